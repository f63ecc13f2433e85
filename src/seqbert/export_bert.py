"""Back to BERT: a post-LN SeqBERT encoder as the transformers BERT class that computes the same, in memory or saved.

A SeqBERT model with `norm_placement="post"`, learned positions and unscaled embeddings (what `from_bert_pretrained`
builds, and what it can be fine-tuned into) computes exactly BERT. `to_bert` gives the matching `transformers` BERT
model with the same weights; `save_as_bert` writes it as a plain BERT folder with its tokenizer (and a
sentence-transformers model's pooling modules), the layout that BERT-only engines take as it is: stock CTranslate2,
OpenVINO and ONNX Runtime through `torch.onnx.export` (tested in tests/test_export_bert.py), and the BERT loaders of
TEI, vLLM and llama.cpp's GGUF converter (not tried here). No seqbert code goes into that folder.

The weight names are those of `convert_bert`, read backwards: BERT's own parameter names, renamed by
`bert_state_dict_to_seqbert`, say which SeqBERT tensor each one takes. BERT -> SeqBERT -> BERT therefore gives back
every tensor bit for bit.

SeqBERT class (task)                                     transformers BERT class
SeqBertModel ("feature-extraction")                      BertModel (with the pooler when the SeqBERT model has one)
SeqBertForMaskedLM ("fill-mask")                         BertForMaskedLM (tied or untied decoder, as the config says)
SeqBertForSequenceClassification ("text-classification") BertForSequenceClassification
SeqBertForTokenClassification ("token-classification")   BertForTokenClassification
SeqBertForQuestionAnswering ("question-answering")       BertForQuestionAnswering
SeqBertForMultipleChoice ("multiple-choice")             BertForMultipleChoice

Every encoder head also exports its encoder alone as `BertModel` (`task="feature-extraction"`).

This module is not imported by `modeling_seqbert.py`, so it is not copied into saved SeqBERT folders.
"""

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertPreTrainedModel,
    PretrainedConfig,
)
from transformers import initialization as init
from transformers.utils import cached_file, logging

from .configuration_seqbert import SeqBertConfig
from .convert_bert import bert_state_dict_to_seqbert
from .hub import copy_sentence_transformers_modules
from .modeling_seqbert import (
    SeqBertForCausalLM,
    SeqBertForConditionalGeneration,
    SeqBertForMaskedLM,
    SeqBertForMultipleChoice,
    SeqBertForQuestionAnswering,
    SeqBertForSequenceClassification,
    SeqBertForTokenClassification,
    SeqBertModel,
    SeqBertPreTrainedModel,
)


logger = logging.get_logger(__name__)


# The task each SeqBERT encoder class serves (the names of transformers' pipelines and optimum's exporters), and the
# BERT class of each task.
SEQBERT_CLASS_TASKS = {
    SeqBertModel: "feature-extraction",
    SeqBertForMaskedLM: "fill-mask",
    SeqBertForSequenceClassification: "text-classification",
    SeqBertForTokenClassification: "token-classification",
    SeqBertForQuestionAnswering: "question-answering",
    SeqBertForMultipleChoice: "multiple-choice",
}
BERT_CLASS_FOR_TASK = {
    "feature-extraction": BertModel,
    "fill-mask": BertForMaskedLM,
    "text-classification": BertForSequenceClassification,
    "token-classification": BertForTokenClassification,
    "question-answering": BertForQuestionAnswering,
    "multiple-choice": BertForMultipleChoice,
}
TASKS = tuple(BERT_CLASS_FOR_TASK)

# SeqBERT config fields copied into the BertConfig under the same name: BERT has each of them, with the same meaning.
_SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "initializer_range",
    "layer_norm_eps",
    "classifier_dropout",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "problem_type",
)

# SeqBERT fields whose other values BERT cannot express: field -> (the value BERT computes, what BERT lacks).
_BERT_ONLY_VALUES = {
    "norm_placement": (
        "post",
        "BERT has post-LN layers only (LayerNorm after each residual sum): no LayerNorm before each sub-layer and no "
        "final LayerNorm",
    ),
    "position_embedding_type": ("learned", "BERT has a learned position table only, no sinusoidal positions"),
    "scale_embedding": (False, "BERT does not scale word embeddings by sqrt(hidden_size)"),
    "is_encoder_decoder": (False, "BERT is an encoder only, with no decoder"),
}

# Files that make a folder a model folder (what `save_as_bert` refuses to write over without `overwrite=True`).
_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


