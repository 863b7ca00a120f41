"""The `argus` command line (docs/design.md §8).

Each subcommand is an ``argparse`` parser here and a ``main(args) -> int``
function in the module that does the work, imported only when that command
runs (so `argus diagnose` never imports torch). Defaults come from
:mod:`argus.config`; options fall back to the ``ARGUS_*`` environment variables.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from argus import __version__, config
from argus.errors import ArgusError, ConfigError

__all__ = ["build_parser", "main"]

#: Subcommand → "module:function" that runs it.
COMMANDS: dict[str, str] = {
    "server": "argus.server:main",
    "agent": "argus.agent.node:main",
    "run": "argus.agent.run:main",
    "demo": "argus.demo.command:main",
    "import": "argus.collector.importer:main",
    "analyze": "argus.analyzer.service:main",
    "diagnose": "argus.client:diagnose_main",
    "jobs": "argus.client:jobs_main",
}


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(name) or default


# --- option groups: each declared once, used by every command that takes it ----------------------

#: A parser or a group of one (argparse's common base).
_Options = argparse._ActionsContainer


def _store(p: _Options, *, default: str | None = config.DEFAULT_STORE_URL) -> None:
    """``--store URL`` (``$ARGUS_STORE``): the ClickHouse store, embedded or a server."""
    p.add_argument(
        "--store",
        default=_env(config.ENV_STORE, default) if default is not None else None,
        metavar="URL",
        help="store URL, chdb://DIR or clickhouse://user:pass@host:port/db"
        + (" (default %(default)s)" if default is not None else " (offline)"),
    )


def _collector(p: argparse.ArgumentParser, *, client: bool = False) -> None:
    """``--collector HOST:PORT`` (``$ARGUS_COLLECTOR``) and ``--socket PATH`` (``$ARGUS_SOCKET``;
    default :func:`argus.config.default_socket`, for a ``client`` :func:`argus.config.find_socket`)."""
    p.add_argument(
        "--collector",
        default=_env(config.ENV_COLLECTOR, config.DEFAULT_COLLECTOR),
        metavar="HOST:PORT",
        help="collector address (default %(default)s)",
    )
    p.add_argument(
        "--socket",
        default=config.find_socket() if client else _env(config.ENV_SOCKET, config.default_socket()),
        metavar="PATH",
        help="the node agent's unix socket for probes (default %(default)s)",
    )


def _server_url(p: _Options, *, default: str | None = config.DEFAULT_SERVER_URL) -> None:
    """``--server URL`` (``$ARGUS_SERVER``): a running `argus server`'s REST API."""
    p.add_argument(
        "--server",
        default=_env(config.ENV_SERVER, default) if default is not None else None,
        metavar="URL",
        help=f"a running argus server (default {config.DEFAULT_SERVER_URL})",
    )


def _auth(p: argparse.ArgumentParser, *, server: bool) -> None:
    """``--token``, ``--token-file`` (else ``$ARGUS_TOKEN``), ``--tls-cert`` (``--tls-key`` on the server)."""
    p.add_argument(
        "--token",
        help="bearer token" + (" clients must send" if server else " to send") + f" (${config.ENV_TOKEN}; "
        "a command line is visible to every user of the machine: prefer --token-file or the variable)",
    )
    p.add_argument("--token-file", metavar="FILE", help="read the bearer token from FILE (its first line)")
    if server:
        p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: serve TLS (with --tls-key)")
        p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    else:
        p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate of the server to trust: use TLS")


def _min_loss(p: argparse.ArgumentParser) -> None:
    """``--min-loss-pct PCT``: the analyzer's loss threshold."""
    p.add_argument(
        "--min-loss-pct",
        type=float,
        default=config.DEFAULT_MIN_LOSS_PCT,
        metavar="PCT",
        help="loss threshold: a fault opens only when it costs the job at least this share of its time "
        "over the confirmation span (default %(default)s)",
    )


def _stack_interval(p: argparse.ArgumentParser) -> None:
    """``--stack-interval-s S``: how often one open diagnosis gets a stack capture."""
    p.add_argument(
        "--stack-interval-s",
        type=float,
        default=config.DEFAULT_STACK_INTERVAL_S,
        metavar="S",
        help="seconds between two stack captures (py-spy) of the ranks of one open diagnosis; one is "
        "taken when it opens or its cause changes (default %(default)s)",
    )


