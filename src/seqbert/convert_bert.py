"""Read a BERT or BERT2BERT checkpoint (Hub name or local folder) and rename its weights to SeqBERT's.

Used by `SeqBertPreTrainedModel.from_bert_pretrained` and `scripts/convert_bert_checkpoint.py`. It is copied next
to `modeling_seqbert.py` into saved model folders, so it imports only torch and transformers.

BERT body name (after an optional `bert.` prefix)       SeqBERT name ({P} = `seqbert.` for the encoder, `decoder.`)
embeddings.{word,position,token_type}_embeddings      {P}embeddings.{same}
embeddings.LayerNorm                                   {P}embeddings.layer_norm
encoder.layer.{i}.attention.self.{query,key,value}     {P}...layers.{i}.{A}.qkv_proj (concatenated in that order)
encoder.layer.{i}.attention.output.dense               {P}...layers.{i}.{A}.out_proj
encoder.layer.{i}.attention.output.LayerNorm           {P}...layers.{i}.{A}_norm
encoder.layer.{i}.crossattention.self.query            decoder.layers.{i}.cross_attention.q_proj
encoder.layer.{i}.crossattention.self.{key,value}      decoder.layers.{i}.cross_attention.kv_proj (concatenated)
encoder.layer.{i}.crossattention.output.dense          decoder.layers.{i}.cross_attention.out_proj
encoder.layer.{i}.crossattention.output.LayerNorm      decoder.layers.{i}.cross_attention_norm
encoder.layer.{i}.intermediate.dense                   {P}...layers.{i}.mlp.up_proj
encoder.layer.{i}.output.dense                         {P}...layers.{i}.mlp.down_proj
encoder.layer.{i}.output.LayerNorm                     {P}...layers.{i}.mlp_norm
pooler.dense                                           seqbert.pooler.dense
cls.predictions.transform.dense                        lm_head.dense
cls.predictions.transform.LayerNorm                    lm_head.layer_norm
cls.predictions.bias                                   lm_head.decoder.bias
classifier, qa_outputs                                 unchanged
embeddings.position_ids (a buffer some files carry)     dropped
anything else (e.g. cls.seq_relationship)              unchanged, so `from_pretrained` reports it as unexpected

where the encoder's layers are `seqbert.encoder.layers` with {A} = `attention`, the decoder's `decoder.layers` with
{A} = `self_attention`. A transformers `EncoderDecoderModel` stores its encoder under `encoder.` and its
`BertLMHeadModel` decoder under `decoder.bert.` / `decoder.cls.`.
"""

import json
import os
import re

import torch
from transformers import AutoConfig, AutoTokenizer
from transformers.modeling_utils import load_state_dict
from transformers.utils import cached_file

from .configuration_seqbert import SeqBertConfig


# Weight files in the order transformers' own loader prefers them. Pickled `.bin` files are read only on request
# (`use_safetensors=False`): unpickling a file from an untrusted source can run code.
_SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

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
_FUSED = re.compile(_LAYER + r"(attention|crossattention)\.self\.(query|key|value)\.(weight|bias)$")


def _body_renames(prefix: str, layers: str, attention: str) -> list[tuple[str, str]]:
    """Anchored renames of BERT body keys to SeqBERT names under `prefix` (`seqbert.` or `decoder.`)."""
    return [
        (r"^embeddings\.LayerNorm\.", f"{prefix}embeddings.layer_norm."),
        (r"^embeddings\.(word_embeddings|position_embeddings|token_type_embeddings)\.", prefix + r"embeddings.\1."),
        (_LAYER + r"attention\.output\.dense\.", layers + r".\1." + attention + ".out_proj."),
        (_LAYER + r"attention\.output\.LayerNorm\.", layers + r".\1." + attention + "_norm."),
        (_LAYER + r"crossattention\.output\.dense\.", layers + r".\1.cross_attention.out_proj."),
        (_LAYER + r"crossattention\.output\.LayerNorm\.", layers + r".\1.cross_attention_norm."),
        (_LAYER + r"intermediate\.dense\.", layers + r".\1.mlp.up_proj."),
        (_LAYER + r"output\.dense\.", layers + r".\1.mlp.down_proj."),
        (_LAYER + r"output\.LayerNorm\.", layers + r".\1.mlp_norm."),
    ]


_ENCODER_RENAMES = _body_renames("seqbert.", "seqbert.encoder.layers", "attention") + [
    (r"^pooler\.dense\.", "seqbert.pooler.dense.")
]
_DECODER_RENAMES = _body_renames("decoder.", "decoder.layers", "self_attention")
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


def _fuse_projections(parts: dict, layers: str, attention: str) -> dict[str, torch.Tensor]:
    """Concatenate each layer's query/key/value (self-attention) and key/value (cross-attention) along dim 0."""
    fused = {}
    for (layer, block, kind), tensors in sorted(parts.items()):
        if block == "attention":
            names, target = ("query", "key", "value"), f"{layers}.{layer}.{attention}.qkv_proj.{kind}"
        else:
            names, target = ("key", "value"), f"{layers}.{layer}.cross_attention.kv_proj.{kind}"
            if "query" in tensors:
                fused[f"{layers}.{layer}.cross_attention.q_proj.{kind}"] = tensors.pop("query")
        if set(tensors) != set(names):
            raise ValueError(f"BERT layer {layer} has {block} {kind}s for {sorted(tensors)}, expected {list(names)}")
        fused[target] = torch.cat([tensors[name] for name in names], dim=0)
    return fused


