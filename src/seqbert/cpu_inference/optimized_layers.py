"""The optimized encoder and encoder layer: mixins that `optimize_for_cpu_inference` puts on a copy's encoder and
layer classes, running a layer's six linear layers as `PackedLinear` calls and attention over `LengthGroups`, as a
`CpuInferencePlan` says; elsewhere (gradients, hooks, tracing, other devices and dtypes) the model's own forward."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..modeling_seqbert import SeqBertEncoder, SeqBertLayer, SeqBertPreNormLayer
from .length_groups import LengthGroups, split_qkv
from .linear_kernels import PackedLinear


if TYPE_CHECKING:
    from .plans import CpuInferencePlan


# The linear layers of an encoder layer that `optimize_for_cpu_inference` packs, by role: query/key/value as one
# product, the attention's output projection (+ residual), the feed-forward's first (+ activation) and second
# (+ residual) products.
ROLES = ("qkv", "out_proj", "up_proj", "down_proj")


def layer_linears(layer: SeqBertLayer) -> dict[str, tuple[list[nn.Linear], str | None, bool]]:
    """role (`ROLES`) -> (its linear layers, activation, whether a residual is added)."""
    attention, mlp = layer.attention, layer.mlp
    return {
        "qkv": ([attention.query, attention.key, attention.value], None, False),
        "out_proj": ([attention.out_proj], None, True),
        "up_proj": ([mlp.up_proj], attention.config.hidden_act, False),
        "down_proj": ([mlp.down_proj], None, True),
    }


def pack_layer(
    layer: SeqBertLayer, linear_kernels: dict[str, str], int8: bool, dtype: torch.dtype
) -> dict[str, PackedLinear]:
    """role -> the role's linear layers packed for its kernel in `linear_kernels`."""
    return {
        role: PackedLinear(linears, int8, dtype, linear_kernels[role], activation, residual=residual)
        for role, (linears, activation, residual) in layer_linears(layer).items()
    }


class _OptimizedEncoder(SeqBertEncoder):
    """Mixed into an encoder's class by `optimize_for_cpu_inference`: on the unpadded path it sorts the batch's
    sequences into `LengthGroups` once per forward, for all its layers, as its `CpuInferencePlan` says. Optimized for
    bf16, it runs its layers and its final LayerNorm on bf16 hidden states (where `_bf16_applies`) and hands fp32
    back, so the embeddings before it and the pooler and heads after it stay fp32."""

    _dtype: torch.dtype = torch.float32
    _plan: "CpuInferencePlan"

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if kwargs.get("unpadded") is not None:
            kwargs["length_groups"] = LengthGroups.for_mode(
                kwargs["unpadded"], self._plan.length_groups, self._plan.attention
            )
        if self._dtype != torch.bfloat16 or not _bf16_applies(self, hidden_states):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        layer_inputs = args[0] if args else kwargs.get("layer_inputs")
        first = 0 if layer_inputs is None else len(layer_inputs)
        output = super().forward(hidden_states.to(torch.bfloat16), attention_mask, *args, **kwargs)
        if layer_inputs is not None:  # what a same_layer seq2seq decoder reads: fp32, as elsewhere
            layer_inputs[first:] = [x.float() for x in layer_inputs[first:]]
        return output.float()


def _bf16_applies(encoder: SeqBertEncoder, hidden_states: torch.Tensor) -> bool:
    """An optimized encoder computes in bf16 where every layer would take the packed path (`_packable`) on its fp32
    input; elsewhere its layers run their own fp32 forward."""
    if hidden_states.dtype != torch.float32:
        return False
    return all(_packable(layer, hidden_states.device, hidden_states.requires_grad) for layer in encoder.layers)


