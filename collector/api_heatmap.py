"""Rank × time heatmap of step or phase time, and each cell's slowdown against its peers.

A cell is (row, time bin). Per rank and step the metric is the step's duration
(``metric="step"``) or the summed duration of that phase in the step; a rank's
value in a bin is the mean over the steps that start in it. When a job has more
ranks than ``max_rows``, a row covers a range of ranks and shows its slowest
rank, so a straggler stays visible at 10,000 ranks. A cell's slowdown is
``(value / median of the bin's rows − 1) × 100`` percent.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from argus.collector.api_jobs import require_job
from argus.collector.store import Store

from argus.schema import PHASES

__all__ = ["METRICS", "heatmap"]

#: What a heatmap can show.
METRICS = ("step", *PHASES)

_CELLS = """
SELECT intDiv(rank, {group:UInt64}) AS row, b, max(mean_ns) AS value_ns FROM (
    SELECT rank, intDiv(s - {t0:Int64}, {bin:Int64}) AS b, avg(d) AS mean_ns FROM (
        SELECT rank, step, min(start_ns) AS s, sum(dur_ns) AS d FROM {table}
        WHERE job_id = {job:String} AND {phase} GROUP BY rank, step
    ) WHERE s >= {t0:Int64} AND s < {t1:Int64}
    GROUP BY rank, b
) GROUP BY row, b
"""


def heatmap(
    store: Store,
    job_id: str,
    *,
    metric: str,
    start_ns: int | None,
    end_ns: int | None,
    bins: int,
    max_rows: int,
) -> dict[str, Any]:
    """The :class:`argus.collector.api_models.Heatmap` of ``job_id``.

    Args:
        metric: ``step`` or a phase name (:data:`METRICS`).
        start_ns, end_ns: Time range of step starts, ns since the epoch; None = the job's extent.
        bins: Number of time bins (>= 1).
        max_rows: Most rows (>= 1); ranks are grouped into ranges beyond it.

    Raises:
        NotFound: no such job.
        ValueError: ``metric`` not in :data:`METRICS`.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    require_job(store, job_id)
    table = "steps" if metric == "step" else "phases"
    phase = "1" if metric == "step" else "phase = {phase:String}"
    params: dict[str, Any] = {"job": job_id, "phase": metric}
    extent = store.query(
        f"SELECT count() AS n, min(start_ns) AS lo, max(start_ns) AS hi, max(rank) AS top FROM {table} "
        f"WHERE job_id = {{job:String}} AND {phase}",
        params,
    ).to_pylist()[0]
    t0 = start_ns if start_ns is not None else int(extent["lo"])
    t1 = end_ns if end_ns is not None else int(extent["hi"]) + 1
    empty = {"metric": metric, "start_ns": t0, "bin_ns": 1, "times_ns": [], "rows": [], "dur_ms": []}
    if extent["n"] == 0 or t1 <= t0:
        return {**empty, "slowdown_pct": []}
    bin_ns = max(1, math.ceil((t1 - t0) / bins))
    top = int(extent["top"])
    group = max(1, math.ceil((top + 1) / max_rows))
    cells = store.query(
        _CELLS.replace("{table}", table).replace("{phase}", phase),
        {**params, "group": group, "t0": t0, "t1": t1, "bin": bin_ns},
    )
    if cells.num_rows == 0:
        return {**empty, "slowdown_pct": []}
    rows = np.asarray(cells.column("row").to_numpy(), dtype=np.int64)
    cols = np.asarray(cells.column("b").to_numpy(), dtype=np.int64)
    values = np.asarray(cells.column("value_ns").to_numpy(), dtype=np.float64)
    row_ids = np.unique(rows)
    n_bins = math.ceil((t1 - t0) / bin_ns)
    grid = np.full((row_ids.size, n_bins), np.nan)
    grid[np.searchsorted(row_ids, rows), cols] = values
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-empty bins have no median: NaN
        slowdown = (grid / np.nanmedian(grid, axis=0) - 1.0) * 100.0

    def cells_of(matrix: np.ndarray, scale: float) -> list[list[float | None]]:
        return [[round(float(v) * scale, 3) if math.isfinite(v) else None for v in line] for line in matrix]

    return {
        "metric": metric,
        "start_ns": t0,
        "bin_ns": bin_ns,
        "times_ns": [t0 + i * bin_ns for i in range(n_bins)],
        "rows": [
            {"rank_lo": int(r) * group, "rank_hi": min(int(r) * group + group - 1, top)} for r in row_ids
        ],
        "dur_ms": cells_of(grid, 1e-6),
        "slowdown_pct": cells_of(slowdown, 1.0),
    }