def _convert(state_dict: dict[str, torch.Tensor], config: SeqBertConfig, role: str) -> dict[str, torch.Tensor]:
    """Rename one BERT state dict for the `role` "encoder" (a SeqBERT encoder model and its heads) or "decoder"
    (the decoder of a seq2seq model and its LM head)."""
    renames = _ENCODER_RENAMES if role == "encoder" else _DECODER_RENAMES
    layers, attention = (
        ("seqbert.encoder.layers", "attention") if role == "encoder" else ("decoder.layers", "self_attention")
    )
    converted: dict[str, torch.Tensor] = {}
    parts: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        key = (
            key.removeprefix("bert.")
            .replace("LayerNorm.gamma", "LayerNorm.weight")
            .replace("LayerNorm.beta", "LayerNorm.bias")
        )
        if key == "embeddings.position_ids":
            continue  # a buffer that old BERT checkpoints saved; SeqBERT builds positions on the fly
        match = _FUSED.match(key)
        if match:
            layer, block, part, kind = match.groups()
            parts.setdefault((layer, block, kind), {})[part] = tensor
            continue
        if key == "cls.predictions.decoder.weight":
            if not config.tie_word_embeddings:
                converted["lm_head.decoder.weight"] = tensor
            continue  # otherwise tied to the word embeddings
        if key == "cls.predictions.decoder.bias":
            if "cls.predictions.bias" not in state_dict:
                converted["lm_head.decoder.bias"] = tensor
            continue  # BERT stores the decoder bias twice (tied); keep one copy
        converted[_rename(_rename(key, renames), _HEAD_RENAMES)] = tensor
    converted.update(_fuse_projections(parts, layers, attention))
    return converted


def bert_state_dict_to_seqbert(state_dict: dict[str, torch.Tensor], config: SeqBertConfig) -> dict[str, torch.Tensor]:
    """
    Rename a BERT state dict (any BERT head class, with or without the `bert.` prefix) to SeqBERT encoder names.

    Query, key and value of each layer are concatenated along the output dimension into `qkv_proj`
    (weights (3H, H), biases (3H,)), in that order. Legacy TF-style `gamma`/`beta` LayerNorm names are accepted.
    The MLM decoder weight is dropped when `config.tie_word_embeddings` (it is the word embedding matrix).

    Args:
        state_dict: BERT parameter name -> tensor.
        config: the target `SeqBertConfig` (from `SeqBertConfig.from_bert_config`).

    Returns:
        SeqBERT parameter name -> tensor (the same tensors, not copies, except the concatenated projections).

    Raises:
        ValueError: a layer lacks one of query/key/value.
    """
    return _convert(state_dict, config, "encoder")


def bert2bert_state_dict_to_seqbert(
    state_dict: dict[str, torch.Tensor], config: SeqBertConfig
) -> dict[str, torch.Tensor]:
    """
    Rename the state dict of a transformers `EncoderDecoderModel` with BERT encoder and decoder to the names of
    `SeqBertForConditionalGeneration`: `encoder.*` as a BERT encoder, `decoder.bert.*` / `decoder.cls.*` as the
    decoder and its LM head (cross-attention key/value fused into `kv_proj`).

    Raises:
        ValueError: a layer lacks one of its attention projections.
    """
    encoder = {k.removeprefix("encoder."): v for k, v in state_dict.items() if k.startswith("encoder.")}
    decoder = {k.removeprefix("decoder."): v for k, v in state_dict.items() if k.startswith("decoder.")}
    others = {k: v for k, v in state_dict.items() if not k.startswith(("encoder.", "decoder."))}
    return {**_convert(encoder, config, "encoder"), **_convert(decoder, config, "decoder"), **others}


def warm_start_state_dict(state_dict: dict[str, torch.Tensor], config: SeqBertConfig) -> dict[str, torch.Tensor]:
    """
    BERT2BERT warm start (Rothe et al. 2020, "Leveraging Pre-trained Checkpoints for Sequence Generation Tasks"; what
    `EncoderDecoderModel.from_encoder_decoder_pretrained` does): encoder and decoder both start from the same BERT
    weights, as two copies; the LM head from BERT's `cls.predictions` when the checkpoint has one. Cross-attention is
    absent, so `from_pretrained` initialises it and reports it as missing.
    """
    encoder = {k: v for k, v in _convert(state_dict, config, "encoder").items() if not k.startswith("lm_head.")}
    decoder = {k: v.clone() for k, v in _convert(state_dict, config, "decoder").items()}
    return {**encoder, **decoder}


