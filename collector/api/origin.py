"""Who may reach the REST API through a browser: the Host it answers to, and same-origin writes only.

Two attacks come through a browser of someone who can reach the server, not through a client:

- DNS rebinding: a page on ``evil.example`` resolves its own name to 127.0.0.1 and reads the
  API of a server listening on loopback as if it were its own origin. The browser sends
  ``Host: evil.example``; a server on loopback answers only ``Host`` names of loopback
  (:data:`LOOPBACK_NAMES`, any port), others get 403 before anything is read.
- Cross-site request forgery: any page may POST ``multipart/form-data`` to any address
  without asking (a "simple" request, no CORS preflight), so a page could upload traces into
  a server without a token. A write (any method but GET, HEAD, OPTIONS) that a browser marks
  as coming from another site is refused with 403: ``Sec-Fetch-Site`` other than
  ``same-origin`` or ``none``, or an ``Origin`` whose host and port are not the request's
  ``Host``. Clients that are not browsers (``argus import``, curl) send neither header and are
  not affected; the server's own page is same-origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from argus.collector.api.errors import error_response
from argus.errors import Forbidden

__all__ = ["LOOPBACK_NAMES", "SameOrigin", "is_loopback", "loopback_hosts"]

#: Host names a server listening on loopback answers to.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: Methods that only read: not checked for their origin.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """Whether the listen address ``host`` (a name or an IP, IPv6 without brackets) is loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_hosts(listen_host: str) -> frozenset[str] | None:
    """The ``Host`` names a server listening on ``listen_host`` answers to: loopback names for a
    loopback address, None (any) otherwise (a reachable server has its token and TLS instead)."""
    return LOOPBACK_NAMES | {listen_host} if is_loopback(listen_host) else None


def _host_name(value: str) -> str:
    """``value`` (a ``Host`` header or URL netloc: ``name:port``, ``[v6]:port``) without its port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class SameOrigin:
    """ASGI middleware: 403 for a ``Host`` not in ``hosts`` (None: any), and for a write from
    another site (module doc)."""

    def __init__(self, app: ASGIApp, hosts: Collection[str] | None) -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)

    def _refusal(self, scope: Scope) -> Forbidden | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            return Forbidden(
                f"Host {host!r} is not a name of this server (it listens on loopback and answers "
                f"only {', '.join(sorted(self.hosts))}): a page rebinding its own name to this machine?"
            )
        if scope.get("method", "GET") in _SAFE_METHODS:
            return None
        site = headers.get("sec-fetch-site")
        if site is not None and site not in {"same-origin", "none"}:
            return Forbidden(f"a write from another site's page (Sec-Fetch-Site: {site}) is refused")
        origin = headers.get("origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc.lower() != host.lower()):
            return Forbidden(f"a write from another origin ({origin}) is refused")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
