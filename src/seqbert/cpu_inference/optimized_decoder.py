"""The optimized decoder half: mixins that `optimize_for_cpu_inference` puts on the decoder layers of
`SeqBertForConditionalGeneration` and `SeqBertForCausalLM`, their self- and cross-attention, feed-forward and linear
layers, and on their LM head, so that `generate` (and `forward`) compute in the precision asked for (fp32, int8 or
bf16), with the key/value cache and beam search as in the model.

Why (the physics of a decode step): each step multiplies a few rows (batch x beams) by every decoder weight and by
the vocabulary projection, so it is bound by the bytes of weights streamed, not by arithmetic: the MiniLM BERT2BERT
streams about 100 MB of fp32 weights a step, int8 a quarter of that, bf16 half.

How a layer runs (our own arrangement, the encoder's (`optimized_layers`) with a cache):

- fused, the fast path: causal self-attention's query/key/value as one `PackedLinear` call, this step's keys and
  values appended to the self-attention cache, attention on the model's own attention implementation, the output
  projection with the residual added; cross-attention's query packed, its keys and values of the encoder output as one
  packed product computed on the first step only and read from the cross-attention cache afterwards (as the model
  does), its output projection with the residual added; the feed-forward's first product with its activation, its
  second with the residual added. The LM head: its transform's product with the activation fused, its LayerNorm, the
  vocabulary projection packed; logits come back in fp32;
- block by block where a hook watches a block (transformers records `output_attentions` with a hook on each
  attention module, `output_hidden_states` with one on each layer; or a hook of your own): that block runs as a call
  of its module, in the same precision, its linear layers packed (one that a hook watches is called as a module);
- under `torch.compile`, int8 and bf16 decoder layers and LM head run eagerly outside the graph (a graph break
  each); fp32 ones are traced as the model's own;
- the model's own fp32 forward where the packed weights cannot serve the call (gradients flowing into the decoder,
  inputs on another device or of another dtype, `torch.export` and `torch.jit.trace`), with one warning per copy and
  reason for int8 and bf16.

A decode step's int8 products (a few rows each) run on oneDNN's s8 x s8 gemm rather than its int8 linear call, whose
fixed cost outweighs them (`PackedLinear`'s `small_products`, `linear_kernels.SMALL_INT8_PRODUCT`): the same
quantized operands and exact integer sums, the bias and post-op or residual added in fp32 after. Its fp32 attention
(int8's included) runs as batched products on a layout of the keys and mask kept for the generate call
(`_decode_step`).

Precision of what is kept between steps: the key/value cache holds what the layer's projections give, fp32 for fp32
and int8 (oneDNN's int8 products come out in fp32), bf16 for bf16 (half the bytes a step reads back). Hidden states
enter and leave each decoder layer in fp32; a bf16 layer computes in bf16 inside (its residual stream rounded to bf16,
LayerNorm statistics and the softmax in fp32, as the encoder's bf16 layers).

Beam search: each step reorders the cache by the surviving beams. The cross-attention keys and values of all beams of
one source are the same (the encoder output is repeated per beam), so reordering them among those beams changes
nothing; an optimized seq2seq copy reorders only the self-attention cache (`reorder_self_attention_cache`, our own
shortcut), which saves a copy of every cross-attention cache each step (1 MB a layer at batch 8 x 4 beams and 40
source tokens in fp32).
"""

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache

from ..attention_backends import additive_mask
from ..modeling_seqbert import (
    SeqBertAttention,
    SeqBertCrossAttention,
    SeqBertDecoder,
    SeqBertDecoderLayer,
    SeqBertLayer,
    SeqBertLMHead,
    SeqBertPreNormDecoderLayer,
    SeqBertSelfAttention,
)
from .length_groups import split_qkv
from .linear_kernels import PackedLinear
from .optimized_layers import (
    ROLES,
    _bf16_attention_fits,
    _block_hooked,
    _disabled,
    _feed_forward,
    _OptimizedLayer,
    _OptimizedLinear,
    _OptimizedMLP,
    _OptimizedSelfAttention,
    _packed_applies,
    _refusal,
    _warn_once,
    hooked,
    optimize_layer,
    optimized_class,
    precision_name,
)