def _refusal(model_class: type) -> str:
    """The start of a refusal's one-line message: the argument and the model's class."""
    return f"model ({model_class.__name__}) cannot be exported to BERT"


def _bert_lacks(config: SeqBertConfig) -> str | None:
    """What of `config` BERT lacks, as the end of a one-line error message, or None when BERT expresses it all."""
    lacking = [
        f"{field}={getattr(config, field)!r} ({lacks})"
        for field, (bert_value, lacks) in _BERT_ONLY_VALUES.items()
        if getattr(config, field) != bert_value
    ]
    if not lacking:
        return None
    return (
        f"{'; '.join(lacking)}. Only post-LN SeqBERT encoders with learned positions and unscaled embeddings (as "
        "from_bert_pretrained builds them) compute what BERT computes"
    )


def _class_task(model_class: type) -> str:
    """The task of a SeqBERT class (`SEQBERT_CLASS_TASKS`); ValueError for decoders and seq2seq models."""
    if issubclass(model_class, (SeqBertForCausalLM, SeqBertForConditionalGeneration)) or not issubclass(
        model_class, tuple(SEQBERT_CLASS_TASKS)
    ):
        allowed = ", ".join(cls.__name__ for cls in SEQBERT_CLASS_TASKS)
        raise ValueError(
            f"{_refusal(model_class)}: BERT is an encoder only, with no causal decoder and no decoder over an "
            f"encoder; the SeqBERT encoder classes convert ({allowed})"
        )
    return next(task for cls, task in SEQBERT_CLASS_TASKS.items() if issubclass(model_class, cls))


def _check_expressible(model_class: type, config: SeqBertConfig) -> str:
    """The task of `model_class`; ValueError (one line) when it or `config` has what BERT lacks."""
    task = _class_task(model_class)
    lacking = _bert_lacks(config)
    if lacking:
        raise ValueError(f"{_refusal(model_class)}: {lacking}")
    return task


def bert_config_from_seqbert(config: SeqBertConfig) -> BertConfig:
    """
    The `BertConfig` of the BERT model that computes what a post-LN SeqBERT encoder computes: the inverse of
    `SeqBertConfig.from_bert_config`.

    Every field BERT has is carried over: sizes, `hidden_act`, dropout probabilities, `layer_norm_eps`,
    `initializer_range`, `classifier_dropout`, special token ids, `tie_word_embeddings`, the label maps and
    `problem_type`. A negative `pad_token_id` (SeqBERT's "no pad token") becomes `None`, BERT's way to reserve no
    padding row. `type_vocab_size=0` (no segment embedding) becomes BERT's single segment whose embedding row
    `to_bert` sets to zeros, which adds exactly nothing. `position_embedding_type="absolute"` is written too: BERT's
    only kind, which transformers 5 no longer stores but older transformers and CTranslate2's BERT loader read.
    Seq2seq-only fields (`num_decoder_layers`, `cross_attention_source`, ...) and `sparse_prediction` (which only
    changes which logits a masked-LM returns during training with labels, not the loss) have no BERT counterpart and
    are dropped.

    Args:
        config (`SeqBertConfig`): the SeqBERT configuration.

    Returns:
        `BertConfig`.

    Raises:
        ValueError: `config` uses what BERT lacks (`norm_placement="pre"`, `position_embedding_type="sinusoidal"`,
            `scale_embedding=True`, `is_encoder_decoder=True`); one line names each such field and what BERT lacks.
    """
    lacking = _bert_lacks(config)
    if lacking:
        raise ValueError(f"config ({type(config).__name__}) cannot be expressed as a BertConfig: {lacking}")
    fields = {field: getattr(config, field) for field in _SHARED_FIELDS}
    pad_token_id = config.pad_token_id
    return BertConfig(
        **fields,
        type_vocab_size=max(config.type_vocab_size, 1),
        pad_token_id=None if pad_token_id is None or pad_token_id < 0 else pad_token_id,
        position_embedding_type="absolute",
    )


