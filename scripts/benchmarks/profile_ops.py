#!/usr/bin/env python
"""Where the time goes, op by op: seqbert next to the fastest other engine, each with its own profiler, on the
workloads where `benchmark.py` finds seqbert behind (or where its target is not met). About 15 minutes on 2 cores.

    python scripts/benchmarks/profile_ops.py [--threads 2] [--json_file profile_ops.json]

- `long_512`: MiniLM-L6 (real weights) on the first 24 convention speeches cut at 512 tokens, batches of 8, as
  `benchmark.py` times it: `optimize_for_cpu_inference(model, dtype=torch.bfloat16)` (`torch.profiler`) next to
  OpenVINO at its default precision (its per-node counters, `PERF_COUNT`), and `optimize_for_cpu_inference(model,
  int8=True)` next to onnxruntime's dynamic int8 of the fused graph (its own profiler, `enable_profiling`);
- `int8_real_length`: int8 forwards of MiniLM-L6 (real weights) and a seeded bert-base-width model with 4 layers on
  4 real-length batches (32 Rotten Tomatoes snippets), at each of `--thread_counts`: `optimize_for_cpu_inference(model,
  int8=True)` op by op (`torch.profiler`), the time its activation quantization takes (timed whole), and its wall
  time beside CTranslate2's int8 `Encoder` on the same batches
  (CTranslate2's Python API has no per-op profiler: its total only; timed after every seqbert measurement, not
  interleaved, see `int8_real_length`);
- `training`: bert-base-size training steps (4 real-length batches, `Trainer`'s default fused AdamW), fp32 and under
  `torch.autocast("cpu", dtype=torch.bfloat16)` as `Trainer --bf16` runs on a CPU, seqbert next to transformers'
  `BertForSequenceClassification` on the same weights: wall time of the forward, the backward and the optimizer
  step apart (interleaved, medians), and each phase op by op (`torch.profiler`), with autocast's casts, the unpadded
  path's gathers and scatters, attention, LayerNorm, GELU and AdamW in groups of their own.

Each engine's operators are summed into the same few groups (matrix products, attention, LayerNorm, casts and copies,
gathers, element-wise, the optimizer, the rest), in milliseconds per pass over the workload and as shares. Profilers
add their own overhead, so the totals are larger than `benchmark.py`'s timings; the shares are what to read. It needs
the `integrations` extra (onnxruntime, OpenVINO).
"""

import collections
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import profile, record_function
from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

import seqbert
from seqbert.cpu_inference import bf16_linear_available, linear_kernels
from seqbert.data import minilm_checkpoint_path
from seqbert.script_utils import parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # noqa: E402  (next to this script)
import benchmark_engines  # noqa: E402
from interleaved_timing import interleave, median_and_spread, timed  # noqa: E402


SECTIONS = ("long_512", "int8_real_length", "training")


@dataclass
class ProfileArguments:
    threads: int = field(default=2, metadata={"help": "Threads of every engine on the long_512 workload."})
    thread_counts: list[int] = field(
        default_factory=lambda: [1, 2], metadata={"help": "Thread counts of the int8_real_length section."}
    )
    sections: list[str] = field(
        default_factory=lambda: list(SECTIONS), metadata={"help": f"Which sections to run, of {', '.join(SECTIONS)}."}
    )
    repeats: int = field(default=5, metadata={"help": "Interleaved timed repetitions (medians and spread)."})
    json_file: str | None = field(default="profile_ops.json", metadata={"help": "Where to write the groups."})

    def __post_init__(self):
        unknown = [name for name in self.sections if name not in SECTIONS]
        if unknown:
            raise ValueError(f"sections {unknown} unknown; allowed: {', '.join(SECTIONS)}")
        if not self.thread_counts or min(self.thread_counts) < 1:
            raise ValueError(f"thread_counts ({self.thread_counts}) must be integers >= 1")
        if self.repeats < 1:
            raise ValueError(f"repeats ({self.repeats}) must be at least 1")


