"""The REST API reads through a pool of store connections: a slow query holds back no other request."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from argus.metrics import Metrics
from argus.store import open_store
from argus.store_pool import StorePool
from tests.collector.api.conftest import LiveApp

#: A query that runs for about 4 s inside the engine (40 rows, 0.1 s each).
SLOW_SQL = "SELECT sum(sleepEachRow(0.1)) AS s FROM numbers(40) SETTINGS max_block_size = 1"


def test_metrics_and_reads_do_not_queue_behind_a_slow_query(tmp_path: Path) -> None:
    """While one connection of the API's pool runs a slow query, ``/metrics`` and ``/api/v1/jobs``
    are answered: the slow query is still running when they return (an order, not a timing)."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    pool = StorePool.opened_beside(store, 2)
    app = LiveApp(pool, Metrics()).start()
    slow_done = threading.Event()

    def slow() -> None:
        pool.query(SLOW_SQL)
        slow_done.set()

    worker = threading.Thread(target=slow)
    try:
        worker.start()
        while pool._free.qsize() == 2:  # until the slow query holds a connection
            threading.Event().wait(0.01)
        assert httpx.get(f"{app.url}/metrics", timeout=60).status_code == 200
        assert httpx.get(f"{app.url}/api/v1/jobs", timeout=60).status_code == 200
        assert not slow_done.is_set()
        worker.join(60)
        assert slow_done.is_set()
    finally:
        app.stop()
        pool.close()
        store.close()