def to_bert(model: SeqBertPreTrainedModel, task: str | None = None) -> BertPreTrainedModel:
    """
    The transformers BERT model that computes what the post-LN SeqBERT encoder `model` computes, with copies of its
    weights (`bert_config_from_seqbert` gives the config). In fp32 eval mode with eager attention on both sides, every
    output on real tokens is bit-identical to `model`'s (max |delta| 0.0, with or without padding); sdpa attention
    differs from SeqBERT's only as SeqBERT's own unpadded fast path does (last bits). `model` is left unchanged.

    Args:
        model (`SeqBertPreTrainedModel`): a SeqBERT encoder model: `SeqBertModel`, `SeqBertForMaskedLM`,
            `SeqBertForSequenceClassification`, `SeqBertForTokenClassification`, `SeqBertForQuestionAnswering` or
            `SeqBertForMultipleChoice` (`SEQBERT_CLASS_TASKS`), with `norm_placement="post"`, learned positions and
            no embedding scaling. An `optimize_for_cpu_inference` copy converts too (its weights are the model's).
        task (`str`, *optional*): one of `TASKS`: the model's own (the default; `SEQBERT_CLASS_TASKS`) or
            `"feature-extraction"`, which keeps the encoder only (`BertModel`, with the pooler when `model` has one)
            and drops the head.

    Returns:
        `BertPreTrainedModel`: the `BERT_CLASS_FOR_TASK[task]` model, on `model`'s device and in its dtype, with the
        same attention implementation and train/eval mode.

    Raises:
        TypeError: `model` is not a SeqBERT model (a PEFT model: merge its adapters first with `merge_and_unload()`).
        ValueError: `model` is a decoder or seq2seq model, its config uses what BERT lacks (see
            `bert_config_from_seqbert`), it holds weights BERT has no place for, or `task` is not one `model`'s head
            serves; one line names what is wrong and what is allowed.
    """
    if not isinstance(model, SeqBertPreTrainedModel):
        hint = ": merge its adapters first with merge_and_unload()" if hasattr(model, "merge_and_unload") else ""
        raise TypeError(f"model must be a SeqBERT model (SeqBertPreTrainedModel), got {type(model).__name__}{hint}")
    own_task = _check_expressible(type(model), model.config)
    if task is None:
        task = own_task
    if task not in (own_task, "feature-extraction"):
        hint = f" (TASKS: {', '.join(map(repr, TASKS))})" if task not in TASKS else ""
        raise ValueError(
            f"task ({task!r}) cannot be served by {type(model).__name__}{hint}: its head serves {own_task!r}, and "
            "'feature-extraction' exports its encoder alone"
        )
    bert_config = bert_config_from_seqbert(model.config)
    bert_config._attn_implementation = model.config._attn_implementation
    bert_class = BERT_CLASS_FOR_TASK[task]
    base = getattr(model, "seqbert", model)  # the SeqBertModel
    with init.no_init_weights():  # every parameter is loaded below
        if bert_class is BertModel:
            bert = BertModel(bert_config, add_pooling_layer=base.pooler is not None)
        else:
            bert = bert_class(bert_config)
    embeddings = base.get_input_embeddings().weight
    bert.to(device=embeddings.device, dtype=embeddings.dtype)
    bert.load_state_dict(_bert_state_dict(model, bert, task == own_task))
    bert.tie_weights()  # the tied decoder of a masked-LM head (not tied yet: no_init_weights skips post_init's tying)
    return bert.train(model.training)


def _bert_state_dict(
    model: SeqBertPreTrainedModel, bert: BertPreTrainedModel, keep_head: bool
) -> dict[str, torch.Tensor]:
    """`bert`'s state dict filled with `model`'s tensors: each BERT name renamed by `bert_state_dict_to_seqbert`
    names the SeqBERT tensor it takes. ValueError when `model` holds (body, or with `keep_head` head) tensors that
    no BERT name takes."""
    ours = model.state_dict()
    if isinstance(model, SeqBertModel):
        ours = {f"seqbert.{key}": tensor for key, tensor in ours.items()}
    decoder, word_embeddings = ours.get("lm_head.decoder.weight"), ours["seqbert.embeddings.word_embeddings.weight"]
    if model.config.tie_word_embeddings and decoder is not None and decoder.data_ptr() == word_embeddings.data_ptr():
        del ours["lm_head.decoder.weight"]  # the word embeddings, which BERT ties the same way
    # Renaming BERT's key names (rather than tensors) gives {SeqBERT name: BERT name}.
    names = bert_state_dict_to_seqbert({key: key for key in bert.state_dict()}, model.config)
    unplaced = sorted(key for key in ours if key not in names and (keep_head or key.startswith("seqbert.")))
    if unplaced:
        shown = ", ".join(unplaced[:5]) + (f" (and {len(unplaced) - 5} more)" if len(unplaced) > 5 else "")
        raise ValueError(
            f"{_refusal(type(model))}: it holds weights that BERT has no place for: {shown} (a PEFT adapter: merge it "
            "first with merge_and_unload(); a module replaced after loading: export the original model)"
        )
    state_dict = {bert_name: ours[name] for name, bert_name in names.items() if name in ours}
    word_embeddings = state_dict[_prefixed(bert, "embeddings.word_embeddings.weight")]
    if model.config.type_vocab_size == 0:  # BERT's one segment, adding nothing (see bert_config_from_seqbert)
        state_dict[_prefixed(bert, "embeddings.token_type_embeddings.weight")] = word_embeddings.new_zeros(
            1, word_embeddings.shape[1]
        )
    if isinstance(bert, BertForMaskedLM):
        # BERT keeps the decoder's weight (tied: the word embeddings) and its bias (tied: `cls.predictions.bias`) twice.
        if model.config.tie_word_embeddings:
            state_dict["cls.predictions.decoder.weight"] = word_embeddings
        state_dict["cls.predictions.decoder.bias"] = state_dict["cls.predictions.bias"]
    return state_dict


