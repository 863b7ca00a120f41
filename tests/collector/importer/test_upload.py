"""`argus import --server`: traces uploaded to a running `argus server` (POST /api/v1/jobs/{id}/traces)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from argus.collector.importer import default_job_id
from argus.collector.importer.kineto import file_digest

from .traces import T0_US, simple_events, write_trace

pytestmark = pytest.mark.slow


def _argus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", "import", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def test_upload_to_a_running_server(argus_server_factory: Callable[..., Any], tmp_path: Path) -> None:
    server = argus_server_factory("--no-analyzer")
    a = write_trace(tmp_path / "a.json.gz", simple_events(), rank=0, world_size=2)
    b = write_trace(tmp_path / "b.json", simple_events(start_us=T0_US + 5), rank=1, world_size=2)
    done = _argus("--server", server.http_url, str(a), str(b))
    assert done.returncode == 0, done.stderr + server.logs()
    job = default_job_id([file_digest(a), file_digest(b)])
    assert f"imported job {job} ranks [0, 1]" in done.stdout and "kernel_events=80" in done.stdout
    ranks = _get(f"{server.http_url}/api/v1/jobs/{job}/ranks")["items"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    jobs = {j["job_id"]: j for j in _get(f"{server.http_url}/api/v1/jobs")["items"]}
    assert jobs[job]["status"] == "finished"

    again = _argus("--server", server.http_url, "--job-id", job, str(a))
    assert again.returncode == 1 and "already has rank(s) [0]" in again.stderr
    norank = write_trace(tmp_path / "n.json", simple_events(), rank=None, world_size=None)
    refused = _argus("--server", server.http_url, "--job-id", "other", str(norank))
    assert refused.returncode == 1
    assert "distributedInfo.rank" in refused.stderr and "--rank" in refused.stderr
    accepted = _argus("--server", server.http_url, "--job-id", "other", "--rank", "4", str(norank))
    assert accepted.returncode == 0, accepted.stderr
    assert "imported job other ranks [4]" in accepted.stdout


def test_server_that_is_not_there(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", simple_events())
    done = _argus("--server", "http://127.0.0.1:9", str(a))
    assert done.returncode == 1 and "cannot reach the argus server at http://127.0.0.1:9" in done.stderr
