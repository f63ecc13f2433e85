#!/usr/bin/env python
"""How CPU inference speed holds as threads are added: seqbert's serving precisions and the engines a user could run
instead, at 1 and 2 threads (or `--threads`), on real-length batches; then again with torch, oneDNN and CTranslate2
held to AVX2 (AVX2's instruction semantics on this CPU: a correctness check, not an AVX2 CPU's speed). About
15 minutes on 2 cores (16 min on the Zen 4 of docs/benchmarks.md with `--no_avx2`).

    python scripts/benchmarks/benchmark_threads.py [--threads 1 2] [--repeats 7] [--num_batches 4]
        [--json_file benchmark_threads.json] [--no_avx2]

Models: MiniLM-L6 (real weights) and a seeded bert-base-width model with 4 layers (`benchmark.bert_base_folders`);
batches: `--num_batches` batches of 32 Rotten Tomatoes snippets padded to their longest (about half padding), as
`benchmark.py`'s real-length workload. Engines (`benchmark_engines.py`, each from the same checkpoint): transformers'
`BertModel` in fp32 and bf16; seqbert's eager `SeqBertModel` (the model the optimized copies are made from) and
`seqbert.optimize_for_cpu_inference` in fp32, bf16 and int8, timed on the first batch (`example_inputs`; each row
records the plan it measured at each thread count, `plan`); onnxruntime on the fused
export, fp32 and dynamic int8; OpenVINO pinned to f32 and at its default precision; CTranslate2 float32 and int8 at
the ISA it selects (AVX2 on the AMD CPUs with AVX-512 of the docs) and, where the CPU has AVX-512, pinned to it
(`CT2_FORCE_CPU_ISA=AVX512`: the `_avx512` rows).

**Each library runs in processes of its own, one per thread count**, as users run one: torch's engines, onnxruntime's,
OpenVINO's and CTranslate2's, each at each thread count, the processes taking turns, one pass over the batches per
engine per turn (the others idle, waiting on a pipe), `--repeats` rounds: interleaved against a noisy machine, yet no
engine shares a process with another library's threads or another thread count's. Why: the thread pools of one process
disturb each other. CTranslate2 ships a copy of GNU OpenMP whose calls land in the runtime torch computes with, and once
an encoder has run, that runtime manages more threads than there are cores, so it throttles its spinning (libgomp's
`GOMP_SPINCOUNT` logic) and every small parallel op pays a thread wake-up: on the 2-core machine of the docs,
seqbert's int8 MiniLM-L6 fell from about 28,000 to 18,000 tokens/s at 2 threads after one CTranslate2 call in the same
process, and CTranslate2's own 1-thread int8 encoder ran at half its speed beside a 2-thread one (`benchmark.py`, which
interleaves every engine in one process, carries these effects). The turns are 100 ms apart, so that the threads of
the process before have parked. And every process starts with glibc's allocator keeping freed memory
(`seqbert.script_utils.reuse_freed_memory`, what PyTorch's CPU guide gets from jemalloc or tcmalloc): otherwise an
engine's speed depends on what its process happened to allocate and free before (CTranslate2's int8 MiniLM-L6 ran at
8,000 or 15,700 tokens/s at one thread, depending on whether the process had converted a model first).

The order of the turns rotates by one each round, deterministically: round r starts with the r-th process (modulo
their number), and torch's process runs its engines from its r-th. The first engine of a turn pays the wake-up of a
thread pool that idled while the others ran, so every engine pays it in its share of the rounds rather than one engine
in all of them. The JSON records each round's order (`rounds`: the engines as run, `engine@threads`).

Per engine and thread count: real tokens per second (median, with the slowest and fastest round), and the speed-up
from the fewest to the most threads (ratio of the medians; its range pairs the slowest and fastest rounds).

Agreement: each engine's hidden states from its first (untimed) pass over the batches come back from its process and are
compared, on the real tokens, with seqbert's fp32 eager `SeqBertModel` on the same batches, computed once per model in
the parent process. An fp32 engine must stay within `FP32_MAX_ABS_DELTA` of it (1e-4 absolute). A bf16, fp16 or int8
engine moves hidden states as its precision does, so it is held to two looser bounds: the relative RMS error over the
real tokens, |got - expected| / |expected| (Frobenius norms), at most `LOW_PRECISION_MAX_RELATIVE_ERROR` (0.5), and each
sequence's mean-pooled embedding at a cosine similarity of at least `LOW_PRECISION_MIN_COSINE` (0.9) with the
reference's. Measured on the 2-core AMD EPYC of the docs (4 batches, both models, natively and held to AVX2,
2026-11-27): relative errors 0.003 to 0.023 at bert-base width and 0.006 to 0.31 on MiniLM-L6 (onnxruntime's int8 the
highest, 0.31 and cosine 0.929; seqbert's int8 0.15 and 0.983, CTranslate2's 0.08 to 0.09 and 0.989 to 0.991), against
1.06 and 1.23 for the reference with each sequence's tokens reversed (which mean-pooling cannot see: on the seeded
bert-base-width model every engine's mean-pooled cosine rounds to 1.0000); the fp32 engines' largest |delta| 6.2e-6. A
seqbert engine whose timed plan (`cpu_inference_plan`) ran the eager fp32 layers would not compute in its precision:
below fp32 that is a disagreement too (int8 and bf16 plans can no longer hold the eager layers; the check stays as a
guard). Each row records `max_abs_delta`, `relative_error` and `min_cosine` per thread count and
`agrees`; an engine that disagrees is printed as DISAGREES when found (before the timing) and in the tables, listed
under `disagreements` in the JSON, and the script exits with an error (`EngineDisagreement`) once the JSON is written.

The processes start together and import their libraries side by side, then build their engines one at a time while
the others wait idle: seqbert's engines time their implementations when they are built
(`seqbert.cpu_inference.measure_plan`), and two processes timing at once on 2 cores would each see the other's load
(where the timing rounds disagree, seqbert runs the default plan of the CPU class and says so; each row records which,
`plan_chosen_by`).

Optimized against eager: for each of seqbert's optimized engines, its speed over seqbert's own eager `SeqBertModel`
(fp32, the model it was made from) at each thread count, `vs_eager` (ratio of the medians: eager time over optimized
time, above 1.0 is faster) with `vs_eager_range`, the smallest and largest ratio of the two engines' times in the
same round (they run one after the other in one process, so each round pairs like with like); printed after the
tables, with the cells below 1.0 marked. fp32 targets 1.0 or more in every cell (where the eager layers are faster,
the optimized copy is the eager model); int8 and bf16 warn when they measure slower than the fp32 eager model. Every
row also records each round's seconds (`seconds`, one pass over the batches) as measured.

AVX2 (`--no_avx2` leaves it out): the worker processes start with `ATEN_CPU_CAPABILITY=avx2` (torch's kernels),
`ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN: seqbert's packed linears, torch's int8) and `CT2_FORCE_CPU_ISA=AVX2`
(CTranslate2), and without the bf16 engines (an AVX2 CPU has no bf16 instructions). Recorded: torch's capability and
the ISA oneDNN and CTranslate2 report under each setting. OpenVINO's CPU plugin reads `ONEDNN_MAX_CPU_ISA` for its own
copy of oneDNN but picks kernels and its default precision from the CPU's flags (under the cap its default bf16 fails
to compile), and onnxruntime reads no such variable: both keep their AVX-512 kernels there.

Results: `--json_file` and tables on stdout; the JSON names the CPU (`benchmark.cpu_description`).
"""

