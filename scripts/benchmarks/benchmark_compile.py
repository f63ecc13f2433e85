#!/usr/bin/env python
"""What compiling the CUDA-graph route costs on the main job, and after how many steps it pays off: MiniLM-L6
fine-tuned on Rotten Tomatoes snippets in `seqbert.StaticShapeCollator`'s static batches, compiled three ways (as
`Trainer` compiles, with static shapes, regionally) against eager, each compilation in a fresh process with a cold and
then a warm inductor cache. On a quiet 2-core AMD EPYC Zen 5 the run of every variant over the main job's epoch (4
shapes) with `--steps 10` took 6.5 minutes, twice (2026-11-28; the default 20 steps add about a minute), most of it
inductor's C++ code generation; docs/benchmarks.md has its figures. On a GPU it is not yet measured.

    python scripts/benchmarks/benchmark_compile.py [--output_dir benchmark_compile] [--steps 20]
        [--variants trainer static regional eager] [--max_train_samples 2000] [--device cuda|cpu] [--quick]

**The job** is the main job's (`scripts/examples/run_classification.py`): MiniLM-L6 (`seqbert.data.
minilm_checkpoint_path()`, converted by `SeqBertForSequenceClassification.from_bert_pretrained(path, num_labels=2,
problem_type="single_label_classification")`, seed 42) on the first `--max_train_samples` (2,000) training snippets
of `seqbert.data.load_rotten_tomatoes()`, tokenized with `truncation=True, max_length=128`, in an epoch order drawn as
`Trainer`'s sampler draws one (a permutation seeded with 42), in batches of 32 (the last one smaller) laid out by
`seqbert.StaticShapeCollator(tokenizer, model, max_length=128, batch_size=32)`. The epoch's batches come in a few
distinct shapes (B, L, T, S): examples, padded width, the bucket's tokens and sequence slots. The parent process
prepares the model and the batches once (saved to a temporary folder); each measured run loads them.

**The step** is forward on the static batch, `.loss.backward()`, `optimizer.step()`, `optimizer.zero_grad()` with
`torch.optim.AdamW(lr=5e-5, fused=True)` (what `Trainer` builds by default; its gradient clipping and learning-rate
schedule, which run outside the compiled model, are left out). On CUDA the forward runs under `torch.autocast("cuda",
dtype=torch.bfloat16)`, as `--bf16` runs it, and the clock is read after `torch.cuda.synchronize()`; the batches are
moved to the device before any clock starts. On a CPU it runs in fp32.

**The variants** (`--variants`), MODE being "reduce-overhead" on CUDA (CUDA graphs) and "default" on a CPU, which has
no CUDA graphs: there the figures are inductor's CPU code generation (C++ compiled by the system compiler) and CPU
steps, not what a GPU would show:

- `trainer`: `torch.compile(model, mode=MODE, dynamic=None)`, what `TrainingArguments(torch_compile=True,
  torch_compile_mode=MODE)` runs through accelerate's `TorchDynamoPlugin` (transformers 5.24): the first shape is
  compiled static, the second makes dynamo compile again with symbolic sizes;
- `static`: `torch.compile(model, mode=MODE, dynamic=False)`: one graph per distinct shape;
- `regional`: `accelerate.utils.compile_regions(model, mode=MODE, dynamic=None)`, what
  `ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1` selects (https://pytorch.org/tutorials/recipes/regional_compilation.html):
  each encoder layer compiled on its own (the layers share their graphs), the other leaf modules each compiled, the
  model's own forward (unpadding, re-padding, loss) eager;
- `eager`: no compilation, the reference.

**Each compiled variant runs twice**, each time in a fresh Python process (no dynamo or inductor state in memory
carries over): first with `TORCHINDUCTOR_CACHE_DIR` a new, empty folder ("cold"), then with that same folder ("warm":
the FX graph and AOTAutograd caches torch 2.13 keeps by default, and triton's cache, which lives there unless
`TRITON_CACHE_DIR` is set, and is unset for the runs). Dynamo itself traces again in a warm run. `eager` runs once.
Each run measures:

- the first pass: one step on the first batch of each distinct shape of the epoch, in epoch order; on CUDA two steps
  on that batch (CUDA graph trees run a new graph once to warm up and record it at its second call), so that the
  steady steps replay. `first_pass_seconds` is their sum (compilation, warm-up, recording), `first_pass_steps` their
  number;
- what dynamo compiled then: `graphs` (`torch._dynamo.utils.counters["stats"]["unique_graphs"]`), `graph_breaks`
  (and their reasons), the FX graph and AOTAutograd cache hits and misses, on CUDA the CUDA graphs recorded and
  inductor's skipped ones;
- `--steps` steady steps over the epoch's batches (from its first batch on, in order), each timed: the median step
  and the fastest and slowest (`step_spread_seconds`); the graphs compiled and CUDA graphs recorded during them (none
  expected: the first pass saw every shape).

`eager` runs the same first pass (its warm-up, shown but not used) and steady steps.

**Derived** for each compiled run, against eager's median step: `pays_off_after_steps` = (first_pass_seconds -
first_pass_steps x eager_step_median) / (eager_step_median - step_median), rounded up: the steady steps after the first
pass that win back what compilation cost (None, "never" in the table, where the compiled step is not faster); and the
main job (2 epochs of 2,000 snippets at batch 32: 126 steps, `MAIN_JOB_STEPS`) estimated from these figures:
`main_job_seconds` = first_pass_seconds + (126 - first_pass_steps) x step_median, against 126 x eager's median
(`main_job_seconds_saved`; with a smaller `--max_train_samples` the epoch may visit fewer shapes than the main job's).

Results: `<output_dir>/benchmark_compile.json` (rewritten after every run: `environment` (date, machine, CPU model and
flags of interest or the GPU, torch's CPU capability, the versions), `arguments`, `rows`) and a table on stdout. A run
that fails is kept as a row with its `error` (the last lines of its stderr), and the others go on. `--quick` (256
snippets, 3 steady steps) is a smoke test.
"""

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import accelerate
import torch
import transformers
from transformers import AutoTokenizer

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchmark_gpu import CudaGraphRecordings, batch_shape  # noqa: E402  (next to this script)


