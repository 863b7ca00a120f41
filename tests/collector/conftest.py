"""The ``store`` fixture: the same tests on chDB and, when configured, a ClickHouse server.

Set ``ARGUS_TEST_CLICKHOUSE_URL=clickhouse://user:pass@host:8123`` to run the
clickhouse-connect half; each test then gets a database of its own, dropped after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from argus.store import Store, open_store

CLICKHOUSE_ENV = "ARGUS_TEST_CLICKHOUSE_URL"


def store_url_for(backend: str, tmp_path: Path) -> str:
    """A fresh store URL of ``backend`` ("chdb" or "clickhouse"); skips when not configured."""
    if backend == "chdb":
        return f"chdb://{tmp_path / 'store'}"
    base = os.environ.get(CLICKHOUSE_ENV)
    if not base:
        pytest.skip(f"{CLICKHOUSE_ENV} is not set: no ClickHouse server to test clickhouse-connect against")
    return urlunsplit(urlsplit(base)._replace(path=f"/argus_test_{uuid.uuid4().hex[:12]}"))


@pytest.fixture(params=["chdb", pytest.param("clickhouse", marks=pytest.mark.clickhouse)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = store_url_for(request.param, tmp_path)
    yield url
    if request.param == "clickhouse":
        admin = open_store(url, create=False)
        try:
            admin.command(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]}")
        finally:
            admin.close()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open store with the schema created (30-day retention)."""
    opened = open_store(store_url)
    yield opened
    opened.close()
