"""Hub-ready model folders: the model card, and the checks `scripts/hub/push_to_hub.py` runs before uploading.

A folder is ready to push when it holds what a user with only `torch` and `transformers` needs:

- `config.json` with a complete `auto_map` and the code files it names (`SeqBertConfig.save_pretrained` and the
  classes' `register_for_auto_class` write both), plus the files those import relatively;
- safetensors weights (never pickled ones);
- a tokenizer;
- `README.md`, the model card rendered from `hub_card/model_card_template.md` with `huggingface_hub.ModelCard`.

The example scripts call `write_model_card` at the end of a run: it stores what the card needs about the run in
`seqbert_run.json` and renders the card from that file, `config.json` and the weights, so the card can be rendered
again later (the push script does, with the repository id and the commit sha that users should pin).
"""

import datetime
import importlib.resources
import json
import math
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import filter_repo_objects
from safetensors import safe_open
from transformers.dynamic_module_utils import get_relative_imports

from .checkpoint_loading import safetensors_file_problem
from .configuration_seqbert import MIN_TRANSFORMERS_VERSION
from .serving_artifacts import ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH, ONNX_PATH, OPENVINO_PATH


RUN_INFO_NAME = "seqbert_run.json"
CARD_NAME = "README.md"
# The template ships in the package (`seqbert.hub_card`, the repository's top-level hub_card/).
TEMPLATE_PATH = Path(str(importlib.resources.files("seqbert.hub_card") / "model_card_template.md"))

# What never goes to the Hub from an output folder: intermediate Trainer checkpoints, TensorBoard logs, and the pickled
# files Trainer writes (training arguments, optimizer and scheduler states). The card records the recipe instead.
UPLOAD_IGNORE_PATTERNS = ["checkpoint-*", "runs/*", "training_args.bin", "*.pt", "*.pth", "*.pkl", ".cache/*"]
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

# Per model class: the Auto class that loads it, its Hub pipeline tag, and a line of example use for the card.
ARCHITECTURES = {
    "SeqBertModel": (
        "AutoModel",
        "feature-extraction",
        'hidden = model(**tokenizer("A sentence.", return_tensors="pt")).last_hidden_state  # (1, tokens, hidden)',
    ),
    "SeqBertForMaskedLM": (
        "AutoModelForMaskedLM",
        "fill-mask",
        'logits = model(**tokenizer("The capital of France is [MASK].", return_tensors="pt")).logits',
    ),
    "SeqBertForSequenceClassification": (
        "AutoModelForSequenceClassification",
        "text-classification",
        'inputs = tokenizer("A gripping, funny film.", truncation=True, return_tensors="pt")  # cut at model_max_length\n'
        "logits = model(**inputs).logits\n"
        "print(model.config.id2label[logits.argmax(-1).item()])",
    ),
    "SeqBertForTokenClassification": (
        "AutoModelForTokenClassification",
        "token-classification",
        'logits = model(**tokenizer("Ada Lovelace lived in London.", return_tensors="pt")).logits  # (1, tokens, labels)',
    ),
    "SeqBertForQuestionAnswering": (
        "AutoModelForQuestionAnswering",
        "question-answering",
        'inputs = tokenizer("Who wrote it?", "It was written by Ada.", return_tensors="pt")\n'
        "start, end = (logits.argmax(-1).item() for logits in model(**inputs)[:2])",
    ),
    "SeqBertForMultipleChoice": (
        "AutoModelForMultipleChoice",
        None,
        'inputs = tokenizer(["Q? A1", "Q? A2"], return_tensors="pt", padding=True)\n'
        "logits = model(**{k: v.unsqueeze(0) for k, v in inputs.items()}).logits  # (1, choices)",
    ),
    "SeqBertForCausalLM": (
        "AutoModelForCausalLM",
        "text-generation",
        'ids = model.generate(**tokenizer("The film", return_tensors="pt"), max_new_tokens=20)\n'
        "print(tokenizer.decode(ids[0], skip_special_tokens=True))",
    ),
    "SeqBertForConditionalGeneration": (
        "AutoModelForSeq2SeqLM",
        "text2text-generation",
        'inputs = tokenizer("And God said, Let there be light.", truncation=True, return_tensors="pt")\n'
        "ids = model.generate(**inputs, num_beams=4)\n"
        "print(tokenizer.decode(ids[0], skip_special_tokens=True))",
    ),
}


