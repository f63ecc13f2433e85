"""Read a BERT checkpoint (Hub name or local folder) and rename its weights to SeqBERT's.

Used by `SeqBertPreTrainedModel.from_bert_pretrained` and `scripts/convert_bert_checkpoint.py`. It is copied next
to `modeling_seqbert.py` into saved model folders, so it imports only torch, safetensors and transformers.

BERT name (after an optional `bert.` prefix)            SeqBERT name
embeddings.{word,position,token_type}_embeddings      seqbert.embeddings.{same}
embeddings.LayerNorm                                   seqbert.embeddings.layer_norm
encoder.layer.{i}.attention.self.{query,key,value}     seqbert.encoder.layers.{i}.attention.qkv_proj (concatenated)
encoder.layer.{i}.attention.output.dense               seqbert.encoder.layers.{i}.attention.out_proj
encoder.layer.{i}.attention.output.LayerNorm           seqbert.encoder.layers.{i}.attention_norm
encoder.layer.{i}.intermediate.dense                   seqbert.encoder.layers.{i}.mlp.up_proj
encoder.layer.{i}.output.dense                         seqbert.encoder.layers.{i}.mlp.down_proj
encoder.layer.{i}.output.LayerNorm                     seqbert.encoder.layers.{i}.mlp_norm
pooler.dense                                           seqbert.pooler.dense
cls.predictions.transform.dense                        lm_head.dense
cls.predictions.transform.LayerNorm                    lm_head.layer_norm
cls.predictions.bias                                   lm_head.decoder.bias
classifier, qa_outputs                                 unchanged
embeddings.position_ids (a buffer some files carry)     dropped
anything else (e.g. cls.seq_relationship)              unchanged, so `from_pretrained` reports it as unexpected
"""

import json
import re

import torch
from transformers import AutoConfig
from transformers.modeling_utils import load_state_dict
from transformers.utils import cached_file

from .configuration_seqbert import SeqBertConfig


# Weight files in the order transformers' own loader prefers them.
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

# Anchored one-to-one renames, applied to keys with the `bert.` prefix removed.
_RENAMES = [
    (r"^embeddings\.LayerNorm\.", "seqbert.embeddings.layer_norm."),
    (r"^embeddings\.(word_embeddings|position_embeddings|token_type_embeddings)\.", r"seqbert.embeddings.\1."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"seqbert.encoder.layers.\1.attention.out_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"seqbert.encoder.layers.\1.attention_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"seqbert.encoder.layers.\1.mlp.up_proj."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"seqbert.encoder.layers.\1.mlp.down_proj."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"seqbert.encoder.layers.\1.mlp_norm."),
    (r"^pooler\.dense\.", "seqbert.pooler.dense."),
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
    (r"^cls\.predictions\.bias$", "lm_head.decoder.bias"),
]
_QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")


def _resolve_weight_files(name_or_path: str, **hub_kwargs) -> list[str]:
    """Local paths of the checkpoint's weight files (downloading them for Hub names); raise if there are none."""
    for filename in _WEIGHT_FILES:
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
    raise ValueError(
        f"pretrained_model_name_or_path ({name_or_path!r}) has no BERT weights: expected one of {list(_WEIGHT_FILES)}"
    )


def bert_state_dict_to_seqbert(state_dict: dict[str, torch.Tensor], config: SeqBertConfig) -> dict[str, torch.Tensor]:
    """
    Rename a BERT state dict (any BERT head class, with or without the `bert.` prefix) to SeqBERT names.

    Query, key and value of each layer are concatenated along the output dimension into `qkv_proj`
    (weights (3H, H), biases (3H,)), in that order. Legacy TF-style `gamma`/`beta` LayerNorm names are accepted.
    The MLM decoder weight is dropped when `config.tie_word_embeddings` (it is the word embedding matrix).

    Args:
        state_dict: BERT parameter name -> tensor.
        config: the target `SeqBertConfig` (from `SeqBertConfig.from_bert_config`).

    Returns:
        SeqBERT parameter name -> tensor (the same tensors, not copies, except the concatenated Q/K/V).

    Raises:
        ValueError: a layer lacks one of query/key/value.
    """
    converted: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        key = (
            key.removeprefix("bert.")
            .replace("LayerNorm.gamma", "LayerNorm.weight")
            .replace("LayerNorm.beta", "LayerNorm.bias")
        )
        if key == "embeddings.position_ids":
            continue  # a buffer that old BERT checkpoints saved; SeqBERT builds positions on the fly
        match = _QKV.match(key)
        if match:
            layer, part, kind = match.groups()
            qkv_parts.setdefault((layer, kind), {})[part] = tensor
            continue
        if key == "cls.predictions.decoder.bias" and "cls.predictions.bias" in state_dict:
            continue  # BERT stores the decoder bias twice (tied); keep one copy
        if key == "cls.predictions.decoder.weight":
            if config.tie_word_embeddings:
                continue  # tied to the word embeddings
            converted["lm_head.decoder.weight"] = tensor
            continue
        if key == "cls.predictions.decoder.bias":
            converted["lm_head.decoder.bias"] = tensor
            continue
        for pattern, replacement in _RENAMES:
            new_key, n = re.subn(pattern, replacement, key)
            if n:
                key = new_key
                break
        converted[key] = tensor
    for (layer, kind), parts in sorted(qkv_parts.items()):
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(
                f"BERT layer {layer} has attention {kind}s for {sorted(parts)}, expected query, key and value"
            )
        converted[f"seqbert.encoder.layers.{layer}.attention.qkv_proj.{kind}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0
        )
    return converted


def load_bert_as_seqbert_state_dict(
    name_or_path: str, config_overrides: dict | None = None, **hub_kwargs
) -> tuple[SeqBertConfig, dict[str, torch.Tensor]]:
    """
    Read a BERT checkpoint's config and weights and return the post-LN `SeqBertConfig` and the renamed state dict.

    Args:
        name_or_path: Hub model id or local folder with `config.json` and BERT weights.
        config_overrides: SeqBertConfig fields to override (e.g. `{"num_labels": 2}`).
        **hub_kwargs: `cache_dir`, `revision`, `token`, `local_files_only`, ... passed to the Hub resolution.

    Raises:
        ValueError: the checkpoint's config is not BERT's, or it has no weights file.
        OSError: the name or folder cannot be resolved.
    """
    bert_config = AutoConfig.from_pretrained(name_or_path, **hub_kwargs)
    if bert_config.model_type != "bert":
        raise ValueError(
            f"pretrained_model_name_or_path ({name_or_path!r}) is a {bert_config.model_type!r} checkpoint, not BERT "
            "(config.json model_type must be 'bert'); load SeqBERT checkpoints with from_pretrained"
        )
    config = SeqBertConfig.from_bert_config(bert_config, **(config_overrides or {}))
    state_dict: dict[str, torch.Tensor] = {}
    for path in _resolve_weight_files(name_or_path, **hub_kwargs):
        state_dict.update(load_state_dict(path, map_location="cpu"))
    return config, bert_state_dict_to_seqbert(state_dict, config)


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
}