import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ctranslate2  # noqa: F401  (first: see the module docstring)
import numpy as np
import torch
from transformers import AutoTokenizer, BertModel

import seqbert
from seqbert.cpu_inference import bf16_linear_available
from seqbert.data import minilm_checkpoint_path
from seqbert.script_utils import (
    ScriptInputError,
    parse_arguments,
    reuse_freed_memory,
    run_cli,
    script_parser,
    write_json,
)


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # noqa: E402  (next to this script)
import benchmark_engines  # noqa: E402


AVX2_ENVIRONMENT = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "CT2_FORCE_CPU_ISA": "AVX2",
}
# The processes at each thread count: torch's engines share one (one OpenMP runtime, one thread team); every other
# engine has its own, as two engines of one library disturb each other (see the module docstring).
LIBRARIES = (
    "torch", "onnxruntime", "onnxruntime_int8", "openvino", "openvino_default", "ctranslate2", "ctranslate2_int8",
    "ctranslate2_avx512", "ctranslate2_int8_avx512",
)  # fmt: skip
# Engines pinned to a setting other than their default, by their process's environment: CTranslate2 selected AVX2 by
# default on the AMD CPUs with AVX-512 it was run on (its `CT2_VERBOSE=1` log), so it also runs pinned to AVX-512.
# Native setting only, and only on a CPU with AVX-512.
PINNED_ENVIRONMENT = {
    "ctranslate2_avx512": {"CT2_FORCE_CPU_ISA": "AVX512"},
    "ctranslate2_int8_avx512": {"CT2_FORCE_CPU_ISA": "AVX512"},
}
# Seconds between two processes' turns, for the idle library's spinning threads to park.
TURN_GAP = 0.1
# Agreement with seqbert's fp32 eager model (see the module docstring): an fp32 engine's largest |delta| over the real
# tokens' hidden states; a lower-precision engine's relative RMS error over them and its smallest cosine similarity of
# the sequences' mean-pooled embeddings.
FP32_MAX_ABS_DELTA = 1e-4
LOW_PRECISION_MAX_RELATIVE_ERROR = 0.5
LOW_PRECISION_MIN_COSINE = 0.9