def _prefixed(bert: BertPreTrainedModel, key: str) -> str:
    return key if isinstance(bert, BertModel) else f"bert.{key}"


def _folder_contents(folder: Path) -> str:
    names = sorted(os.listdir(folder))
    return ", ".join(names[:6]) + (f" (and {len(names) - 6} more)" if len(names) > 6 else "")


def _check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse an `output_dir` that is a file, or a non-empty folder unless `overwrite` and it holds a model."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise ValueError(f"output_dir ({str(output_dir)!r}) is a file; a BERT folder needs a new or empty folder")
    if not any(output_dir.iterdir()):
        return
    config_path = output_dir / "config.json"
    model_files = [name for name in _MODEL_FILES if (output_dir / name).is_file()]
    if not model_files:
        raise ValueError(
            f"output_dir ({str(output_dir)!r}) is not empty and holds no model ({_folder_contents(output_dir)}): "
            "choose a new or empty folder (overwrite=True replaces only a folder that holds a model)"
        )
    if not overwrite:
        what = "a model"
        if config_path.is_file():
            try:
                model_type = PretrainedConfig.get_config_dict(str(output_dir))[0].get("model_type")
                what = f"a model (config.json of model_type {model_type!r})"
            except (OSError, ValueError):
                what = "a model (config.json, unreadable)"
        raise ValueError(
            f"output_dir ({str(output_dir)!r}) already holds {what}: choose a new or empty folder, or pass "
            "overwrite=True (--overwrite_output_dir) to replace it"
        )


def _has_tokenizer(name_or_path) -> bool:
    """Whether the local folder or Hub model `name_or_path` has tokenizer files (never downloads a missing one)."""
    return any(
        cached_file(
            str(name_or_path),
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
        for filename in _TOKENIZER_FILES
    )


def _load_tokenizer(name_or_path, argument: str):
    """`AutoTokenizer.from_pretrained(name_or_path)`, failures as one-line ValueErrors naming `argument`."""
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path))
    except (OSError, ValueError) as error:
        detail = " ".join(str(error).split())
        raise ValueError(f"{argument} ({str(name_or_path)!r}): its tokenizer cannot be loaded ({detail})") from None


def _load_seqbert(name_or_path) -> SeqBertPreTrainedModel:
    """The SeqBERT model saved at `name_or_path`, of the class its config's `architectures` names."""
    try:
        config_dict, _ = PretrainedConfig.get_config_dict(str(name_or_path))
    except OSError as error:
        raise ValueError(
            f"model_or_path ({str(name_or_path)!r}) is neither a SeqBERT model nor a SeqBERT folder or Hub id with a "
            f"config.json ({error})"
        ) from None
    model_type = config_dict.get("model_type")
    if model_type != SeqBertConfig.model_type:
        hint = " (it is already BERT)" if model_type == "bert" else ""
        raise ValueError(
            f"model_or_path ({str(name_or_path)!r}) is a {model_type!r} model{hint}, not SeqBERT (config.json "
            f"model_type must be {SeqBertConfig.model_type!r})"
        )
    classes = {cls.__name__: cls for cls in (*SEQBERT_CLASS_TASKS, SeqBertForCausalLM, SeqBertForConditionalGeneration)}
    architecture = (config_dict.get("architectures") or ["SeqBertModel"])[0]
    if architecture not in classes:
        raise ValueError(
            f"model_or_path ({str(name_or_path)!r}) holds a {architecture!r} (config.json architectures), which is "
            f"not a SeqBERT encoder class; allowed: {', '.join(cls.__name__ for cls in SEQBERT_CLASS_TASKS)}"
        )
    model_class = classes[architecture]
    config = SeqBertConfig.from_pretrained(name_or_path)
    _check_expressible(model_class, config)  # before reading the weights
    return model_class.from_pretrained(name_or_path, config=config)


