"""The page at / rendered by headless Chromium (Debian's chromium): jobs, heatmap and open diagnoses.

The screenshot is kept as ``page.png`` in the test's tmp dir (and copied to
``$ARGUS_ARTIFACTS`` when that is set).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from argus.store import Store
from synthetic.wire import diagnosis_row, insert_direct, synthetic_job
from tests.api.conftest import LiveApp
from tests.api.prom import CHROMIUM, chromium

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
    # Jobs table, heatmap cells for 8 ranks, the open diagnosis with its evidence; not the resolved one.
    assert 'data-job="job-page"' in html
    heatmap = re.search(r'<svg id="heatmap"[^>]*data-rows="(\d+)"[^>]*data-bins="(\d+)"', html)
    assert heatmap is not None, "no heatmap svg"
    rows, bins = int(heatmap.group(1)), int(heatmap.group(2))
    assert rows == 8 and bins >= 4
    cells = re.findall(r'<rect class="cell"[^>]*data-rank-lo="(\d+)" data-slowdown-pct="([-\d.]*)"', html)
    assert len(cells) == rows * bins
    slowest = max((float(pct), int(rank)) for rank, pct in cells if pct)
    assert slowest[1] == 5 and slowest[0] > 30
    assert '<article class="diagnosis" data-id="diag-open" data-cause="compute">' in html
    assert "diag-old" not in html
    assert "forward_ms" in html and "peers_median" in html and "collective_wait_ms" in html

    shot = tmp_path / "page.png"
    result = chromium(tmp_path / "profile-shot", url, f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("ARGUS_ARTIFACTS"):
        shutil.copy(shot, Path(os.environ["ARGUS_ARTIFACTS"]) / "page.png")
