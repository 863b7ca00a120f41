"""Issue 42 items 2, 3 and 6: what a real `argus run` of a real faulty job shows, and /metrics after it.

A real `argus server` (chDB, 2 s windows) and a real 4-rank gloo DDP job under `argus run` whose
rank 3 stalls 0.1 s after every step from 4 s to 16 s of training (tests/agent/stall_job.py), then
trains healthily. The terminal of `argus run` (its stderr) shows the diagnosis of rank 3 open,
then resolve, then a verdict naming it; while the job runs, `/metrics` has its one step-time series
and rank 3's score; a scrape once the job has ended has no series of the job at all (the alert on
``argus_straggler_score`` cannot fire for an ended job).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest

from tests.agent.jobs import job_env, short_dir
from tests.conftest import ArgusServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = "terminal-live"


def _series(http: httpx.Client, job_id: str) -> list[str]:
    """The lines of /metrics with a ``job_id="job_id"`` label."""
    text = http.get("/metrics").text
    return [line for line in text.splitlines() if f'job_id="{job_id}"' in line and not line.startswith("#")]


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_the_terminal_shows_the_fault_open_and_resolve_and_metrics_end_with_the_job(
    argus_server_factory: Callable[..., ArgusServer],
) -> None:
    server = argus_server_factory("--window-s", "2")
    with short_dir() as work, httpx.Client(base_url=server.http_url, timeout=10) as http:
        stop = work / "stop"
        job = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            "tests/agent/stall_job.py", "--stall-rank=3", "--stall-s=0.1", "--stall-after-s=4",
            "--stall-for-s=12", f"--stop-file={stop}", "--max-s=200",
        ]  # fmt: skip
        cmd = [
            sys.executable, "-m", "argus.cli", "run", "--collector", server.grpc_target,
            "--server", server.http_url, "--socket", str(work / "agent.sock"), "--window-s", "2",
            "--job-id", JOB, "--", *job,
        ]  # fmt: skip
        terminal = work / "terminal.txt"
        running: list[str] = []
        with terminal.open("wb") as err:
            proc = subprocess.Popen(
                cmd, env=job_env(work), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
            try:

                def resolved() -> bool:
                    assert proc.poll() is None, terminal.read_text()[-3000:]
                    running[:] = running or [s for s in _series(http, JOB) if "straggler_score" in s]
                    return "diagnosis resolved" in terminal.read_text()

                _wait_for(
                    resolved,
                    200,
                    f"no resolve line:\n{terminal.read_text()[-3000:]}\n{server.logs()[-2000:]}",
                )
                while_running = _series(http, JOB)
                stop.touch()
                assert proc.wait(timeout=60) == 0, terminal.read_text()[-3000:]
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        said = terminal.read_text()
        print(said)
        opened = re.search(
            r"^argus: diagnosis opened: rank 3 (\w+).*slows the job about \d+ %.*$", said, re.M
        )
        assert opened is not None, said
        assert re.search(rf"^argus: diagnosis resolved: rank 3 {opened.group(1)} after \d+ s", said, re.M), (
            said
        )
        verdict = said.strip().splitlines()[-1]
        assert verdict.startswith(f"argus: job {JOB}: ") and "rank 3" in verdict, said
        assert f"argus diagnose --job {JOB}" in verdict and f"#job={JOB}" in verdict
        assert "\x1b" not in said
        # While it ran: one step-time series for the whole job, and rank 3 flagged.
        assert [s for s in while_running if s.startswith("argus_step_time_seconds")], while_running
        assert len([s for s in while_running if s.startswith("argus_step_time_seconds")]) == 1
        assert any('rank="3"' in s for s in running), running
        # Once the job has ended and its last windows are analysed, none of its series is left.
        _wait_for(lambda: not _series(http, JOB), 60, f"series left after the job: {_series(http, JOB)}")
        assert http.get(f"/api/v1/jobs/{JOB}").json()["status"] == "finished"


def test_argus_run_quiet_prints_nothing_of_the_diagnoses(
    argus_server_factory: Callable[..., ArgusServer],
) -> None:
    server = argus_server_factory("--window-s", "2")
    with short_dir() as work:
        cmd = [
            sys.executable, "-m", "argus.cli", "run", "--quiet", "--collector", server.grpc_target,
            "--server", server.http_url, "--socket", str(work / "agent.sock"), "--job-id", "quiet-1",
            "--", sys.executable, "-c", "pass",
        ]  # fmt: skip
        done = subprocess.run(
            cmd, env=job_env(work), capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "diagnos" not in done.stderr and "verdict" not in done.stderr, done.stderr
        loud_cmd = [c for c in cmd if c != "--quiet"]
        loud = subprocess.run(
            loud_cmd, env=job_env(work), capture_output=True, text=True, timeout=120, check=False
        )
        # A job of no rank (no torch.distributed): the server has no record of it, and says so.
        assert loud.returncode == 0 and "no verdict for job quiet-1: the argus server" in loud.stderr, (
            loud.stderr
        )
        assert "has no record of it" in loud.stderr