class EngineDisagreement(RuntimeError):
    """An engine's outputs disagree with seqbert's fp32 eager model beyond its precision's tolerance."""


@dataclass
class ThreadsArguments:
    threads: list[int] = field(default_factory=lambda: [1, 2], metadata={"help": "Thread counts, fewest first."})
    repeats: int = field(default=7, metadata={"help": "Rounds per thread count (median shown)."})
    num_batches: int = field(default=4, metadata={"help": "Batches of 32 snippets."})
    libraries: list[str] = field(
        default_factory=lambda: list(LIBRARIES),
        metadata={
            "help": "The processes to run: torch's engines, or another engine.",
            "choices": LIBRARIES,
            "nargs": "+",
        },
    )
    avx2: bool = field(default=True, metadata={"help": "Also measure with torch, oneDNN and CTranslate2 held to AVX2."})
    json_file: str | None = field(default="benchmark_threads.json", metadata={"help": "Where to write the rows."})

    def __post_init__(self):
        if len(self.threads) < 2 or sorted(set(self.threads)) != self.threads or self.threads[0] < 1:
            raise ScriptInputError(f"--threads ({self.threads}) must be two or more increasing counts >= 1")
        if self.repeats < 1 or self.num_batches < 1:
            raise ScriptInputError(f"--repeats ({self.repeats}) and --num_batches ({self.num_batches}) must be >= 1")


