"""One window across processes: a node agent, the REST upload path and the analyzer, all run with
``--window-s 4.1``, cut the same kernels into the same windows; a process with another
``--window-s`` is reported, never read into a window it does not summarise (argus.window_grid).

Real parts: `argus server` and `argus agent` subprocesses over gRPC on a chDB store, a probe's
frames over the agent's unix socket, `argus import` uploading a Kineto trace to the server, and
`argus analyze --once` over the stopped server's store.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from argus.agent.sink import AgentLink
from argus.schema import wire_table
from argus.store import open_store
from tests.agent.jobs import job_env, short_dir
from tests.collector.importer.traces import kernel, write_trace
from tests.conftest import ArgusServer

pytestmark = pytest.mark.slow

WINDOW_S = "4.1"
WINDOW_NS = 4_100_000_000
WINDOWS = 3
PER_WINDOW = 40
AGENT_JOB, UPLOAD_JOB = "window-agent", "window-upload"


def _kernel_times_ns() -> list[int]:
    """Kernel starts in the middle of three 4.1 s windows a minute back (windows closed at once);
    in the middle, so the agent's clock offset (µs on one host) moves none across a boundary."""
    first = (time.time_ns() - 60 * 10**9) // WINDOW_NS * WINDOW_NS
    return [
        first + w * WINDOW_NS + WINDOW_NS // 2 + i * 1_000 for w in range(WINDOWS) for i in range(PER_WINDOW)
    ]


def _through_the_agent(work: Path, server: ArgusServer, times_ns: list[int]) -> None:
    """Send the kernels as a probe would, to a real `argus agent --window-s 4.1`."""
    sock = work / "a.sock"
    cmd = [
        sys.executable,
        "-m",
        "argus.cli",
        "agent",
        "--socket",
        str(sock),
        "--collector",
        server.grpc_target,
    ]
    cmd += ["--window-s", WINDOW_S, "--spool", str(work / "spool")]
    with (work / "agent.log").open("wb") as log:
        agent = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=job_env(work))
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, (work / "agent.log").read_text()
            time.sleep(0.1)
        hello = {
            "version": 1, "job_id": AGENT_JOB, "rank": 0, "local_rank": 0, "world_size": 1, "host": "h",
            "pid": 1, "device": "cuda:0", "command": "train.py", "attach_ns": times_ns[0],
        }  # fmt: skip
        link = AgentLink(str(sock), hello)
        n = len(times_ns)
        events = {
            "rank": [0] * n, "kind": ["kernel"] * n, "kernel": ["gemm"] * n, "stream": [7] * n,
            "device": [0] * n, "correlation": list(range(n)), "start_ns": times_ns, "dur_ns": [50_000] * n,
        }  # fmt: skip
        link.enqueue("kernel_events", wire_table("kernel_events", events))
        assert link.flush(20)
        link.close(0, 5)
    finally:
        agent.terminate()  # drains its summaries to the collector before it exits
        assert agent.wait(60) == 0, (work / "agent.log").read_text()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "argus.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _rows(store_url: str, sql: str) -> pa.Table:
    store = open_store(store_url, create=False)
    try:
        return store.query(sql)
    finally:
        store.close()


def test_agent_upload_and_analyzer_agree_on_a_non_integer_window(
    argus_server_factory: Callable[..., ArgusServer],
) -> None:
    server = argus_server_factory("--window-s", WINDOW_S, "--no-analyzer")
    times_ns = _kernel_times_ns()
    with short_dir() as work:
        _through_the_agent(work, server, times_ns)
        trace = write_trace(work / "r0.json", [kernel(t / 1000, 50) for t in times_ns], world_size=1)
        _cli("import", "--server", server.http_url, "--job-id", UPLOAD_JOB, str(trace))
    assert server.stop() == 0, server.logs()
    analysed = _cli("analyze", "--store", server.store_url, "--window-s", WINDOW_S, "--once")

    got = _rows(
        server.store_url,
        "SELECT job_id, window_start_ns, window_ns, sum(count) AS n FROM kernel_summaries GROUP BY ALL",
    ).to_pylist()
    starts = {
        job: sorted(r["window_start_ns"] for r in got if r["job_id"] == job)
        for job in (AGENT_JOB, UPLOAD_JOB)
    }
    expected = sorted({t // WINDOW_NS * WINDOW_NS for t in times_ns})
    assert {r["window_ns"] for r in got} == {WINDOW_NS}
    assert starts[AGENT_JOB] == starts[UPLOAD_JOB] == expected, (
        got
    )  # the agent's windows were 4,099,999,999 ns
    assert {r["n"] for r in got} == {PER_WINDOW}

    # The analyzer's windows are those the kernels were summarised in: each summary read into its own.
    windows = _rows(
        server.store_url,
        f"SELECT window_start_ns, window_ns FROM analysis_windows FINAL WHERE job_id = '{AGENT_JOB}'",
    ).to_pylist()
    assert {w["window_ns"] for w in windows} == {WINDOW_NS}, windows
    assert set(expected) <= {w["window_start_ns"] for w in windows}, (windows, expected)
    assert "another window" not in analysed.stderr, analysed.stderr

    # The same store analysed with another --window-s: the summaries are reported, not misread.
    other = _cli("analyze", "--store", server.store_url, "--window-s", "4", "--once")
    assert "summarised in another window than the analyzer's 4 s" in other.stderr, other.stderr
