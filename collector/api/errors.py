"""The one mapping from Argus errors to HTTP statuses (docs/style.md §5).

    NotFound          → 404      unknown job
    Unauthenticated   → 401      missing or wrong bearer token (with WWW-Authenticate)
    Forbidden         → 403      a Host the server does not answer to, or another site's Origin
    BadParameter      → 422      a query parameter the API cannot use
    TraceError        → 422      an uploaded trace that cannot be imported
    TooLarge          → 413      an upload past --max-upload-bytes (body or decompressed)
    TooManyRows       → 422      a read that would scan more than --max-read-rows rows
    InvalidBatch      → 422
    ConfigError       → 422
    NotBuiltYet       → 501      a part of the design not implemented yet
    StoreError        → 503      the store failed or is unreachable (StoreLocked too)
    other ArgusError  → 500

Bodies are FastAPI's ``{"detail": message}``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from argus.collector.api.params import BadParameter
from argus.errors import (
    ArgusError,
    ConfigError,
    Forbidden,
    InvalidBatch,
    NotBuiltYet,
    NotFound,
    StoreError,
    TooLarge,
    TooManyRows,
    TraceError,
    Unauthenticated,
)

__all__ = ["ERROR_RESPONSES", "error_response", "http_status", "install_error_handlers"]

log = logging.getLogger(__name__)

_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NotFound, 404),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (BadParameter, 422),
    (TraceError, 422),
    (TooLarge, 413),
    (TooManyRows, 422),
    (InvalidBatch, 422),
    (ConfigError, 422),
    (NotBuiltYet, 501),
    (StoreError, 503),
    (ArgusError, 500),
)

#: OpenAPI description of the error answers every endpoint may give.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong bearer token (only when the server has a token)"},
    403: {"description": "A Host the server does not answer to, or a write from another site's page"},
    503: {"description": "The store failed or cannot be reached"},
}


def http_status(exc: Exception) -> int:
    """The HTTP status for ``exc`` (an ArgusError or BadParameter); 500 for anything else."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def error_response(exc: Exception) -> JSONResponse:
    """``{"detail": str(exc)}`` with the status of :func:`http_status`."""
    status = http_status(exc)
    if status >= 500:
        log.warning("answering %d: %s", status, exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer ArgusError and BadParameter raised by any endpoint through :func:`error_response`."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    app.add_exception_handler(ArgusError, handle)
    app.add_exception_handler(BadParameter, handle)
