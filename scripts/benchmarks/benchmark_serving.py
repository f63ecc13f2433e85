#!/usr/bin/env python
"""The deploy routes of one saved SeqBERT folder (its ONNX and OpenVINO files, its CTranslate2 conversion, its BERT
export) timed against seqbert's own model in the same process, interleaved, on the batches `benchmark.py` uses: how
fast each route runs and how far its hidden states are from seqbert's. The default run takes about 2.5 minutes on 2 CPU
cores.

    python scripts/benchmarks/benchmark_serving.py [--threads 2] [--repeats 5] [--json_file benchmark_serving.json]

It needs the `integrations` extra (`pip install -e ".[integrations]"`: onnx, onnxscript, onnxruntime, OpenVINO,
CTranslate2).

The folder: the real MiniLM-L6 BERT weights as a SeqBERT folder (`SeqBertModel.from_bert_pretrained`, saved with its
tokenizer). Every route is built from that folder and pinned to `--threads` threads (torch, ONNX Runtime's intra-op
threads, OpenVINO's `INFERENCE_NUM_THREADS`, CTranslate2's `intra_threads`); the engine wrappers are
`benchmark_engines.py`'s:

- `seqbert`: `SeqBertModel.from_pretrained(folder)` in fp32, the reference of every ratio and delta;
  `seqbert_optimized`: `seqbert.optimize_for_cpu_inference(model)`; `seqbert_optimized_bf16`: the same with
  `dtype=torch.bfloat16`, only on CPUs with bf16 instructions (AVX512_BF16 or AMX; elsewhere oneDNN emulates bf16,
  slower than fp32);
- `onnxruntime`, `onnxruntime_optimized`, `onnxruntime_int8`: ONNX Runtime's CPU provider (all graph optimizations on)
  on the files `seqbert.serving_artifacts.save_serving_artifacts(folder, task="feature-extraction", optimize=True)`
  writes: `onnx/model.onnx`, `onnx/model_optimized.onnx` (onnxscript's fusions for ONNX Runtime) and
  `onnx/model_qint8_quantized.onnx`. The optimized graph's speed over the plain one is what the fusions gain;
- `openvino_default`, `openvino_f32`: OpenVINO on the `openvino/openvino_model.xml` it writes, compiled with no
  precision hint (what optimum-intel and sentence-transformers do: bf16 on CPUs with AVX512_BF16 or AMX) and pinned
  to f32 (`INFERENCE_PRECISION_HINT`); the precision it ran is read back from the compiled model;
- `ctranslate2`, `ctranslate2_int8`: CTranslate2's `TransformersConverter(folder)` through seqbert's registered loader
  (`seqbert.ctranslate2_loader`), float32, and int8 weights with the int8 compute type, fed ragged id lists;
- `bert_sdpa`: `seqbert.export_bert.save_as_bert(folder, ...)` loaded by transformers' `BertModel` (sdpa attention),
  what a BERT-only engine sees.

Workloads: `real_length`, Rotten Tomatoes snippets in `--num_batches` batches of 32 with dynamic padding
(`benchmark.real_length_batches`), and `long_256`, 8 convention speeches cut at `--long_length` tokens
(`benchmark.long_batches`, one batch). Each engine gets its own form of every batch before the clock starts and one
untimed pass; then the routes run in turn, `--repeats` times (`interleaved_timing.py`). Per route: real (non-padding)
tokens per second, the median and the slowest and fastest repeat; its speed over seqbert fp32's and over the fastest
seqbert route's; the max |delta| of last_hidden_state from seqbert fp32 on real tokens; the precision it ran. Also the
CPU (lscpu's avx512f, avx512_bf16 and amx flags, torch's CPU capability), the date, each engine's version and the time
each route took to build. `--quick` (one batch, one repeat, no long batch) is for the test.
"""

import datetime
import importlib.metadata
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import openvino
import torch
from ctranslate2.converters import TransformersConverter
from transformers import AutoTokenizer, BertModel

