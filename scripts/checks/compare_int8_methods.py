#!/usr/bin/env python
"""How far int8 moves MiniLM-L6's hidden states from fp32 on real text under each way of keeping oneDNN's int8
products exact on CPUs without VNNI (`seqbert.cpu_inference.int8_weight_levels` says why one was chosen). About
20 seconds on 2 cores.

The ways:

- `8-bit` (the reference): 8-bit weights (127 levels a side) and activations, exact only where the CPU's int8
  products do not saturate (VNNI), or computed so here when they do not reach int16's limit;
- `7-bit weights`: weights at 63 levels a side, activations 8-bit (what seqbert runs where the products saturate);
- `7-bit activations`: activations at 126 steps instead of 253 (PyTorch's `reduce_range`), weights 8-bit;
- `paired weights`: 8-bit weights, each pair (2i, 2i+1) of an output feature's weights cut to |w| + |w'| <= 128 where
  both have the same sign (exact 8-bit elsewhere).

Every variant runs `optimize_for_cpu_inference(model, int8=True)` with its quantization patched in, on the first
`--num_snippets` Rotten Tomatoes snippets in file order (one padded batch), and reports max and mean |delta| from the
fp32 eager model's last hidden state over real tokens and the smallest and mean per-token cosine similarity. On a CPU
whose products saturate (or under `ONEDNN_MAX_CPU_ISA=AVX2`) the `8-bit` row shows the saturation's own error too.

    python scripts/checks/compare_int8_methods.py [--num_snippets 64] [--json_file int8_methods.json]
"""

import contextlib
import math
from dataclasses import dataclass, field
from unittest import mock

import torch

import seqbert
from seqbert import cpu_inference
from seqbert.cpu_inference import linear_kernels
from seqbert.data import minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


@dataclass
class CompareArguments:
    num_snippets: int = field(default=64, metadata={"help": "Real snippets in the batch (first in file order)."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})

    def __post_init__(self):
        if self.num_snippets < 1:
            raise ScriptInputError(f"--num_snippets must be >= 1, got {self.num_snippets}")


def quantize_7bit_activations(x: torch.Tensor, shifted: bool) -> tuple[torch.Tensor, float, int]:
    """`linear_kernels._quantize` (`cpu_inference.quantize_per_tensor_uint8`, or with `shifted` less 128 as int8)
    with the range spread over 126 steps: values q in [0, 127]."""
    low, high = min(x.amin().item(), 0.0), max(x.amax().item(), 0.0)
    scale = max((high - low) / 126, torch.finfo(torch.float32).tiny)
    zero_point = math.ceil(-low / scale)
    q = torch.round(x / scale + zero_point)
    return (q - 128).to(torch.int8) if shifted else q.to(torch.uint8), scale, zero_point


def paired_weights(levels: int):
    """A `PackedLinear.__init__` wrapper that re-quantizes the weight with each same-sign pair (2i, 2i+1) cut to
    |w| + |w'| <= 128, taking the larger cut from the larger weight."""
    original = cpu_inference.PackedLinear.__init__

    def init(
        self, linears, int8=False, dtype=torch.float32, kernel="onednn", activation=None, weight_levels=None,
        residual=False, **options,
    ):  # fmt: skip
        original(self, linears, int8, dtype, kernel, activation, weight_levels, residual, **options)
        if not int8:
            return
        weight = torch.cat([linear.weight.detach() for linear in linears]).double()
        quantized = torch.round(weight / self.weight_scale.double()[:, None]).clamp(-levels, levels)
        first, second = quantized[:, 0::2], quantized[:, 1::2]  # views
        excess = ((first.abs() + second.abs() - 128) * (first * second > 0)).clamp(min=0)
        first_larger = first.abs() >= second.abs()
        cut_first = torch.where(first_larger, torch.ceil(excess / 2), torch.floor(excess / 2))
        first.sub_(first.sign() * cut_first)
        second.sub_(second.sign() * (excess - cut_first))
        self.weight = torch.ops.onednn.qlinear_prepack(quantized.to(torch.int8), None)
        if self.small_products:  # the s8 x s8 gemm's copy of the same weights (`PackedLinear`'s small products)
            self.gemm_weight = quantized.to(torch.int8).t()
            self.gemm_weight_sums = self.gemm_weight.sum(0, dtype=torch.int32)

    return init


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(CompareArguments, __doc__), argv)
    import pandas as pd
    from transformers import AutoTokenizer

    if not cpu_inference.onednn_x86_operators_available():
        raise ScriptInputError("int8 needs torch's oneDNN operators on an x86 CPU, and this CPU or torch has none")
    path = minilm_checkpoint_path()
    frame = pd.read_csv(rotten_tomatoes_path())
    texts = frame[frame["category"].isin(["fresh", "rotten"])]["text"].astype(str).tolist()[: args.num_snippets]
    batch = dict(AutoTokenizer.from_pretrained(path)(texts, padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    model = seqbert.SeqBertModel.from_bert_pretrained(path).eval()
    plan = cpu_inference.CpuInferencePlan(dict.fromkeys(cpu_inference.ROLES, "onednn"))
    variants = {
        "8-bit": {"weight_levels": 127},
        "7-bit weights": {"weight_levels": 63},
        "7-bit activations": {"weight_levels": 127, "quantize": quantize_7bit_activations},
        "paired weights": {"weight_levels": 127, "init": paired_weights(127)},
    }
    with torch.inference_mode():
        expected = model(**batch).last_hidden_state[real]
    results = {
        "snippets": len(texts),
        "tokens": int(real.sum()),
        "int8_products_saturate": cpu_inference.int8_products_saturate(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "variants": {},
    }
    for name, variant in variants.items():
        # PackedLinear looks both up in `linear_kernels` (every call form gets the variant's weight levels)
        levels = mock.patch.object(
            linear_kernels, "int8_weight_levels", lambda form=None, v=variant: v["weight_levels"]
        )
        patches = [levels]
        if "quantize" in variant:
            patches.append(mock.patch.object(linear_kernels, "_quantize", variant["quantize"]))
        if "init" in variant:
            patches.append(mock.patch.object(cpu_inference.PackedLinear, "__init__", variant["init"]))
        with contextlib.ExitStack() as stack, torch.inference_mode():
            for patch in patches:
                stack.enter_context(patch)
            got = seqbert.optimize_for_cpu_inference(model, int8=True, plan=plan)(**batch).last_hidden_state[real]
        delta = (got - expected).abs()
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        row = {
            "max_abs_delta": delta.max().item(),
            "mean_abs_delta": delta.mean().item(),
            "min_cosine": cosine.min().item(),
            "mean_cosine": cosine.mean().item(),
        }
        results["variants"][name] = row
        print(
            f"{name:18s} max |delta| {row['max_abs_delta']:.4f}  mean |delta| {row['mean_abs_delta']:.4f}  "
            f"min cosine {row['min_cosine']:.4f}  mean cosine {row['mean_cosine']:.5f}"
        )
    print(
        f"{results['snippets']} snippets, {results['tokens']} real tokens; CPU capability {results['cpu_capability']}, "
        f"int8 products saturate here: {results['int8_products_saturate']}"
    )
    write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(CompareArguments, __doc__))
