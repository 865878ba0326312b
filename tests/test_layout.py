"""The package's layout: imports flow one way through the stages, with no cycles.

The import graph is read from the source with `ast` (imports inside functions count; those
under ``if TYPE_CHECKING:`` do not, as they never run), so a failure names the modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "remat"

# Stages, lowest first: a module may import its own stage or a lower one; `recipes` may also
# import the public `remat`.
STAGES = (
    "_core",
    "_scan",
    "_trace",
    "_shard",
    "_measure",
    "_plan",
    "_report",
    "_lint",
    "_models",
    "recipes",
    "_cli",
)
TOP = len(STAGES)  # `remat/__init__.py` and `remat/__main__.py` re-export everything
TYPE_CHECKING_NAMES = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return TOP
    if parts[1] not in STAGES:
        raise AssertionError(f"{module} is in no stage; add its folder to STAGES (in order)")
    return STAGES.index(parts[1])


def _runtime_nodes(tree: ast.AST):
    """Every node, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING_NAMES:
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(module: str) -> set[str]:
    """The `remat` modules that ``module`` imports (a package's ``__init__`` as the package)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_is_in_a_stage():
    for module in MODULES:
        stage(module)


def test_no_import_from_a_higher_stage():
    upward = [
        f"{m} ({STAGES[stage(m)] if stage(m) < TOP else 'top'}) imports {t} ({STAGES[stage(t)]})"
        for m, targets in GRAPH.items()
        for t in sorted(targets)
        if stage(t) > stage(m) and not (m.startswith("remat.recipes") and t == "remat")
    ]
    assert not upward, "imports that flow up the stages:\n" + "\n".join(upward)


def test_recipes_use_only_the_public_api():
    private = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if m.startswith("remat.recipes")
        for t in sorted(targets)
        if not t.startswith("remat.recipes") and t != "remat"
    ]
    assert not private, "\n".join(private)


def test_no_import_cycles():
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*path[path.index(t) :], t]))
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_no_file_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    # `remat.scan` is one algorithm with its docstring and is allowed a little over.
    limit = 520 if path.name == "_scan.py" else 500
    assert lines <= limit, f"{module_name(path)} has {lines} lines; split it by concept"


def test_subpackages_say_what_they_own_and_may_import():
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name in STAGES):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc, f"{folder.name}/__init__.py needs a docstring"
        if folder.name != "recipes":
            assert "import" in doc.lower(), (
                f"{folder.name}/__init__.py should say what it may import"
            )


def test_the_graph_is_read():
    """The reader resolves relative imports, deferred imports and `from pkg import module`."""
    assert "remat._core._budget" in GRAPH["remat._plan._plan"]
    assert "remat._trace._apply" in GRAPH["remat._measure._measure"]  # inside a function
    assert "remat._scan._scan" in GRAPH["remat._cli._cli_demo"]  # `from .._scan import _scan`
    assert "remat._report._report" not in GRAPH["remat._report._plot"]  # TYPE_CHECKING only
