"""Read a BERT or BERT2BERT checkpoint (Hub name or local folder) and rename its weights to SeqBERT's.

Used by `SeqBertPreTrainedModel.from_bert_pretrained` and `scripts/hub/convert_bert_checkpoint.py`. It is copied next
to `modeling_seqbert.py` into saved model folders, so it imports only torch and transformers.

BERT body name (after an optional `bert.` prefix)       SeqBERT name ({P} = `seqbert.` or `decoder.`, see below)
embeddings.{word,position,token_type}_embeddings      {P}embeddings.{same}
embeddings.LayerNorm                                   {P}embeddings.layer_norm
encoder.layer.{i}.attention.self.{query,key,value}     {L}.{i}.{A}.{query,key,value}
encoder.layer.{i}.attention.output.dense               {L}.{i}.{A}.out_proj
encoder.layer.{i}.attention.output.LayerNorm           {L}.{i}.{A}_norm
encoder.layer.{i}.crossattention.self.{query,key,value} decoder.layers.{i}.cross_attention.{query,key,value}
encoder.layer.{i}.crossattention.output.dense          decoder.layers.{i}.cross_attention.out_proj
encoder.layer.{i}.crossattention.output.LayerNorm      decoder.layers.{i}.cross_attention_norm
encoder.layer.{i}.intermediate.dense                   {L}.{i}.mlp.up_proj
encoder.layer.{i}.output.dense                         {L}.{i}.mlp.down_proj
encoder.layer.{i}.output.LayerNorm                     {L}.{i}.mlp_norm
pooler.dense                                           seqbert.pooler.dense
cls.predictions.transform.dense                        lm_head.dense
cls.predictions.transform.LayerNorm                    lm_head.layer_norm
cls.predictions.bias                                   lm_head.decoder.bias
classifier, qa_outputs                                 unchanged
embeddings.position_ids (a buffer some files carry)     dropped
anything else (e.g. cls.seq_relationship)              unchanged, so `from_pretrained` reports it as unexpected

The role of the BERT weights sets {P}, the layer stack {L} and the self-attention name {A}:

role       for                                                 {P}        {L}                      {A}
encoder    SeqBertModel and its encoder heads; a seq2seq encoder  seqbert.   seqbert.encoder.layers   attention
decoder    the decoder of SeqBertForConditionalGeneration      decoder.   decoder.layers           self_attention
causal     SeqBertForCausalLM (from a `BertLMHeadModel`)       seqbert.   seqbert.layers           attention

A transformers `EncoderDecoderModel` stores its encoder under `encoder.` and its `BertLMHeadModel` decoder under
`decoder.bert.` / `decoder.cls.`.
"""

import contextlib
import functools
import logging as pylogging
import re

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from transformers.modeling_utils import load_state_dict
from transformers.utils import cached_file, logging

from .checkpoint_loading import (
    _FUSED_ATTENTION,
    _REDOWNLOAD,
    PICKLE_FILES,
    SAFETENSORS_FILES,
    _corrupt,
    _index_shards,
    _listed,
    _missing_shard,
    checkpoint_config_dict,
    find_checkpoint_problem,
    mismatched_sizes_error,
    non_finite_weights_error,
    refuse_pickled_weights,
    safetensors_file_problem,
    weights_file_problem,
)
from .configuration_seqbert import SeqBertConfig


logger = logging.get_logger(__name__)


# BERT sizes that encoder and decoder of one SeqBERT model share.
_SHARED_BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
)

_LAYER = r"^encoder\.layer\.(\d+)\."

# role -> (prefix {P}, layer stack {L}, self-attention name {A}); see the module docstring.
_ROLES = {
    "encoder": ("seqbert.", "seqbert.encoder.layers", "attention"),
    "decoder": ("decoder.", "decoder.layers", "self_attention"),
    "causal": ("seqbert.", "seqbert.layers", "attention"),
}