# A sentence-transformers model keeps, next to the transformers files: `modules.json` (the module list), each module's
# folder (`1_Pooling/`, `2_Normalize/`, ...), the Transformer module's `sentence_bert_config.json` (max_seq_length,
# lower-casing) and `config_sentence_transformers.json` (versions, prompts, similarity function).
SENTENCE_TRANSFORMERS_ROOT_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def copy_sentence_transformers_modules(source: str, target, **hub_kwargs) -> list[str]:
    """
    Copy the sentence-transformers modules of the checkpoint `source` (a local folder or a Hub id) into `target`,
    a converted SeqBERT folder, so that `SentenceTransformer(target, trust_remote_code=True)` rebuilds the same
    pipeline (pooling, normalisation, maximum length) around the SeqBERT encoder instead of sentence-transformers'
    default (mean pooling, no normalisation, max_seq_length 512). The module at path "" is the encoder itself, which
    the conversion wrote.

    Args:
        source (`str`): the checkpoint that was converted.
        target (`str` or `os.PathLike`): the folder it was converted into.
        **hub_kwargs: `revision`, `cache_dir`, `token`, `local_files_only` for a Hub `source`.

    Returns:
        `list[str]`: the paths copied, relative to `target`; empty when `source` is not a sentence-transformers model
        (it has no `modules.json`).
    """
    from huggingface_hub import snapshot_download

    local = Path(source)
    if not local.is_dir():
        patterns = list(SENTENCE_TRANSFORMERS_ROOT_FILES)
        local = Path(snapshot_download(source, allow_patterns=patterns, **hub_kwargs))
        if (local / "modules.json").is_file():
            module_paths = [m["path"] for m in json.loads((local / "modules.json").read_text()) if m.get("path")]
            patterns += [f"{path}/*" for path in module_paths]
            local = Path(snapshot_download(source, allow_patterns=patterns, **hub_kwargs))
    if not (local / "modules.json").is_file():
        return []
    copied = []
    for name in SENTENCE_TRANSFORMERS_ROOT_FILES:
        if (local / name).is_file():
            shutil.copy2(local / name, Path(target) / name)
            copied.append(name)
    for module in json.loads((local / "modules.json").read_text()):
        path = module.get("path")
        if path and (local / path).is_dir():
            shutil.copytree(local / path, Path(target) / path, dirs_exist_ok=True)
            copied.append(path)
    return copied


def machine_description() -> str:
    """One line naming the accelerator(s) or, without one, the CPU model and its core count."""
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, no GPU"


def software_description() -> str:
    """The versions that produced the numbers: Python, torch, transformers."""
    import torch
    import transformers

    return f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}"


def command_line() -> str:
    """The command that started this process, quoted so that it can be pasted into a shell."""
    return " ".join(["python", *(shlex.quote(arg) for arg in sys.argv)])


def hub_base_model(name_or_path: str) -> str | None:
    """The Hub id to name as a card's `base_model`: the id itself, the Hub original of the offline MiniLM folder, or
    `None` for other local folders (their origin is unknown)."""
    from .data import MINILM_HUB_ID, minilm_checkpoint_path

    if os.path.isdir(name_or_path):
        try:
            return MINILM_HUB_ID if Path(name_or_path).resolve() == minilm_checkpoint_path().resolve() else None
        except FileNotFoundError:
            return None
    return name_or_path


def training_recipe(training_args, metrics: dict, steps: int, **extra) -> dict[str, str]:
    """
    The settings of a `Trainer` run that a reader needs to reproduce it, as display strings, for the card.

    Args:
        training_args (`transformers.TrainingArguments`): the run's arguments (after launch, so `world_size` is known).
        metrics (`dict`): the run's train metrics (`train_samples`, `train_runtime` in seconds), if any.
        steps (`int`): optimizer steps taken (`trainer.state.global_step`).
        **extra: more rows (e.g. `max_seq_length=128`), shown last; `None` values are left out.
    """
    args = training_args
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    epochs = args.num_train_epochs
    length = f"{args.max_steps} steps" if args.max_steps > 0 else f"{epochs:g} epoch{'' if epochs == 1 else 's'}"
    precision = "bf16 mixed" if args.bf16 else "fp16 mixed" if args.fp16 else "fp32"
    recipe = {
        "training length": length,
        "global batch": (
            f"{global_batch} ({args.per_device_train_batch_size} per device x {_count(args.world_size, 'process')} x "
            f"{_count(args.gradient_accumulation_steps, 'accumulation step')})"
        ),
        "optimizer": f"{args.optim.value if hasattr(args.optim, 'value') else args.optim}, "
        f"weight decay {args.weight_decay:g}",
        "learning rate": f"{args.learning_rate:g}, {getattr(args.lr_scheduler_type, 'value', args.lr_scheduler_type)} "
        f"schedule, {args.get_warmup_steps(args.max_steps if args.max_steps > 0 else steps):g} warm-up steps"
        + (f" ({args.warmup_steps:.0%} of the steps)" if 0 < args.warmup_steps < 1 else ""),
        "precision": precision,
        "gradient checkpointing": str(bool(args.gradient_checkpointing)),
        "seed": str(args.seed),
    }
    extra = {
        "optimizer_steps": steps,
        "train_samples": metrics.get("train_samples"),
        "train_runtime": f"{metrics['train_runtime']:.0f} s" if "train_runtime" in metrics else None,
        **extra,
    }
    recipe.update({name.replace("_", " "): str(value) for name, value in extra.items() if value is not None})
    return recipe