# Operator names (torch's aten ops, onnxruntime's and OpenVINO's node types), lower-cased, to groups; first match wins.
# onnxruntime's fused `Attention` / `QAttention` node also computes the query/key/value projection, so it has a group of
# its own; OpenVINO's `Subgraph` nodes (its "snippets") hold the fused MatMul-Softmax-MatMul of attention here.
GROUPS = (
    ("QKV projection + attention, one node", r"^q?attention$"),
    (
        "matrix products",
        r"^aten::(mm|addmm|linear)$|linear_pointwise|matmulinteger|dynamicquantizematmul|fullyconnected|gemm|^matmul$",
    ),
    ("attention", r"attention|sdpa|softmax|^aten::bmm$|^subgraph$"),
    ("layer norm", r"layer_?norm|^mvn$"),
    ("casts and copies", r"copy|^convert$|reorder|cast|contiguous|clone|transpose"),
    ("gathers and scatters", r"index|gather|scatter|embedding"),
    ("optimizer", r"adam|zero_grad|optimizer"),
    ("fill", r"fill|zero"),
    ("GELU", r"gelu"),
    ("quantization", r"quantize|aminmax|round"),
    ("element-wise", r"add|mul|div|sub|eltwise|erf|tanh|where|masked|bitwise"),
)
# The phases of a training step, as `training_phases` marks them (`torch.profiler.record_function`).
PHASES = ("forward", "backward", "optimizer")


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, pattern in GROUPS if re.search(pattern, lowered)), "the rest")


def torch_groups(run, passes: int = 2) -> dict[str, float]:
    """Self CPU milliseconds per pass of `run` under `torch.profiler`, summed by group (after one untimed pass)."""
    run()
    with profile() as prof:
        for _ in range(passes):
            run()
    totals = collections.Counter()
    for event in prof.key_averages():
        totals[group_of(event.key)] += event.self_cpu_time_total / 1e3 / passes
    return dict(totals)


def onnxruntime_groups(path: Path, batches: list[dict], threads: int, tmp: str, passes: int = 2) -> dict[str, float]:
    """Milliseconds per pass over `batches` of each node type (onnxruntime's own profiler), summed by group."""
    session = benchmark_engines.onnxruntime_session(
        path, threads, profile_prefix=str(Path(tmp) / "onnxruntime_profile")
    )
    feeds = [{name: b[name].numpy() for name in benchmark_engines.ONNX_INPUTS} for b in batches]
    for feed in feeds:  # set-up, not counted: the events carry their pass
        session.run(None, feed)
    skip = len(feeds)
    for _ in range(passes):
        for feed in feeds:
            session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    first_counted = runs[skip]["ts"] if len(runs) > skip else 0
    totals = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= first_counted:
            totals[group_of(event["args"]["op_name"])] += event["dur"] / 1e3 / passes
    return dict(totals)


def openvino_groups(bert: BertModel, batches: list[dict], threads: int, passes: int = 2) -> dict[str, float]:
    """Milliseconds per pass of each node type of OpenVINO at its default precision (its per-node counters)."""
    import openvino

    model = benchmark_engines.convert_openvino(bert, batches[0])
    compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    feeds = [{name: b[name].numpy() for name in benchmark_engines.ONNX_INPUTS} for b in batches]
    for feed in feeds:
        request.infer(feed)
    totals = collections.Counter()
    for _ in range(passes):
        for feed in feeds:
            request.infer(feed)
            for info in request.profiling_info:
                totals[group_of(info.node_type)] += info.real_time.total_seconds() * 1e3 / passes
    return dict(totals)


def long_inputs(threads: int, tmp: str) -> dict:
    folder = str(minilm_checkpoint_path())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batches = benchmark.long_batches(tokenizer, 512)
    inputs = [{name: b[name] for name in benchmark_engines.ONNX_INPUTS} for b in batches]
    bert = BertModel.from_pretrained(folder).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(folder).eval()
    torch.set_num_threads(threads)
    results = {}
    with torch.inference_mode():
        if bf16_linear_available():
            fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
            results["seqbert_optimized_bf16"] = torch_groups(lambda: [fast(**b) for b in inputs])
        results["openvino_default"] = openvino_groups(bert, batches, threads)
        int8 = seqbert.optimize_for_cpu_inference(model, int8=True)
        results["seqbert_optimized_int8"] = torch_groups(lambda: [int8(**b) for b in inputs])
    _, onnx_int8, _ = benchmark_engines.export_fused_onnx(folder, batches[0], Path(tmp))
    results["onnxruntime_int8"] = onnxruntime_groups(onnx_int8, batches, threads, tmp)
    return results


