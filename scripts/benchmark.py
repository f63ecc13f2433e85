#!/usr/bin/env python
"""Benchmark seqbert against transformers' own BERT classes and against the other engines a user could pick for CPU
inference, all holding identical weights, in one process, interleaved. The default run takes about 16 minutes on 2
CPU cores (2026-11-23).

    python scripts/benchmark.py [--repeats 3] [--threads 1 2] [--json_file benchmark.json] [--chart_file benchmark.png]

It needs the `train` and `integrations` extras (`pip install -e ".[train,integrations]"`: onnx, onnxruntime).

Inference (fp32 unless named int8, `torch.inference_mode`), at each of `--threads` (torch and onnxruntime alike):

- engines (`scripts/benchmark_engines.py`): transformers' `BertModel` (sdpa; the reference of every delta), torch's
  `nn.TransformerEncoder` fast path over nested tensors, onnxruntime (the exported `BertModel` fused by onnxruntime's
  BERT optimizer), seqbert's `SeqBertModel`, and the int8 versions: onnxruntime's dynamic quantization of the fused
  graph and torch's dynamic quantization of seqbert's linear layers; OpenVINO (f32) and CTranslate2 (float32 and
  int8); and `seqbert.optimize_for_cpu_inference` of the seqbert model, fp32 and int8;
- models: MiniLM-L6 (real weights) and a seeded bert-base-width model with 4 layers;
- `real_length`: Rotten Tomatoes snippets in batches of 32 with dynamic padding (`DataCollatorWithPadding`), as a
  classifier sees them; `dense` (bert-base width only): a batch of 8 x 128 real tokens (snippets cut into blocks).

Training and generation, at all cores:

- `real_length_training`: `BertForSequenceClassification` vs `SeqBertForSequenceClassification` (bert-base size, dropout
  0, so both see the same computation), forward + backward + optimizer step on the real-length batches, each model with
  its own optimizer: `Trainer`'s default, fused AdamW;
- `padding_free_mlm_training`: masked-LM training steps of one model (`SeqBertForMaskedLM`, bert-base width, 4
  layers, dropout 0) on the same masked snippets, padded per batch ("reference") or packed into one row per batch
  without padding (`DataCollatorWithFlattening`, "seqbert"): what `run_mlm.py --padding_free` buys over
  `--line_by_line`. The masks are drawn once, so both see the same tokens and the losses agree;
- `generation`: greedy and beam-4, 32 new tokens, MiniLM-size BERT2BERT (`EncoderDecoderModel` vs
  `SeqBertForConditionalGeneration`), batch 8 (`scripts/benchmark_generation.py`, cached rows);
- `training_memory`: peak RSS during the training step (the real-length batches, once), one fresh process per model,
  with the peak reset after the model, optimizer and batches are built (`VmHWM` of /proc/self/status).

Each timed workload runs its contenders in turn, `--repeats` times; tables show medians, the JSON also the fastest and
slowest repeat. Per workload: real (non-padding) tokens per second (generated tokens for generation), seqbert's
speed-up over each contender, the max |delta| from the reference on real tokens (hidden states, logits or losses; for
generation whether the ids are identical), and the fraction of the fp32 matmul peak reached: 2 FLOPs per
multiply-add of the linear layers on real tokens and of attention on each sequence's real length (x3 for training),
over the fastest of many 2048^3 `torch.mm` products at the same thread count, timed between the workload's rounds.
"""

import gc
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser


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
    memory_probe: str | None = field(
        default=None, metadata={"help": "Internal: 'reference' or 'seqbert', measure one training step's peak RSS."}
    )

    def __post_init__(self):
        if any(count < 1 for count in self.threads):
            raise ScriptInputError(f"--threads must be positive thread counts, got {self.threads}")


INFERENCE_ENGINES = (
    "transformers",
    "nested_tensor",
    "onnxruntime",
    "openvino",
    "ctranslate2",
    "seqbert",
    "seqbert_optimized",
    "onnxruntime_int8",
    "ctranslate2_int8",
    "seqbert_int8",
    "seqbert_optimized_int8",
)


class MatmulPeak:
    """The fastest fp32 (size x size) @ (size x size) `torch.mm` seen so far, per thread count, in GFLOP/s. `probe()`
    is called between a workload's rounds, so the peak is sampled over the whole run rather than once."""

    def __init__(self, size: int = 2048, products_per_probe: int = 3):
        self.size, self.products_per_probe = size, products_per_probe
        self.a, self.b = torch.randn(size, size), torch.randn(size, size)
        self.best_seconds: dict[int, float] = {}

    def probe(self) -> None:
        threads = torch.get_num_threads()
        for _ in range(self.products_per_probe):
            seconds = timed(lambda: torch.mm(self.a, self.b))
            self.best_seconds[threads] = min(seconds, self.best_seconds.get(threads, float("inf")))

    def gflops(self, threads: int | None = None) -> float:
        return 2 * self.size**3 / self.best_seconds[threads or torch.get_num_threads()] / 1e9


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


