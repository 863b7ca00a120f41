"""Defaults shared by every part: addresses, paths, the analysis window, environment variables.

Each default is chosen once here; the CLI, the probe and the README read it from here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "DATABASE",
    "DEFAULT_COLLECTOR",
    "DEFAULT_GRPC_LISTEN",
    "DEFAULT_HTTP_LISTEN",
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_SERVER_URL",
    "DEFAULT_SOCKET",
    "DEFAULT_SPOOL_MAX_BYTES",
    "DEFAULT_STORE_URL",
    "DEFAULT_WINDOW_S",
    "ENV_COLLECTOR",
    "ENV_DISABLE",
    "ENV_JOB_ID",
    "ENV_SERVER",
    "ENV_SOCKET",
    "ENV_STORE",
    "ENV_TOKEN",
    "MAX_MESSAGE_BYTES",
    "default_spool_dir",
    "env_flag",
    "spool_dir_for",
]

#: gRPC ingest (node agents connect here).
DEFAULT_GRPC_LISTEN = "127.0.0.1:7470"
#: REST API, web page and /metrics.
DEFAULT_HTTP_LISTEN = "127.0.0.1:7471"
#: Where node agents and `argus run` send batches.
DEFAULT_COLLECTOR = "127.0.0.1:7470"
#: Where client commands (`import`, `diagnose`) reach a running server.
DEFAULT_SERVER_URL = "http://127.0.0.1:7471"
#: Embedded ClickHouse (chDB) under ./argus-data.
DEFAULT_STORE_URL = "chdb://./argus-data"
#: Unix socket between probes and the node agent of their node.
DEFAULT_SOCKET = "/tmp/argus/agent.sock"
#: Analysis window and node-side compression window, seconds.
DEFAULT_WINDOW_S = 10.0
#: Rows are dropped this many days after they were stored.
DEFAULT_RETENTION_DAYS = 30
#: Bound on the node agent's on-disk spool of unacknowledged batches.
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
#: gRPC message size limit, both directions; larger batches are split by the agent.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: ClickHouse database holding the tables of argus.schema.
DATABASE = "argus"

ENV_COLLECTOR = "ARGUS_COLLECTOR"
ENV_SOCKET = "ARGUS_SOCKET"
ENV_JOB_ID = "ARGUS_JOB_ID"
ENV_DISABLE = "ARGUS_DISABLE"
ENV_TOKEN = "ARGUS_TOKEN"
ENV_SERVER = "ARGUS_SERVER"
ENV_STORE = "ARGUS_STORE"


def default_spool_dir() -> Path:
    """The node agent's spool folder: ``$XDG_STATE_HOME/argus/spool`` (``~/.local/state/...``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "argus" / "spool"


def spool_dir_for(collector: str) -> Path:
    """The default spool of a node agent streaming to ``collector`` (``host:port``).

    One folder per collector: batches spooled for one collector are never replayed
    into another's store when an agent is later started against a different one.
    """
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", collector).strip("_") or "collector"
    return default_spool_dir() / slug


def env_flag(name: str) -> bool:
    """True when environment variable ``name`` is set to 1/true/yes/on (any case)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