def _body_renames(role: str) -> list[tuple[str, str]]:
    """Anchored renames of BERT body keys to SeqBERT names for `role` (a key of `_ROLES`)."""
    prefix, layers, attention = _ROLES[role]
    renames = [
        (r"^embeddings\.LayerNorm\.", f"{prefix}embeddings.layer_norm."),
        (r"^embeddings\.(word_embeddings|position_embeddings|token_type_embeddings)\.", prefix + r"embeddings.\1."),
        (_LAYER + r"attention\.self\.(query|key|value)\.", layers + r".\1." + attention + r".\2."),
        (_LAYER + r"attention\.output\.dense\.", layers + r".\1." + attention + ".out_proj."),
        (_LAYER + r"attention\.output\.LayerNorm\.", layers + r".\1." + attention + "_norm."),
        (_LAYER + r"crossattention\.self\.(query|key|value)\.", layers + r".\1.cross_attention.\2."),
        (_LAYER + r"crossattention\.output\.dense\.", layers + r".\1.cross_attention.out_proj."),
        (_LAYER + r"crossattention\.output\.LayerNorm\.", layers + r".\1.cross_attention_norm."),
        (_LAYER + r"intermediate\.dense\.", layers + r".\1.mlp.up_proj."),
        (_LAYER + r"output\.dense\.", layers + r".\1.mlp.down_proj."),
        (_LAYER + r"output\.LayerNorm\.", layers + r".\1.mlp_norm."),
    ]
    if role == "encoder":
        renames.append((r"^pooler\.dense\.", "seqbert.pooler.dense."))
    return renames


_HEAD_RENAMES = [
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
    (r"^cls\.predictions\.bias$", "lm_head.decoder.bias"),
]


def _rename(key: str, renames: list[tuple[str, str]]) -> str:
    for pattern, replacement in renames:
        new_key, n = re.subn(pattern, replacement, key)
        if n:
            return new_key
    return key


def _convert(state_dict: dict[str, torch.Tensor], config: SeqBertConfig, role: str) -> dict[str, torch.Tensor]:
    """Rename one BERT state dict for `role` (see the module docstring): the same tensors under SeqBERT's names."""
    renames = _body_renames(role) + _HEAD_RENAMES
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        key = (
            key.removeprefix("bert.")
            .replace("LayerNorm.gamma", "LayerNorm.weight")
            .replace("LayerNorm.beta", "LayerNorm.bias")
        )
        if key == "embeddings.position_ids":
            continue  # a buffer that old BERT checkpoints saved; SeqBERT builds positions on the fly
        if key == "cls.predictions.decoder.weight":
            if not config.tie_word_embeddings:
                converted["lm_head.decoder.weight"] = tensor
            continue  # otherwise tied to the word embeddings
        if key == "cls.predictions.decoder.bias":
            if "cls.predictions.bias" not in state_dict:
                converted["lm_head.decoder.bias"] = tensor
            continue  # BERT stores the decoder bias twice (tied); keep one copy
        converted[_rename(key, renames)] = tensor
    return converted


def bert_state_dict_to_seqbert(
    state_dict: dict[str, torch.Tensor], config: SeqBertConfig, role: str = "encoder"
) -> dict[str, torch.Tensor]:
    """
    Rename a BERT state dict (any BERT head class, with or without the `bert.` prefix) to SeqBERT names.

    Query, key and value keep their own projections under BERT's names (`attention.query`, ...). Legacy TF-style
    `gamma`/`beta` LayerNorm names are accepted. The MLM decoder weight is dropped when `config.tie_word_embeddings`
    (it is the word embedding matrix).

    Args:
        state_dict: BERT parameter name -> tensor.
        config: the target `SeqBertConfig` (from `SeqBertConfig.from_bert_config`).
        role: `"encoder"` (SeqBertModel and its encoder heads) or `"causal"` (SeqBertForCausalLM, from a
            `BertLMHeadModel`); see the module docstring.

    Returns:
        SeqBERT parameter name -> tensor (the same tensors, not copies).
    """
    return _convert(state_dict, config, role)


_FUSED_PARTS = {"qkv_proj": ("query", "key", "value"), "kv_proj": ("key", "value"), "q_proj": ("query",)}


