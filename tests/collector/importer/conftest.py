"""Fixtures of the trace-import tests: the real Kineto traces and a fresh embedded store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from argus.store import Store, open_store

#: The real traces of the data README (override with $ARGUS_KINETO_DIR).
KINETO_DIR = Path(os.environ.get("ARGUS_KINETO_DIR", "/work/shared/data/kineto"))


@pytest.fixture(scope="session")
def kineto_dir() -> Path:
    """The folder of real Kineto traces; tests using it skip where it is absent."""
    if not (KINETO_DIR / "README.md").exists():
        pytest.skip(f"no real Kineto traces at {KINETO_DIR} (set ARGUS_KINETO_DIR)")
    return KINETO_DIR


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh chDB store under ``tmp_path`` with the schema; closed at teardown (one per process)."""
    s = open_store(f"chdb://{tmp_path / 'data'}")
    try:
        yield s
    finally:
        s.close()