def _resolve_weight_files(name_or_path: str, use_safetensors: bool | None = None, **hub_kwargs) -> list[str]:
    """Local paths of the checkpoint's weight files (downloading them for Hub names); raise if there are none.

    safetensors files only, unless `use_safetensors=False` allows pickled `pytorch_model.bin` files as a fallback."""
    names = _SAFETENSORS_FILES + (_PICKLE_FILES if use_safetensors is False else ())
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
            return [resolved]
        with open(resolved, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [cached_file(name_or_path, shard, **hub_kwargs) for shard in shards]
    folder = os.path.join(name_or_path, hub_kwargs.get("subfolder") or "")
    if use_safetensors is not False and any(os.path.isfile(os.path.join(folder, name)) for name in _PICKLE_FILES):
        raise ValueError(
            f"pretrained_model_name_or_path ({str(name_or_path)!r}) holds only pickled PyTorch weights (pytorch_model.bin), "
            "which seqbert does not load by default because unpickling can run code: pass use_safetensors=False if "
            "you trust the file"
        )
    allowed = (
        list(names)
        if use_safetensors is False
        else f"{list(names)} (or {list(_PICKLE_FILES)} with use_safetensors=False)"
    )
    raise ValueError(
        f"pretrained_model_name_or_path ({str(name_or_path)!r}) has no BERT weights: expected one of {allowed}"
    )


def _special_token_defaults(name_or_path: str, **hub_kwargs) -> dict:
    """BERT2BERT's generation ids from the checkpoint's tokenizer, if it has one: decoding starts at [CLS] and ends
    at [SEP] (as in the transformers BERT2BERT examples)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **hub_kwargs)
    except (OSError, ValueError):
        return {}
    ids = {"decoder_start_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    return {k: v for k, v in ids.items() if v is not None}


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
    seq2seq: bool = False,
    use_safetensors: bool | None = None,
    **hub_kwargs,
) -> tuple[SeqBertConfig, dict[str, torch.Tensor]]:
    """
    Read a BERT (or, for `seq2seq`, BERT or BERT2BERT) checkpoint's config and weights and return the post-LN
    `SeqBertConfig` and the state dict under SeqBERT names.

    Args:
        name_or_path: Hub model id or local folder with `config.json` and weights.
        config_overrides: SeqBertConfig fields to override (e.g. `{"num_labels": 2}`).
        seq2seq: build a `SeqBertForConditionalGeneration` state dict: from a BERT checkpoint by warm start
            (encoder and decoder both from BERT), from an `EncoderDecoderModel` by exact conversion.
        use_safetensors: `False` also accepts pickled `pytorch_model.bin` weights when there are no safetensors
            (read with `torch.load(weights_only=True)`); by default only safetensors are read.
        **hub_kwargs: `cache_dir`, `revision`, `token`, `local_files_only`, ... passed to the Hub resolution.

    Raises:
        ValueError: the checkpoint is neither BERT nor (for `seq2seq`) a BERT2BERT `EncoderDecoderModel`, its
            encoder and decoder sizes differ, or it has no weights file (or only pickled ones without
            `use_safetensors=False`).
        OSError: the name or folder cannot be resolved.
    """
    overrides = dict(config_overrides or {})
    source_config = AutoConfig.from_pretrained(name_or_path, **hub_kwargs)
    model_type = source_config.model_type
    if seq2seq and model_type == "encoder-decoder":
        config = _seq2seq_config_from_encoder_decoder(source_config, overrides)
        convert = bert2bert_state_dict_to_seqbert
    elif model_type == "bert":
        if seq2seq:
            overrides = {**_special_token_defaults(name_or_path, **hub_kwargs), "is_encoder_decoder": True, **overrides}
        config = SeqBertConfig.from_bert_config(source_config, **overrides)
        convert = warm_start_state_dict if seq2seq else bert_state_dict_to_seqbert
    else:
        allowed = "'bert' or 'encoder-decoder' (BERT2BERT)" if seq2seq else "'bert'"
        raise ValueError(
            f"pretrained_model_name_or_path ({name_or_path!r}) is a {model_type!r} checkpoint, not BERT "
            f"(config.json model_type must be {allowed}); load SeqBERT checkpoints with from_pretrained"
        )
    state_dict: dict[str, torch.Tensor] = {}
    for path in _resolve_weight_files(name_or_path, use_safetensors, **hub_kwargs):
        state_dict.update(load_state_dict(path, map_location="cpu"))
    return config, convert(state_dict, config)


# The SeqBERT class that keeps every head a BERT checkpoint has, by the checkpoint's `architectures` entry.
SEQBERT_CLASS_FOR_BERT_ARCHITECTURE = {
    "BertModel": "SeqBertModel",
    "BertForPreTraining": "SeqBertForMaskedLM",
    "BertForMaskedLM": "SeqBertForMaskedLM",
    "BertLMHeadModel": "SeqBertForMaskedLM",
    "BertForSequenceClassification": "SeqBertForSequenceClassification",
    "BertForTokenClassification": "SeqBertForTokenClassification",
    "BertForQuestionAnswering": "SeqBertForQuestionAnswering",
    "BertForMultipleChoice": "SeqBertForMultipleChoice",
    "EncoderDecoderModel": "SeqBertForConditionalGeneration",
}
