"""The HTTP side of an `argus server` (docs/design.md §9): REST API, ``/metrics``, ``/healthz`` and the page.

    /api/v1/...        JSON endpoints (routes), OpenAPI at /openapi.json, docs at /docs
    /healthz           liveness, never needs the token
    /metrics           Prometheus exposition of the server's registry
    /, /page/{asset}   the web page (plain HTML + JS, no build step)

With a token, every path but ``/healthz`` needs ``Authorization: Bearer TOKEN``
(a browser showing the page needs a proxy or extension that adds the header).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request, Response, Security
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from argus import __version__
from argus.collector.api.errors import ERROR_RESPONSES, error_response, install_error_handlers
from argus.collector.api.jobs import recent_job_status_counts
from argus.collector.api.models import Health
from argus.collector.api.origin import SameOrigin
from argus.collector.api.routes import build_router
from argus.config import ApiSettings
from argus.errors import StoreError, TooLarge, TooManyRows, Unauthenticated
from argus.metrics import Metrics
from argus.store import Store

__all__ = ["BodyLimit", "create_app"]

log = logging.getLogger(__name__)

#: `argus_jobs` counts jobs active within this many seconds.
_RECENT_S = 3600
#: What the app's own paths answer besides their own: a wrong token (401), a Host the server does not
#: answer to (403, the origin middleware, before any route).
_AUTH_RESPONSE: dict[int | str, dict[str, Any]] = {401: ERROR_RESPONSES[401], 403: ERROR_RESPONSES[403]}
_PAGE = Path(__file__).with_name("page")
_ASSET_TYPES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}

_DESCRIPTION = """\
Jobs, ranks, diagnoses and timelines of the training jobs Argus watches.

Lists are `{"items": [...], "next": cursor|null}`: pass `next` back as `cursor`
for the following page. Times are integer ns since the epoch; in queries, epoch
ns or RFC 3339. Rank sets are `0,1,5-7`. Errors are `{"detail": ...}`.
When the server has a token, send `Authorization: Bearer TOKEN`.
"""


class BodyLimit:
    """ASGI middleware: a request body past ``limit`` bytes is refused with 413 and never stored.

    A ``Content-Length`` past the limit is answered before the body is read; a longer
    chunked body fails the request as soon as its bytes pass the limit (the multipart
    parser spools uploads to disk, so this also bounds the disk an upload takes).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _refusal(self) -> str:
        return f"the request body is larger than {self.limit} bytes (max_upload_bytes, --max-upload-bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await error_response(TooLarge(self._refusal()))(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # FastAPI re-raises an HTTPException met while reading a body; others become 400.
                    raise HTTPException(413, self._refusal())
            return message

        await self.app(scope, bounded, send)


def create_app(  # noqa: C901  (the app's routes are declared inside it, over its store)
    store: Store,
    *,
    metrics: Metrics,
    settings: ApiSettings | None = None,
    allowed_hosts: Collection[str] | None = None,
) -> FastAPI:
    """The FastAPI app of an `argus server` over ``store``.

    Args:
        store: The server's store (the process owns it; the app never closes it).
        metrics: The server's metrics; ``/metrics`` exposes ``metrics.registry``.
        settings: Token, window and limits (:class:`~argus.config.ApiSettings`; None: its defaults).
            With a token, every endpoint but ``/healthz`` requires ``Authorization: Bearer TOKEN``;
            a rank silent past ``settings.heartbeat_timeout_ns`` (no host sample) is not ``running``.
        allowed_hosts: The ``Host`` names it answers to (None: any); writes from another
            site's page are refused whatever it is (:mod:`argus.collector.api.origin`).
    """
    settings = settings if settings is not None else ApiSettings()
    token = settings.token
    reads = store.reading_at_most(settings.max_read_rows)
    # Declares the scheme in the OpenAPI document; the check itself is the middleware below.
    bearer = HTTPBearer(auto_error=False, description="Only when the server runs with --token")
    secured = [Security(bearer)] if token else []
    # /docs and /redoc from Swagger UI and ReDoc assets the server serves itself (fastapi-offline):
    # they work without internet, where FastAPI's own pages load them from a CDN.
    app = FastAPIOffline(title="Argus", version=__version__, description=_DESCRIPTION)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes)

    if token:
        expected = f"Bearer {token}".encode()

        @app.middleware("http")
        async def require_token(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            if request.url.path != "/healthz":
                sent = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(sent, expected):
                    reason = "wrong bearer token" if sent else "missing Authorization: Bearer header"
                    return error_response(Unauthenticated(reason))
            return await call_next(request)

    # Added last, so it runs first: a rebound name or a forged write is refused before anything else.
    app.add_middleware(SameOrigin, hosts=allowed_hosts)

    app.include_router(build_router(reads, settings), dependencies=secured)

    @app.get(
        "/healthz",
        response_model=Health,
        summary="Liveness (no token needed)",
        responses={403: ERROR_RESPONSES[403]},
    )
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics",
        dependencies=secured,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "text exposition format"},
            **_AUTH_RESPONSE,
        },
    )
    def prometheus_metrics() -> Response:
        now = time.time_ns()
        try:
            counts = recent_job_status_counts(
                reads,
                since_ns=now - _RECENT_S * 1_000_000_000,
                now_ns=now,
                timeout_ns=settings.heartbeat_timeout_ns,
            )
            for status in ("running", "finished", "unknown"):
                metrics.jobs.labels(status).set(counts.get(status, 0))
        except (StoreError, TooManyRows) as exc:
            log.warning("argus_jobs not updated: %s", exc)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/",
        response_class=HTMLResponse,
        summary="The web page: jobs, heatmap, diagnoses",
        dependencies=secured,
        responses=_AUTH_RESPONSE,
    )
    def page() -> HTMLResponse:
        return HTMLResponse((_PAGE / "index.html").read_text(encoding="utf-8"))

    @app.get(
        "/page/{asset}",
        response_class=Response,
        summary="The web page's script and style",
        dependencies=secured,
        responses={**_AUTH_RESPONSE, 422: {"description": "No such asset"}},
    )
    def page_asset(asset: Literal["app.js", "style.css"]) -> Response:
        return Response((_PAGE / asset).read_bytes(), media_type=_ASSET_TYPES[asset])

    return app
