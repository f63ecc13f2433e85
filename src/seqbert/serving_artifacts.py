"""ONNX and OpenVINO files inside a saved SeqBERT folder, laid out where the serving engines look for them.

    model.save_pretrained("runs/rt_minilm"); tokenizer.save_pretrained("runs/rt_minilm")
    artifacts = save_serving_artifacts("runs/rt_minilm")                       # the head's own task
    artifacts = save_serving_artifacts("runs/rt_minilm", task="feature-extraction", optimize=True)

writes into the folder:

| file | read by |
|---|---|
| `onnx/model.onnx` | text-embeddings-inference's ONNX Runtime backend, optimum's `ORTModelFor*`, sentence-transformers' `backend="onnx"` |
| `onnx/model_qint8_quantized.onnx` (`int8=True`) | the same, with `file_name="onnx/model_qint8_quantized.onnx"` (sentence-transformers: `model_kwargs`) |
| `onnx/model_optimized.onnx` (`optimize=True`) | ONNX Runtime only (its `com.microsoft` fused operators), `file_name` as above |
| `openvino/openvino_model.xml`, `.bin` | optimum-intel's `OVModelFor*`, sentence-transformers' `backend="openvino"` |

Each graph takes `input_ids`, `attention_mask` and `token_type_ids` (int64, `(batch_size, sequence_length)`; multiple
choice `(batch_size, num_choices, sequence_length)`; no `token_type_ids` when `type_vocab_size` is 0) and returns the
task's outputs by their transformers names: `last_hidden_state` (feature extraction), `logits`, or `start_logits` and
`end_logits` (question answering), float32. Batch size and length are dynamic. These are the names optimum's
`ORTModel` / `OVModel` classes feed and read, and those text-embeddings-inference's `OrtBackend` uses (it feeds
`token_type_ids` only when the graph has that input and reads `last_hidden_state` to embed, `logits` to classify).

How: `torch.onnx.export(dynamo=True)` of the model at opset 18 (ONNX Runtime 1.14 and later), as `docs/export.md`
describes; int8 is onnxruntime's dynamic quantization (`quantize_dynamic`, int8 weights with one scale per output
channel, activations quantized at run time) after its `quant_pre_process`; `optimize=True` applies onnxscript's ONNX
Runtime fusions (`onnxscript.rewriter.ort_fusions.optimize_for_ort`: `Attention`, `SkipLayerNormalization`,
`BiasGelu`), which fuse attention on this graph where onnxruntime's own `optimize_model(model_type="bert")` does not;
OpenVINO converts the ONNX file (`openvino.convert_model`) and saves it uncompressed (`compress_to_fp16=False`: its
default fp16 weights move MiniLM's hidden states by 3e-3). Before anything is moved into the folder, every fp32 file is
run by its engine on inputs of another shape than the traced ones and compared with the model (`CHECK_TOLERANCE`).

Everything is written into a staging folder under `model_dir/.cache/` (which `seqbert.hub.UPLOAD_IGNORE_PATTERNS`
leaves out of uploads) and moved into place only when all of it is written and checked. Each call replaces the
folder's `onnx/` and `openvino/` as a whole, and removes the one left out of `engines`, so no file of an earlier export
(other weights, another task) is left next to the new ones.

An integration with other libraries: onnx, onnxscript, onnxruntime and openvino are imported only when called.
"""

import importlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .configuration_seqbert import SeqBertConfig
from .modeling_seqbert import (
    SeqBertForMaskedLM,
    SeqBertForMultipleChoice,
    SeqBertForQuestionAnswering,
    SeqBertForSequenceClassification,
    SeqBertForTokenClassification,
    SeqBertModel,
    SeqBertPreTrainedModel,
)