def _build(library: str, count: int, folder: str, artifacts: dict, batches: list[dict], bf16: bool) -> tuple:
    """{engine: its timed calls, one per batch} of `library` at `count` threads, each run once (first-call set-up),
    and what the parent checks: `precisions` ({engine: precision}), `outputs` ({engine: its hidden states on the
    batches' real tokens from that first run, a (tokens, hidden) fp32 array}) and `eager_layers` ({seqbert engine:
    whether its timed plan kept the eager fp32 layers}), `plans` and `chosen_by` ({seqbert engine: its plan's
    summary, and "measurement" or why the CPU class's default plan ran})."""
    if library == "torch":
        torch.set_num_threads(count)
        bert = BertModel.from_pretrained(folder).eval()
        model = seqbert.SeqBertModel.from_bert_pretrained(folder).eval()
        example = batches[0]  # the optimized copies time their kernels on batches like these
        modules = {
            "transformers": (bert, "fp32"),
            "seqbert": (model, "fp32"),  # the eager model the optimized copies are made from (sdpa, unpadded)
            "seqbert_optimized": (seqbert.optimize_for_cpu_inference(model, example_inputs=example), "fp32"),
            "seqbert_optimized_int8": (
                seqbert.optimize_for_cpu_inference(model, int8=True, example_inputs=example),
                "int8",
            ),
        }
        if bf16 and bf16_linear_available():
            modules["transformers_bf16"] = (BertModel.from_pretrained(folder, dtype=torch.bfloat16).eval(), "bf16")
            modules["seqbert_optimized_bf16"] = (
                seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, example_inputs=example),
                "bf16",
            )
        engines = {name: benchmark_engines.torch_engine(m, precision) for name, (m, precision) in modules.items()}
        plans = {name: getattr(m, "cpu_inference_plan", None) for name, (m, _) in modules.items()}
        eager_layers = {name: plan.eager_layers for name, plan in plans.items() if plan is not None}
        plan_summaries = {name: plan.summary() for name, plan in plans.items() if plan is not None}
        chosen_by = {name: plan.measurements.get("chosen_by") for name, plan in plans.items() if plan is not None}
    else:
        eager_layers, plan_summaries, chosen_by = {}, {}, {}
        torch.set_num_threads(1)  # torch only prepares inputs here: it starts no OpenMP team of its own
        if library.startswith("onnxruntime"):
            int8 = library.endswith("_int8")
            path = artifacts["onnx_int8" if int8 else "onnx_fp32"]
            engines = {library: benchmark_engines.onnxruntime_engine(path, count, "int8" if int8 else "fp32")}
        elif library.startswith("openvino"):
            bert = BertModel.from_pretrained(folder).eval()
            precision = None if library == "openvino_default" else "f32"
            engines = {library: benchmark_engines.openvino_engine(bert, batches[0], count, precision)}
        else:
            quantization = "int8" if "_int8" in library else "float32"
            path = artifacts[f"ct2_{quantization}"]
            engines = {library: benchmark_engines.ctranslate2_engine(path, quantization, count)}
    calls = {name: [engine.prepare(batch) for batch in batches] for name, engine in engines.items()}
    outputs = {}
    for name, engine_calls in calls.items():
        states = [
            engines[name].padded(call(), batch)[batch["attention_mask"].bool()]
            for call, batch in zip(engine_calls, batches, strict=True)
        ]
        outputs[name] = torch.cat(states).float().numpy()
    precisions = {name: engine.precision for name, engine in engines.items()}
    found = {"precisions": precisions, "outputs": outputs, "eager_layers": eager_layers, "plans": plan_summaries}
    return calls, found | {"chosen_by": chosen_by}


def rotated(items: list, turn: int) -> list:
    """`items` starting from the one at `turn` (modulo their number): round `turn`'s order."""
    shift = turn % len(items)
    return items[shift:] + items[:shift]


def worker(library: str, count: int, folder: str, artifacts: dict, num_batches: int, bf16: bool, conn):
    """A process of one library at one thread count: loads its batches and says so, builds its engines when it is
    told to and sends their first run's outputs, then, each time it is sent a round number r, times one pass of each
    engine, in their order rotated to start from the r-th, until it is sent None."""
    reuse_freed_memory()  # every engine on the same allocator settings (see the module docstring)
    os.environ.update(PINNED_ENVIRONMENT.get(library, {}))  # read when the engine is built, not at import
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, num_batches)
    conn.send("loaded")
    conn.recv()  # the parent's turn to build (see the module docstring)
    with torch.inference_mode():
        calls, found = _build(library, count, folder, artifacts, batches, bf16)
        conn.send(found | {"isa": torch.backends.cpu.get_cpu_capability()})
        while (turn := conn.recv()) is not None:
            seconds = {}
            for name in rotated(list(calls), turn):
                start = time.perf_counter()
                for call in calls[name]:
                    call()
                seconds[name] = time.perf_counter() - start
            conn.send(seconds)  # in the order run


