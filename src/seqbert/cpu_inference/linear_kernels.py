"""Packed linear kernels for CPU inference: one or more `nn.Linear`s laid out once for a kernel (oneDNN's blocked
layout, MKL's packed sgemm, the weight transposed for `addmm`, or as stored), in fp32, bf16 or int8, with the
activation or residual add that follows them; and the dynamic uint8 quantization of the int8 kernel's inputs."""

import copy
import functools
import math

import torch
from torch import nn
from transformers.activations import ACT2FN

from .capabilities import INT8_CALL_FORMS, INT8_GEMM_FORM, int8_weight_levels


# hidden_act -> oneDNN's (post-op, algorithm) for the fused bias + activation of the feed-forward's first linear.
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # exact (erf) GELU, BERT's
    "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}

# The same post-ops applied after `torch._int_mm` (`PackedLinear`'s small int8 products), by oneDNN's (post-op,
# algorithm).
TORCH_POST_OPS = {
    ("gelu", "none"): nn.functional.gelu,
    ("gelu", "tanh"): functools.partial(nn.functional.gelu, approximate="tanh"),
    ("relu", ""): torch.relu_,
}

# int8 products of at most this many outputs (rows x out_features) run as oneDNN's s8 x s8 gemm (`torch._int_mm`) and
# torch's element-wise epilogue rather than as oneDNN's int8 linear (`PackedLinear`), whose fixed cost of about 20 us a
# call (with its bias and post-op fused) outweighs the product itself at a decode step's few rows. Our own threshold,
# measured on the 2-core Zen 5 of docs/int8.md (torch 2.13.0; medians, quantization and epilogue included), the gemm's
# time over oneDNN's at 2 / 1 threads: 8 rows of MiniLM's products 0.63 / 0.58 (384 x 384 + residual), 0.69 / 0.77
# (384 x 1,152), 0.72 / 0.83 (1,536 x 384 + residual), 1.03 / 0.95 (384 x 1,536 + GELU); 32 rows x 1,152 outputs
# 0.87 / 0.93; 128 x 384: 0.99 / 0.93; 64 x 1,152: 1.07 / 1.02; 32 x 1,536 + GELU: 1.14 / 1.08; one row of a 30,522-word
# vocabulary 0.73 / 0.82, 8 rows 1.77 / 3.21 (oneDNN's prepacked weight pays off there).
SMALL_INT8_PRODUCT = 36_864

# Linear implementations, in order of preference:
LINEAR_KERNELS = {
    "onednn": "oneDNN's linear on a weight reordered into its blocked layout, bias and activation or residual fused "
    "(`mkldnn._linear_pointwise`; int8: `onednn.qlinear_pointwise`), what inductor lowers frozen linear layers to",
    "mkl": "MKL's packed sgemm (`mkl._mkl_linear` on a `mkl._mkl_reorder_linear_weight` copy), inductor's fp32 "
    "linear where MKL is present; activation and residual added after",
    "addmm": "`torch.addmm` on the weight stored transposed, (in, out) contiguous; torch's generic operator",
    "linear": "`torch.nn.functional.linear`, as the eager model runs it; torch's generic operator",
}


