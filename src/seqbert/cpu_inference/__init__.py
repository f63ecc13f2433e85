"""Faster CPU inference for SeqBERT encoders: one call that returns a copy whose encoder layers run prepacked linear
layers with fused post-ops and length-grouped attention, in fp32, int8 or bf16, with the implementations chosen by
timing them on this CPU.

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    fast = seqbert.optimize_for_cpu_inference(model)               # fp32, within 1e-5 of BERT
    fast_int8 = seqbert.optimize_for_cpu_inference(model, int8=True)
    fast_bf16 = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)  # CPUs with AVX512_BF16 or AMX
    fast.cpu_inference_plan  # what was chosen, and how long each candidate took; pass it back as `plan=` to reuse

The default eager model is untouched (it stays bit-identical to BERT); this is an opt-in for serving. The precision is
the caller's; which kernels run is not the same on every CPU (an AVX2 AMD Zen 3 and an AVX-512 Zen 4 rank them
differently), nor at every shape and thread count, so `optimize_for_cpu_inference` times the candidates on the
model's own shapes when it is called (`CpuInferencePlan`), from a default plan per CPU class that stands where the
timing cannot be trusted. There is no compile step and no recompilation when the batch size or length changes.

One module per concern:

- `capabilities`: what this CPU and torch build can do (ISA, kernels present, int8 saturation per call form, class,
  the cores a cgroup CPU quota leaves the process);
- `linear_kernels`: packed linear kernels (`PackedLinear`) and the int8 kernel's input quantization;
- `length_groups`: length-grouped attention (`LengthGroups`);
- `optimized_layers`: the optimized encoder, layer, attention, feed-forward and linear classes, and how each call form
  keeps the precision;
- `optimized_decoder`: the same for the decoder half of the generation models (decoder layers with their key/value
  cache, cross-attention, LM head) and beam search's cache reordering;
- `plans`: `CpuInferencePlan`, the default plans per CPU class, `measure_plan` and the per-process cache;
- `optimized_model`: `optimize_for_cpu_inference`.

Each module imports only modules listed above it (dependencies run one way).

Every name this module had before it was split stays importable from here.
"""

from .capabilities import (
    INT8_CALL_FORMS,
    INT8_GEMM_FORM,
    UnsupportedCpuError,
    aten_dispatches_avx2_or_better,
    bf16_instructions_available,
    bf16_linear_available,
    cgroup_cpu_limit,
    cpu_class,
    int8_products_saturate,
    int8_weight_levels,
    linear_kernels_available,
    mkl_linear_available,
    onednn_x86_operators_available,
    usable_cpus,
)
from .length_groups import ATTENTION_MODES, LENGTH_GROUPS, LengthGroups
from .linear_kernels import (
    LINEAR_KERNELS,
    ONEDNN_ACTIVATIONS,
    SMALL_INT8_PRODUCT,
    PackedLinear,
    quantize_per_tensor_uint8,
)
from .optimized_layers import ROLES
from .optimized_model import optimize_for_cpu_inference
from .plans import (
    DEFAULT_PLANS,
    MARGIN,
    MAX_SPREAD,
    MIN_CPU_SHARE,
    CpuInferencePlan,
    default_plan,
    default_timing_lengths,
    measure_plan,
)


# The names these functions had before the split, which said less than they do: `x86_cpu` is true where ATen
# dispatches AVX2 or better, and `onednn_available` includes that check. Scripts and users import them.
x86_cpu = aten_dispatches_avx2_or_better
onednn_available = onednn_x86_operators_available

__all__ = [
    "ATTENTION_MODES",
    "DEFAULT_PLANS",
    "INT8_CALL_FORMS",
    "INT8_GEMM_FORM",
    "LENGTH_GROUPS",
    "LINEAR_KERNELS",
    "MARGIN",
    "MAX_SPREAD",
    "MIN_CPU_SHARE",
    "ONEDNN_ACTIVATIONS",
    "ROLES",
    "SMALL_INT8_PRODUCT",
    "CpuInferencePlan",
    "LengthGroups",
    "PackedLinear",
    "UnsupportedCpuError",
    "aten_dispatches_avx2_or_better",
    "bf16_instructions_available",
    "bf16_linear_available",
    "cgroup_cpu_limit",
    "cpu_class",
    "default_plan",
    "default_timing_lengths",
    "int8_products_saturate",
    "int8_weight_levels",
    "linear_kernels_available",
    "measure_plan",
    "mkl_linear_available",
    "onednn_available",
    "onednn_x86_operators_available",
    "optimize_for_cpu_inference",
    "quantize_per_tensor_uint8",
    "usable_cpus",
    "x86_cpu",
]
