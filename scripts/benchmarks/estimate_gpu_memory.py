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
kernel counted on the true sequence lengths). Then, for each of `--cards_gib`, the largest batch (a multiple of 8) whose
estimated peak fits in that many GiB: a line in the tokens each model computes on (the real ones for seqbert, the
padded grid for BERT), through the smallest and largest `--batch_sizes`, gives a first guess, then fake steps bracket
and bisect it.

What the estimate leaves out: the CUDA context (about 0.5 GiB, outside torch's allocator), cuBLAS and cuDNN workspaces
(tens of MiB), the caching allocator's fragmentation and rounding beyond 512-byte blocks (commonly 5-15 % more reserved
than allocated), NCCL buffers under DDP, and what a card reports below its nominal size (an 80 GB H100: 79.6 GiB).

`--on_gpu` runs the same steps on a real CUDA GPU (real weights' shapes, random values) and records
`torch.cuda.max_memory_allocated()` over them, less what was allocated before the model; with `--estimate_json` (rows
written by an estimate run) each row gets the estimate and the gap. Results: `--json_file` and a table on stdout.
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
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

import seqbert
from seqbert.data import convention_speeches, minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


GIB = 2**30
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


def estimate(model_name: str, config, batch: dict):
    """`fake_cuda.StepCost` of a training step of `model_name` on `batch` on the fake GPU."""
    import fake_cuda

    model_class = MODEL_CLASSES[model_name]
    reader = model_class(narrow(config)).train()
    with torch.no_grad():  # the forward reads the host; a backward never does (the fake run would fail on a read)
        reads = fake_cuda.record_host_reads(lambda: reader(**batch))
    lengths = batch["attention_mask"].sum(1).tolist() if model_name == "seqbert" else None
    with fake_cuda.FakeGPU(reads) as gpu, fake_cuda.GpuSdpaChoice():
        model = gpu.model(model_class, config, torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)  # Trainer's default, adamw_torch_fused
        return fake_cuda.measure_training_step(gpu, model, optimizer, gpu.tensors(batch), lengths)


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
                    cost = estimate(name, model_configs[name], batch)
                    row[name] = {
                        "peak_gib": cost.peak_bytes / GIB,
                        "at_peak_gib": {kind: value / GIB for kind, value in cost.at_peak.items()},
                        "tflops_per_step": cost.flops / 1e12,
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
                    return estimate(name, config, batches(workload, batch_size)).peak_bytes

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
    return (
        f"{row['shape']:<6} {row['workload']:<9} batch {row['batch_size']:>4} (length {row['padded_length']:>3}, "
        f"{row['padding']:.0%} padding): peak seqbert {row['seqbert']['peak_gib']:.2f} GiB, BERT "
        f"{row['bert']['peak_gib']:.2f} GiB ({row['peak_ratio']:.2f}x) | TFLOP/step seqbert "
        f"{row['seqbert']['tflops_per_step']:.2f}, BERT {row['bert']['tflops_per_step']:.2f} ({row['flops_ratio']:.2f}x)"
    )


if __name__ == "__main__":
    run_cli(main, script_parser(EstimateArguments, __doc__))
