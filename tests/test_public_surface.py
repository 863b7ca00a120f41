"""The public surface is what the README documents (httpx's ``tests/test_exported_members.py`` as model).

`argus.agent` exports ``attach`` and ``step``; the CLI's commands and options, the REST routes and
the environment variables are the README's reference tables; every package and module declares
``__all__``, and each name in it exists.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
from pathlib import Path

import argus
from argus import config
from argus.cli import build_parser
from argus.collector.api import create_app
from argus.metrics import Metrics
from argus.store import open_store

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_rows(first_cell: str) -> dict[str, str]:
    """``| `KEY` | REST |`` rows of the README's reference tables whose key matches ``first_cell``."""
    rows = re.findall(r"^\| `(" + first_cell + r")` \| (.*) \|$", README, re.MULTILINE)
    return dict(rows)


def test_argus_agent_exports_attach_and_step() -> None:
    import argus.agent

    public = {n for n, v in vars(argus.agent).items() if not n.startswith("_") and callable(v)}
    assert argus.agent.__all__ == ["attach", "step"]
    assert public - {"annotations", "TYPE_CHECKING"} <= {"attach", "step"}
    assert "argus.agent.attach()" in README and "argus.agent.step()" in README


def test_cli_commands_and_options_are_the_readme_table() -> None:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    got = {
        f"argus {name}": [
            o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"
        ]
        for name, p in sub.choices.items()
    }
    documented = {
        cmd: re.findall(r"`(--[a-z0-9-]+)`", opts) for cmd, opts in _readme_rows(r"argus [a-z]+").items()
    }
    assert got == documented
    assert "--quiet" in got["argus run"]  # the terminal's diagnosis lines can be turned off


def test_rest_routes_are_the_readme_table(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        schema = create_app(store, metrics=Metrics()).openapi()
    finally:
        store.close()
    got = {
        f"{method.upper()} {path}"
        for path, operations in schema["paths"].items()
        for method in operations
        if method in {"get", "post", "put", "patch", "delete"}
    }
    assert got == set(_readme_rows(r"(?:GET|POST|PUT|PATCH|DELETE) /[^`]*"))


def test_environment_variables_are_the_readme_table() -> None:
    assert set(_readme_rows(r"ARGUS_[A-Z0-9_]+")) == set(config.ENVIRONMENT)


def test_every_module_declares_all_and_each_name_exists() -> None:
    missing: list[str] = []
    for info in pkgutil.walk_packages(argus.__path__, "argus."):
        if info.name.startswith("argus.proto.") or info.name.endswith("sitecustomize"):
            continue  # generated code; a start-up script run by path
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        if names is None:
            missing.append(f"{info.name}: no __all__")
            continue
        missing += [f"{info.name}.{n}" for n in names if not hasattr(module, n)]
    assert not missing