# The linear layers of a seq2seq decoder layer that `optimize_for_cpu_inference` packs, by role: the causal
# self-attention's query/key/value as one product and its output projection (+ residual); the cross-attention's query,
# its key and value as one product (on the encoder output, once per `generate`), its output projection (+ residual);
# the feed-forward's first (+ activation) and second (+ residual) products.
DECODER_ROLES = ("qkv", "out_proj", "cross_query", "cross_kv", "cross_out_proj", "up_proj", "down_proj")
# The LM head's: its transform's product (+ activation) and the vocabulary projection.
LM_HEAD_ROLES = ("dense", "vocabulary")


def decoder_layer_linears(layer: SeqBertDecoderLayer) -> dict[str, tuple[list[nn.Linear], str | None, bool]]:
    """role (`DECODER_ROLES`) -> (its linear layers, activation, whether a residual is added)."""
    attention, cross, mlp = layer.self_attention, layer.cross_attention, layer.mlp
    return {
        "qkv": ([attention.query, attention.key, attention.value], None, False),
        "out_proj": ([attention.out_proj], None, True),
        "cross_query": ([cross.query], None, False),
        "cross_kv": ([cross.key, cross.value], None, False),
        "cross_out_proj": ([cross.out_proj], None, True),
        "up_proj": ([mlp.up_proj], attention.config.hidden_act, False),
        "down_proj": ([mlp.down_proj], None, True),
    }


def lm_head_linears(head: SeqBertLMHead, hidden_act: str) -> dict[str, tuple[list[nn.Linear], str | None, bool]]:
    """role (`LM_HEAD_ROLES`) -> (its linear layer, activation, whether a residual is added: never)."""
    return {"dense": ([head.dense], hidden_act, False), "vocabulary": ([head.decoder], None, False)}


# Where a cached cross-attention keeps `identical_row_groups` for each layer: {layer_idx: (groups, batch)}, an attribute
# of the generate call's `EncoderDecoderCache`.
_ROW_GROUPS = "seqbert_identical_row_groups"


def identical_row_groups(states: torch.Tensor, attention_mask: torch.Tensor | None) -> int:
    """The largest g > 1 dividing B for which every run of g consecutive rows of `states` (B, S, H), and of
    `attention_mask` (B, ...) where given, is one row repeated, else 1: beam search repeats each source's encoder
    output once per beam (`GenerationMixin._expand_inputs_for_generation`), so g is the number of beams there."""
    batch = states.shape[0]
    for groups in (g for g in range(batch, 1, -1) if batch % g == 0):
        if not torch.equal(states[::groups].repeat_interleave(groups, dim=0), states):
            continue
        if attention_mask is None or torch.equal(attention_mask[::groups].repeat_interleave(groups, 0), attention_mask):
            return groups
    return 1


