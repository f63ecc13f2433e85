"""Builds and loads `fake_cuda_shim.cpp`, the fake CUDA device that lets the dry run (`fake_cuda.py`,
`test_cuda_dry_run.py`) execute seqbert's CUDA path on a CPU-only build of torch. Imports nothing of torch: the shim
must be loaded before torch is (`getCUDAHooks()` is fixed at torch's import), so `conftest.py` calls `load()` first.

The shim is compiled with the machine's C++ compiler against the installed torch's own headers and libraries, about
2 s, once per torch release and source (cached under `~/.cache/seqbert/fake-cuda/`, or `SEQBERT_FAKE_CUDA_CACHE`).
It is pinned to `PINNED_TORCH`, the release the dry run was written and checked against: the meta kernels, fake-tensor
rules and hooks it leans on are torch internals. A CUDA build of torch needs no shim (FakeTensorMode installs its own
fake guard there), so nothing is loaded; the dry run runs on it all the same.

`load()` returns None when the fake device is ready, else the reason it is not, naming what is missing; the dry run
skips with that reason, or fails where `SEQBERT_REQUIRE_CUDA_DRY_RUN=1` says it must run (CI, `.ci/run`).
"""

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


# The torch release the shim and the dry run were built and checked for.
PINNED_TORCH = "2.13.0"
SOURCE = Path(__file__).with_name("fake_cuda_shim.cpp")
REQUIRED_VARIABLE = "SEQBERT_REQUIRE_CUDA_DRY_RUN"

# What `load()` found: the loaded library (None on a CUDA build) and why the fake device is unavailable (None: ready).
library: ctypes.CDLL | None = None
unavailable: str | None = "fake_cuda_shim.load() has not run"
cuda_build = False
attempted = False


def _torch_folder() -> Path | None:
    spec = importlib.util.find_spec("torch")
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(torch_folder: Path, compiler: str, version: str) -> Path:
    """The shim's shared library for this torch and source, compiled on first use (atomically: parallel test workers
    may build it at once)."""
    key = hashlib.sha256(SOURCE.read_bytes() + f"{version}|{torch_folder}|{compiler}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("SEQBERT_FAKE_CUDA_CACHE", Path.home() / ".cache" / "seqbert" / "fake-cuda"))
    target = root / f"torch-{version}-{key}" / "libseqbert_fake_cuda.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
        pass
    command = [
        compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-w", str(SOURCE), "-o", partial.name,
        f"-I{torch_folder / 'include'}", f"-L{torch_folder / 'lib'}", "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{torch_folder / 'lib'}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(partial.name)
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    os.replace(partial.name, target)
    return target


def load() -> str | None:
    """Build and load the shim unless torch is a CUDA build; set and return `unavailable` (None: the fake device is
    ready). Call before `import torch`; a later call returns the first call's answer."""
    global library, unavailable, cuda_build, attempted
    if attempted:  # conftest tried before a test imported a script that asks again: its answer stands
        return unavailable
    attempted = True
    if "torch" in sys.modules:
        unavailable = "the fake CUDA shim must be loaded before torch is imported (tests/conftest.py does it first)"
        return unavailable
    torch_folder = _torch_folder()
    if torch_folder is None:
        unavailable = "torch is not installed"
        return unavailable
    version = importlib.metadata.version("torch")
    if version.split("+")[0] != PINNED_TORCH:
        unavailable = (
            f"the CUDA dry run is pinned to torch {PINNED_TORCH}, the release its fake-CUDA shim and harness were "
            f"built and checked against; this is torch {version}"
        )
        return unavailable
    if any((torch_folder / "lib").glob("libtorch_cuda*.so")):
        cuda_build, unavailable = True, None  # FakeTensorMode brings its own fake CUDA guard on a CUDA build
        return unavailable
    compiler = _compiler()
    if compiler is None:
        unavailable = (
            "the CUDA dry run needs a C++ compiler to build its fake CUDA device (tests/fake_cuda_shim.cpp) against "
            "torch's headers: none of $CXX, g++, c++, clang++ is on PATH (Debian: apt install g++)"
        )
        return unavailable
    if not (torch_folder / "include" / "ATen" / "detail" / "CUDAHooksInterface.h").exists():
        unavailable = f"the CUDA dry run needs torch's C++ headers, and {torch_folder / 'include'} has none"
        return unavailable
    try:  # RTLD_LOCAL: globally, libtorch_cpu's symbols (its `sgemm_`) would displace CTranslate2's own
        library = ctypes.CDLL(str(_build(torch_folder, compiler, version)), mode=ctypes.RTLD_LOCAL)
    except (RuntimeError, OSError) as error:
        unavailable = f"building or loading the fake CUDA shim failed: {error}"
        return unavailable
    library.seqbert_fake_cuda_enable.argtypes = [ctypes.c_bool]
    unavailable = None
    return unavailable


def enable(on: bool) -> None:
    """Turn the shim's CUDA hooks on (while a fake GPU is entered) or off; nothing on a CUDA build."""
    if library is not None:
        library.seqbert_fake_cuda_enable(on)


def required() -> bool:
    """Whether the dry run must run here (`SEQBERT_REQUIRE_CUDA_DRY_RUN=1`, set by CI), so that a skip is a failure."""
    return os.environ.get(REQUIRED_VARIABLE, "") not in ("", "0")
