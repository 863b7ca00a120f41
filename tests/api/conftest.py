"""Fixtures of the API tests: an embedded store per test (chDB allows one open data dir per process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from argus.collector.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh chDB store with the schema, closed at teardown."""
    opened = open_store(f"chdb://{tmp_path / 'store'}")
    yield opened
    opened.close()