import seqbert
from seqbert.cpu_inference import bf16_instructions_available, bf16_linear_available
from seqbert.data import minilm_checkpoint_path
from seqbert.export_bert import save_as_bert
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json
from seqbert.serving_artifacts import (
    ONNX_INT8_PATH,
    ONNX_OPTIMIZED_PATH,
    ONNX_PATH,
    OPENVINO_PATH,
    save_serving_artifacts,
)


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # noqa: E402  (next to this script)
import benchmark_engines  # noqa: E402
from interleaved_timing import interleave, median_and_spread  # noqa: E402


@dataclass
class ServingBenchmarkArguments:
    threads: int = field(
        default_factory=torch.get_num_threads,
        metadata={"help": "Threads of every route (torch, ONNX Runtime, OpenVINO, CTranslate2); all cores by default."},
    )
    repeats: int = field(default=5, metadata={"help": "Interleaved timed repetitions per workload (median shown)."})
    num_batches: int = field(default=8, metadata={"help": "Batches of 32 snippets in the real-length workload."})
    long_length: int = field(
        default=256, metadata={"help": "Tokens per document of the long batch (8 speeches); 0 leaves it out."}
    )
    quick: bool = field(
        default=False, metadata={"help": "One batch, one repeat, no long batch: checks that every route runs."}
    )
    json_file: str | None = field(default="benchmark_serving.json", metadata={"help": "Where to write the results."})

    def __post_init__(self):
        for name in ("threads", "repeats", "num_batches"):
            if getattr(self, name) < 1:
                raise ScriptInputError(f"--{name} ({getattr(self, name)}) must be at least 1")
        if not 0 <= self.long_length <= 512:
            raise ScriptInputError(f"--long_length ({self.long_length}) must be 0 (no long batch) to 512, BERT's limit")


# Every route, in table order; `seqbert` is the reference. The bf16 route exists on CPUs with bf16 instructions only.
ROUTES = {
    "seqbert": "SeqBertModel (eager), the reference",
    "seqbert_optimized": "optimize_for_cpu_inference(model)",
    "seqbert_optimized_bf16": "optimize_for_cpu_inference(model, dtype=torch.bfloat16)",
    "onnxruntime": ONNX_PATH,
    "onnxruntime_optimized": ONNX_OPTIMIZED_PATH,
    "onnxruntime_int8": ONNX_INT8_PATH,
    "openvino_default": f"{OPENVINO_PATH}, no precision hint",
    "openvino_f32": f"{OPENVINO_PATH}, INFERENCE_PRECISION_HINT f32",
    "ctranslate2": "TransformersConverter(folder), float32",
    "ctranslate2_int8": "TransformersConverter(folder), int8",
    "bert_sdpa": "save_as_bert(folder) -> BertModel (sdpa)",
}
SEQBERT_ROUTES = ("seqbert", "seqbert_optimized", "seqbert_optimized_bf16")
# The packages whose versions go with the figures.
PACKAGES = ("seqbert", "torch", "transformers", "onnx", "onnxscript", "onnxruntime", "openvino", "ctranslate2")


def openvino_file_engine(xml_path: Path, threads: int, precision: str | None) -> benchmark_engines.Engine:
    """A saved OpenVINO model (`xml_path`, its `.bin` next to it) compiled for the CPU as
    `benchmark_engines.openvino_engine` compiles a converted `BertModel`: `threads` inference threads and the
    precision hint `precision` ("f32"), or none (`None`, OpenVINO's CPU default). The engine's `precision` is the one
    the compiled model reports."""
    config = {"INFERENCE_NUM_THREADS": threads}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = openvino.Core().compile_model(str(xml_path), "CPU", config)
    request = compiled.create_infer_request()
    hint = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # "f32", "bf16", "f16"
    output = compiled.output("last_hidden_state")

    def prepare(batch: dict) -> Callable[[], object]:
        feed = {name: batch[name].numpy() for name in benchmark_engines.ONNX_INPUTS}
        return lambda: request.infer(feed)[output]

    return benchmark_engines.Engine(
        prepare, lambda result, batch: torch.from_numpy(result.copy()), {"f32": "fp32", "f16": "fp16"}.get(hint, hint)
    )


