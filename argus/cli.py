"""The `argus` command line (DESIGN §6).

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

from argus import __version__, config
from argus.errors import ArgusError

__all__ = ["build_parser", "main"]

#: Subcommand → "module:function" that runs it.
COMMANDS: dict[str, str] = {
    "server": "argus.collector.server:main",
    "agent": "argus.agent.node:main",
    "run": "argus.agent.run:main",
    "demo": "argus.demo:main",
    "import": "argus.collector.importer:main",
    "analyze": "argus.analyzer.service:main",
    "diagnose": "argus.collector.client:diagnose_main",
    "jobs": "argus.collector.client:jobs_main",
}


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(name) or default


def _add_auth(p: argparse.ArgumentParser, *, server: bool) -> None:
    p.add_argument(
        "--token",
        default=_env(config.ENV_TOKEN, None),
        help="bearer token" + (" clients must send" if server else " to send") + f" (${config.ENV_TOKEN})",
    )
    if server:
        p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: serve TLS (with --tls-key)")
        p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    else:
        p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate of the server to trust: use TLS")


def _add_min_loss(p: argparse.ArgumentParser) -> None:
    from argus.analyzer.loss import DEFAULT_MIN_LOSS_PCT

    p.add_argument(
        "--min-loss-pct",
        type=float,
        default=DEFAULT_MIN_LOSS_PCT,
        metavar="PCT",
        help="loss threshold: a fault opens only when it costs the job at least this share of its time "
        "over the confirmation span (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full `argus` parser; each subparser sets ``args.command``."""
    parser = argparse.ArgumentParser(
        prog="argus",
        description="Always-on tracing and fail-slow diagnosis for distributed PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("server", help="collector + analyzer + REST API + /metrics in one process")
    p.add_argument(
        "--store",
        default=_env(config.ENV_STORE, config.DEFAULT_STORE_URL),
        help="store URL (default %(default)s)",
    )
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
    _add_auth(p, server=True)
    p.add_argument(
        "--window-s",
        type=float,
        default=config.DEFAULT_WINDOW_S,
        help="analysis window, seconds (default %(default)s)",
    )
    _add_min_loss(p)
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

    p = sub.add_parser("agent", help="node agent: takes probe buffers, compresses, streams to the collector")
    p.add_argument(
        "--collector",
        default=_env(config.ENV_COLLECTOR, config.DEFAULT_COLLECTOR),
        metavar="HOST:PORT",
        help="collector address (default %(default)s)",
    )
    p.add_argument(
        "--socket",
        default=_env(config.ENV_SOCKET, config.DEFAULT_SOCKET),
        metavar="PATH",
        help="unix socket for probes (default %(default)s)",
    )
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
        "--window-s",
        type=float,
        default=config.DEFAULT_WINDOW_S,
        help="kernel compression window, seconds (default %(default)s)",
    )
    _add_auth(p, server=False)

    p = sub.add_parser(
        "run", help="run COMMAND (e.g. torchrun ...) with the probe attached to every Python rank"
    )
    p.add_argument(
        "--collector",
        default=_env(config.ENV_COLLECTOR, config.DEFAULT_COLLECTOR),
        metavar="HOST:PORT",
        help="collector address (default %(default)s)",
    )
    p.add_argument(
        "--job-id",
        default=_env(config.ENV_JOB_ID, None),
        help="job id (default: $TORCHELASTIC_RUN_ID, else a new one)",
    )
    p.add_argument(
        "--socket",
        default=_env(config.ENV_SOCKET, config.DEFAULT_SOCKET),
        metavar="PATH",
        help="node agent socket (default %(default)s)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=config.DEFAULT_WINDOW_S,
        help="kernel compression window of a node agent started for the job (default %(default)s)",
    )
    _add_auth(p, server=False)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the command to run")

    p = sub.add_parser(
        "demo",
        help="the whole system on one machine against a real training job with a fault injected",
    )
    # The job's names (argus.demo_job.SCENARIOS, LAYOUTS) written out: that module imports torch.
    p.add_argument(
        "--scenario",
        choices=["none", "compute", "host_stall", "spiky_stall", "dataloader", "host_work", "slow_link"],
        default="compute",
        help="the fault (default %(default)s; slow_link: with --nodes 3 or more)",
    )
    p.add_argument(
        "--layout",
        choices=["dp", "pp", "tp"],
        default="dp",
        help="data parallel, pipeline x data parallel, tensor x data parallel (default %(default)s)",
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

    p = sub.add_parser("import", help="load PyTorch profiler (Kineto) traces, one file per rank")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help=f"a running argus server (default {config.DEFAULT_SERVER_URL})",
    )
    where.add_argument("--store", default=None, metavar="URL", help="write to a store directly (offline)")
    p.add_argument("--job-id", default=None, help="job id (default: from the traces)")
    p.add_argument(
        "--rank", type=int, default=None, help="rank of a single file without distributedInfo.rank"
    )
    _add_auth(p, server=False)
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files (.json or .json.gz)")

    p = sub.add_parser("analyze", help="the analyzer on its own")
    p.add_argument(
        "--store",
        default=_env(config.ENV_STORE, config.DEFAULT_STORE_URL),
        help="store URL (default %(default)s)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=config.DEFAULT_WINDOW_S,
        help="analysis window, seconds (default %(default)s)",
    )
    _add_min_loss(p)
    p.add_argument("--once", action="store_true", help="analyze what is stored, then exit")
    p.add_argument("--job", default=None, help="only this job")

    p = sub.add_parser("diagnose", help="print a job's diagnoses")
    p.add_argument("--job", "--job-id", dest="job", required=True, help="job id")
    p.add_argument(
        "--server",
        default=_env(config.ENV_SERVER, config.DEFAULT_SERVER_URL),
        metavar="URL",
        help="argus server (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the diagnosis objects as JSON")
    _add_auth(p, server=False)

    p = sub.add_parser("jobs", help="list jobs: status, ranks, open diagnoses, last seen (newest first)")
    p.add_argument(
        "--server",
        default=_env(config.ENV_SERVER, config.DEFAULT_SERVER_URL),
        metavar="URL",
        help="argus server (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the REST API's job objects as JSON")
    _add_auth(p, server=False)
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
        return run(args)
    except ArgusError as exc:
        print(f"argus {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