def _window(p: argparse.ArgumentParser, what: str) -> None:
    """``--window-s S``: the analysis window (and the node agent's compression window)."""
    p.add_argument(
        "--window-s",
        type=float,
        default=config.DEFAULT_WINDOW_S,
        metavar="S",
        help=f"{what}, seconds (default %(default)s)",
    )


def _server_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus server` and its options."""
    p = sub.add_parser("server", help="collector + analyzer + REST API + /metrics in one process")
    _store(p)
    p.add_argument(
        "--grpc-listen",
        default=config.DEFAULT_GRPC_LISTEN,
        metavar="HOST:PORT",
        help="gRPC ingest address (default %(default)s)",
    )
    p.add_argument(
        "--http-listen",
        default=config.DEFAULT_HTTP_LISTEN,
        metavar="HOST:PORT",
        help="REST API and /metrics address (default %(default)s)",
    )
    _auth(p, server=True)
    _window(p, "analysis window")
    _min_loss(p)
    _stack_interval(p)
    p.add_argument(
        "--retention-days",
        type=int,
        default=config.DEFAULT_RETENTION_DAYS,
        help="drop rows this many days after storing them (default %(default)s)",
    )
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="ClickHouse cluster: ReplicatedMergeTree + Distributed tables",
    )
    p.add_argument("--no-analyzer", action="store_true", help="run ingest and API only")
    p.add_argument(
        "--max-upload-bytes",
        type=int,
        default=config.DEFAULT_MAX_UPLOAD_BYTES,
        metavar="BYTES",
        help="cap on a trace upload's body and decompressed text; 413 past it (default %(default)s)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=config.DEFAULT_MAX_STREAMS,
        metavar="N",
        help="agent streams kept open at once; past it a new one gets UNAVAILABLE (default %(default)s)",
    )
    p.add_argument(
        "--max-read-rows",
        type=int,
        default=config.DEFAULT_MAX_READ_ROWS,
        metavar="N",
        help="rows of the store one REST read may scan; 422 past it (default %(default)s)",
    )
    p.add_argument(
        "--max-upload-parse-s",
        type=float,
        default=config.DEFAULT_MAX_UPLOAD_PARSE_S,
        metavar="S",
        help="CPU seconds parsing one trace upload may take; 413 past it (default %(default)s)",
    )
    p.add_argument(
        "--max-decoded-bytes",
        type=int,
        default=config.DEFAULT_MAX_DECODED_BYTES,
        metavar="BYTES",
        help="agent batches held from read to written, payload plus decoded, all streams; "
        "past it a stream waits (default %(default)s)",
    )


def _agent_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus agent` and its options."""
    p = sub.add_parser("agent", help="node agent: takes probe buffers, compresses, streams to the collector")
    _collector(p)
    p.add_argument(
        "--spool",
        default=None,
        metavar="DIR",
        help=f"spool of unacknowledged batches (default {config.default_spool_dir()}/COLLECTOR)",
    )
    p.add_argument(
        "--spool-max-bytes",
        type=int,
        default=config.DEFAULT_SPOOL_MAX_BYTES,
        help="spool bound (default %(default)s)",
    )
    p.add_argument(
        "--socket-group",
        default=None,
        metavar="GROUP",
        help="group (name or gid) whose members' probes may connect: the socket is mode 0660 and "
        "its folder 0750 with this group (default: the agent's own group, folder 0700)",
    )
    _window(p, "kernel compression window")
    _auth(p, server=False)


def _run_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus run` and its options."""
    p = sub.add_parser(
        "run", help="run COMMAND (e.g. torchrun ...) with the probe attached to every Python rank"
    )
    _collector(p, client=True)
    p.add_argument(
        "--job-id",
        default=_env(config.ENV_JOB_ID, None),
        help="job id (default: $TORCHELASTIC_RUN_ID, else a new one)",
    )
    _window(p, "kernel compression window of a node agent started for the job")
    _auth(p, server=False)
    p.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help=f"the argus server whose diagnoses of the job this terminal prints (${config.ENV_SERVER}; "
        "default port 7471 of the collector's host)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="do not print the job's diagnoses as they open and resolve, nor the verdict at its end",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the command to run")