def build_routes(root: Path, tokenizer, threads: int) -> tuple[dict[str, benchmark_engines.Engine], dict]:
    """The SeqBERT folder `root/seqbert` (MiniLM's weights and tokenizer) and every route built from it, at `threads`
    threads (torch's thread count must already be `threads`); also what building took: seconds per step, the
    serving files' own check deltas and onnxscript's fusions."""
    folder = root / "seqbert"
    seqbert.SeqBertModel.from_bert_pretrained(minilm_checkpoint_path()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    seconds = {}

    start = time.perf_counter()
    model = seqbert.SeqBertModel.from_pretrained(folder).eval()
    modules = {"seqbert": (model, "fp32"), "seqbert_optimized": (seqbert.optimize_for_cpu_inference(model), "fp32")}
    if bf16_instructions_available() and bf16_linear_available():
        modules["seqbert_optimized_bf16"] = (seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16), "bf16")
    engines = {name: benchmark_engines.torch_engine(module, precision) for name, (module, precision) in modules.items()}
    seconds["seqbert"] = time.perf_counter() - start

    start = time.perf_counter()
    artifacts = save_serving_artifacts(folder, task="feature-extraction", optimize=True)
    seconds["save_serving_artifacts"] = time.perf_counter() - start
    files = artifacts.files
    engines["onnxruntime"] = benchmark_engines.onnxruntime_engine(files["onnx"], threads)
    engines["onnxruntime_optimized"] = benchmark_engines.onnxruntime_engine(files["onnx_optimized"], threads)
    engines["onnxruntime_int8"] = benchmark_engines.onnxruntime_engine(files["onnx_int8"], threads, "int8")
    engines["openvino_default"] = openvino_file_engine(files["openvino"], threads, precision=None)
    engines["openvino_f32"] = openvino_file_engine(files["openvino"], threads, precision="f32")

    start = time.perf_counter()
    converter = TransformersConverter(str(folder))  # seqbert's loader, registered when seqbert was imported
    for quantization, name in (("float32", "ctranslate2"), ("int8", "ctranslate2_int8")):
        path = converter.convert(str(root / name), quantization=quantization)
        engines[name] = benchmark_engines.ctranslate2_engine(path, quantization, threads)
    seconds["ctranslate2_convert"] = time.perf_counter() - start

    start = time.perf_counter()
    bert = BertModel.from_pretrained(save_as_bert(folder, root / "bert"), attn_implementation="sdpa").eval()
    engines["bert_sdpa"] = benchmark_engines.torch_engine(bert)
    seconds["save_as_bert"] = time.perf_counter() - start

    built = {
        "build_seconds": seconds,
        "serving_artifacts_check_max_abs_delta": artifacts.max_abs_delta,
        "onnxscript_fusions": artifacts.fusions,
    }
    return {name: engines[name] for name in ROUTES if name in engines}, built