VARIANTS = ("trainer", "static", "regional", "eager")
DEVICES = ("cpu", "cuda")
MAX_TRAIN_SAMPLES = 2000  # the main job's training snippets (`load_rotten_tomatoes()["train"]`)
BATCH_SIZE = 32
MAX_LENGTH = 128
LEARNING_RATE = 5e-5
SEED = 42  # run_classification.py's: the classifier's initialisation and the epoch order
MAIN_JOB_STEPS = 126  # 2 epochs of ceil(2000 / 32) = 63 steps
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# Runs the measurement of one variant in a fresh interpreter: the path of its spec (a JSON file) is argv[1].
CHILD_COMMAND = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); import benchmark_compile; benchmark_compile.measure(sys.argv[1])"
)


@dataclass
class CompileBenchmarkArguments:
    output_dir: str = field(
        default="benchmark_compile", metadata={"help": "Folder for benchmark_compile.json (created)."}
    )
    variants: list[str] = field(
        default_factory=lambda: list(VARIANTS),
        metadata={
            "help": f"What to measure, any of {', '.join(VARIANTS)} (eager is the reference of the derived figures)."
        },
    )
    steps: int = field(default=20, metadata={"help": "Timed steady steps of each run, after its first pass."})
    max_train_samples: int = field(
        default=MAX_TRAIN_SAMPLES,
        metadata={"help": f"Training snippets in the epoch, 1 to {MAX_TRAIN_SAMPLES} (the main job's 2,000)."},
    )
    device: str = field(
        default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu",
        metadata={"help": "cpu or cuda (default: cuda where a GPU is visible)."},
    )
    quick: bool = field(default=False, metadata={"help": "Smoke test: 256 snippets, 3 steady steps."})

    def __post_init__(self):
        if self.quick:
            self.max_train_samples, self.steps = 256, 3
        unknown = [name for name in self.variants if name not in VARIANTS]
        if unknown or not self.variants:
            raise ScriptInputError(f"--variants ({self.variants}) must be one or more of {', '.join(VARIANTS)}")
        self.variants = list(dict.fromkeys(self.variants))  # once each, in the given order
        if self.steps < 1:
            raise ScriptInputError(f"--steps ({self.steps}) must be at least 1")
        if not 1 <= self.max_train_samples <= MAX_TRAIN_SAMPLES:
            raise ScriptInputError(
                f"--max_train_samples ({self.max_train_samples}) must be 1 to {MAX_TRAIN_SAMPLES}, the main job's "
                "training snippets"
            )
        if self.device not in DEVICES:
            raise ScriptInputError(f"--device ({self.device!r}) must be one of {', '.join(DEVICES)}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ScriptInputError(
                f"--device (cuda) needs a CUDA GPU, but torch.cuda.is_available() is False on this machine (torch "
                f"{torch.__version__}): use --device cpu"
            )


