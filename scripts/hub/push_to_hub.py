#!/usr/bin/env python
"""Check a SeqBERT model folder and upload it to the Hugging Face Hub, for users with only torch and transformers.
The checks take seconds; the upload as long as the network needs for the weights.

    python scripts/hub/push_to_hub.py --model_dir runs/rt_minilm --repo_id USER/NAME [--private] [--revision BRANCH]
    python scripts/hub/push_to_hub.py --model_dir runs/rt_minilm --repo_id USER/NAME --dry_run
    python scripts/hub/push_to_hub.py --model_dir runs/rt_minilm --repo_id USER/NAME --serving_artifacts onnx openvino

The folder must hold what `trust_remote_code=True` loading needs (see `seqbert.hub.validate_model_folder`): a SeqBERT
`config.json` with a complete `auto_map`, the code files it names, safetensors weights, a tokenizer and the model card
`README.md`. The output folders of `run_classification.py` and `run_seq2seq.py` have all of it. If anything is missing
the script lists every problem and exits with status 1 before touching the Hub.

Upload, with `huggingface_hub.HfApi` and the token of `HF_TOKEN` or of `hf auth login`:
1. `create_repo` (and `create_branch` for `--revision`);
2. `upload_folder`: every file except `seqbert.hub.UPLOAD_IGNORE_PATTERNS` (intermediate `checkpoint-*` folders, logs
   and the pickled files Trainer writes);
3. `upload_file` of the card rendered again with the repository id and the sha of the commit of step 2, which the
   card's loading snippet pins.

`--serving_artifacts onnx openvino` first writes the files the serving engines load into the folder
(`seqbert.serving_artifacts.save_serving_artifacts`: `onnx/model.onnx` and its int8 version
`onnx/model_qint8_quantized.onnx` for text-embeddings-inference, optimum and sentence-transformers' ONNX backend,
`openvino/openvino_model.xml` for their OpenVINO backend), for the model's own task or `--serving_task`; they are
uploaded with the rest. This needs onnx, onnxscript and onnxruntime (and openvino) installed, and takes under a minute
for a MiniLM-sized model on two CPU cores.

`--dry_run` validates, writes the serving files if asked, and prints the files and their sizes; it uploads nothing.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import HFValidationError, validate_repo_id

from seqbert.hub import (
    CARD_NAME,
    UPLOAD_IGNORE_PATTERNS,
    auto_class_name,
    render_model_card,
    upload_files,
    validate_model_folder,
)
from seqbert.script_utils import script_parser
from seqbert.serving_artifacts import (
    SERVING_ENGINES,
    TASKS,
    check_engines,
    resolve_task,
    save_serving_artifacts,
    saved_architecture,
)


@dataclass
class PushArguments:
    """What to upload and where."""

    model_dir: str = field(metadata={"help": "The model folder (e.g. the --output_dir of run_classification.py)."})
    repo_id: str = field(metadata={"help": "The Hub repository, USER/NAME or ORG/NAME; created if it does not exist."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    revision: str | None = field(
        default=None, metadata={"help": "Branch to upload to (created from main if missing); default: main."}
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "Validate (and write the serving files, if asked) and list the files; upload nothing."},
    )
    commit_message: str = field(default="Upload SeqBERT model", metadata={"help": "Message of the upload commit."})
    serving_artifacts: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Write these engines' files into model_dir before uploading (replacing its onnx/ and openvino/): "
            f"any of {', '.join(SERVING_ENGINES)}."
        },
    )
    serving_task: str | None = field(
        default=None,
        metadata={
            "help": "The task of the serving files: the model's own (default) or feature-extraction (the encoder's "
            f"hidden states, for embeddings); one of {', '.join(TASKS)}."
        },
    )


def _size(num_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024


def main(argv: list[str] | None = None) -> int:
    """Parse arguments (from `argv`, else the command line), validate, upload; return the exit status (0 or 1)."""
    (args,) = script_parser(PushArguments, __doc__).parse_args_into_dataclasses(args=argv)
    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        print(f"error: repo_id ({args.repo_id!r}) is not a valid Hub repository id: {error}", file=sys.stderr)
        return 1
    problems = validate_model_folder(args.model_dir)
    if problems:
        print(f"error: model_dir ({args.model_dir!r}) is not ready to push:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1

    if args.serving_artifacts or args.serving_task is not None:
        try:
            engines = check_engines(args.serving_artifacts, argument="serving_artifacts")
            source = f"the model in model_dir ({args.model_dir!r})"
            task = resolve_task(saved_architecture(args.model_dir), args.serving_task, "serving_task", source)
            artifacts = save_serving_artifacts(args.model_dir, task=task, engines=engines)
        except (ValueError, ImportError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        deltas = ", ".join(f"{name} {delta:.1e}" for name, delta in artifacts.max_abs_delta.items())
        print(f"Wrote the {task} serving files of {', '.join(engines)} (max |delta| from the model: {deltas}).")

    files = upload_files(args.model_dir)
    width = max(len(path) for path, _ in files)
    print(f"{len(files)} files, {_size(sum(size for _, size in files))}, for {args.repo_id}@{args.revision or 'main'}:")
    for path, size in files:
        print(f"  {path:<{width}}  {size:>12,d} bytes  ({_size(size)})")
    if args.dry_run:
        print("Dry run: nothing was uploaded.")
        return 0

    api = HfApi()
    repo_id = api.create_repo(args.repo_id, private=args.private, exist_ok=True).repo_id
    if args.revision is not None:
        api.create_branch(repo_id, branch=args.revision, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=args.model_dir,
        revision=args.revision,
        ignore_patterns=UPLOAD_IGNORE_PATTERNS,
        commit_message=args.commit_message,
    )
    card = render_model_card(Path(args.model_dir), repo_id=repo_id, revision=commit.oid)
    api.upload_file(
        path_or_fileobj=str(card).encode("utf-8"),
        path_in_repo=CARD_NAME,
        repo_id=repo_id,
        revision=args.revision,
        commit_message=f"Model card: pin the loading snippet to {commit.oid}",
    )
    print(f"Uploaded to {commit.commit_url}")
    auto_class = auto_class_name(args.model_dir)
    print(f"Load it with: {auto_class}.from_pretrained({repo_id!r}, revision={commit.oid!r}, trust_remote_code=True)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