def _runs(library: str, native: bool) -> bool:
    """Whether `library` runs in this setting: the bf16 default and the pinned engines only natively, and pinning to
    AVX-512 only where the CPU has it."""
    if library == "openvino_default":
        return native
    if library in PINNED_ENVIRONMENT:
        return native and torch.backends.cpu.get_cpu_capability() == "AVX512"
    return True


def reference_outputs(folder: str, num_batches: int) -> dict:
    """seqbert's fp32 eager `SeqBertModel` from the BERT checkpoint `folder` on the workers' batches: its hidden
    states on the real tokens, a (tokens, hidden) fp32 tensor, and each sequence's number of real tokens."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, num_batches)
    model = seqbert.SeqBertModel.from_bert_pretrained(folder).eval()
    with torch.inference_mode():
        states = [
            model(**{name: batch[name] for name in benchmark_engines.ONNX_INPUTS}).last_hidden_state.float()[
                batch["attention_mask"].bool()
            ]
            for batch in batches
        ]
    lengths = [n for batch in batches for n in batch["attention_mask"].sum(1).tolist()]
    return {"states": torch.cat(states), "lengths": lengths}


def agreement(output: np.ndarray, reference: dict, precision: str, eager_layers: bool = False) -> dict:
    """How an engine's hidden states on the real tokens (`output`) compare with the reference's (`reference_outputs`):
    the largest |delta|, the relative RMS error (|delta| / |expected|, Frobenius norms), the smallest cosine similarity
    of the sequences' mean-pooled embeddings, and whether they agree within the tolerances of the engine's `precision`
    (see the module docstring); a lower-precision engine that runs the eager fp32 layers (`eager_layers`) does not."""
    expected, lengths = reference["states"], reference["lengths"]
    got = torch.from_numpy(output)
    if got.shape != expected.shape:
        return {
            "max_abs_delta": None,
            "relative_error": None,
            "min_cosine": None,
            "agrees": False,
            "shape": list(got.shape),
        }
    delta = (got - expected).abs().max().item()
    relative = ((got - expected).norm() / expected.norm()).item()
    pooled = [torch.stack([chunk.mean(0) for chunk in states.split(lengths)]) for states in (got, expected)]
    cosine = torch.nn.functional.cosine_similarity(*pooled).min().item()
    if precision == "fp32":
        agrees = delta <= FP32_MAX_ABS_DELTA
    else:
        agrees = (
            relative <= LOW_PRECISION_MAX_RELATIVE_ERROR and cosine >= LOW_PRECISION_MIN_COSINE and not eager_layers
        )
    found = {"max_abs_delta": delta, "relative_error": relative, "min_cosine": cosine, "agrees": bool(agrees)}
    return found | ({"eager_layers": True} if eager_layers else {})


@dataclass
class Measurement:
    """What `measure` found for one model: the `rows` (one per engine: speeds, agreement, plans), torch's CPU capability
    in the workers (`isa`), each round's order (`rounds`, `engine@threads` as run), and, per (engine, thread count),
    its hidden states on the real tokens from its first, untimed pass (`outputs`, a (tokens, hidden) fp32 array) and
    whether its timed plan kept the eager fp32 layers (`eager_layers`)."""

    rows: list[dict]
    isa: str
    rounds: list[list[str]]
    outputs: dict[tuple[str, int], np.ndarray]
    eager_layers: dict[tuple[str, int], bool]


def compare_outputs(
    model_name: str, outputs: dict, precisions: dict, eager_layers: dict, reference: dict
) -> dict[str, dict[int, dict]]:
    """{engine: {thread count: `agreement` of its `outputs` with `reference`}}, each disagreement printed (DISAGREES)
    as found. `outputs`, `precisions` and `eager_layers` are keyed by (engine, thread count), as `Measurement`'s."""
    agreements: dict = {}
    for (name, count), output in outputs.items():
        precision = precisions[name, count]
        found = agreement(output, reference, precision, eager_layers.get((name, count), False))
        agreements.setdefault(name, {})[count] = found
        if not found["agrees"]:
            print(f"DISAGREES: {model_name} {name} ({precision}) at {count} threads: {found}", flush=True)
    return agreements


