"""scripts/benchmarks/benchmark_threads.py: what its AVX2 setting holds (torch, oneDNN, CTranslate2, each read back
from the library in a fresh process), its refusals, the rotated order of its rounds and the agreement of its engines'
outputs with seqbert's fp32 eager model (torch's engines on MiniLM, one batch). The two tests of the measurement itself
(`torch_engines`: two worker processes timing plans and rounds, about 40 s of CPU) are `benchmark_run` tests, run on
demand (`python -m pytest -m benchmark_run`): the benchmark checks every engine against the reference whenever it runs
and fails on a disagreement."""

import json
import os
import subprocess
import sys

import benchmark_threads
import pytest
import torch

from seqbert.script_utils import ScriptInputError


def test_the_avx2_setting_holds_torch_onednn_and_ctranslate2():
    environment = benchmark_threads.AVX2_ENVIRONMENT
    assert benchmark_threads.onednn_isa(environment) == "Intel AVX2"
    assert benchmark_threads.ctranslate2_isa(environment) == "AVX2"
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ | environment, check=True
    )
    assert result.stdout.strip() == "AVX2"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "2"], r"--threads \(\[2\]\) must be two or more increasing counts"),
        (["--threads", "2", "1"], r"--threads \(\[2, 1\]\) must be two or more increasing counts"),
        (["--repeats", "0"], r"--repeats \(0\) and --num_batches \(4\) must be >= 1"),
    ],
)
def test_bad_arguments_are_named(argv, message, tmp_path):
    with pytest.raises(ScriptInputError, match=message):
        benchmark_threads.main([*argv, "--json_file", str(tmp_path / "threads.json")])
    assert not (tmp_path / "threads.json").exists()


def test_ctranslate2_is_also_pinned_to_avx512_where_the_cpu_has_it():
    """CTranslate2 picks AVX2 on AMD CPUs with AVX-512 (the docs' machines); its pinned rows hold it to AVX-512, and
    are left out where the CPU has none (and under the AVX2 setting everywhere)."""
    import torch

    has_avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    for library, environment in benchmark_threads.PINNED_ENVIRONMENT.items():
        assert benchmark_threads._runs(library, native=True) == has_avx512
        assert not benchmark_threads._runs(library, native=False)
        if has_avx512:
            assert benchmark_threads.ctranslate2_isa(environment) == "AVX512"


def _torch_only(repeats: int = 3) -> "benchmark_threads.ThreadsArguments":
    return benchmark_threads.ThreadsArguments(
        threads=[1, 2], repeats=repeats, num_batches=1, libraries=["torch"], avx2=False, json_file=None
    )


@pytest.fixture(scope="module")
def torch_engines(minilm_path) -> tuple[dict, "benchmark_threads.Measurement"]:
    """torch's engines on MiniLM at 1 and 2 threads (two processes), 3 rounds: the reference and the measurement."""
    reference = benchmark_threads.reference_outputs(str(minilm_path), 1)
    measurement = benchmark_threads.measure(
        "MiniLM-L6", str(minilm_path), {}, _torch_only(), {}, bf16=False, reference=reference
    )
    return reference, measurement


@pytest.mark.benchmark_run
def test_each_round_starts_with_another_engine_and_the_engines_agree(torch_engines):
    """Round r starts with the r-th process and, within each process, with its r-th engine; every engine agrees with
    seqbert's fp32 eager model, the fp32 ones to 1e-4, the int8 one within int8's tolerances and computing in int8
    (its plan never holds the eager fp32 layers, however loaded the machine); each optimized engine's speed over the
    eager model comes from the two engines' seconds in the same rounds."""
    _, measurement = torch_engines
    rows, rounds = measurement.rows, measurement.rounds
    engines = ["transformers", "seqbert", "seqbert_optimized", "seqbert_optimized_int8"]
    assert {row["engine"]: row["precision"] for row in rows} == dict(
        zip(engines, ["fp32", "fp32", "fp32", "int8"], strict=True)
    )
    assert set(measurement.outputs) == {(name, count) for name in engines for count in (1, 2)}
    seconds = {row["engine"]: row["seconds"] for row in rows}
    for row in rows:  # the optimized engines say which plan they measured at each thread count, and how it was chosen
        assert all(len(seconds[row["engine"]][count]) == 3 for count in (1, 2))
        assert ("plan" in row) == ("vs_eager" in row) == row["engine"].startswith("seqbert_optimized")
        if "plan" not in row:
            continue
        assert set(row["plan"]) == set(row["plan_chosen_by"]) == {1, 2}
        assert all(by == "measurement" or by.startswith("default plan: ") for by in row["plan_chosen_by"].values())
        for count in (1, 2):
            eager, optimized = seconds["seqbert"][count], seconds[row["engine"]][count]
            assert row["vs_eager"][count] == pytest.approx(sorted(eager)[1] / sorted(optimized)[1])  # medians of 3
            paired = [e / o for e, o in zip(eager, optimized, strict=True)]
            assert row["vs_eager_range"][count] == [min(paired), max(paired)]
    processes = [[f"{name}@{count}" for name in engines] for count in (1, 2)]
    for turn, order in enumerate(rounds):
        runs = [benchmark_threads.rotated(process, turn) for process in processes]
        assert order == sum(benchmark_threads.rotated(runs, turn), []), (turn, order)
    assert [order[0] for order in rounds] == ["transformers@1", "seqbert@2", "seqbert_optimized@1"]
    for row in rows:
        assert all(len(rates) == 2 for rates in (row["tokens_per_s"], row["agreement"]))
        assert row["agrees"], row
        for found in row["agreement"].values():
            if row["precision"] == "fp32":
                assert found["max_abs_delta"] <= benchmark_threads.FP32_MAX_ABS_DELTA
            else:  # int8 moves hidden states, yet keeps them and each embedding
                assert found["max_abs_delta"] > benchmark_threads.FP32_MAX_ABS_DELTA
                assert found["relative_error"] <= benchmark_threads.LOW_PRECISION_MAX_RELATIVE_ERROR
                assert found["min_cosine"] >= benchmark_threads.LOW_PRECISION_MIN_COSINE


