"""README.md and the documentation stay true: CI runs exactly the README's test command, README stays a short front
door, and every code block marked as running offline (in README.md and in docs/) runs as written."""

from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- runs offline as written: tests/test_readme.py -->"
README_MAX_LINES = 200


def test_ci_runs_exactly_the_readme_test_command():
    """The one command, and CI's only setting, which README names beside it: the CUDA dry run may not skip there."""
    readme = (ROOT / "README.md").read_text()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in lines if line.startswith("export ")] == ["export SEQBERT_REQUIRE_CUDA_DRY_RUN=1"]
    assert "`SEQBERT_REQUIRE_CUDA_DRY_RUN=1`" in readme
    ci_lines = [line for line in lines if line and not line.startswith(("#", "set ", "cd ", "export "))]
    assert len(ci_lines) == 1
    assert ci_lines[0] in readme.splitlines()
    assert ci_lines[0].endswith("python -m pytest") and "pip install torch==2.13.0" in ci_lines[0]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs on a docs page"


def offline_blocks(path: Path) -> list[str]:
    """The python blocks of a Markdown file that follow the marker, in order."""
    lines = path.read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() == MARKER:
            where = f"{path.relative_to(ROOT)} line {index + 1}"
            assert lines[index + 1] == "```python", f"the marker at {where} must precede a python block"
            end = lines.index("```", index + 2)
            blocks.append("\n".join(lines[index + 2 : end]))
    return blocks


def check_quick_start(namespace, output):
    assert type(namespace["clf"]).__name__ == "SeqBertForSequenceClassification"
    assert namespace["logits"].shape == (1, 2)
    assert type(namespace["lm"]).__name__ == "SeqBertForCausalLM"


def check_trainer(namespace, output):
    assert type(namespace["clf"]).__name__ == "SeqBertForSequenceClassification"
    assert namespace["trainer"].state.global_step == 8  # 256 snippets in batches of 32, one epoch
    assert "eval_loss" in output


def check_causal_lm(namespace, output):
    assert type(namespace["lm"]).__name__ == "SeqBertForCausalLM"
    assert namespace["ids"].shape[0] == 2 and namespace["ids"].shape[1] > namespace["batch"]["input_ids"].shape[1]
    assert namespace["text"].startswith("And he said")


# What each file's blocks must leave behind. A file with marked blocks that is not listed here still runs.
CHECKS = {
    "README.md": check_quick_start,
    "docs/fine-tuning.md": check_trainer,
    "docs/causal-lm.md": check_causal_lm,
}
MARKED = sorted(
    str(path.relative_to(ROOT))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    if MARKER in path.read_text()
)


def test_the_checked_blocks_are_still_marked():
    assert set(CHECKS) <= set(MARKED), f"marked blocks moved away from {sorted(set(CHECKS) - set(MARKED))}"


@pytest.mark.parametrize("name", MARKED)
def test_marked_blocks_run_offline_as_written(name, tmp_path, monkeypatch, capsys):
    """A file's marked blocks run in order in one namespace, in an empty folder, with the Hub offline."""
    blocks = offline_blocks(ROOT / name)
    assert blocks
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, name, "exec"), namespace)  # noqa: S102 - the documentation's own code
    CHECKS.get(name, lambda namespace, output: None)(namespace, capsys.readouterr().out)