# The tasks (optimum's names) and the outputs each graph returns (transformers' names).
TASKS = {
    "feature-extraction": ("last_hidden_state",),
    "fill-mask": ("logits",),
    "text-classification": ("logits",),
    "token-classification": ("logits",),
    "question-answering": ("start_logits", "end_logits"),
    "multiple-choice": ("logits",),
}
# Each encoder class's own task; every one of them also serves feature extraction with its encoder.
HEAD_TASKS = {
    SeqBertModel: "feature-extraction",
    SeqBertForMaskedLM: "fill-mask",
    SeqBertForSequenceClassification: "text-classification",
    SeqBertForTokenClassification: "token-classification",
    SeqBertForQuestionAnswering: "question-answering",
    SeqBertForMultipleChoice: "multiple-choice",
}
ENCODER_CLASSES = {model_class.__name__: model_class for model_class in HEAD_TASKS}
# engine -> the packages its files need: the ONNX export (onnx, onnxscript) for both, then each engine's own runtime.
SERVING_ENGINES = {"onnx": ("onnx", "onnxscript", "onnxruntime"), "openvino": ("onnx", "onnxscript", "openvino")}
# The files, relative to the model folder (the names sentence-transformers' export helpers give them).
ONNX_PATH, ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH = (
    "onnx/model.onnx",
    "onnx/model_qint8_quantized.onnx",
    "onnx/model_optimized.onnx",
)
OPENVINO_PATH = "openvino/openvino_model.xml"
SERVING_FOLDERS = ("onnx", "openvino")  # replaced as a whole by each export
ONNX_OPSET = 18  # the lowest opset torch's dynamo exporter writes: the widest range of ONNX Runtime releases
# A single ONNX file is one protobuf message, which cannot exceed 2 GiB; external weight files are not supported here.
PROTOBUF_LIMIT = 2**31
# Largest |delta| allowed between an exported fp32 file and the model on the check inputs: atol + rtol * |expected|.
CHECK_TOLERANCE = (1e-4, 1e-4)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class ServingArtifacts:
    """
    What `save_serving_artifacts` wrote.

    Attributes:
        task (`str`): the task the graphs serve (a key of `TASKS`).
        files (`dict[str, Path]`): "onnx", "onnx_int8", "onnx_optimized", "openvino" -> the file in the folder (the
            `.xml` for OpenVINO, whose weights are the `.bin` next to it), for those written.
        max_abs_delta (`dict[str, float]`): the same keys, except "onnx_int8" -> max |delta| between the file's
            outputs and the model's on the check inputs (random ids, a padded batch of another shape than the traced
            one), padding positions included.
        fusions (`dict[str, int]`): with `optimize=True`, onnxscript's count of each fusion that took.
    """

    task: str
    files: dict[str, Path] = field(default_factory=dict)
    max_abs_delta: dict[str, float] = field(default_factory=dict)
    fusions: dict[str, int] = field(default_factory=dict)


def servable_tasks(architecture: str) -> tuple[str, ...]:
    """The tasks a SeqBERT encoder class (by name, as `architectures` in config.json has it) can be exported for: its
    own (first) and feature extraction."""
    own = HEAD_TASKS[ENCODER_CLASSES[architecture]]
    return (own,) if own == "feature-extraction" else (own, "feature-extraction")


def check_engines(engines: Sequence[str], argument: str = "engines") -> tuple[str, ...]:
    """
    Check that `engines` names known engines whose packages are installed; returns them as a tuple without repeats.

    Args:
        engines (`Sequence[str]`): some of `SERVING_ENGINES` ("onnx", "openvino").
        argument (`str`): the name the caller knows the argument by, for the error message.

    Raises:
        ValueError: `engines` is empty, a string, or names an engine not in `SERVING_ENGINES`.
        ImportError: a package an engine needs (`SERVING_ENGINES`) is not installed.
    """
    allowed = ", ".join(repr(name) for name in SERVING_ENGINES)
    if isinstance(engines, str) or not engines or any(engine not in SERVING_ENGINES for engine in engines):
        raise ValueError(f"{argument} ({engines!r}) must be a non-empty list of engines out of {allowed}")
    for engine in engines:
        for package in SERVING_ENGINES[engine]:
            try:
                importlib.import_module(package)
            except ImportError:
                raise ImportError(
                    f"{argument} ({list(engines)!r}) asks for {engine!r}, which needs the {package} package, not "
                    f"installed here: pip install {package} (or pip install 'seqbert[integrations]'), or leave "
                    f"{engine!r} out (allowed: {allowed})"
                ) from None
    return tuple(dict.fromkeys(engines))


