#!/usr/bin/env python
"""Check that saved SeqBERT folders load, with `trust_remote_code=True`, on other transformers releases: each release in
a throwaway virtual environment that holds only torch and transformers (and their dependencies), with outputs
compared to this environment's. The default run (27 releases) took 13 minutes on 2 CPU cores on 2026-11-23 with
part of the environments already built; each environment built afresh adds the install time of transformers and its
dependencies (torch is installed once and shared).

    python scripts/checks/check_transformers_versions.py                       # the default releases, reference folders
    python scripts/checks/check_transformers_versions.py --versions 5.0.0 5.4.0 --folders runs/rt_minilm runs/rt_minilm/checkpoint-250

Without `--folders` it writes reference folders first: the MiniLM checkpoint in every encoder head (heads seeded),
the causal LM and the BERT2BERT seq2seq model, plus a Trainer checkpoint of a two-step classifier run. Each folder
then gets the jobs of `scripts/hub/load_without_seqbert.py`: a forward pass on real Rotten Tomatoes snippets (token ids
below the folder's vocabulary size), for generating models greedy and beam-4 `generate`, and where the folder has a
tokenizer, the tokenizer loaded as a user without seqbert loads it. The same jobs run here
first, in a process without seqbert, and every release must reproduce those tensors exactly.

The environments live in `--venv_root` (default `~/.cache/seqbert/venvs`) and are reused (check_environments.py builds
them). To save time and disk they share one torch: a torch-only environment `torch-<version>` is built once, and each release's environment reaches it
through a `.pth` file; its own site-packages (transformers and its dependencies) come first on the path. torch is
installed with `pip install torch==<this environment's version>` plus `--pip_args` (for example
`--index-url https://download.pytorch.org/whl/cpu` on a machine where PyPI's torch is the CUDA build).

Prints a table (release -> result) and writes it to `--json_file`. Exit status 1 if a 5.x release fails or differs.
"""

import json
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import check_environments
import torch
from safetensors.torch import save_file

from seqbert.script_utils import script_parser


ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "hub" / "load_without_seqbert.py"
# What transformers prints when a folder's code would need trust_remote_code (the prompt) or when it falls back to a
# generic config: neither may appear while a saved folder loads.
LOADING_COMPLAINTS = ("Do you wish to run the custom code", "to instantiate a model of type")
# The newest patch of every 5.x minor release up to the one this project is developed with, and three 4.x releases
# (which must stop with SeqBERT's one-line message).
DEFAULT_VERSIONS = [
    "4.40.2", "4.48.3", "4.57.6",
    "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4", "5.11.0",
    "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2",
    "5.23.0",
]  # fmt: skip


@dataclass
class CheckArguments:
    versions: list[str] = field(default_factory=lambda: list(DEFAULT_VERSIONS), metadata={"help": "Releases."})
    folders: list[str] = field(default_factory=list, metadata={"help": "Saved folders (default: reference ones)."})
    venv_root: str = field(
        default=str(check_environments.DEFAULT_VENV_ROOT), metadata={"help": "Where environments live."}
    )
    pip_args: str = field(default="", metadata={"help": "Extra pip arguments for installing torch."})
    json_file: str | None = field(default=None, metadata={"help": "Write the results here too."})


def is_built(root: Path, version: str) -> bool:
    """Whether the environment of transformers `version` under `root` is built (`release_environment` reuses it)."""
    return check_environments.is_built(root, f"transformers-{version}")


def release_environment(root: Path, version: str, pip_args: str = "") -> Path:
    """An environment with transformers `version` and the shared torch (`check_environments.cached_environment`),
    built once."""
    return check_environments.cached_environment(
        root,
        f"transformers-{version}",
        lambda folder: check_environments.run_pip(folder, "install", f"transformers=={version}"),
        pip_args=pip_args,
    )


def run_jobs(python: str, jobs: list[dict], work: Path, name: str) -> tuple[dict | None, str]:
    """Run the jobs with `python` (`check_environments.run_worker`, `RUNNER`); return the tensors (or None) and the
    last line of the error output, or the complaint (`LOADING_COMPLAINTS`) the output holds."""
    result = check_environments.run_worker(python, RUNNER, jobs, work, name, results_format="safetensors")
    if result.results is None:
        return None, result.error
    for complaint in LOADING_COMPLAINTS:
        if complaint in result.stdout + result.stderr:
            return None, f"the output says {complaint!r}"
    return result.results, ""


def reference_folders(work: Path) -> list[Path]:
    """Save the reference folders (see the module docstring) under `work`."""
    from transformers import AutoTokenizer, DataCollatorWithPadding, TrainingArguments

    import seqbert
    from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
    from seqbert.training import SeqBertTrainer

    path = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    folders = []
    classes = [
        seqbert.SeqBertModel,
        seqbert.SeqBertForMaskedLM,
        seqbert.SeqBertForSequenceClassification,
        seqbert.SeqBertForTokenClassification,
        seqbert.SeqBertForQuestionAnswering,
        seqbert.SeqBertForMultipleChoice,
        seqbert.SeqBertForCausalLM,
        seqbert.SeqBertForConditionalGeneration,
    ]
    for model_class in classes:
        torch.manual_seed(0)
        folder = work / "folders" / model_class.__name__
        model_class.from_bert_pretrained(path, num_labels=2).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    snippets = load_rotten_tomatoes(num_train=16, num_validation=16)["train"]
    encoded = tokenizer(list(snippets["text"]), truncation=True, max_length=64)
    train = [
        {"input_ids": ids, "attention_mask": mask, "labels": label}
        for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], snippets["label"], strict=True)
    ]
    output_dir = work / "folders" / "trainer"
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=2, per_device_train_batch_size=8, save_steps=2, report_to="none",
        use_cpu=True, dataloader_pin_memory=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(path, num_labels=2)
    trainer = SeqBertTrainer(
        model=model, args=args, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer)
    )
    trainer.train()
    folders.append(output_dir / "checkpoint-2")
    return folders


