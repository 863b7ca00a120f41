"""Serving the REST app: uvicorn in a thread, on a socket bound before it starts."""

from __future__ import annotations

import functools
import socket
import threading
from dataclasses import dataclass

import uvicorn

from argus.collector.api.app import create_app
from argus.collector.api.origin import loopback_hosts
from argus.config import ServerConfig, parse_listen
from argus.errors import ConfigError
from argus.metrics import Metrics
from argus.store import Store
from argus.threads import start_daemon

__all__ = ["GRACE_S", "HttpServer", "start_http"]

#: Seconds in-flight requests get at shutdown.
GRACE_S = 5.0


@dataclass
class HttpServer:
    """uvicorn serving the REST app in a thread; ``url`` is where it answers."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self, grace_s: float = GRACE_S) -> None:
        """Let in-flight requests finish for ``grace_s``, then end the rest."""
        self.server.should_exit = True
        self.thread.join(grace_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(grace_s)


def start_http(store: Store, metrics: Metrics, config: ServerConfig) -> HttpServer:
    """Serve :func:`~argus.collector.api.app.create_app` with ``config.api`` on ``config.http_listen``
    (port 0 picks a free one).

    Serves HTTPS with ``config.tls``. On a loopback address it answers only loopback ``Host`` names
    (DNS rebinding; :mod:`argus.collector.api.origin`). Returns once it accepts requests.

    Raises:
        ConfigError: the address cannot be bound, or uvicorn failed to start.
    """
    listen, tls = config.http_listen, config.tls
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
    app = create_app(store, metrics=metrics, settings=config.api, allowed_hosts=loopback_hosts(host))
    served = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        ssl_certfile=tls.cert if tls else None,
        ssl_keyfile=tls.key if tls else None,
        timeout_graceful_shutdown=int(GRACE_S),
    )
    server = uvicorn.Server(served)
    thread = start_daemon(functools.partial(server.run, sockets=[sock]), "argus-http")
    while not server.started:
        if not thread.is_alive():
            raise ConfigError(f"the HTTP server on {listen} failed to start (see the log above)")
        thread.join(0.02)
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return HttpServer(server, thread, f"{scheme}://{shown}:{port}")
