"""The attention back-ends of SeqBERT, and the unpadded layout they read. `modeling_seqbert.py` chooses among them;
it implements none of them.

- `eager_attention_forward`: plain softmax(Q Kᵀ · scaling + mask) V, the readable reference every other back-end must
  match (`attn_implementation="eager"`).
- `sdpa_attention_forward`: what `attn_implementation="sdpa"` (the default) runs on padded batches, and on the CPU's
  unpadded batches laid out one sequence per row: transformers' own sdpa function, except for mixed-precision training
  on a CPU (below).
- `varlen_attention_forward`: on a CUDA GPU, in fp16 / bf16, the unpadded tokens go straight to torch's
  variable-length flash-attention kernel with the batch's `cu_seqlens` and `max_seqlen`, attention dropout included
  (`aten._flash_attention_forward`, the kernel under `torch.nn.attention.varlen.varlen_attn`): no per-layer layout at
  all, in training as in inference (`varlen_attention_applies` says where; `varlen_attention_fits` checks each call).
- `UnpaddedBatch`: where the real tokens of a batch sit, computed once per forward with one host read.

**Why the GPU path differs from the CPU's.** A GPU is fed by kernel launches, and every host sync stalls it. Measured
on one H200 in bf16 at batch 32 before this module existed: 310 GPU events and 8 host syncs per forward, against
transformers' BERT's 216 and 1, because each layer laid its tokens out per sequence (4 gathers a layer) and the
layout was read on the host piece by piece. So the layout is read on the host once (`UnpaddedBatch.from_mask`), the
hidden states stay `(1, T, H)` over the real tokens through every layer, and on CUDA attention reads `cu_seqlens`
directly. This is MosaicBERT's and ModernBERT's design (ModernBERT's `_unpad_modernbert_input` /
`_pad_modernbert_output`; flash-attn's `bert_padding.py`). On a CPU the per-sequence layout stays: there a gather
costs little, and torch's CPU attention kernels take a padded grid.

**Dropout inside the kernel.** Fine-tuning BERT draws attention dropout (0.1). torch's public `varlen_attn` has no
dropout, so the kernel is called through the op beneath it, `torch.ops.aten._flash_attention_forward`, with
`dropout_p`; its registered derivative (`_flash_attention_backward`, which redraws the same mask from the returned
random state) gives the gradients. torch's own jagged-tensor sdpa calls it the same way in training
(`torch/nested/_internal/sdpa.py`); flash-attn's `flash_attn_varlen_func(dropout_p=...)` is the same kernel. It is a
private op, so its schema is probed at import (`flash_attention_forward` is None where it does not take the positional
arguments and `scale=` this module passes), and then `varlen_attn` serves inference while training with attention
dropout lays tokens out per sequence for sdpa. Inference calls the same op with `dropout_p=0.0`: `varlen_attn` wraps
that very call and adds a `torch.zeros` for its random state, one more launch per layer
(`scripts/checks/count_launches.py` counts them).

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
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa_attention_forward

from .input_checks import (
    IGNORE_INDEX,
    LABELLED,
    DeferredCheck,
    DeferredReads,
    StaticLayoutMatches,
    check_static_layout,
    eager_execution,
    packed_sequence_ids,
    read_on_host,
)


try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # older torch: the unpadded path lays tokens out per sequence everywhere
    varlen_attn = None

# The positional arguments `varlen_attention_forward` passes to `aten._flash_attention_forward`, by name, before its
# keyword `scale`.
FLASH_ATTENTION_ARGUMENTS = (
    "query",
    "key",
    "value",
    "cum_seq_q",
    "cum_seq_k",
    "max_q",
    "max_k",
    "dropout_p",
    "is_causal",
    "return_debug_mask",
)


def flash_attention_schema_fits(schema) -> bool:
    """Whether an op schema (`torch._C.FunctionSchema`) takes `FLASH_ATTENTION_ARGUMENTS` positionally, then `scale`
    and only arguments with defaults, and returns the attention output first: what `varlen_attention_forward` passes
    and reads."""
    arguments = schema.arguments
    named = tuple(a.name for a in arguments[: len(FLASH_ATTENTION_ARGUMENTS)] if not a.kwarg_only)
    rest = arguments[len(FLASH_ATTENTION_ARGUMENTS) :]
    if named != FLASH_ATTENTION_ARGUMENTS or "scale" not in {a.name for a in rest}:
        return False
    return all(a.has_default_value() for a in rest) and bool(schema.returns) and schema.returns[0].name == "output"


def _probe_flash_attention_forward():
    """torch's `aten._flash_attention_forward` where its schema fits (`flash_attention_schema_fits`, as in torch 2.4
    to 2.13), else None."""
    try:
        overload = torch.ops.aten._flash_attention_forward.default
    except (AttributeError, RuntimeError):
        return None
    return overload if flash_attention_schema_fits(overload._schema) else None


# torch's variable-length flash-attention forward with dropout (None where its schema is not the probed one).
flash_attention_forward = _probe_flash_attention_forward()


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


def additive_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask broadcastable to (B, N, L_q, L_k) as the additive fp32 one `eager_attention_forward` adds: 0
    where True, fp32's minimum where False. A mask expanded along the queries (the unpadded encoder's, `sdpa_mask`) is
    converted once per key row and broadcast."""
    if attention_mask.dim() == 4 and attention_mask.stride(2) == 0:
        attention_mask = attention_mask[:, :, :1]  # (B, 1, 1, L_k)
    return torch.zeros(attention_mask.shape).masked_fill_(~attention_mask, torch.finfo(torch.float32).min)


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
    if attention_mask is not None:  # fp32 scores with the additive mask, in one pass, as eager's masks add them
        attn_weights = torch.add(additive_mask(attention_mask), attn_weights)
    else:
        attn_weights = attn_weights.float()
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

    Where attention needs a padded grid (the CPU's kernels, fp32, GPUs without flash-attention), the *attention layout*
    lays the tokens out again, (S, L_max), one sequence per row from column 0 (`with_attention_layout`). Every move between
    layouts is a gather (`index_select`, several times faster on a CPU than advanced indexing or scattering into
    zeros). In the attention layout a position after a sequence's end repeats that sequence's first token (our own
    shortcut, exact): as a key it is masked out (weight exactly 0 after the softmax, times a finite value of the same
    sequence), and as a query its output is never read, so neither results nor gradients change.

    A *static* batch (`from_static_layout`, what `StaticShapeCollator` builds for CUDA graphs) is a padded batch whose
    layout came with it, computed on the CPU: T is a bucket's token count, the real tokens followed by filler tokens
    (each `indices` entry of a filler token is B x L, one past the grid: a zero row when unpadding, dropped when
    padding), `cu_seqlens` may repeat an offset (empty sequences, to fix S), and `max_seqlen` is a bound given with the
    batch (at least the longest sequence), so that every size is known without reading the device.

    Attributes:
        indices (`torch.LongTensor` of shape `(T,)`): flat input positions `b * L + l` of the real tokens, in order
            (a static batch's filler tokens: B x L, see `filler`).
        input_shape (`tuple[int, int]`): (B, L).
        cu_seqlens (`torch.IntTensor` of shape `(S + 1,)`): int32 cumulative sequence lengths, from 0 to T.
        max_seqlen (`int`): the longest sequence's length, L_max (a static batch: a bound on it).
        packed (`bool`): some row holds more than one sequence.
        filler (`bool`): a static batch: `indices` may hold B x L, the position of filler tokens outside the grid.
        token_sequence (`torch.LongTensor` of shape `(T,)`): each real token's sequence, 0 .. S-1 (computed on first
            use: variable-length attention never needs it).
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
    filler: bool = False
    varlen: bool = False
    attention_mask: torch.Tensor | None = None
    attention_indices: torch.Tensor | None = None
    attention_sources: torch.Tensor | None = None
    # What is built on first use: `token_sequence`, and the attention layout a variable-length batch falls back to
    # (`attention_fallback`).
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_mask(
        cls,
        attention_mask: torch.Tensor | None,
        sequence_ids: torch.Tensor | None = None,
        checks: tuple[DeferredCheck, ...] = (),
        attention_layout: bool = True,
        reads: DeferredReads | None = None,
    ) -> "UnpaddedBatch":
        """
        The layout of a batch, with one host read (one sync on a GPU) for everything data-dependent: the number of
        real tokens T, of sequences S, the longest sequence and whether rows are packed, together with the results
        of the input checks `checks` and of a caller's `reads` (so that they cost no sync of their own). Every other
        size follows from those.

        Args:
            attention_mask (`torch.Tensor` of shape `(B, L)`, *optional*): 1 (or True) for real tokens; None: all real.
            sequence_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): which sequence each token belongs to; a
                new sequence starts wherever the id changes between two real tokens of a row (as
                `find_packed_sequence_indices` numbers them). None: one sequence per row.
            checks (`tuple[DeferredCheck, ...]`): input checks read in the same host read; the first that fails
                raises its error.
            attention_layout (`bool`): also build the attention layout (`with_attention_layout`).
            reads (`DeferredReads`, *optional*): a caller's checks (after `checks`) and scalars, read in the same
                host read; their values land in `reads.values`.
        At least one of `attention_mask` and `sequence_ids` is given.

        Raises:
            ValueError, TypeError: a check of `checks` or `reads.checks` fails.
        """
        reference = attention_mask if attention_mask is not None else sequence_ids
        batch_size, seq_len = reference.shape
        device = reference.device
        reads = DeferredReads() if reads is None else reads
        checks = (*checks, *reads.checks)
        if sequence_ids is None:  # one sequence per row: the rows' lengths, in fewer kernels than the walk below
            lengths = torch.count_nonzero(attention_mask, dim=1)  # (B,)
            cumulative = nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))  # (B + 1,)
            layout_scalars = (cumulative[-1], torch.count_nonzero(lengths), lengths.max())  # T, S, L_max
            values = read_on_host(checks, (*layout_scalars, *reads.scalars))
            (num_tokens, num_sequences, max_seqlen), reads.values = values[:3], values[3:]
            if num_sequences < batch_size:  # fully padded rows hold no sequence: their ends are dropped
                ends = torch.nonzero_static(lengths, size=num_sequences).squeeze(1) + 1  # (S,)
                cumulative = cumulative.index_select(0, nn.functional.pad(ends, (1, 0)))
            batch = cls(
                indices=torch.nonzero_static(attention_mask.reshape(-1), size=num_tokens).squeeze(1),
                input_shape=(batch_size, seq_len),
                cu_seqlens=cumulative,
                max_seqlen=max_seqlen,
                packed=False,
            )
            return batch.with_attention_layout() if attention_layout else batch
        if attention_mask is None:
            real = torch.ones(batch_size * seq_len, dtype=torch.bool, device=device)
        else:
            real = attention_mask.reshape(-1) != 0  # (B * L,)
        position = torch.arange(batch_size * seq_len, device=device)
        # The real token before each position (-1: none). A sequence starts at a real token whose predecessor lies in
        # another row or carries another sequence id.
        last_real = torch.cummax(torch.where(real, position, -1), dim=0).values
        previous = nn.functional.pad(last_real[:-1], (1, 0), value=-1)  # (B * L,)
        starts = real & (torch.div(previous, seq_len, rounding_mode="floor") != position // seq_len)
        sequence = sequence_ids.reshape(-1)
        restarts = real & ~starts & (sequence != sequence.index_select(0, previous.clamp(min=0)))
        starts = starts | restarts
        sequence_index = starts.cumsum(0) - 1  # (B * L,): the sequence of each real position
        lengths = torch.zeros_like(position).index_add_(0, sequence_index.clamp(min=0), real.long())  # (>= S,)
        layout_scalars = (real.sum(), starts.sum(), lengths.max(), restarts.any())
        values = read_on_host(checks, (*layout_scalars, *reads.scalars))
        (num_tokens, num_sequences, max_seqlen, packed), reads.values = values[:4], values[4:]
        indices = torch.nonzero_static(real, size=num_tokens).squeeze(1)  # (T,)
        cu_seqlens = nn.functional.pad(torch.cumsum(lengths[:num_sequences], 0, dtype=torch.int32), (1, 0))
        batch = cls(
            indices=indices,
            input_shape=(batch_size, seq_len),
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            packed=bool(packed),
        )
        batch._cache["token_sequence"] = sequence_index.index_select(0, indices)
        return batch.with_attention_layout() if attention_layout else batch

    @classmethod
    def from_static_layout(
        cls, indices: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, input_shape: tuple[int, int]
    ) -> "UnpaddedBatch":
        """
        The layout of a static batch (see the class docstring), as given with it: reads nothing on the host, builds
        nothing on the device. The caller vouches for it (`StaticShapeCollator` computed it on the CPU).

        Args:
            indices (`torch.LongTensor` of shape `(T,)`): the flat grid position of each token, in order, B x L for a
                filler token.
            cu_seqlens (`torch.IntTensor` of shape `(S + 1,)`): int32 offsets from 0 to T, non-decreasing (a repeated
                offset is an empty sequence).
            max_seqlen (`int`): at least the longest sequence's length.
            input_shape (`tuple[int, int]`): (B, L) of the inputs.
        """
        return cls(indices, input_shape, cu_seqlens, max_seqlen, packed=True, filler=True)

    @property
    def num_tokens(self) -> int:
        """T, the number of real tokens (a static batch's filler tokens included)."""
        return self.indices.numel()

    @property
    def token_sequence(self) -> torch.Tensor:
        """(T,) int64: each real token's sequence, 0 .. S-1, from `cu_seqlens` (no host read)."""
        if "token_sequence" not in self._cache:
            tokens = torch.arange(self.num_tokens, device=self.cu_seqlens.device)
            self._cache["token_sequence"] = torch.searchsorted(self.cu_seqlens[1:], tokens.int(), right=True)
        return self._cache["token_sequence"]

    def with_attention_layout(self) -> "UnpaddedBatch":
        """This batch, with the attention layout built (from `cu_seqlens`, no host read) and `varlen` False. An empty
        sequence (a static batch's) gets one key, a token of the batch, so that no row of the softmax is all masked:
        its output is never read, so neither results nor gradients change (our own shortcut, as the repeated first
        token below)."""
        max_seqlen = self.max_seqlen
        first_token = self.cu_seqlens[:-1].long()  # (S,)
        column = torch.arange(max_seqlen, device=first_token.device)
        attention_mask = column < self.cu_seqlens.diff().clamp(min=1)[:, None]  # (S, L_max)
        token = torch.arange(self.num_tokens, device=first_token.device)
        sources = (first_token[:, None] + column * attention_mask).reshape(-1)
        return replace(
            self,
            varlen=False,
            attention_mask=attention_mask,
            attention_indices=self.token_sequence * max_seqlen + (token - first_token[self.token_sequence]),
            attention_sources=sources.clamp(max=self.num_tokens - 1),  # an empty sequence at the end: the last token
        )

    def attention_fallback(self) -> "UnpaddedBatch":
        """This batch with the attention layout, for a variable-length batch whose attention cannot run the kernel
        after all (`varlen_attention_fits`): built on the first call from `cu_seqlens` (no host read), then reused by
        every layer of the forward."""
        if self.attention_mask is not None:
            return self
        if "fallback" not in self._cache:
            self._cache["fallback"] = self.with_attention_layout()
        return self._cache["fallback"]

    def sdpa_mask(self) -> torch.Tensor | None:
        """
        The boolean mask sdpa reads in the attention layout, True where a key is a real token of the query's
        sequence: `attention_mask` (S, L_max) as (S, 1, L_max, L_max), a broadcast view, the values transformers'
        `create_bidirectional_mask` builds, without its host read (it asks whether every position is real; here that
        follows from T = S x L_max, known on the host). None when every row is full, as transformers returns then.
        """
        num_sequences, max_length = self.attention_mask.shape
        if self.num_tokens == num_sequences * max_length:
            return None
        return self.attention_mask[:, None, None, :].expand(num_sequences, 1, max_length, max_length)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) in the input layout -> (1, T, ...): the real tokens' rows (a filler token's: zeros)."""
        rows = padded.reshape(-1, *padded.shape[2:])  # (B * L, ...)
        if self.filler:
            rows = torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])  # position B * L: the filler's zeros
        elif torch.is_grad_enabled() and rows.requires_grad:  # distinct positions: the gradient copied back
            return _GatherDistinctRows.apply(rows, self.indices).unsqueeze(0)
        return rows.index_select(0, self.indices).unsqueeze(0)

    def pad(self, unpadded: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (B, L, ...) in the input layout, zeros at padding (a static batch's filler tokens are
        written one past the grid, then dropped)."""
        positions = self.input_shape[0] * self.input_shape[1]
        rows = unpadded.new_zeros(positions + int(self.filler), *unpadded.shape[2:])
        rows.index_copy_(0, self.indices, unpadded.squeeze(0))
        return rows[:positions].view(*self.input_shape, *unpadded.shape[2:])

    def to_attention_layout(self, unpadded: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (S, L_max, ...), one sequence per row; after a sequence's end, its first token again. Its
        gradient is gathered back from each token's own position (`_ToAttentionLayout`)."""
        shape, rows = self.attention_mask.shape, unpadded.squeeze(0)
        if torch.is_grad_enabled() and rows.requires_grad:
            laid_out = _ToAttentionLayout.apply(rows, self.attention_sources, self.attention_indices)
        else:
            laid_out = rows.index_select(0, self.attention_sources)
        return laid_out.view(*shape, *unpadded.shape[2:])

    def from_attention_layout(self, laid_out: torch.Tensor) -> torch.Tensor:
        """(S, L_max, ...) -> (1, T, ...): the real tokens' rows, in input order. Its gradient is copied to those rows
        (`_GatherDistinctRows`)."""
        rows = laid_out.reshape(-1, *laid_out.shape[2:])
        if torch.is_grad_enabled() and rows.requires_grad:
            return _GatherDistinctRows.apply(rows, self.attention_indices).unsqueeze(0)
        return rows.index_select(0, self.attention_indices).unsqueeze(0)


class _ToAttentionLayout(torch.autograd.Function):
    """
    `rows.index_select(0, sources)` (T rows -> S x L_max rows of the attention layout) whose backward gathers each
    token's gradient from its own position (`own`, the attention indices) instead of adding up the gradients of every
    position that repeats it, as `index_select`'s backward does (`index_add_`, a scatter: on a CPU it took a quarter of
    a bf16 training step at bert-base width, 2026-11-29, issue 68). Exact: a position after a sequence's end repeats
    its first token, and that copy's gradient is exactly zero (as a key its attention weight is exactly 0 after the
    softmax; as a query its output is never read), so the sum it is left out of is unchanged, bit for bit. Our own
    shortcut.
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor, sources: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(own)
        return rows.index_select(0, sources)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (own,) = ctx.saved_tensors
        return grad.index_select(0, own), None, None


class _GatherDistinctRows(torch.autograd.Function):
    """
    `rows.index_select(0, own)` for distinct indices `own` (the attention layout's S x L_max rows -> the T real
    tokens' rows; the padded grid's B x L rows -> the T real tokens') whose backward copies the gradient into zeros
    (`index_copy_`) instead of adding it (`index_add_`, a scatter, slower on a CPU): the indices are distinct, so the
    result is the same, bit for bit. Our own shortcut (see `_ToAttentionLayout`).
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(own)
        ctx.num_rows = rows.shape[0]
        return rows.index_select(0, own)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (own,) = ctx.saved_tensors
        return grad.new_zeros(ctx.num_rows, *grad.shape[1:]).index_copy_(0, own, grad), None


# ----------------------------------------------------------------------------------------------------------------------
# Variable-length attention (CUDA)
# ----------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _capability_runs_flash_attention(device_index: int) -> bool:
    """Whether the GPU runs flash-attention's kernels (compute capability 8.0, Ampere, or newer)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 8


@torch.compiler.assume_constant_result
def runs_flash_attention(device: torch.device) -> bool:
    """Whether `device` is a CUDA GPU that runs flash-attention's kernels: compute capability 8.0 (Ampere) or newer,
    and not a ROCm build of torch (its flash kernels are another implementation, not tested with SeqBERT). A fact of
    the device: `torch.compile` takes it as a constant of the graph (it asks the driver, which it cannot trace)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return _capability_runs_flash_attention(torch.cuda.current_device() if device.index is None else device.index)


@torch.compiler.assume_constant_result
def _flash_enabled() -> bool:
    """`torch.backends.cuda.flash_sdp_enabled()`, which `torch.compile` cannot trace: a graph takes the value it had
    when compiled (switching flash off with `sdpa_kernel` afterwards does not reach a compiled graph)."""
    return torch.backends.cuda.flash_sdp_enabled()


_HALF_PRECISION = (torch.float16, torch.bfloat16)


def varlen_attention_applies(device: torch.device, dtype: torch.dtype, head_dim: int, dropout: float) -> bool:
    """
    Whether the unpadded encoder lays its batch out for `varlen_attention_forward` (else per sequence, for sdpa): the
    tokens are on a CUDA GPU that runs flash-attention (`runs_flash_attention`) and flash is not switched off
    (`torch.backends.cuda.flash_sdp_enabled()`, which `torch.nn.attention.sdpa_kernel` sets), attention computes in
    fp16 or bf16 (the model's dtype, or autocast's), the head size is a multiple of 8 up to 256, and the kernel is
    there: `flash_attention_forward` (any dropout), or torch's `varlen_attn` (torch >= 2.10) where no attention
    dropout is drawn.

    Args:
        device (`torch.device`): where the hidden states are.
        dtype (`torch.dtype`): the dtype queries and keys are computed in.
        head_dim (`int`): D.
        dropout (`float`): the attention dropout probability of the configuration in effect (0.0 in eval mode).
    """
    if dtype not in _HALF_PRECISION or head_dim % 8 != 0 or head_dim > 256:
        return False
    kernel = flash_attention_forward is not None or (varlen_attn is not None and dropout == 0.0)
    return kernel and _flash_enabled() and runs_flash_attention(device)


def varlen_attention_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float) -> bool:
    """
    Whether this call's queries, keys and values can go to the kernel as they are, checked where attention runs:
    one dtype, fp16 or bf16, one CUDA device (a quantized or adapter linear may return another dtype than the model's),
    and a kernel that draws `dropout` (`varlen_attention_applies` decided the layout from the configuration; a
    module's own dropout may differ). Reads nothing on the host.
    """
    if not (query.dtype == key.dtype == value.dtype) or query.dtype not in _HALF_PRECISION:
        return False
    if not (query.device == key.device == value.device) or not runs_flash_attention(query.device):
        return False
    return flash_attention_forward is not None or (varlen_attn is not None and dropout == 0.0)


def varlen_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    unpadded: UnpaddedBatch,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """
    softmax(Q Kᵀ · scaling) V within each sequence of `unpadded`, on the real tokens as they are, with dropout on the
    attention weights: torch's variable-length flash-attention kernel (Dao 2023, "FlashAttention-2"; variable-length
    batches as flash-attn's `flash_attn_varlen_func`) through `aten._flash_attention_forward` (see the module
    docstring), or torch's `varlen_attn` where that op's schema is not the probed one (then `dropout` must be 0).

    Args:
        query, key, value (`torch.Tensor` of shape `(T, N, D)`): fp16 or bf16, on a CUDA GPU (`varlen_attention_fits`).
        unpadded (`UnpaddedBatch`): the batch's `cu_seqlens` and `max_seqlen`.
        dropout (`float`): the probability of dropping an attention weight (kept ones are scaled by 1 / (1 - p)).
        scaling (`float`, *optional*): usually D ** -0.5, the kernel's default (None; `varlen_attn` takes only that).

    Returns:
        `torch.Tensor` of shape `(T, N, D)` in the dtype of `query`.

    Raises:
        ValueError: `dropout` > 0 where only `varlen_attn`, which has no dropout, is there.
    """
    cu_seqlens, max_seqlen = unpadded.cu_seqlens, unpadded.max_seqlen
    if flash_attention_forward is not None:
        arguments = (query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout, False, False)
        return flash_attention_forward(*arguments, scale=scaling)[0]
    if dropout > 0.0:
        raise ValueError(f"dropout ({dropout}) must be 0.0: torch's varlen_attn draws no attention dropout")
    return varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)  # its scale: D ** -0.5


