"""Settings shared by every part: defaults, environment variables, and the typed settings of commands.

Each default is chosen once here, every ``ARGUS_*`` environment variable is declared here
(:data:`ENVIRONMENT` says what each does), and each setting is checked once: a
:class:`ServerConfig` or :class:`AgentConfig` that exists is valid, built from the command's
flags (which fall back to the environment, :mod:`argus.cli`). The CLI, the probe and the README
read them from here.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from argus.errors import ConfigError
from argus.window_grid import WindowGrid

__all__ = [
    "DATABASE",
    "DEFAULT_AGENT_DRAIN_S",
    "DEFAULT_COLLECTOR",
    "DEFAULT_GRPC_LISTEN",
    "DEFAULT_HTTP_LISTEN",
    "DEFAULT_MAX_READ_ROWS",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "DEFAULT_MIN_LOSS_PCT",
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_SERVER_URL",
    "DEFAULT_SPOOL_MAX_BYTES",
    "DEFAULT_STACK_INTERVAL_S",
    "DEFAULT_STACK_SECONDS",
    "DEFAULT_STORE_URL",
    "DEFAULT_WINDOW",
    "DEFAULT_WINDOW_S",
    "ENVIRONMENT",
    "ENV_AGENT_DRAIN_S",
    "ENV_AGENT_LOG",
    "ENV_AUTOATTACH",
    "ENV_COLLECTOR",
    "ENV_COMMAND",
    "ENV_CUPTI",
    "ENV_CUPTI_BACKEND",
    "ENV_CUPTI_DUTY",
    "ENV_DDP_HOOK",
    "ENV_DISABLE",
    "ENV_JOB_ID",
    "ENV_LIBCUPTI",
    "ENV_PYSPY",
    "ENV_SERVER",
    "ENV_SOCKET",
    "ENV_STORE",
    "ENV_TOKEN",
    "MAX_MESSAGE_BYTES",
    "MIN_HEARTBEAT_TIMEOUT_NS",
    "SYSTEM_SOCKET",
    "AgentConfig",
    "ApiSettings",
    "ServerConfig",
    "TlsFiles",
    "check_min_loss_pct",
    "default_spool_dir",
    "env_flag",
    "parse_listen",
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
#: The unix socket of a node agent run as root (systemd, the Kubernetes DaemonSet): see
#: :func:`default_socket`.
SYSTEM_SOCKET = "/run/argus/agent.sock"
#: Analysis window and node-side compression window, seconds.
DEFAULT_WINDOW_S = 10.0
#: :data:`DEFAULT_WINDOW_S` as the grid every part uses (:mod:`argus.window_grid`).
DEFAULT_WINDOW = WindowGrid.from_seconds(DEFAULT_WINDOW_S)
#: Sustained loss (percent of wall time over the confirmation span) below which no diagnosis opens
#: (:mod:`argus.analyzer.loss`). Measured on the clean 4-rank jobs of tests/analyzer/test_real_runs.py
#: on the 2-core machine under other engineers' load (load average 7-19): the largest loss over two
#: consecutive 6 s windows was 7.7 % (dp), 2.2 % (pp), 9.1 % (tp); at 5 % the pp and tp jobs opened
#: nothing (a diagnosis also needs a rank, or the job, to stand out from its noise) and the dp job
#: named a rank the scheduler slowed (a known failure, issue 16). 5 % keeps a 5 %-costly
#: tensor-parallel straggler diagnosable there (README, "How the analyzer decides").
DEFAULT_MIN_LOSS_PCT = 5.0
#: Seconds between two stack captures of one diagnosis (docs/design.md §6.12; argus.analyzer.stacks): one
#: when it opens or its cause changes, then at most one per this many seconds while it stays open.
DEFAULT_STACK_INTERVAL_S = 300.0
#: Seconds one stack capture samples each rank (py-spy at 10 Hz: 30 samples).
DEFAULT_STACK_SECONDS = 3.0
#: Rows are dropped this many days after they were stored.
DEFAULT_RETENTION_DAYS = 30
#: Bound on the node agent's on-disk spool of unacknowledged batches.
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
#: Cap on a trace upload's request body and decompressed text, bytes (argus.limits).
DEFAULT_MAX_UPLOAD_BYTES = 2 * 1024**3
#: CPU seconds one trace upload may take to parse (thread time); past it the upload is refused (413).
DEFAULT_MAX_UPLOAD_PARSE_S = 120.0
#: Seconds a stopping node agent keeps sending what it spooled.
DEFAULT_AGENT_DRAIN_S = 10.0
#: Longest one store call (query, command, insert) may run before ClickHouse stops it, seconds
#: (``max_execution_time``).
DEFAULT_STORE_TIMEOUT_S = 60
#: Most memory one store call may use in ClickHouse, bytes (``max_memory_usage``).
DEFAULT_STORE_MEMORY_BYTES = 4 * 1024**3
#: Agent streams one server keeps open at once (each holds its batches read ahead); past it a new
#: stream is refused with UNAVAILABLE (argus.collector.grpc_service).
DEFAULT_MAX_STREAMS = 2048
#: Bytes of agent batches the server holds from read to written, all streams together: payload
#: plus what they declare decoded (argus.collector.decoded_budget); past it a stream waits.
DEFAULT_MAX_DECODED_BYTES = 1 << 30
#: Rows of the store one REST read may scan (ClickHouse ``max_rows_to_read``); past it the request
#: is answered 422 (:class:`argus.errors.TooManyRows`). A day of a 10,000-rank job's steps at two
#: steps a second is 1.7 billion rows; a billion is a few seconds of a ClickHouse server's scan.
DEFAULT_MAX_READ_ROWS = 1_000_000_000
#: A rank whose heartbeats are this old is no longer ``running`` whatever the window (the REST
#: API waits three windows, and at least this long: :attr:`ApiSettings.heartbeat_timeout_ns`), ns.
MIN_HEARTBEAT_TIMEOUT_NS = 3 * DEFAULT_WINDOW.length_ns
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
ENV_CUPTI = "ARGUS_CUPTI"
ENV_CUPTI_DUTY = "ARGUS_CUPTI_DUTY"
ENV_CUPTI_BACKEND = "ARGUS_CUPTI_BACKEND"
ENV_LIBCUPTI = "ARGUS_LIBCUPTI"
ENV_DDP_HOOK = "ARGUS_DDP_HOOK"
ENV_AGENT_DRAIN_S = "ARGUS_AGENT_DRAIN_S"
ENV_AGENT_LOG = "ARGUS_AGENT_LOG"
ENV_AUTOATTACH = "ARGUS_AUTOATTACH"
ENV_COMMAND = "ARGUS_COMMAND"
ENV_PYSPY = "ARGUS_PYSPY"

#: Every environment variable Argus reads, and what it does.
ENVIRONMENT: dict[str, str] = {
    ENV_COLLECTOR: "collector address (HOST:PORT) of `argus agent` and `argus run`",
    ENV_SOCKET: "the node agent's unix socket, for the agent, `argus run` and the probe",
    ENV_JOB_ID: "the job id the probe reports (set by `argus run`)",
    ENV_DISABLE: "1: the probe and `argus run`'s automatic attach do nothing",
    ENV_TOKEN: "bearer token of every command that takes --token",
    ENV_SERVER: "server URL of `argus diagnose`, `argus import`, `argus jobs` and `argus run`",
    ENV_STORE: "store URL of `argus server` and `argus analyze`",
    ENV_CUPTI: "0: no GPU kernel capture (CUPTI)",
    ENV_CUPTI_DUTY: "GPU kernel capture duty cycle: ON/PERIOD seconds (default 1/10) or `always`",
    ENV_CUPTI_BACKEND: "how CUPTI is read: `native` (default; libcupti through ctypes) or `cupti-python`",
    ENV_LIBCUPTI: "libcupti the native backend loads (default: the one torch loaded, else searched for)",
    ENV_DDP_HOOK: "0: leave DDP's C++ all-reduce alone (no bucket capture)",
    ENV_AGENT_DRAIN_S: "seconds a stopping node agent keeps sending what it spooled (default 10)",
    ENV_AGENT_LOG: "log file of a node agent `argus run` starts (default next to the spool)",
    ENV_AUTOATTACH: "set by `argus run` for its processes: attach the probe at start-up",
    ENV_COMMAND: "set by `argus run`: the job's command line, as the probe reports it",
    ENV_PYSPY: "py-spy executable of the node agent's stack captures (default: beside its Python, else "
    "on PATH); `off`: the probes sample their own threads",
}


def default_socket(environ: Mapping[str, str] | None = None, euid: int | None = None) -> str:
    """Where a node agent listens when ``--socket`` is not given: never under ``/tmp``.

    Root: :data:`SYSTEM_SOCKET`. Others: ``$XDG_RUNTIME_DIR/argus/agent.sock`` (systemd's per-user
    runtime folder, mode 0700), else ``$XDG_STATE_HOME/argus/agent.sock`` (``~/.local/state``). The
    agent creates the folder mode 0700 (0750 with ``--socket-group``) and refuses one another user
    owns or others may write (:func:`argus.agent.node.main`).
    """
    env = os.environ if environ is None else environ
    if (os.geteuid() if euid is None else euid) == 0:
        return SYSTEM_SOCKET
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "argus" / "agent.sock")
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(state) / "argus" / "agent.sock")


def find_socket(environ: Mapping[str, str] | None = None, euid: int | None = None) -> str:
    """The socket a probe or `argus run` uses: ``$ARGUS_SOCKET``, else :func:`default_socket`, else,
    when nothing is there and a system-wide agent's socket exists that this user may connect to
    (a member of its ``--socket-group``), :data:`SYSTEM_SOCKET`."""
    env = os.environ if environ is None else environ
    given = env.get(ENV_SOCKET)
    if given:
        return given
    own = default_socket(env, euid)
    if not os.path.exists(own) and os.access(SYSTEM_SOCKET, os.W_OK):
        return SYSTEM_SOCKET
    return own


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


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """True when environment variable ``name`` is set to 1/true/yes/on (any case)."""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def parse_listen(value: str, option: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into host and port.

    Raises:
        ConfigError: no port, or a port outside 0..65535 (the message names ``option``).
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{option} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:7470")
    return host.strip("[]"), int(port)


def _positive(option: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{option} must be > 0, got {value}")


def _at_least(option: str, value: float, least: int) -> None:
    if value < least:
        raise ConfigError(f"{option} must be >= {least}, got {value}")


def check_min_loss_pct(value: float) -> float:
    """The loss threshold ``--min-loss-pct``, a percent of wall time strictly between 0 and 100.

    Raises:
        ConfigError: ``value`` is outside (0, 100).
    """
    if not 0 < value < 100:
        raise ConfigError(f"--min-loss-pct must be in (0, 100), got {value}")
    return value


@dataclass(frozen=True)
class TlsFiles:
    """A server's TLS certificate and private key, PEM files (both or neither: ``--tls-cert/--tls-key``)."""

    cert: str
    key: str

    @classmethod
    def of(cls, cert: str | None, key: str | None) -> TlsFiles | None:
        """The pair, or None when neither is given.

        Raises:
            ConfigError: only one of them is given.
        """
        if (cert is None) != (key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        return cls(cert, key) if cert is not None and key is not None else None


@dataclass(frozen=True)
class ApiSettings:
    """What the REST API of a server needs (:func:`argus.collector.api.create_app`); checked when built.

    Built once by :class:`ServerConfig` (its ``api``) and passed whole to the app and its routes.

    Attributes:
        token: Bearer token every endpoint but ``/healthz`` requires, or None.
        window: The analysis window; uploaded traces are summarised in it.
        max_upload_bytes: Cap on a request body and on an upload's decompressed text, bytes (>= 1; 413).
        max_read_rows: Rows of the store one request may scan (>= 1; 422 past it, naming the limit).
        max_upload_parse_s: CPU seconds parsing one trace upload may take (> 0; 413 past it).

    Raises:
        ConfigError: a limit out of range (the message names its flag).
    """

    token: str | None = None
    window: WindowGrid = DEFAULT_WINDOW
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    max_read_rows: int = DEFAULT_MAX_READ_ROWS
    max_upload_parse_s: float = DEFAULT_MAX_UPLOAD_PARSE_S

    def __post_init__(self) -> None:
        _at_least("--max-upload-bytes", self.max_upload_bytes, 1)
        _at_least("--max-read-rows", self.max_read_rows, 1)
        _positive("--max-upload-parse-s", self.max_upload_parse_s)

    @property
    def heartbeat_timeout_ns(self) -> int:
        """A rank whose newest heartbeat is older than this is not ``running``: three windows, and at
        least :data:`MIN_HEARTBEAT_TIMEOUT_NS`, ns."""
        return max(MIN_HEARTBEAT_TIMEOUT_NS, 3 * self.window.length_ns)


@dataclass(frozen=True)
class ServerConfig:
    """The settings of `argus server`; checked when built (:class:`~argus.errors.ConfigError`).

    Attributes:
        store: Store URL (:func:`argus.store.open_store`).
        grpc_listen: gRPC ingest address, ``HOST:PORT`` (port 0: a free one).
        http_listen: REST API and /metrics address, ``HOST:PORT``.
        window: Analysis window (``--window-s``, :meth:`WindowGrid.from_seconds`).
        min_loss_pct: A fault opens only when it costs the job at least this share of its time (0–100 %).
        retention_days: Rows are dropped this many days after storing them (>= 1).
        cluster: ClickHouse cluster name (replicated and distributed tables), or None.
        token: Bearer token clients must send, or None.
        tls: Certificate and key to serve TLS with, or None.
        analyzer: Run the analyzer in the server.
        max_upload_bytes: Cap on a trace upload's body and decompressed text, bytes (>= 1; 413 past it).
        stack_interval_s: Seconds between two stack captures of one open diagnosis (> 0).
        max_streams: Agent streams kept open at once (>= 1; past it a new one is refused).
        max_read_rows: Rows of the store one REST read may scan (>= 1; 422 past it).
        max_decoded_bytes: Bytes of batches held from read to written, all streams (>= 1; waits past it).
        max_upload_parse_s: CPU seconds parsing one trace upload may take (> 0; 413 past it).
        api: The REST API's part of these (:class:`ApiSettings`), built with them.
    """

    store: str = DEFAULT_STORE_URL
    grpc_listen: str = DEFAULT_GRPC_LISTEN
    http_listen: str = DEFAULT_HTTP_LISTEN
    window: WindowGrid = DEFAULT_WINDOW
    min_loss_pct: float = DEFAULT_MIN_LOSS_PCT
    retention_days: int = DEFAULT_RETENTION_DAYS
    cluster: str | None = None
    token: str | None = None
    tls: TlsFiles | None = None
    analyzer: bool = True
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    stack_interval_s: float = DEFAULT_STACK_INTERVAL_S
    max_streams: int = DEFAULT_MAX_STREAMS
    max_read_rows: int = DEFAULT_MAX_READ_ROWS
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    max_upload_parse_s: float = DEFAULT_MAX_UPLOAD_PARSE_S
    api: ApiSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parse_listen(self.grpc_listen, "--grpc-listen")
        _positive("--stack-interval-s", self.stack_interval_s)
        parse_listen(self.http_listen, "--http-listen")
        check_min_loss_pct(self.min_loss_pct)
        _at_least("--retention-days", self.retention_days, 1)
        _at_least("--max-streams", self.max_streams, 1)
        _at_least("--max-decoded-bytes", self.max_decoded_bytes, 1)
        api = ApiSettings(
            token=self.token,
            window=self.window,
            max_upload_bytes=self.max_upload_bytes,
            max_read_rows=self.max_read_rows,
            max_upload_parse_s=self.max_upload_parse_s,
        )
        object.__setattr__(self, "api", api)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """The settings of `argus server`'s flags (:func:`argus.cli.build_parser`).

        Raises:
            ConfigError: a bad value (the message names the flag).
        """
        return cls(
            store=args.store,
            grpc_listen=args.grpc_listen,
            http_listen=args.http_listen,
            window=WindowGrid.from_seconds(args.window_s),
            min_loss_pct=args.min_loss_pct,
            retention_days=args.retention_days,
            cluster=args.cluster,
            token=args.token,
            tls=TlsFiles.of(args.tls_cert, args.tls_key),
            analyzer=not args.no_analyzer,
            max_upload_bytes=args.max_upload_bytes,
            stack_interval_s=args.stack_interval_s,
            max_streams=args.max_streams,
            max_read_rows=args.max_read_rows,
            max_decoded_bytes=args.max_decoded_bytes,
            max_upload_parse_s=args.max_upload_parse_s,
        )


@dataclass(frozen=True)
class AgentConfig:
    """The settings of `argus agent`; checked when built (:class:`~argus.errors.ConfigError`).

    Attributes:
        socket: Unix socket the node's probes connect to (default :func:`default_socket`).
        socket_group: Group (name or gid) given the socket (mode 0660) and its folder (0750), so
            its members' probes may connect; None: the agent's own group, folder 0700.
        collector: Collector address, ``HOST:PORT``.
        spool_dir: Spool of unacknowledged batches (default: one per collector, :func:`spool_dir_for`).
        spool_max_bytes: Bound on the spool, bytes (> 0).
        window: Kernel compression window (``--window-s``, :meth:`WindowGrid.from_seconds`).
        token: Bearer token sent to the collector, or None.
        tls_cert: PEM certificate (or CA) of the collector to trust: use TLS; None for plaintext.
        drain_s: Seconds a stopping agent keeps sending (``$ARGUS_AGENT_DRAIN_S``).
    """

    socket: str = ""
    collector: str = DEFAULT_COLLECTOR
    spool_dir: str = ""
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    window: WindowGrid = DEFAULT_WINDOW
    token: str | None = None
    tls_cert: str | None = None
    drain_s: float = DEFAULT_AGENT_DRAIN_S
    socket_group: str | None = None

    def __post_init__(self) -> None:
        _positive("--spool-max-bytes", self.spool_max_bytes)
        if self.drain_s < 0:
            raise ConfigError(f"{ENV_AGENT_DRAIN_S} must be >= 0, got {self.drain_s}")
        if not self.spool_dir:
            object.__setattr__(self, "spool_dir", str(spool_dir_for(self.collector)))
        if not self.socket:
            object.__setattr__(self, "socket", default_socket())

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> AgentConfig:
        """The settings of `argus agent`'s flags and ``$ARGUS_AGENT_DRAIN_S``.

        Raises:
            ConfigError: a bad value (the message names the flag or variable).
        """
        env = os.environ if environ is None else environ
        drain = env.get(ENV_AGENT_DRAIN_S, "").strip()
        try:
            drain_s = float(drain) if drain else DEFAULT_AGENT_DRAIN_S
        except ValueError:
            raise ConfigError(f"{ENV_AGENT_DRAIN_S}={drain!r} is not a number of seconds") from None
        return cls(
            socket=args.socket,
            collector=args.collector,
            spool_dir=args.spool or "",
            spool_max_bytes=args.spool_max_bytes,
            window=WindowGrid.from_seconds(args.window_s),
            token=args.token,
            tls_cert=args.tls_cert,
            drain_s=drain_s,
            socket_group=getattr(args, "socket_group", None),
        )