def resolve_task(architecture: str, task: str | None, argument: str = "task", source: str = "the model") -> str:
    """
    The task to export a model of class `architecture` (its name) for: `task`, checked, or the class's own task when
    `task` is None. `argument` and `source` (what holds the model) are the names the error messages use.

    Raises:
        ValueError: `architecture` is not a SeqBERT encoder class (`ENCODER_CLASSES`), or it cannot serve `task`.
    """
    if architecture not in ENCODER_CLASSES:
        raise ValueError(
            f"{source} is a {architecture}, which has no serving export: only the encoder classes do "
            f"({', '.join(ENCODER_CLASSES)})"
        )
    servable = servable_tasks(architecture)
    if task is None:
        return servable[0]
    if task not in servable:
        allowed = ", ".join(repr(name) for name in servable)
        raise ValueError(f"{argument} ({task!r}) cannot be served by {source}, a {architecture}: allowed {allowed}")
    return task


def save_serving_artifacts(
    model_dir: str | os.PathLike,
    model: SeqBertPreTrainedModel | None = None,
    *,
    task: str | None = None,
    engines: Sequence[str] = ("onnx", "openvino"),
    int8: bool = True,
    optimize: bool = False,
) -> ServingArtifacts:
    """
    Export the SeqBERT model saved in `model_dir` to ONNX (and int8 ONNX) and OpenVINO files inside that folder, at
    the paths text-embeddings-inference, optimum and sentence-transformers load them from (see the module docstring).

    Args:
        model_dir (`str` or `os.PathLike`): a folder the model was saved to with `save_pretrained` (its `config.json`
            and weights; add the tokenizer too, the engines need it). The files go into its `onnx/` and `openvino/`,
            which are replaced: an engine left out of `engines` loses its folder.
        model (`SeqBertPreTrainedModel`, *optional*): the model in memory, float32, which must be the one saved in
            `model_dir` (same config and weights); default: loaded from `model_dir` (float32), as its
            `architectures` entry names it. Left in the training mode it was in.
        task (`str`, *optional*): the task the graphs serve (`TASKS`): the model's own task (default), or
            "feature-extraction" (the encoder's `last_hidden_state`) for any head.
        engines (`Sequence[str]`): "onnx" and/or "openvino" (`SERVING_ENGINES`).
        int8 (`bool`): with "onnx", also write `onnx/model_qint8_quantized.onnx`.
        optimize (`bool`): with "onnx", also write `onnx/model_optimized.onnx`, fused for ONNX Runtime.

    Returns:
        `ServingArtifacts`: the task, the files written, the max |delta| of each fp32 file on the check inputs, and the
        fusions (with `optimize=True`).

    Raises:
        ValueError: `model_dir` holds no saved model, or a model other than `model` or not a SeqBERT one; the model
            is no encoder (causal LM, seq2seq), is not float32, or is too large for one ONNX file (2 GiB); `task`
            is not one the model serves; `engines` is empty or names an unknown engine; an exported file does not
            reproduce the model within `CHECK_TOLERANCE` (nothing is written then).
        ImportError: a package an engine needs is not installed.
    """
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(
            f"model_dir ({str(model_dir)!r}) holds no saved model (no config.json): save the model there first "
            "(model.save_pretrained(model_dir), with its tokenizer)"
        )
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    if saved.get("model_type") != SeqBertConfig.model_type:
        raise ValueError(
            f"model_dir ({str(model_dir)!r}) holds a {saved.get('model_type')!r} model, not a "
            f"{SeqBertConfig.model_type!r} one"
        )
    architecture = type(model).__name__ if model is not None else saved_architecture(model_dir)
    source = "model" if model is not None else f"the model in model_dir ({str(model_dir)!r})"
    task = resolve_task(architecture, task, source=source)
    engines = check_engines(engines)
    if model is None:
        model = ENCODER_CLASSES[architecture].from_pretrained(model_dir, dtype=torch.float32)
    else:
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes != {torch.float32}:
            raise ValueError(
                f"model has {sorted(map(str, dtypes))} parameters: the exported files are float32; pass model.float()"
            )
        _check_is_saved_model(model, model_dir, saved)
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if size >= PROTOBUF_LIMIT:
        raise ValueError(
            f"model ({size / 2**30:.1f} GiB of weights) does not fit one ONNX file ({PROTOBUF_LIMIT / 2**30:.0f} GiB, "
            "protobuf's limit); external ONNX weights are not supported here"
        )

    staging_root = model_dir / ".cache"
    created_root = not staging_root.exists()
    staging_root.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="seqbert-serving-", dir=staging_root))
    was_training = model.training
    try:
        artifacts = _export(model, task, engines, int8, optimize, staging)
        for folder in SERVING_FOLDERS:  # all of them, so no file of an earlier export stays next to the new ones
            if (model_dir / folder).exists():
                os.replace(model_dir / folder, staging / f"replaced-{folder}")
            if (staging / folder).exists():
                os.replace(staging / folder, model_dir / folder)
    finally:
        model.train(was_training)
        shutil.rmtree(staging, ignore_errors=True)
        if created_root:
            shutil.rmtree(staging_root, ignore_errors=True)
    artifacts.files = {name: model_dir / path for name, path in artifacts.files.items()}
    return artifacts


