"""README.md stays true: CI runs exactly the README's test command."""

from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert len(ci_lines) == 1
    assert ci_lines[0] in readme.splitlines()
    assert ci_lines[0].endswith("python -m pytest") and "pip install torch==2.13.0" in ci_lines[0]


MARKER = "<!-- runs offline as written: tests/test_readme.py -->"


def offline_blocks() -> list[str]:
    """The python blocks of README.md that follow the marker, in order."""
    lines = (ROOT / "README.md").read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() == MARKER:
            assert lines[index + 1] == "```python", f"the marker at README.md line {index + 1} must precede a block"
            end = lines.index("```", index + 2)
            blocks.append("\n".join(lines[index + 2 : end]))
    return blocks


def test_the_quick_start_and_trainer_snippet_run_offline_as_written(tmp_path, monkeypatch, capsys):
    blocks = offline_blocks()
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    assert type(namespace["clf"]).__name__ == "SeqBertForSequenceClassification"
    assert namespace["logits"].shape == (1, 2)
    assert type(namespace["lm"]).__name__ == "SeqBertForCausalLM"
    assert namespace["trainer"].state.global_step == 8  # 256 snippets in batches of 32, one epoch
    assert "eval_loss" in capsys.readouterr().out
