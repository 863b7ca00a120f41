"""`argus diagnose`: the rich table and the JSON objects of docs/design.md §7, over real HTTP (and TLS)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from argus.diagnosis import Diagnosis
from argus.schema import wire_table
from argus.store import Store
from synthetic.wire import diagnosis_row, insert_direct, synthetic_job
from tests.collector.api.conftest import LiveApp
from tests.collector.test_auth_tls import self_signed
from tests.conftest import ArgusServer


def _diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", "diagnose", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_diagnose_prints_table_and_json(store: Store, live_app: LiveApp) -> None:
    now = time.time_ns()
    insert_direct(store, "job-cli", synthetic_job(world_size=4, steps=2))
    store.insert(
        "diagnoses",
        diagnosis_row(
            "job-cli",
            "d-open",
            state="open",
            updated_ns=now,
            first_ns=now - 10**10,
            rank=3,
            ranks=[3],
            evidence=json.dumps({"forward_ms": {"rank": 30.0, "peers_median": 10.0}, "lost_s": 4.5}),
        ),
    )
    store.insert(
        "diagnoses",
        diagnosis_row(
            "job-cli",
            "d-link",
            state="resolved",
            updated_ns=now,
            first_ns=now - 10**11,
            rank=None,
            ranks=[0, 1],
            cause="communication",
            phase=None,
            kernel="ncclDevKernel_AllReduce",
            slowdown_pct=12.5,
        ),
    )
    window = {"window_start_ns": [now - 10**10], "window_ns": [10**10], "status": ["analysed"]}
    window.update(wall_ns=[10**10], steps=[100], lost_ns=[2 * 10**9], explained_ns=[15 * 10**8])
    window.update(updated_ns=[now])
    store.insert("analysis_windows", wire_table("analysis_windows", window, "job-cli"))
    result = _diagnose("--job", "job-cli", "--server", live_app.url, "--json")
    assert result.returncode == 0, result.stderr
    objects = json.loads(result.stdout)
    assert [d["id"] for d in objects] == ["d-open", "d-link"]
    for obj in objects:
        assert Diagnosis.from_dict(obj).to_dict() == obj  # exactly the docs/design.md §7 shape
    assert objects[1]["ranks"] == [0, 1] and objects[1]["rank"] is None

    table = _diagnose("--job", "job-cli", "--server", live_app.url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "job-cli" in lines[0] and "1 open diagnoses" in lines[0]
    # The job's lost time and its unexplained share, and each diagnosis's lost time.
    assert (
        "1 analysis window(s)" in lines[1]
        and "lost 2.0 s" in lines[1]
        and "25 % of it unexplained" in lines[1]
    )
    open_row = next(line for line in lines if "compute" in line)
    assert "open" in open_row and " 3 " in open_row and "forward" in open_row and "2.50" in open_row
    assert "4.5 s" in open_row
    link_row = next(line for line in lines if "communication" in line)
    assert "resolved" in link_row and "0,1" in link_row and "12.5%" in link_row
    assert lines.index(open_row) < lines.index(link_row)  # open first
    # Under the table, each diagnosis: its headline, the summary sentence (with the rank's host and
    # pid), then at most 5 evidence lines with units.
    assert objects[0]["summary"].startswith("Rank 3 (host node1, pid 1003) computes more slowly")
    head = lines.index("OPEN rank 3: compute")
    assert lines[head + 1] == "  " + objects[0]["summary"]
    figures = list(itertools.takewhile(lambda line: line.startswith("    "), lines[head + 2 :]))
    assert 1 <= len(figures) <= 5 and all(re.search(r"\d (ms|s|%)", f) for f in figures), figures
    assert lines[head + 2 + len(figures) :][1] == "RESOLVED ranks 0,1: communication"


def _argus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_jobs_lists_status_ranks_open_diagnoses_and_last_seen(store: Store, live_app: LiveApp) -> None:
    now = time.time_ns()
    long_id = "a-training-job-whose-id-is-longer-than-any-column-" + "z" * 60
    insert_direct(store, long_id, synthetic_job(world_size=4, steps=2))
    insert_direct(store, "job-old", synthetic_job(world_size=2, steps=2, exited=True, start_ns=now - 10**12))
    store.insert(
        "diagnoses", diagnosis_row(long_id, "d1", state="open", updated_ns=now, first_ns=now - 10**10)
    )
    listed = _argus("jobs", "--server", live_app.url, "--json")
    assert listed.returncode == 0, listed.stderr
    objects = json.loads(listed.stdout)
    assert [j["job_id"] for j in objects] == [long_id, "job-old"]  # newest first
    table = _argus("jobs", "--server", live_app.url)
    assert table.returncode == 0, table.stderr
    text = table.stdout
    assert "status" in text and "open diagnoses" in text and "last seen" in text
    # The whole id, folded over lines if the column is narrow; never cut.
    assert long_id in "".join(text.replace("│", " ").split())
    newest = next(line for line in text.splitlines() if "running" in line)
    assert "4/4" in newest and re.search(r"\b1\b", newest)
    seen = time.strftime("%Y-%m-%d", time.localtime(objects[0]["last_seen_ns"] / 1e9))
    assert seen in newest
    old = next(line for line in text.splitlines() if "job-old" in line)
    assert "finished" in old and "2/2" in old
    empty = _argus("jobs", "--server", live_app.url + "/nowhere")
    assert empty.returncode == 1 and "404" in empty.stderr


@pytest.mark.slow
def test_diagnose_over_tls(argus_server_factory: Callable[..., ArgusServer], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = argus_server_factory("--no-analyzer", "--tls-cert", str(cert), "--tls-key", str(key))
    assert server.http_url.startswith("https://")
    plain = server.http_url.replace("https://", "http://")
    trusted = _diagnose("--job", "nope", "--server", plain, "--tls-cert", str(cert))
    assert trusted.returncode == 1 and "404" in trusted.stderr and "no job 'nope'" in trusted.stderr
    untrusted = _diagnose("--job", "nope", "--server", server.http_url)
    assert (
        untrusted.returncode == 1
        and "cannot reach" in untrusted.stderr
        and "CERTIFICATE" in untrusted.stderr.upper()
    )