def saved_architecture(model_dir: str | os.PathLike) -> str:
    """The class name `architectures` names in the config.json of `model_dir` (SeqBertModel when it names none)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return (config.get("architectures") or [SeqBertModel.__name__])[0]


def _check_is_saved_model(model: SeqBertPreTrainedModel, model_dir: Path, saved: dict) -> None:
    """Raise unless `model_dir` holds `model`: its class, its config and every saved tensor equal to the model's."""
    from safetensors import safe_open

    reason = None
    # What save_pretrained records about the saving rather than the model.
    volatile = {
        "architectures",
        "auto_map",
        "dtype",
        "torch_dtype",
        "transformers_version",
        "seqbert_version",
        "_name_or_path",
    }
    ours = {k: v for k, v in json.loads(model.config.to_json_string()).items() if k not in volatile}
    theirs = {k: v for k, v in saved.items() if k not in volatile}
    changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = ["model.safetensors"] if (model_dir / "model.safetensors").is_file() else []
    if type(model).__name__ not in (saved.get("architectures") or []):
        reason = f"a {(saved.get('architectures') or ['?'])[0]}, where model is a {type(model).__name__}"
    elif changed:
        reason = f"its config differs from model's in {changed}"
    elif not files:
        reason = "no safetensors weights"
    state = model.state_dict()
    for name in files if reason is None else []:
        with safe_open(model_dir / name, framework="pt") as weights:
            for key in weights.keys():
                if key not in state or not torch.equal(weights.get_tensor(key), state[key].detach().cpu()):
                    reason = f"its weight {key} differs from model's"
                    break
        if reason is not None:
            break
    if reason is not None:
        raise ValueError(
            f"model_dir ({str(model_dir)!r}) holds another model ({reason}): pass the folder model was saved to, or "
            "save it there first with model.save_pretrained(model_dir)"
        )


class _TaskOutputs(nn.Module):
    """`model` called with the serving inputs by name; returns the task's outputs as a tuple (the graph's outputs)."""

    def __init__(self, model: nn.Module, output_names: tuple[str, ...]):
        super().__init__()
        self.model, self.output_names = model, output_names

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(outputs[name] for name in self.output_names)


def _sample_inputs(config: SeqBertConfig, task: str, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids in [1, vocab_size), the second row right-padded to half the length (multiple choice: 2 choices)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, 2, length) if task == "multiple-choice" else (batch, length)
    input_ids = torch.randint(1, config.vocab_size, shape, generator=generator)
    attention_mask = torch.ones(shape, dtype=torch.long)
    attention_mask[1, ..., length // 2 :] = 0
    inputs = {"input_ids": input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)}
    inputs["attention_mask"] = attention_mask
    if config.type_vocab_size > 0:
        inputs["token_type_ids"] = torch.randint(0, config.type_vocab_size, shape, generator=generator) * attention_mask
    return inputs


