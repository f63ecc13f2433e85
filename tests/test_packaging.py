"""seqbert as a real package: `python -m build` gives a wheel and an sdist with the model-card template as package data
and one version (`seqbert.configuration_seqbert.SEQBERT_VERSION`), and the main job run against the installed wheel,
not the source tree, writes a true model card and a folder that records the seqbert version.

The build runs in an isolated environment whose build backend (setuptools) pip fetches from the package index. Where the
index cannot be reached, it runs in this environment instead (`--no-isolation`) when its setuptools meets the build's
requirement, and is skipped, with the command that installs it, when not."""

import json
import os
import subprocess
import sys
import tarfile
import zipfile

import build
import pytest
from conftest import ROOT, SCRIPT_PATHS, package_index_reachable
from huggingface_hub import ModelCard

import seqbert
from seqbert.configuration_seqbert import SEQBERT_VERSION


def build_command(out) -> list[str]:
    """`python -m build` into `out`: isolated, or without the package index in this environment (see above)."""
    command = [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)]
    if package_index_reachable():
        return command
    requires = sorted(build.ProjectBuilder(str(ROOT)).build_system_requires)
    if any(list(build.check_dependency(requirement)) for requirement in requires):
        pytest.skip(
            f"the build backend ({', '.join(requires)}) is not installed and the package index cannot be reached: run "
            f"`pip install {' '.join(repr(requirement) for requirement in requires)}` online"
        )
    return [*command, "--no-isolation"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(build_command(out), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out


def test_wheel_and_sdist_carry_the_template_and_one_version(dist):
    assert seqbert.__version__ == SEQBERT_VERSION
    (wheel,) = dist.glob(f"seqbert-{SEQBERT_VERSION}-py3-none-any.whl")
    (sdist,) = dist.glob(f"seqbert-{SEQBERT_VERSION}.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "seqbert/hub_card/model_card_template.md",
        "seqbert/modeling_seqbert.py",
        "seqbert/attention_backends.py",
        "seqbert/input_checks.py",
        "seqbert/packed_cpu_linears.py",
        "seqbert/peft_integration.py",
        "seqbert/transformers_compat.py",
        "seqbert/metrics/accuracy.py",
    } <= names
    members = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    assert {
        "hub_card/model_card_template.md",
        "scripts/examples/run_classification.py",
        "src/seqbert/hub.py",
    } <= members


def test_the_main_job_on_the_installed_wheel_writes_a_card(dist, tmp_path):
    (wheel,) = dist.glob("seqbert-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    # This environment has seqbert installed editable (a meta path finder onto the source tree): drop it, and put the
    # wheel's files first, so that the job imports the installed package, as a non-editable install would.
    prelude = (
        "import runpy, sys; "
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in type(f).__module__.lower()]; "
        f"sys.path.insert(0, {str(target)!r}); "
        "import seqbert; "
        f"assert seqbert.__file__.startswith({str(target)!r}), seqbert.__file__; "
        f"sys.argv = [{str(SCRIPT_PATHS['run_classification.py'])!r}] + sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-c", prelude, "--output_dir", str(output_dir), "--max_train_samples", "32",
        "--max_eval_samples", "32", "--num_train_epochs", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    card = ModelCard.load(output_dir / "README.md")
    assert f"seqbert {SEQBERT_VERSION}" in card.text
    assert json.loads((output_dir / "config.json").read_text())["seqbert_version"] == SEQBERT_VERSION
