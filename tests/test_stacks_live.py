"""L5 on a real job (issue 15, must show 1): the stacks of the flagged rank name where it stalls.

A real `argus server` (chDB, the analyzer on 2 s windows), a real 4-rank gloo DDP job under
`argus run` whose rank 3 sleeps after every step in ``very_distinctive_checkpoint_stall``
(tests/agent/stall_job.py) after 4 s of healthy training. Once the analyzer opens a diagnosis of
rank 3 it asks for stacks; the server's collector passes the request to the node agent `argus
run` started, which samples rank 3 and a healthy peer with py-spy; the next version of the
diagnosis carries the top frames, and the REST endpoint serves the stacks. With py-spy off
(``ARGUS_PYSPY=off``, as where it cannot attach) the agent asks the ranks' probes instead, which
sample their own threads (must show 2). A rank hung inside a function (its peers waiting in the
next all-reduce) is diagnosed ``unresponsive`` and py-spy's blocking dump of its threads names
the function (must show 2, second half).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.jobs import argus_run, job_env, short_dir
from tests.conftest import ArgusServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STALL = "very_distinctive_checkpoint_stall"
JOB = "stacks-live"


def _with_frames(http: httpx.Client, cause: str | None = None) -> dict[str, Any] | None:
    got = http.get(f"/api/v1/jobs/{JOB}/diagnoses", params={"state": "all"})
    if got.status_code == 404:
        return None  # no row of the job stored yet
    items = got.json()["items"]
    return next((d for d in items if d["evidence"].get("top_frames") and cause in (None, d["cause"])), None)


def _run_until_frames(
    server: ArgusServer,
    http: httpx.Client,
    work: Path,
    stall: list[str],
    env: dict[str, str],
    cause: str | None,
) -> dict[str, Any]:
    """Run stall_job.py (4 ranks, ``stall`` arguments) under `argus run` until a diagnosis of
    ``cause`` (any, if None) carries top frames; stop the job cleanly and return that diagnosis."""
    stop = work / "stop"
    job = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "tests/agent/stall_job.py", "--stall-rank=3", *stall, f"--stop-file={stop}", "--max-s=150",
    ]  # fmt: skip
    log_path = work / "job.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argus_run(work, server.grpc_target, JOB, job, window_s=2.0),
            env=job_env(work, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # on failure the whole job (torchrun, ranks, agent) is killed
        )
        try:
            deadline = time.monotonic() + 150
            found = None
            while found is None:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, (
                    http.get(f"/api/v1/jobs/{JOB}/diagnoses").text + server.logs()[-3000:]
                )
                time.sleep(1.0)
                found = _with_frames(http, cause)
            stop.touch()
            assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
            return found
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.parametrize("sampler", ["py-spy", "in-process"])
def test_the_stalling_rank_s_top_frames_name_the_function(
    argus_server_factory: Callable[..., ArgusServer], sampler: str
) -> None:
    server = argus_server_factory("--window-s", "2")
    with short_dir() as work, httpx.Client(base_url=server.http_url, timeout=10) as http:
        stall = ["--stall-s=0.1", "--stall-after-s=4"]
        env = {"ARGUS_PYSPY": "off"} if sampler == "in-process" else {}
        found = _run_until_frames(server, http, work, stall, env, None)
        about = found["evidence"]["stacks"]
        assert found["rank"] == 3 and about["rank"] == 3 and about["sampler"] == sampler
        top = found["evidence"]["top_frames"]
        assert top[0]["function"] == STALL, top
        assert top[0]["file"].endswith("stall_job.py") and top[0]["share"] > 0.2 and top[0]["peer_share"] == 0
        peer = about["peer"]
        assert peer in (0, 1, 2)
        # The REST endpoint serves the same capture: the function in rank 3's stacks, not the peer's.
        rows = http.get(f"/api/v1/jobs/{JOB}/stacks", params={"rank": 3, "limit": 1000}).json()["items"]
        assert any(STALL in r["frames"] and r["capture_id"] == about["capture_id"] for r in rows)
        peer_rows = http.get(f"/api/v1/jobs/{JOB}/stacks", params={"rank": peer, "limit": 1000}).json()[
            "items"
        ]
        assert peer_rows and not any(STALL in r["frames"] for r in peer_rows)
        folded = http.get(f"/api/v1/jobs/{JOB}/stacks", params={"rank": 3, "format": "collapsed"}).text
        assert STALL in folded
        diagnose = subprocess.run(
            [sys.executable, "-m", "argus.cli", "diagnose", "--job", JOB, "--server", server.http_url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        print(diagnose.stdout)
        assert diagnose.returncode == 0 and "stall_job.py:" in diagnose.stdout.partition(f"{STALL} (")[2], (
            diagnose.stdout
        )


def _line_of(marker: str) -> int:
    text = Path("tests/agent/stall_job.py").read_text().splitlines()
    return next(i for i, line in enumerate(text, 1) if marker in line and "time.sleep" in line)


@pytest.mark.parametrize("layout", ["sleep-in-main", "function-beside-a-watcher"])
def test_the_stalling_line_leads_in_the_evidence_the_terminal_and_the_page(
    argus_server_factory: Callable[..., ArgusServer], layout: str, tmp_path: Path
) -> None:
    """Issue 42, must show 1: a flagged rank stalled at one line of a function every rank runs
    (``time.sleep`` in ``main``), and one stalled in a named function while a thread only it has
    waits (Lightning's launcher watcher), each get that line first in ``evidence.top_frames``,
    in `argus diagnose` and on the page (headless Chromium)."""
    from tests.collector.api.prom import CHROMIUM, chromium

    if layout == "sleep-in-main":
        stall, function, line = ["--stall-in=main"], "main", _line_of("STALL-IN-MAIN")
    else:
        stall, function, line = ["--watcher"], STALL, _line_of("time.sleep(seconds)")
    server = argus_server_factory("--window-s", "2")
    with short_dir() as work, httpx.Client(base_url=server.http_url, timeout=10) as http:
        found = _run_until_frames(
            server, http, work, [*stall, "--stall-s=0.1", "--stall-after-s=4"], {}, None
        )
        top = found["evidence"]["top_frames"]
        assert (top[0]["function"], top[0]["line"]) == (function, line), top
        assert found["rank"] == 3 and found["evidence"]["stacks"]["thread"] == "MainThread", found["evidence"]
        assert top[0]["file"].endswith("stall_job.py") and top[0]["peer_share"] == 0, top
        assert all("watcher" not in f["function"] for f in top), top
        diagnose = subprocess.run(
            [sys.executable, "-m", "argus.cli", "diagnose", "--job", JOB, "--server", server.http_url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        print(diagnose.stdout)
        shown = diagnose.stdout.partition("top frames of rank 3")[2].splitlines()
        assert (
            diagnose.returncode == 0 and f"{function} (" in shown[1] and f"stall_job.py:{line})" in shown[1]
        ), diagnose.stdout
        if not Path(CHROMIUM).exists():
            pytest.skip("chromium not installed (Debian package chromium; .ci/run installs it)")
        dom = chromium(tmp_path / "profile", f"{server.http_url}/#job={JOB}", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        first = re.search(r'<ol class="top-frames"><li>(.*?)</li>', dom.stdout, re.S)
        assert first is not None, dom.stdout[-4000:]
        assert f"<code>{function}</code> (" in first.group(1) and f"stall_job.py:{line})" in first.group(1)


HANG = "very_distinctive_hang"


def test_a_hung_rank_s_blocking_dump_names_the_function(
    argus_server_factory: Callable[..., ArgusServer],
) -> None:
    server = argus_server_factory("--window-s", "2")
    with short_dir() as work, httpx.Client(base_url=server.http_url, timeout=10) as http:
        found = _run_until_frames(server, http, work, ["--hang", "--stall-after-s=6"], {}, "unresponsive")
        assert found["rank"] == 3 and found["evidence"]["hung"] is True, json.dumps(found, indent=1)
        about = found["evidence"]["stacks"]
        assert about["rank"] == 3 and about["sampler"] == "py-spy-native", about  # the blocking dump
        top = found["evidence"]["top_frames"]
        assert top[0]["function"] == HANG and top[0]["file"].endswith("stall_job.py"), top