def save_as_bert(
    model_or_path,
    output_dir,
    tokenizer=None,
    task: str | None = None,
    overwrite: bool = False,
) -> Path:
    """
    Write a post-LN SeqBERT encoder as a plain transformers BERT folder (`to_bert`, then `save_pretrained`): BERT's
    config.json and model.safetensors, the tokenizer, and a sentence-transformers model's modules (`modules.json`,
    pooling, normalisation) when the SeqBERT folder has them. `BertModel.from_pretrained(output_dir)` (or the head's
    class), stock CTranslate2, OpenVINO, ONNX Runtime and TEI load it without seqbert. The folder is written next to
    `output_dir` and renamed into place at the end, so no error leaves a half-written folder.

    Args:
        model_or_path (`SeqBertPreTrainedModel`, `str` or `os.PathLike`): the model, or a SeqBERT folder (or Hub id)
            whose config's `architectures` names the class to load.
        output_dir (`str` or `os.PathLike`): the BERT folder to write; must not exist, or be empty, or (with
            `overwrite`) hold a model.
        tokenizer (*optional*): a tokenizer (anything with `save_pretrained`) or the folder / Hub id to load one from;
            by default the tokenizer of `model_or_path` (a folder) or of the folder the model was loaded from
            (`model.name_or_path`). Without one the folder gets none, and a warning says so: engines that read the
            vocabulary from the model folder (CTranslate2, TEI) need it.
        task (`str`, *optional*): as in `to_bert` (`"feature-extraction"` writes the encoder alone as `BertModel`).
        overwrite (`bool`, defaults to `False`): replace an `output_dir` that already holds a model.

    Returns:
        `Path`: `output_dir`.

    Raises:
        TypeError, ValueError: as `to_bert`; also `model_or_path` is not a SeqBERT model or folder (e.g. a BERT
            folder), or names a class that is not a SeqBERT encoder; `output_dir` is a file, is `model_or_path`
            itself, holds a model and `overwrite` is False, or is not empty and holds no model (never replaced);
            `tokenizer` (or the tokenizer files of `model_or_path`) cannot be loaded. Each is one line naming the
            argument, its value and what is allowed; nothing is written. A folder's config is checked before its
            weights are read.
    """
    output_dir = Path(output_dir)
    source = None if isinstance(model_or_path, torch.nn.Module) else model_or_path
    if source is not None and os.path.isdir(source) and Path(source).resolve() == output_dir.resolve():
        raise ValueError(
            f"output_dir ({str(output_dir)!r}) is the SeqBERT folder being exported: choose another folder"
        )
    _check_output_dir(output_dir, overwrite)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = _load_tokenizer(tokenizer, "tokenizer")
    model = _load_seqbert(source) if source is not None else model_or_path
    bert = to_bert(model, task=task)
    origin = source if source is not None else getattr(model, "name_or_path", "")
    if tokenizer is None and origin and _has_tokenizer(origin):
        tokenizer = _load_tokenizer(origin, "model_or_path")
    if tokenizer is None:
        logger.warning(
            f"save_as_bert: {str(output_dir)!r} gets no tokenizer (model_or_path has none): pass tokenizer= for "
            "engines that read the vocabulary from the model folder (CTranslate2, TEI)"
        )
    parent = output_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.bert-", dir=parent))
    replaced = None
    try:
        bert.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if origin and os.path.isdir(origin) and isinstance(bert, BertModel):
            copy_sentence_transformers_modules(str(origin), staging)
        if output_dir.exists():
            replaced = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.replaced-", dir=parent))
            os.replace(output_dir, replaced / "old")
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if replaced is not None and (replaced / "old").exists() and not output_dir.exists():
            os.replace(replaced / "old", output_dir)
        raise
    finally:
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    return output_dir


__all__ = [
    "BERT_CLASS_FOR_TASK",
    "SEQBERT_CLASS_TASKS",
    "TASKS",
    "bert_config_from_seqbert",
    "save_as_bert",
    "to_bert",
]
