"""Issue 12 against a live `argus server`: a job with a backlog of years next to a live job with a slow rank.

The backlog is a trace import (``argus import --server``) of two ranks whose events lie twenty
years apart: analysed window by window it would be 315 million empty windows. The live job
streams over gRPC meanwhile (:class:`synthetic.wire.LiveFeed`, rank 2 slow). The server must
name the slow rank within two windows of the window that completes its evidence, keep
answering, and hold its memory.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from synthetic.wire import LiveFeed
from tests.collector.importer.traces import T0_US, simple_events, write_trace
from tests.conftest import ArgusServer

pytestmark = pytest.mark.slow

WINDOW_S = 4.0
TWENTY_YEARS_US = 20 * 365 * 86_400 * 10**6
#: The server's whole process RSS may not pass this while it works (it starts near 400 MB).
RSS_BOUND_MB = 1_500


def _import_backlog(server: ArgusServer, tmp_path: Path) -> str:
    old = write_trace(tmp_path / "r0.json", simple_events(start_us=T0_US - TWENTY_YEARS_US, steps=3), rank=0)
    new = write_trace(tmp_path / "r1.json", simple_events(start_us=T0_US, steps=3), rank=1)
    command = [sys.executable, "-m", "argus.cli", "import", "--server", server.http_url]
    done = subprocess.run(
        [*command, "--job-id", "backlog", str(old), str(new)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr + server.logs()
    return "backlog"


def _diagnoses(server: ArgusServer, job_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{server.http_url}/api/v1/jobs/{job_id}/diagnoses", timeout=10)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def test_a_backlog_of_years_delays_no_live_diagnosis(argus_server_factory: Any, tmp_path: Path) -> None:
    server: ArgusServer = argus_server_factory("--window-s", str(WINDOW_S))
    assert server.proc is not None
    process = psutil.Process(server.proc.pid)
    backlog = _import_backlog(server, tmp_path)
    feed = LiveFeed(server.grpc_target, "live", world_size=4, slow_rank=2)
    peak_mb = 0.0
    try:
        feed.send_elapsed()  # 10 s of history, then the job goes on in real time
        feed.start()
        deadline = time.monotonic() + 120
        while True:
            peak_mb = max(peak_mb, process.memory_info().rss / 2**20)
            found = [d for d in _diagnoses(server, "live") if d["rank"] == 2]
            if found:
                seen_ns = time.time_ns()
                break
            assert not feed.errors, feed.errors
            assert time.monotonic() < deadline, f"no diagnosis after 120 s:\n{server.logs()[-3000:]}"
            time.sleep(0.25)
        (first,) = found
        evidence_complete_ns = first["last_window_ns"] + int(WINDOW_S * 1e9)
        late_windows = (seen_ns - evidence_complete_ns) / (WINDOW_S * 1e9)
        assert late_windows <= 2, f"named {late_windows:.1f} windows after its evidence was complete"
        assert (first["cause"], first["state"]) == ("compute", "open")
        # The server still answers everyone: the backlog job's own reads, and its health.
        assert httpx.get(f"{server.http_url}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{server.http_url}/api/v1/jobs/{backlog}/ranks", timeout=10).status_code == 200
        assert _diagnoses(server, backlog) == []
    finally:
        feed.stop()
    assert not feed.errors, feed.errors
    assert peak_mb < RSS_BOUND_MB, f"server RSS {peak_mb:.0f} MB"