def _in_precision(
    attention: SeqBertAttention,
    query,
    key,
    value,
    attention_mask,
    groups: int = 1,
    cache=None,
    role: str = "self",
    **kwargs,
):
    """`SeqBertAttention.merged_heads` of (B, N, L, D) queries and (B, N, S, D) keys and values -> the heads side by
    side (B, L, H) in the queries' dtype, and the weights where the implementation returns them; bf16 runs in fp32 on
    the bf16 projections unless it is sdpa with a boolean mask or none (as `_OptimizedSelfAttention.merged_heads`).

    A decode step (one query per row) in fp32 under sdpa (boolean mask or none, no dropout) is written out instead
    (`_decode_step`): softmax(q Kᵀ · scaling + mask) V in two batched products, as `LengthGroups.attend` writes out
    short fp32 groups (our own choice for decoding: sdpa's CPU flash kernel costs more than the products for a single
    query; measured on the Zen 5 of docs/int8.md at 1 thread, 8 rows x 12 heads: 43 against 62 us at 24 keys, 114
    against 142 us at 96; 32 rows, 128 keys: 742 against 1,023 us).

    `groups` > 1 (cross-attention, `identical_row_groups`): each run of `groups` rows shares its keys, values and mask
    (the beams of one source), so a decode step's single queries of those rows attend together as `groups` queries of
    one row, on that row's keys and values (our own arrangement: beam search then reads each source's cross-attention
    keys and values once a step, not once per beam; the same softmax per query). `cache` (the generate call's, or
    None) keeps what a decode step builds from inputs that do not change between layers or steps (`_decode_step`);
    `role`, "self" or "cross", tells apart the masks kept there."""
    dtype = query.dtype
    batch, heads_count, length, head_dim = query.shape
    if length == 1 and dtype == torch.float32 and _sdpa_written_out_fits(attention, attention_mask):
        heads = _decode_step(attention, query, key, value, attention_mask, groups, cache, role)
        return heads, None
    if groups > 1 and length == 1 and _sdpa_written_out_fits(attention, attention_mask):
        query = query.reshape(batch // groups, groups, heads_count, head_dim).transpose(1, 2)  # (B/g, N, g, D)
        key, value = key[::groups], value[::groups]  # (B/g, N, S, D), views
        mask = None if attention_mask is None else attention_mask[::groups, :, :1]  # (B/g, 1, 1, S)
        heads = nn.functional.scaled_dot_product_attention(query, key, value, mask, scale=attention.scaling)
        return heads.transpose(1, 2).reshape(batch, 1, -1), None  # (B, 1, H)
    if dtype == torch.bfloat16 and not _bf16_attention_fits(attention, attention_mask):
        query, key, value = query.float(), key.float(), value.float()
    heads, weights = SeqBertAttention.merged_heads(attention, query, key, value, attention_mask, **kwargs)
    return heads.to(dtype), weights


# What a decode step keeps on the generate call's cache (`_decode_step`), attributes of the cache object: the additive
# masks, {(role, groups): (the boolean mask they came from, (B/g x N, 1, S) fp32)}, and the cross-attention keys and
# values of each layer as the batched products take them, {layer_idx: (the cached keys, groups, Kᵀ, V)}.
_DECODE_MASKS = "seqbert_decode_masks"
_DECODE_CROSS = "seqbert_decode_cross_attention"


def _decode_step(attention: SeqBertAttention, query, key, value, attention_mask, groups: int, cache, role: str):
    """One decode step's attention in fp32: (B, N, 1, D) queries, (B, N, S, D) keys and values, a boolean mask
    broadcastable to (B, 1, 1, S), True where allowed, or None -> the heads side by side (B, 1, H).

    softmax(q Kᵀ · scaling + mask) V as `torch.baddbmm` (the mask added in the product's epilogue) or `torch.bmm`, the
    softmax, and `torch.bmm`, on (B/g x N, g, D) queries against the (B/g x N, D, S) keys of each `groups` rows (our
    own arrangement: 0.6x the time of `torch.matmul` on the 4-d tensors with the mask added apart, measured on the
    Zen 5 of docs/int8.md, 8 rows x 12 heads x 40 keys, 2 threads: 24 against 41 us). Kept on `cache` where given:
    the additive mask, for the boolean mask object every layer of a step is handed, and the cross-attention's keys and
    values in that layout, for the cached keys of the generate call (`_DECODE_MASKS`, `_DECODE_CROSS`)."""
    batch, heads_count, _, head_dim = query.shape
    rows = batch // groups
    kept = vars(cache) if cache is not None else {}
    layouts = kept.setdefault(_DECODE_CROSS, {}) if role == "cross" else {}  # self-attention's keys grow every step
    layout = layouts.get(attention.layer_idx)
    if layout is None or layout[0] is not key or layout[1] != groups:
        shape = (rows * heads_count, key.shape[2], head_dim)
        layout = (key, groups, key[::groups].reshape(shape).transpose(1, 2), value[::groups].reshape(shape))
        layouts[attention.layer_idx] = layout
    _, _, keys_t, values = layout  # (B/g x N, D, S), (B/g x N, S, D)
    if groups == 1:
        queries = query.reshape(batch * heads_count, 1, head_dim)
    else:  # the beams of a row side by side: (B/g, g, N, D) -> (B/g x N, g, D)
        queries = query.reshape(rows, groups, heads_count, head_dim).transpose(1, 2).reshape(-1, groups, head_dim)
    mask = _decode_mask(attention_mask, rows, heads_count, groups, kept, role)
    if mask is None:
        scores = torch.bmm(queries, keys_t).mul_(attention.scaling)
    else:
        scores = torch.baddbmm(mask, queries, keys_t, alpha=attention.scaling)
    heads = torch.bmm(scores.softmax(-1), values)  # (B/g x N, g, D)
    return heads.view(rows, heads_count, groups, head_dim).transpose(1, 2).reshape(batch, 1, heads_count * head_dim)


def _decode_mask(attention_mask, rows: int, heads_count: int, groups: int, kept: dict, role: str):
    """A decode step's boolean mask (B, 1 or N, 1 or L, S), or None, as the additive fp32 one `_decode_step` adds:
    (B/g x N, 1, S), 0 where True, fp32's minimum where False (`additive_mask`), of every `groups`-th row; kept in
    `kept` (the cache's attributes) for the mask object it came from."""
    if attention_mask is None:
        return None
    masks = kept.setdefault(_DECODE_MASKS, {})
    entry = masks.get((role, groups))
    if entry is not None and entry[0] is attention_mask:
        return entry[1]
    mask = additive_mask(attention_mask[::groups, :, -1:])  # (B/g, 1 or N, 1, S)
    mask = mask.expand(rows, heads_count, 1, mask.shape[-1]).reshape(rows * heads_count, 1, mask.shape[-1])
    masks[(role, groups)] = (attention_mask, mask)
    return mask


def _sdpa_written_out_fits(attention: SeqBertAttention, attention_mask: torch.Tensor | None) -> bool:
    """Whether sdpa attention (which returns no weights) may be written out here: a boolean mask or none, and no
    attention dropout (eval mode or a rate of 0)."""
    if attention.config._attn_implementation != "sdpa":
        return False
    if attention.training and attention.attention_dropout > 0:
        return False
    return attention_mask is None or attention_mask.dtype == torch.bool


class _OptimizedCausalSelfAttention(_OptimizedSelfAttention):
    """Mixed into the causal self-attention of an optimized decoder layer: its query/key/value product packed (each
    projection as a module where a hook watches it), this step's keys and values appended to the cache, attention in
    the layer's precision (`_in_precision`), the output projection packed."""

    optimized_name = "CpuOptimizedCausal{}"

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        unpadded=None,
        length_groups=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `SeqBertSelfAttention.forward`: (B, L, H) -> (output (B, L, H), weights or None), the cache updated
        (`length_groups`, the encoder's, is never given to a decoder)."""
        packed = self._packed_qkv
        if unpadded is not None or not _packed_applies(hidden_states, packed.dtype):
            return SeqBertSelfAttention.forward(
                self, hidden_states, attention_mask, past_key_values, unpadded, **kwargs
            )
        projections = (self.query, self.key, self.value)
        if any(hooked(projection) for projection in projections):
            qkv = torch.cat([projection(hidden_states) for projection in projections], dim=-1)
        else:
            qkv = packed(hidden_states)  # (B, L, 3H)
        heads, weights = self.heads(qkv, attention_mask, None, None, past_key_values=past_key_values, **kwargs)
        return self.out_proj(heads), weights

    def heads(self, qkv, attention_mask, length_groups=None, unpadded=None, past_key_values=None, **kwargs):
        """Fused query/key/value projections (B, L, 3H) -> the heads side by side (B, L, H) and the weights (eager
        attention) or None; this step's keys and values are appended to `past_key_values`' self-attention cache
        first (`length_groups` and `unpadded` are the encoder's, never given here)."""
        query, key, value = split_qkv(qkv, self)  # (B, N, L, D) each
        if past_key_values is not None:
            cache = getattr(past_key_values, "self_attention_cache", past_key_values)
            key, value = cache.update(key, value, self.layer_idx)  # (B, N, L_past + L, D) each
        return _in_precision(self, query, key, value, attention_mask, cache=past_key_values, **kwargs)


class _OptimizedCrossAttention(SeqBertCrossAttention):
    """Mixed into the cross-attention of an optimized decoder layer: the query packed; the keys and values of the
    encoder states as one packed product on the first step (each as a module where a hook watches it), kept in the
    cross-attention cache and read back on later steps, as the model does; attention in the layer's precision; the
    output projection packed."""

    _packed_query: PackedLinear
    _packed_kv: PackedLinear

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `SeqBertCrossAttention.forward`: decoder states (B, L, H), encoder states (B, S, H) -> (output (B, L, H),
        weights (B, N, L, S) or None)."""
        packed = self._packed_query
        if not _packed_applies(hidden_states, packed.dtype):  # fp32, the keys and values of the encoder states too
            try:
                self.key._cpu_fp32 = self.value._cpu_fp32 = True
                return super().forward(hidden_states, encoder_hidden_states, attention_mask, past_key_values, **kwargs)
            finally:
                del self.key._cpu_fp32, self.value._cpu_fp32
        query = self.query(hidden_states) if hooked(self.query) else packed(hidden_states)
        heads, weights = self.heads(query, encoder_hidden_states, attention_mask, past_key_values, **kwargs)
        return self.out_proj(heads), weights

    def heads(self, query, encoder_hidden_states, attention_mask, past_key_values, **kwargs):
        """The projected queries (B, L, H) -> the heads side by side (B, L, H), in their dtype, and the weights or
        None; the keys and values of `encoder_hidden_states` (B, S, H), fp32, computed here on the first step."""
        query = self._split_heads(query)  # (B, N, L, D)
        groups = 1
        if past_key_values is not None and past_key_values.is_updated.get(self.layer_idx):
            cached = past_key_values.cross_attention_cache.layers[self.layer_idx]
            key, value = cached.keys, cached.values  # (B, N, S, D) each, computed on the first step
            groups, batch = vars(past_key_values).get(_ROW_GROUPS, {}).get(self.layer_idx, (1, None))
            groups = groups if batch == key.shape[0] else 1  # the cache's rows were selected since
        else:
            states = encoder_hidden_states.to(self._packed_kv.dtype)
            if hooked(self.key) or hooked(self.value):
                kv = torch.cat([self.key(states), self.value(states)], dim=-1)
            else:
                kv = self._packed_kv(states)  # (B, S, 2H)
            key, value = kv.view(*kv.shape[:2], 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            if past_key_values is not None:
                key, value = past_key_values.cross_attention_cache.update(key, value, self.layer_idx)
                past_key_values.is_updated[self.layer_idx] = True
                groups = identical_row_groups(encoder_hidden_states, attention_mask)
                vars(past_key_values).setdefault(_ROW_GROUPS, {})[self.layer_idx] = (groups, key.shape[0])
        return _in_precision(self, query, key, value, attention_mask, groups, past_key_values, "cross", **kwargs)


class _OptimizedDecoderLayer(SeqBertDecoderLayer):
    """Mixed into a seq2seq decoder layer's class by `optimize_for_cpu_inference`: the same computation, with the
    layer's ten linear layers as seven `PackedLinear` calls (`DECODER_ROLES`), block by block where a hook watches a
    block, outside a compiled graph, or the model's own fp32 forward where the packed weights cannot serve the call
    (see the module docstring). Input and output have the same dtype."""

    _packed: dict[str, PackedLinear]
    _cpu_precision: str
    _cpu_notes: set
    _cpu_part: str

    def forward(
        self, x, attention_mask, encoder_hidden_states, encoder_attention_mask=None, past_key_values=None, **kwargs
    ):
        refusal = _refusal(self, x)
        if refusal is None and torch.compiler.is_compiling():
            if self._cpu_precision == "fp32":  # the model's own layer, traced into the graph
                return super().forward(
                    x, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs
                )
            return _decoder_layer_outside_the_graph(
                self, x, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values, kwargs
            )
        if refusal is not None:
            if self._cpu_precision != "fp32":
                _warn_once(self, refusal)
            dtype = x.dtype
            fp32 = x.float() if dtype == torch.bfloat16 else x
            return (
                super()
                .forward(fp32, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs)
                .to(dtype)
            )
        return self.packed_forward(
            x, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values, kwargs
        )

    def packed_forward(
        self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values, kwargs
    ) -> torch.Tensor:
        """The layer on its packed weights: (B, L, H), fp32 or (bf16 layers) bf16 -> the same shape and dtype; the
        encoder states (B, S, H) are read on the first step of a cached decoding only."""
        packed, attention, cross = self._packed, self.self_attention, self.cross_attention
        pre_norm = isinstance(self, SeqBertPreNormDecoderLayer)
        x = hidden_states.to(packed["qkv"].dtype)
        normed = self.self_attention_norm(x) if pre_norm else x
        if _block_hooked(attention, self.self_attention_dropout):  # the attention module, its hooks included
            out = attention(normed, attention_mask, past_key_values=past_key_values, **kwargs)[0]
            x = x + self.self_attention_dropout(out)
        else:
            heads, _ = attention.heads(packed["qkv"](normed), attention_mask, past_key_values=past_key_values, **kwargs)
            x = packed["out_proj"](heads, residual=x)
        if not pre_norm:
            x = self.self_attention_norm(x)
        normed = self.cross_attention_norm(x) if pre_norm else x
        if _block_hooked(cross, self.cross_attention_dropout):
            out = cross(
                normed, encoder_hidden_states, encoder_attention_mask, past_key_values=past_key_values, **kwargs
            )
            x = x + self.cross_attention_dropout(out[0])
        else:
            query = packed["cross_query"](normed)
            heads, _ = cross.heads(query, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs)
            x = packed["cross_out_proj"](heads, residual=x)
        if not pre_norm:
            x = self.cross_attention_norm(x)
        return _feed_forward(self, packed, x, pre_norm).to(hidden_states.dtype)


class _OptimizedCausalLayer(_OptimizedLayer):
    """Mixed into the causal layers of `SeqBertForCausalLM`'s decoder: the encoder's optimized layer
    (`_OptimizedLayer`), its attention `_OptimizedCausalSelfAttention` (the key/value cache), compiled calls broken
    out of the graph with the decoder's reason."""

    optimized_name = "CpuOptimizedCausal{}"

    def outside_the_graph(self, hidden_states, attention_mask, length_groups, kwargs) -> torch.Tensor:
        return _causal_layer_outside_the_graph(self, hidden_states, attention_mask, kwargs)


class _OptimizedLMHead(SeqBertLMHead):
    """Mixed into the LM head of an optimized generation model: its transform's product with the activation fused
    (both as modules where a hook watches one), its LayerNorm, and the vocabulary projection packed (as a module where
    a hook watches it), in the model's precision; logits (..., V) in fp32. Outside a compiled graph for int8 and bf16;
    the model's own fp32 head where the packed weights cannot serve the call, as the layers."""

    _packed: dict[str, PackedLinear]
    _cpu_precision: str
    _cpu_notes: set
    _cpu_part: str

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        refusal = _refusal(self, hidden_states)
        if refusal is None and torch.compiler.is_compiling():
            if self._cpu_precision == "fp32":
                return super().forward(hidden_states)
            return _lm_head_outside_the_graph(self, hidden_states)
        if refusal is not None:
            if self._cpu_precision != "fp32":
                _warn_once(self, refusal)
            return super().forward(hidden_states.float())
        return self.packed_forward(hidden_states)

    def packed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., H) fp32 or bf16 -> logits (..., V) fp32, on the packed weights."""
        packed = self._packed
        x = hidden_states.to(packed["dense"].dtype)
        x = self.act(self.dense(x)) if hooked(self.dense) or hooked(self.act) else packed["dense"](x)
        x = self.layer_norm(x)
        logits = self.decoder(x) if hooked(self.decoder) else packed["vocabulary"](x)
        return logits.float()


_COMPILED_REASON = (
    "optimize_for_cpu_inference's int8 and bf16 decoder layers and LM head run eagerly outside the compiled graph: "
    "oneDNN's int8 calls quantize each input from its own range, read on the host. Compile without fullgraph=True (a "
    "graph break per layer), or compile the model itself (fp32)"
)


@_disabled(_COMPILED_REASON)
def _decoder_layer_outside_the_graph(layer: _OptimizedDecoderLayer, *args) -> torch.Tensor:
    """An int8 or bf16 decoder layer's packed forward, called from a `torch.compile`d model: run eagerly."""
    return layer.packed_forward(*args)


@_disabled(_COMPILED_REASON)
def _causal_layer_outside_the_graph(layer: _OptimizedCausalLayer, hidden_states, attention_mask, kwargs):
    """An int8 or bf16 causal layer's packed forward, called from a `torch.compile`d model: run eagerly."""
    return layer.packed_forward(hidden_states, attention_mask, None, kwargs)


@_disabled(_COMPILED_REASON)
def _lm_head_outside_the_graph(head: _OptimizedLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
    """An int8 or bf16 LM head's packed forward, called from a `torch.compile`d model: run eagerly."""
    return head.packed_forward(hidden_states)


def _pack(linears_by_role: dict, kernel: str, int8: bool, dtype: torch.dtype) -> dict[str, PackedLinear]:
    """role -> the role's linear layers packed for `kernel`, int8 products of a decode step's few rows on
    `torch._int_mm` (`PackedLinear`'s `small_products`); each linear layer mixed with `_OptimizedLinear`."""
    packed = {}
    for role, (linears, activation, residual) in linears_by_role.items():
        packed[role] = PackedLinear(linears, int8, dtype, kernel, activation, residual=residual, small_products=True)
        for linear in linears:
            linear._cpu_linear = (int8, dtype, kernel, True)
            linear.__class__ = optimized_class(_OptimizedLinear, type(linear))
    return packed


def optimize_decoder_layer(
    layer: SeqBertDecoderLayer, kernel: str, int8: bool, dtype: torch.dtype, notes: set
) -> SeqBertDecoderLayer:
    """`layer` itself, its linear layers packed for `kernel` (`DECODER_ROLES`), its class and its modules' mixed with
    the optimized ones; `notes`: the reasons already warned about, shared by one copy."""
    packed = _pack(decoder_layer_linears(layer), kernel, int8, dtype)
    attention, cross = layer.self_attention, layer.cross_attention
    attention._packed_qkv = packed["qkv"]
    attention.__class__ = optimized_class(_OptimizedCausalSelfAttention, type(attention))
    cross._packed_query, cross._packed_kv = packed["cross_query"], packed["cross_kv"]
    cross.__class__ = optimized_class(_OptimizedCrossAttention, type(cross))
    layer.mlp._packed_up = packed["up_proj"]
    layer.mlp.__class__ = optimized_class(_OptimizedMLP, type(layer.mlp))
    layer._packed, layer._cpu_notes, layer._cpu_part = packed, notes, "decoder"
    layer._cpu_precision = precision_name(int8, dtype)
    layer.__class__ = optimized_class(_OptimizedDecoderLayer, type(layer))
    return layer


def optimize_decoder(decoder: SeqBertDecoder, kernel: str, int8: bool, dtype: torch.dtype, notes: set) -> None:
    """`decoder`'s layers optimized in place, every linear role on `kernel` ("onednn" for int8 and bf16): the
    seq2seq decoder's layers (`optimize_decoder_layer`) or the causal LM's causal layers (`optimize_layer` with
    `_OptimizedCausalLayer` and `_OptimizedCausalSelfAttention`)."""
    for layer in decoder.layers:
        if isinstance(layer, SeqBertDecoderLayer):
            optimize_decoder_layer(layer, kernel, int8, dtype, notes)
        elif isinstance(layer, SeqBertLayer):
            optimize_layer(
                layer, dict.fromkeys(ROLES, kernel), int8, dtype, notes, _OptimizedCausalLayer,
                _OptimizedCausalSelfAttention, part="decoder", small_products=True,
            )  # fmt: skip


def optimize_lm_head(
    head: SeqBertLMHead, hidden_act: str, kernel: str, int8: bool, dtype: torch.dtype, notes: set
) -> None:
    """`head` optimized in place: its transform and vocabulary projection packed for `kernel` (`LM_HEAD_ROLES`)."""
    head._packed = _pack(lm_head_linears(head, hidden_act), kernel, int8, dtype)
    head._cpu_notes, head._cpu_part, head._cpu_precision = notes, "LM head", precision_name(int8, dtype)
    head.__class__ = optimized_class(_OptimizedLMHead, type(head))


def reorder_self_attention_cache(cache, beam_idx: torch.LongTensor):
    """The model's `_reorder_cache` for beam search (`GenerationMixin` calls it, where a model has one, instead of
    `cache.reorder_cache`): the self-attention cache reordered by `beam_idx` (B x beams,), the cross-attention cache
    left as it is, since it holds the same keys and values for every beam of a source (see the module docstring).
    Returns `cache`."""
    getattr(cache, "self_attention_cache", cache).reorder_cache(beam_idx)
    return cache
