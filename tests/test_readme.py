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