def split_fused_attention(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """
    A state dict written by seqbert 0.1.0 (fused `qkv_proj`, cross-attention `q_proj` / `kv_proj`) under this
    version's names: each fused tensor split along dim 0 into `query`, `key`, `value` (the order they were fused in).
    Other keys are kept.

    Example (a folder saved by seqbert 0.1.0)::

        from safetensors.torch import load_file, save_file
        state_dict = split_fused_attention(load_file("old/model.safetensors"))
        save_file(state_dict, "old/model.safetensors", metadata={"format": "pt"})
    """
    converted = {}
    for key, tensor in state_dict.items():
        match = _FUSED_ATTENTION.match(key)
        if match is None:
            converted[key] = tensor
            continue
        prefix, fused, kind = match.groups()
        names = _FUSED_PARTS[fused]
        for name, part in zip(names, tensor.chunk(len(names), dim=0), strict=True):
            converted[f"{prefix}.{name}.{kind}"] = part.contiguous()
    return converted


def bert2bert_state_dict_to_seqbert(
    state_dict: dict[str, torch.Tensor], config: SeqBertConfig
) -> dict[str, torch.Tensor]:
    """
    Rename the state dict of a transformers `EncoderDecoderModel` with BERT encoder and decoder to the names of
    `SeqBertForConditionalGeneration`: `encoder.*` as a BERT encoder, `decoder.bert.*` / `decoder.cls.*` as the
    decoder and its LM head.
    """
    encoder = {k.removeprefix("encoder."): v for k, v in state_dict.items() if k.startswith("encoder.")}
    decoder = {k.removeprefix("decoder."): v for k, v in state_dict.items() if k.startswith("decoder.")}
    others = {k: v for k, v in state_dict.items() if not k.startswith(("encoder.", "decoder."))}
    return {**_convert(encoder, config, "encoder"), **_convert(decoder, config, "decoder"), **others}


CROSS_ATTENTION_INITS = ("self_attention", "random")


def warm_start_state_dict(
    state_dict: dict[str, torch.Tensor], config: SeqBertConfig, cross_attention_init: str = "self_attention"
) -> dict[str, torch.Tensor]:
    """
    BERT2BERT warm start (Rothe et al. 2020, "Leveraging Pre-trained Checkpoints for Sequence Generation Tasks"; what
    `EncoderDecoderModel.from_encoder_decoder_pretrained` does): encoder and decoder both start from the same BERT
    weights, as two copies; the LM head from BERT's `cls.predictions` when the checkpoint has one.

    BERT has no cross-attention. With `cross_attention_init="self_attention"` (the default) each decoder layer's
    cross-attention starts as a copy of the same BERT layer's self-attention (query, key, value, output projection
    and its LayerNorm): decoder queries then meet encoder keys in the space BERT's own attention learned, so the
    decoder can attend to the source from the first step. This initialisation is seqbert's own (Rothe et al. leave
    cross-attention random; we know of no published source); the seq2seq ablation in the docs (Benchmarks and measured results) measures it. With
    `"random"`, cross-attention is left out of the state dict, so `from_pretrained` initialises it at random and
    reports it as missing, exactly as BERT2BERT does.

    Raises:
        ValueError: `cross_attention_init` is not one of `CROSS_ATTENTION_INITS`.
    """
    if cross_attention_init not in CROSS_ATTENTION_INITS:
        raise ValueError(
            f"cross_attention_init ({cross_attention_init!r}) must be one of {', '.join(map(repr, CROSS_ATTENTION_INITS))}"
        )
    encoder = {k: v for k, v in _convert(state_dict, config, "encoder").items() if not k.startswith("lm_head.")}
    decoder = {k: v.clone() for k, v in _convert(state_dict, config, "decoder").items()}
    if cross_attention_init == "self_attention":
        decoder.update(
            {
                re.sub(r"\.self_attention(_norm)?\.", r".cross_attention\1.", key): tensor.clone()
                for key, tensor in decoder.items()
                if re.search(r"^decoder\.layers\.\d+\.self_attention(_norm)?\.", key)
            }
        )
    return {**encoder, **decoder}


def _resolve_weight_files(name_or_path: str, use_safetensors: bool | None = None, **hub_kwargs) -> list[str]:
    """Local paths of the checkpoint's weight files (downloading them for Hub names), each checked for truncation.

    safetensors files only, unless `use_safetensors=False` allows pickled `pytorch_model.bin` files as a fallback.

    Raises:
        ValueError: there are no weight files (or only pickled ones and `use_safetensors` is not `False`).
        OSError: the weight index is not valid JSON or names a shard that does not exist, or a safetensors file is
            truncated or corrupt; the message names the file.
    """
    names = SAFETENSORS_FILES + (PICKLE_FILES if use_safetensors is False else ())
    for filename in names:
        resolved = cached_file(
            name_or_path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
        if resolved is None:
            continue
        if not filename.endswith(".index.json"):
            files = [resolved]
        else:
            files = []
            for shard in _index_shards(resolved):
                path = cached_file(name_or_path, shard, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
                if path is None:
                    raise OSError(_missing_shard(resolved, shard))
                files.append(path)
        for path in files:
            if path.endswith(".safetensors") and (problem := safetensors_file_problem(path)) is not None:
                raise OSError(problem)
        return files
    if use_safetensors is not False:
        refuse_pickled_weights(name_or_path, hub_kwargs.get("subfolder") or "")
    allowed = (
        list(names)
        if use_safetensors is False
        else f"{list(names)} (or {list(PICKLE_FILES)} with use_safetensors=False)"
    )
    raise ValueError(
        f"pretrained_model_name_or_path ({str(name_or_path)!r}) has no BERT weights: expected one of {allowed}"
    )


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    """`load_state_dict(path)`, with any failure to read the file turned into an `OSError` that names it."""
    try:
        return load_state_dict(path, map_location="cpu")
    except Exception as error:  # SafetensorError, torch.load's RuntimeError/UnpicklingError/EOFError, ...
        problem = weights_file_problem(path)
        raise OSError(problem or _corrupt(path, f"{type(error).__name__}: {error}")) from error


def _load_config(name_or_path: str, **hub_kwargs):
    """`AutoConfig.from_pretrained`, with a `config.json` that is not valid JSON reported as a corrupt file."""
    try:
        return AutoConfig.from_pretrained(name_or_path, **hub_kwargs)
    except OSError as error:
        problem = find_checkpoint_problem(name_or_path, weights=False, **hub_kwargs)
        if problem is None:
            raise
        raise OSError(problem) from error


# ----------------------------------------------------------------------------------------------------------------------
# Generation ids of a BERT2BERT warm start
# ----------------------------------------------------------------------------------------------------------------------

_GENERATION_IDS = {"decoder_start_token_id": "cls_token", "eos_token_id": "sep_token"}
_PASS_GENERATION_IDS = (
    "pass decoder_start_token_id= and eos_token_id= (the ids of [CLS] and [SEP] in the checkpoint's vocabulary: 101 "
    "and 102 for bert-base-uncased)"
)


def _special_token_defaults(name_or_path: str, overrides: dict, **hub_kwargs) -> dict:
    """
    BERT2BERT's generation ids, as in the transformers BERT2BERT examples: decoding starts at [CLS] and ends at [SEP].
    Ids given in `overrides` win; the others are read from the checkpoint's tokenizer.

    A folder without tokenizer files is an error, not a default: transformers' `AutoTokenizer` then builds a
    `BertTokenizer` with an empty vocabulary (where [CLS] is id 2), which would silently give a model that starts and
    stops decoding at the wrong tokens.

    Raises:
        ValueError: an id is not in `overrides` and the checkpoint has no tokenizer (`tokenizer.json` or `vocab.txt`),
            its tokenizer cannot be loaded, or the tokenizer has no [CLS]/[SEP] token; the message says to pass
            `decoder_start_token_id=` and `eos_token_id=`.
    """
    needed = [name for name in _GENERATION_IDS if overrides.get(name) is None]
    if not needed:
        return {}
    found = [
        filename
        for filename in ("tokenizer.json", "vocab.txt")
        if cached_file(
            name_or_path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
    ]
    where = f"pretrained_model_name_or_path ({str(name_or_path)!r})"
    if not found:
        raise ValueError(
            f"{where} has no tokenizer (tokenizer.json or vocab.txt), so the seq2seq warm start cannot tell which "
            f"token ids start and end decoding ({', '.join(needed)}): {_PASS_GENERATION_IDS}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **hub_kwargs)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"the tokenizer of {where} cannot be loaded ({error}), so the seq2seq warm start cannot tell which token "
            f"ids start and end decoding ({', '.join(needed)}): {_PASS_GENERATION_IDS}"
        ) from error
    ids = {}
    for name in needed:
        token = getattr(tokenizer, _GENERATION_IDS[name])
        token_id = None if token is None else tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(
                f"the tokenizer of {where} has no {_GENERATION_IDS[name]} in its vocabulary, so the seq2seq warm "
                f"start cannot set {name}: {_PASS_GENERATION_IDS}"
            )
        ids[name] = token_id
    return ids


# ----------------------------------------------------------------------------------------------------------------------
# Reading a BERT checkpoint
# ----------------------------------------------------------------------------------------------------------------------

# Overrides that keep every parameter shape (so every pretrained tensor loads) but change what the weights compute;
# the value is BERT's, or None for "the checkpoint's own value".
_NUMERICS_FIELDS = {
    "num_attention_heads": None,
    "hidden_act": None,
    "layer_norm_eps": None,
    "norm_placement": "post",
    "position_embedding_type": "learned",
    "scale_embedding": False,
}


def _warn_numerics_overrides(bert_config, overrides: dict, name_or_path) -> None:
    for field, bert_value in _NUMERICS_FIELDS.items():
        if field not in overrides:
            continue
        checkpoint_value = getattr(bert_config, field, None) if bert_value is None else bert_value
        if overrides[field] != checkpoint_value:
            logger.warning(
                f"{field}={overrides[field]!r} differs from the BERT checkpoint {str(name_or_path)!r} "
                f"({checkpoint_value!r}): the pretrained weights still load, but the model no longer computes what "
                "the checkpoint was trained to compute"
            )


def _seq2seq_config_from_encoder_decoder(config, overrides: dict) -> SeqBertConfig:
    """The SeqBertConfig of a transformers EncoderDecoderConfig whose encoder and decoder are BERT."""
    encoder, decoder = config.encoder, config.decoder
    for side, sub in (("encoder", encoder), ("decoder", decoder)):
        if sub.model_type != "bert":
            raise ValueError(
                f"the EncoderDecoderModel's {side} is {sub.model_type!r}, not BERT: only BERT2BERT converts"
            )
    for field in _SHARED_BERT_FIELDS:
        if getattr(encoder, field) != getattr(decoder, field):
            raise ValueError(
                f"encoder {field} ({getattr(encoder, field)!r}) differs from decoder {field} "
                f"({getattr(decoder, field)!r}); SeqBERT's encoder and decoder share their sizes"
            )
    if getattr(config, "tie_encoder_decoder", False):
        raise ValueError("tie_encoder_decoder (True) is not supported: SeqBERT's encoder and decoder have own weights")
    fields = dict(
        num_decoder_layers=decoder.num_hidden_layers,
        is_encoder_decoder=True,
        tie_word_embeddings=getattr(decoder, "tie_word_embeddings", True),
        decoder_start_token_id=getattr(config, "decoder_start_token_id", None),
        pad_token_id=encoder.pad_token_id if getattr(config, "pad_token_id", None) is None else config.pad_token_id,
        eos_token_id=getattr(config, "eos_token_id", None),
        bos_token_id=getattr(config, "bos_token_id", None),
    )
    fields = {k: v for k, v in fields.items() if v is not None}
    return SeqBertConfig.from_bert_config(encoder, **{**fields, **overrides})


def load_bert_as_seqbert_state_dict(
    name_or_path: str,
    config_overrides: dict | None = None,
    target: str = "encoder",
    use_safetensors: bool | None = None,
    cross_attention_init: str | None = None,
    **hub_kwargs,
) -> tuple[SeqBertConfig, dict[str, torch.Tensor]]:
    """
    Read a BERT (or, for `"seq2seq"`, BERT or BERT2BERT) checkpoint's config and weights and return the post-LN
    `SeqBertConfig` and the state dict under SeqBERT names.

    Overrides that keep every shape but change the computation (`num_attention_heads`, `hidden_act`,
    `layer_norm_eps`, `norm_placement`, `position_embedding_type`, `scale_embedding`) are logged as warnings.

    Args:
        name_or_path: Hub model id or local folder with `config.json` and weights.
        config_overrides: SeqBertConfig fields to override (e.g. `{"num_labels": 2}`).
        target: the SeqBERT model the state dict is for: `"encoder"` (SeqBertModel and its encoder heads),
            `"causal"` (SeqBertForCausalLM, from a `BertLMHeadModel` or any BERT checkpoint), or `"seq2seq"`
            (a `SeqBertForConditionalGeneration` state dict: from a BERT checkpoint by warm start
            (encoder and decoder both from BERT; `decoder_start_token_id` and `eos_token_id` from the overrides,
            else the ids of [CLS] and [SEP] in the checkpoint's tokenizer), from an `EncoderDecoderModel` by exact
            conversion).
        use_safetensors: `False` also accepts pickled `pytorch_model.bin` weights when there are no safetensors
            (read with `torch.load(weights_only=True)`); by default only safetensors are read.
        cross_attention_init: how a BERT warm start fills the decoder's cross-attention (`warm_start_state_dict`):
            `"self_attention"` (default) or `"random"`. Only for a seq2seq warm start from a plain BERT checkpoint.
        **hub_kwargs: `cache_dir`, `revision`, `token`, `local_files_only`, ... passed to the Hub resolution.

    Raises:
        ValueError: the checkpoint is neither BERT nor (for `"seq2seq"`) a BERT2BERT `EncoderDecoderModel` (the
            message names the model_type found and what is allowed, and points SeqBERT checkpoints to
            `from_pretrained`), its encoder and decoder sizes differ, it has no weights file (or only pickled ones
            without `use_safetensors=False`), or a BERT warm start has no tokenizer to read
            `decoder_start_token_id`/`eos_token_id` from and they are not in `config_overrides`, or
            `cross_attention_init` is given for anything but a seq2seq warm start from BERT, or is not allowed.
        OSError: the name or folder cannot be resolved, or `config.json`, the weight index or a weights file is
            truncated, corrupt or missing (the message names the file and says to re-download or save it again).
    """
    overrides = dict(config_overrides or {})
    seq2seq = target == "seq2seq"
    source_config = _load_config(name_or_path, **hub_kwargs)
    model_type = source_config.model_type
    if (
        cross_attention_init is not None
        and model_type in ("bert", "encoder-decoder")
        and not (seq2seq and model_type == "bert")
    ):
        raise ValueError(
            f"cross_attention_init ({cross_attention_init!r}) only applies to a seq2seq warm start from a plain BERT "
            f"checkpoint; {str(name_or_path)!r} is a {model_type!r} checkpoint loaded for {target!r}"
        )
    if seq2seq and model_type == "encoder-decoder":
        _warn_numerics_overrides(source_config.encoder, overrides, name_or_path)
        config = _seq2seq_config_from_encoder_decoder(source_config, overrides)
        convert = bert2bert_state_dict_to_seqbert
    elif model_type == "bert":
        _warn_numerics_overrides(source_config, overrides, name_or_path)
        if seq2seq:
            overrides = {
                **_special_token_defaults(name_or_path, overrides, **hub_kwargs),
                "is_encoder_decoder": True,
                "cross_attention_source": "same_layer",  # the docs' seq2seq ablation; "last_layer" is BERT2BERT's
                **overrides,
            }
        config = SeqBertConfig.from_bert_config(source_config, **overrides)
        if seq2seq:
            convert = functools.partial(
                warm_start_state_dict, cross_attention_init=cross_attention_init or "self_attention"
            )
        else:
            convert = functools.partial(bert_state_dict_to_seqbert, role=target)
    else:
        allowed = "'bert' or 'encoder-decoder' (BERT2BERT)" if seq2seq else "'bert'"
        hint = (
            "it is already a SeqBERT checkpoint: load it with from_pretrained"
            if model_type == SeqBertConfig.model_type
            else "load SeqBERT checkpoints with from_pretrained"
        )
        raise ValueError(
            f"pretrained_model_name_or_path ({str(name_or_path)!r}) is a {model_type!r} checkpoint, not BERT "
            f"(config.json model_type must be {allowed}); {hint}"
        )
    state_dict: dict[str, torch.Tensor] = {}
    for path in _resolve_weight_files(name_or_path, use_safetensors, **hub_kwargs):
        state_dict.update(_read_weights(path))
    return config, convert(state_dict, config)


# -----------------------------------------------------------------------------------------------------------------------
# Checking what loaded: parameters left at their random initialisation
# ----------------------------------------------------------------------------------------------------------------------

# Task heads a checkpoint may lack (newly initialised, as transformers does), and the cross-attention that a BERT2BERT
# warm start initialises (Rothe et al. 2020), each allowed to be missing only when the checkpoint has none of it.
_NEW_PARTS = (
    re.compile(r"^classifier\."),
    re.compile(r"^qa_outputs\."),
    re.compile(r"^lm_head\."),
    re.compile(r"^seqbert\.pooler\."),
    re.compile(r"^decoder\.layers\.\d+\.cross_attention(_norm)?\."),
)
_LAYER_STACKS = (
    ("seqbert.encoder.layers.", "num_hidden_layers"),
    ("seqbert.layers.", "num_hidden_layers"),
    ("decoder.layers.", "num_decoder_layers"),
)
_TOP_LEVEL_PREFIXES = ("seqbert.", "decoder.", "lm_head.", "classifier.", "qa_outputs.")


def _missing_causes(missing: list[str], loaded_keys: set[str], config, overrides: dict) -> list[str]:
    """Likely reasons why these parameters of the model are not in the converted BERT checkpoint."""
    causes, explained = [], set()
    depth_overridden = any(field in overrides for _, field in _LAYER_STACKS)
    for prefix, field in _LAYER_STACKS:
        have = {int(k[len(prefix) :].split(".")[0]) for k in loaded_keys if k.startswith(prefix)}
        count = max(have) + 1 if have else 0
        extra = [k for k in missing if k.startswith(prefix) and int(k[len(prefix) :].split(".")[0]) >= count]
        if extra and depth_overridden:
            explained.update(extra)
            causes.append(
                f"{field}={getattr(config, field)} but the checkpoint has {count} layers: drop the override or use "
                f"at most {count}"
            )
    final_norms = [k for k in missing if ".final_layer_norm." in k]
    if final_norms:
        explained.update(final_norms)
        causes.append(
            f"norm_placement={config.norm_placement!r} adds a final LayerNorm that BERT (post-LN) does not have: "
            "BERT weights need norm_placement='post'"
        )
    if any(k not in explained for k in missing):
        causes.append(f"the checkpoint lacks these tensors, so it is incomplete or corrupt: {_REDOWNLOAD}")
    return causes


def check_bert_loading_info(
    loading_info: dict,
    config,
    loaded_keys,
    name_or_path,
    where: str,
    overrides: dict | None = None,
    ignore_mismatched_sizes: bool = False,
    **hub_kwargs,
) -> None:
    """
    Check what `from_pretrained` did with a converted BERT state dict: no parameter outside the task heads may keep
    its random initialisation.

    Allowed to be missing (newly initialised and reported by transformers, as usual): a task head the checkpoint has
    none of (`classifier`, `qa_outputs`, `lm_head`; a tied `lm_head.decoder.weight` is the word embedding matrix),
    the pooler when the checkpoint has no pooler at all (e.g. a BertForMaskedLM checkpoint loaded for sequence
    classification, as `BertForSequenceClassification` does too), and the decoder's cross-attention when the
    checkpoint has none (the BERT2BERT warm start of Rothe et al. 2020). Unexpected keys stay transformers' warning:
    checkpoint layers beyond a smaller `num_hidden_layers` (a deliberate truncation), BertForPreTraining's
    next-sentence head, a pooler a model does not use.

    Args:
        loading_info: `from_pretrained(..., output_loading_info=True)`'s dict.
        config: the model's config.
        loaded_keys: the converted state dict's keys (what the checkpoint provided, under SeqBERT names).
        name_or_path: the BERT checkpoint; its config (read again from disk or the Hub cache, only on a shape
            mismatch) names the fields behind the mismatch.
        where: the call, for messages.
        overrides: the config overrides the caller passed (they explain layers beyond the checkpoint's).
        ignore_mismatched_sizes: accept shape mismatches (transformers re-initialises and reports them).
        **hub_kwargs: `cache_dir`, `revision`, `subfolder` locate the checkpoint's config.

    Raises:
        MismatchedSizesError: (a `RuntimeError` and a `ValueError`) parameters have another shape than in the
            checkpoint, unless `ignore_mismatched_sizes`.
        ValueError: parameters outside the allowed parts are missing; the message lists them (first few and a count) and
            the likely cause (an override of a size or of `num_hidden_layers`, `norm_placement`, or an incomplete
            checkpoint).
    """
    if loading_info["mismatched_keys"] and not ignore_mismatched_sizes:
        source = checkpoint_config_dict(name_or_path, **hub_kwargs)
        if source is not None and source.get("model_type") == "encoder-decoder":
            source = source.get("encoder")
        raise mismatched_sizes_error(loading_info["mismatched_keys"], config, source, where)
    loaded_keys = set(loaded_keys)
    absent_parts = [part for part in _NEW_PARTS if not any(part.search(k) for k in loaded_keys)]
    # The converted keys are a head model's; a base SeqBertModel names its parameters without the `seqbert.` prefix.
    canonical = {
        key: key if key.startswith(_TOP_LEVEL_PREFIXES) else f"seqbert.{key}" for key in loading_info["missing_keys"]
    }
    missing = sorted(k for k, name in canonical.items() if not any(part.search(name) for part in absent_parts))
    if missing:
        causes = _missing_causes([canonical[k] for k in missing], loaded_keys, config, overrides or {})
        raise ValueError(
            f"{where}: {len(missing)} parameter(s) outside the task heads are not in the checkpoint and would keep "
            f"their random initialisation: {_listed(missing)}. Likely cause: {'; '.join(causes)}"
        )


class _WithoutLoadReport(pylogging.Filter):
    def filter(self, record: pylogging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


@contextlib.contextmanager
def quiet_loading_report():
    """Inside the block, transformers' loading report (a WARNING of `transformers.modeling_utils` that starts with
    "... LOAD REPORT") is not shown: `from_bert_pretrained` loads a converted state dict, for which it would name no
    source ("from: None"), and reports with `report_bert_loading` instead."""
    report_logger, report_filter = logging.get_logger("transformers.modeling_utils"), _WithoutLoadReport()
    report_logger.addFilter(report_filter)
    try:
        yield
    finally:
        report_logger.removeFilter(report_filter)


def report_bert_loading(loading_info: dict, where: str) -> None:
    """Log what a BERT conversion left new (a WARNING, as transformers reports missing weights) and what of the
    checkpoint it did not use (INFO)."""
    new = sorted({*loading_info["missing_keys"], *(name for name, _, _ in loading_info["mismatched_keys"])})
    if new:
        logger.warning(f"{where}: newly initialised, to be trained before use: {_listed(new)}")
    if loading_info["unexpected_keys"]:
        logger.info(
            f"{where}: checkpoint weights this model has no place for: {_listed(sorted(loading_info['unexpected_keys']))}"
        )


# Keyword arguments of `from_bert_pretrained` that go to `from_pretrained` (loading) rather than to the config.
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")
_LOADING_KWARGS = (
    "dtype",
    "torch_dtype",
    "device_map",
    "attn_implementation",
    "output_loading_info",
    "ignore_mismatched_sizes",
)


def from_bert_pretrained(cls, pretrained_model_name_or_path, **kwargs):
    """
    `SeqBertPreTrainedModel.from_bert_pretrained`: the BERT checkpoint converted (`load_bert_as_seqbert_state_dict`),
    loaded with `cls.from_pretrained`, its loading checked (`check_bert_loading_info`) and reported, its generation
    settings kept. See that method for the arguments and what raises.
    """
    use_safetensors = kwargs.pop("use_safetensors", None)
    cross_attention_init = kwargs.pop("cross_attention_init", None)
    hub_kwargs = {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}
    loading_kwargs = {k: kwargs.pop(k) for k in _LOADING_KWARGS if k in kwargs}
    output_loading_info = loading_kwargs.pop("output_loading_info", False)
    ignore_mismatched_sizes = loading_kwargs.pop("ignore_mismatched_sizes", False)
    config, state_dict = load_bert_as_seqbert_state_dict(
        pretrained_model_name_or_path,
        config_overrides=kwargs,
        target=cls._bert_conversion_target,
        use_safetensors=use_safetensors,
        cross_attention_init=cross_attention_init,
        **hub_kwargs,
    )
    loaded_keys = set(state_dict)
    where = f"{cls.__name__}.from_bert_pretrained({str(pretrained_model_name_or_path)!r})"
    with quiet_loading_report():
        model, loading_info = cls.from_pretrained(
            None, config=config, state_dict=state_dict, ignore_mismatched_sizes=True, output_loading_info=True,
            **loading_kwargs,
        )  # fmt: skip
    check_bert_loading_info(
        loading_info,
        model.config,
        loaded_keys,
        pretrained_model_name_or_path,
        where=where,
        overrides=kwargs,
        ignore_mismatched_sizes=ignore_mismatched_sizes,
        **hub_kwargs,
    )
    report_bert_loading(loading_info, where)
    if (error := non_finite_weights_error(model, where)) is not None:
        raise error
    if model.can_generate():
        # Keep the generation settings the checkpoint ships (beam size, length limits, ...), if any.
        try:
            source = GenerationConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        except OSError:
            source = None
        if source is not None:
            model.generation_config.update(**source.to_diff_dict())
    # Where the weights came from, as `from_pretrained` records it (PEFT's adapter config reads it, for one).
    model.name_or_path = model.config._name_or_path = str(pretrained_model_name_or_path)
    return (model, loading_info) if output_loading_info else model


# The SeqBERT class that keeps every head a BERT checkpoint has, by the checkpoint's `architectures` entry.
SEQBERT_CLASS_FOR_BERT_ARCHITECTURE = {
    "BertModel": "SeqBertModel",
    "BertForPreTraining": "SeqBertForMaskedLM",
    "BertForMaskedLM": "SeqBertForMaskedLM",
    "BertLMHeadModel": "SeqBertForCausalLM",
    "BertForSequenceClassification": "SeqBertForSequenceClassification",
    "BertForTokenClassification": "SeqBertForTokenClassification",
    "BertForQuestionAnswering": "SeqBertForQuestionAnswering",
    "BertForMultipleChoice": "SeqBertForMultipleChoice",
    "EncoderDecoderModel": "SeqBertForConditionalGeneration",
}
