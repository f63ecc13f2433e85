"""Saved SeqBERT folders on the oldest supported transformers release, 5.0.0, in a virtual environment that holds only
torch and transformers (no seqbert): every encoder head, the causal LM and the seq2seq model (forward, greedy and
beam-4 `generate`) and a Trainer checkpoint give exactly this environment's outputs. On transformers 4.x loading stops
with SeqBERT's one-line message. The environments are built once by scripts/checks/check_transformers_versions.py (which
checks every release) and cached in ~/.cache/seqbert/venvs; without the package index the tests skip unless both are
cached there."""

import check_environments
import check_transformers_versions  # noqa: E402
import pytest
from conftest import skip_module_without_package_index

import seqbert
from seqbert.configuration_seqbert import MIN_TRANSFORMERS_VERSION, check_transformers_version


VENV_ROOT = check_environments.DEFAULT_VENV_ROOT  # where the checks build their environments
# The releases these tests load folders on: the oldest supported one, and the last 4.x (refused in one line).
RELEASES = (MIN_TRANSFORMERS_VERSION, "4.57.6")

if not all(check_transformers_versions.is_built(VENV_ROOT, version) for version in RELEASES):
    skip_module_without_package_index(
        f"the transformers {' and '.join(RELEASES)} environments",
        f"python scripts/checks/check_transformers_versions.py --versions {' '.join(RELEASES)}",
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    work = tmp_path_factory.mktemp("versions")
    return work, check_transformers_versions.reference_folders(work)


def test_every_folder_gives_identical_outputs_on_the_oldest_supported_release(folders):
    work, saved = folders
    assert MIN_TRANSFORMERS_VERSION == "5.0.0"
    results = check_transformers_versions.check([MIN_TRANSFORMERS_VERSION], saved, VENV_ROOT, work)
    assert results == {"5.0.0": "identical"}
    assert {folder.name for folder in saved} >= {
        "SeqBertForConditionalGeneration",
        "SeqBertForCausalLM",
        "checkpoint-2",
    }


def test_transformers_4_stops_with_one_line_naming_the_version_needed(folders, monkeypatch):
    work, saved = folders
    results = check_transformers_versions.check([RELEASES[1]], saved[:1], VENV_ROOT, work)
    assert results[RELEASES[1]] == (
        "fails: ImportError: SeqBERT models need transformers >= 5.0.0, but transformers 4.57.6 is installed: "
        "pip install -U 'transformers>=5.0.0'"
    )
    monkeypatch.setattr(seqbert.configuration_seqbert.transformers, "__version__", "4.40.0")
    with pytest.raises(ImportError, match=r"need transformers >= 5\.0\.0, but transformers 4\.40\.0 is installed"):
        check_transformers_version()
