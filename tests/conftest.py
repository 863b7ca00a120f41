"""Fixtures every test folder may use.

``argus_server_factory`` starts real `argus server` processes (chDB allows one
data dir per process, so the server always runs in its own process) on free
loopback ports with a data dir under ``tmp_path``, and stops each at teardown,
also when the test fails::

    def test_x(argus_server_factory):
        server = argus_server_factory("--no-analyzer")
        ...  # server.grpc_target, server.http_url, server.data_dir
        server.restart()  # same data dir, same ports

``argus_server`` is one such server with the analyzer on and a 1 s window.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from argus.diagnosis import host_slowed_the_job
from argus.store import ClickHouseStore

#: A live job whose verdict moves with a shared machine's load, kept running and visible in every
#: report but not asserted: on a 2-core host running 4 CPU ranks the analyzer may also name ranks
#: that are not the fault's (the ranks waiting for a slow one grow their own backward time: gloo's
#: threads spin through DDP's overlapped all-reduces and take the cores backward needs; a rank the
#: scheduler slows for two windows reads as a straggler). Recordings of the same jobs assert their
#: verdicts (tests/analyzer/test_recorded_runs.py).
LOAD_DEPENDENT_VERDICT = pytest.mark.xfail(
    reason="a live job's verdict on a shared CPU host moves with its load; its recordings assert it",
    strict=False,
)

__all__ = ["LOAD_DEPENDENT_VERDICT", "ArgusServer", "assert_blames_no_one"]

# A test run started in the background (`cmd &` from a script: no job control) gets SIGINT ignored,
# and an ignored signal stays ignored across exec, so every process the tests start would ignore
# the Ctrl-C that tests/agent/test_run_signals.py and tests/demo/test_demo_interrupt.py press (both
# failed so in a fresh-clone .ci/run started with `&`). The tests stand in for a terminal, whose
# foreground job has SIGINT's default: give it back to this process, which its children inherit.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def assert_blames_no_one(found: Sequence[Mapping[str, Any]], context: str = "") -> None:
    """Assert that the diagnoses (docs/design.md §7 objects) of a job that ran no fault blame nothing.

    docs/design.md §6.2: no slowdown above the loss threshold stays silent. A shared host now and then
    slows a whole job, every rank alike, for seconds (measured on this 2-core machine: a clean
    job's steps 52 -> 61-68 ms for 12-15 s, no rank behind), and Argus then opens a job-level
    diagnosis naming no rank. So a clean job may open only that: no rank, no ranks, no group,
    and its job really ran slower than its healthy pace by the loss threshold. A diagnosis
    naming a rank, a group or a node fails, and so does a job-level one without that slowdown.

    Raises:
        AssertionError: a diagnosis blames something; the message shows them all (and
            ``context``: logs, say).
    """
    blaming = [d for d in found if not host_slowed_the_job(d)]
    assert not blaming, json.dumps(list(found), indent=1, default=str)[:6000] + (
        "\n" + context if context else ""
    )


_READY = re.compile(r"^argus server: gRPC on (?P<grpc>\S+?)(?: \(TLS\))?, HTTP on (?P<http>\S+), store ")


class ArgusServer:
    """One `argus server` subprocess; see the module docstring.

    Args:
        data_dir: The chDB data dir (``store_url`` is ``chdb://<data_dir>``).
        args: Extra command-line options (``--no-analyzer``, ``--token T``, ...).
        log_dir: Where the process's stdout and stderr go (``server-N.out/.err``).
        env: Extra environment variables.
    """

    def __init__(
        self, data_dir: Path, args: tuple[str, ...], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.args = args
        self.log_dir = log_dir
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_target = ""  # host:port
        self.http_url = ""  # http(s)://host:port
        self.starts = 0
        self._grpc_listen = "127.0.0.1:0"
        self._http_listen = "127.0.0.1:0"

    @property
    def store_url(self) -> str:
        return f"chdb://{self.data_dir}"

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"server-{self.starts}.out"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"server-{self.starts}.err"

    def logs(self) -> str:
        """stdout and stderr of the latest start, for assertion messages."""
        return "".join(
            p.read_text(errors="replace") for p in (self.stdout_path, self.stderr_path) if p.exists()
        )

    def start(self, timeout_s: float = 60.0) -> ArgusServer:
        """Start the process; return once it printed its ready line and /healthz answers.

        The first start picks free ports; later starts reuse them.
        """
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        command = [
            sys.executable,
            "-m",
            "argus.cli",
            "server",
            "--store",
            self.store_url,
            "--grpc-listen",
            self._grpc_listen,
            "--http-listen",
            self._http_listen,
            *self.args,
        ]
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + timeout_s
        while True:
            match = _READY.match(self.stdout_path.read_text(errors="replace"))
            if match:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"argus server exited with {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"argus server not ready after {timeout_s} s:\n{self.logs()}")
            time.sleep(0.05)
        self.grpc_target, self.http_url = match["grpc"], match["http"]
        self._grpc_listen = self.grpc_target
        self._http_listen = self.http_url.split("://", 1)[1]
        self._wait_healthy(deadline)
        return self

    def _wait_healthy(self, deadline: float) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        while True:
            try:
                with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=2, context=context) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.http_url}/healthz never answered 200:\n{self.logs()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGTERM) and wait; kill after ``timeout_s``. Returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the process (a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout_s: float = 60.0) -> ArgusServer:
        """Stop cleanly and start again on the same data dir and ports."""
        status = self.stop()
        assert status == 0, f"argus server exited with {status}:\n{self.logs()}"
        return self.start(timeout_s)


@pytest.fixture(autouse=True)
def _embedded_stores_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves an embedded (chDB) store open, and close the store.

    chDB runs one engine per process, on one data dir: a store a test leaves open (a failure
    before its ``close``) fails every later test that opens another data dir with "EmbeddedServer
    already initialized" (70 tests of one fresh-clone ``.ci/run``). Stores of module- and
    session-scoped fixtures are opened before this fixture starts and are not its concern.
    """
    opened: list[weakref.ref[Any]] = []
    connect = ClickHouseStore._connect

    def tracked(store: ClickHouseStore) -> Any:
        client = connect(store)
        if store.embedded:
            opened.append(weakref.ref(client))
        return client

    monkeypatch.setattr(ClickHouseStore, "_connect", tracked)
    yield
    left = [c for ref in opened if (c := ref()) is not None and not getattr(c._backend, "_closed", True)]
    for client in left:
        client.close()
    assert not left, f"the test left {len(left)} embedded store client(s) open: close every store it opens"


@pytest.fixture
def argus_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ArgusServer]]:
    """``(*args, data_dir=None, env=None, start=True) -> ArgusServer``; every one is stopped at teardown."""
    servers: list[ArgusServer] = []

    def make(
        *args: str, data_dir: Path | None = None, env: dict[str, str] | None = None, start: bool = True
    ) -> ArgusServer:
        root = tmp_path_factory.mktemp("argus-server")
        server = ArgusServer(data_dir or root / "data", args, root, env)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.stop(timeout_s=15)


@pytest.fixture
def argus_server(argus_server_factory: Callable[..., ArgusServer]) -> ArgusServer:
    """A running `argus server` with the analyzer on a 1 s window, on a fresh data dir."""
    return argus_server_factory("--window-s", "1")
