"""The rooms of the package (docs/design.md §10): who may import whom.

The analyzer and the collector share the store, the metrics, the schema and the diagnosis
through :mod:`argus`; neither imports the other (only the composition root, ``argus/server.py``,
knows both). Imports are read from the source, those inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, absolute names (relative imports resolved against ``package``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def _package_imports(folder: str, package: str) -> dict[str, set[str]]:
    out = {}
    for path in (ROOT / folder).rglob("*.py"):
        inner = path.relative_to(ROOT / folder).with_suffix("").parts
        out[str(path.relative_to(ROOT))] = _imports(path, ".".join((package, *inner[:-1])))
    return out


def _offenders(folder: str, package: str, forbidden: str) -> dict[str, list[str]]:
    return {
        file: sorted(m for m in names if m == forbidden or m.startswith(forbidden + "."))
        for file, names in _package_imports(folder, package).items()
        if any(m == forbidden or m.startswith(forbidden + ".") for m in names)
    }


def test_no_analyzer_module_imports_the_collector() -> None:
    assert _offenders("analyzer", "argus.analyzer", "argus.collector") == {}


def test_no_collector_module_imports_the_analyzer() -> None:
    assert _offenders("collector", "argus.collector", "argus.analyzer") == {}


def test_the_agent_imports_neither_service_part() -> None:
    assert _offenders("agent", "argus.agent", "argus.collector") == {}
    assert _offenders("agent", "argus.agent", "argus.analyzer") == {}


def test_a_forbidden_import_is_seen_even_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from argus.collector.api import jobs\n    from . import window\n")
    assert _imports(module, "argus.analyzer") == {
        "argus.collector.api",
        "argus.collector.api.jobs",
        "argus.analyzer",
        "argus.analyzer.window",
    }


#: The folders of the installed package and the names they install as (pyproject's package-dir).
PACKAGES = (
    ("argus", "argus"),
    ("agent", "argus.agent"),
    ("collector", "argus.collector"),
    ("analyzer", "argus.analyzer"),
)


def _module_graph() -> dict[str, set[str]]:
    """Every module of the package, by its installed name → the package's modules it imports."""
    imports: dict[str, set[str]] = {}
    for folder, package in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            inner = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *inner)).removesuffix(".__init__")
            imports[name] = _imports(path, ".".join((package, *inner[:-1])))

    def module_of(name: str) -> str | None:  # ``argus.demo.local.WINDOW_S`` → ``argus.demo.local``
        while name and name not in imports:
            name = name.rpartition(".")[0]
        return name or None

    return {
        m: {t for n in names if (t := module_of(n)) is not None and t != m and not m.startswith(t + ".")}
        for m, names in imports.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_demo_is_a_room_no_other_module_imports() -> None:
    # The CLI names `argus.demo.command` as a string (imported when `argus demo` runs), and the
    # `python -m argus.demo_job` shim runs `argus.demo.job` by name: neither is an import.
    graph = _module_graph()
    assert any(m.startswith("argus.demo.") for m in graph)
    outside = {m: sorted(t for t in ts if t.startswith("argus.demo.")) for m, ts in graph.items()}
    assert {m: ts for m, ts in outside.items() if ts and not m.startswith("argus.demo.")} == {}


def test_no_import_cycle_in_the_package() -> None:
    assert _cycles(_module_graph()) == []


def test_a_cycle_is_seen() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
