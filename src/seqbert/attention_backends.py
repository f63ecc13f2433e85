"""The attention back-ends of SeqBERT, and the unpadded layout they read. `modeling_seqbert.py` chooses among them;
it implements none of them.

- `eager_attention_forward`: plain softmax(Q Kᵀ · scaling + mask) V, the readable reference every other back-end must
  match (`attn_implementation="eager"`).
- `sdpa_attention_forward`: what `attn_implementation="sdpa"` (the default) runs on padded batches, and on the CPU's
  unpadded batches laid out one sequence per row: transformers' own sdpa function, except for mixed-precision training
  on a CPU (below).
- `varlen_attention_forward`: on a CUDA GPU, in fp16 / bf16 without attention dropout, the unpadded tokens go
  straight to torch's variable-length flash kernel (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10) with the
  batch's `cu_seqlens` and `max_seqlen`: no per-layer layout at all (`varlen_attention_applies` says where).
- `UnpaddedBatch`: where the real tokens of a batch sit, computed once per forward with one host read.

**Why the GPU path differs from the CPU's.** A GPU is fed by kernel launches, and every host sync stalls it. Measured
on one H200 in bf16 at batch 32 before this module existed: 310 GPU events and 8 host syncs per forward, against
transformers' BERT's 216 and 1, because each layer laid its tokens out per sequence (4 gathers a layer) and the
layout was read on the host piece by piece. So the layout is read on the host once (`UnpaddedBatch.from_mask`), the
hidden states stay `(1, T, H)` over the real tokens through every layer, and on CUDA attention reads `cu_seqlens`
directly. This is MosaicBERT's and ModernBERT's design (ModernBERT's `_unpad_modernbert_input` /
`_pad_modernbert_output`; flash-attn's `bert_padding.py`). On a CPU the per-sequence layout stays: there a gather
costs little, and torch's CPU attention kernels take a padded grid.

**Mixed-precision training on a CPU.** `torch.nn.functional.scaled_dot_product_attention` on a CPU picks its flash
kernel for bf16 / fp16 inputs without dropout, and its math kernel with dropout. For the short sequences of
fine-tuning (tens of tokens) the flash kernel's backward is slow: under `torch.autocast("cpu", dtype=torch.bfloat16)`
(what `Trainer --bf16` runs on a CPU) a bert-base layer's attention forward and backward took 40 ms there for 32
sequences of 48 tokens, against 11 ms for the same product written out as two bf16 matrix products around a fp32
softmax (2026-11-25, AMD EPYC Zen 4 with AVX512_BF16, 2 threads, torch 2.13.0; `scripts/benchmarks/benchmark.py`
measures the whole training step). From about 256 keys on, the flash kernel is as fast or faster. So, where gradients
flow in reduced precision on a CPU and the keys are at most `MAX_KEYS_WRITTEN_OUT`, `sdpa_attention_forward` computes
exactly what `eager_attention_forward` computes under autocast: the scores Q Kᵀ · scaling in bf16, the softmax in
fp32, dropout on the weights, their product with V in bf16 ("Attention Is All You Need" §3.2.1). Everywhere else
(fp32, inference, CUDA, long inputs, causal attention given without a mask) it is transformers' own sdpa function
unchanged, so fp32 results stay bit-identical to BERT's. Choosing the written-out product by length is our own trick;
the threshold is a measurement on the machine above, not a law.

Copied into saved model folders with the modeling file, which imports it relatively: it depends only on torch and
transformers.
"""

import functools
from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa_attention_forward

from .input_checks import DeferredCheck, read_on_host


try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # older torch: the unpadded path lays tokens out per sequence everywhere
    varlen_attn = None


