#!/usr/bin/env python
"""Benchmark seqbert against transformers' own BERT classes holding identical weights, in one process, interleaved.
With --repeats 5 it took 20 minutes on 2 CPU cores (2026-11-23); the default 3 repeats take less.

    python scripts/benchmark.py [--repeats 3] [--json_file benchmark.json]

Workloads (fp32, all cores, `torch.inference_mode` for inference):

- `dense_inference`: bert-base width (`BertConfig()`, seeded), `BertModel` vs `SeqBertModel`, a batch of 8 x 128
  real tokens (Rotten Tomatoes text cut into blocks), no padding;
- `real_length_inference`: the same models on Rotten Tomatoes snippets in batches of 32 with dynamic padding
  (`DataCollatorWithPadding`), as a classifier sees them;
- `real_length_training`: `BertForSequenceClassification` vs `SeqBertForSequenceClassification` (dropout 0, so both
  see the same computation), forward + backward + AdamW step on those batches, each model with its own optimizer;
- `padding_free_mlm_training`: masked-LM training steps of one model (`SeqBertForMaskedLM`, bert-base width, 4
  layers, dropout 0) on the same masked snippets, padded per batch ("reference") or packed into one row per batch
  without padding (`DataCollatorWithFlattening`, "seqbert"): what `run_mlm.py --padding_free` buys over
  `--line_by_line`. The masks are drawn once, so both see the same tokens and the losses agree;
- `generation`: greedy and beam-4, 32 new tokens, MiniLM-size BERT2BERT (`EncoderDecoderModel` vs
  `SeqBertForConditionalGeneration`), batch 8 (`scripts/benchmark_generation.py`, cached rows);
- `training_memory`: peak RSS during the training step (the real-length batches, once), one fresh process per model,
  with the peak reset after the model, optimizer and batches are built (`VmHWM` of /proc/self/status).

Each timed workload runs reference, seqbert, reference, seqbert, ... `--repeats` times; the table shows medians. Per
workload: real (non-padding) tokens per second for both (generated tokens for generation), the ratio seqbert /
reference, the max |delta| between the two outputs on real tokens (hidden states, logits or losses; for generation
whether the ids are identical), and the fraction of this machine's fp32 matmul peak (a 2048^3 `torch.mm`, measured in
the same run) that seqbert reaches, counting 2 FLOPs per multiply-add of the linear layers on real tokens and of
attention on the padded length (x3 for training).
"""

import gc
import json
import statistics
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
    DataCollatorWithPadding,
)

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import script_parser


@dataclass
class BenchmarkArguments:
    repeats: int = field(default=3, metadata={"help": "Interleaved timed repetitions per workload (median shown)."})
    num_batches: int = field(default=8, metadata={"help": "Batches of 32 snippets in the real-length workloads."})
    json_file: str | None = field(default="benchmark.json", metadata={"help": "Where to write the results."})
    skip_generation: bool = field(default=False, metadata={"help": "Leave out the generation workload."})
    memory_probe: str | None = field(
        default=None, metadata={"help": "Internal: 'reference' or 'seqbert', measure one training step's peak RSS."}
    )


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    """fp32 GFLOP/s of the best of `repeats` (size x size) @ (size x size) products on all cores."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def encoder_flops(config, batches: list[dict]) -> float:
    """Forward FLOPs of a BERT encoder on `batches`: linear layers on real tokens, attention on the padded length."""
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    total = 0.0
    for batch in batches:
        real = batch["attention_mask"].sum().item()
        size, length = batch["attention_mask"].shape
        total += 2 * real * layers * (4 * hidden * hidden + 2 * hidden * inner)  # QKV, output, FFN up and down
        total += 2 * layers * size * length * length * 2 * hidden  # QK^T and PV
    return total


def bert_base_folders(tmp: str) -> tuple[str, str]:
    """Seeded bert-base-size `BertModel` and `BertForSequenceClassification` (dropout 0) saved as BERT checkpoints."""
    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(f"{tmp}/base")
    torch.manual_seed(0)
    config = BertConfig(num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertForSequenceClassification(config).save_pretrained(f"{tmp}/cls")
    return f"{tmp}/base", f"{tmp}/cls"


def real_length_batches(tokenizer, num_batches: int, batch_size: int = 32) -> list[dict]:
    """Rotten Tomatoes snippets, batches of `batch_size` padded to their longest (`DataCollatorWithPadding`)."""
    snippets = load_rotten_tomatoes()["validation"].select(range(num_batches * batch_size))
    encoded = tokenizer(list(snippets["text"]), truncation=True, max_length=128)
    collator = DataCollatorWithPadding(tokenizer)
    labels = list(snippets["label"])
    batches = []
    for start in range(0, len(labels), batch_size):
        features = [
            {"input_ids": encoded["input_ids"][i], "attention_mask": encoded["attention_mask"][i], "labels": labels[i]}
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
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def interleave(workers: dict, repeats: int) -> dict[str, float]:
    """Run `workers` (label -> callable) in turn, `repeats` times; median seconds per label."""
    times = {label: [] for label in workers}
    for _ in range(repeats):
        for label, work in workers.items():
            times[label].append(_timed(work))
    return {label: statistics.median(values) for label, values in times.items()}


@torch.inference_mode()
def inference_workload(reference, model, batches, repeats) -> dict:
    masks = [b["attention_mask"].bool() for b in batches]
    inputs = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    delta = max(
        (reference(**x).last_hidden_state - model(**x).last_hidden_state)[m].abs().max().item()
        for x, m in zip(inputs, masks, strict=True)
    )
    seconds = interleave(
        {"reference": lambda: [reference(**x) for x in inputs], "seqbert": lambda: [model(**x) for x in inputs]},
        repeats,
    )
    return {"seconds": seconds, "real_tokens": sum(m.sum().item() for m in masks), "max_abs_delta": delta}


def training_steps(model, batches, losses: list):
    """A function that runs one AdamW step (lr 1e-5) of `model` per batch and appends each loss to `losses`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def run():
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

    return run