def rechecked(measurement: Measurement, reference: dict) -> list[dict]:
    """`measurement`'s rows with their agreement (`agreement`, `agrees`) against another `reference`, computed from the
    outputs the engines gave (no engine runs again); disagreements printed as `measure` prints them."""
    precisions = {
        (row["engine"], int(count)): row["precision"] for row in measurement.rows for count in row["agreement"]
    }
    model_name = measurement.rows[0]["model"]
    agreements = compare_outputs(model_name, measurement.outputs, precisions, measurement.eager_layers, reference)
    return [row | _agreement_fields(agreements[row["engine"]]) for row in measurement.rows]


def _agreement_fields(by_count: dict[int, dict]) -> dict:
    return {
        "agreement": {count: _rounded(found) for count, found in by_count.items()},
        "agrees": all(found["agrees"] for found in by_count.values()),
    }


def measure(
    model_name: str,
    folder: str,
    artifacts: dict,
    args: ThreadsArguments,
    environment: dict,
    bf16: bool,
    reference: dict,
) -> Measurement:
    """Every engine of every library at each thread count, each (library, thread count) in its own process (started
    together, built one at a time), the processes taking turns in an order rotated each round; each engine's outputs
    compared with `reference` (`reference_outputs`) before the timing starts."""
    context = multiprocessing.get_context("spawn")
    saved = dict(os.environ)
    os.environ.update(environment)  # the workers' environment (spawned processes copy it)
    processes, pipes = {}, {}
    try:
        for count in args.threads:
            for library in (name for name in args.libraries if _runs(name, bf16)):
                parent, child = context.Pipe()
                arguments = (library, count, folder, artifacts, args.num_batches, bf16, child)
                processes[library, count] = context.Process(target=worker, args=arguments)
                processes[library, count].start()
                pipes[library, count] = parent
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for pipe in pipes.values():
        pipe.recv()  # loaded
    ready = {}
    for key, pipe in pipes.items():  # one at a time (see the module docstring)
        pipe.send("build")
        ready[key] = pipe.recv()
    plans: dict = {}  # seqbert engine -> {threads: the plan it measured, `CpuInferencePlan.summary()`}
    chosen_by: dict = {}  # seqbert engine -> {threads: "measurement", or why the class's default plan ran}
    outputs, precisions, eager_layers = {}, {}, {}  # keyed by (engine, thread count)
    for (_, count), answer in ready.items():
        for name, summary in answer["plans"].items():
            plans.setdefault(name, {})[count] = summary
            chosen_by.setdefault(name, {})[count] = answer["chosen_by"][name]
        for name, output in answer.pop("outputs").items():
            outputs[name, count] = output
            precisions[name, count] = answer["precisions"][name]
            eager_layers[name, count] = answer["eager_layers"].get(name, False)
    agreements = compare_outputs(model_name, outputs, precisions, eager_layers, reference)
    times: dict = {}
    rounds = []
    for turn in range(args.repeats):
        order = []
        for key in rotated(list(pipes), turn):
            time.sleep(TURN_GAP)
            pipes[key].send(turn)
            for name, seconds in pipes[key].recv().items():
                times.setdefault(name, {}).setdefault(key[1], []).append(seconds)
                order.append(f"{name}@{key[1]}")
        rounds.append(order)
    for key, pipe in pipes.items():
        pipe.send(None)
        processes[key].join()
    real = sum(reference["lengths"])
    rows = []
    for name, by_count in times.items():
        first, last = by_count[args.threads[0]], by_count[args.threads[-1]]
        rows.append(
            {
                "model": model_name,
                "engine": name,
                "precision": precisions[name, args.threads[0]],
                "tokens_per_s": {count: real / statistics.median(s) for count, s in by_count.items()},
                "tokens_per_s_range": {count: [real / max(s), real / min(s)] for count, s in by_count.items()},
                "speedup": statistics.median(first) / statistics.median(last),
                "speedup_range": [min(first) / max(last), max(first) / min(last)],
                **_agreement_fields(agreements[name]),
                **({"plan": plans[name], "plan_chosen_by": chosen_by[name]} if name in plans else {}),
                **(against_eager(by_count, times["seqbert"]) if name in plans and "seqbert" in times else {}),
                "seconds": by_count,
            }
        )
    isa = next(answer["isa"] for answer in ready.values())
    return Measurement(rows, isa, rounds, outputs, eager_layers)