def _count(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless `n` is 1 ("1 process", "2 processes")."""
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{n} {noun if n == 1 else plural}"


def auto_class_name(model_dir) -> str:
    """The name of the Auto class that loads the model saved in `model_dir` (from `architectures` in config.json)."""
    architecture = (_read_config(Path(model_dir)).get("architectures") or ["SeqBertModel"])[0]
    return ARCHITECTURES.get(architecture, ("AutoModel",))[0]


def _read_config(model_dir: Path) -> dict:
    with open(model_dir / "config.json", encoding="utf-8") as f:
        return json.load(f)


def _weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of the folder (the shards an index names, or `model.safetensors`)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            return [model_dir / name for name in sorted(set(json.load(f)["weight_map"].values()))]
    single = model_dir / "model.safetensors"
    return [single] if single.is_file() else []


def count_parameters(model_dir) -> tuple[int, str]:
    """
    Number of stored parameters (elements of every tensor in the safetensors files, so a tied matrix counts once) and
    their dtype, read from the safetensors headers without loading the weights.
    """
    total, dtypes = 0, set()
    for path in _weight_files(Path(model_dir)):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                tensor_slice = f.get_slice(key)
                shape = tensor_slice.get_shape()
                total += math.prod(shape)
                dtypes.add(str(tensor_slice.get_dtype()))
    dtype_names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    return total, ", ".join(sorted(dtype_names.get(d, d) for d in dtypes))


def _serving_files(model_dir) -> dict[str, list[str]]:
    """The serving files `seqbert.serving_artifacts.save_serving_artifacts` wrote into `model_dir` (what
    `push_to_hub.py --serving_artifacts` adds), by engine: `{"onnx": [...], "openvino": [...]}`, paths relative to the
    folder, each engine's main file first; engines without files are left out."""
    model_dir = Path(model_dir)
    engines = {"onnx": (ONNX_PATH, ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH), "openvino": (OPENVINO_PATH,)}
    found = {engine: [path for path in paths if (model_dir / path).is_file()] for engine, paths in engines.items()}
    return {engine: paths for engine, paths in found.items() if paths}


def _human_count(n: int) -> str:
    return f"{n / 1e6:.1f} M ({n:,})" if n >= 1e6 else f"{n:,}"


def render_model_card(model_dir, repo_id: str | None = None, revision: str | None = None) -> ModelCard:
    """
    Render the model card of a saved SeqBERT folder from `hub_card/model_card_template.md`.

    Args:
        model_dir (`str` or `os.PathLike`): folder with `config.json`, safetensors weights and `seqbert_run.json`
            (written by `write_model_card`); the card lists the serving files in its `onnx/` and `openvino/`, if any
            (`push_to_hub.py --serving_artifacts` writes them before it renders the card).
        repo_id (`str`, *optional*): the Hub repository, for the loading snippet (default: a `USER/NAME` placeholder).
        revision (`str`, *optional*): the commit sha the loading snippet pins (default: a placeholder).

    Returns:
        `huggingface_hub.ModelCard`: YAML metadata (library_name, pipeline_tag, tags, license, base_model, datasets,
        metrics, model-index) and the text.

    Raises:
        FileNotFoundError: `config.json` or `seqbert_run.json` is missing, or the template is (package data of
            seqbert, `seqbert.hub_card`: a broken install).
        ValueError: the folder holds no SeqBERT model.
    """
    model_dir = Path(model_dir)
    for name in ("config.json", RUN_INFO_NAME):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"model_dir ({str(model_dir)!r}) has no {name}: it is needed to render the card")
    if not TEMPLATE_PATH.is_file():
        raise FileNotFoundError(f"the model-card template is missing: expected {TEMPLATE_PATH}")
    config = _read_config(model_dir)
    with open(model_dir / RUN_INFO_NAME, encoding="utf-8") as f:
        run = json.load(f)
    architecture = (config.get("architectures") or ["SeqBertModel"])[0]
    if config.get("model_type") != "seqbert" or architecture not in ARCHITECTURES:
        raise ValueError(
            f"model_dir ({str(model_dir)!r}) holds a {config.get('model_type')!r} {architecture!r} model, not SeqBERT"
        )
    auto_class, pipeline_tag, usage = ARCHITECTURES[architecture]
    parameters, dtype = count_parameters(model_dir)

    dataset = run["dataset"]
    eval_results = [
        EvalResult(
            task_type=pipeline_tag or "multiple-choice",
            dataset_type=dataset["type"],
            dataset_name=dataset["name"],
            dataset_split=dataset.get("split"),
            metric_type=result["type"],
            metric_name=result["name"],
            metric_value=result["value"],
        )
        for result in run["results"]
    ]
    card_data = ModelCardData(
        model_name=run["model_name"],
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["seqbert", "custom_code", "bert", "safetensors", *run.get("tags", [])],
        license=run.get("license", "apache-2.0"),
        language=run.get("language"),
        base_model=run.get("base_model"),
        datasets=run.get("datasets") or None,
        metrics=sorted({result["type"] for result in run["results"]}) or None,
        eval_results=eval_results or None,
    )
    decoder = config.get("num_decoder_layers", config["num_hidden_layers"])
    layers = (
        f"{config['num_hidden_layers']} encoder + {decoder} decoder"
        if config.get("is_encoder_decoder")
        else f"{config['num_hidden_layers']} encoder"
    )
    norm = config.get("norm_placement", "pre")
    position = config.get("position_embedding_type", "learned")
    table = [*run["results"], *run.get("baselines", [])]
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_PATH),
        model_name=run["model_name"],
        summary=run["summary"],
        min_transformers=MIN_TRANSFORMERS_VERSION,
        seqbert_version=config.get("seqbert_version", "unknown"),
        architecture=architecture,
        auto_class=auto_class,
        layers=layers,
        config=config,
        norm_description="pre-LN (`x + f(LN(x))`, final LayerNorm)" if norm == "pre" else "post-LN (BERT's)",
        position_description=(
            f"learned table of {config['max_position_embeddings']} positions"
            if position == "learned"
            else "fixed sinusoids (any length)"
        ),
        parameter_count=_human_count(parameters),
        weight_files=", ".join(path.name for path in _weight_files(model_dir)),
        dtype=dtype,
        recipe_intro=run.get("recipe_intro", ""),
        recipe=list(run["recipe"].items()),
        command=run["command"],
        date=run["date"],
        machine=run["machine"],
        software=run["software"],
        results=[{**row, "value": _format_value(row["value"])} for row in table],
        loss_curve="loss_curve.png" if (model_dir / "loss_curve.png").is_file() else None,
        repo_id=repo_id or "USER/NAME",
        revision=revision,
        usage=usage,
        serving_files=_serving_files(model_dir),
        limitations=run.get("limitations", []),
    )


