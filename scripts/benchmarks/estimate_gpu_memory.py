#!/usr/bin/env python
"""GPU memory and FLOPs of a bf16 fine-tuning step, seqbert against transformers' `BertForSequenceClassification`,
estimated on a CPU: both models run on one fake H100 (the CUDA dry run's harness, `tests/fake_cuda.py`), through
torch's meta kernels, with the attention kernel each would run on the GPU. About 20 minutes on 2 CPU cores.

    python scripts/benchmarks/estimate_gpu_memory.py [--shapes base large] [--workloads snippets speeches]
        [--batch_sizes 32 128] [--cards_gib 24 40 80 141] [--json_file estimate_gpu_memory.json]
    python scripts/benchmarks/estimate_gpu_memory.py --on_gpu --estimate_json estimate_gpu_memory.json

The step is what `Trainer(bf16=True)` runs on a GPU with its default optimizer: fp32 weights, the forward under
`torch.autocast("cuda", dtype=torch.bfloat16)`, backward, `torch.optim.AdamW(fused=True)` step, `zero_grad`, BERT's
dropout (0.1 in hidden states and attention). The step is one after the first: the optimizer's states exist
throughout it, as in a training run. Models: `BertForSequenceClassification` (sdpa; on the GPU with a padding mask it runs the
memory-efficient kernel) and `SeqBertForSequenceClassification` from the same `BertConfig` (post-LN, as converted BERT;
the variable-length flash kernel on the real tokens), 2 labels, shapes bert-base (12 layers, hidden 768) and bert-large
(24 layers, hidden 1024).

Workloads: `snippets`, the first B Rotten Tomatoes snippets in file order, padded to the longest of the batch (about
half padding); `speeches`, the first B convention speeches (repeated past the 189 there are) cut at 512 tokens and padded
to 512. Labels seeded.

Measured, per model: peak memory (`torch.distributed._tools.mem_tracker.MemTracker`: every CUDA tensor's storage in
the caching allocator's 512-byte blocks; by kind at the peak: parameters, gradients, optimizer states, activations,
backward temporaries) and matmul FLOPs per step (`torch.utils.flop_counter.FlopCounterMode`, with the variable-length
kernel counted on the true sequence lengths); and one layer's attention backward temporaries (below:
`attention_workspace_gib`) and whether the peak falls while they are held (`peak_in_attention_backward`). Then, for
each of `--cards_gib`, the largest batch (a multiple of 8) whose estimated peak fits in that many GiB: a line in the
tokens each model computes on (the real ones for seqbert, the padded grid for BERT), through the smallest and largest
`--batch_sizes`, gives a first guess, then fake steps bracket and bisect it.

The attention backward kernels' own temporaries, which torch's meta kernels do not allocate, are added as the kernels
hold them: allocated when one layer's attention backward starts, beside its gradients, and freed when it returns, so
they raise the peak only where it falls in an attention backward (`AttentionWorkspaceTracker`; sizes in
`attention_backward_workspace`, read from torch's CUDA sources):

- seqbert's variable-length flash backward (`mha_varlen_bwd` in
  `aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`): `dq_accum`, (T + 128 S) x N x round32(D) fp32,
  and `softmax_d`, N x (T + 128 S) fp32, for T real tokens in S sequences, N heads of size D (round32: D rounded up to
  a multiple of 32, of 64 above 128); the dense flash backward (`mha_bwd`, sdpa without a mask) the same with B
  sequences of the padded length L rounded up to 128 in place of T + 128 S;
- BERT's memory-efficient backward (`_efficient_attention_backward` in
  `aten/src/ATen/native/transformers/cuda/attention_backward.cu`, kernels in `mem_eff_attention/kernel_backward.h`,
  chosen by `mem_eff_attention/kernels/cutlassB.h`): `workspace`, B x N x ceil(L / 64) x ceil(D / 64) blocks of
  16 + 64 x 64 x 4 bytes (the fp32 dQ accumulator of the split-key kernel, `GradQTempStorage`; 128 x 128 tiles for
  64 < D <= 128), and `delta`, B x N x L fp32. bf16 and fp16 with D <= 64 take a 64 x 64 kernel there on sm80 to
  sm121, whose dK and dV stay in registers (`kOutputInRF`), so it holds no dK / dV accumulator;
- the copies both make of `grad_out` (flash: and `out`) where it is not contiguous in the layout the kernel takes
  (`grad_out.contiguous()`), read from the fake tensors' strides.

Checked on an H200 (torch 2.11.0+cu130, 2026-11-27), each backward op run alone: its peak over the gradients it
returned was these sizes to the byte for the variable-length flash kernel (three shapes) and the memory-efficient
kernel (two shapes; the third 1 MiB above, the caching allocator's rounding of a large block), and for sdpa's dense
flash backward once its two copies were counted.

What the estimate leaves out: the CUDA context (about 0.5 GiB, outside torch's allocator), cuBLAS and cuDNN workspaces
(tens of MiB; cuBLAS takes its own through the caching allocator on first use), the caching allocator's fragmentation
and its rounding of large blocks (up to 1 MiB each; commonly 5-15 % more reserved than allocated), the
deterministic-mode variants of the workspaces, NCCL buffers under DDP, and what a card reports below its nominal size
(an 80 GB H100: 79.6 GiB).

`--on_gpu` runs the same steps on a real CUDA GPU (real weights' shapes, random values) and records
`torch.cuda.max_memory_allocated()` over them, less what was allocated before the model: the real allocator, the
kernels' workspaces included; with `--estimate_json` (rows written by an estimate run) each row gets the estimate and
the gap. Results: `--json_file` and a table on stdout.
"""

