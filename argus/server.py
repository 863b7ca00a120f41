"""`argus server`: the composition root — collector (gRPC), analyzer, REST API and /metrics in one process.

The one module that wires the parts together; each part knows only the store and the metrics
it is handed. Start-up order: open the store (creating the schema, migrating it, applying the
retention TTL), start gRPC (:mod:`argus.collector.grpc_service`), start the analyzer thread
(:mod:`argus.analyzer.service`), start the HTTP side (:mod:`argus.collector.api`), then print
one line saying where it listens. SIGTERM/SIGINT stop it in the reverse order: the collector
refuses new batches and waits for those being stored, so every acknowledged batch is in the
store before the store closes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

from argus.analyzer.service import Analyzer
from argus.collector.api.serve import HttpServer, start_http
from argus.collector.grpc_service import CollectorServer, start_collector
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import Store, open_store
from argus.store_pool import StorePool
from argus.threads import start_daemon

__all__ = ["GRACE_S", "main", "serve"]

log = logging.getLogger(__name__)

#: Seconds each part gets to finish in-flight work at shutdown.
GRACE_S = 5.0


def _without_password(url: str) -> str:
    """``url`` with the password of its user part, if any, shown as ``***`` (for what is printed)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def main(args: argparse.Namespace) -> int:
    """`argus server`: :func:`serve` with the settings of its flags.

    Raises:
        ConfigError: a bad option (listen address, TLS files, retention, window).
        StoreError: the store cannot be opened (StoreLocked: another process holds it).
    """
    return serve(ServerConfig.from_args(args))


def serve(config: ServerConfig, stop: threading.Event | None = None) -> int:
    """Run the server until SIGTERM or SIGINT (or ``stop``); return 0 after a clean stop.

    Raises:
        ConfigError: an address cannot be bound or a TLS file read.
        StoreError: the store cannot be opened (StoreLocked: another process holds it).
    """
    stop = stop if stop is not None else threading.Event()
    # The handler takes no lock: Python runs it in the main thread between two bytecodes, possibly
    # inside ``stop.wait`` holding the Event's own lock, where ``stop.set()`` would deadlock (the
    # node agent hung so under a burst of SIGTERMs). The loop below sees the signal within 0.5 s.
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)

    store = open_store(config.store, retention_days=config.retention_days, cluster=config.cluster)
    # Ingest has the store's first connection to itself: the analyzer's and the REST API's calls
    # (a trace read can take seconds) run beside it, not in front of a batch's insert.
    besides: list[Store] = []
    metrics = Metrics()
    collector: CollectorServer | None = None
    http: HttpServer | None = None
    analyzer: tuple[Analyzer, threading.Thread] | None = None
    try:
        collector = start_collector(store, metrics, config)
        if config.analyzer:
            besides.append(store.beside())
            service = Analyzer(
                besides[-1],
                window=config.window,
                metrics=metrics,
                min_loss_pct=config.min_loss_pct,
                stack_interval_s=config.stack_interval_s,
            )
            thread = start_daemon(service.run_forever, "argus-analyzer")
            analyzer = service, thread
        # A pool: one slow read (a trace export) holds back no other request, /metrics included.
        besides.append(StorePool.opened_beside(store))
        http = start_http(besides[-1], metrics, config)
        notes = [" (TLS)" if collector.tls else "", ", token required" if config.token else ""]
        print(
            f"argus server: gRPC on {collector.address}{notes[0]}, HTTP on {http.url}, "
            f"store {_without_password(store.url)}{notes[1]}",
            flush=True,
        )
        while not signals and not stop.wait(0.5):
            pass
        log.info("stopping")
    finally:
        if collector is not None:
            collector.stop(GRACE_S)
            log.debug("collector stopped")
        if analyzer is not None:
            service, thread = analyzer
            service.stop()
            thread.join(GRACE_S)
            log.debug("analyzer stopped")
        if http is not None:
            http.stop(GRACE_S)
            log.debug("HTTP stopped")
        for other in besides:
            other.close()
        store.close()
        log.debug("store closed")
    print("argus server: stopped", file=sys.stderr, flush=True)
    return 0
