"""`argus run [--collector H:P] [--job-id ID] -- COMMAND...`: run a job with the probe in every rank.

- The job id is ``--job-id``, else ``$TORCHELASTIC_RUN_ID``, else a new one; it
  reaches every rank as ``$ARGUS_JOB_ID`` (a multi-node job needs the same id
  on every node: pass ``--job-id`` or use torchrun's ``--rdzv-id``).
- :mod:`argus.agent._bootstrap` goes first on ``PYTHONPATH``, so each Python
  process of COMMAND (torchrun's children included) attaches the probe when it
  initialises ``torch.distributed`` (see :mod:`argus.agent.autoattach`).
- When no node agent listens on the socket, one is started for the duration
  of the job (its log goes to ``$ARGUS_AGENT_LOG``, default next to the spool)
  and stopped after COMMAND exits, once it has drained to the collector (or
  kept what it could not send in its spool). It gets the token through
  ``$ARGUS_TOKEN``, never on its command line.
- A started agent whose collector does not accept a TCP connection is said on
  stderr at once (the batches go to its spool), and so is its drain at exit.
- COMMAND's exit status is returned; SIGINT and SIGTERM are passed on to it.
  If the agent cannot start, COMMAND still runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from argus import config
from argus.agent import _bootstrap
from argus.agent.identity import new_job_id
from argus.config import ENV_AGENT_LOG, ENV_AUTOATTACH, ENV_COMMAND
from argus.errors import ConfigError
from argus.jobid import check_job_id
from argus.window_grid import WindowGrid

__all__ = ["agent_listening", "bootstrap_dir", "collector_reachable", "main"]

log = logging.getLogger(__name__)

#: Seconds to wait for a started agent to listen.
AGENT_START_S = 15.0
#: Seconds a started agent may take to drain after the job.
AGENT_DRAIN_S = 10.0


def bootstrap_dir() -> str:
    """The folder holding the automatic-attach ``sitecustomize``."""
    return str(Path(_bootstrap.__file__).resolve().parent)


def agent_listening(path: str) -> bool:
    """True when something accepts connections on unix socket ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
    except OSError:
        return False
    finally:
        sock.close()
    return True


def _job_id(args: argparse.Namespace) -> str:
    if args.job_id:
        return str(args.job_id)
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic.lower() != "none":
        return elastic
    return new_job_id()


def _start_agent(args: argparse.Namespace, window: WindowGrid) -> subprocess.Popen[bytes] | None:
    cmd = [
        sys.executable,
        "-m",
        "argus.cli",
        "agent",
        "--socket",
        args.socket,
        "--collector",
        args.collector,
        "--window-s",
        window.flag_value(),
    ]
    if args.tls_cert:
        cmd += ["--tls-cert", args.tls_cert]
    log_path = Path(os.environ.get(ENV_AGENT_LOG) or config.default_spool_dir().parent / "agent.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != ENV_AUTOATTACH}
    if args.token:
        env[config.ENV_TOKEN] = args.token  # never on a command line: every user can read those
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + AGENT_START_S
    while time.monotonic() < deadline:
        if agent_listening(args.socket):
            print(f"argus: started a node agent (pid {proc.pid}, log {log_path})", file=sys.stderr)
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    print(f"argus: the node agent did not start (see {log_path}); running without it", file=sys.stderr)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return None


def collector_reachable(target: str, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to the collector ``target`` (``HOST:PORT``) opens within ``timeout_s``."""
    try:
        host, port = config.parse_listen(target, "--collector")
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except (OSError, ConfigError):
        return False


def _stop_agent(proc: subprocess.Popen[bytes], *, reachable: bool, spool: Path) -> None:
    if proc.poll() is not None:
        return
    if not reachable:
        print(
            f"argus: stopping the node agent: up to {AGENT_DRAIN_S:.0f} s more for it to reach the "
            f"collector; what it cannot send stays in {spool}, and the next `argus run` or `argus agent` "
            "for this collector sends it",
            file=sys.stderr,
        )
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=AGENT_DRAIN_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _attach_env(args: argparse.Namespace, cmd: list[str], pythonpath: str) -> dict[str, str]:
    """The environment variables that make every Python process of ``cmd`` attach the probe."""
    return {
        config.ENV_JOB_ID: _job_id(args),
        config.ENV_SOCKET: args.socket,
        ENV_COMMAND: shlex.join(cmd),
        ENV_AUTOATTACH: "1",
        "PYTHONPATH": os.pathsep.join(p for p in (bootstrap_dir(), pythonpath) if p),
    }


def main(args: argparse.Namespace) -> int:
    """Run COMMAND with automatic attach; returns its exit status."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("argus run: no command given (argus run [options] -- COMMAND...)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    agent: subprocess.Popen[bytes] | None = None
    reachable = True
    if not config.env_flag(config.ENV_DISABLE):
        attach = _attach_env(args, cmd, env.get("PYTHONPATH", ""))
        try:
            check_job_id(attach[config.ENV_JOB_ID])
        except ValueError as exc:
            print(f"argus run: --job-id (or $TORCHELASTIC_RUN_ID): {exc}", file=sys.stderr)
            return 2
        env.update(attach)
        if not agent_listening(args.socket):
            agent = _start_agent(args, WindowGrid.from_seconds(args.window_s))
            reachable = collector_reachable(args.collector)
            if agent is not None and not reachable:
                print(
                    f"argus: collector {args.collector} unreachable: spooling to "
                    f"{config.spool_dir_for(args.collector)}; run `argus server` or pass --collector",
                    file=sys.stderr,
                )
        print(f"argus: job {env[config.ENV_JOB_ID]}", file=sys.stderr)
    try:
        return _run_child(cmd, env)
    finally:
        if agent is not None:
            _stop_agent(agent, reachable=reachable, spool=config.spool_dir_for(args.collector))


def _run_child(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` passing SIGINT and SIGTERM on to it; its exit status (127: it cannot run)."""
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"argus run: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - rc if rc < 0 else rc
