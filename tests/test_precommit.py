"""The pre-commit hooks run the checks tests/test_lint.py runs, with the same ruff release as the test extra."""

import re
from pathlib import Path

import yaml


ROOT = Path(__file__).resolve().parents[1]


def test_pre_commit_hooks_run_ruff_pinned_as_the_test_extra_and_file_hygiene():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "trailing-whitespace", "end-of-file-fixer", "check-yaml", "check-toml"} <= set(
        hooks
    )
    assert hooks["ruff-check"]["entry"].split()[:2] == ["ruff", "check"]
    assert hooks["ruff-format"]["entry"].split()[:2] == ["ruff", "format"]
    # No hook arguments override pyproject.toml's [tool.ruff] settings, which test_lint.py uses.
    assert "args" not in hooks["ruff-check"] and "args" not in hooks["ruff-format"]
    test_extra_ruff = re.search(r'"ruff==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    for hook_id in ("ruff-check", "ruff-format"):
        assert hooks[hook_id]["additional_dependencies"] == [f"ruff=={test_extra_ruff}"]