def jobs_for(folders: list[Path], work: Path) -> list[dict]:
    """Forward (and generate) jobs for each folder on real snippets."""
    from transformers import AutoTokenizer

    from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    texts = list(load_rotten_tomatoes(num_train=8, num_validation=8)["validation"]["text"])[:4]
    plain = dict(tokenizer(texts, padding=True, truncation=True, max_length=48, return_tensors="pt"))
    pairs = tokenizer([texts[0]] * 2 + [texts[1]] * 2, texts, padding=True, truncation=True, max_length=48)
    choices = {k: torch.tensor(v).view(2, 2, -1).contiguous() for k, v in pairs.items()}
    jobs = []
    for index, folder in enumerate(folders):
        config = json.loads((folder / "config.json").read_text())
        architecture = (config.get("architectures") or ["SeqBertModel"])[0]
        inputs = choices if architecture == "SeqBertForMultipleChoice" else dict(plain)
        inputs = {k: v.clamp(max=config["vocab_size"] - 1) if k == "input_ids" else v for k, v in inputs.items()}
        if architecture == "SeqBertForCausalLM":  # decoder-only prompts are padded on the left, as for generate
            left = tokenizer(
                texts, padding=True, truncation=True, max_length=48, padding_side="left", return_tensors="pt"
            )
            inputs = {k: v for k, v in left.items() if k != "token_type_ids"}
        forward_inputs = dict(inputs)
        if architecture == "SeqBertForConditionalGeneration":
            forward_inputs["decoder_input_ids"] = inputs["input_ids"][:, :6].contiguous()
        inputs_file, forward_file = work / f"inputs-{index}.safetensors", work / f"forward-{index}.safetensors"
        save_file(inputs, inputs_file)
        save_file(forward_inputs, forward_file)
        auto_class = next(k for k, v in config["auto_map"].items() if v.endswith("." + architecture))
        name = f"{index}-{architecture}"
        base = {"folder": str(folder), "auto_class": auto_class, "inputs": str(inputs_file)}
        jobs.append({"name": name, "mode": "forward", **base, "inputs": str(forward_file)})
        if (folder / "tokenizer_config.json").exists():  # its tokenizer loads without a prompt or warning too
            jobs.append({"name": f"{name}-tokenizer", "mode": "tokenize", "folder": str(folder), "texts": texts})
        if architecture in ("SeqBertForConditionalGeneration", "SeqBertForCausalLM"):
            for decoding, options in {"greedy": {}, "beam4": {"num_beams": 4}}.items():
                kwargs = {"max_new_tokens": 8, **options}
                jobs.append({"name": f"{name}-{decoding}", "mode": "generate", "generate_kwargs": kwargs, **base})
    return jobs


def compare(expected: dict, got: dict | None, error: str) -> str:
    if got is None:
        return f"fails: {error}"
    if set(got) != set(expected):
        return f"differs: outputs {sorted(set(expected) ^ set(got))}"
    differing = sorted(k for k in expected if not torch.equal(got[k], expected[k]))
    if not differing:
        return "identical"
    worst = max((got[k].float() - expected[k].float()).abs().max().item() for k in differing)
    return f"differs: {', '.join(differing)} (max |delta| {worst:.1e})"


def check(versions: list[str], folders: list[Path], root: Path, work: Path, pip_args: str = "") -> dict[str, str]:
    """Run the folders' jobs on each release; return release -> result."""
    jobs = jobs_for(folders, work)
    expected, error = run_jobs(sys.executable, jobs, work, "reference")
    if expected is None:
        raise RuntimeError(f"the jobs fail in this environment: {error}")
    results = {}
    for version in versions:
        environment = release_environment(root, version, pip_args)
        got, error = run_jobs(str(check_environments.python_of(environment)), jobs, work, f"transformers-{version}")
        results[version] = compare(expected, got, error)
        print(f"transformers {version:<8} {results[version]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict[str, str]:

    (args,) = script_parser(CheckArguments, __doc__).parse_args_into_dataclasses(args=argv)
    root = Path(args.venv_root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folders = [Path(f).resolve() for f in args.folders] or reference_folders(work)
        print(
            f"{len(folders)} folders, this environment: torch {torch.__version__}, python {sysconfig.get_python_version()}"
        )
        results = check(args.versions, folders, root, work, args.pip_args)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(results, indent=2))
    failed = [v for v, r in results.items() if not v.startswith("4.") and r != "identical"]
    if failed:
        print(f"not identical on: {', '.join(failed)}")
    return results


if __name__ == "__main__":
    results = main()
    sys.exit(1 if any(not v.startswith("4.") and r != "identical" for v, r in results.items()) else 0)