def compile_mode(device: str) -> str:
    """CUDA graphs on a GPU; inductor's default on a CPU, which has none."""
    return "reduce-overhead" if device == "cuda" else "default"


# ----------------------------------------------------------------------------------------------------------------------
# The parent: data, model, one subprocess per run, derived figures
# ----------------------------------------------------------------------------------------------------------------------


def prepare(folder: Path, max_train_samples: int) -> tuple[Path, Path]:
    """The main job's model (converted from MiniLM, its classifier drawn after seed 42) saved to `folder / "model"`,
    and its epoch of static batches (`StaticShapeCollator`, in an epoch order seeded with 42) saved to
    `folder / "batches.pt"`; returns both paths."""
    path = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    transformers.set_seed(SEED)
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        path, num_labels=2, problem_type="single_label_classification"
    )
    train = load_rotten_tomatoes()["train"].select(range(max_train_samples))
    encoded = tokenizer(list(train["text"]), truncation=True, max_length=MAX_LENGTH)
    features = [
        {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "label": label}
        for ids, types, mask, label in zip(
            encoded["input_ids"],
            encoded["token_type_ids"],
            encoded["attention_mask"],
            list(train["label"]),
            strict=True,
        )
    ]
    order = torch.randperm(len(features), generator=torch.Generator().manual_seed(SEED)).tolist()
    collator = seqbert.StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH, batch_size=BATCH_SIZE)
    batches = [
        collator([features[i] for i in order[start : start + BATCH_SIZE]]) for start in range(0, len(order), BATCH_SIZE)
    ]
    model.save_pretrained(folder / "model")
    torch.save(batches, folder / "batches.pt")
    return folder / "model", folder / "batches.pt"


def run_variant(spec: dict, folder: Path, cache_dir: Path | None) -> dict:
    """One run (`measure`) in a fresh Python process, with `TORCHINDUCTOR_CACHE_DIR` set to `cache_dir` (compiled
    variants) and no `TRITON_CACHE_DIR`, so that triton's cache lives there too; its row, or a row with its `error`."""
    name = f"{spec['variant']}_{spec['cache'] or 'none'}"
    spec = {**spec, "row_path": str(folder / f"{name}.json")}
    spec_path = folder / f"{name}_spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_CACHE_DIR"}
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", CHILD_COMMAND, str(spec_path)], capture_output=True, text=True, env=env
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0 or not Path(spec["row_path"]).is_file():
        tail = " | ".join(result.stderr.strip().splitlines()[-8:])
        return {"variant": spec["variant"], "cache": spec["cache"], "process_seconds": seconds, "error": tail}
    row = json.loads(Path(spec["row_path"]).read_text(encoding="utf-8"))
    return {**row, "process_seconds": seconds}


def add_derived(rows: list[dict]) -> None:
    """Each compiled row's break-even against the eager row's median step (see the module docstring), in place."""
    eager = next((row for row in rows if row["variant"] == "eager" and "error" not in row), None)
    for row in rows:
        if row["variant"] == "eager" or "error" in row:
            continue
        if eager is None:
            row |= {"pays_off_after_steps": None, "derived": "no eager row to compare with"}
            continue
        base, step = eager["step_median_seconds"], row["step_median_seconds"]
        extra = row["first_pass_seconds"] - row["first_pass_steps"] * base  # what compiling cost beyond eager steps
        saving = base - step  # per steady step
        main_job = row["first_pass_seconds"] + (MAIN_JOB_STEPS - row["first_pass_steps"]) * step
        row |= {
            "eager_step_median_seconds": base,
            "compile_overhead_seconds": extra,
            "saving_per_step_seconds": saving,
            "pays_off_after_steps": max(0, math.ceil(extra / saving)) if saving > 0 else None,
            "main_job_steps": MAIN_JOB_STEPS,
            "main_job_seconds": main_job,
            "main_job_eager_seconds": MAIN_JOB_STEPS * base,
            "main_job_seconds_saved": MAIN_JOB_STEPS * base - main_job,
        }
        row["pays_off_in_main_job"] = row["main_job_seconds_saved"] > 0


def runs(variants: list[str]) -> list[tuple[str, str | None]]:
    """(variant, cache state) in the order they run: eager first (once), then each compiled variant cold, then warm."""
    order = [("eager", None)] if "eager" in variants else []
    return order + [(name, cache) for name in variants if name != "eager" for cache in ("cold", "warm")]


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(CompileBenchmarkArguments, __doc__), argv)
    return run(args)


