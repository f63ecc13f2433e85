"""The fake CUDA device of the dry run (`fake_cuda_shim.py`): where it cannot be had, `load()` says why, naming what is
missing, and the dry run skips with that reason (or fails under `SEQBERT_REQUIRE_CUDA_DRY_RUN=1`, as in CI). Each case
runs in a fresh interpreter, since the shim must be loaded before torch is imported."""

import os
import subprocess
import sys
from pathlib import Path

import fake_cuda_shim


TESTS = Path(__file__).resolve().parent


def _load_in_a_fresh_process(code: str = "", **environment) -> str:
    script = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n{code}\nimport fake_cuda_shim\nprint(fake_cuda_shim.load())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, **environment}, check=True
    )
    return result.stdout.strip().splitlines()[-1]


def test_this_machine_has_the_fake_device():
    """CI builds the shim: `conftest.py` loaded it, so the dry run runs (tests/test_cuda_dry_run.py)."""
    assert fake_cuda_shim.unavailable is None, fake_cuda_shim.unavailable


def test_without_a_compiler_the_reason_names_it():
    reason = _load_in_a_fresh_process(PATH="/nonexistent", CXX="")
    assert "needs a C++ compiler" in reason and "none of $CXX, g++, c++, clang++ is on PATH" in reason


def test_after_torch_is_imported_it_refuses():
    reason = _load_in_a_fresh_process("import torch")
    assert reason == "the fake CUDA shim must be loaded before torch is imported (tests/conftest.py does it first)"


def test_another_torch_release_is_named():
    code = "import importlib.metadata; importlib.metadata.version = lambda name: '2.99.0+cpu'"
    reason = _load_in_a_fresh_process(code)
    assert reason.startswith(f"the CUDA dry run is pinned to torch {fake_cuda_shim.PINNED_TORCH}")
    assert reason.endswith("this is torch 2.99.0+cpu")


def test_the_dry_run_fails_instead_of_skipping_where_it_is_required(tmp_path):
    """With `SEQBERT_REQUIRE_CUDA_DRY_RUN=1` (CI) and no compiler, collecting the dry run is an error, not a skip."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(TESTS / "test_cuda_dry_run.py"), "-n", "0", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:/nonexistent", "CXX": "",
             "SEQBERT_REQUIRE_CUDA_DRY_RUN": "1", "SEQBERT_FAKE_CUDA_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.returncode != 0
    assert "SEQBERT_REQUIRE_CUDA_DRY_RUN is set, but the CUDA dry run cannot run" in result.stdout, result.stdout[
        -3000:
    ]


def test_torchs_symbols_stay_out_of_the_global_scope():
    """The shim is loaded with RTLD_LOCAL. Loaded RTLD_GLOBAL, it would put its dependency libtorch_cpu's exported
    symbols (its BLAS `sgemm_`, for one) ahead of every later library's, and CTranslate2's encoder then computed
    hidden states off by ~6 (every CTranslate2 test failed in CI). torch itself loads libtorch_cpu locally."""
    import ctypes

    assert fake_cuda_shim.library is not None or fake_cuda_shim.cuda_build
    assert not hasattr(ctypes.CDLL(None), "sgemm_")