@torch.inference_mode()
def time_workload(name: str, batches: list[dict], engines: dict, repeats: int, threads: int) -> dict:
    """Every route on `batches`, interleaved `repeats` times after one untimed pass: tokens/s, ratios, deltas."""
    masks = [batch["attention_mask"].bool() for batch in batches]
    references = [engines["seqbert"](batch) for batch in batches]
    calls = {route: [engine.prepare(batch) for batch in batches] for route, engine in engines.items()}
    for route_calls in calls.values():  # first-call set-up (kernels for new shapes), untimed
        for call in route_calls:
            call()
    times = interleave({route: (lambda c=calls[route]: [call() for call in c]) for route in engines}, repeats)
    real = sum(int(mask.sum()) for mask in masks)
    fastest_seqbert = min(
        (r for r in SEQBERT_ROUTES if r in times), key=lambda r: median_and_spread(times[r])["seconds"]
    )
    routes = {}
    for route, engine in engines.items():
        summary = median_and_spread(times[route])
        delta = max(
            (engine(batch) - reference)[mask].abs().max().item()
            for batch, reference, mask in zip(batches, references, masks, strict=True)
        )
        routes[route] = summary | {
            "tokens_per_s": real / summary["seconds"],
            "tokens_per_s_spread": [real / summary["spread_seconds"][1], real / summary["spread_seconds"][0]],
            "max_abs_delta": delta,
            "precision": engine.precision,
        }
    for row in routes.values():
        row["speed_over_seqbert"] = routes["seqbert"]["seconds"] / row["seconds"]
        row["speed_over_fastest_seqbert"] = routes[fastest_seqbert]["seconds"] / row["seconds"]
    return {
        "workload": name,
        "threads": threads,
        "batches": [list(batch["input_ids"].shape) for batch in batches],
        "real_tokens": real,
        "padding_fraction": 1 - real / sum(mask.numel() for mask in masks),
        "fastest_seqbert_route": fastest_seqbert,
        # What onnxscript's fusions gain ONNX Runtime: the optimized file's speed over the plain one's.
        "onnx_fusion_gain": routes["onnxruntime"]["seconds"] / routes["onnxruntime_optimized"]["seconds"],
        "routes": routes,
    }


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(ServingBenchmarkArguments, __doc__), argv)
    if args.quick:
        args.repeats, args.num_batches, args.long_length = 1, 1, 0
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    workloads = {"real_length": benchmark.real_length_batches(tokenizer, args.num_batches)}
    if args.long_length:
        workloads[f"long_{args.long_length}"] = benchmark.long_batches(tokenizer, args.long_length, num_batches=1)
    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": benchmark.cpu_description(),
        "versions": {package: importlib.metadata.version(package) for package in PACKAGES},
        "threads": args.threads,
        "repeats": args.repeats,
        "routes": ROUTES,
    }
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            engines, built = build_routes(Path(tmp), tokenizer, args.threads)
            results |= built
            results["workloads"] = [
                time_workload(name, batches, engines, args.repeats, args.threads) for name, batches in workloads.items()
            ]
    finally:
        torch.set_num_threads(torch_threads)
    print_table(results)
    write_json(args.json_file, results)
    return results


def print_table(results: dict) -> None:
    cpu = results["cpu"]
    print(
        f"\n{results['date']}; CPU: {cpu['model_name']}; lscpu flags: avx512f {'yes' if cpu['avx512f'] else 'no'},"
        f" avx512_bf16 {'yes' if cpu['avx512_bf16'] else 'no'}, amx {' '.join(cpu['amx']) or 'no'};"
        f" torch CPU capability {cpu['torch_cpu_capability']}"
    )
    print("versions: " + ", ".join(f"{package} {version}" for package, version in results["versions"].items()))
    build = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in results["build_seconds"].items())
    print(f"build: {build}; onnxscript fusions: {results['onnxscript_fusions']}")
    print("routes: " + "; ".join(f"{name}: {what}" for name, what in results["routes"].items()))
    for row in results["workloads"]:
        count, lengths = len(row["batches"]), sorted({length for _, length in row["batches"]})
        sizes = sorted({size for size, _ in row["batches"]})
        shape = f"{'/'.join(map(str, sizes))} x {lengths[0]}" + (f" to {lengths[-1]}" if len(lengths) > 1 else "")
        print(
            f"\n{row['workload']}: {count} batch{'es' if count > 1 else ''} ({shape} tokens,"
            f" {100 * row['padding_fraction']:.0f}% padding),"
            f" {row['real_tokens']} real tokens, {row['threads']} threads, medians of {results['repeats']};"
            f" speed over seqbert fp32 and over the fastest seqbert route ({row['fastest_seqbert_route']});"
            " max |delta| from seqbert fp32 on real tokens"
        )
        print(
            f"  {'route':<24} {'precision':>9} {'tokens/s':>9} {'(min - max)':>17} {'x seqbert':>9} "
            f"{'x fastest':>9} {'max|delta|':>10}"
        )
        for name, route in row["routes"].items():
            low, high = route["tokens_per_s_spread"]
            print(
                f"  {name:<24} {route['precision']:>9} {route['tokens_per_s']:>9.0f} {f'({low:.0f} - {high:.0f})':>17}"
                f" {route['speed_over_seqbert']:>9.2f} {route['speed_over_fastest_seqbert']:>9.2f}"
                f" {route['max_abs_delta']:>10.1e}"
            )
        print(f"  onnxscript's fusions: onnx/model_optimized.onnx runs {row['onnx_fusion_gain']:.2f}x onnx/model.onnx")


if __name__ == "__main__":
    run_cli(main, script_parser(ServingBenchmarkArguments, __doc__))
