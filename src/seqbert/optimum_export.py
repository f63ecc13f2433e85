"""optimum export configs for SeqBERT, registered when optimum's exporters are imported.

optimum's exporters (the OpenVINO one of optimum-intel, `optimum.exporters.openvino`, and the ONNX one of optimum-onnx,
`optimum.exporters.onnx`) export only the model types in `TasksManager`'s tables. For any other `model_type`,
`OVModelForFeatureExtraction.from_pretrained(folder, export=True)`, `main_export(...)` and sentence-transformers'
`backend="openvino"` / `backend="onnx"` stop with "Trying to export a seqbert model, that is a custom or unsupported
architecture". `TasksManager.create_register(exporter)` adds a model type to those tables.

SeqBERT takes BERT's inputs and gives BERT's outputs whatever its norm placement, so its export configs are BERT's
(`BertOpenVINOConfig`, `BertOnnxConfig`: `NormalizedTextConfig`, dynamic batch, sequence and choice axes, the
outputs `last_hidden_state`, `logits`, `start_logits` / `end_logits` of each task) with two differences:
- `token_type_ids` is an input only when the config has a segment embedding that tells segments apart
  (`type_vocab_size >= 2`); with 0 or 1 the model adds segment 0's embedding (or none) by itself, and optimum's dummy
  segment ids, drawn from [0, 2), would not fit.
- a task the checkpoint's head cannot serve (`text-classification` of a `SeqBertModel` folder, which would export a
  randomly initialised classifier) is refused in one line (`check_export_task`).

An integration with another library, not part of the model, as `peft_integration.py` is. optimum stays optional and
costs nothing when it is absent: `register_optimum_export_configs_on_import()` only looks up whether `optimum` is
installed, and registers once the module that defines BERT's export config (`EXPORTERS`) has been imported.
"""

import functools
import importlib
import importlib.util
import sys
import warnings

from .peft_integration import AfterImport


# The tasks SeqBERT's encoder heads serve, under optimum's task names.
SEQBERT_EXPORT_TASKS = (
    "feature-extraction",
    "fill-mask",
    "text-classification",
    "token-classification",
    "question-answering",
    "multiple-choice",
)

# Which tasks a saved checkpoint serves, by its `config.architectures[0]`: the encoder (feature-extraction, which
# `AutoModel` loads from any encoder checkpoint, and from a seq2seq checkpoint's encoder) and the task of its head.
# A decoder-only `SeqBertForCausalLM` has no bidirectional encoder to export.
TASKS_FOR_ARCHITECTURE = {
    "SeqBertModel": ("feature-extraction",),
    "SeqBertForMaskedLM": ("feature-extraction", "fill-mask"),
    "SeqBertForSequenceClassification": ("feature-extraction", "text-classification"),
    "SeqBertForTokenClassification": ("feature-extraction", "token-classification"),
    "SeqBertForQuestionAnswering": ("feature-extraction", "question-answering"),
    "SeqBertForMultipleChoice": ("feature-extraction", "multiple-choice"),
    "SeqBertForConditionalGeneration": ("feature-extraction",),
    "SeqBertForCausalLM": (),
}

# optimum's exporters: the module that defines BERT's export config (registration waits for its import), the class,
# and the package that installs it.
EXPORTERS = {
    "openvino": ("optimum.exporters.openvino.model_configs", "BertOpenVINOConfig", "optimum-intel[openvino]"),
    "onnx": ("optimum.exporters.onnx.model_configs", "BertOnnxConfig", "optimum-onnx"),
}


def check_export_task(config, task: str) -> None:
    """
    Check that a SeqBERT checkpoint serves `task` before optimum exports it: optimum loads the task's Auto class
    (`AutoModelForSequenceClassification` for "text-classification"), which would give a freshly initialised head on a
    checkpoint without one, and export it without a word.

    Args:
        config (`SeqBertConfig`): the checkpoint's config; its `architectures` (written by `save_pretrained`) names
            the head. A config without `architectures` (built in memory) passes for every task in
            `SEQBERT_EXPORT_TASKS`.
        task (`str`): optimum's task name.

    Raises:
        ValueError: `task` is not one of `SEQBERT_EXPORT_TASKS`, or the checkpoint's head does not serve it
            (`TASKS_FOR_ARCHITECTURE`).
    """
    if task not in SEQBERT_EXPORT_TASKS:
        raise ValueError(f"task ({task!r}) must be one of the tasks SeqBERT exports: {', '.join(SEQBERT_EXPORT_TASKS)}")
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        return
    architecture = architectures[0]
    served = TASKS_FOR_ARCHITECTURE.get(architecture)
    if served is None:
        raise ValueError(
            f"config.architectures ({architectures!r}) names no SeqBERT model that optimum exports: it must start "
            f"with one of {', '.join(TASKS_FOR_ARCHITECTURE)}"
        )
    if task not in served:
        allowed = f"it serves only {', '.join(served)}" if served else "a decoder-only model serves none of them"
        raise ValueError(
            f"task ({task!r}) cannot be exported from a {architecture} checkpoint, whose head does not serve it "
            f"({allowed}): save the model with the head of that task first"
        )


