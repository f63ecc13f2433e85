"""The code base stays clean under the ruff configuration in pyproject.toml, and its modules import each other one
way."""

import ast
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_and_format():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def relative_imports(package: Path) -> dict[str, set[str]]:
    """Every module of `package` (as a path relative to it, without `.py`) and the modules it imports relatively,
    at module level or inside a function (a lazy import is a dependency too)."""
    graph = {}
    for path in package.rglob("*.py"):
        module = path.relative_to(package).with_suffix("")
        graph[str(module)] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = module.parent
            for _ in range(node.level - 1):
                base = base.parent
            names = [node.module] if node.module else [alias.name for alias in node.names]
            graph[str(module)] |= {str(base / name.replace(".", "/")) for name in names}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        if state.get(module) == "open":
            return [*path[path.index(module) :], module]
        if state.get(module) == "done":
            return None
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if (cycle := visit(target, [*path, module])) is not None:
                return cycle
        state[module] = "done"
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module, [])) is not None), None)


def test_imports_between_the_packages_modules_run_one_way(tmp_path):
    """No cycle among seqbert's modules (issue 62: cpu_inference/plans.py and optimized_layers.py named each other):
    each can be read, tested and copied into a saved folder after the ones it depends on. The check finds a cycle
    planted in a package of three modules, one of them through a lazy import inside a function."""
    graph = relative_imports(ROOT / "src" / "seqbert")
    assert "attention_backends" in graph["modeling_seqbert"] and "cpu_inference/optimized_layers" in graph
    assert import_cycle(graph) is None, import_cycle(graph)
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("from .sub.b import x\n")
    (tmp_path / "sub" / "b.py").write_text("from . import c\n")
    (tmp_path / "sub" / "c.py").write_text("def f():\n    from ..a import y\n")
    assert import_cycle(relative_imports(tmp_path)) == ["a", "sub/b", "sub/c", "a"]
