"""A store that stops at one point of a batch's write and waits to be killed (the exactly-once tests)."""

from __future__ import annotations

import time
from typing import Any

from argus.store import Store

__all__ = ["stop_at"]


def stop_at(store: Store, point: str) -> None:
    """Make ``store`` print ``point`` and sleep 600 s just before its first data insert
    (``point`` "recorded": the batch is recorded in ``ingest_batches``, its rows not stored) or just
    after it ("inserted"), so the test can SIGKILL the process there."""
    real = store.insert

    def insert(table: str, data: Any, *, dedup_token: str | None = None) -> None:
        if table != "ingest_batches" and point == "recorded":
            print(point, flush=True)
            time.sleep(600)
        real(table, data, dedup_token=dedup_token)
        if table != "ingest_batches" and point == "inserted":
            print(point, flush=True)
            time.sleep(600)

    store.insert = insert  # type: ignore[method-assign]