def against_eager(optimized: dict[int, list[float]], eager: dict[int, list[float]]) -> dict:
    """An optimized engine's speed over seqbert's eager model, per thread count, from each engine's seconds per round
    (same process, same rounds): `vs_eager`, the eager model's median time over the optimized engine's, and
    `vs_eager_range`, the smallest and largest ratio of their times in the same round."""
    ratios = {
        count: [e / o for e, o in zip(eager[count], seconds, strict=True)] for count, seconds in optimized.items()
    }
    return {
        "vs_eager": {count: statistics.median(eager[count]) / statistics.median(s) for count, s in optimized.items()},
        "vs_eager_range": {count: [min(r), max(r)] for count, r in ratios.items()},
    }


def _rounded(found: dict) -> dict:
    return {key: float(f"{value:.3g}") if isinstance(value, float) else value for key, value in found.items()}


def disagreements(result: dict) -> list[str]:
    """The engines of `result` (`main`'s) that disagree with the reference, one line each."""
    return [
        f"{setting}: {row['model']} {row['engine']} ({row['precision']}): {row['agreement']}"
        for setting, found in result["settings"].items()
        for row in found["rows"]
        if not row["agrees"]
    ]


def finish(result: dict, json_file: str | None) -> dict:
    """Write `result` (with its `disagreements`) to `json_file`; then raise `EngineDisagreement` if any engine
    disagrees, so that the script exits with an error, else return `result`."""
    result["disagreements"] = disagreements(result)
    write_json(json_file, result)
    if result["disagreements"]:
        lines = "\n".join(result["disagreements"])
        print(f"\nDISAGREEMENT with seqbert's fp32 eager model:\n{lines}", flush=True)
        raise EngineDisagreement(
            f"{len(result['disagreements'])} engine run(s) disagree with seqbert's fp32 eager model (tolerances: fp32 "
            f"max |delta| <= {FP32_MAX_ABS_DELTA}; else relative error <= {LOW_PRECISION_MAX_RELATIVE_ERROR} and "
            f"mean-pooled cosine >= {LOW_PRECISION_MIN_COSINE}, computing in that precision):\n{lines}"
        )
    return result


def onednn_isa(environment: dict) -> str:
    """The ISA oneDNN dispatches to in a fresh process with `environment` (its verbose header)."""
    code = "import torch; torch.ops.mkldnn._linear_pointwise(torch.randn(8, 64), "
    code += "torch.ops.mkldnn._reorder_linear_weight(torch.randn(64, 64), None), None, 'none', [], '')"
    result = _probe(code, environment | {"ONEDNN_VERBOSE": "1"})
    match = re.search(r"isa:([^,\n]+)", result)
    return match.group(1).strip() if match else "unknown"


def ctranslate2_isa(environment: dict) -> str:
    """The ISA CTranslate2 selects in a fresh process with `environment`: it logs its CPU configuration when it first
    builds a model, even one that fails to load."""
    code = "import ctranslate2\ntry:\n    ctranslate2.Encoder('/nonexistent')\nexcept RuntimeError:\n    pass"
    match = re.search(r"Selected ISA:\s*(\S+)", _probe(code, environment | {"CT2_VERBOSE": "1"}))
    return match.group(1) if match else "unknown"