# ----------------------------------------------------------------------------------------------------------------------
# The readable reference
# ----------------------------------------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Plain scaled dot-product attention, softmax(Q Kᵀ · scaling + mask) V ("Attention Is All You Need" §3.2.1).
    The readable reference that the sdpa / flash / flex / variable-length back-ends must match.

    Args:
        module (`nn.Module`): the attention module (its `training` is read).
        query, key, value (`torch.Tensor`): (B, N, L_q, D), (B, N, L_k, D), (B, N, L_k, D).
        attention_mask (`torch.Tensor`, *optional*): additive float mask broadcastable to (B, N, L_q, L_k), 0 where
            attention is allowed and the dtype's minimum where it is not (as built by `masking_utils`).
        scaling (`float`): usually D ** -0.5.
        dropout (`float`): dropout probability on the attention weights (applied only in training).

    Returns:
        `(attn_output, attn_weights)`: (B, L_q, N, D) and (B, N, L_q, L_k).
    """
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, N, L_q, L_k)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)  # (B, N, L_q, D)
    return attn_output.transpose(1, 2).contiguous(), attn_weights  # (B, L_q, N, D)


# ----------------------------------------------------------------------------------------------------------------------
# sdpa, with mixed-precision CPU training written out
# ----------------------------------------------------------------------------------------------------------------------

# The longest key length for which the written-out product replaces the flash kernel (see the module docstring).
MAX_KEYS_WRITTEN_OUT = 128

_REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def _writes_out(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, is_causal: bool, position_bias
) -> bool:
    """Whether `sdpa_attention_forward` takes the written-out product (see the module docstring)."""
    if query.device.type != "cpu" or query.dtype not in _REDUCED_PRECISION or key.shape[2] > MAX_KEYS_WRITTEN_OUT:
        return False
    if not torch.is_grad_enabled() or not (query.requires_grad or key.requires_grad or value.requires_grad):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if attention_mask is None:  # sdpa would apply the causal flag itself
        return not is_causal
    return attention_mask.dtype == torch.bool and position_bias is None


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """
    transformers' `sdpa_attention_forward`, with the written-out product for reduced-precision CPU training on short
    keys (see the module docstring).

    Args:
        module (`nn.Module`): the attention module (its `is_causal` and `training` are read).
        query, key, value (`torch.Tensor`): (B, N, L_q, D), (B, N, L_k, D), (B, N, L_k, D), any float dtype.
        attention_mask (`torch.Tensor`, *optional*): a boolean mask broadcastable to (B, N, L_q, L_k), True where
            attention is allowed (as `masking_utils` builds it for sdpa), or an additive float mask.
        dropout (`float`): dropout probability on the attention weights.
        scaling (`float`, *optional*): usually D ** -0.5 (None: sdpa's default, the same).

    Returns:
        `(attn_output, None)`: (B, L_q, N, D) in the dtype of `value`.
    """
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal  # as transformers' sdpa reads it
    if not _writes_out(query, key, value, attention_mask, is_causal, kwargs.get("position_bias")):
        return transformers_sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, N, L_q, L_k), bf16 / fp16
    attn_weights = attn_weights.float()
    if attention_mask is not None:  # the additive mask's minimum, as eager_attention_forward's masks carry
        attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)  # fp32
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights.to(value.dtype), value)  # (B, N, L_q, D)
    return attn_output.transpose(1, 2).contiguous(), None


# ----------------------------------------------------------------------------------------------------------------------
# The unpadded layout
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnpaddedBatch:
    """
    Where the T real tokens of a batch sit, for the unpadded encoder: hidden states travel as (1, T, H) over the real
    tokens only (embeddings, projections, feed-forward and LayerNorms never see padding).

    The batch holds S sequences, numbered in the order they appear. For an ordinary padded batch the sequences are the
    rows with at least one real token. For packed rows (several sequences in one row, as `DataCollatorWithFlattening`
    builds them) each sequence counts on its own, so no token attends across a sequence boundary. Sequence `s` holds
    the real tokens `cu_seqlens[s] .. cu_seqlens[s + 1] - 1`, in input order: the layout flash-attention's
    variable-length kernels read.

    Where attention needs a padded grid (the CPU's kernels, fp32, attention dropout), the *attention layout* lays the
    tokens out again, (S, L_max), one sequence per row from column 0 (`with_attention_layout`). Every move between
    layouts is a gather (`index_select`, several times faster on a CPU than advanced indexing or scattering into
    zeros). In the attention layout a position after a sequence's end repeats that sequence's first token (our own
    shortcut, exact): as a key it is masked out (weight exactly 0 after the softmax, times a finite value of the same
    sequence), and as a query its output is never read, so neither results nor gradients change.

    Attributes:
        indices (`torch.LongTensor` of shape `(T,)`): flat input positions `b * L + l` of the real tokens, in order.
        input_shape (`tuple[int, int]`): (B, L).
        cu_seqlens (`torch.IntTensor` of shape `(S + 1,)`): int32 cumulative sequence lengths, from 0 to T.
        max_seqlen (`int`): the longest sequence's length, L_max.
        packed (`bool`): some row holds more than one sequence.
        token_sequence (`torch.LongTensor` of shape `(T,)`): each real token's sequence, 0 .. S-1.
        varlen (`bool`): attention runs `varlen_attention_forward` on `cu_seqlens` (see `varlen_attention_applies`);
            else it runs on the attention layout.
        attention_mask (`torch.BoolTensor` of shape `(S, L_max)`, or None before `with_attention_layout`): True where
            a sequence has a token.
        attention_indices (`torch.LongTensor` of shape `(T,)`, or None likewise): flat attention positions
            `s * L_max + k` of the real tokens (sequence s, k-th token of it).
        attention_sources (`torch.LongTensor` of shape `(S * L_max,)`, or None likewise): the real token (0 .. T-1)
            each flat attention position holds: its own, or after a sequence's end that sequence's first.
    """

    indices: torch.Tensor
    input_shape: tuple[int, int]
    cu_seqlens: torch.Tensor
    max_seqlen: int
    packed: bool
    token_sequence: torch.Tensor
    varlen: bool = False
    attention_mask: torch.Tensor | None = None
    attention_indices: torch.Tensor | None = None
    attention_sources: torch.Tensor | None = None

    @classmethod
    def from_mask(
        cls,
        attention_mask: torch.Tensor | None,
        sequence_ids: torch.Tensor | None = None,
        checks: tuple[DeferredCheck, ...] = (),
        attention_layout: bool = True,
    ) -> "UnpaddedBatch":
        """
        The layout of a batch, with one host read (one sync on a GPU) for everything data-dependent: the number of
        real tokens T, of sequences S, the longest sequence and whether rows are packed, together with the results
        of the input checks `checks` (so that they cost no sync of their own). Every other size follows from those.

        Args:
            attention_mask (`torch.Tensor` of shape `(B, L)`, *optional*): 1 (or True) for real tokens; None: all real.
            sequence_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): which sequence each token belongs to; a
                new sequence starts wherever the id changes between two real tokens of a row (as
                `find_packed_sequence_indices` numbers them). None: one sequence per row.
            checks (`tuple[DeferredCheck, ...]`): input checks read in the same host read; the first that fails
                raises its error.
            attention_layout (`bool`): also build the attention layout (`with_attention_layout`).
        At least one of `attention_mask` and `sequence_ids` is given.

        Raises:
            ValueError, TypeError: a check of `checks` fails.
        """
        reference = attention_mask if attention_mask is not None else sequence_ids
        batch_size, seq_len = reference.shape
        device = reference.device
        if attention_mask is None:
            real = torch.ones(batch_size * seq_len, dtype=torch.bool, device=device)
        else:
            real = attention_mask.reshape(-1) != 0  # (B * L,)
        position = torch.arange(batch_size * seq_len, device=device)
        # The real token before each position (-1: none). A sequence starts at a real token whose predecessor lies in
        # another row or, in packed rows, carries another sequence id.
        last_real = torch.cummax(torch.where(real, position, -1), dim=0).values
        previous = nn.functional.pad(last_real[:-1], (1, 0), value=-1)  # (B * L,)
        starts = real & (torch.div(previous, seq_len, rounding_mode="floor") != position // seq_len)
        restarts = torch.zeros((), dtype=torch.bool, device=device)
        if sequence_ids is not None:
            sequence = sequence_ids.reshape(-1)
            restarts = real & ~starts & (sequence != sequence.index_select(0, previous.clamp(min=0)))
            starts = starts | restarts
        sequence_index = starts.cumsum(0) - 1  # (B * L,): the sequence of each real position
        lengths = torch.zeros_like(position).index_add_(0, sequence_index.clamp(min=0), real.long())  # (>= S,)
        num_tokens, num_sequences, max_seqlen, packed = read_on_host(
            checks, (real.sum(), starts.sum(), lengths.max(), restarts.any())
        )
        indices = torch.nonzero_static(real, size=num_tokens).squeeze(1)  # (T,)
        cu_seqlens = nn.functional.pad(torch.cumsum(lengths[:num_sequences], 0, dtype=torch.int32), (1, 0))
        batch = cls(
            indices=indices,
            input_shape=(batch_size, seq_len),
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            packed=bool(packed),
            token_sequence=sequence_index.index_select(0, indices),
        )
        return batch.with_attention_layout() if attention_layout else batch

    @property
    def num_tokens(self) -> int:
        """T, the number of real tokens."""
        return self.indices.numel()

    def with_attention_layout(self) -> "UnpaddedBatch":
        """This batch, with the attention layout built (from `cu_seqlens`, no host read) and `varlen` False."""
        max_seqlen = self.max_seqlen
        first_token = self.cu_seqlens[:-1].long()  # (S,)
        column = torch.arange(max_seqlen, device=first_token.device)
        attention_mask = column < self.cu_seqlens.diff()[:, None]  # (S, L_max)
        token = torch.arange(self.num_tokens, device=first_token.device)
        return replace(
            self,
            varlen=False,
            attention_mask=attention_mask,
            attention_indices=self.token_sequence * max_seqlen + (token - first_token[self.token_sequence]),
            attention_sources=(first_token[:, None] + column * attention_mask).reshape(-1),
        )

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) in the input layout -> (1, T, ...): the real tokens' rows."""
        return padded.reshape(-1, *padded.shape[2:]).index_select(0, self.indices).unsqueeze(0)

    def pad(self, unpadded: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (B, L, ...) in the input layout, zeros at padding."""
        rows = unpadded.new_zeros(self.input_shape[0] * self.input_shape[1], *unpadded.shape[2:])
        return rows.index_copy_(0, self.indices, unpadded[0]).view(*self.input_shape, *unpadded.shape[2:])

    def to_attention_layout(self, unpadded: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (S, L_max, ...), one sequence per row; after a sequence's end, its first token again."""
        shape = self.attention_mask.shape
        return unpadded[0].index_select(0, self.attention_sources).view(*shape, *unpadded.shape[2:])

    def from_attention_layout(self, laid_out: torch.Tensor) -> torch.Tensor:
        """(S, L_max, ...) -> (1, T, ...): the real tokens' rows, in input order."""
        return laid_out.reshape(-1, *laid_out.shape[2:]).index_select(0, self.attention_indices).unsqueeze(0)


# ----------------------------------------------------------------------------------------------------------------------
# Variable-length attention (CUDA)
# ----------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _runs_flash_attention(device_index: int) -> bool:
    """Whether the GPU runs flash-attention's kernels (compute capability 8.0, Ampere, or newer)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def varlen_attention_applies(device: torch.device, dtype: torch.dtype, head_dim: int, dropout: float) -> bool:
    """
    Whether the unpadded encoder's attention runs `varlen_attention_forward`: torch ships `varlen_attn` (>= 2.10), the
    tokens are on a CUDA GPU that runs flash-attention (compute capability >= 8.0) and flash is not switched off
    (`torch.backends.cuda.flash_sdp_enabled()`, which `torch.nn.attention.sdpa_kernel` sets), attention computes in
    fp16 or bf16 (the model's dtype, or autocast's), the head size is a multiple of 8 up to 256, and no attention
    dropout is drawn (`varlen_attn` has none: training with `attention_probs_dropout_prob > 0` lays tokens out per
    sequence for sdpa instead, as on the CPU).

    Args:
        device (`torch.device`): where the hidden states are.
        dtype (`torch.dtype`): the dtype queries and keys are computed in.
        head_dim (`int`): D.
        dropout (`float`): the attention dropout probability in effect (0.0 in eval mode).
    """
    if varlen_attn is None or device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if dropout > 0.0 or head_dim % 8 != 0 or head_dim > 256 or not torch.backends.cuda.flash_sdp_enabled():
        return False
    return _runs_flash_attention(torch.cuda.current_device() if device.index is None else device.index)


def varlen_attention_forward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, unpadded: UnpaddedBatch
) -> torch.Tensor:
    """
    softmax(Q Kᵀ / sqrt(D)) V within each sequence of `unpadded`, on the real tokens as they are: torch's
    variable-length flash-attention kernel (`torch.nn.attention.varlen.varlen_attn`; Dao 2023, "FlashAttention-2",
    variable-length batches as in flash-attn's `flash_attn_varlen_func`). The scale is the kernel's default,
    1 / sqrt(D), the same as `SeqBertAttention.scaling`.

    Args:
        query, key, value (`torch.Tensor` of shape `(T, N, D)`): fp16 or bf16, on a CUDA GPU.
        unpadded (`UnpaddedBatch`): the batch's `cu_seqlens` and `max_seqlen`.

    Returns:
        `torch.Tensor` of shape `(T, N, D)` in the dtype of `query`.
    """
    cu_seqlens, max_seqlen = unpadded.cu_seqlens, unpadded.max_seqlen
    return varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


__all__ = [
    "MAX_KEYS_WRITTEN_OUT",
    "UnpaddedBatch",
    "eager_attention_forward",
    "sdpa_attention_forward",
    "varlen_attention_applies",
    "varlen_attention_forward",
]
