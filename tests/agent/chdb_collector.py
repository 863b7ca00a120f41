"""The real collector in-process on a real chDB store, for the agent's delivery tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from argus.collector.grpc_service import CollectorServer, start_collector
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import Store, open_store


@dataclass
class Collector:
    server: CollectorServer
    store: Store
    metrics: Metrics

    @property
    def address(self) -> str:
        return self.server.address

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        """Rows of ``sql`` (``FINAL`` is the caller's), as tuples."""
        data = self.store.query(sql)
        return list(zip(*(c.to_pylist() for c in data.columns), strict=True))

    def dropped_events(self) -> float:
        return self.metrics.registry.get_sample_value("argus_agent_dropped_events_total") or 0.0


@contextmanager
def chdb_collector(folder: Path) -> Iterator[Collector]:
    """``argus.v1.Collector`` on 127.0.0.1 (a free port) storing into ``chdb://folder/store``."""
    store = open_store(f"chdb://{folder / 'store'}")
    metrics = Metrics()
    server = start_collector(store, metrics, ServerConfig(grpc_listen="127.0.0.1:0"))
    try:
        yield Collector(server, store, metrics)
    finally:
        server.stop(2)
        store.close()