@torch.inference_mode()
def inference_rows(
    model_name: str, bert_folder: str, workloads: dict, threads: list[int], repeats: int, peak: MatmulPeak, tmp: str
) -> list[dict]:
    """Every engine on each workload (name -> batches) of one BERT checkpoint, at each thread count."""
    bert = BertModel.from_pretrained(bert_folder).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder).eval()
    folder = Path(tmp) / model_name.replace(" ", "_")
    folder.mkdir()
    sample = next(iter(workloads.values()))[0]
    onnx_fp32, onnx_int8, fused_ops = benchmark_engines.export_fused_onnx(bert_folder, sample, folder)
    ctranslate2_models = {q: benchmark_engines.convert_ctranslate2(bert_folder, folder, q) for q in ("float32", "int8")}
    modules = {
        "transformers": bert,
        "nested_tensor": benchmark_engines.NestedTensorBert(bert),
        "seqbert": model,
        "seqbert_optimized": seqbert.optimize_for_cpu_inference(model),
        "seqbert_int8": benchmark_engines.quantize_int8(model),
        "seqbert_optimized_int8": seqbert.optimize_for_cpu_inference(model, int8=True),
    }
    available = torch.get_num_threads()
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        engines = {name: benchmark_engines.torch_engine(module) for name, module in modules.items()}
        engines["onnxruntime"] = benchmark_engines.onnxruntime_engine(onnx_fp32, count)
        engines["onnxruntime_int8"] = benchmark_engines.onnxruntime_engine(onnx_int8, count)
        engines["openvino"] = benchmark_engines.openvino_engine(bert, sample, count)
        for quantization, suffix in (("float32", ""), ("int8", "_int8")):
            path = ctranslate2_models[quantization]
            engines["ctranslate2" + suffix] = benchmark_engines.ctranslate2_engine(path, quantization, count)
        engines = {name: engines[name] for name in INFERENCE_ENGINES}
        for workload, batches in workloads.items():
            masks = [batch["attention_mask"].bool() for batch in batches]
            references = [engines["transformers"](batch) for batch in batches]
            times = interleave(
                {name: (lambda run=run, batches=batches: [run(b) for b in batches]) for name, run in engines.items()},
                repeats,
                between=peak.probe,
            )
            flops = encoder_flops(bert.config, batches)
            real = sum(mask.sum().item() for mask in masks)
            results = {}
            for name, run in engines.items():
                delta = max(
                    (run(batch) - reference)[mask].abs().max().item()
                    for batch, reference, mask in zip(batches, references, masks, strict=True)
                )
                summary = median_and_spread(times[name])
                results[name] = summary | {
                    "tokens_per_s": real / summary["seconds"],
                    "max_abs_delta": delta,
                    "fraction_of_matmul_peak": flops / summary["seconds"] / 1e9 / peak.gflops(count),
                }
            seqbert_seconds = results["seqbert"]["seconds"]
            rows.append(
                {
                    "model": model_name,
                    "workload": workload,
                    "threads": count,
                    "real_tokens": real,
                    "padding_fraction": 1 - real / sum(mask.numel() for mask in masks),
                    "engines": results,
                    "seqbert_speedup": {name: row["seconds"] / seqbert_seconds for name, row in results.items()},
                    "int8_speedup": results["seqbert"]["seconds"] / results["seqbert_int8"]["seconds"],
                    "optimized_speedup": {
                        name: row["seconds"] / results["seqbert_optimized"]["seconds"] for name, row in results.items()
                    },
                    "optimized_int8_speedup": {
                        name: row["seconds"] / results["seqbert_optimized_int8"]["seconds"]
                        for name, row in results.items()
                    },
                    "onnxruntime_fused_operators": fused_ops,
                }
            )
    torch.set_num_threads(available)
    return rows


def inference_chart(rows: list[dict], path: str) -> None:
    """Grouped bars: each engine's real tokens per second relative to transformers, one group per inference row."""
    from matplotlib.figure import Figure  # no pyplot state nor display backend

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / len(INFERENCE_ENGINES)
    for index, name in enumerate(INFERENCE_ENGINES):
        heights = [
            row["engines"][name]["tokens_per_s"] / row["engines"]["transformers"]["tokens_per_s"] for row in rows
        ]
        positions = [group + (index - (len(INFERENCE_ENGINES) - 1) / 2) * width for group in range(len(rows))]
        axes.bar(positions, heights, width, label=name)
    axes.set_xticks(
        range(len(rows)),
        [f"{row['model']}\n{row['workload']}, {row['threads']} thr." for row in rows],
        fontsize=7,
    )
    axes.axhline(1.0, color="black", linewidth=0.6)
    axes.set_ylabel("speed relative to transformers' BertModel")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7, ncols=3)
    figure.savefig(path, dpi=120)