def training_workload(cls_folder: str, batches, repeats) -> dict:
    reference = BertForSequenceClassification.from_pretrained(cls_folder).train()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
    losses = {"reference": [], "seqbert": []}
    runs = {
        "reference": training_steps(reference, batches, losses["reference"]),
        "seqbert": training_steps(model, batches, losses["seqbert"]),
    }
    seconds = interleave(runs, repeats)
    delta = max(abs(a - b) for a, b in zip(losses["reference"], losses["seqbert"], strict=True))
    real = sum(b["attention_mask"].sum().item() for b in batches)
    return {"seconds": seconds, "real_tokens": real, "max_abs_delta": delta, "compared": "loss at every step"}


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
    seconds = interleave(runs, repeats)
    delta = max(abs(a - b) for a, b in zip(losses["reference"], losses["seqbert"], strict=True))
    real = sum(b["attention_mask"].sum().item() for b in batches)
    return {"seconds": seconds, "real_tokens": real, "max_abs_delta": delta, "compared": "loss at every step"}


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
        _, cls_folder = bert_base_folders(tmp)
        if which == "reference":
            model = BertForSequenceClassification.from_pretrained(cls_folder).train()
        else:
            model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
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
    (args,) = script_parser(BenchmarkArguments, __doc__).parse_args_into_dataclasses(args=argv)
    if args.memory_probe is not None:
        memory_probe(args.memory_probe, args.num_batches)
        return {}
    torch.manual_seed(0)
    peak = matmul_peak_gflops()
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = real_length_batches(tokenizer, args.num_batches)
    dense = [dense_batch(tokenizer)]
    results = {"machine": {"threads": torch.get_num_threads(), "fp32_matmul_peak_gflops": peak}}
    with tempfile.TemporaryDirectory() as tmp:
        base_folder, cls_folder = bert_base_folders(tmp)
        reference = BertModel.from_pretrained(base_folder).eval()
        model = seqbert.SeqBertModel.from_bert_pretrained(base_folder).eval()
        flops = {"dense_inference": encoder_flops(model.config, dense)}
        flops["real_length_inference"] = encoder_flops(model.config, batches)
        flops["real_length_training"] = 3 * flops["real_length_inference"]
        results["dense_inference"] = inference_workload(reference, model, dense, args.repeats)
        results["real_length_inference"] = inference_workload(reference, model, batches, args.repeats)
        del reference, model
        results["real_length_training"] = training_workload(cls_folder, batches, args.repeats)
    results["padding_free_mlm_training"] = padding_free_workload(batches, args.repeats)
    padding = 1 - sum(b["attention_mask"].sum().item() for b in batches) / sum(
        b["attention_mask"].numel() for b in batches
    )
    results["real_length_inference"]["padding_fraction"] = padding
    for name in (*flops, "padding_free_mlm_training"):
        row = results[name]
        row["reference_tokens_per_s"] = row["real_tokens"] / row["seconds"]["reference"]
        row["seqbert_tokens_per_s"] = row["real_tokens"] / row["seconds"]["seqbert"]
        row["ratio"] = row["seconds"]["reference"] / row["seconds"]["seqbert"]
        if name in flops:
            row["seqbert_fraction_of_matmul_peak"] = flops[name] / row["seconds"]["seqbert"] / 1e9 / peak
    if not args.skip_generation:
        sys.path.insert(0, str(Path(__file__).parent))
        import benchmark_generation

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

    print(f"\n{torch.get_num_threads()} threads, fp32 matmul peak {peak:.0f} GFLOP/s, medians of {args.repeats}")
    print(
        f"{'workload':<24} {'reference tok/s':>16} {'seqbert tok/s':>14} {'ratio':>6} {'max|delta|':>11} {'% peak':>7}"
    )
    for name, row in results.items():
        if "ratio" not in row or name == "training_memory":
            continue
        delta = row.get("max_abs_delta", "same ids" if row.get("identical_ids") else "DIFFERENT")
        delta = f"{delta:.1e}" if isinstance(delta, float) else delta
        share = row.get("seqbert_fraction_of_matmul_peak")
        share = f"{100 * share:.1f}" if share is not None else "-"
        print(
            f"{name:<24} {row['reference_tokens_per_s']:>16.0f} {row['seqbert_tokens_per_s']:>14.0f} "
            f"{row['ratio']:>6.2f} {delta:>11} {share:>7}"
        )
    mem = results["training_memory"]
    print(
        f"training step peak RSS: reference {mem['reference']['peak_rss_mib']:.0f} MiB, seqbert "
        f"{mem['seqbert']['peak_rss_mib']:.0f} MiB (ratio {mem['ratio']:.2f})"
    )
    print(f"real-length batches: {100 * padding:.0f}% padding")
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
