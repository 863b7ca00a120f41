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
