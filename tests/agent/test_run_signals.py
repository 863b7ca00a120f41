"""Issue 39 item 14: signals and a real `argus run`.

- Ctrl-C at a terminal (a real pseudo-terminal: the line discipline sends SIGINT to the
  foreground process group) reaches COMMAND once, not twice;
- SIGHUP, SIGUSR1 and SIGUSR2 sent to `argus run` with ``kill`` are passed on to COMMAND;
- the node agent `argus run` started dies with it, on SIGKILL of `argus run` and on a SIGINT
  while the agent is starting;
- a node agent stops and exits on a flood of SIGTERM (its handler once deadlocked on a lock the
  main thread held: the way `argus run`'s death, one SIGTERM per thread it had, left it running).
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.jobs import job_env, short_dir

pytestmark = pytest.mark.timeout(120)

#: COMMAND: writes each signal it gets to its file; exits 0 a second after SIGINT, SIGTERM or
#: SIGHUP (so a second delivery would be seen), or after 60 s.
CHILD = """
import signal, sys, time
out = open(sys.argv[1], "a", buffering=1)
done = []
def got(signum, _frame):
    out.write(signal.Signals(signum).name + "\\n")
    if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) and not done:
        done.append(time.monotonic())
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, got)
out.write("ready\\n")
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (done and time.monotonic() - done[0] > 1.0):
    time.sleep(0.02)
"""


def _argus_run(work: Path, *options: str) -> list[str]:
    child = work / "child.py"
    child.write_text(CHILD)
    return [sys.executable, "-m", "argus.cli", "run", "--quiet", *options, "--", sys.executable, str(child),
            str(work / "signals")]  # fmt: skip


def _signals(work: Path, timeout_s: float = 30.0, until: str = "ready") -> list[str]:
    deadline = time.monotonic() + timeout_s
    path = work / "signals"
    while time.monotonic() < deadline:
        lines = path.read_text().split() if path.exists() else []
        if until in lines:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"COMMAND did not write {until!r}: {path.read_text() if path.exists() else ''}")


def test_ctrl_c_at_the_terminal_reaches_the_command_once() -> None:
    with short_dir() as work:
        env = job_env(work, ARGUS_DISABLE="1")
        cmd = _argus_run(work)
        pid, master = pty.fork()
        if pid == 0:  # the child: session leader of the pseudo-terminal, in its foreground group
            os.execve(sys.executable, cmd, env)
        try:
            _signals(work)
            os.write(master, b"\x03")  # Ctrl-C, as typed
            deadline = time.monotonic() + 30
            status = None
            while status is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    os.read(master, 65536)  # keep the terminal's buffer drained
                done, st = os.waitpid(pid, os.WNOHANG)
                status = st if done else None
                time.sleep(0.05)
            assert status is not None, "argus run did not end after Ctrl-C"
        finally:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(master)
        assert _signals(work)[1:] == ["SIGINT"], _signals(work)
        assert os.waitstatus_to_exitcode(status) == 0  # COMMAND's status: it handled the one SIGINT


def test_signals_sent_to_argus_run_are_passed_on_to_the_command() -> None:
    with short_dir() as work:
        proc = subprocess.Popen(
            _argus_run(work), env=job_env(work, ARGUS_DISABLE="1"), stderr=subprocess.PIPE, text=True
        )
        try:
            _signals(work)
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                proc.send_signal(sig)
                _signals(work, until=sig.name)
            proc.send_signal(signal.SIGHUP)
            assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert _signals(work)[1:] == ["SIGUSR1", "SIGUSR2", "SIGHUP"]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` that run `argus agent`."""
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    found = []
    for kid in kids:
        try:
            if b"\0agent\0" in Path(f"/proc/{kid}/cmdline").read_bytes():
                found.append(kid)
        except OSError:
            continue
    return found


def _log(work: Path) -> str:
    path = work / "agent.log"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no agent log)"


def test_the_agent_argus_run_started_dies_when_argus_run_is_killed() -> None:
    with short_dir() as work:
        # A collector that refuses connections: the agent starts, spools, and keeps running.
        proc = subprocess.Popen(
            _argus_run(work, "--collector", "127.0.0.1:1", "--socket", str(work / "agent.sock")),
            env=job_env(work),
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        agent = 0
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                m = re.search(r"started a node agent \(pid (\d+)", line)
                if m:
                    agent = int(m.group(1))
                    break
            assert agent, "no agent started"
            _signals(work)
            proc.kill()  # SIGKILL: argus run runs no code of its own on the way out
            proc.wait()
            assert _wait_gone(agent, 30), "the agent outlived argus run:\n" + _log(work)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the COMMAND
            if agent and _alive(agent):
                os.kill(agent, signal.SIGKILL)


def test_ctrl_c_while_the_agent_starts_stops_the_agent() -> None:
    with short_dir() as work:
        proc = subprocess.Popen(
            _argus_run(work, "--collector", "127.0.0.1:1", "--socket", str(work / "agent.sock")),
            env=job_env(work),
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        agent = 0
        try:
            deadline = time.monotonic() + 30
            while not agent and time.monotonic() < deadline:
                kids = _children(proc.pid)
                agent = kids[0] if kids else 0
                time.sleep(0.005)
            assert agent, "argus run started no agent"
            assert not (work / "agent.sock").exists()  # still starting (Python imports take a second)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130
            assert _wait_gone(agent, 10), "the agent outlived an interrupted argus run"
            assert not (work / "signals").exists()  # COMMAND never started
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if agent and _alive(agent):
                os.kill(agent, signal.SIGKILL)


def test_a_flood_of_sigterm_stops_the_agent_as_at_a_job_s_end() -> None:
    """SIGTERM sent again and again while the agent stops: each delivery runs its handler, at any
    point of the main thread. The agent drains, writes its last stats line and exits (0, or by one
    of the SIGTERMs that came after the interpreter gave the signal its default back on the way out)."""
    with short_dir() as work:
        sock = work / "agent.sock"
        with (work / "agent.log").open("wb") as out:
            agent = [
                sys.executable,
                "-m",
                "argus.cli",
                "agent",
                "--socket",
                str(sock),
                "--collector",
                "127.0.0.1:1",
            ]
            proc = subprocess.Popen(
                agent, env=job_env(work, ARGUS_AGENT_DRAIN_S="1"), stdout=out, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + 60
            while not sock.exists():
                assert proc.poll() is None and time.monotonic() < deadline, _log(work)
                time.sleep(0.05)
            flood_end = time.monotonic() + 3
            while proc.poll() is None and time.monotonic() < flood_end:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM), _log(work)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "argus agent: batches stored 0" in _log(work), _log(work)