@pytest.mark.benchmark_run
def test_a_disagreement_is_reported_and_fails_the_run(torch_engines, tmp_path, capsys):
    """One real token of the reference moved by 0.01, the same engines' outputs checked against it: the fp32 engines
    disagree (printed, recorded, and the run ends with an error once the JSON is written); int8, held to int8's
    tolerances, still agrees."""
    reference, measurement = torch_engines
    states = reference["states"].clone()
    states[0] += 0.01
    capsys.readouterr()
    rows = benchmark_threads.rechecked(measurement, reference | {"states": states})
    assert {row["engine"]: row["agrees"] for row in rows} == {
        "transformers": False, "seqbert": False, "seqbert_optimized": False, "seqbert_optimized_int8": True
    }  # fmt: skip
    assert capsys.readouterr().out.count("DISAGREES: MiniLM-L6") == 6  # three fp32 engines at two thread counts
    assert [row["tokens_per_s"] for row in rows] == [row["tokens_per_s"] for row in measurement.rows]
    result = {"settings": {"native": {"rows": rows}}}
    with pytest.raises(benchmark_threads.EngineDisagreement, match=r"3 engine run\(s\) disagree") as raised:
        benchmark_threads.finish(result, str(tmp_path / "threads.json"))
    assert "native: MiniLM-L6 transformers (fp32)" in str(raised.value)
    written = json.loads((tmp_path / "threads.json").read_text())
    assert [line.split(" (")[0] for line in written["disagreements"]] == [
        "native: MiniLM-L6 transformers", "native: MiniLM-L6 seqbert", "native: MiniLM-L6 seqbert_optimized"
    ]  # fmt: skip
    assert written["settings"]["native"]["rows"][0]["agreement"]["1"]["max_abs_delta"] >= 0.0099


def test_what_agrees_with_the_reference(minilm_path):
    """The tolerances on MiniLM's real hidden states: fp32 within 1e-4 absolute; below fp32 a relative error of 10 %
    (int8's size) passes, each snippet's tokens reversed does not, though mean-pooling cannot see it; neither does an
    int8 engine that runs the eager fp32 layers, nor outputs of another shape."""
    reference = benchmark_threads.reference_outputs(str(minilm_path), 1)
    states = reference["states"]
    noise = torch.randn(states.shape, generator=torch.Generator().manual_seed(0))
    close = states + 0.1 * noise * states.norm() / noise.norm()
    reversed_tokens = torch.cat([chunk.flip(0) for chunk in states.split(reference["lengths"])])
    agreement = benchmark_threads.agreement
    assert agreement((states + 5e-5).numpy(), reference, "fp32")["agrees"]
    assert not agreement((states + 2e-4).numpy(), reference, "fp32")["agrees"]
    assert agreement(close.numpy(), reference, "int8") == {
        "max_abs_delta": pytest.approx((close - states).abs().max().item()),
        "relative_error": pytest.approx(0.1, rel=1e-4),
        "min_cosine": pytest.approx(1.0, abs=0.02),
        "agrees": True,
    }
    assert not agreement(close.numpy(), reference, "fp32")["agrees"]
    wrong = agreement(reversed_tokens.numpy(), reference, "bf16")
    assert wrong["min_cosine"] == pytest.approx(1.0) and wrong["relative_error"] > 1 and not wrong["agrees"]
    assert agreement(states.numpy(), reference, "int8", eager_layers=True) == {
        "max_abs_delta": 0.0, "relative_error": 0.0, "min_cosine": pytest.approx(1.0), "agrees": False,
        "eager_layers": True,
    }  # fmt: skip
    assert agreement(states[:-1].numpy(), reference, "fp32")["agrees"] is False