def int8_real_length(tmp: str, thread_counts: list[int], repeats: int) -> dict:
    """seqbert's int8 (op groups and wall time) beside CTranslate2's int8 (wall time), per model and thread count.

    Not interleaved: every seqbert measurement comes first, before CTranslate2 is loaded, because CTranslate2's copy
    of OpenMP shares torch's runtime and leaves it throttling its threads' spinning for the rest of the process (seen
    here: seqbert's wall time twice its profiled op time once CTranslate2 had run; `benchmark.py` orders its rows for
    the same reason, and `benchmark_threads.py` gives each engine processes of its own)."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, 4)
    inputs = [{name: b[name] for name in benchmark_engines.ONNX_INPUTS} for b in batches]
    _, base_4_layers, _ = benchmark.bert_base_folders(tmp)
    tokenizer.save_pretrained(base_4_layers)  # CTranslate2's converter reads the vocabulary from the folder
    models = {"MiniLM-L6": str(minilm_checkpoint_path()), "bert-base width, 4 layers": base_4_layers}
    settings = [(name, threads) for name in models for threads in thread_counts]
    label = {(name, threads): f"{name}, {threads} thread{'s' if threads > 1 else ''}" for name, threads in settings}
    results, threads_before = {}, torch.get_num_threads()
    for name, folder in models.items():
        model = seqbert.SeqBertModel.from_bert_pretrained(folder).eval()
        for threads in thread_counts:
            torch.set_num_threads(threads)
            int8 = seqbert.optimize_for_cpu_inference(model, int8=True)
            with torch.inference_mode():
                groups = torch_groups(lambda int8=int8: [int8(**b) for b in inputs])
                quantization = quantization_seconds(lambda int8=int8: [int8(**b) for b in inputs])
                times = interleave({"seqbert_int8": lambda int8=int8: [int8(**b) for b in inputs]}, repeats)
            results[label[name, threads]] = {
                "seqbert_int8": groups,
                "quantization_seconds": quantization,
                "wall": {"seqbert_int8": times["seqbert_int8"]},
            }
    for index, (name, folder) in enumerate(models.items()):  # CTranslate2 last (see above)
        converted = benchmark_engines.convert_ctranslate2(folder, Path(tmp) / f"model_{index}", "int8")
        for threads in thread_counts:
            engine = benchmark_engines.ctranslate2_engine(converted, "int8", threads)
            calls = [engine.prepare(batch) for batch in batches]
            times = interleave({"ctranslate2_int8": lambda calls=calls: [call() for call in calls]}, repeats)
            result = results[label[name, threads]]
            result["wall"]["ctranslate2_int8"] = times["ctranslate2_int8"]
            result["wall"] = {engine: median_and_spread(values) for engine, values in result["wall"].items()}
            wall = result["wall"]
            result["seqbert_over_ctranslate2"] = wall["ctranslate2_int8"]["seconds"] / wall["seqbert_int8"]["seconds"]
    torch.set_num_threads(threads_before)
    return results


def quantization_seconds(run: Callable[[], object], passes: int = 3) -> float:
    """Wall seconds per pass of `run` spent quantizing int8 layers' activations (`linear_kernels._quantize`, timed
    whole by a wrapper, after one untimed pass): the profiler's op groups split its range, rounding and cast among
    reductions, element-wise ops and casts."""
    spent = [0.0]
    quantize = linear_kernels._quantize

    def timed_quantize(*args, **kwargs):
        start = time.perf_counter()
        try:
            return quantize(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    with mock.patch.object(linear_kernels, "_quantize", timed_quantize):
        run()
        spent[0] = 0.0
        for _ in range(passes):
            run()
    return spent[0] / passes


def training_phases(model, batches: list[dict], bf16: bool) -> dict[str, Callable]:
    """A training step per batch with `Trainer`'s default optimizer (`benchmark.trainer_optimizer`), the forward under
    bf16 autocast with `bf16`, as two callables: "step" runs every batch's forward, backward and optimizer step under
    `torch.profiler.record_function` labels (`PHASES`); "phase_seconds" runs the same and returns the seconds of each
    phase, summed over the batches."""
    optimizer = benchmark.trainer_optimizer(model)
    state = {}

    def forward(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            state["loss"] = model(**batch).loss

    def step():
        for batch in batches:
            with record_function("forward"):
                forward(batch)
            with record_function("backward"):
                state.pop("loss").backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()

    def phase_seconds() -> dict[str, float]:
        seconds = collections.Counter()
        for batch in batches:
            seconds["forward"] += timed(lambda batch=batch: forward(batch))
            seconds["backward"] += timed(lambda: state.pop("loss").backward())
            seconds["optimizer"] += timed(lambda: (optimizer.step(), optimizer.zero_grad()))
        return dict(seconds)

    return {"step": step, "phase_seconds": phase_seconds}


def phase_groups(step: Callable[[], None]) -> dict[str, dict[str, float]]:
    """Self CPU milliseconds per pass of `step` by phase (the `record_function` range an op started in) and group."""
    step()
    with profile() as prof:
        step()
    events = prof.events()
    ranges = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name in PHASES]
    totals = {phase: collections.Counter() for phase in PHASES}
    for event in events:
        if event.name in PHASES:
            continue
        start = event.time_range.start
        phase = next((name for name, begin, end in ranges if begin <= start <= end), None)
        if phase is not None:
            totals[phase][group_of(event.name)] += event.self_cpu_time_total / 1e3
    return {phase: dict(groups) for phase, groups in totals.items()}


def training(tmp: str, repeats: int) -> dict:
    """seqbert's and BERT's training step, fp32 and bf16 autocast: phase times (interleaved) and phase op groups."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, 4)
    _, _, cls_folder = benchmark.bert_base_folders(tmp)
    results = {}
    for precision, bf16 in (("fp32", False), ("bf16_autocast", True)):
        models = {
            "transformers": BertForSequenceClassification.from_pretrained(cls_folder).train(),
            "seqbert": seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train(),
        }
        runs = {name: training_phases(model, batches, bf16) for name, model in models.items()}
        for run in runs.values():
            run["phase_seconds"]()  # warm-up: the optimizer's state, oneDNN's primitives
        rounds = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                rounds[name].append(run["phase_seconds"]())
        medians = {
            name: {phase: statistics.median(r[phase] for r in values) for phase in PHASES}
            for name, values in rounds.items()
        }
        spread = {
            name: {"step": [min(sum(r.values()) for r in values), max(sum(r.values()) for r in values)]}
            for name, values in rounds.items()
        }
        results[precision] = {
            "seconds_per_pass": medians,
            "spread_seconds_per_pass": spread,
            "ratio": sum(medians["transformers"].values()) / sum(medians["seqbert"].values()),
            "groups_ms": {name: phase_groups(run["step"]) for name, run in runs.items()},
        }
    return results