import copy
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path


# The fake CUDA device of the dry run must be loaded before torch is imported (tests/fake_cuda_shim.py).
TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
import fake_cuda_shim  # tests/, imports no torch


fake_cuda_shim.load()

import pandas as pd
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

import seqbert
from seqbert.data import convention_speeches, minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


GIB = 2**30
aten = torch.ops.aten
SHAPES = {
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}
MAX_SPEECH_TOKENS = 512
MODELS = ("seqbert", "bert")


@dataclass
class EstimateArguments:
    shapes: list[str] = field(
        default_factory=lambda: ["base", "large"],
        metadata={"help": "Model shapes: bert-base, bert-large.", "choices": list(SHAPES), "nargs": "+"},
    )
    workloads: list[str] = field(
        default_factory=lambda: ["snippets", "speeches"],
        metadata={"help": "Inputs (see the docstring).", "choices": ["snippets", "speeches"], "nargs": "+"},
    )
    batch_sizes: list[int] = field(
        default_factory=lambda: [32, 128], metadata={"help": "Batch sizes measured (two or more).", "nargs": "+"}
    )
    cards_gib: list[float] = field(
        default_factory=lambda: [24.0, 40.0, 80.0, 141.0],
        metadata={"help": "Card memory in GiB for the largest-batch search.", "nargs": "+"},
    )
    search_batches: bool = field(default=True, metadata={"help": "Search the largest batch for each card."})
    num_hidden_layers: int | None = field(
        default=None, metadata={"help": "Layers instead of the shape's (a quick run: the estimate is per layer)."}
    )
    on_gpu: bool = field(default=False, metadata={"help": "Measure on a real CUDA GPU instead of estimating."})
    estimate_json: str | None = field(
        default=None, metadata={"help": "With --on_gpu: an estimate run's JSON file, to report the gap to."}
    )
    json_file: str | None = field(default="estimate_gpu_memory.json", metadata={"help": "Where to write the rows."})

    def __post_init__(self):
        if len(set(self.batch_sizes)) < 2 or min(self.batch_sizes) < 1:
            raise ScriptInputError(f"--batch_sizes ({self.batch_sizes}) must hold two or more different sizes >= 1")
        if any(card <= 0 for card in self.cards_gib):
            raise ScriptInputError(f"--cards_gib ({self.cards_gib}) must be positive")
        if self.num_hidden_layers is not None and self.num_hidden_layers < 1:
            raise ScriptInputError(f"--num_hidden_layers ({self.num_hidden_layers}) must be >= 1")
        if self.on_gpu and not torch.cuda.is_available():
            raise ScriptInputError("--on_gpu needs a CUDA GPU, and torch.cuda.is_available() is False here")
        if not self.on_gpu and fake_cuda_shim.unavailable is not None:
            raise ScriptInputError(f"the fake GPU is unavailable: {fake_cuda_shim.unavailable}")


