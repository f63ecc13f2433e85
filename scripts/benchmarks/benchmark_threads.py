#!/usr/bin/env python
"""How CPU inference speed holds as threads are added: seqbert's serving precisions and the engines a user could run
instead, at 1 and 2 threads (or `--threads`), on real-length batches; then again with torch, oneDNN and CTranslate2
held to AVX2 (a laptop-class CPU). About 15 minutes on 2 cores.

    python scripts/benchmarks/benchmark_threads.py [--threads 1 2] [--repeats 7] [--num_batches 4]
        [--json_file benchmark_threads.json] [--no_avx2]

Models: MiniLM-L6 (real weights) and a seeded bert-base-width model with 4 layers (`benchmark.bert_base_folders`);
batches: `--num_batches` batches of 32 Rotten Tomatoes snippets padded to their longest (about half padding), as
`benchmark.py`'s real-length workload. Engines (`benchmark_engines.py`, each from the same checkpoint): transformers'
`BertModel` in fp32 and bf16; `seqbert.optimize_for_cpu_inference` in fp32, bf16 and int8; onnxruntime on the fused
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

Per engine and thread count: real tokens per second (median, with the slowest and fastest round), and the speed-up
from the fewest to the most threads (ratio of the medians; its range pairs the slowest and fastest rounds).

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


def _build(library: str, count: int, folder: str, artifacts: dict, batches: list[dict], bf16: bool) -> dict:
    """{engine: its timed calls, one per batch} of `library` at `count` threads, each run once (first-call set-up)."""
    if library == "torch":
        torch.set_num_threads(count)
        bert = BertModel.from_pretrained(folder).eval()
        model = seqbert.SeqBertModel.from_bert_pretrained(folder).eval()
        modules = {
            "transformers": (bert, "fp32"),
            "seqbert_optimized": (seqbert.optimize_for_cpu_inference(model), "fp32"),
            "seqbert_optimized_int8": (seqbert.optimize_for_cpu_inference(model, int8=True), "int8"),
        }
        if bf16 and bf16_linear_available():
            modules["transformers_bf16"] = (BertModel.from_pretrained(folder, dtype=torch.bfloat16).eval(), "bf16")
            modules["seqbert_optimized_bf16"] = (
                seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16),
                "bf16",
            )
        engines = {name: benchmark_engines.torch_engine(m, precision) for name, (m, precision) in modules.items()}
    else:
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
    for engine_calls in calls.values():
        for call in engine_calls:
            call()
    return calls, {name: engine.precision for name, engine in engines.items()}


def worker(library: str, count: int, folder: str, artifacts: dict, num_batches: int, bf16: bool, conn):
    """A process of one library at one thread count: builds its engines, then times one pass of each whenever it is
    sent True, until it is sent None."""
    reuse_freed_memory()  # every engine on the same allocator settings (see the module docstring)
    os.environ.update(PINNED_ENVIRONMENT.get(library, {}))  # read when the engine is built, not at import
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, num_batches)
    with torch.inference_mode():
        calls, precisions = _build(library, count, folder, artifacts, batches, bf16)
        conn.send({"precisions": precisions, "isa": torch.backends.cpu.get_cpu_capability()})
        while conn.recv() is not None:
            seconds = {}
            for name, engine_calls in calls.items():
                start = time.perf_counter()
                for call in engine_calls:
                    call()
                seconds[name] = time.perf_counter() - start
            conn.send(seconds)


def _runs(library: str, native: bool) -> bool:
    """Whether `library` runs in this setting: the bf16 default and the pinned engines only natively, and pinning to
    AVX-512 only where the CPU has it."""
    if library == "openvino_default":
        return native
    if library in PINNED_ENVIRONMENT:
        return native and torch.backends.cpu.get_cpu_capability() == "AVX512"
    return True


def measure(model_name: str, folder: str, artifacts: dict, args: ThreadsArguments, environment: dict, bf16: bool):
    """Every engine of every library at each thread count, each (library, thread count) in its own process, the
    processes taking turns."""
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
    ready = {key: pipe.recv() for key, pipe in pipes.items()}
    times: dict = {}
    for _ in range(args.repeats):
        for (_, count), pipe in pipes.items():
            time.sleep(TURN_GAP)
            pipe.send(True)
            for name, seconds in pipe.recv().items():
                times.setdefault(name, {}).setdefault(count, []).append(seconds)
    for key, pipe in pipes.items():
        pipe.send(None)
        processes[key].join()
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, args.num_batches)
    real = sum(batch["attention_mask"].sum().item() for batch in batches)
    precisions = {name: p for answer in ready.values() for name, p in answer["precisions"].items()}
    rows = []
    for name, by_count in times.items():
        first, last = by_count[args.threads[0]], by_count[args.threads[-1]]
        rows.append(
            {
                "model": model_name,
                "engine": name,
                "precision": precisions[name],
                "tokens_per_s": {count: real / statistics.median(s) for count, s in by_count.items()},
                "tokens_per_s_range": {count: [real / max(s), real / min(s)] for count, s in by_count.items()},
                "speedup": statistics.median(first) / statistics.median(last),
                "speedup_range": [min(first) / max(last), max(first) / min(last)],
            }
        )
    return rows, next(answer["isa"] for answer in ready.values())


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
        for setting, environment in settings.items():
            rows, torch_isa = [], None
            for model_name, folder in models.items():
                model_rows, torch_isa = measure(
                    model_name, folder, artifacts[model_name], args, environment, bf16=setting == "native"
                )
                rows += model_rows
            isa = {"torch": torch_isa, "onednn": onednn_isa(environment), "ctranslate2": ctranslate2_isa(environment)}
            result["settings"][setting] = {"environment": environment, "isa": isa, "rows": rows}
            print_table(setting, isa, rows)
    write_json(args.json_file, result)
    return result


def print_table(setting: str, isa: dict, rows: list[dict]) -> None:
    print(f"\n{setting}: ISA {isa}")
    for row in rows:
        rates = " / ".join(f"{rate:,.0f}" for rate in row["tokens_per_s"].values())
        low, high = row["speedup_range"]
        print(
            f"{row['model']:<26} {row['engine']:<24} {row['precision']:<5} {rates:>17} tokens/s  "
            f"x{row['speedup']:.2f} [{low:.2f}-{high:.2f}]"
        )


if __name__ == "__main__":
    run_cli(main, script_parser(ThreadsArguments, __doc__))
