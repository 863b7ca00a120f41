"""Kernel summaries of another window length (an agent or an import with another ``--window-s``)
are left out of the analysis, counted and logged, never read into a window they do not summarise."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from argus.analyzer.service import Analyzer
from argus.analyzer.store_io import Liveness, read_window
from argus.collector.importer import import_traces
from argus.metrics import Metrics
from argus.store import Store
from argus.window_grid import WindowGrid
from tests.collector.importer.traces import T0_US, kernel, write_trace

#: Kernels every half second for 20 s: summaries in five 4.1 s windows.
KERNELS = [kernel(T0_US + i * 500_000, 50 + i) for i in range(40)]


def _summaries(store: Store, job: str) -> int:
    return int(
        store.query(f"SELECT count() AS n FROM kernel_summaries WHERE job_id = '{job}'").column(0)[0].as_py()
    )


@pytest.mark.parametrize("analyzer_s", [4.1, 4.0])
def test_summaries_of_another_window_are_counted_and_logged_not_misread(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture, analyzer_s: float
) -> None:
    summarised = WindowGrid.from_seconds(4.1)
    import_traces(store, [write_trace(tmp_path / "r0.json", KERNELS)], job_id="w41", window=summarised)
    rows = _summaries(store, "w41")
    grid = WindowGrid.from_seconds(analyzer_s)
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="argus.analyzer.service"):
        # Long after the trace's end: the job's own series are gone, the server-wide count is not.
        Analyzer(store, window=grid, metrics=metrics, job="w41").run_once(now_ns=(T0_US + 60_000_000) * 1000)
    text = generate_latest(metrics.registry).decode()
    warned = [r.getMessage() for r in caplog.records if "another window" in r.getMessage()]

    start = grid.start_ns(T0_US * 1000)
    window = read_window(store, "w41", start, start + grid.length_ns, Liveness())
    if grid == summarised:
        assert window.mismatched_kernel_rows == 0 and len(window.kernels.count) > 0
        assert "argus_window_mismatch_rows_total 0.0" in text and warned == []
        return
    # Every row is reported once (the windows tile time), the window reads none of them.
    assert window.mismatched_kernel_rows > 0 and len(window.kernels.count) == 0
    assert f"argus_window_mismatch_rows_total {float(rows)}" in text
    assert len(warned) == 1 and "the analyzer's 4 s" in warned[0], warned