def _probe(code: str, environment: dict) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | environment)
    return result.stdout + result.stderr


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(ThreadsArguments, __doc__), argv)
    settings = {"native": {}} | ({"avx2": AVX2_ENVIRONMENT} if args.avx2 else {})
    result = {"cpu": benchmark.cpu_description(), "threads": args.threads, "repeats": args.repeats, "settings": {}}
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    sample = benchmark.real_length_batches(tokenizer, 1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        _, base_4_layers, _ = benchmark.bert_base_folders(tmp)
        tokenizer.save_pretrained(base_4_layers)  # CTranslate2's converter reads the vocabulary from the folder
        models = {"MiniLM-L6": str(minilm_checkpoint_path()), "bert-base width, 4 layers": base_4_layers}
        artifacts = {}
        for model_name, folder in models.items():
            where = Path(tmp) / model_name.replace(" ", "_").replace(",", "")
            where.mkdir()
            onnx_fp32, onnx_int8, _ = benchmark_engines.export_fused_onnx(folder, sample, where)
            artifacts[model_name] = {"onnx_fp32": onnx_fp32, "onnx_int8": onnx_int8} | {
                f"ct2_{q}": benchmark_engines.convert_ctranslate2(folder, where, q) for q in ("float32", "int8")
            }
        references = {name: reference_outputs(folder, args.num_batches) for name, folder in models.items()}
        for setting, environment in settings.items():
            rows, torch_isa, rounds = [], None, {}
            for model_name, folder in models.items():
                measurement = measure(
                    model_name,
                    folder,
                    artifacts[model_name],
                    args,
                    environment,
                    bf16=setting == "native",
                    reference=references[model_name],
                )
                rows += measurement.rows
                torch_isa, rounds[model_name] = measurement.isa, measurement.rounds
            isa = {"torch": torch_isa, "onednn": onednn_isa(environment), "ctranslate2": ctranslate2_isa(environment)}
            result["settings"][setting] = {"environment": environment, "isa": isa, "rows": rows, "rounds": rounds}
            print_table(setting, isa, rows)
    return finish(result, args.json_file)


def print_table(setting: str, isa: dict, rows: list[dict]) -> None:
    print(f"\n{setting}: ISA {isa}")
    for row in rows:
        rates = " / ".join(f"{rate:,.0f}" for rate in row["tokens_per_s"].values())
        low, high = row["speedup_range"]
        found = list(row["agreement"].values())
        deltas = [f["max_abs_delta"] for f in found if f["max_abs_delta"] is not None]
        errors = [f["relative_error"] for f in found if f["relative_error"] is not None]
        cosines = [f["min_cosine"] for f in found if f["min_cosine"] is not None]
        check = (
            f"max |delta| {max(deltas):.2g}, rel. error {max(errors):.2g}, min cos {min(cosines):.4f}"
            if deltas
            else "shapes differ"
        )
        print(
            f"{row['model']:<26} {row['engine']:<24} {row['precision']:<5} {rates:>17} tokens/s  "
            f"x{row['speedup']:.2f} [{low:.2f}-{high:.2f}]  {check}" + ("" if row["agrees"] else "  DISAGREES")
        )
    ratios = [row for row in rows if "vs_eager" in row]
    if ratios:
        print("optimized / eager (seqbert's eager SeqBertModel, fp32), per thread count [range over the rounds]:")
    for row in ratios:
        cells = []
        for count, ratio in row["vs_eager"].items():
            low, high = row["vs_eager_range"][count]
            cells.append(f"{count}: {ratio:.2f}x [{low:.2f}-{high:.2f}]" + (" BELOW 1.0" if ratio < 1.0 else ""))
        print(f"  {row['model']:<26} {row['engine']:<24} {row['precision']:<5} " + "  ".join(cells))


if __name__ == "__main__":
    run_cli(main, script_parser(ThreadsArguments, __doc__))
