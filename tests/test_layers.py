"""The import graph of ``pacectl/``: layers point down, and no module imports itself back.

Read from the source (every ``import``, module-level or inside a function), so a lazy import that
closes a loop counts too: ``config.py`` -> ``fabric/profile.py`` -> ``config.py`` (a physics model
reading the conf folder) was one.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pacectl"

#: What the lower layers never import: the config layer, the entry points, the experiments and the
#: report (an importer or a model writes through pacectl.files, never through the report).
UPPER = (
    "pacectl.cli",
    "pacectl.config",
    "pacectl.experiment",
    "pacectl.report",
    "pacectl.run",
    "pacectl.studies",
    "pacectl.torchdist",
    "pacectl.tune",
    "pacectl.tuning",
    "pacectl.whatif",
)
#: The lower layers: values, files, controllers, models, importers, backends, the loop, metrics.
LOWER = (
    "pacectl.backends",
    "pacectl.checks",
    "pacectl.controllers",
    "pacectl.energy",
    "pacectl.errors",
    "pacectl.fabric",
    "pacectl.files",
    "pacectl.loop",
    "pacectl.metrics",
    "pacectl.traces",
    "pacectl.types",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every pacectl import in ``path`` (``from m import name`` also as ``m.name``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pacectl"):
            found += [(node.lineno, node.module)] + [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names
            ]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("pacectl")]
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the pacectl modules it imports (a package's own submodules and parents aside)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, target in _imports(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if (
                target
                and target != module
                and not module.startswith(target + ".")
                and not target.startswith(module + ".")
            ):
                graph[module].add(target)
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return loops


def test_no_import_loops() -> None:
    assert _loops(_graph()) == []


def test_the_loop_finder_finds_a_loop() -> None:
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_layers_never_import_upper_ones() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for module, path in _modules().items()
        if module.startswith(LOWER)
        for line, target in _imports(path)
        if target.startswith(UPPER)
    ]
    assert wrong == []
