"""Faster CPU inference for SeqBERT encoders: one call that returns a copy whose encoder layers run prepacked linear
layers with fused post-ops and length-grouped attention, in fp32, int8 or bf16, with the implementations chosen by
timing them on this CPU.

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    fast = seqbert.optimize_for_cpu_inference(model)               # fp32, within 1e-5 of BERT
    fast_int8 = seqbert.optimize_for_cpu_inference(model, int8=True)
    fast_bf16 = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)  # CPUs with AVX512_BF16 or AMX
    fast.cpu_inference_plan  # what was chosen, and how long each candidate took; pass it back as `plan=` to reuse

The default eager model is untouched (it stays bit-identical to BERT); this is an opt-in for serving. Which
implementation is fastest depends on the CPU (an AVX2 AMD Zen 3 and an AVX-512 Zen 4 rank them differently), the shape
and the thread count, so `optimize_for_cpu_inference` times the candidates on the model's own shapes when it is called
(`CpuInferencePlan`), and keeps the eager layers where they are faster. There is no compile step and no recompilation
when the batch size or length changes.
"""

import copy
import dataclasses
import functools
import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.utils import logging

from .attention_backends import UnpaddedBatch, additive_mask
from .modeling_seqbert import SeqBertEncoder, SeqBertLayer, SeqBertPreNormLayer, SeqBertPreTrainedModel


logger = logging.get_logger(__name__)

# hidden_act -> oneDNN's (post-op, algorithm) for the fused bias + activation of the feed-forward's first linear.
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # exact (erf) GELU, BERT's
    "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}

# The linear layers of an encoder layer that `optimize_for_cpu_inference` packs, by role: query/key/value as one
# product, the attention's output projection (+ residual), the feed-forward's first (+ activation) and second
# (+ residual) products.
ROLES = ("qkv", "out_proj", "up_proj", "down_proj")

# Linear implementations, in order of preference (a later one is chosen only where it is measurably faster):
LINEAR_KERNELS = {
    "onednn": "oneDNN's linear on a weight reordered into its blocked layout, bias and activation or residual fused "
    "(`mkldnn._linear_pointwise`; int8: `onednn.qlinear_pointwise`), what inductor lowers frozen linear layers to",
    "mkl": "MKL's packed sgemm (`mkl._mkl_linear` on a `mkl._mkl_reorder_linear_weight` copy), inductor's fp32 "
    "linear where MKL is present; activation and residual added after",
    "addmm": "`torch.addmm` on the weight stored transposed, (in, out) contiguous; torch's generic operator",
    "linear": "`torch.nn.functional.linear`, as the eager model runs it; torch's generic operator",
}
ATTENTION_MODES = {
    "written_out": "fp32 length groups of at most `LengthGroups.max_keys_written_out` keys as softmax(Q K^T + mask) "
    "V in two batched matrix products; longer groups and other dtypes on sdpa",
    "sdpa": "every group on torch's `scaled_dot_product_attention` (its CPU flash kernel)",
}
LENGTH_GROUPS = (1, 2, 4, 8)
# How much faster (as a fraction of the time) a later candidate must be to displace an earlier one: 3 %, about the
# spread of repeated timings on the 2-core machines of the docs.
MARGIN = 0.03


class UnsupportedCpuError(RuntimeError):
    """This CPU or torch build cannot run the precision asked of `optimize_for_cpu_inference` (the message names what
    is missing and the route that works here)."""


def x86_cpu() -> bool:
    """Whether torch runs on an x86 CPU with AVX2 or better (`torch.backends.cpu.get_cpu_capability()` reports "AVX2"
    or "AVX512" there; "DEFAULT", "NO AVX", "SVE256", "ZVECTOR", ... elsewhere)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX")


def onednn_available() -> bool:
    """Whether this torch has the oneDNN linear operators (fp32, bf16 and int8) and runs on an x86 CPU with AVX2 or
    better, where they were measured."""
    try:
        ops = (
            torch.ops.mkldnn._reorder_linear_weight,
            torch.ops.mkldnn._linear_pointwise,
            torch.ops.onednn.qlinear_prepack,
            torch.ops.onednn.qlinear_pointwise,
        )
    except (AttributeError, RuntimeError):
        return False
    return all(ops) and torch.backends.mkldnn.is_available() and x86_cpu()


def mkl_linear_available() -> bool:
    """Whether this torch has MKL's packed linear (`torch.ops.mkl._mkl_linear`, x86 builds with MKL) on an x86 CPU."""
    try:
        ops = (torch.ops.mkl._mkl_reorder_linear_weight, torch.ops.mkl._mkl_linear)
    except (AttributeError, RuntimeError):
        return False
    return all(ops) and torch.backends.mkl.is_available() and x86_cpu()


def bf16_instructions_available() -> bool:
    """Whether the CPU computes bf16 products in hardware: AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and
    Sapphire Rapids and later) or AMX (Sapphire Rapids and later). Without them oneDNN emulates bf16 on AVX-512, which
    is slower than fp32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def bf16_linear_available() -> bool:
    """Whether torch's oneDNN linear runs bf16 on this CPU at all: it needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
    (`mkldnn._reorder_linear_weight` refuses bf16 otherwise, as on AVX2-only CPUs such as AMD Zen 3)."""
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def linear_kernels_available(int8: bool = False, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The `LINEAR_KERNELS` this CPU and torch build can run for a precision, in order of preference: int8 and bf16
    only oneDNN's; fp32 also MKL's packed sgemm where present and torch's generic `addmm` and `linear`, which run on
    every CPU."""
    if int8 or dtype != torch.float32:
        return ("onednn",) if onednn_available() else ()
    return tuple(
        name for name, available in (("onednn", onednn_available()), ("mkl", mkl_linear_available())) if available
    ) + ("addmm", "linear")