# ----------------------------------------------------------------------------------------------------------------------
# The layout of a batch, planned once per forward
# ----------------------------------------------------------------------------------------------------------------------


def plan_layout(
    config,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    reads: DeferredReads,
    kwargs: dict,
    training: bool,
    dtype: torch.dtype,
) -> tuple[UnpaddedBatch | None, torch.Tensor | None, bool]:
    """
    How the encoder lays a batch out, decided once per forward: `(layout, sequence_ids, all_real)`.

    `layout` is the real tokens' `UnpaddedBatch` where the unpadded path applies (sdpa, eager execution, a (B, L)
    mask with padding or packed rows, no per-layer outputs requested), else None: the padded path, which eager
    attention always takes (the reference) and `torch.compile` / `torch.export` trace. The value checks of `reads`
    and the layout are read on the host together, once (`UnpaddedBatch.from_mask`). A static batch
    (`static_layout=True` in `kwargs`) brings its layout (`from_static_layout`, taken out of `kwargs`); in eager
    execution the layout is checked against the attention mask (`StaticLayoutMatches`) in one host read with the
    checks and scalars of `reads`, unless `validate_static_layout=False` is given; under `torch.compile`, tracing or
    CUDA graph capture it reads nothing (the collator computed it and checked the values on the CPU). `sequence_ids`
    (B, L) number packed sequences for the padded path's block-diagonal mask (None where no row is packed);
    `all_real`: every position is a real token of an unpacked row (the padded path needs no mask).

    Args:
        config: the model's `SeqBertConfig` (attention implementation, per-layer outputs, dropout, head size).
        input_ids, inputs_embeds, attention_mask, position_ids: the encoder's inputs.
        reads (`DeferredReads`): the checks and scalars read with the layout; `values` set here (None: nothing read).
        kwargs (`dict`): the forward's keyword arguments (per-layer output requests, packed rows' `cu_seq_lens_q`, a
            static batch's layout).
        training (`bool`): the model's mode (attention dropout).
        dtype (`torch.dtype`): the model's weights' dtype (autocast's where it is on): the kernel's entry condition.

    Raises:
        TypeError, ValueError: a check of `reads` fails, or a static batch's layout is incomplete
            (`check_static_layout`) or, validated, not the attention mask's (`StaticLayoutMatches`: the field and
            its values named).
    """
    static = None
    validate = kwargs.pop("validate_static_layout", True)
    if kwargs.pop("static_layout", None):
        indices, cu_seqlens, max_seqlen = check_static_layout(kwargs)
        reference = input_ids if input_ids is not None else inputs_embeds
        static = UnpaddedBatch.from_static_layout(indices, cu_seqlens, max_seqlen, tuple(reference.shape[:2]))
        reads.values = None  # nothing is read (its collator checked the values), unless validated below
        if validate and eager_execution():
            mask = attention_mask
            if mask is None:
                mask = torch.ones(static.input_shape, dtype=torch.bool, device=indices.device)
            layout_check = StaticLayoutMatches(mask, indices, cu_seqlens, max_seqlen)
            reads.values = read_on_host([*reads.checks, layout_check], reads.scalars)
    eligible = config._attn_implementation == "sdpa" and (static is not None or eager_execution())
    eligible = eligible and (attention_mask is None or attention_mask.dim() == 2)
    eligible = eligible and not any(
        kwargs.get(name, getattr(config, name, False)) for name in ("output_hidden_states", "output_attentions")
    )
    layout = functools.partial(attention_layout, config=config, training=training, dtype=dtype)
    if static is not None:
        return (layout(static), None, False) if eligible else (None, None, False)  # else: the padded path
    if not eligible:
        reads.values = read_on_host(reads.checks, reads.scalars) if eager_execution() else None
        return None, packed_sequence_ids(config, input_ids, inputs_embeds, position_ids, kwargs), False
    sequence_ids = packed_sequence_ids(config, input_ids, inputs_embeds, position_ids, kwargs, reads.checks)
    if attention_mask is None and sequence_ids is None:
        reads.values = read_on_host(reads.checks, reads.scalars)
        return None, None, False  # nothing to drop, no sequence boundary
    unpadded = UnpaddedBatch.from_mask(attention_mask, sequence_ids, attention_layout=False, reads=reads)
    batch_size, seq_len = unpadded.input_shape
    if unpadded.num_tokens == 0:
        return None, None, False  # nothing to keep
    if unpadded.num_tokens == batch_size * seq_len and not unpadded.packed:
        return None, None, True  # nothing to drop
    return layout(unpadded), sequence_ids, False