def _export(model, task: str, engines: tuple[str, ...], int8: bool, optimize: bool, staging: Path) -> ServingArtifacts:
    """Write the files under `staging` (paths relative to it in `files`) and check each fp32 one against `model`."""
    config = model.config
    module = model if task == HEAD_TASKS[type(model)] else model.base_model  # feature extraction of a head
    graph = _TaskOutputs(module, TASKS[task]).eval()
    sample = _sample_inputs(config, task, batch=2, length=8, seed=0)
    check = _sample_inputs(config, task, batch=3, length=11, seed=1)  # another batch size and length
    with torch.no_grad():
        expected = [t.numpy() for t in graph(**check)]

    batch = torch.export.Dim("batch_size")
    learned = config.position_embedding_type == "learned"
    length = torch.export.Dim("sequence_length", max=config.max_position_embeddings if learned else None)
    axes = (
        {0: batch, 1: torch.export.Dim("num_choices"), 2: length}
        if task == "multiple-choice"
        else {0: batch, 1: length}
    )
    artifacts = ServingArtifacts(task)
    onnx_path = staging / ONNX_PATH
    onnx_path.parent.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on axis names and torch's pytree deprecations
        program = torch.onnx.export(
            graph,
            args=(),
            kwargs=sample,
            dynamic_shapes={name: axes for name in sample},
            output_names=list(TASKS[task]),
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
        )
    program.save(str(onnx_path), external_data=False)
    if "onnx" in engines:
        artifacts.files["onnx"] = Path(ONNX_PATH)
        artifacts.max_abs_delta["onnx"] = _check_onnx(onnx_path, check, expected, "the ONNX export")
        if optimize:
            artifacts.fusions = _optimize_onnx(onnx_path, staging / ONNX_OPTIMIZED_PATH)
            artifacts.files["onnx_optimized"] = Path(ONNX_OPTIMIZED_PATH)
            artifacts.max_abs_delta["onnx_optimized"] = _check_onnx(
                staging / ONNX_OPTIMIZED_PATH, check, expected, "the optimized ONNX graph"
            )
        if int8:
            _quantize_onnx(onnx_path, staging / ONNX_INT8_PATH, staging)
            artifacts.files["onnx_int8"] = Path(ONNX_INT8_PATH)
    if "openvino" in engines:
        xml_path = staging / OPENVINO_PATH
        _convert_openvino(onnx_path, xml_path)
        artifacts.files["openvino"] = Path(OPENVINO_PATH)
        artifacts.max_abs_delta["openvino"] = _check_openvino(xml_path, check, expected, TASKS[task])
    if "onnx" not in engines:
        shutil.rmtree(onnx_path.parent)  # only the intermediate of the OpenVINO conversion
    return artifacts


def _assert_close(got: list, expected: list, what: str) -> float:
    """Max |delta| of `got` from `expected` (lists of arrays); raises when over `CHECK_TOLERANCE`."""
    atol, rtol = CHECK_TOLERANCE
    worst = 0.0
    for value, reference in zip(got, expected, strict=True):
        delta = abs(value.astype("float64") - reference)
        if value.shape != reference.shape or (delta > atol + rtol * abs(reference)).any():
            raise ValueError(
                f"{what} does not reproduce the model (shape {value.shape} against {reference.shape}, max |delta| "
                f"{delta.max():.3g}): nothing was written; please report this with the model's config"
            )
        worst = max(worst, float(delta.max()))
    return worst


def _check_onnx(path: Path, inputs: dict, expected: list, what: str) -> float:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return _assert_close(session.run(None, {k: v.numpy() for k, v in inputs.items()}), expected, what)


def _optimize_onnx(source: Path, target: Path) -> dict[str, int]:
    """`source` fused into ONNX Runtime's operators by onnxscript's `optimize_for_ort`; returns the fusion counts."""
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, counts = optimize_for_ort(onnx_ir.load(str(source)))
    onnx_ir.save(model, str(target))
    return {name: count for name, count in counts.items() if count}


def _quantize_onnx(source: Path, target: Path, staging: Path) -> None:
    """onnxruntime's recipe: `quant_pre_process` (shape inference, graph clean-up), then `quantize_dynamic`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = staging / "prepared.onnx"
    quant_pre_process(str(source), str(prepared))
    quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8, per_channel=True)
    prepared.unlink()


def _convert_openvino(source: Path, target: Path) -> None:
    import openvino

    target.parent.mkdir()
    # fp32 weights: save_model's default (compress_to_fp16=True) rounds them to fp16.
    openvino.save_model(openvino.convert_model(str(source)), str(target), compress_to_fp16=False)


def _check_openvino(path: Path, inputs: dict, expected: list, output_names: tuple[str, ...]) -> float:
    import openvino

    compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled({k: v.numpy() for k, v in inputs.items()})
    return _assert_close([results[compiled.output(name)] for name in output_names], expected, "the OpenVINO model")
