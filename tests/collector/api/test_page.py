"""The page at / rendered by headless Chromium (Debian's chromium): jobs, heatmap and diagnoses.

The screenshot is kept as ``page.png`` in the test's tmp dir (and copied to
``$ARGUS_ARTIFACTS`` when that is set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
import zlib
from pathlib import Path
from urllib.parse import quote

import pytest

from argus.schema import wire_table
from argus.store import Store
from synthetic.wire import diagnosis_row, insert_direct, synthetic_job
from tests.collector.api.conftest import LiveApp
from tests.collector.api.prom import CHROMIUM, chromium

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium not installed (Debian package chromium; .ci/run installs it)",
    ),
]


def test_page_renders_heatmap_and_diagnoses(store: Store, live_app: LiveApp, tmp_path: Path) -> None:
    now = time.time_ns()
    insert_direct(store, "job-page", synthetic_job(world_size=8, steps=16, slow_rank=5))
    evidence = '{"forward_ms": {"rank": 30.0, "peers_median": 10.0}, "collective_wait_ms": 0.1}'
    store.insert(
        "diagnoses",
        diagnosis_row(
            "job-page",
            "diag-open",
            state="open",
            updated_ns=now,
            first_ns=now - 10**10,
            rank=5,
            ranks=[5],
            evidence=evidence,
        ),
    )
    store.insert(
        "diagnoses",
        diagnosis_row(
            "job-page", "diag-old", state="resolved", updated_ns=now, first_ns=now - 10**11, rank=1
        ),
    )
    url = f"{live_app.url}/#job=job-page"

    dom = chromium(tmp_path / "profile-dom", url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="true"' in html, html[-3000:]
    # Jobs table, heatmap cells for 8 ranks, the open diagnosis with its evidence, and the resolved one
    # marked as such.
    assert 'data-job="job-page"' in html
    heatmap = re.search(r'<svg id="heatmap"[^>]*data-rows="(\d+)"[^>]*data-bins="(\d+)"', html)
    assert heatmap is not None, "no heatmap svg"
    rows, bins = int(heatmap.group(1)), int(heatmap.group(2))
    assert rows == 8 and bins >= 4
    cells = re.findall(r'<rect class="cell"[^>]*data-rank-lo="(\d+)" data-slowdown-pct="([-\d.]*)"', html)
    assert len(cells) == rows * bins
    slowest = max((float(pct), int(rank)) for rank, pct in cells if pct)
    assert slowest[1] == 5 and slowest[0] > 30
    assert (
        'class="diagnosis diagnosis-open" data-id="diag-open" data-cause="compute" data-state="open"' in html
    )
    assert 'data-id="diag-old" data-cause="compute" data-state="resolved"' in html
    assert html.index('data-id="diag-open"') < html.index('data-id="diag-old"')  # open first
    assert "forward_ms" in html and "peers_median" in html and "collective_wait_ms" in html

    shot = tmp_path / "page.png"
    result = chromium(tmp_path / "profile-shot", url, f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("ARGUS_ARTIFACTS"):
        shutil.copy(shot, Path(os.environ["ARGUS_ARTIFACTS"]) / "page.png")


def test_a_finished_job_shows_its_resolved_diagnosis(store: Store, live_app: LiveApp, tmp_path: Path) -> None:
    """The job's whole story after it ends: the diagnosis resolved when it finished (rank, cause,
    summary), never "every rank is like its peers", a legend under the heatmap, the full job id."""
    job_id = "demo-dp-compute-20261201-142233-a-job-id-longer-than-the-jobs-column-" + "x" * 140
    now = time.time_ns()
    insert_direct(store, job_id, synthetic_job(world_size=4, steps=16, slow_rank=3, exited=True))
    evidence = {"self_ms": 71.6, "peer_self_ms": 40.1, "wait_ms": 3.524, "peer_wait_ms": 19.482}
    evidence |= {"phase_excess_ms": {"forward": 31.5}, "lost_s": 6.2, "span_s": 23.0, "job_finished": True}
    store.insert(
        "diagnoses",
        diagnosis_row(
            job_id,
            "diag-done",
            state="resolved",
            updated_ns=now,
            first_ns=now - 2 * 10**9,
            rank=3,
            ranks=[3],
            slowdown_pct=27.0,
            evidence=json.dumps(evidence),
        ),
    )
    dom = chromium(tmp_path / "profile", f"{live_app.url}/#job={quote(job_id, safe='')}", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="true"' in html, html[-3000:]
    assert "like its peers" not in html
    article = re.search(
        r'<article class="diagnosis diagnosis-resolved" data-id="diag-done"(.*?)</article>', html, re.S
    )
    assert article is not None, html[-4000:]
    body = article.group(1)
    assert 'data-cause="compute" data-state="resolved"' in body and "compute: rank 3" in body
    summary = re.search(r'<p class="summary">([^<]*)</p>', body)
    assert summary is not None
    text = summary.group(1)
    assert text.startswith("Resolved (the job finished): rank 3 (host node1, pid 1003) computes more slowly")
    assert "waits 3.5 ms per step while its peers wait 19.5 ms" in text and "loses 27 %" in text
    # The header says the job finished and its diagnosis was resolved; the span on the time axis.
    header = re.search(r'<p id="job-summary"[^>]*>([^<]*)</p>', html)
    assert header is not None and header.group(1).startswith("finished,")
    assert "0 open and 1 resolved diagnoses" in header.group(1)
    assert re.search(r'<rect class="span span-resolved"[^>]*data-id="diag-done"', html)
    legend = re.search(r'<div id="heatmap-legend"[^>]*>(.*?)</div>', html, re.S)
    assert legend is not None and "slowdown vs the median rank" in legend.group(1)
    assert "+50 % or more" in legend.group(1) and "no data" in legend.group(1)
    # The jobs table holds the whole id (at most two lines of it shown), with the id as its tooltip;
    # the job's link is written out under its heading; the score and the group are said in words.
    assert f'<td title="{job_id}"><div class="job-id">{job_id}</div></td>' in html
    link = re.search(r'<a id="job-link" href="([^"]*)">([^<]*)</a>', html)
    assert link is not None and link.group(1) == link.group(2), html[-3000:]
    assert link.group(1) == f"{live_app.url}/#job={quote(job_id, safe='')}"
    assert "how far the rank stands from its peers" in body and "1 = the detection threshold" in body
    # At 1,400 px the id's cell is at most two lines tall (a 6-line cell is ~125 px; 2 lines ~46 px).
    shot = tmp_path / "long-id.png"
    done = chromium(
        tmp_path / "profile-shot", f"{live_app.url}/#job={quote(job_id, safe='')}", f"--screenshot={shot}"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _selected_row_height_px(shot) <= 50


def _selected_row_height_px(png: Path) -> int:
    """Rows of pixels of the page's screenshot ``png`` that show the selected job's row (its
    background, #eef2ff, in the left third), read with zlib: an 8-bit RGB(A) PNG, not interlaced."""
    data = png.read_bytes()
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + size
    raw, stride = zlib.decompress(idat), width * channels
    previous, rows = bytearray(stride), 0
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):  # undo the PNG filter of this line
            a = line[i - channels] if i >= channels else 0
            b, c = previous[i], previous[i - channels] if i >= channels else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            paeth = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + (0, a, b, (a + b) // 2, paeth)[kind]) & 0xFF
        previous = line
        px = [tuple(line[x * channels : x * channels + 3]) for x in range(0, width // 3, 4)]
        rows += sum(1 for p in px if p == (0xEE, 0xF2, 0xFF)) >= 20
    return rows


def test_a_diagnosis_with_stacks_shows_the_flagged_ranks_flame_graph(
    store: Store, live_app: LiveApp, tmp_path: Path
) -> None:
    """Issue 15: the page draws the flagged rank's stacks of the diagnosis's capture as an icicle
    (from GET .../stacks?capture=&rank=&format=collapsed), each frame's function name as text,
    the top frames listed above it; the peer's stacks are a click away, not drawn at first."""
    now = time.time_ns()
    job_id = "job-stacks"
    insert_direct(store, job_id, synthetic_job(world_size=4, steps=16, slow_rank=3))
    loop = "<module> (train.py:90);train (train.py:71)"
    stall = f"{loop};very_distinctive_page_stall (train.py:12)"
    rows = {
        "rank": [3, 3, 3, 2, 2, 3],
        "pid": [13, 13, 13, 12, 12, 13],
        "capture_id": ["cap-1"] * 5 + ["cap-0"],
        "time_ns": [now - 5 * 10**9] * 5 + [now - 400 * 10**9],
        "duration_ns": [3 * 10**9] * 6,
        "sampler": ["py-spy"] * 6,
        "thread": ["MainThread", "MainThread", "argus-probe", "MainThread", "MainThread", "MainThread"],
        "frames": [
            stall,
            f"{loop};forward (model.py:5)",
            "Thread.run (threading.py:982);Shipper._run (agent/shipper.py:138)",
            f"{loop};forward (model.py:5)",
            f"{loop};peer_only_allreduce_wait (dist.py:3)",
            f"{loop};an_older_capture_only (old.py:1)",
        ],
        "count": [12, 18, 30, 10, 20, 7],
        "idle": [1, 0, 1, 0, 1, 0],
        "gil": [0, 1, 0, 1, 0, 1],
    }
    store.insert("stacks", wire_table("stacks", rows, job_id=job_id))
    stall_frame = {"function": "very_distinctive_page_stall", "file": "train.py", "line": 12}
    evidence = {
        "self_ms": 71.6,
        "top_frames": [{**stall_frame, "share": 0.4, "peer_share": 0.0}],
        "stacks": {
            "capture_id": "cap-1", "time_ns": now - 5 * 10**9, "rank": 3, "peer": 2,
            "sampler": "py-spy", "samples": 30,
        },
    }  # fmt: skip
    store.insert(
        "diagnoses",
        diagnosis_row(
            job_id,
            "diag-stall",
            state="open",
            updated_ns=now,
            first_ns=now - 10**10,
            rank=3,
            ranks=[3],
            cause="host_stall",
            phase=None,
            evidence=json.dumps(evidence),
        ),
    )
    dom = chromium(tmp_path / "profile", f"{live_app.url}/#job={job_id}", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="true"' in html, html[-3000:]
    section = re.search(r'<div class="stacks" data-capture="cap-1">(.*?)</article>', html, re.S)
    assert section is not None, html[-4000:]
    body = section.group(1)
    assert re.search(r'<div class="flame" data-rank="3"', body), body
    frames = re.findall(r'<div class="frame([^"]*)"[^>]*data-function="([^"]*)"[^>]*>([^<]*)</div>', body)
    shown = {name for _, name, _ in frames}
    # Every frame's function name is the frame's text; the fault's function is marked a top frame.
    assert all(name == text for _, name, text in frames), frames
    assert ("very_distinctive_page_stall" in shown) and {"train", "forward", "MainThread"} <= shown, shown
    assert any(name == "very_distinctive_page_stall" and "top" in cls for cls, name, _ in frames)
    # Only rank 3's stacks of this capture, without Argus's own thread.
    assert not shown & {"peer_only_allreduce_wait", "an_older_capture_only", "Shipper._run", "argus-probe"}
    assert "<code>very_distinctive_page_stall</code> (train.py:12), peer 0.0 %" in body
    assert 'data-rank="2">rank 2 (peer)</button>' in body
    # Issue 42: a capture that sets nothing apart says why, in place of an empty heading.
    why = "no line is held more often in the rank's stacks than in its peer's (30 samples)"
    empty = {**evidence, "top_frames": [], "stacks": {**evidence["stacks"], "why_no_frames": why}}  # type: ignore[dict-item]
    store.insert(
        "diagnoses",
        diagnosis_row(
            job_id, "diag-stall", state="open", updated_ns=now + 1, first_ns=now - 10**10, rank=3, ranks=[3],
            cause="host_stall", phase=None, evidence=json.dumps(empty),
        ),
    )  # fmt: skip
    dom = chromium(tmp_path / "profile-empty", f"{live_app.url}/#job={job_id}", "--dump-dom")
    html = dom.stdout
    assert 'data-loaded="true"' in html, html[-3000:]
    section = re.search(r'<div class="stacks" data-capture="cap-1">(.*?)</article>', html, re.S)
    assert section is not None, html[-4000:]
    assert "Top frames of" not in section.group(1) and '<ol class="top-frames">' not in section.group(1)
    assert f"No top frames of rank 3 against rank 2 (py-spy, 30 samples): {why}" in section.group(1)


def test_docs_work_offline(store: Store, live_app: LiveApp, tmp_path: Path) -> None:
    """/docs with every host but the server's unresolvable: Swagger UI's assets come from the server."""
    offline = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
    dom = chromium(tmp_path / "profile-docs", f"{live_app.url}/docs", offline, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "/static-offline-docs/swagger-ui-bundle.js" in html and "cdn." not in html
    operations = set(re.findall(r'<span class="opblock-summary-path"[^>]*data-path="([^"]+)"', html))
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/diagnoses", "/metrics"} <= operations, html[-3000:]