class PackedLinear:
    """
    One or more `nn.Linear`s that read the same input, laid out once for one `LINEAR_KERNELS` implementation, with
    the activation or residual add that follows them.

    fp32: `kernel` decides the layout: oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, as inductor's weight
    prepacking does), MKL's packed layout, the weight transposed, or as stored. bf16 (oneDNN only): the weight rounded
    to bf16 and reordered; inputs and outputs are bf16, the products accumulate in fp32 inside oneDNN, and the bias,
    rounded to bf16, is added to the fp32 sums. int8 (oneDNN only): the weight quantized symmetrically with one scale
    per output feature to `int8_weight_levels(form)` levels each side (127, or 63 where this call form's int8 products
    saturate; the form is the activation's fused post-op or, with `residual=True`, the residual add) and prepacked
    (`onednn.qlinear_prepack`); each call quantizes its input to 8 bits with one scale and zero point for the whole
    tensor, from the tensor's own range (dynamic quantization, Jacob et al. 2018, "Quantization and Training of Neural
    Networks for Efficient Integer-Arithmetic-Only Inference", §2.1; `quantize_per_tensor_uint8`), and accumulates in
    int32. With `small_products`, a product of at most `SMALL_INT8_PRODUCT` outputs (a decode step's) runs the same
    quantized operands through oneDNN's s8 x s8 gemm instead (`torch._int_mm`, the activations less 128, the exact
    int32 sums corrected by 128 less the zero point times each weight row's sum), then scales, adds the bias and
    applies the post-op or residual in fp32 (our own arrangement, see `SMALL_INT8_PRODUCT`): the same product up to
    fp32 rounding, where that gemm's products are exact at the weights' levels (`int8_weight_levels(INT8_GEMM_FORM)`),
    else always oneDNN's linear.

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
            `int8_weight_levels(self.call_form)`).
        residual (`bool`): every call adds a residual to the output (`__call__`'s `residual`, required then).
        small_products (`bool`): int8 only, run products of at most `SMALL_INT8_PRODUCT` outputs on `torch._int_mm`
            (where its products are exact at the weights' levels); keeps the quantized weight (out x in bytes) beside
            oneDNN's packed copy. The decoder's and LM head's layers use it, the encoder's not.

    Attributes:
        call_form (`str`): the `capabilities.INT8_CALL_FORMS` entry of oneDNN's calls: "add" with a residual, else the
            fused activation's ("gelu", "gelu_tanh", "relu") or "plain".

    `copy.deepcopy` packs the copied `linears` anew with the same options (oneDNN's packed weights are opaque tensors,
    which torch cannot copy), so a deep copy of an optimized model works and reads the copy's weights. A call after
    one of `linears`' weights or biases changed (written in place, as `load_state_dict` does, or replaced) packs them
    anew first, with the same options, so that the packed product is the product of the module's weights (not seen:
    an in-place edit of a parameter made under `torch.inference_mode`, which keeps no version counter).

    Raises:
        ValueError: `activation` together with `residual=True` (the second product of a layer adds the residual, the
            first applies the activation; none does both).
    """

    def __init__(
        self,
        linears: list[nn.Linear],
        int8: bool = False,
        dtype: torch.dtype = torch.float32,
        kernel: str = "onednn",
        activation: str | None = None,
        weight_levels: int | None = None,
        residual: bool = False,
        small_products: bool = False,
    ):
        if activation and residual:
            raise ValueError(f"activation ({activation!r}) and residual=True: a PackedLinear does one or the other")
        self._sources = list(linears)  # what `__deepcopy__` and a repacking pack anew
        self._packed_from = _parameter_versions(self._sources)
        self._options = {
            "int8": int8, "dtype": dtype, "kernel": kernel, "activation": activation, "residual": residual,
            "small_products": small_products,
        }  # fmt: skip
        weights = [linear.weight.detach() for linear in linears]
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)  # (out, in)
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([bias.detach() for bias in biases]).contiguous()
        self.int8, self.dtype, self.kernel, self.residual = int8, dtype, kernel, residual
        self.small_products = False
        self.out_features, self.in_features = weight.shape
        self.post_op = ONEDNN_ACTIVATIONS.get(activation) if kernel == "onednn" and activation else None
        self.activation = ACT2FN[activation] if activation and self.post_op is None else None
        post_ops = {value: name for name, value in INT8_CALL_FORMS.items()}
        self.call_form = "add" if residual else post_ops[self.post_op or ("none", "")]
        if self.bias is not None and not int8:
            self.bias = self.bias.to(dtype)  # oneDNN takes the bias in the input's dtype (added in fp32)
        if int8:
            self.weight_levels = weight_levels or int8_weight_levels(self.call_form)
            self._options["weight_levels"] = self.weight_levels
            self.weight_scale, quantized = quantize_per_row_int8(weight, self.weight_levels)
            self.weight = torch.ops.onednn.qlinear_prepack(quantized, None)
            self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
            self.small_products = small_products and int8_weight_levels(INT8_GEMM_FORM) >= self.weight_levels
            if self.small_products:  # the gemm's operand (in, out), a view of the (out, in) rows, and their sums
                self.gemm_weight = quantized.t()
                self.gemm_weight_sums = quantized.sum(1, dtype=torch.int32)
        elif kernel == "onednn":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(), None)
        elif kernel == "mkl":
            self.weight = weight.contiguous()
            self.mkl_weight = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, 64)
        elif kernel == "addmm":
            self.weight = weight.t().contiguous()  # (in, out)
        else:
            self.weight = weight.contiguous()

    def __deepcopy__(self, memo: dict) -> "PackedLinear":
        return PackedLinear(copy.deepcopy(self._sources, memo), **self._options)

    def _repack(self) -> None:
        """Pack the linear layers' current weights, with the same options (`__call__`, where one changed)."""
        self.__dict__.update(PackedLinear(self._sources, **self._options).__dict__)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), fp32 (int8 too) or bf16 as packed: `x @ W.T + b`, then the
        activation, or `+ residual` (same shape and dtype as the output) where built with `residual=True`.

        Raises:
            ValueError: `residual` given to a PackedLinear built without `residual=True`, or missing from one built
                with it (int8 chose its weights' bits for the call form it was built for).
        """
        # Pack again where a weight or bias changed since packing: written in place (`load_state_dict`, `copy_`: its
        # version counter moved) or replaced by another parameter. About 0.1 us a parameter when none did (written
        # out here, not a method: a decode step makes 40 of these calls; measured on the Zen 5 of docs/int8.md).
        for parameters, name, parameter, version in self._packed_from:
            if parameters.get(name) is not parameter or (version is not None and parameter._version != version):
                self._repack()
                break
        if (residual is not None) != self.residual:
            raise ValueError(
                f"residual is {'given' if residual is not None else 'missing'}, but this PackedLinear was built with "
                f"residual={self.residual}: pass a residual exactly when built with residual=True"
            )
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
        if self.small_products and rows.shape[0] * self.out_features <= SMALL_INT8_PRODUCT:
            return self._small_product(*_quantize(rows, shifted=True), other)
        quantized, scale, zero_point = _quantize(rows, shifted=False)
        args = (quantized, scale, zero_point, self.weight, self.weight_scale, self.weight_zero_point)
        if other is not None:
            return torch.ops.onednn.qlinear_pointwise.binary(
                *args, other, self.bias, 1.0, 0, torch.float32, 1.0, 0, "add", 1.0, "none", [], ""
            )
        return torch.ops.onednn.qlinear_pointwise(*args, self.bias, 1.0, 0, torch.float32, post_op, [], algorithm)

    def _small_product(self, shifted: torch.Tensor, scale: float, zero_point: int, other: torch.Tensor | None):
        """The int8 product of (rows, in) activations quantized to uint8 and handed over less 128 (`shifted`, int8)
        through `torch._int_mm`: Σ (q - 128) w + (128 - zero_point) Σ w = Σ (q - zero_point) w exactly in int32, then
        scale x weight_scale, the bias and the post-op or `other` (the residual) in fp32 -> (rows, out) fp32."""
        sums = torch._int_mm(shifted, self.gemm_weight).add_(self.gemm_weight_sums, alpha=128 - zero_point)
        if other is not None:
            out = torch.addcmul(other, sums, self.weight_scale, value=scale)
            return out if self.bias is None else out.add_(self.bias)
        if self.bias is None:
            out = torch.mul(sums, self.weight_scale).mul_(scale)
        else:
            out = torch.addcmul(self.bias, sums, self.weight_scale, value=scale)
        return out if self.post_op is None else TORCH_POST_OPS[self.post_op](out)


def _parameter_versions(linears: list[nn.Linear]) -> tuple:
    """What `PackedLinear` packed: (the module's parameter dict, name, the parameter, its version counter) for each
    weight and bias; the version None for a parameter made under `torch.inference_mode`, which keeps no counter (an
    in-place edit of it goes unseen; replacing it does not)."""
    return tuple(
        (linear._parameters, name, parameter, None if parameter.is_inference() else parameter._version)
        for linear in linears
        for name, parameter in linear._parameters.items()
        if parameter is not None
    )


def quantize_per_row_int8(weight: torch.Tensor, levels: int, rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Symmetric int8 quantization of a weight (out, in) with one scale per row (output feature): `q = round(w / s)`,
    `s = max |w| / levels` over the row, q in [-levels, levels]. Rounded in float64, so that no weight lands on the
    other side of a half step through fp32's rounding of w / s; `rows` rows at a time, so that the float64 copies of a
    large matrix (a 30,522 x 384 vocabulary projection: 94 MB each) never exist whole.

    Returns:
        `(scale, q)`: scale float32 of shape (out,), > 0; q int8 of `weight`'s shape.
    """
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    quantized = torch.empty(weight.shape, dtype=torch.int8)
    for start in range(0, weight.shape[0], rows):
        block = weight[start : start + rows].double()
        block_scale = (block.abs().amax(dim=1) / levels).clamp(min=torch.finfo(torch.float32).tiny)
        quantized[start : start + rows] = torch.round(block / block_scale[:, None]).clamp_(-levels, levels)
        scale[start : start + rows] = block_scale
    return scale, quantized


def quantize_per_tensor_uint8(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """
    Asymmetric uint8 quantization of a whole float tensor (computed on its fp32 values) from its own range (dynamic
    quantization, Jacob et al. 2018, §2.1): `q = round(x / scale) + zero_point`, the range widened to include 0, so
    that 0 is exact.

    Our own arrangement of the passes over `x`, about 2.7x faster than the plain multiply, add, round, clamp and cast
    (measured on a (830, 1536) tensor): the range is spread over 253 steps rather than 255 and the zero point rounded
    up, so every value lands in [0, 254] with half a step to spare on each side and no clamp is needed; and the cast
    goes through int8 (`q - 128`, then the same bytes read as uint8 with the top bit flipped), because torch's
    fp32 -> uint8 cast is about 9x slower than its fp32 -> int8 one. Scale and zero point are read to the host (a CPU
    tensor's values, no device sync). The range comes from `amin` and `amax`, two passes that together take about
    0.6x the time of torch's one-pass `aminmax` on these shapes (torch 2.13.0, one thread; measured on (800, 384) and
    (800, 1536) tensors), with the same values; small inputs take `aminmax` (`_ONE_PASS_RANGE`).

    Returns:
        `(q, scale, zero_point)`: q uint8 with `x`'s shape, scale a float > 0, zero_point an int in [0, 253] (254
        where fp32's rounding of -low / scale lands just above 253; q stays in [0, 254]).

    Raises:
        ValueError: `x` holds NaN or an infinity, which 8 bits cannot hold (fp32 layers would pass them on).
    """
    return _quantize(x, shifted=False)


# Inputs of at most this many elements take their range from one `torch.aminmax` call rather than `amin` and `amax`:
# the same values, one operator call less (about 1.4 us of a decode step's 10 us quantization of 8 x 384 inputs,
# measured on the Zen 5 of docs/int8.md), where the two passes' speed on large inputs does not count yet.
_ONE_PASS_RANGE = 16_384

# The quantizer's offsets (zero point - 128) as fp32 scalar tensors, one per zero point it can give ([0, 253], and
# 254 where fp32's rounding of -low / scale lands just above 253): made once rather than by `torch.tensor` on every
# call (about 1.9 us a call, a few ops of its own).
_OFFSETS = tuple(torch.tensor(zero_point - 128.0) for zero_point in range(255))


def _quantize(x: torch.Tensor, shifted: bool) -> tuple[torch.Tensor, float, int]:
    """`quantize_per_tensor_uint8`: (q as uint8, or with `shifted` q - 128 as int8, scale, zero_point); same errors.
    Other float dtypes than fp32 are quantized from their fp32 values (bf16 has too few bits to add the offset in)."""
    if x.numel() <= _ONE_PASS_RANGE:
        low, high = (bound.item() for bound in torch.aminmax(x))
    else:
        low, high = x.amin().item(), x.amax().item()
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(
            f"an int8 layer's input holds NaN or an infinity (its range is [{low}, {high}]), which int8 cannot "
            "quantize: find where the model's hidden states stop being finite (the fp32 model shows it too)"
        )
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / 253, torch.finfo(torch.float32).tiny)
    zero_point = math.ceil(-low / scale)  # x / scale + zero_point lies in [0, 254)
    if x.dtype != torch.float32:  # `x.float()` on fp32 is one more operator call (a decode step makes 37 of these)
        x = x.float()
    q = torch.add(_OFFSETS[zero_point], x, alpha=1.0 / scale).round_().to(torch.int8)  # q - 128
    return (q, scale, zero_point) if shifted else (q.view(torch.uint8).bitwise_xor_(0x80), scale, zero_point)
