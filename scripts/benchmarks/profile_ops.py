#!/usr/bin/env python
"""Where the time goes, op by op: seqbert next to the fastest other engine, each with its own profiler, on the
workloads where `benchmark.py` finds seqbert behind (or where its target is not met). About 3 minutes on 2 cores.

    python scripts/benchmarks/profile_ops.py [--threads 2] [--json_file profile_ops.json]

- `long_512`: MiniLM-L6 (real weights) on the first 24 convention speeches cut at 512 tokens, batches of 8, as
  `benchmark.py` times it: `optimize_for_cpu_inference(model, dtype=torch.bfloat16)` (`torch.profiler`) next to
  OpenVINO at its default precision (its per-node counters, `PERF_COUNT`), and `optimize_for_cpu_inference(model,
  int8=True)` next to onnxruntime's dynamic int8 of the fused graph (its own profiler, `enable_profiling`);
- `real_length_training_bf16`: one bert-base-size training step per real-length batch (32 Rotten Tomatoes snippets)
  under `torch.autocast("cpu", dtype=torch.bfloat16)`, seqbert next to transformers' `BertForSequenceClassification`
  (`torch.profiler` for both).

Each engine's operators are summed into the same few groups (matrix products, attention, LayerNorm, casts and copies,
gathers, element-wise, the optimizer, the rest), in milliseconds per pass over the workload and as shares. Profilers
add their own overhead, so the totals are larger than `benchmark.py`'s timings; the shares are what to read. It needs
the `integrations` extra (onnxruntime, OpenVINO).
"""

import collections
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import profile
from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

import seqbert
from seqbert.cpu_inference import bf16_linear_available
from seqbert.data import minilm_checkpoint_path
from seqbert.script_utils import parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # noqa: E402  (next to this script)
import benchmark_engines  # noqa: E402


@dataclass
class ProfileArguments:
    threads: int = field(default=2, metadata={"help": "Threads of every engine on the long_512 workload."})
    json_file: str | None = field(default="profile_ops.json", metadata={"help": "Where to write the groups."})


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
    ("gathers", r"index|gather|scatter|embedding"),
    ("optimizer", r"adam|zero_grad|optimizer"),
    ("fill", r"fill|zero"),
    ("element-wise", r"gelu|add|mul|div|sub|eltwise|erf|tanh|where|masked|quantize|aminmax|round|bitwise"),
)


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


def training_bf16(tmp: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.real_length_batches(tokenizer, 4)
    _, _, cls_folder = benchmark.bert_base_folders(tmp)
    models = {
        "transformers_bf16_autocast": BertForSequenceClassification.from_pretrained(cls_folder).train(),
        "seqbert_bf16_autocast": seqbert.SeqBertForSequenceClassification.from_bert_pretrained(cls_folder).train(),
    }
    return {
        name: torch_groups(benchmark.training_steps(model, batches, [], bf16=True), passes=1)
        for name, model in models.items()
    }


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
    with tempfile.TemporaryDirectory() as tmp:
        results = {"isa": benchmark.cpu_isa(), "long_512": long_inputs(args.threads, tmp)}
        torch.set_num_threads(threads)
        results["real_length_training_bf16"] = training_bf16(tmp)
    print(f"CPU: {results['isa']}")
    print_groups(f"MiniLM-L6, 3 batches of 8 x 512 tokens, {args.threads} threads", results["long_512"])
    print_groups(
        f"bert-base-size training step under bf16 autocast, 4 real-length batches, {threads} threads",
        results["real_length_training_bf16"],
    )
    if args.json_file:
        write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(ProfileArguments, __doc__))