class Batches:
    """The workloads' batches, tokenized once."""

    def __init__(self):
        self.tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
        frame = pd.read_csv(rotten_tomatoes_path())
        self.snippets = frame[frame.category.isin(["fresh", "rotten"])].text.tolist()
        self.speeches = convention_speeches()
        self._lengths: dict[str, list[int]] = {}

    def lengths(self, workload: str) -> list[int]:
        """Each text's length in tokens, as the batches cut it (tokenized on first use)."""
        if workload not in self._lengths:
            texts = self.snippets if workload == "snippets" else self.speeches
            limit = None if workload == "snippets" else MAX_SPEECH_TOKENS
            encoded = self.tokenizer(texts, truncation=limit is not None, max_length=limit)["input_ids"]
            self._lengths[workload] = [len(ids) for ids in encoded]
        return self._lengths[workload]

    def tokens(self, workload: str, model_name: str, batch_size: int) -> int:
        """The tokens `model_name` computes on for a batch: the real ones (seqbert), or the padded grid (BERT)."""
        lengths = self.lengths(workload)
        batch = [lengths[i % len(lengths)] for i in range(batch_size)]
        return sum(batch) if model_name == "seqbert" else batch_size * max(batch)

    def __call__(self, workload: str, batch_size: int) -> dict[str, torch.Tensor]:
        if workload == "snippets":
            texts = [self.snippets[i % len(self.snippets)] for i in range(batch_size)]
            batch = self.tokenizer(texts, padding=True, return_tensors="pt")
        else:
            texts = [self.speeches[i % len(self.speeches)] for i in range(batch_size)]
            batch = self.tokenizer(
                texts, padding=True, truncation=True, max_length=MAX_SPEECH_TOKENS, return_tensors="pt"
            )
        labels = torch.randint(0, 2, (batch_size,), generator=torch.Generator().manual_seed(0))
        return {**batch, "labels": labels}


def configs(shape: str, layers: int | None) -> dict[str, object]:
    """The BERT config of `shape` (2 labels, sdpa) and seqbert's from it."""
    sizes = SHAPES[shape] | ({} if layers is None else {"num_hidden_layers": layers})
    bert = BertConfig(num_labels=2, **sizes)
    bert._attn_implementation = "sdpa"
    return {"seqbert": seqbert.SeqBertConfig.from_bert_config(bert), "bert": bert}


MODEL_CLASSES = {"seqbert": seqbert.SeqBertForSequenceClassification, "bert": BertForSequenceClassification}


def narrow(config):
    """`config` at a width and depth that cost nothing on a CPU: its host reads depend on the inputs only."""
    config = copy.deepcopy(config)
    config.hidden_size, config.num_attention_heads, config.intermediate_size, config.num_hidden_layers = 16, 2, 16, 1
    return config