def _seqbert_export_config(bert_export_config: type) -> type:
    """The SeqBERT export config of one exporter: `bert_export_config` with the task check and the `token_type_ids`
    rule of the module docstring."""

    class SeqBertExportConfig(bert_export_config):
        def __init__(self, config, task: str = "feature-extraction", **kwargs):
            check_export_task(config, task)
            super().__init__(config, task=task, **kwargs)

        @property
        def inputs(self) -> dict[str, dict[int, str]]:
            inputs = super().inputs
            if self._config.type_vocab_size < 2:
                inputs.pop("token_type_ids", None)
            return inputs

    name = bert_export_config.__name__.replace("Bert", "SeqBert", 1)
    SeqBertExportConfig.__name__ = SeqBertExportConfig.__qualname__ = name
    SeqBertExportConfig.__doc__ = f"`{bert_export_config.__name__}` for `model_type` 'seqbert' (see `optimum_export`)."
    return SeqBertExportConfig


def register_optimum_export_config(exporter: str, model_configs=None) -> type:
    """
    Register SeqBERT's export config for `exporter` with optimum's `TasksManager`, for every task of
    `SEQBERT_EXPORT_TASKS`. Runs by itself when the exporter's model configs are imported (see
    `register_optimum_export_configs_on_import`), so users never call it; calling it again changes nothing.

    Args:
        exporter (`str`): "openvino" (optimum-intel) or "onnx" (optimum-onnx).
        model_configs (module, *optional*): the exporter's model-configs module (`EXPORTERS`); imported when None.

    Returns:
        `type`: the registered config class (`SeqBertOpenVINOConfig` or `SeqBertOnnxConfig`), a subclass of BERT's.

    Raises:
        ValueError: `exporter` is not one of `EXPORTERS`.
        ImportError: the package of `exporter` is not installed; the message names it.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter ({exporter!r}) must be one of {', '.join(map(repr, EXPORTERS))}")
    module_name, class_name, package = EXPORTERS[exporter]
    if model_configs is None:
        try:
            model_configs = importlib.import_module(module_name)  # optimum is optional: imported here only
        except ModuleNotFoundError as error:
            if error.name is None or not module_name.startswith(error.name):
                raise  # installed, but one of its own imports is missing: optimum's message says which
            raise ImportError(
                f"exporter ({exporter!r}) needs {package}, which is not installed here ({error}): "
                f"pip install '{package}'"
            ) from None
    tasks_manager = importlib.import_module("optimum.exporters.tasks").TasksManager
    registered = tasks_manager.get_supported_tasks_for_model_type
    if _registered_config(registered, exporter) is None:
        config_class = _seqbert_export_config(getattr(model_configs, class_name))
        tasks_manager.create_register(exporter)("seqbert", *SEQBERT_EXPORT_TASKS)(config_class)
    return _registered_config(registered, exporter)


def _registered_config(supported_tasks, exporter: str) -> type | None:
    """The config class registered for 'seqbert' with `exporter`, or None."""
    try:
        constructors = supported_tasks("seqbert", exporter, library_name="transformers")
    except KeyError:
        return None
    constructor = constructors["feature-extraction"]  # functools.partial(config_class, task=...)
    return getattr(constructor, "func", constructor)


def _register_after_import(exporter: str, model_configs) -> None:
    """The import hook's callback. It runs inside the user's `import optimum...`, which must not fail because of
    seqbert: if an optimum release has moved what the registration uses, it warns (and optimum will refuse seqbert
    models as unsupported) instead of raising."""
    try:
        register_optimum_export_config(exporter, model_configs)
    except Exception as error:
        warnings.warn(
            f"seqbert could not register its {exporter} export config with optimum ({type(error).__name__}: "
            f"{error}): optimum's {exporter} exporter will refuse seqbert models",
            stacklevel=2,
        )


def register_optimum_export_configs_on_import() -> None:
    """Run `register_optimum_export_config` for each exporter of `EXPORTERS` now if its model configs were already
    imported, else right after they are first imported (when optimum is installed at all). Importing seqbert calls
    it; calling it again adds nothing."""
    if importlib.util.find_spec("optimum") is None:
        return
    for exporter, (module_name, _, _) in EXPORTERS.items():
        if module_name in sys.modules:
            _register_after_import(exporter, sys.modules[module_name])
        elif not any(getattr(finder, "module_name", None) == module_name for finder in sys.meta_path):
            sys.meta_path.insert(0, AfterImport(module_name, functools.partial(_register_after_import, exporter)))
