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
- A started agent dies with `argus run`, however that ends (SIGKILL, a hang-up, Ctrl-C while
  the agent starts): the kernel sends it SIGTERM when `argus run` exits
  (``PR_SET_PDEATHSIG``), and it stops as it does at the job's end (spooling what it holds).
- COMMAND's exit status is returned. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent
  to `argus run` by a process (``kill``) are passed on to COMMAND once; those the terminal sends
  (Ctrl-C, Ctrl-\\, a hang-up) already reach COMMAND, in the terminal's foreground process group,
  and are not sent a second time. If the agent cannot start, COMMAND still runs.
- Node rank 0 (:func:`argus.agent.follow.node_rank`) prints each diagnosis of the job as it opens
  and resolves, and a verdict when COMMAND exits (:mod:`argus.agent.follow`); ``--quiet`` not.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
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
from argus.agent.follow import Follower, node_rank, server_url
from argus.agent.identity import new_job_id
from argus.config import ENV_AGENT_LOG, ENV_AUTOATTACH, ENV_COMMAND
from argus.errors import ConfigError
from argus.jobid import check_job_id
from argus.window_grid import WindowGrid

__all__ = ["FORWARDED", "agent_listening", "bootstrap_dir", "collector_reachable", "main"]

log = logging.getLogger(__name__)

#: Seconds to wait for a started agent to listen.
AGENT_START_S = 15.0
#: Seconds a started agent may take to drain after the job.
AGENT_DRAIN_S = 10.0
#: The signals `argus run` passes on to COMMAND (when a process, not the terminal, sent them).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: ``si_code`` at or below this: the signal was sent by a process (``kill``, ``sigqueue``, ``tkill``);
#: above it (``SI_KERNEL``): by the kernel, for the terminal (Ctrl-C, Ctrl-\\, a hang-up).
_SI_USER = 0
#: ``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to the caller when its parent exits.
_PR_SET_PDEATHSIG = 1


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
        # Its own session: the terminal's Ctrl-C does not stop it before the job's last rows are in.
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - no thread runs yet in `argus run`
        )
    started = False
    try:
        deadline = time.monotonic() + AGENT_START_S
        while time.monotonic() < deadline and not started:
            started = agent_listening(args.socket)
            if not started and proc.poll() is not None:
                break
            time.sleep(0 if started else 0.05)
    finally:
        if not started and proc.poll() is None:  # it did not start in time, or Ctrl-C meanwhile
            proc.kill()
            proc.wait()
    if started:
        print(f"argus: started a node agent (pid {proc.pid}, log {log_path})", file=sys.stderr)
        return proc
    print(f"argus: the node agent did not start (see {log_path}); running without it", file=sys.stderr)
    return None


def _die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process exits (Linux
    ``PR_SET_PDEATHSIG``), or SIGTERM itself at once when this process has exited already;
    None where ``prctl`` is not found."""
    try:  # the C library this process runs on (no find_library: it runs ldconfig)
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


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
    if not reachable:  # it gives up its drain once its channel to the collector fails
        print(
            "argus: stopping the node agent: it waits for the collector only if it reached it meanwhile "
            f"(up to {AGENT_DRAIN_S:.0f} s); what it cannot send stays in {spool}, and the next `argus run` "
            "or `argus agent` for this collector sends it",
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
    follower = _follower(args, cmd, env)
    try:
        return _run_child(cmd, env, follower)
    finally:
        if agent is not None:
            _stop_agent(agent, reachable=reachable, spool=config.spool_dir_for(args.collector))


def _follower(args: argparse.Namespace, cmd: list[str], env: dict[str, str]) -> Follower | None:
    """The job's diagnoses followed on this terminal (:mod:`argus.agent.follow`): None with
    ``--quiet``, without Argus, or on a node other than node rank 0."""
    if getattr(args, "quiet", False) or config.ENV_JOB_ID not in env or node_rank(cmd, os.environ):
        return None
    server = getattr(args, "server", None) or server_url(args.collector, os.environ)
    return Follower(server, env[config.ENV_JOB_ID], token=args.token, tls_cert=args.tls_cert)


def _run_child(cmd: list[str], env: dict[str, str], follower: Follower | None = None) -> int:
    """Run ``cmd`` passing the :data:`FORWARDED` signals a process sends on to it (module doc);
    ``follower`` prints the job's diagnoses meanwhile and its verdict after. Returns ``cmd``'s exit
    status (127: it cannot run; 128 + N: killed by signal N)."""
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"argus run: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    # Blocked, the signals wait for sigtimedwait, which says who sent each; the follower's thread,
    # started after, has them blocked too.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        if follower is not None:
            follower.start()
        while child.poll() is None:
            info = signal.sigtimedwait(FORWARDED, 0.2)
            if info is not None and info.si_code <= _SI_USER and child.poll() is None:
                child.send_signal(info.si_signo)
        rc = child.returncode
    finally:
        while signal.sigtimedwait(FORWARDED, 0) is not None:  # those that came as it exited: handled
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if follower is not None:
        with contextlib.suppress(Exception):  # the verdict never changes the job's status
            follower.finish()
    return 128 - rc if rc < 0 else rc
