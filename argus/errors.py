"""The one error hierarchy of Argus.

Third-party errors (grpc, chDB, clickhouse-connect, ijson) are translated into
these at the edge, ``raise ArgusError(...) from exc``; the collector maps them to
gRPC status codes in one place and the REST API to HTTP statuses in another.

    ArgusError
    ├── ConfigError          bad option, URL or environment value
    ├── InvalidBatch         a batch that cannot be stored      → INVALID_ARGUMENT
    ├── StoreError           the store failed or is unreachable → UNAVAILABLE / 503
    │   └── StoreLocked      another process owns the chDB data dir
    ├── NotFound             unknown job or object              → NOT_FOUND / 404
    ├── Unauthenticated      missing or wrong bearer token      → UNAUTHENTICATED / 401
    ├── TraceError           a trace file that cannot be imported → 422
    ├── TooLarge             an upload past its size cap        → 413
    ├── SamplerError         py-spy absent or cannot attach (argus.agent.stacks; the probe samples itself)
    └── NotBuiltYet          a CLI command that does not exist yet
"""

from __future__ import annotations

__all__ = [
    "ArgusError",
    "ConfigError",
    "Forbidden",
    "InvalidBatch",
    "NotBuiltYet",
    "NotFound",
    "StoreError",
    "StoreLocked",
    "TooLarge",
    "TooManyRows",
    "TraceError",
    "Unauthenticated",
]


class ArgusError(Exception):
    """Root of every error Argus raises on purpose."""


class ConfigError(ArgusError):
    """An option, URL or environment variable has a value Argus cannot use."""


class InvalidBatch(ArgusError):
    """A batch is malformed: bad Arrow bytes, missing or mistyped column, bad values."""


class StoreError(ArgusError):
    """The ClickHouse store failed a query or cannot be reached."""


class StoreLocked(StoreError):
    """The chDB data dir is held by another process (chDB allows one per dir)."""


class NotFound(ArgusError):
    """The job (or other object) asked for does not exist."""


class Unauthenticated(ArgusError):
    """A request lacks the bearer token the server requires, or has a wrong one."""


class Forbidden(ArgusError):
    """A request comes through a name the server does not answer to (DNS rebinding) or from
    another site's page (cross-site request forgery)."""


class TraceError(ArgusError):
    """A trace file cannot be imported; the message names the file and position."""


class TooLarge(ArgusError):
    """A request body or its decompressed text is past its cap (argus.limits); nothing is written."""


class TooManyRows(ArgusError):
    """A read would scan more rows of the store than its limit (``max_rows_to_read``); nothing is answered.

    Args:
        limit: The limit, rows.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"the request would read more than {limit:,} rows of the store (max_read_rows, "
            "argus server --max-read-rows): ask for a shorter time range (start, end) or fewer ranks"
        )


class NotBuiltYet(ArgusError):
    """The requested command is part of the design but not implemented yet."""
