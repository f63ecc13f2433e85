"""The cached virtual environments the checks run in, and the runner of their workers (no check of its own).

check_transformers_versions.py, check_optimum.py and check_llama_cpp.py each need packages this environment cannot
hold (another transformers release, optimum-intel, llama.cpp's converter). Each builds an environment of its own with
`cached_environment` under a root folder (`DEFAULT_VENV_ROOT` unless told otherwise) and reuses it while its `.complete`
marker records what it was built with. To save time and disk they share one torch: the torch-only environment
`torch-<version>` (`torch_environment`, the version of the torch running here) is built once, and every other
environment reaches it through a `.pth` file; its own site-packages come first on the path. Each check then runs its
jobs there with `run_worker`: a worker, given a JSON file of jobs, writes its results to a file this side reads back.

This module imports only the standard library at its top: the workers import the checks, and with them this module,
in environments that have neither seqbert nor (llama.cpp's) transformers 5.
"""

import json
import os
import shlex
import subprocess
import venv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


DEFAULT_VENV_ROOT = Path.home() / ".cache" / "seqbert" / "venvs"
# The file whose presence (and contents: what the environment was built with, one item a line) marks an environment
# as built; an environment whose build stopped half-way has none and is built again.
COMPLETE_MARKER = ".complete"
# The file in each environment's site-packages that puts the shared torch environment's site-packages on its path.
SHARED_TORCH_PTH = "_seqbert_shared_torch.pth"


def torch_version() -> str:
    """The version of the torch running here, without its local part (`2.13.0`, not `2.13.0+cpu`): the torch the
    environments share."""
    import torch

    return torch.__version__.split("+")[0]


def python_of(environment: Path) -> Path:
    """The Python interpreter of the virtual environment `environment`."""
    return environment / "bin" / "python"


def site_packages(environment: Path) -> Path:
    """The site-packages folder of the virtual environment `environment`.

    Raises:
        RuntimeError: the environment has no single `lib/python*/site-packages` folder.
    """
    found = list((environment / "lib").glob("python*/site-packages"))
    if len(found) != 1:
        raise RuntimeError(f"cannot find the site-packages folder of {environment}")
    return found[0]