def _format_value(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_model_card(output_dir, run_info: dict) -> Path:
    """
    Store `run_info` as `seqbert_run.json` in `output_dir` and write the rendered card there as `README.md`.

    Args:
        output_dir (`str` or `os.PathLike`): a folder the model was saved to (`config.json`, weights).
        run_info (`dict`): what the card says about the run. Keys: `model_name`, `summary` (one paragraph),
            `dataset` (`{"type": Hub id or short name, "name": description, "split": ...}`), `results` (list of
            `{"type": metric id, "name": label, "value": number, "data": where it was measured}`: the model's
            scores, also written to model-index), `recipe` (`{setting: value}`, see `training_recipe`), `command`;
            optional `baselines` (rows like `results`, shown in the table only), `base_model`, `datasets` (Hub ids),
            `license` (default apache-2.0), `language`, `tags`, `recipe_intro`, `limitations` (list of sentences),
            and `date` / `machine` / `software` (default: today, `machine_description()`, `software_description()`).

    Returns:
        `pathlib.Path` of the card. Both files are written to a temporary name first and then renamed, so a failure
        never leaves a half-written card.
    """
    output_dir = Path(output_dir)
    run_info = {
        "date": datetime.date.today().isoformat(),
        "machine": machine_description(),
        "software": software_description(),
        **run_info,
    }
    _atomic_write(output_dir / RUN_INFO_NAME, json.dumps(run_info, indent=2) + "\n")
    card = render_model_card(output_dir)
    _atomic_write(output_dir / CARD_NAME, str(card))
    return output_dir / CARD_NAME


def _atomic_write(path: Path, text: str) -> None:
    staging = path.with_name(path.name + ".partial")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


def upload_files(model_dir) -> list[tuple[str, int]]:
    """
    `(path in repo, size in bytes)` of every file `upload_folder` sends from `model_dir`, sorted: all files except
    `UPLOAD_IGNORE_PATTERNS`, filtered with huggingface_hub's own `filter_repo_objects`.
    """
    model_dir = Path(model_dir)
    paths = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
    kept = filter_repo_objects(paths, ignore_patterns=UPLOAD_IGNORE_PATTERNS)
    return [(path, (model_dir / path).stat().st_size) for path in kept]


def validate_model_folder(model_dir) -> list[str]:
    """
    Everything that keeps `model_dir` from loading for a Hub user with only `torch` and `transformers`.

    Checks: `config.json` is a SeqBERT config whose `auto_map` has `AutoConfig`, `AutoModel` and the Auto class of
    its architecture; every code file `auto_map` names, and every file those import relatively, is in the folder;
    safetensors weights (all shards) are there and readable (not truncated) and no pickled file would be uploaded (an OpenVINO
    `.bin` beside its `.xml` is raw weights, not a pickle); a tokenizer; the card
    (`README.md`) with YAML metadata naming `library_name` and the `custom_code` tag.

    Returns:
        `list[str]`: one sentence per problem, each naming the file and how to fix it; empty when the folder is ready.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return [f"model_dir ({str(model_dir)!r}) is not a folder"]
    problems = []
    names = {path for path, _ in upload_files(model_dir)}
    if "config.json" not in names:
        problems.append("config.json is missing: save the model with save_pretrained")
    else:
        problems += _config_problems(model_dir, _read_config(model_dir))
    if not _weight_files(model_dir):
        problems.append("no safetensors weights (model.safetensors or model.safetensors.index.json): save_pretrained")
    else:
        for path in _weight_files(model_dir):
            if not path.is_file():
                problems.append(f"{path.name} is missing (named in the weight index)")
            elif (problem := safetensors_file_problem(path)) is not None:
                problems.append(problem)
    # OpenVINO's IR keeps its weights as raw tensors in a `.bin` beside the `.xml` graph: not a pickle.
    openvino_weights = {name[: -len(".xml")] + ".bin" for name in names if name.endswith(".xml")}
    pickled = sorted(name for name in names if name.endswith(PICKLED_SUFFIXES) and name not in openvino_weights)
    if pickled:
        problems.append(
            f"pickled files would be uploaded ({', '.join(pickled)}): unpickling runs code on the downloader's machine; "
            "keep safetensors only (load with use_safetensors=False, then save_pretrained) and delete them"
        )
    if "tokenizer.json" not in names and "vocab.txt" not in names:
        problems.append("no tokenizer (tokenizer.json or vocab.txt): save the tokenizer into the folder too")
    if CARD_NAME not in names:
        problems.append(f"no model card ({CARD_NAME}): render one with seqbert.hub.write_model_card")
    else:
        data = ModelCard.load(model_dir / CARD_NAME).data.to_dict()
        if not data.get("library_name") or "custom_code" not in (data.get("tags") or []):
            problems.append(f"{CARD_NAME} lacks YAML metadata with library_name and the custom_code tag")
    return problems


def _config_problems(model_dir: Path, config: dict) -> list[str]:
    if config.get("model_type") != "seqbert":
        return [f"config.json has model_type {config.get('model_type')!r}, not 'seqbert'"]
    auto_map = config.get("auto_map") or {}
    architecture = (config.get("architectures") or ["SeqBertModel"])[0]
    needed = ["AutoConfig", "AutoModel", ARCHITECTURES.get(architecture, ("AutoModel",))[0]]
    problems = [
        f"config.json auto_map has no {auto_class!r} entry: save with seqbert's save_pretrained, which writes the full "
        "auto_map"
        for auto_class in dict.fromkeys(needed)
        if auto_class not in auto_map
    ]
    code_files = sorted({target.split(".")[0] + ".py" for target in auto_map.values()})
    seen = set()
    while code_files:
        name = code_files.pop()
        if name in seen:
            continue
        seen.add(name)
        if not (model_dir / name).is_file():
            problems.append(f"{name} is missing: the code named by auto_map (or imported by it) must be in the folder")
            continue
        code_files += [module + ".py" for module in get_relative_imports(str(model_dir / name))]
    return problems
