"""The code base stays clean under the ruff configuration in pyproject.toml, and its modules import each other one
way."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_and_format():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def packages_on_the_path(name: str) -> set[str]:
    """`name` and every package above it: `a.b.c` -> {`a`, `a.b`, `a.b.c`}."""
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)}


def package_imports(folder: Path, package: str | None = None) -> dict[str, set[str]]:
    """Every module of the package in `folder` (named `package`, by default the folder's name), by its dotted name
    (a package by its own name: `seqbert`, `seqbert.cpu_inference`, `seqbert.cpu_inference.plans`), and the package's
    modules it depends on, at module level or inside a function (a lazy import is a dependency too).

    Relative imports at any level and absolute ones (`seqbert.x.y`) resolve to the same names (`importlib.util.
    resolve_name`). `from X import name` depends on the submodule `X.name` where there is one, and on X otherwise (a
    name of X's module, or of its package `__init__`); importing X also runs every package `__init__` on X's path
    that is not already running as one of the importer's own packages."""
    files = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package or folder.name, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":  # a package's __init__ is the package
            parts.pop()
        files[".".join(parts)] = path
    graph = {}
    for module, path in files.items():
        # The package a relative import starts from: the module's own for an __init__, its parent's otherwise.
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        # Importing X runs the __init__ of every package on X's path, but for those already running: the importer's.
        running = packages_on_the_path(own_package)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                sources, used = [alias.name for alias in node.names], {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = (
                    importlib.util.resolve_name("." * node.level + (node.module or ""), own_package)
                    if node.level
                    else node.module
                )
                sources = [source]
                used = {
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source for alias in node.names
                }
            else:
                continue
            targets |= used.union(*(packages_on_the_path(source) - running for source in sources))
        graph[module] = (targets & files.keys()) - {module}
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


def plant(folder: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """Writes `files` (path -> source) under `folder` and returns the package's import graph."""
    for name, source in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(source)
    return package_imports(folder)


def test_imports_between_the_packages_modules_run_one_way(tmp_path):
    """No cycle among seqbert's modules (issue 62: cpu_inference/plans.py and optimized_layers.py named each other):
    each can be read, tested and copied into a saved folder after the ones it depends on. The graph names package
    `__init__` modules as the packages they are and resolves relative and absolute imports alike, so the check finds
    cycles planted in small packages: through a lazy import inside a function, through a package `__init__`, and
    through an absolute import."""
    graph = package_imports(ROOT / "src" / "seqbert")
    assert "seqbert.attention_backends" in graph["seqbert.modeling_seqbert"]
    assert "seqbert.cpu_inference.optimized_layers" in graph and "seqbert.cpu_inference" in graph
    assert import_cycle(graph) is None, import_cycle(graph)

    lazy = plant(
        tmp_path / "lazy",
        {
            "a.py": "from .sub.b import x\n",
            "sub/b.py": "from . import c\n",
            "sub/c.py": "def f():\n    from ..a import y\n",
        },
    )
    assert import_cycle(lazy) == ["lazy.a", "lazy.sub.b", "lazy.sub.c", "lazy.a"]

    # seqbert's layout: a subpackage whose __init__ re-exports its modules' names, and a module outside it that takes
    # one from the __init__; the cycle closes when a module of the subpackage imports that outside module.
    through_init = plant(
        tmp_path / "through_init",
        {
            "__init__.py": "",
            "modeling.py": "from .cpu_inference import optimize\n",
            "cpu_inference/__init__.py": "from .optimized import optimize\n",
            "cpu_inference/optimized.py": "from ..modeling import Model\n",
        },
    )
    assert through_init["through_init.modeling"] == {"through_init.cpu_inference"}
    assert import_cycle(through_init) == [
        "through_init.cpu_inference",
        "through_init.cpu_inference.optimized",
        "through_init.modeling",
        "through_init.cpu_inference",
    ]
    # Importing a module of a subpackage runs the subpackage's __init__ first: the same cycle, one step removed.
    (tmp_path / "through_init" / "modeling.py").write_text("from .cpu_inference.optimized import optimize\n")
    assert "through_init.cpu_inference" in package_imports(tmp_path / "through_init")["through_init.modeling"]
    assert import_cycle(package_imports(tmp_path / "through_init")) is not None
    # `from . import name` takes a name of the package's __init__ where no submodule has that name.
    (tmp_path / "through_init" / "cpu_inference" / "optimized.py").write_text("from . import DEFAULTS\n")
    assert import_cycle(package_imports(tmp_path / "through_init")) == [
        "through_init.cpu_inference",
        "through_init.cpu_inference.optimized",
        "through_init.cpu_inference",
    ]

    absolute = plant(
        tmp_path / "absolute",
        {
            "__init__.py": "",
            "hub.py": "import absolute.data.loading as loading\n",
            "data/__init__.py": "",
            "data/loading.py": "def f():\n    from absolute.hub import push\n",
        },
    )
    assert import_cycle(absolute) == ["absolute.data.loading", "absolute.hub", "absolute.data.loading"]

    # And what is not a cycle: a module taking a sibling from its own package (`from . import x`), and an __init__
    # that imports its submodules while they import each other.
    one_way = plant(
        tmp_path / "one_way",
        {
            "__init__.py": "from .b import g\n",
            "a.py": "X = 1\n",
            "b.py": "from . import a\nfrom .a import X\nimport one_way.a\n",
        },
    )
    assert one_way == {"one_way": {"one_way.b"}, "one_way.a": set(), "one_way.b": {"one_way.a"}}
    assert import_cycle(one_way) is None