def run_pip(environment: Path, command: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run `pip COMMAND --quiet --disable-pip-version-check ARGS...` with the environment's Python.

    Args:
        environment: the virtual environment.
        command: the pip command (`install`, `download`, `uninstall`).
        *args: its arguments.
        env: the process environment (default: this one's), for example with `CMAKE_ARGS` for a build from source.

    Raises:
        RuntimeError: pip failed; the message holds the command and the end of its output.
    """
    python = str(python_of(environment))
    full = [python, "-m", "pip", command, "--quiet", "--disable-pip-version-check", *args]
    result = subprocess.run(full, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(full)} failed:\n{(result.stdout + result.stderr)[-3000:]}")


def is_built(root: Path, name: str, built_with: Sequence[str] = ()) -> bool:
    """Whether the environment `name` under `root` is built, with `built_with` (what `cached_environment` was given;
    one built with something else is built again)."""
    marker = root / name / COMPLETE_MARKER
    return marker.exists() and marker.read_text().splitlines() == list(built_with)


def _mark_built(folder: Path, built_with: Sequence[str]) -> None:
    (folder / COMPLETE_MARKER).write_text("".join(f"{item}\n" for item in built_with))


def torch_environment(root: Path, pip_args: str = "") -> Path:
    """The torch-only environment `root/torch-<version>` every other environment shares, built once.

    Args:
        root: the folder the environments live in.
        pip_args: extra pip arguments for installing torch (for example
            `--index-url https://download.pytorch.org/whl/cpu` where PyPI's torch is the CUDA build).

    Returns:
        The environment's folder.

    Raises:
        RuntimeError: pip could not install torch.
    """
    version = torch_version()
    folder = root / f"torch-{version}"
    with _building(root, folder.name):
        if not is_built(root, folder.name):
            venv.create(folder, with_pip=True, clear=True)
            run_pip(folder, "install", f"torch=={version}", *shlex.split(pip_args))
            _mark_built(folder, ())
    return folder


def _building(root: Path, name: str):
    """A lock on the environment `root/name` (`filelock.FileLock` on `root/name.lock`), held while it is checked and
    built: two processes that need it at once (the test suite's parallel workers, two checks run side by side) build
    it once, the second waiting for the first, instead of both writing into one folder."""
    from filelock import FileLock  # not at the top: the workers import this module where it may be absent

    root.mkdir(parents=True, exist_ok=True)
    return FileLock(root / f"{name}.lock")


def cached_environment(
    root: Path,
    name: str,
    install: Callable[[Path], None],
    built_with: Sequence[str] = (),
    pip_args: str = "",
) -> Path:
    """The virtual environment `root/name` with the shared torch, built once and reused while it is built with
    `built_with`.

    Building it builds the shared torch environment first (`torch_environment`) if it is not built, creates a fresh
    virtual environment (with pip), puts the shared torch's site-packages on its path through a `.pth` file, runs
    `install` and writes the marker `is_built` reads.

    Args:
        root: the folder the environments live in.
        name: the environment's folder name under `root`, its cache key.
        install: installs what the environment holds; called with the environment's folder (`run_pip` installs into
            it). Pin torch to `torch_version()` among its requirements, so that nothing pulls in another torch.
        built_with: what the environment is built with (its requirements, build options), one item a line in its
            marker; an environment built with something else is built again. Empty: the name alone is the key.
        pip_args: extra pip arguments for installing the shared torch (`torch_environment`).

    Returns:
        The environment's folder (its Python: `python_of`).

    Raises:
        RuntimeError: an install step failed (the environment stays unmarked and is built afresh next time).
    """
    folder = root / name
    with _building(root, name):
        if not is_built(root, name, built_with):
            shared = torch_environment(root, pip_args)
            venv.create(folder, with_pip=True, clear=True)
            (site_packages(folder) / SHARED_TORCH_PTH).write_text(f"{site_packages(shared)}\n")
            install(folder)
            _mark_built(folder, built_with)
    return folder


@dataclass
class WorkerResult:
    """What `run_worker` got back from a worker process.

    Attributes:
        results: the worker's results file, parsed (a dict; tensors for `results_format="safetensors"`), or None if
            the worker failed.
        error: empty if the worker succeeded; else the last non-blank line of its error output (or its exit status).
        returncode: the worker's exit status.
        stdout: its standard output.
        stderr: its error output.
    """

    results: dict | None
    error: str
    returncode: int
    stdout: str
    stderr: str


def run_worker(
    python: str | Path,
    worker: str | Path,
    jobs: list[dict],
    work: Path,
    name: str = "worker",
    results_format: str = "json",
    env: dict[str, str] | None = None,
    pythonpath: Sequence[str | Path] = (),
    check: bool = False,
) -> WorkerResult:
    """Run a worker on `jobs` with `python`, offline, in `work`, and read its results back.

    The jobs are written to `work/<name>.json`; the worker is called with that file and the results file it must
    write (`work/<name>.results.json` or `work/<name>.safetensors`). It runs with `work` as its working folder,
    standard input closed (a trust_remote_code prompt must not wait for an answer), `HF_HUB_OFFLINE=1`, a dynamic-module
    cache of its own (`HF_MODULES_CACHE=work/modules-<name>`) and `PYTHONPATH` set to `pythonpath` (removed if empty).

    Args:
        python: the interpreter (an environment's `python_of`, or `sys.executable`).
        worker: a script (a `Path`), run as `python SCRIPT JOBS RESULTS`, or `"module:function"` (a `str`), run as
            `function(JOBS, RESULTS)` after `import module` (put the module's folder on `pythonpath`).
        jobs: the jobs, as JSON.
        work: the folder of the jobs, the results and the worker's working folder.
        name: the stem of the files (distinct per run in one `work` folder).
        results_format: `"json"` (read with `json`) or `"safetensors"` (read with `safetensors.torch.load_file`).
        env: extra environment variables for the worker, over this process's.
        pythonpath: the worker's `PYTHONPATH` entries.
        check: raise if the worker fails, instead of returning the error.

    Returns:
        The `WorkerResult`: parsed results, or None and the error.

    Raises:
        ValueError: `results_format` is neither `"json"` nor `"safetensors"`.
        RuntimeError: with `check=True`, the worker failed; the message holds the end of its error output.
    """
    if results_format not in ("json", "safetensors"):
        raise ValueError(f"results_format must be 'json' or 'safetensors', not {results_format!r}")
    jobs_file = work / f"{name}.json"
    results_file = work / (f"{name}.results.json" if results_format == "json" else f"{name}.safetensors")
    jobs_file.write_text(json.dumps(jobs))
    process_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(work / f"modules-{name}"),
        **(env or {}),
    }
    process_env.pop("PYTHONPATH", None)
    if pythonpath:
        process_env["PYTHONPATH"] = os.pathsep.join(str(entry) for entry in pythonpath)
    if isinstance(worker, Path):
        command = [str(python), str(worker)]
    else:
        module, function = worker.split(":")
        command = [str(python), "-c", f"import sys, {module}; {module}.{function}(sys.argv[1], sys.argv[2])"]
    result = subprocess.run(
        [*command, str(jobs_file), str(results_file)],
        capture_output=True,
        text=True,
        env=process_env,
        cwd=work,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        if check:
            raise RuntimeError(f"{worker} failed with {python}:\n{result.stderr[-4000:]}")
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        error = lines[-1] if lines else f"exit status {result.returncode}"
        return WorkerResult(None, error, result.returncode, result.stdout, result.stderr)
    if results_format == "json":
        results = json.loads(results_file.read_text())
    else:
        from safetensors.torch import load_file

        results = load_file(results_file)
    return WorkerResult(results, "", result.returncode, result.stdout, result.stderr)
