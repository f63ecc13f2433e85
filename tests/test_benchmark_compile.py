"""scripts/benchmarks/benchmark_compile.py, the compile-cost benchmark of the CUDA-graph route: bad arguments stop it
with a one-line message naming the argument, before anything is written (in process, well under a second); and its
smoke run (`--quick --variants trainer eager --device cpu`: eager, then `Trainer`'s compilation with a cold and a warm
inductor cache, each in a fresh process) goes through end to end and writes the rows the derived figures need. No
timing is asserted: the machine is shared. The smoke run is a `benchmark_run` test, run on demand (`python -m pytest
-m benchmark_run tests/test_benchmark_compile.py -n 0`; several minutes of CPU, most of it inductor's C++ code
generation)."""

import json
import math
import subprocess
import sys

import benchmark_compile  # noqa: E402  (scripts/benchmarks, on sys.path by conftest)
import pytest
import torch
from conftest import ROOT, SCRIPT_PATHS

from seqbert.script_utils import ScriptInputError, run_cli, script_parser


SCRIPT = SCRIPT_PATHS["benchmark_compile.py"]

BAD_ARGUMENTS = {
    "no-steps": (["--steps", "0"], "--steps (0) must be at least 1"),
    "unknown-variant": (["--variants", "trainer", "jit"], "--variants (['trainer', 'jit']) must be one or more of"),
    "no-samples": (["--max_train_samples", "0"], "--max_train_samples (0) must be 1 to 2000"),
    "more-samples-than-the-main-job": (["--max_train_samples", "2001"], "--max_train_samples (2001) must be 1 to 2000"),
    "unknown-device": (["--device", "tpu"], "--device ('tpu') must be one of cpu, cuda"),
}
if not torch.cuda.is_available():
    BAD_ARGUMENTS["cuda-without-a-gpu"] = (["--device", "cuda"], "--device (cuda) needs a CUDA GPU")


@pytest.mark.parametrize("case", BAD_ARGUMENTS, ids=list(BAD_ARGUMENTS))
def test_bad_arguments_stop_with_one_line_naming_the_argument_and_write_nothing(case, tmp_path, capsys):
    argv, message = BAD_ARGUMENTS[case]
    output_dir = tmp_path / "out"
    argv = [*argv, "--output_dir", str(output_dir)]
    with pytest.raises(ScriptInputError) as error:
        benchmark_compile.main(argv)
    assert message in str(error.value) and "\n" not in str(error.value)
    # On the command line (`run_cli`): exit status 2 and that one line on stderr.
    parser = script_parser(benchmark_compile.CompileBenchmarkArguments, benchmark_compile.__doc__)
    with pytest.raises(SystemExit) as exit_:
        run_cli(lambda: benchmark_compile.main(argv), parser)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err, captured.err
    assert not output_dir.exists()


def test_runs_put_eager_first_and_each_compiled_variant_cold_then_warm():
    assert benchmark_compile.runs(["regional", "eager", "trainer"]) == [
        ("eager", None),
        ("regional", "cold"),
        ("regional", "warm"),
        ("trainer", "cold"),
        ("trainer", "warm"),
    ]


def test_pays_off_after_the_steps_that_win_back_the_first_pass():
    eager = {"variant": "eager", "step_median_seconds": 1.0}
    faster = {"variant": "trainer", "first_pass_seconds": 23.0, "first_pass_steps": 3, "step_median_seconds": 0.75}
    slower = {"variant": "static", "first_pass_seconds": 5.0, "first_pass_steps": 3, "step_median_seconds": 1.5}
    rows = [eager, faster, slower]
    benchmark_compile.add_derived(rows)
    # (23 - 3 x 1.0) / (1.0 - 0.75) = 80 steps; the main job: 23 + 123 x 0.75 = 115.25 s against 126 s.
    assert faster["pays_off_after_steps"] == 80
    assert faster["main_job_seconds"] == pytest.approx(115.25) and faster["pays_off_in_main_job"]
    assert faster["main_job_seconds_saved"] == pytest.approx(10.75)
    assert slower["pays_off_after_steps"] is None and not slower["pays_off_in_main_job"]
    assert "never" in benchmark_compile.table_line(
        slower | {"cache": "cold", "graphs": 2, "graph_breaks": 0, "step_spread_seconds": [1.4, 1.6]}
    )


@pytest.mark.benchmark_run
def test_the_quick_run_goes_through_on_the_cpu(tmp_path):
    output = tmp_path / "out"
    command = [str(SCRIPT), "--quick", "--variants", "trainer", "eager", "--device", "cpu", "--output_dir", str(output)]
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILED" not in result.stdout and "no CUDA graphs" in result.stdout

    results = json.loads((output / "benchmark_compile.json").read_text())
    env = results["environment"]
    assert env["torch_version"] == torch.__version__ and env["gpu"] is None
    assert {"date", "machine", "cpu", "cpu_flags", "cpu_capability", "transformers_version"} <= set(env)
    assert {"accelerate_version", "seqbert_version"} <= set(env)
    assert results["compile_mode"] == "default"
    assert results["arguments"] | {"steps": 3, "max_train_samples": 256} == results["arguments"]
    rows = results["rows"]
    assert [(row["variant"], row["cache"]) for row in rows] == [
        ("eager", None),
        ("trainer", "cold"),
        ("trainer", "warm"),
    ]
    for row in rows:
        assert "error" not in row, row
        shapes = row["shapes"]
        assert 1 <= len(shapes) <= row["batches"] == 8  # 256 snippets in batches of 32
        assert all(shape[:2] == [32, benchmark_compile.MAX_LENGTH] for shape in shapes)
        assert row["first_pass_steps"] == len(shapes) == len(row["first_pass_step_seconds"])
        assert row["first_pass_seconds"] > 0 and all(math.isfinite(loss) for loss in row["first_pass_losses"])
        assert row["steps"] == len(row["step_seconds"]) == 3
        low, high = row["step_spread_seconds"]
        assert 0 < low <= row["step_median_seconds"] <= high
    eager, cold, warm = rows
    assert "graphs" not in eager
    for row in (cold, warm):
        assert row["mode"] == "default" and row["dynamic"] is None
        assert 1 <= row["graphs"] <= len(row["shapes"]), row["graphs"]
        assert row["graphs_in_steady_steps"] == 0 and row["graph_breaks"] == 0, row["graph_break_reasons"]
        assert row["eager_step_median_seconds"] == eager["step_median_seconds"]
        assert row["main_job_steps"] == benchmark_compile.MAIN_JOB_STEPS
        assert math.isfinite(row["main_job_seconds_saved"])
        after = row["pays_off_after_steps"]
        assert (after is None) == (row["step_median_seconds"] >= eager["step_median_seconds"])
    # The warm run found what the cold one compiled in the inductor cache folder they share.
    assert cold["cache_counters"]["fxgraph_cache_miss"] >= 1 and not cold["cache_counters"].get("fxgraph_cache_hit")
    assert warm["cache_counters"]["fxgraph_cache_hit"] >= 1 and not warm["cache_counters"].get("fxgraph_cache_miss")
    assert "trainer   cold" in result.stdout and "trainer   warm" in result.stdout