def run(args: CompileBenchmarkArguments) -> dict:
    """Every run of `args.variants` (`runs`), the results written to `args.output_dir` after each; returns them."""
    start = time.perf_counter()
    transformers.logging.set_verbosity_error()  # the conversion reports the classifier it initialises
    transformers.logging.disable_progress_bar()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    env = environment(args.device)
    mode = compile_mode(args.device)
    print("; ".join(f"{key} {value}" for key, value in env.items()), flush=True)
    if args.device == "cpu":
        print(
            f"mode {mode!r} on a CPU: no CUDA graphs here; the figures are inductor's CPU code generation and CPU "
            "steps, not a GPU's",
            flush=True,
        )
    results = {"environment": env, "arguments": asdict(args), "compile_mode": mode, "rows": []}
    with tempfile.TemporaryDirectory(prefix="benchmark_compile_") as tmp:
        folder = Path(tmp)
        model_path, batches_path = prepare(folder, args.max_train_samples)
        results["prepare_seconds"] = time.perf_counter() - start
        for variant, cache in runs(args.variants):
            spec = {
                "variant": variant,
                "cache": cache,
                "device": args.device,
                "mode": mode,
                "steps": args.steps,
                "model_path": str(model_path),
                "batches_path": str(batches_path),
            }
            cache_dir = folder / f"inductor_cache_{variant}" if cache is not None else None
            print(f"\n== {variant}" + (f", {cache} inductor cache" if cache else ""), flush=True)
            row = run_variant(spec, folder, cache_dir)
            print(
                f"   {row['process_seconds']:.1f} s in all"
                + (
                    f"; FAILED: {row['error']}" if "error" in row else f"; first pass {row['first_pass_seconds']:.1f} s"
                ),
                flush=True,
            )
            results["rows"].append(row)
            add_derived(results["rows"])
            write_json(output_dir / "benchmark_compile.json", results)
    results["total_seconds"] = time.perf_counter() - start
    write_json(output_dir / "benchmark_compile.json", results)
    print_table(results)
    print(f"\nresults in {output_dir / 'benchmark_compile.json'}")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# The child: one variant, one cache state, in a fresh process
# ----------------------------------------------------------------------------------------------------------------------


def compiled(model: torch.nn.Module, variant: str, mode: str) -> torch.nn.Module:
    """`model` as the variant `variant` runs it (see the module docstring)."""
    if variant == "eager":
        return model
    if variant == "regional":
        return accelerate.utils.compile_regions(model, mode=mode, dynamic=None)
    return torch.compile(model, mode=mode, dynamic=None if variant == "trainer" else False)


def measure(spec_path: str) -> None:
    """Measure the run of the spec at `spec_path` (written by `run_variant`) and write its row to the spec's
    `row_path`."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    transformers.logging.set_verbosity_error()
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    setup_start = time.perf_counter()
    torch.manual_seed(0)  # dropout
    model = seqbert.SeqBertForSequenceClassification.from_pretrained(spec["model_path"]).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
    runner = compiled(model, spec["variant"], spec["mode"])
    batches = [
        {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
        for batch in torch.load(spec["batches_path"], weights_only=True)
    ]
    first_of_shape = {}
    for batch in batches:
        first_of_shape.setdefault(batch_shape(batch), batch)
    setup_seconds = time.perf_counter() - setup_start

    def step(batch: dict) -> tuple[float, torch.Tensor]:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = runner(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, loss

    counters = torch._dynamo.utils.counters
    counters.clear()
    calls_per_shape = 2 if cuda and spec["variant"] != "eager" else 1  # warm-up, then recording
    first_pass, first_losses = [], []
    with CudaGraphRecordings() as recordings:
        for batch in first_of_shape.values():
            for _ in range(calls_per_shape):
                seconds, loss = step(batch)
                first_pass.append(seconds)
                first_losses.append(loss.item())  # after the clock, before the next step can overwrite it
    graphs = counters["stats"]["unique_graphs"]
    breaks = dict(counters["graph_break"])
    caches = {
        key: value for group in ("inductor", "aot_autograd") for key, value in counters[group].items() if "cache" in key
    }
    cudagraph_skips = counters["inductor"]["cudagraph_skips"]
    with CudaGraphRecordings() as steady_recordings:
        steady = [step(batches[i % len(batches)])[0] for i in range(spec["steps"])]
    row = {
        "variant": spec["variant"],
        "cache": spec["cache"],
        "device": spec["device"],
        "mode": spec["mode"] if spec["variant"] != "eager" else None,
        "dynamic": {"trainer": None, "static": False, "regional": None}.get(spec["variant"]),
        "threads": torch.get_num_threads(),
        "shapes": [list(shape) for shape in first_of_shape],
        "batches": len(batches),
        "setup_seconds": setup_seconds,
        "first_pass_steps": len(first_pass),
        "first_pass_seconds": sum(first_pass),
        "first_pass_step_seconds": first_pass,
        "first_pass_losses": first_losses,
        "steps": len(steady),
        "step_seconds": steady,
        "step_median_seconds": statistics.median(steady),
        "step_spread_seconds": [min(steady), max(steady)],
    }
    if spec["variant"] != "eager":
        row |= {
            "graphs": graphs,
            "graphs_in_steady_steps": counters["stats"]["unique_graphs"] - graphs,
            "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": {reason[:300]: count for reason, count in breaks.items()},
            "cache_counters": caches,
        }
        if cuda:
            row |= {
                "cuda_graph_recordings": recordings.count,
                "cuda_graph_recordings_in_steady_steps": steady_recordings.count,
                "cudagraph_skips": cudagraph_skips,
            }
    write_json(spec["row_path"], row)


# ----------------------------------------------------------------------------------------------------------------------
# Environment and output
# ----------------------------------------------------------------------------------------------------------------------


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of `CPU_FLAGS` it has, as `lscpu` reports them ("unknown" and [] without it)."""
    try:
        result = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown", []
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return fields.get("Model name", "unknown").strip(), [flag for flag in CPU_FLAGS if flag in flags]


