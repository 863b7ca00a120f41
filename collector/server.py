"""`argus server`: collector (gRPC) + analyzer + REST API and /metrics in one process.

Start-up order: open the store (creating the schema, applying the retention
TTL), start gRPC, start the analyzer thread, start uvicorn, then print one
line saying where it listens. SIGTERM/SIGINT stop it in the reverse order: the
collector refuses new batches and waits for those being stored, so every
acknowledged batch is in the store before the store closes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import uvicorn

from argus.collector.api import DEFAULT_HEARTBEAT_TIMEOUT_S, create_app
from argus.collector.grpc_service import CollectorServer, start_collector
from argus.collector.metrics import Metrics
from argus.collector.store import Store, open_store
from argus.config import DEFAULT_WINDOW_S
from argus.errors import ConfigError

if TYPE_CHECKING:
    from argus.analyzer.service import Analyzer

__all__ = ["HttpServer", "main", "parse_listen", "start_http"]

log = logging.getLogger(__name__)

#: Seconds each part gets to finish in-flight work at shutdown.
GRACE_S = 5.0


def parse_listen(value: str, option: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into host and port.

    Raises:
        ConfigError: no port, or a port outside 0..65535.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{option} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:7470")
    return host.strip("[]"), int(port)


@dataclass
class HttpServer:
    """uvicorn serving the REST app in a thread, on a socket bound before it starts."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self, grace_s: float = GRACE_S) -> None:
        self.server.should_exit = True
        self.thread.join(grace_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(grace_s)


def start_http(
    store: Store,
    metrics: Metrics,
    listen: str,
    *,
    token: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    window_s: float = DEFAULT_WINDOW_S,
) -> HttpServer:
    """Serve ``argus.collector.api.create_app`` on ``listen`` (port 0 picks a free one).

    Serves HTTPS with ``tls_cert``/``tls_key``. Returns once it accepts requests.

    Raises:
        ConfigError: the address cannot be bound, or uvicorn failed to start.
    """
    host, port = parse_listen(listen, "--http-listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen for HTTP on {listen}: {exc}") from exc
    sock.listen(1024)
    port = sock.getsockname()[1]
    app = create_app(
        store,
        metrics=metrics,
        token=token,
        window_s=window_s,
        heartbeat_timeout_s=max(DEFAULT_HEARTBEAT_TIMEOUT_S, 3 * window_s),
    )
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        timeout_graceful_shutdown=int(GRACE_S),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="argus-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise ConfigError(f"the HTTP server on {listen} failed to start (see the log above)")
        thread.join(0.02)
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return HttpServer(server, thread, f"{scheme}://{shown}:{port}")


def _without_password(url: str) -> str:
    """``url`` with the password of its user part, if any, shown as ``***`` (for what is printed)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _start_analyzer(
    store: Store, metrics: Metrics, window_s: float, min_loss_pct: float
) -> tuple[Analyzer, threading.Thread]:
    from argus.analyzer.service import Analyzer

    analyzer = Analyzer(store, window_s=window_s, metrics=metrics, min_loss_pct=min_loss_pct)
    thread = threading.Thread(target=analyzer.run_forever, name="argus-analyzer", daemon=True)
    thread.start()
    return analyzer, thread


def main(args: argparse.Namespace) -> int:
    """Run `argus server` until SIGTERM or SIGINT; return the exit status (0 after a clean stop).

    Raises:
        ConfigError: a bad option (listen address, TLS files, retention).
        StoreError: the store cannot be opened (StoreLocked: another process holds it).
    """
    parse_listen(args.grpc_listen, "--grpc-listen")
    if args.retention_days < 1:
        raise ConfigError(f"--retention-days must be >= 1, got {args.retention_days}")
    if args.window_s <= 0:
        raise ConfigError(f"--window-s must be > 0, got {args.window_s}")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    store = open_store(args.store, retention_days=args.retention_days, cluster=args.cluster)
    metrics = Metrics()
    collector: CollectorServer | None = None
    http: HttpServer | None = None
    analyzer: tuple[Analyzer, threading.Thread] | None = None
    try:
        tls = {"tls_cert": args.tls_cert, "tls_key": args.tls_key}
        collector = start_collector(store, metrics, args.grpc_listen, token=args.token, **tls)
        if not args.no_analyzer:
            analyzer = _start_analyzer(store, metrics, args.window_s, args.min_loss_pct)
        http = start_http(store, metrics, args.http_listen, token=args.token, window_s=args.window_s, **tls)
        notes = [" (TLS)" if collector.tls else "", ", token required" if args.token else ""]
        print(
            f"argus server: gRPC on {collector.address}{notes[0]}, HTTP on {http.url}, "
            f"store {_without_password(store.url)}{notes[1]}",
            flush=True,
        )
        while not stop.wait(0.5):
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
        store.close()
        log.debug("store closed")
    print("argus server: stopped", file=sys.stderr, flush=True)
    return 0
