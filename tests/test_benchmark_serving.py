"""scripts/benchmarks/benchmark_serving.py runs every deploy route of a saved SeqBERT folder (MiniLM's real weights) on
real text, and each fp32 route gives seqbert's hidden states within the tolerance its own tests hold it to, so the
speed table compares like with like. No timing is asserted: the machine is shared. A `benchmark_run` test, run on
demand (`python -m pytest -m benchmark_run`; about 40 s of CPU): each route has tests of its own in the default run
(test_serving_artifacts.py, test_ctranslate2_loader.py, test_export_bert.py, test_cpu_inference.py), and the benchmark
records every route's delta whenever it runs."""

import json
import math

import benchmark_serving  # noqa: E402  (scripts/benchmarks, on sys.path by conftest)
import pytest

from seqbert.cpu_inference import bf16_instructions_available, bf16_linear_available


# Max |delta| from seqbert's fp32 `SeqBertModel` on real tokens, per fp32 route, as each route's own tests bound it.
FP32_TOLERANCES = {
    "seqbert": 0.0,  # the reference itself
    "seqbert_optimized": 1e-5,  # tests/test_cpu_inference.py
    "onnxruntime": 1e-4,  # tests/test_serving_artifacts.py (TOLERANCE)
    "onnxruntime_optimized": 1e-4,
    "openvino_f32": 1e-4,
    "ctranslate2": 1.5e-5,  # tests/test_ctranslate2_loader.py (FP32_TOLERANCE)
    "bert_sdpa": 1e-5,  # tests/test_export_bert.py (SDPA_TOLERANCE)
}
BF16_TOLERANCE = 0.1  # tests/test_benchmark_engines.py, OpenVINO at its default bf16


@pytest.mark.benchmark_run
def test_every_route_runs_and_the_fp32_ones_give_seqberts_hidden_states(tmp_path):
    json_file = tmp_path / "serving.json"
    results = benchmark_serving.main(["--quick", "--json_file", str(json_file)])
    assert json.loads(json_file.read_text())["workloads"] == results["workloads"]
    (row,) = results["workloads"]  # --quick: the real-length batch only
    assert row["workload"] == "real_length" and row["padding_fraction"] > 0

    routes = row["routes"]
    bf16 = bf16_instructions_available() and bf16_linear_available()
    expected = [name for name in benchmark_serving.ROUTES if bf16 or name != "seqbert_optimized_bf16"]
    assert list(routes) == expected
    for name, route in routes.items():
        assert math.isfinite(route["tokens_per_s"]) and route["tokens_per_s"] > 0, name
        assert math.isfinite(route["max_abs_delta"]), name
    for name, tolerance in FP32_TOLERANCES.items():
        assert routes[name]["precision"] == "fp32", name
        assert routes[name]["max_abs_delta"] <= tolerance, (name, routes[name]["max_abs_delta"])
    for name, route in routes.items():
        if route["precision"] != "fp32":
            assert route["max_abs_delta"] > 0, name  # it computed in int8 or bf16
    # OpenVINO's CPU default is bf16 where the CPU has bf16 instructions, f32 elsewhere; the route reports which.
    assert routes["openvino_default"]["precision"] == ("bf16" if bf16_instructions_available() else "fp32")
    if routes["openvino_default"]["precision"] == "bf16":
        assert routes["openvino_default"]["max_abs_delta"] < BF16_TOLERANCE
    if bf16:
        assert routes["seqbert_optimized_bf16"]["max_abs_delta"] < BF16_TOLERANCE
    assert routes["onnxruntime_int8"]["precision"] == routes["ctranslate2_int8"]["precision"] == "int8"
