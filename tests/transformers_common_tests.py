"""transformers' own model tests, from the source distribution of the installed transformers, for SeqBERT.

transformers runs `ModelTesterMixin` (tests/test_modeling_common.py) and `ConfigTester` (tests/test_configuration_common.py)
against every built-in model. Neither ships in the wheel; the sdist on PyPI has both, as top-level files of its
`tests/` folder. `load()` downloads that sdist once (pip, no dependencies), extracts the two files into a cache folder
and imports them as the package `transformers_common_tests_<version>`. Nothing of it is committed here.

The sdist's `tests/` folder has no sub-folders, so three modules the two files import relatively are missing. They are
written here, and each says what it stands for:
- `exporters/test_export.py`: `ExportTesterMixin`, the base of `ModelTesterMixin` that adds transformers' export tests
  (SeqBERT's export tests are tests/test_export.py instead);
- `generation/test_utils.py`: `GenerationTesterMixin`, transformers' generation tests (SeqBERT's generation is tested
  against `EncoderDecoderModel` and `BertLMHeadModel` in tests/test_bert2bert.py and tests/test_causal_lm.py);
- `utils/test_configuration_utils.py`: `config_common_kwargs`, which `ConfigTester` passes to the config to check that
  `PreTrainedConfig`'s own fields are set: every such field of the installed transformers, each with a non-default
  value.

The cache folder is `$SEQBERT_TRANSFORMERS_TESTS_CACHE` or `~/.cache/seqbert/transformers-tests`; without the package
index, tests/test_transformers_common.py skips unless it is filled. `python tests/transformers_common_tests.py` fills
it for the installed transformers.
"""

import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers
from filelock import FileLock


FILES = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
STUBS = {
    "exporters/test_export.py": (
        '"""Stand-in: the transformers sdist lacks tests/exporters/. SeqBERT\'s export tests are its own."""\n\n\n'
        "class ExportTesterMixin:\n    pass\n"
    ),
    "generation/test_utils.py": (
        '"""Stand-in: the transformers sdist lacks tests/generation/. SeqBERT\'s generation tests are its own."""\n\n\n'
        "class GenerationTesterMixin:\n    pass\n"
    ),
    "utils/test_configuration_utils.py": (
        '"""Stand-in: the transformers sdist lacks tests/utils/. Every field PreTrainedConfig sets itself, with a value\n'
        'that is not its default."""\n\n'
        "config_common_kwargs = {\n"
        '    "return_dict": False,\n'
        '    "output_hidden_states": True,\n'
        '    "output_attentions": True,\n'
        '    "dtype": "float16",\n'
        '    "chunk_size_feed_forward": 5,\n'
        '    "architectures": ["SeqBertModel"],\n'
        '    "id2label": {0: "label"},\n'
        '    "label2id": {"label": 0},\n'
        '    "problem_type": "regression",\n'
        "}\n"
    ),
}


def cache_folder() -> Path:
    root = (
        os.environ.get("SEQBERT_TRANSFORMERS_TESTS_CACHE") or Path.home() / ".cache" / "seqbert" / "transformers-tests"
    )
    return Path(root) / transformers.__version__


def package_name() -> str:
    return "transformers_common_tests_" + transformers.__version__.replace(".", "_").replace("-", "_")


def _fetch(target: Path) -> None:
    """Download the transformers sdist of the installed version and write the package into `target`."""
    with tempfile.TemporaryDirectory() as download:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
            f"transformers=={transformers.__version__}", "--dest", download,
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"could not download the transformers {transformers.__version__} sdist from PyPI (needed for "
                f"transformers' own model tests): {result.stderr.strip()[-2000:]}"
            )
        (archive,) = Path(download).glob("transformers-*.tar.gz")
        staging = Path(tempfile.mkdtemp(dir=target.parent))
        package = staging / package_name()
        with tarfile.open(archive) as sdist:
            for member in sdist.getmembers():
                relative = member.name.split("/", 1)[-1]
                if relative in FILES:
                    path = package / Path(relative).name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(sdist.extractfile(member).read())
        missing = [name for name in FILES if not (package / Path(name).name).exists()]
        if missing:
            raise RuntimeError(f"the transformers {transformers.__version__} sdist has no {', '.join(missing)}")
        for relative, text in STUBS.items():
            path = package / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text(text)
        (package / "__init__.py").touch()
        staging.rename(target)  # complete or absent: never a half-written cache


def is_cached() -> bool:
    """Whether the cache folder holds the tests of the installed transformers (`load` then needs no download)."""
    return (cache_folder() / package_name() / "__init__.py").exists()


def load():
    """Import and return transformers' `test_modeling_common` and `test_configuration_common` modules, downloading
    the sdist first unless they are cached (`is_cached`).

    Raises:
        RuntimeError: the sdist could not be downloaded, or lacks the files.
    """
    target = cache_folder()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f"{target.name}.lock"):  # the suite's parallel workers fetch it once
        if not is_cached():
            _fetch(target)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    modeling = importlib.import_module(f"{package_name()}.test_modeling_common")
    configuration = importlib.import_module(f"{package_name()}.test_configuration_common")
    return modeling, configuration


if __name__ == "__main__":
    load()
    print(f"transformers {transformers.__version__}'s model tests are cached in {cache_folder()}")