def print_training(results: dict) -> None:
    for precision, result in results.items():
        print(
            f"\nbert-base-size training step, {precision}, 4 real-length batches of 32 (s per pass; ratio "
            f"{result['ratio']:.2f}x)"
        )
        for name, phases in result["seconds_per_pass"].items():
            print(f"  {name}: " + ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in phases.items()))
        for phase in PHASES:
            print_groups(f"{precision}, {phase}", {n: g[phase] for n, g in result["groups_ms"].items()})


def print_groups(title: str, results: dict) -> None:
    names = list(results)
    print(f"\n{title} (ms per pass over the workload, share)")
    print("| group | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    groups = [group for group, _ in GROUPS] + ["the rest"]
    totals = {name: sum(results[name].values()) for name in names}
    for group in groups:
        cells = [f"{results[n].get(group, 0.0):,.0f} ({results[n].get(group, 0.0) / totals[n]:.0%})" for n in names]
        print(f"| {group} | " + " | ".join(cells) + " |")
    print("| total | " + " | ".join(f"{totals[n]:,.0f}" for n in names) + " |")


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(ProfileArguments, __doc__), argv)
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    results = {"isa": benchmark.cpu_isa(), "threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        if "long_512" in args.sections:
            results["long_512"] = long_inputs(args.threads, tmp)
            torch.set_num_threads(threads)
        if "training" in args.sections:
            results["training"] = training(tmp, args.repeats)
        if "int8_real_length" in args.sections:  # last: CTranslate2's OpenMP runtime stays in the process
            results["int8_real_length"] = int8_real_length(tmp, args.thread_counts, args.repeats)
    print(f"CPU: {results['isa']}")
    if "long_512" in results:
        print_groups(f"MiniLM-L6, 3 batches of 8 x 512 tokens, {args.threads} threads", results["long_512"])
    if "training" in results:
        print_training(results["training"])
    for setting, result in results.get("int8_real_length", {}).items():
        wall = ", ".join(f"{k} {v['seconds'] * 1e3:.0f} ms" for k, v in result["wall"].items())
        print(
            f"\nint8, 4 real-length batches of 32, {setting}: {wall}; seqbert {result['seqbert_over_ctranslate2']:.2f}x"
        )
        share = result["quantization_seconds"] / result["wall"]["seqbert_int8"]["seconds"]
        print(
            f"activation quantization, timed whole: {result['quantization_seconds'] * 1e3:.1f} ms a pass ({share:.0%})"
        )
        print_groups("seqbert int8 op groups", {"seqbert_int8": result["seqbert_int8"]})
    if args.json_file:
        write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(ProfileArguments, __doc__))
