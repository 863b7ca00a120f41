"""REST API (DESIGN §6) — stub: /healthz only. Owned by issue 5, which replaces this module."""

from __future__ import annotations

from argus.collector.metrics import Metrics
from argus.collector.store import Store
from fastapi import FastAPI

__all__ = ["create_app"]


def create_app(store: Store, *, metrics: Metrics, token: str | None = None) -> FastAPI:
    """The FastAPI app of an `argus server` over ``store``.

    Args:
        store: The server's store (the process owns it; the app never closes it).
        metrics: The server's metrics; ``/metrics`` exposes ``metrics.registry``.
        token: When set, every endpoint but ``/healthz`` requires ``Authorization: Bearer TOKEN``.
    """
    app = FastAPI(title="Argus")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