def trainer_optimizer(model) -> torch.optim.Optimizer:
    """The optimizer `Trainer` builds by default (lr 1e-5 here): AdamW, fused with torch >= 2.8 ("adamw_torch_fused"),
    which on CPU takes about 46 ms per step for bert-base against 232 ms for the foreach AdamW (measured 2026-11-23)."""
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(
        TrainingArguments(output_dir=tempfile.gettempdir(), learning_rate=1e-5, report_to=[])
    )
    return optimizer_cls(model.parameters(), **kwargs)


def training_steps(model, batches, losses: list):
    """A function that runs one step of `trainer_optimizer` of `model` per batch and appends each loss to `losses`."""
    optimizer = trainer_optimizer(model)

    def run():
        for batch in batches:
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


def training_workload(cls_folder: str, batches, repeats, peak: MatmulPeak) -> dict:
    reference = BertForSequenceClassification.from_pretrained(cls_folder).train()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
    losses = {"reference": [], "seqbert": []}
    runs = {
        "reference": training_steps(reference, batches, losses["reference"]),
        "seqbert": training_steps(model, batches, losses["seqbert"]),
    }
    return _training_result(interleave(runs, repeats, between=peak.probe), losses, batches)


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
    with tempfile.TemporaryDirectory() as tmp:
        base_folder, base_4_layers, cls_folder = bert_base_folders(tmp)
        tokenizer.save_pretrained(base_4_layers)  # CTranslate2's converter reads the vocabulary from the folder
        for model_name, folder, workloads in (
            ("MiniLM-L6", str(minilm_checkpoint_path()), {"real_length": batches}),
            ("bert-base width, 4 layers", base_4_layers, {"real_length": batches, "dense": dense}),
        ):
            results["inference"] += inference_rows(model_name, folder, workloads, args.threads, args.repeats, peak, tmp)
        results["real_length_training"] = training_workload(cls_folder, batches, args.repeats, peak)
        training_flops = 3 * encoder_flops(BertConfig(), batches)
    results["padding_free_mlm_training"] = padding_free_workload(batches, args.repeats)
    for name in ("real_length_training", "padding_free_mlm_training"):
        row = results[name]
        row["reference_tokens_per_s"] = row["real_tokens"] / row["seconds"]["reference"]
        row["seqbert_tokens_per_s"] = row["real_tokens"] / row["seconds"]["seqbert"]
        row["ratio"] = row["seconds"]["reference"] / row["seconds"]["seqbert"]
    results["real_length_training"]["seqbert_fraction_of_matmul_peak"] = (
        training_flops / results["real_length_training"]["seconds"]["seqbert"] / 1e9 / peak.gflops(all_cores)
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
    memory = memory_workload(args.num_batches)
    results["training_memory"] = {
        **memory,
        "ratio": memory["seqbert"]["peak_rss_mib"] / memory["reference"]["peak_rss_mib"],
    }
    results["machine"]["fp32_matmul_peak_gflops"] = {count: peak.gflops(count) for count in peak.best_seconds}
    print_tables(results, args.repeats)
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    if args.chart_file:
        inference_chart(results["inference"], args.chart_file)
    return results


def print_tables(results: dict, repeats: int) -> None:
    peaks = ", ".join(
        f"{gflops:.0f} GFLOP/s at {count}" for count, gflops in results["machine"]["fp32_matmul_peak_gflops"].items()
    )
    print(f"\nfp32 matmul peak (fastest 2048^3 torch.mm): {peaks} threads; medians of {repeats}")
    print("\ninference: real tokens/s per engine; in brackets seqbert's speed-up over it, max |delta| from BertModel")
    for row in results["inference"]:
        print(
            f"{row['model']}, {row['workload']} ({100 * row['padding_fraction']:.0f}% padding), {row['threads']} threads:"
        )
        for name, engine in row["engines"].items():
            print(
                f"  {name:<22} {engine['tokens_per_s']:>8.0f} tok/s  [{row['seqbert_speedup'][name]:5.2f}x]  "
                f"delta {engine['max_abs_delta']:.1e}  {100 * engine['fraction_of_matmul_peak']:5.1f}% of peak"
            )
        print(f"  seqbert int8 / seqbert fp32: {row['int8_speedup']:.2f}x")
        print(
            f"  optimize_for_cpu_inference vs CTranslate2: fp32 {row['optimized_speedup']['ctranslate2']:.2f}x, "
            f"int8 {row['optimized_int8_speedup']['ctranslate2_int8']:.2f}x"
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
    share = results["real_length_training"]["seqbert_fraction_of_matmul_peak"]
    print(f"seqbert training step: {100 * share:.1f}% of the matmul peak")
    mem = results["training_memory"]
    print(
        f"training step peak RSS: reference {mem['reference']['peak_rss_mib']:.0f} MiB, seqbert "
        f"{mem['seqbert']['peak_rss_mib']:.0f} MiB (ratio {mem['ratio']:.2f})"
    )


if __name__ == "__main__":
    run_cli(main, script_parser(BenchmarkArguments, __doc__))