@functools.cache
def int8_products_saturate() -> bool:
    """
    Whether oneDNN's u8 x s8 products on this CPU add pairs of products in saturating int16 before the int32 sum.

    Without VNNI (AVX2 CPUs such as AMD Zen 3 and Intel before Ice Lake server / Alder Lake; AVX-512 CPUs before
    Cascade Lake; any CPU under `ONEDNN_MAX_CPU_ISA=AVX2`), oneDNN multiplies u8 by s8 with `vpmaddubsw`, which sums
    adjacent pairs of products in int16 and saturates at 32,767: 255 x 127 x 2 = 64,770 does not fit, so large
    activations times large weights come out wrong, silently (oneDNN's developer guide, "Nuances of int8
    computations"). VNNI's `vpdpbusd` sums in int32 and does not saturate.

    Measured, not assumed from CPU flags (which cannot see oneDNN's ISA cap): products whose pairs overflow int16
    (every activation 254, every weight 127) through `onednn.qlinear_pointwise` at three shapes, against the exact
    sum. Once per process (about 5 ms).
    """
    if not onednn_available():
        return False
    for rows, depth, features in ((1, 64, 16), (16, 256, 64), (128, 512, 96)):  # depth x 254 x 127 < 2^24: exact
        activations = torch.full((rows, depth), 254, dtype=torch.uint8)
        weight = torch.ops.onednn.qlinear_prepack(torch.full((features, depth), 127, dtype=torch.int8), None)
        out = torch.ops.onednn.qlinear_pointwise(
            activations, 1.0, 0, weight, torch.ones(features), torch.zeros(features, dtype=torch.int64),
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        if not torch.equal(out, torch.full_like(out, 254 * 127 * depth)):
            return True
    return False


def int8_weight_levels() -> int:
    """
    The largest quantized weight magnitude on this CPU: 127 (8-bit weights) where int8 products are exact, 63 (7-bit
    weights) where they saturate (`int8_products_saturate`).

    With weights in [-63, 63] a pair of products is at most 254 x 63 x 2 = 32,004, inside int16, so the products are
    exact again on every x86 CPU. 7-bit weights, rather than 7-bit activations as PyTorch's x86 quantization does with
    `reduce_range`, because they cost less accuracy (`scripts/checks/compare_int8_methods.py`, MiniLM-L6 on 64 real
    Rotten Tomatoes snippets, int8 hidden states against fp32: mean |delta| 0.0372 with exact 8-bit products, 0.0398
    with 7-bit weights, 0.0721 with 7-bit activations; min per-token cosine 0.965, 0.945 and 0.884): one scale per
    output feature absorbs a lost weight bit better than one scale per tensor absorbs a lost activation bit. OpenVINO's
    post-training quantization offers the same remedy for the same saturation (7-bit weights, 8-bit activations).
    Capping each same-sign pair of weights instead (|w_2i| + |w_2i+1| <= 128, 8-bit elsewhere) measured worse (mean
    0.0443, min cosine 0.920): it cuts the largest weights hardest.
    """
    return 63 if int8_products_saturate() else 127


class PackedLinear:
    """
    One or more `nn.Linear`s that read the same input, laid out once for one `LINEAR_KERNELS` implementation, with
    the activation or residual that follows them.

    fp32: `kernel` decides the layout: oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, as inductor's weight
    prepacking does), MKL's packed layout, the weight transposed, or as stored. bf16 (oneDNN only): the weight rounded
    to bf16 and reordered; inputs and outputs are bf16, the products accumulate in fp32 inside oneDNN, and the bias,
    rounded to bf16, is added to the fp32 sums. int8 (oneDNN only): the weight quantized symmetrically with one scale
    per output feature to `int8_weight_levels()` levels each side (127, or 63 where int8 products saturate) and
    prepacked (`onednn.qlinear_prepack`); each call quantizes its input to 8 bits with one scale and zero point for
    the whole tensor, from the tensor's own range (dynamic quantization, Jacob et al. 2018, "Quantization and Training
    of Neural Networks for Efficient Integer-Arithmetic-Only Inference", §2.1; `quantize_per_tensor_uint8`), and
    accumulates in int32.

    Several linear layers that read the same input are packed as one (their weights stacked along the outputs), as
    the query, key and value projections are.

    Args:
        linears (`list[nn.Linear]`): same `in_features`, all with or all without bias.
        int8 (`bool`): compute in int8 (oneDNN).
        dtype (`torch.dtype`): float32 or bfloat16 (not with int8).
        kernel (`str`): one of `LINEAR_KERNELS` (int8 and bf16: "onednn").
        activation (`str`, *optional*): a transformers `hidden_act` applied to the output (fused into oneDNN's call
            where `ONEDNN_ACTIVATIONS` has it).
        weight_levels (`int`, *optional*): int8 only, the largest quantized weight magnitude (default
            `int8_weight_levels()`).
    """

    def __init__(
        self,
        linears: list[nn.Linear],
        int8: bool = False,
        dtype: torch.dtype = torch.float32,
        kernel: str = "onednn",
        activation: str | None = None,
        weight_levels: int | None = None,
    ):
        weight = torch.cat([linear.weight.detach() for linear in linears])  # (out, in)
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([bias.detach() for bias in biases]).contiguous()
        self.int8, self.dtype, self.kernel = int8, dtype, kernel
        self.out_features, self.in_features = weight.shape
        self.post_op = ONEDNN_ACTIVATIONS.get(activation) if kernel == "onednn" and activation else None
        self.activation = ACT2FN[activation] if activation and self.post_op is None else None
        if self.bias is not None and not int8:
            self.bias = self.bias.to(dtype)  # oneDNN takes the bias in the input's dtype (added in fp32)
        if int8:
            self.weight_levels = weight_levels or int8_weight_levels()
            # Rounded in float64, so that no weight lands on the other side of a half step through fp32's rounding
            # of weight / scale; the scale is handed to oneDNN in fp32.
            scale = (weight.double().abs().amax(dim=1) / self.weight_levels).clamp(min=torch.finfo(torch.float32).tiny)
            quantized = torch.round(weight.double() / scale[:, None]).clamp(-self.weight_levels, self.weight_levels)
            self.weight_scale = scale.float()
            self.weight = torch.ops.onednn.qlinear_prepack(quantized.to(torch.int8), None)
            self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
        elif kernel == "onednn":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(), None)
        elif kernel == "mkl":
            self.weight = weight.contiguous()
            self.mkl_weight = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, 64)
        elif kernel == "addmm":
            self.weight = weight.t().contiguous()  # (in, out)
        else:
            self.weight = weight.contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), fp32 (int8 too) or bf16 as packed: `x @ W.T + b`, then the
        activation or `+ residual` (same shape and dtype as the output; not with an activation)."""
        rows = x.reshape(-1, self.in_features)
        other = None if residual is None else residual.reshape(-1, self.out_features)
        if self.kernel == "onednn":
            out = self._onednn(rows, other)
        else:
            if self.kernel == "mkl":
                out = torch.ops.mkl._mkl_linear(rows, self.mkl_weight, self.weight, self.bias, rows.shape[0])
            elif self.kernel == "addmm":
                out = rows @ self.weight if self.bias is None else torch.addmm(self.bias, rows, self.weight)
            else:
                out = nn.functional.linear(rows, self.weight, self.bias)
            if other is not None:
                out.add_(other)
        if self.activation is not None:
            out = self.activation(out)
        return out.view(*x.shape[:-1], self.out_features)

    def _onednn(self, rows: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
        post_op, algorithm = self.post_op or ("none", "")
        if not self.int8:
            if other is not None:
                return torch.ops.mkldnn._linear_pointwise.binary(rows, other, self.weight, self.bias, "add")
            return torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, post_op, [], algorithm)
        quantized, scale, zero_point = quantize_per_tensor_uint8(rows)
        args = (quantized, scale, zero_point, self.weight, self.weight_scale, self.weight_zero_point)
        if other is not None:
            return torch.ops.onednn.qlinear_pointwise.binary(
                *args, other, self.bias, 1.0, 0, torch.float32, 1.0, 0, "add", 1.0, "none", [], ""
            )
        return torch.ops.onednn.qlinear_pointwise(*args, self.bias, 1.0, 0, torch.float32, post_op, [], algorithm)


def quantize_per_tensor_uint8(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """
    Asymmetric uint8 quantization of a whole fp32 tensor from its own range (dynamic quantization, Jacob et al. 2018,
    §2.1): `q = round(x / scale) + zero_point`, the range widened to include 0, so that 0 is exact.

    Our own arrangement of the passes over `x`, about 2.7x faster than the plain multiply, add, round, clamp and cast
    (measured on a (830, 1536) tensor): the range is spread over 253 steps rather than 255 and the zero point rounded
    up, so every value lands in [0, 254] with half a step to spare on each side and no clamp is needed; and the cast
    goes through int8 (`q - 128`, then the same bytes read as uint8 with the top bit flipped), because torch's
    fp32 -> uint8 cast is about 9x slower than its fp32 -> int8 one. Scale and zero point are read to the host (a CPU
    tensor's values, no device sync). The range comes from `amin` and `amax`, two passes that together take about
    0.6x the time of torch's one-pass `aminmax` on these shapes (torch 2.13.0, one thread; measured on (800, 384) and
    (800, 1536) tensors), with the same values.

    Returns:
        `(q, scale, zero_point)`: q uint8 with `x`'s shape, scale a float > 0, zero_point an int in [0, 253].
    """
    low, high = x.amin().item(), x.amax().item()
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / 253, torch.finfo(torch.float32).tiny)
    zero_point = math.ceil(-low / scale)  # x / scale + zero_point lies in [0, 254)
    offset = torch.tensor(zero_point - 128.0, dtype=x.dtype)
    shifted = torch.add(offset, x, alpha=1.0 / scale).round_().to(torch.int8)  # q - 128
    return shifted.view(torch.uint8).bitwise_xor_(0x80), scale, zero_point  # q


class LengthGroups:
    """
    The sequences of an unpadded batch sorted by length and cut into at most `max_groups` groups, each laid out
    (S_g, L_g) with L_g its longest sequence, so that attention computes less on padding than in one (S, L_max) grid:
    with real-length snippets (48 % padding) and 4 groups the padded attention area falls by about half. Our own trick
    (the idea of bucketing by length, applied inside one batch); results per sequence are those of
    `torch.nn.functional.scaled_dot_product_attention` on a shorter padding, equal up to the order of its sums.

    The grouped layout is gathered from the real tokens, a padding row repeating its sequence's first token, as in
    `UnpaddedBatch.to_attention_layout`.

    Args:
        unpadded (`UnpaddedBatch`): the batch, with its attention layout.
        max_groups (`int`): at most this many groups (one per sequence at most).
        max_keys_written_out (`int`): fp32 groups of at most this many keys compute attention written out (see
            `attend`); 0: every group on sdpa.

    Attributes:
        rows (`torch.LongTensor` of shape `(T,)`): each real token's row in the grouped layout (all groups' grids
            flattened one after the other).
        sources (`torch.LongTensor` of shape `(total_rows,)`): the real token each row of the grouped layout holds
            (after a sequence's end, that sequence's first token).
        groups (`list[tuple[int, int, int, torch.Tensor, torch.Tensor]]`): per group its first row, S_g, L_g, its key
            mask (S_g, 1, 1, L_g), True at real tokens, and the same as an additive fp32 mask.
    """

    # The longest group (keys) whose fp32 attention the "written_out" mode writes out: beyond about 72 keys the
    # written-out products slowed down by up to 3x on some lengths (2026-11-27, AMD EPYC Zen 5, torch 2.13.0).
    written_out_limit = 64

    def __init__(self, unpadded: UnpaddedBatch, max_groups: int = 4, max_keys_written_out: int = written_out_limit):
        self.max_keys_written_out = max_keys_written_out
        mask = unpadded.attention_mask  # (S, L_max)
        num_sequences, max_length = mask.shape
        lengths = mask.sum(1)  # (S,)
        order = torch.argsort(lengths, descending=True, stable=True)
        count = min(max_groups, num_sequences)
        bounds = [round(i * num_sequences / count) for i in range(count + 1)]
        place = torch.empty(num_sequences, dtype=torch.long)  # each sequence's first row in the grouped layout
        sorted_lengths = lengths[order].tolist()
        attention_sources = unpadded.attention_sources.view(num_sequences, max_length)
        self.groups, sources, first_row = [], [], 0
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            size, width = end - start, sorted_lengths[start]
            place[order[start:end]] = first_row + torch.arange(size) * width
            key_mask = (torch.arange(width) < lengths[order[start:end], None])[:, None, None, :]
            self.groups.append((first_row, size, width, key_mask, additive_mask(key_mask)))
            sources.append(attention_sources[order[start:end], :width].reshape(-1))
            first_row += size * width
        self.total_rows = first_row
        self.sources = torch.cat(sources)
        sequence, offset = unpadded.attention_indices // max_length, unpadded.attention_indices % max_length
        self.rows = place[sequence] + offset

    def attend(self, qkv: torch.Tensor, attention) -> torch.Tensor:
        """
        (1, T, 3H) fused query/key/value projections of the real tokens -> (1, T, H) heads side by side.

        In fp32, a group of at most `max_keys_written_out` keys computes softmax(Q Kᵀ · scaling + mask) V as written
        ("Attention Is All You Need" §3.2.1, what BERT's eager attention computes): two batched matrix products
        around a softmax. Other groups run sdpa's CPU flash kernel. Which is faster depends on the CPU and the thread
        count (on an AMD EPYC Zen 5 with real-length batches, 2026-11-27: the fp32 flash kernel gained only 1.0-1.4x
        from a second thread, the written-out products 1.7-1.9x, and on one thread the kernel was a few per cent
        faster), so `optimize_for_cpu_inference` times both (`CpuInferencePlan.attention`).
        """
        hidden = qkv.shape[-1] // 3
        laid_out = torch.index_select(qkv[0], 0, self.sources)  # (total_rows, 3H)
        output = qkv.new_empty(self.total_rows, hidden)
        longest_written_out = self.max_keys_written_out if qkv.dtype == torch.float32 else 0
        for first_row, size, width, key_mask, key_bias in self.groups:
            block = laid_out[first_row : first_row + size * width].view(size, width, 3 * hidden)
            query, key, value = _split_qkv(block, attention)  # (S_g, N, L_g, D) each
            if width <= longest_written_out:
                scores = torch.matmul(query, key.transpose(-1, -2))  # (S_g, N, L_g, L_g)
                heads = torch.matmul(torch.add(key_bias, scores, alpha=attention.scaling).softmax(-1), value)
            else:
                heads = nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask=key_mask, scale=attention.scaling
                )  # (S_g, N, L_g, D)
            output[first_row : first_row + size * width].view(size, width, hidden).copy_(
                heads.transpose(1, 2).reshape(size, width, hidden)
            )
        return torch.index_select(output, 0, self.rows).unsqueeze(0)


def _split_qkv(qkv: torch.Tensor, attention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, L, 3H) fused projections -> query, key, value, each (B, N, L, D) (strided views, no copy)."""
    return qkv.view(*qkv.shape[:2], 3, attention.num_heads, attention.head_dim).permute(2, 0, 3, 1, 4)


# ----------------------------------------------------------------------------------------------------------------------
# The plan: which implementation runs, chosen by timing on this CPU
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CpuInferencePlan:
    """
    What an optimized encoder runs: per linear role (`ROLES`) one of `LINEAR_KERNELS`, the attention mode
    (`ATTENTION_MODES`) and the number of length groups (`LENGTH_GROUPS`), or the eager layers unchanged.

    `optimize_for_cpu_inference` measures one (`measure_plan`) unless given one; `to_dict` / `from_dict` round-trip
    it through JSON, so a choice measured once can be pinned (`plan=`), on this machine or on a fleet of the same CPU.

    Attributes:
        linear_kernels (`dict[str, str]`): role -> kernel.
        attention (`str`): "written_out" or "sdpa".
        length_groups (`int`): at most this many length groups per batch.
        eager_layers (`bool`): the eager layers measured faster than every optimized one; the copy runs them.
        measurements (`dict`): how the plan was chosen (median milliseconds per candidate, threads, CPU capability,
            seconds spent, the timing batch); empty for a given plan. Not compared.
    """

    linear_kernels: dict[str, str]
    attention: str = "written_out"
    length_groups: int = 4
    eager_layers: bool = False
    measurements: dict = dataclasses.field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        """The plan as plain JSON-ready values (measurements included)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping) -> "CpuInferencePlan":
        """The plan `to_dict` wrote (extra keys refused, measurements optional)."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown or not isinstance(values.get("linear_kernels"), Mapping):
            raise ValueError(
                f"plan must be a CpuInferencePlan or a dict with linear_kernels (a dict of {list(ROLES)}) and "
                f"optionally {sorted(names - {'linear_kernels'})}; got keys {sorted(values)}"
            )
        return cls(**{**values, "linear_kernels": dict(values["linear_kernels"])})

    def summary(self) -> str:
        """One line: the kernels by role, the attention, the groups (what the log and the benchmarks print)."""
        if self.eager_layers:
            return "eager layers (measured faster than the optimized ones)"
        kernels = ", ".join(f"{role} {self.linear_kernels[role]}" for role in ROLES)
        return f"{kernels}; attention {self.attention}, {self.length_groups} length group(s)"


def default_timing_lengths(num_sequences: int = 32) -> list[int]:
    """Sequence lengths of the batch a plan is timed on when no `example_inputs` are given: `num_sequences` lengths
    from 8 to 64 tokens, median about 28, like the Rotten Tomatoes snippets' (median 26, 95th percentile 47) that the
    docs' serving figures use; 32 sequences, about 970 tokens, as a batch of 32 snippets."""
    return [round(8 + 56 * (i / max(num_sequences - 1, 1)) ** 1.5) for i in range(num_sequences)]


def _layer_linears(layer: SeqBertLayer) -> dict[str, tuple[list[nn.Linear], str | None, bool]]:
    """role -> (its linear layers, activation, whether a residual is added)."""
    attention, mlp = layer.attention, layer.mlp
    return {
        "qkv": ([attention.query, attention.key, attention.value], None, False),
        "out_proj": ([attention.out_proj], None, True),
        "up_proj": ([mlp.up_proj], attention.config.hidden_act, False),
        "down_proj": ([mlp.down_proj], None, True),
    }


def _pack_layer(layer: SeqBertLayer, plan: CpuInferencePlan, int8: bool, dtype: torch.dtype) -> dict[str, PackedLinear]:
    return {
        role: PackedLinear(linears, int8, dtype, plan.linear_kernels[role], activation)
        for role, (linears, activation, _) in _layer_linears(layer).items()
    }


def _median_times(candidates: dict[str, Callable[[], object]], rounds: int, budget: float) -> dict[str, float]:
    """Median milliseconds of each candidate over interleaved rounds (each round calls every candidate once, in a
    rotated order), after one untimed warm-up call each: `rounds` rounds, fewer (3 at least) where they would take
    more than `budget` seconds."""
    names = list(candidates)
    start = time.perf_counter()
    for name in names:
        candidates[name]()
    per_round = time.perf_counter() - start
    rounds = max(3, min(rounds, int(budget / max(per_round, 1e-9))))
    samples = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            start = time.perf_counter()
            candidates[name]()
            samples[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in samples.items()}


def _preferred(times: dict[str, float]) -> str:
    """The first candidate (in `times`' order of preference) unless a later one is faster by more than `MARGIN`."""
    best = next(iter(times))
    for name, milliseconds in times.items():
        if milliseconds < times[best] * (1 - MARGIN):
            best = name
    return best


@torch.inference_mode()
def measure_plan(
    layer: SeqBertLayer,
    int8: bool = False,
    dtype: torch.dtype = torch.float32,
    lengths: list[int] | None = None,
    rounds: int = 5,
    budget: float = 3.0,
) -> CpuInferencePlan:
    """
    Time the implementations an optimized encoder layer can run, on `layer`'s own shapes, on this CPU at the current
    thread count (`torch.get_num_threads()`), and return the fastest as a `CpuInferencePlan`. Our own procedure:

    1. each linear role (`ROLES`) with each kernel of `linear_kernels_available(int8, dtype)`, with its activation or
       residual, on min(T, 512) random rows (T the real tokens of `lengths`);
    2. attention on the chosen query/key/value product: each `ATTENTION_MODES` with 1, 2, 4 and 8 length groups;
    3. the layer so optimized against the eager layer (sdpa on the unpadded batch, as the eager model runs it); where
       the eager layer is faster the plan keeps it (`eager_layers`), so the copy is never slower than the eager model
       on such batches, up to the timing's noise.

    Each step takes the median of `rounds` interleaved rounds (fewer, 3 at least, where they would overrun `budget`:
    60 % of it for the linears, 15 % for attention, 25 % for the layers) and keeps the earlier candidate in the order
    of preference unless a later one is faster by more than `MARGIN` (3 %). All layers of an encoder share their
    shapes, so one layer is timed for all, whatever the depth; the seconds spent are in `measurements["seconds"]`
    (docs/int8.md lists them for MiniLM-L6 and bert-base width).

    Args:
        layer (`SeqBertLayer`): a bidirectional encoder layer, fp32, on the CPU (not modified).
        int8, dtype: the precision, as `optimize_for_cpu_inference` takes it.
        lengths (`list[int]`, *optional*): the sequence lengths of the timing batch (default
            `default_timing_lengths()`).
        rounds (`int`): timed rounds per step, at most.
        budget (`float`): seconds the timed rounds should take, about (the warm-up calls come on top).

    Returns:
        `CpuInferencePlan` with `measurements`: every candidate's median milliseconds, the threads, the CPU
        capability, the batch's tokens and sequences, and the seconds spent.
    """
    started = time.perf_counter()
    lengths = lengths or default_timing_lengths()
    mask = torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]  # (S, L_max)
    unpadded = UnpaddedBatch.from_mask(mask)
    config = layer.attention.config
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, unpadded.num_tokens, config.hidden_size, generator=generator)
    compute_dtype = torch.float32 if int8 else dtype
    kernels = linear_kernels_available(int8, dtype)
    measurements: dict = {"linear_ms": {}, "attention_ms": {}}
    chosen = {}
    rows = min(unpadded.num_tokens, 512)
    linears_by_role = _layer_linears(layer)
    for role, (linears, activation, residual) in linears_by_role.items():
        x = torch.randn(rows, linears[0].in_features, generator=generator).to(compute_dtype)
        other = hidden[0, :rows].to(compute_dtype) if residual else None
        packed = {kernel: PackedLinear(linears, int8, dtype, kernel, activation) for kernel in kernels}
        times = _median_times({k: functools.partial(p, x, other) for k, p in packed.items()}, rounds, 0.15 * budget)
        measurements["linear_ms"][role] = times
        chosen[role] = _preferred(times)
    qkv = PackedLinear(linears_by_role["qkv"][0], int8, dtype, chosen["qkv"])(hidden.to(compute_dtype))
    options = {}
    for mode in ATTENTION_MODES if compute_dtype == torch.float32 else ("sdpa",):
        for groups in LENGTH_GROUPS:
            if groups <= len(lengths):
                options[f"{mode}/{groups}"] = functools.partial(_grouped_attention, unpadded, groups, mode, qkv, layer)
    times = _median_times(options, rounds, 0.15 * budget)
    measurements["attention_ms"] = times
    attention, groups = _preferred(times).split("/")
    plan = CpuInferencePlan(chosen, attention, int(groups))
    optimized = _optimized_layer(copy.deepcopy(layer), plan, int8, dtype)
    sdpa_mask = unpadded.sdpa_mask()
    length_groups = _length_groups(unpadded, plan.length_groups, plan.attention)  # once per forward, as the layout
    optimized_input = hidden.to(compute_dtype)
    layer_times = _median_times(
        {
            "optimized": lambda: optimized(optimized_input, None, length_groups=length_groups),
            "eager": lambda: layer(hidden, sdpa_mask, unpadded=unpadded),
        },
        rounds,
        0.25 * budget,
    )
    measurements["layer_ms"] = layer_times
    eager_layers = _preferred(layer_times) == "eager"
    measurements.update(
        threads=torch.get_num_threads(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        tokens=unpadded.num_tokens,
        sequences=len(lengths),
        seconds=round(time.perf_counter() - started, 3),
    )
    return dataclasses.replace(plan, eager_layers=eager_layers, measurements=measurements)


def _length_groups(unpadded: UnpaddedBatch, groups: int, attention: str) -> LengthGroups:
    """`LengthGroups` for an `ATTENTION_MODES` mode: "written_out" writes out the fp32 groups of at most
    `LengthGroups.written_out_limit` keys, "sdpa" none."""
    keys = LengthGroups.written_out_limit if attention == "written_out" else 0
    return LengthGroups(unpadded, groups, keys)


def _grouped_attention(unpadded, groups: int, attention: str, qkv: torch.Tensor, layer: SeqBertLayer) -> torch.Tensor:
    return _length_groups(unpadded, groups, attention).attend(qkv, layer.attention)


class _OptimizedEncoder(SeqBertEncoder):
    """Mixed into an encoder's class by `optimize_for_cpu_inference`: on the unpadded path it sorts the batch's
    sequences into `LengthGroups` once per forward, for all its layers, as its `CpuInferencePlan` says. Optimized for
    bf16, it runs its layers and its final LayerNorm on bf16 hidden states (where `_bf16_applies`) and hands fp32
    back, so the embeddings before it and the pooler and heads after it stay fp32."""

    _dtype: torch.dtype = torch.float32
    _plan: CpuInferencePlan

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if kwargs.get("unpadded") is not None:
            kwargs["length_groups"] = _length_groups(kwargs["unpadded"], self._plan.length_groups, self._plan.attention)
        if self._dtype != torch.bfloat16 or not _bf16_applies(self, hidden_states, attention_mask):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        layer_inputs = args[0] if args else kwargs.get("layer_inputs")
        first = 0 if layer_inputs is None else len(layer_inputs)
        output = super().forward(hidden_states.to(torch.bfloat16), attention_mask, *args, **kwargs)
        if layer_inputs is not None:  # what a same_layer seq2seq decoder reads: fp32, as elsewhere
            layer_inputs[first:] = [x.float() for x in layer_inputs[first:]]
        return output.float()


def _bf16_applies(encoder: SeqBertEncoder, hidden_states: torch.Tensor, attention_mask) -> bool:
    """An optimized encoder computes in bf16 where every layer would take the packed path (`_packable`) on its fp32
    input and the attention mask is none or boolean (an additive fp32 mask would not fit bf16 scores); elsewhere its
    layers run their own fp32 forward."""
    if hidden_states.dtype != torch.float32 or (attention_mask is not None and attention_mask.dtype != torch.bool):
        return False
    return all(_packable(layer, hidden_states.device, hidden_states.requires_grad) for layer in encoder.layers)


class _OptimizedLayer(SeqBertLayer):
    """Mixed into an encoder layer's class by `optimize_for_cpu_inference`: the same computation, with the layer's
    six linear layers as three-plus-three `PackedLinear` calls (query/key/value as one; the output projection with the
    residual added; the feed-forward's first linear with its activation; its second with the residual added)."""

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
            query, key, value = _split_qkv(qkv, attention)
            heads, _ = attention.merged_heads(query, key, value, attention_mask, **kwargs)
        hidden_states = packed["out_proj"](heads, residual=hidden_states)
        if not pre_norm:
            hidden_states = self.attention_norm(hidden_states)
        normed = self.mlp_norm(hidden_states) if pre_norm else hidden_states
        hidden_states = packed["down_proj"](packed["up_proj"](normed), residual=hidden_states)
        return hidden_states if pre_norm else self.mlp_norm(hidden_states)


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


def _optimized_layer(layer: SeqBertLayer, plan: CpuInferencePlan, int8: bool, dtype: torch.dtype) -> SeqBertLayer:
    """`layer` itself, its class mixed with `_OptimizedLayer` and its linears packed as `plan` says."""
    layer._packed = _pack_layer(layer, plan, int8, dtype)
    layer.__class__ = _optimized_class(_OptimizedLayer, type(layer))
    return layer


# Plans measured in this process, by what they depend on (see `_plan_key`): optimizing the same shapes again, at the
# same thread count, reuses the measurement.
_MEASURED_PLANS: dict[tuple, CpuInferencePlan] = {}


def _plan_key(layer: SeqBertLayer, int8: bool, dtype: torch.dtype, lengths: list[int]) -> tuple:
    config = layer.attention.config
    shapes = tuple((tuple(linear.weight.shape), linear.bias is not None) for linear in _all_linears(layer))
    return (
        int8, dtype, shapes, config.num_attention_heads, config.hidden_act, type(layer), tuple(lengths),
        torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(), int8 and int8_weight_levels(),
        linear_kernels_available(int8, dtype),
    )  # fmt: skip


def _all_linears(layer: SeqBertLayer) -> list[nn.Linear]:
    return [linear for linears, _, _ in _layer_linears(layer).values() for linear in linears]


def _check_plan(plan, int8: bool, dtype: torch.dtype) -> CpuInferencePlan:
    """`plan` as a `CpuInferencePlan`, or ValueError naming the entry that this precision or CPU cannot run."""
    if isinstance(plan, Mapping):
        plan = CpuInferencePlan.from_dict(plan)
    if not isinstance(plan, CpuInferencePlan):
        raise TypeError(f"plan must be a CpuInferencePlan, a dict from its to_dict(), or None; got {plan!r}")
    available = linear_kernels_available(int8, dtype)
    if set(plan.linear_kernels) != set(ROLES):
        raise ValueError(f"plan.linear_kernels must name a kernel for each of {list(ROLES)}, got {plan.linear_kernels}")
    for role, kernel in plan.linear_kernels.items():
        if kernel not in available:
            precision = "int8" if int8 else str(dtype).removeprefix("torch.")
            raise ValueError(
                f"plan.linear_kernels[{role!r}] is {kernel!r}, which {precision} cannot run on this CPU and torch "
                f"build; available: {list(available)}"
            )
    if plan.attention not in ATTENTION_MODES:
        raise ValueError(f"plan.attention is {plan.attention!r}; allowed: {list(ATTENTION_MODES)}")
    if not isinstance(plan.length_groups, int) or plan.length_groups < 1:
        raise ValueError(f"plan.length_groups must be an int >= 1, got {plan.length_groups!r}")
    return plan


def optimize_for_cpu_inference(
    model: SeqBertPreTrainedModel,
    int8: bool = False,
    dtype: torch.dtype = torch.float32,
    plan: CpuInferencePlan | Mapping | None = None,
    example_inputs: Mapping | None = None,
) -> SeqBertPreTrainedModel:
    """
    A copy of `model` for CPU inference whose encoder layers run prepacked linear layers with fused post-ops and
    length-grouped attention (our own combination of torch's oneDNN, MKL and generic operators):

    - query, key and value projections as one matrix product, laid out for attention with one copy instead of three;
    - bias + activation fused into the feed-forward's first product, and the residual added inside the output
      projection and the feed-forward's second product (oneDNN's eltwise and binary post-ops; after the product on
      the other kernels);
    - attention per group of similar lengths (`LengthGroups`).

    Which implementation runs is measured on this CPU, at the current thread count, on the model's own shapes
    (`measure_plan`: each linear kernel per role, attention written out or on sdpa, 1 to 8 length groups, then the
    optimized layer against the eager one), in about a second, and logged at INFO level (transformers' logging,
    `seqbert.cpu_inference`). The result is the copy's `cpu_inference_plan`; pass it back as `plan=` (or its
    `to_dict()`) to skip the timing and get the same choice. If the eager layers measure faster, the copy keeps them.
    Measurements are cached per process by shape, precision and thread count.

    Attention, LayerNorms, embeddings, heads and the decoder of a seq2seq model run as in `model`; so does every layer
    while gradients flow into it, under `torch.compile`/`torch.export`, off the CPU or outside the packed dtype, and
    when transformers records per-layer outputs (`output_attentions`, `output_hidden_states`). Any batch size or
    length runs without further preparation.

    fp32 results differ from the eager model in the last bits (the kernels sum in another order): within 1e-5 of
    BERT's hidden states on real text, whichever kernels the plan holds. fp32 runs on every CPU: where oneDNN's x86
    operators are missing (non-x86 CPUs such as AWS Graviton or Apple silicon, or builds without oneDNN) the plan
    chooses among torch's generic `addmm` and `linear`.

    With `int8=True` the encoder's linear layers compute in int8 through oneDNN (x86 only; weights per output feature,
    activations per call; see `PackedLinear`), which moves hidden states as int8 does
    (`scripts/benchmarks/evaluate_int8.py` measures the accuracy a fine-tuned classifier keeps). On CPUs whose int8
    products saturate (no VNNI: AVX2 CPUs such as AMD Zen 3), weights are quantized to 7 bits so that the products
    stay exact (`int8_weight_levels`).

    With `dtype=torch.bfloat16` the encoder layers compute in bf16 (Kalamkar et al. 2019, "A Study of BFLOAT16 for
    Deep Learning Training"): weights rounded to bf16 once, hidden states bf16 between the encoder's layers, every
    matrix product accumulated in fp32 inside oneDNN, LayerNorm statistics and the attention softmax computed in fp32
    (torch's mixed-dtype LayerNorm and its CPU flash attention do so for bf16 inputs), and the embeddings, pooler and
    heads in fp32 as before, so outputs are fp32. On CPUs with AVX512_BF16 or AMX-BF16 this is the fast path. On
    other AVX-512 CPUs oneDNN emulates bf16, slower than fp32, and a warning says so (`bf16_instructions_available`);
    on CPUs without AVX-512 torch has no bf16 oneDNN linear, and this raises (`bf16_linear_available`).

    The copy is for inference: its parameters do not require grad, and the packed weights are taken now, so changing
    the copy's weights afterwards is not seen by the packed layers; optimize again instead. `save_pretrained` of the
    copy writes the ordinary fp32 weights.

    Args:
        model (`SeqBertPreTrainedModel`): any SeqBERT model with an encoder, on the CPU in float32; left unchanged.
        int8 (`bool`): compute the encoder's linear layers in int8.
        dtype (`torch.dtype`): `torch.float32` (default) or `torch.bfloat16`, what the encoder layers compute in
            (not with `int8=True`).
        plan (`CpuInferencePlan` or `dict`, *optional*): run this plan instead of measuring one.
        example_inputs (`Mapping`, *optional*): a batch like those that will be served (the tokenizer's output); its
            `attention_mask` gives the lengths the plan is timed on (default `default_timing_lengths()`).

    Returns:
        `SeqBertPreTrainedModel`: the optimized copy, in eval mode, with `cpu_inference_plan` set.

    Raises:
        TypeError: `model` is not a SeqBERT model, `int8` is not a bool, `dtype` not a `torch.dtype`, or `plan` of
            another type.
        ValueError: `dtype` is neither float32 nor bfloat16, or bfloat16 with `int8=True`; `model` is not on the CPU
            in float32, has no bidirectional encoder layers, or its linear layers are wrapped (PEFT adapters: merge
            them first with `merge_and_unload()`); `plan` names a kernel this precision or CPU cannot run, or an
            unknown attention mode; `example_inputs` has no usable `attention_mask`.
        UnsupportedCpuError: int8 or bf16 where this CPU or torch build lacks oneDNN's x86 operators (the message
            names the ONNX Runtime route of docs/deploy.md), or bf16 where oneDNN has no bf16 linear (AVX-512 or
            AVX-NE-CONVERT is needed).
    """
    if not isinstance(model, SeqBertPreTrainedModel):
        raise TypeError(f"model must be a SeqBERT model (SeqBertPreTrainedModel), got {type(model).__name__}")
    if not isinstance(int8, bool):
        raise TypeError(f"int8 must be True or False, got {int8!r}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (torch.float32 or torch.bfloat16), got {dtype!r}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype ({dtype}) must be torch.float32 or torch.bfloat16")
    if int8 and dtype != torch.float32:
        raise ValueError(f"int8=True computes in int8 with fp32 outputs: leave dtype at torch.float32, got {dtype}")
    for name, parameter in model.named_parameters():
        if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
            raise ValueError(
                f"optimize_for_cpu_inference needs a float32 model on the CPU; parameter {name!r} is "
                f"{parameter.dtype} on {parameter.device}"
            )
    layers = [
        (name, layer)
        for encoder in model.modules()
        if isinstance(encoder, SeqBertEncoder)
        for name, layer in encoder.layers.named_children()
        if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal
    ]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no bidirectional encoder layers to optimize")
    for name, layer in layers:
        for child_name, child in layer.named_modules():
            if child_name.rsplit(".", 1)[-1] in ("query", "key", "value", "out_proj", "up_proj", "down_proj") and (
                type(child) is not nn.Linear
            ):
                raise ValueError(
                    f"layer {name}'s {child_name} is a {type(child).__name__}, not a plain nn.Linear (a PEFT "
                    "adapter?); merge adapters into the weights first (`merge_and_unload()`)"
                )
    _check_cpu(int8, dtype)
    lengths = _example_lengths(example_inputs)
    if plan is None:
        key = _plan_key(layers[0][1], int8, dtype, lengths)
        if key not in _MEASURED_PLANS:
            _MEASURED_PLANS[key] = measure_plan(layers[0][1], int8, dtype, lengths)
        plan = _MEASURED_PLANS[key]
        logger.info(
            f"optimize_for_cpu_inference({'int8' if int8 else dtype}): {plan.summary()}; measured in "
            f"{plan.measurements['seconds']} s at {plan.measurements['threads']} thread(s), CPU capability "
            f"{plan.measurements['cpu_capability']}"
        )
    else:
        plan = _check_plan(plan, int8, dtype)
    optimized = copy.deepcopy(model).eval().requires_grad_(False)
    optimized.cpu_inference_plan = plan
    if plan.eager_layers:
        return optimized
    for encoder in (m for m in optimized.modules() if isinstance(m, SeqBertEncoder)):
        encoder.__class__ = _optimized_class(_OptimizedEncoder, type(encoder))
        encoder._dtype, encoder._plan = dtype, plan
        for layer in encoder.layers:
            if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal:
                _optimized_layer(layer, plan, int8, dtype)
    return optimized


def _check_cpu(int8: bool, dtype: torch.dtype) -> None:
    """UnsupportedCpuError where this CPU or torch build cannot run the precision asked for; a warning where bf16 runs
    emulated."""
    capability = torch.backends.cpu.get_cpu_capability()
    if (int8 or dtype == torch.bfloat16) and not onednn_available():
        precision = "int8=True" if int8 else "dtype=torch.bfloat16"
        raise UnsupportedCpuError(
            f"optimize_for_cpu_inference({precision}) needs torch's oneDNN operators on an x86 CPU with AVX2 or "
            f"better; this CPU and torch build have none (CPU capability {capability!r}, oneDNN available "
            f"{torch.backends.mkldnn.is_available()}). fp32 (the default) runs here on torch's generic operators. For "
            "int8 on this CPU use ONNX Runtime: seqbert.serving_artifacts.save_serving_artifacts(folder) writes "
            "onnx/model_qint8_quantized.onnx, ONNX Runtime's dynamic int8 quantization of the model (docs/deploy.md, "
            "'ONNX and OpenVINO files in the folder')"
        )
    if dtype == torch.bfloat16 and not bf16_linear_available():
        raise UnsupportedCpuError(
            "optimize_for_cpu_inference(dtype=torch.bfloat16) needs a CPU on which oneDNN runs bf16: AVX-512 (BW, "
            "VL, DQ) or AVX-NE-CONVERT, best with AVX512_BF16 or AMX; this CPU has neither (torch reports capability "
            f"{capability!r}): use dtype=torch.float32, or int8=True"
        )
    if dtype == torch.bfloat16 and not bf16_instructions_available():
        _warn_no_bf16_instructions()


def _example_lengths(example_inputs: Mapping | None) -> list[int]:
    """The real lengths of `example_inputs`' sequences (rows with no real token left out), or the default ones."""
    if example_inputs is None:
        return default_timing_lengths()
    mask = example_inputs.get("attention_mask") if isinstance(example_inputs, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(
            "example_inputs must be a batch with a (batch, length) attention_mask tensor, as the tokenizer returns "
            f"with return_tensors='pt'; got {type(example_inputs).__name__} with attention_mask "
            f"{None if mask is None else getattr(mask, 'shape', type(mask).__name__)}"
        )
    lengths = [length for length in mask.sum(1).tolist() if length > 0]
    if not lengths:
        raise ValueError("example_inputs' attention_mask has no real token (every entry 0)")
    return lengths


@functools.cache
def _warn_no_bf16_instructions() -> None:
    """Once per process: bf16 was asked for on a CPU without bf16 instructions."""
    warnings.warn(
        "optimize_for_cpu_inference(dtype=torch.bfloat16): this CPU has no bf16 instructions (AVX512_BF16 or "
        f"AMX-BF16; torch reports CPU capability {torch.backends.cpu.get_cpu_capability()!r}), so oneDNN emulates "
        "bf16 and it runs slower than dtype=torch.float32 here; results are still bf16's",
        stacklevel=4,
    )