class _OptimizedLayer(SeqBertLayer):
    """Mixed into an encoder layer's class by `optimize_for_cpu_inference`: the same computation, with the layer's
    six linear layers as three-plus-three `PackedLinear` calls (query/key/value as one; the output projection with the
    residual added; the feed-forward's first linear with its activation; its second with the residual added).

    Attention runs over the encoder's `LengthGroups` on the unpadded path, else the model's own attention on the
    padded batch. In bf16 the padded batch's attention runs in fp32 on the bf16 projections unless it is sdpa with a
    boolean mask or none (whose CPU kernel computes its softmax in fp32 for bf16 inputs): eager attention would take
    its softmax in bf16, and an additive fp32 mask does not fit bf16 scores."""

    _packed: dict[str, PackedLinear]

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        length_groups = kwargs.pop("length_groups", None)
        if not _takes_packed_path(self, hidden_states):
            return super().forward(hidden_states, attention_mask, **kwargs)
        pre_norm = isinstance(self, SeqBertPreNormLayer)
        packed = self._packed
        attention = self.attention
        kwargs.pop("unpadded", None)
        normed = self.attention_norm(hidden_states) if pre_norm else hidden_states
        qkv = packed["qkv"](normed)  # (B, L, 3H) or, unpadded, (1, T, 3H)
        if length_groups is not None:
            heads = length_groups.attend(qkv, attention)  # (1, T, H)
        else:
            query, key, value = split_qkv(qkv, attention)  # (B, N, L, D) each
            if qkv.dtype != torch.float32 and not _bf16_attention_fits(attention, attention_mask):
                query, key, value = query.float(), key.float(), value.float()
            heads, _ = attention.merged_heads(query, key, value, attention_mask, **kwargs)  # (B, L, H)
            heads = heads.to(qkv.dtype)
        hidden_states = packed["out_proj"](heads, residual=hidden_states)
        if not pre_norm:
            hidden_states = self.attention_norm(hidden_states)
        normed = self.mlp_norm(hidden_states) if pre_norm else hidden_states
        hidden_states = packed["down_proj"](packed["up_proj"](normed), residual=hidden_states)
        return hidden_states if pre_norm else self.mlp_norm(hidden_states)


def _bf16_attention_fits(attention: nn.Module, attention_mask: torch.Tensor | None) -> bool:
    """Whether the padded batch's attention runs on bf16 projections as they are: sdpa with a boolean mask or none."""
    no_float_mask = attention_mask is None or attention_mask.dtype == torch.bool
    return attention.config._attn_implementation == "sdpa" and no_float_mask


def _takes_packed_path(layer: SeqBertLayer, hidden_states: torch.Tensor) -> bool:
    """The packed path runs CPU inputs of the packed dtype (fp32, or bf16 for a bf16-optimized layer) outside tracing,
    with no hooks on the modules it bypasses (transformers records `output_attentions` and `output_hidden_states` with
    hooks); anything else takes the layer's own forward."""
    return _packable(layer, hidden_states.device, hidden_states.requires_grad) and (
        hidden_states.dtype == layer._packed["qkv"].dtype
    )


def _packable(layer: SeqBertLayer, device: torch.device, requires_grad: bool) -> bool:
    """`_takes_packed_path` but for the dtype."""
    if torch.compiler.is_compiling() or device.type != "cpu":
        return False
    if torch.is_grad_enabled() and requires_grad:
        return False
    bypassed = (layer.attention, layer.mlp, *layer.attention.children(), *layer.mlp.children())
    return not any(module._forward_hooks or module._forward_pre_hooks for module in bypassed)


_OPTIMIZED_CLASSES: dict[type, type] = {}


def _optimized_class(mixin: type, module_class: type) -> type:
    """The class `mixin` + `module_class` (one per pair, so optimized copies share their classes)."""
    if module_class not in _OPTIMIZED_CLASSES:
        _OPTIMIZED_CLASSES[module_class] = type(f"CpuOptimized{module_class.__name__}", (mixin, module_class), {})
    return _OPTIMIZED_CLASSES[module_class]


def optimize_layer(layer: SeqBertLayer, plan: "CpuInferencePlan", int8: bool, dtype: torch.dtype) -> SeqBertLayer:
    """`layer` itself, its class mixed with `_OptimizedLayer` and its linears packed as `plan` says."""
    layer._packed = pack_layer(layer, plan.linear_kernels, int8, dtype)
    layer.__class__ = _optimized_class(_OptimizedLayer, type(layer))
    return layer


def optimize_encoder(encoder: SeqBertEncoder, plan: "CpuInferencePlan", int8: bool, dtype: torch.dtype) -> None:
    """`encoder` and its bidirectional layers optimized in place, as `plan` says."""
    encoder.__class__ = _optimized_class(_OptimizedEncoder, type(encoder))
    encoder._dtype, encoder._plan = dtype, plan
    for layer in encoder.layers:
        if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal:
            optimize_layer(layer, plan, int8, dtype)
