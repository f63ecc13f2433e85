"""The CPU-dependent tests (marked `cpu_semantics`: int8 products, the saturation probe, every plan's kernels, int8 in
every call form) once more with torch and oneDNN held to AVX2, whatever CPU runs the suite; the timing tests (marked
`timing`) skip there, saying why.

An ISA cap reproduces an older CPU's instruction semantics (oneDNN's AVX2 level has no VNNI, so its u8 x s8 products
sum pairs in saturating int16, as on an AMD Zen 3), not its speed. Run on an AVX-512 machine, the suite alone never
took those kernels, and an int8 linear that was wrong on every AVX2 CPU passed here; with this run a saturation
fault fails on any x86 machine. Speed is another matter: timings taken under a cap are neither CPU's, so a test that
asserts what timings measure (`conftest.timing_test`) skips under one. The same can be run by hand:

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m pytest -m "cpu_semantics or timing" -n 0
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqbert.cpu_inference import onednn_x86_operators_available


ROOT = Path(__file__).resolve().parents[1]
CAP = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


@pytest.mark.skipif(not onednn_x86_operators_available(), reason="the AVX2 cap applies to x86 CPUs with oneDNN")
def test_cpu_dependent_tests_pass_with_torch_and_onednn_held_to_avx2():
    command = [sys.executable, "-m", "pytest", "-m", "cpu_semantics or timing", "-n", "0", "-p", "no:cacheprovider"]
    command += ["-rA", "-q", "tests/test_int8.py", "tests/test_cpu_inference.py", "tests/test_cpu_call_forms.py"]
    command += ["tests/test_cpu_plans.py", "tests/test_cpu_generation.py"]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **CAP}, capture_output=True, text=True, timeout=900
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # The tests that would catch a saturation fault ran under the cap (none skipped), the probe saying it saturates in
    # every call form; int8 measured beside a busy process, and int8 in every call form of an optimized copy, its
    # decoder and LM head included, computed in int8 there too.
    for test in (
        "test_int8.py::test_int8_linear_is_the_dequantized_product",
        "test_int8.py::test_saturation_probe_follows_the_instructions_onednn_may_use",
        "test_cpu_inference.py::test_every_plan_gives_berts_numbers",
        "test_cpu_inference.py::test_int8_optimized_model_keeps_sentence_embeddings",
        "test_cpu_inference.py::test_int8_computes_in_int8_beside_a_busy_process",
        "test_cpu_call_forms.py::test_recorded_outputs_and_hooks_see_the_precision_asked_for[int8]",
        "test_cpu_call_forms.py::test_a_model_that_recorded_before_it_was_optimized_and_the_unpadded_path[int8]",
        "test_cpu_call_forms.py::test_torch_compile_runs_the_precision_outside_the_graph[int8]",
        "test_cpu_generation.py::test_decoder_and_lm_head_compute_in_the_precision_asked_for[int8]",
        "test_cpu_generation.py::test_cached_decoding_static_cache_and_beam_reordering[int8]",
        "test_cpu_generation.py::test_recorded_outputs_hooks_and_gradients_keep_the_precision[int8]",
    ):
        assert f"PASSED tests/{test}" in output, output[-6000:]
    # ... and the timing test skipped, saying why.
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED") and "a timing test: held to" in line]
    assert len(skipped) == 1 and "test_cpu_plans.py" in skipped[0], output[-6000:]
