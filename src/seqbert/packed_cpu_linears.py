"""CPU generation speed: the decode steps' small matrix products on prepacked oneDNN weights (`PackedCpuLinears`).

A runtime mechanism, not part of the model: `generate` of `SeqBertForCausalLM` and `SeqBertForConditionalGeneration`
runs under it, and results equal `F.linear`'s to rounding. It sits apart from `modeling_seqbert.py` so that the
modeling file reads as the model; the modeling file imports it relatively, so it is copied into saved model folders
for `trust_remote_code=True` users and depends only on torch.
"""

import functools

import torch
from torch import nn


class PackedCpuLinears:
    """
    Context manager: inside `with PackedCpuLinears(model):`, each plain `nn.Linear` of `model` (LoRA's base layers
    included) runs small CPU fp32 batches through oneDNN, with its weight reordered once into oneDNN's blocked layout
    (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the pair inductor's weight prepacking uses for
    dynamic batch sizes). `generate` of the two generation models runs under it; nothing else does.

    Why (our own measurement, not a published trick): a decode step multiplies a few rows (batch x beams) by every
    weight. MKL's `addmm` reads a row-major weight at 6-7 GB/s for 8 rows on the 2-core AMD EPYC of the docs' measured results;
    the packed weight streams 2-3x faster (the 30,522 x 384 vocabulary projection: 7.5 ms -> 2.4 ms at 2 threads).
    For hundreds of rows packing loses (0.83-0.9x), so only these calls take it:
      - 2 to 32 rows (one row stays on MKL's matrix-vector path, which is faster there);
      - up to 512 rows for an output of at least 8,192 features (a vocabulary projection).

    Results differ from `F.linear` in the last bits (about 1e-6 relative), so generated ids match transformers'
    `EncoderDecoderModel` and `BertLMHeadModel` (tests/test_bert2bert.py and tests/test_causal_lm.py check them) but
    scores are not bit-equal. Every other call runs `F.linear` unchanged: grad-requiring inputs or weights, other
    dtypes or devices, weight tensor subclasses, `torch.compile` tracing, no oneDNN or no AVX2 CPU, and
    `torch.backends.mkldnn.flags(enabled=False)`, which is how a user turns it off.

    Modules are swapped by an instance attribute `forward` (hooks still run), which `__exit__` removes; a module that
    already has one (accelerate's offloading hooks, or another `generate` running in a second thread) is left alone.
    A weight is packed on its second small call, so a one-step `generate` costs nothing extra, and the packed copies
    are dropped on exit, so weights changed between calls (training, adapters merged through `.data`) are always read
    afresh. Packing the MiniLM BERT2BERT decoder and vocabulary projection takes about 20 ms per `generate` call.
    """

    max_rows = 32
    max_rows_vocabulary = 512
    min_vocabulary_features = 8192

    def __init__(self, model: nn.Module):
        self.model = model
        self.swapped: list[nn.Linear] = []
        self.packed: dict[nn.Linear, tuple] = {}  # module -> (the weight, its packed copy or None before its 2nd use)

    def __enter__(self) -> "PackedCpuLinears":
        if _ONEDNN_LINEAR:
            self.swapped = [m for m in self.model.modules() if type(m) is nn.Linear and "forward" not in vars(m)]
            for module in self.swapped:
                module.forward = functools.partial(self.linear, module)
        return self

    def __exit__(self, *exc_info) -> None:
        for module in self.swapped:
            vars(module).pop("forward", None)
        self.swapped, self.packed = [], {}

    def linear(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """`module(x)` for an `nn.Linear`: (..., in_features) -> (..., out_features), in `x`'s dtype."""
        weight, bias = module.weight, module.bias
        if not (_packable_cpu_linear(x, weight, bias) and self._small(x, weight)):
            return nn.functional.linear(x, weight, bias)
        weight_seen, packed = self.packed.get(module, (None, None))
        if weight_seen is not weight:  # its first small call (or a weight replaced inside the block)
            self.packed[module] = (weight, None)
            return nn.functional.linear(x, weight, bias)
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.max_rows)
            self.packed[module] = (weight, packed)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def _small(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        rows = x.numel() // x.shape[-1]
        if weight.shape[0] >= self.min_vocabulary_features:
            return rows <= self.max_rows_vocabulary
        return 2 <= rows <= self.max_rows


def _packable_cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `F.linear(x, weight, bias)` may take `PackedCpuLinears`' oneDNN path (see there)."""
    if not torch.backends.mkldnn.enabled or torch.compiler.is_compiling():
        return False
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if not all(type(t) in (torch.Tensor, nn.Parameter) for t in tensors):
        return False
    if any(t.device.type != "cpu" or t.dtype != torch.float32 or t.layout != torch.strided for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return weight.dim() == 2 and x.dim() >= 2 and x.shape[-1] == weight.shape[1] and x.numel() > 0


def _onednn_linear_available() -> bool:
    """oneDNN's packed linear ops exist and the CPU is an x86 one with AVX2 or better, where they were measured."""
    try:
        ops = (torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False
    return (
        all(ops) and torch.backends.mkldnn.is_available() and torch.backends.cpu.get_cpu_capability().startswith("AVX")
    )


_ONEDNN_LINEAR = _onednn_linear_available()