def environment(device: str) -> dict:
    """The machine and the versions the figures were measured with."""
    model_name, flags = cpu_description()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": platform.node(),
        "platform": platform.platform(),
        "cpu": model_name,
        "cpu_flags": flags,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "transformers_version": transformers.__version__,
        "accelerate_version": accelerate.__version__,
        "seqbert_version": seqbert.__version__,
    }


def table_line(row: dict) -> str:
    """One run in the table."""
    name = f"{row['variant']:<9} {row['cache'] or '-':<5}"
    if "error" in row:
        return f"{name} FAILED: {row['error']}"
    low, high = row["step_spread_seconds"]
    compiled_ = row["variant"] != "eager"
    graphs = f"{row['graphs']:>6} {row['graph_breaks']:>6}" if compiled_ else f"{'-':>6} {'-':>6}"
    if not compiled_ or "main_job_seconds_saved" not in row:
        payoff, main_job = "-", "-"
    else:
        after = row["pays_off_after_steps"]
        payoff = "never" if after is None else f"{after:,} steps"
        saved = row["main_job_seconds_saved"]
        main_job = f"saves {saved:.0f} s" if saved > 0 else f"loses {-saved:.0f} s"
    return (
        f"{name} {row['first_pass_seconds']:>9.1f} s {graphs} {row['step_median_seconds']:>9.3f} s "
        f"[{low:.3f}-{high:.3f}] {payoff:>14}  {main_job}"
    )


def print_table(results: dict) -> None:
    env, args, rows = results["environment"], results["arguments"], results["rows"]
    where = env["gpu"] if env["gpu"] else f"CPU {env['cpu']} ({env['cpu_capability']}, {env['threads']} threads)"
    print(
        f"\nCompile cost of the CUDA-graph route: MiniLM-L6 on {args['max_train_samples']} Rotten Tomatoes snippets, "
        f"batch {BATCH_SIZE}, static batches at max_length {MAX_LENGTH}; {where}; mode {results['compile_mode']!r}"
        f"{' (no CUDA graphs on a CPU)' if args['device'] == 'cpu' else ''}; torch {env['torch_version']}, "
        f"transformers {env['transformers_version']}, accelerate {env['accelerate_version']}; {env['date']}; "
        f"{results['total_seconds']:.0f} s in all"
    )
    shapes = next((row["shapes"] for row in rows if "shapes" in row), [])
    print(f"distinct shapes in the epoch, in order (B, L, T, S): {', '.join(str(tuple(s)) for s in shapes)}")
    print(
        f"{'variant':<9} {'cache':<5} {'first pass':>11} {'graphs':>6} {'breaks':>6} {'step median':>11} "
        f"[min-max] of {args['steps']} {'pays off after':>14}  main job ({MAIN_JOB_STEPS} steps) vs eager"
    )
    for row in rows:
        print(table_line(row))


if __name__ == "__main__":
    run_cli(main, script_parser(CompileBenchmarkArguments, __doc__))
