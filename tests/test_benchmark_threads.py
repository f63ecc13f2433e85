"""scripts/benchmarks/benchmark_threads.py: what its AVX2 setting holds (torch, oneDNN, CTranslate2, each read back
from the library in a fresh process) and its refusals."""

import os
import subprocess
import sys

import benchmark_threads
import pytest

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