def _ceil_div(value: int, divisor: int) -> int:
    return -(-value // divisor)


def _round_up(value: int, multiple: int) -> int:
    return _ceil_div(value, multiple) * multiple


def _flash_workspace(rows: int, heads: int, head_dim: int) -> list[int]:
    """`dq_accum` and `softmax_d` of flash-attention's backward (`flash_api.cpp`), bytes: `rows` query rows as the
    kernel pads them (T + 128 S for `mha_varlen_bwd`; B x L rounded up to 128 for `mha_bwd`)."""
    rounded = _round_up(head_dim, 32 if head_dim <= 128 else 64)
    return [rows * heads * rounded * 4, heads * rows * 4]


def _efficient_workspace(batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype) -> list[int]:
    """`workspace` and `delta` of the memory-efficient backward (`attention_backward.cu`), bytes, for the kernel
    `cutlassB.h` picks on sm80 to sm121: per (sequence, head), ceil(L / I) x ceil(D / J) `GradQTempStorage` blocks
    (16 bytes of lock and counter, then the I x J fp32 dQ tile), I = J = 64 for D <= 64 and 128 for D <= 128 in fp16 /
    bf16 (`kernel_backward.h`, `workspace_elements_gq`); and the (B, N, L) fp32 `delta` the half kernels fill."""
    if dtype not in (torch.float16, torch.bfloat16) or head_dim > 128:
        raise ValueError(
            f"the memory-efficient backward's workspace is modelled for fp16 / bf16 with head dim <= 128, not "
            f"{dtype} with head dim {head_dim}"
        )
    tile = 64 if head_dim <= 64 else 128
    blocks = _ceil_div(length, tile) * _ceil_div(head_dim, tile)
    return [batch * heads * blocks * (16 + tile * tile * 4), batch * heads * length * 4]


def _copies(*tensors: torch.Tensor) -> list[int]:
    """Bytes of the `contiguous()` copies a kernel makes of `tensors` (of those not contiguous already)."""
    return [t.numel() * t.element_size() for t in tensors if not t.is_contiguous()]


def attention_backward_workspace(func, args) -> list[int]:
    """Bytes of each temporary the CUDA kernel of attention backward op `func` allocates inside the op (and frees
    before it returns), from its arguments' shapes and strides; [] for any other op. Read from torch's CUDA sources
    (see the module docstring), the non-deterministic kernels, as torch runs them by default: the fp32 workspaces, and
    the copies the kernels make of `grad_out` (and, flash, of `out`) where these are not contiguous in the layout the
    kernel takes, (B, L, N, D) or (T, N, D)."""
    if func is aten._flash_attention_backward.default:
        grad_out, query, out, cu_seqlens = args[0], args[1], args[4], args[6]
        if cu_seqlens is not None and cu_seqlens.numel() > 0:  # mha_varlen_bwd: query (T, N, D)
            total, heads, head_dim = query.shape
            sequences = cu_seqlens.shape[0] - 1
            rows = total + 128 * sequences
        else:  # mha_bwd: query (B, L, N, D)
            batch, length, heads, head_dim = query.shape
            rows = batch * _round_up(length, 128)
        return _copies(grad_out, out) + _flash_workspace(rows, heads, head_dim)
    if func is aten._scaled_dot_product_flash_attention_backward.default:  # mha_bwd on query (B, N, L, D)
        grad_out, query, out = args[0], args[1], args[4]
        batch, heads, length, head_dim = query.shape
        copies = _copies(grad_out.transpose(1, 2), out.transpose(1, 2))
        return copies + _flash_workspace(batch * _round_up(length, 128), heads, head_dim)
    if func is aten._scaled_dot_product_efficient_attention_backward.default:  # query (B, N, L, D)
        grad_out, query = args[0], args[1]
        batch, heads, length, head_dim = query.shape
        copies = _copies(grad_out.transpose(1, 2))
        return copies + _efficient_workspace(batch, heads, length, head_dim, query.dtype)
    return []


class AttentionWorkspaceTracker(MemTracker):
    """
    torch's `MemTracker`, plus the temporaries the attention backward kernels allocate inside the op (fp32
    workspaces, copies of non-contiguous inputs: `attention_backward_workspace`), which a meta kernel does not: each
    is allocated through the tracker just before the op runs (the kernel allocates them beside its gradients, and all
    coexist while it runs), counted as a backward temporary, and freed when the op returns, so they add to the peak
    only while one layer's attention backward runs.

    Attributes:
        workspace_bytes (`int`): the most bytes one op's temporaries held (in 512-byte blocks); 0 if none ran.
        peak_in_workspace (`int`): the highest total tracked while they were held.
    """

    def __init__(self):
        super().__init__()
        self.workspace_bytes = 0
        self.peak_in_workspace = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        sizes = attention_backward_workspace(func, args)
        if not sizes:
            return super().__torch_dispatch__(func, types, args, kwargs)
        device = args[1].device
        held = []  # allocated through this tracker (its own dispatch), so that it counts them
        for size in sizes:
            empty = (aten.empty.memory_format, types, ([size],), {"dtype": torch.uint8, "device": device})
            held.append(super().__torch_dispatch__(*empty))
        result = super().__torch_dispatch__(func, types, args, kwargs)
        self.workspace_bytes = max(self.workspace_bytes, sum(_round_up(size, 512) for size in sizes))
        current = self.get_tracker_snapshot().get(device, {})
        self.peak_in_workspace = max(self.peak_in_workspace, current.get("Total", 0))
        del held  # the kernel frees its workspace as it returns
        return result


def estimate(model_name: str, config, batch: dict) -> tuple:
    """`fake_cuda.StepCost` of a training step of `model_name` on `batch` on the fake GPU, the attention backward's
    workspaces included, and the `AttentionWorkspaceTracker` that measured it."""
    import fake_cuda

    model_class = MODEL_CLASSES[model_name]
    reader = model_class(narrow(config)).train()
    with torch.no_grad():  # the forward reads the host; a backward never does (the fake run would fail on a read)
        reads = fake_cuda.record_host_reads(lambda: reader(**batch))
    lengths = batch["attention_mask"].sum(1).tolist() if model_name == "seqbert" else None
    tracker = AttentionWorkspaceTracker()
    with fake_cuda.FakeGPU(reads) as gpu, fake_cuda.GpuSdpaChoice():
        model = gpu.model(model_class, config, torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)  # Trainer's default, adamw_torch_fused
        return fake_cuda.measure_training_step(gpu, model, optimizer, gpu.tensors(batch), lengths, tracker), tracker


def measure_on_gpu(model_name: str, config, batch: dict, steps: int = 2) -> dict:
    """The same steps on the real GPU: peak allocated bytes (less what was allocated before) and FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    device = torch.device("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model = MODEL_CLASSES[model_name](config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    inputs = {k: v.to(device) for k, v in batch.items()}
    with FlopCounterMode(display=False) as flops:
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**inputs).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - before
    del model, optimizer, inputs
    torch.cuda.empty_cache()
    return {"peak_gib": peak / GIB, "tflops_per_step": flops.get_total_flops() / steps / 1e12}


def largest_batch(cost, capacity: float, guess: float, step: int = 8, stride_fraction: float = 1 / 64) -> int:
    """The largest multiple of `step` whose `cost(batch)` (bytes) is at most `capacity` (0 if none): bracketed from
    `guess` in strides of `stride_fraction` of the batch, then bisected."""
    known = {}

    def fits(batch: int) -> bool:
        if batch not in known:
            known[batch] = cost(batch) <= capacity
        return known[batch]

    def stride(batch: int) -> int:
        return max(step, int(batch * stride_fraction) // step * step)

    batch = max(step, int(guess) // step * step)
    if fits(batch):
        low, high = batch, None
        while high is None:
            batch = low + stride(low)
            low, high = (batch, None) if fits(batch) else (low, batch)
    else:
        low, high = None, batch
        while low is None:
            batch = high - stride(high)
            if batch < step:
                return 0
            low, high = (batch, high) if fits(batch) else (None, batch)
    while high - low > step:
        middle = (low + high) // 2 // step * step
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(EstimateArguments, __doc__), argv)
    warnings.filterwarnings("ignore", message="Module is None")
    batches = Batches()
    rows, fits = [], []
    estimated = _estimates_by_key(args.estimate_json)
    for shape in args.shapes:
        model_configs = configs(shape, args.num_hidden_layers)
        for workload in args.workloads:
            line = {}
            for batch_size in args.batch_sizes:
                batch = batches(workload, batch_size)
                mask = batch["attention_mask"]
                row = {
                    "shape": shape,
                    "layers": model_configs["bert"].num_hidden_layers,
                    "workload": workload,
                    "batch_size": batch_size,
                    "padded_length": mask.shape[1],
                    "padding": round(1 - mask.float().mean().item(), 4),
                }
                for name in MODELS:
                    if args.on_gpu:
                        row[name] = measure_on_gpu(name, model_configs[name], batch)
                        key = (shape, row["layers"], workload, batch_size, name)
                        if key in estimated:
                            row[name]["estimated_peak_gib"] = estimated[key]
                            row[name]["gap"] = row[name]["peak_gib"] / estimated[key] - 1
                        continue
                    cost, tracker = estimate(name, model_configs[name], batch)
                    row[name] = {
                        "peak_gib": cost.peak_bytes / GIB,
                        "at_peak_gib": {kind: value / GIB for kind, value in cost.at_peak.items()},
                        "tflops_per_step": cost.flops / 1e12,
                        "attention_workspace_gib": tracker.workspace_bytes / GIB,
                        "peak_in_attention_backward": tracker.peak_in_workspace == cost.peak_bytes,
                    }
                    line.setdefault(name, []).append((batch_size, cost.peak_bytes))
                row["peak_ratio"] = row["seqbert"]["peak_gib"] / row["bert"]["peak_gib"]
                row["flops_ratio"] = row["seqbert"]["tflops_per_step"] / row["bert"]["tflops_per_step"]
                rows.append(row)
                print(_row_line(row))
            if args.on_gpu or not args.search_batches:
                continue
            for name in MODELS:
                # A first guess from a line in the tokens computed on (real ones, or the padded grid), through the
                # smallest and largest batch measured; fake steps then settle it.
                (small, small_peak), (large, large_peak) = min(line[name]), max(line[name])
                small_tokens, large_tokens = (batches.tokens(workload, name, b) for b in (small, large))
                per_token = (large_peak - small_peak) / (large_tokens - small_tokens)
                fixed = small_peak - per_token * small_tokens

                def cost(batch_size, name=name, config=model_configs[name], workload=workload):
                    return estimate(name, config, batches(workload, batch_size))[0].peak_bytes

                for card in args.cards_gib:
                    guess = small
                    while fixed + per_token * batches.tokens(workload, name, guess * 2) <= card * GIB:
                        guess *= 2
                    low, high = guess, guess * 2  # the line's largest batch lies between: bisect it on the line
                    while high - low > 1:
                        middle = (low + high) // 2
                        inside = fixed + per_token * batches.tokens(workload, name, middle) <= card * GIB
                        low, high = (middle, high) if inside else (low, middle)
                    biggest = largest_batch(cost, card * GIB, low)
                    fits.append(
                        {"shape": shape, "workload": workload, "card_gib": card, "model": name, "batch": biggest}
                    )
                    print(f"{shape:<6} {workload:<9} {card:>6.0f} GiB  {name:<8} largest batch {biggest}")
    result = {"rows": rows, "largest_batches": fits, "torch": torch.__version__, "on_gpu": args.on_gpu}
    if args.on_gpu:
        result["device"] = torch.cuda.get_device_name()
    write_json(args.json_file, result)
    return result


def _estimates_by_key(path: str | None) -> dict:
    if path is None:
        return {}
    import json

    rows = json.loads(Path(path).read_text())["rows"]
    return {
        (r["shape"], r["layers"], r["workload"], r["batch_size"], name): r[name]["peak_gib"]
        for r in rows
        for name in MODELS
    }


def _row_line(row: dict) -> str:
    line = (
        f"{row['shape']:<6} {row['workload']:<9} batch {row['batch_size']:>4} (length {row['padded_length']:>3}, "
        f"{row['padding']:.0%} padding): peak seqbert {row['seqbert']['peak_gib']:.2f} GiB, BERT "
        f"{row['bert']['peak_gib']:.2f} GiB ({row['peak_ratio']:.2f}x) | TFLOP/step seqbert "
        f"{row['seqbert']['tflops_per_step']:.2f}, BERT {row['bert']['tflops_per_step']:.2f} ({row['flops_ratio']:.2f}x)"
    )
    if "attention_workspace_gib" in row["seqbert"]:  # an estimate: one layer's attention backward temporaries
        line += " | attention backward temporaries " + ", ".join(
            f"{name} {row[key]['attention_workspace_gib']:.3f} GiB"
            + (" (at the peak)" if row[key]["peak_in_attention_backward"] else "")
            for key, name in (("seqbert", "seqbert"), ("bert", "BERT"))
        )
    return line


if __name__ == "__main__":
    run_cli(main, script_parser(EstimateArguments, __doc__))
