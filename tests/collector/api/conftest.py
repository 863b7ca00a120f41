"""Fixtures of the API tests: an embedded store per test (chDB allows one open data dir per process),
and the app over it served by uvicorn on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from argus.collector.api import create_app
from argus.config import ApiSettings
from argus.metrics import Metrics
from argus.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh chDB store with the schema, closed at teardown."""
    opened = open_store(f"chdb://{tmp_path / 'store'}")
    yield opened
    opened.close()


class LiveApp:
    """The API app served over real HTTP by uvicorn in a thread of the test process."""

    def __init__(self, store: Store, metrics: Metrics, token: str | None = None, **app: Any) -> None:
        config = uvicorn.Config(
            create_app(store, metrics=metrics, settings=ApiSettings(token=token, **app)),
            host="127.0.0.1",
            port=0,
            log_level="warning",
        )
        self.metrics = metrics
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> LiveApp:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


@pytest.fixture
def live_app(store: Store) -> Iterator[LiveApp]:
    """``create_app`` over ``store`` on a free loopback port (for clients that need real HTTP)."""
    app = LiveApp(store, Metrics()).start()
    yield app
    app.stop()