def _demo_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus demo` and its options."""
    p = sub.add_parser(
        "demo",
        help="the whole system on one machine against a real training job with a fault injected",
    )
    # The job's names (argus.demo.job.SCENARIOS, LAYOUTS) written out: that module imports torch.
    p.add_argument(
        "--scenario",
        choices=["none", "compute", "host_stall", "spiky_stall", "dataloader", "host_work", "slow_link"],
        default="compute",
        help="the fault (default %(default)s; slow_link: with --nodes 3 or more)",
    )
    p.add_argument(
        "--layout",
        choices=["dp", "pp", "tp", "fsdp"],
        default="dp",
        help="data parallel, pipeline x data parallel, tensor x data parallel, fully sharded data "
        "parallel (FSDP2) (default %(default)s)",
    )
    p.add_argument("--ranks", type=int, default=4, help="world size (default %(default)s)")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="nodes, each in a network namespace (root only; slow_link needs 3 or more); "
        "--ranks is spread over them (default %(default)s)",
    )
    p.add_argument("--slow-rank", type=int, default=None, help="the rank to slow down (default: the last)")
    p.add_argument(
        "--steps", type=int, default=None, help="training steps (default: enough for the diagnosis)"
    )
    p.add_argument("--data-dir", default=None, help="store data dir (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _import_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus import` and its options."""
    p = sub.add_parser("import", help="load PyTorch profiler (Kineto) traces, one file per rank")
    where = p.add_mutually_exclusive_group()
    _server_url(where)
    _store(where, default=None)
    p.add_argument("--job-id", default=None, help="job id (default: from the traces)")
    p.add_argument(
        "--rank", type=int, default=None, help="rank of a single file without distributedInfo.rank"
    )
    _window(p, "kernel summary window with --store (an upload is summarised in the server's window)")
    _auth(p, server=False)
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files (.json or .json.gz)")


def _analyze_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus analyze` and its options."""
    p = sub.add_parser("analyze", help="the analyzer on its own")
    _store(p)
    _window(p, "analysis window")
    _min_loss(p)
    _stack_interval(p)
    p.add_argument("--once", action="store_true", help="analyze what is stored, then exit")
    p.add_argument("--job", default=None, help="only this job")


def _diagnose_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus diagnose` and its options."""
    p = sub.add_parser("diagnose", help="print a job's diagnoses")
    p.add_argument("--job", "--job-id", dest="job", required=True, help="job id")
    _server_url(p)
    p.add_argument("--json", action="store_true", help="print the diagnosis objects as JSON")
    _auth(p, server=False)


def _jobs_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`argus jobs` and its options."""
    p = sub.add_parser("jobs", help="list jobs: status, ranks, open diagnoses, last seen (newest first)")
    _server_url(p)
    p.add_argument("--json", action="store_true", help="print the REST API's job objects as JSON")
    _auth(p, server=False)


def build_parser() -> argparse.ArgumentParser:
    """The full `argus` parser; each subparser sets ``args.command``."""
    parser = argparse.ArgumentParser(
        prog="argus",
        description="Always-on tracing and fail-slow diagnosis for distributed PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _server_command(sub)
    _agent_command(sub)
    _run_command(sub)
    _demo_command(sub)
    _import_command(sub)
    _analyze_command(sub)
    _diagnose_command(sub)
    _jobs_command(sub)
    return parser


def _resolve(command: str) -> Callable[[argparse.Namespace], int] | None:
    module_name, _, func = COMMANDS[command].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    fn: Callable[[argparse.Namespace], int] = getattr(module, func)
    return fn


def _resolve_token(args: argparse.Namespace) -> None:
    """Set ``args.token``: ``--token``, else the first line of ``--token-file``, else ``$ARGUS_TOKEN``.

    Raises:
        ConfigError: the token file cannot be read or is empty.
    """
    if not hasattr(args, "token") or args.token:
        return
    path = getattr(args, "token_file", None)
    if not path:
        args.token = _env(config.ENV_TOKEN, None)
        return
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    if not lines or not lines[0].strip():
        raise ConfigError(f"the token file {path} is empty")
    args.token = lines[0].strip()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `argus` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One INFO line per HTTP request of the REST client is noise on a command's output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run = _resolve(args.command)
    if run is None:
        print(f"argus {args.command}: not built yet", file=sys.stderr)
        return 2
    try:
        _resolve_token(args)
        return run(args)
    except ArgusError as exc:
        print(f"argus {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