def attention_layout(unpadded: UnpaddedBatch, config, training: bool, dtype: torch.dtype) -> UnpaddedBatch:
    """`unpadded` laid out for attention: `cu_seqlens` alone for the variable-length kernel where it applies
    (`varlen_attention_applies`: CUDA, flash-attention, fp16 / bf16, autocast's dtype where it is on), else one
    sequence per row."""
    device = unpadded.cu_seqlens.device
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    dropout = config.attention_probs_dropout_prob if training else 0.0
    if varlen_attention_applies(device, dtype, config.hidden_size // config.num_attention_heads, dropout):
        return replace(unpadded, varlen=True)
    return unpadded.with_attention_layout()


# ----------------------------------------------------------------------------------------------------------------------
# What the heads share of the layout
# ----------------------------------------------------------------------------------------------------------------------


def labelled_rows(
    hidden_states: torch.Tensor, labels: torch.Tensor, reads: DeferredReads, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The hidden states (B, L, H) and labels (B, L) of the labelled positions, `(rows (M, H), labels (M,))` in
    row-major order, by a gather of fixed size: M read with the encoder's one read (`DeferredReads.count_labelled`), or a
    static batch's `max_predictions` (an int >= M given with the batch, taken out of `kwargs`). A static batch gives M
    rows, as any other batch, where its layout was validated (eager execution: M is read with the layout, and checked
    against `max_predictions`); where nothing was read (compiled, CUDA graphs, `validate_static_layout=False`) it gives
    `max_predictions` rows, the first M those of the labelled positions, the rest position 0's state with ignored
    labels (`static_shapes.copied_logits` keeps the first M for `Trainer`'s metrics); traced, by boolean indexing.

    Raises:
        ValueError: a static batch without an int `max_predictions`, or, validated, with fewer than M.
    """
    hidden_states, labels = hidden_states.flatten(0, 1), labels.reshape(-1)  # (B * L, H), (B * L,)
    labelled = labels != IGNORE_INDEX
    bound = kwargs.pop("max_predictions", None)
    if kwargs.get("static_layout") is True:
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise ValueError(
                "a static batch (static_layout=True) for a sparse_prediction model needs max_predictions, an int "
                f"bound on the labelled positions (StaticShapeCollator adds it); got {bound!r}"
            )
        count = reads.value(LABELLED)
        if count is not None and count > bound:
            raise ValueError(
                f"max_predictions ({bound}) is below the static batch's {count} labelled positions (labels != "
                f"{IGNORE_INDEX}): their loss terms would be dropped; max_predictions must be at least {count}"
            )
        if count is not None:  # validated: exactly the labelled rows, as any other batch
            bound = count
        positions = torch.nonzero_static(labelled, size=bound, fill_value=0).squeeze(1)  # (max_predictions,)
        beyond = torch.arange(bound, device=positions.device) >= labelled.sum()
        return hidden_states.index_select(0, positions), labels.index_select(0, positions).masked_fill(
            beyond, IGNORE_INDEX
        )
    count = reads.value(LABELLED)
    if count is not None:
        positions = torch.nonzero_static(labelled, size=count).squeeze(1)  # (M,)
        return hidden_states.index_select(0, positions), labels.index_select(0, positions)
    return hidden_states[labelled], labels[labelled]


def span_logits(
    logits: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Span logits (B, L, ...) as the dynamically padded batch of the same examples gives them: a static batch
    (`static_layout=True`) is padded to its bucket's width, so its columns beyond its longest sequence hold the
    dtype's minimum (they take no probability), and `span`, that length (a 0-dim tensor), tells the loss to ignore
    positions there. Any other batch: `(logits, None)`. No host read.
    """
    if kwargs.get("static_layout") is not True or attention_mask is None:
        return logits, None
    span = attention_mask.sum(-1).max()
    beyond = torch.arange(logits.shape[1], device=logits.device) >= span  # (L,)
    beyond = beyond.view(1, -1, *([1] * (logits.dim() - 2)))
    return logits.masked_fill(beyond, torch.finfo(logits.dtype).min), span


__all__ = [
    "MAX_KEYS_WRITTEN_OUT",
    "UnpaddedBatch",
    "attention_layout",
    "labelled_rows",
    "eager_attention_forward",
    "flash_attention_forward",
    "plan_layout",
    "runs_flash_attention",
    "span_logits",
    "sdpa_attention_forward",
    "varlen_attention_applies",
    "varlen_attention_fits",
    "varlen_attention_forward",
]
