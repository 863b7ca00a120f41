"""Rank × time heatmap of step, busy or phase time, and each cell's slowdown against its peers.

Per rank and step the metric is:

- ``busy`` — step time minus the time the rank waited in collectives for the
  last rank to arrive (docs/design.md §2: wait = max issue time over the ranks of a
  (process group, seq) − own issue time). In a synchronous job every rank's
  step time is the same; busy time is what differs, so the straggler shows.
- ``step`` — the step's duration.
- a phase name — the summed duration of that phase in the step.

A rank's value in a time bin is the mean over its steps that start in it.
When a job has more ranks than ``max_rows``, a row covers a range of ranks and
shows its slowest rank, so a straggler stays visible at 10,000 ranks. A
cell's slowdown is ``(value / median of the bin's rows − 1) × 100`` percent.
There are never more bins than steps in the range.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from argus.collector.api.jobs import require_job
from argus.schema import PHASES
from argus.store import Store

__all__ = ["METRICS", "heatmap"]

#: What a heatmap can show.
METRICS = ("busy", "step", *PHASES)

_RANGE = "job_id = {job:String} AND start_ns >= {t0:Int64} AND start_ns < {t1:Int64}"

_STEP_ROWS = (
    f"SELECT rank, step, min(start_ns) AS s, sum(dur_ns) AS d FROM steps WHERE {_RANGE} GROUP BY rank, step"
)

_PHASE_ROWS = (
    "SELECT rank, step, min(start_ns) AS s, sum(dur_ns) AS d FROM phases "
    f"WHERE {_RANGE} AND phase = {{phase:String}} GROUP BY rank, step"
)

_BUSY_ROWS = f"""
SELECT st.rank AS rank, st.step AS step, st.s AS s, st.d - w.wait AS d
FROM ({_STEP_ROWS}) AS st
LEFT JOIN (
    SELECT c.rank AS rank, c.step AS step, sum(greatest(l.last_arrival - c.issue_ns, 0)) AS wait
    FROM collectives AS c
    INNER JOIN (
        SELECT process_group, seq, max(issue_ns) AS last_arrival FROM collectives
        WHERE job_id = {{job:String}} AND step BETWEEN {{step_lo:UInt64}} AND {{step_hi:UInt64}}
        GROUP BY process_group, seq
    ) AS l ON c.process_group = l.process_group AND c.seq = l.seq
    WHERE c.job_id = {{job:String}} AND c.step BETWEEN {{step_lo:UInt64}} AND {{step_hi:UInt64}}
    GROUP BY c.rank, c.step
) AS w ON st.rank = w.rank AND st.step = w.step
"""

_CELLS = """
SELECT intDiv(rank, {group:UInt64}) AS row, b, max(mean_ns) AS value_ns FROM (
    SELECT rank, intDiv(s - {t0:Int64}, {bin:Int64}) AS b, avg(d) AS mean_ns FROM ({rows})
    GROUP BY rank, b
) GROUP BY row, b
"""


def _per_step(metric: str) -> str:
    if metric == "busy":
        return _BUSY_ROWS
    return _STEP_ROWS if metric == "step" else _PHASE_ROWS


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
    """The :class:`argus.collector.api.models.Heatmap` of ``job_id``.

    Args:
        metric: ``busy``, ``step`` or a phase name (:data:`METRICS`).
        start_ns, end_ns: Time range of step starts, ns since the epoch; None = the job's extent.
        bins: Most time bins (>= 1).
        max_rows: Most rows (>= 1); ranks are grouped into ranges beyond it.

    Raises:
        NotFound: no such job.
        ValueError: ``metric`` not in :data:`METRICS`.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    require_job(store, job_id)
    params: dict[str, Any] = {
        "job": job_id,
        "phase": metric,
        "t0": start_ns if start_ns is not None else 0,
        "t1": end_ns if end_ns is not None else 2**63 - 1,
    }
    table = "phases" if metric in PHASES else "steps"
    phase = " AND phase = {phase:String}" if metric in PHASES else ""
    extent = store.query(
        f"SELECT count() AS n, min(start_ns) AS lo, max(start_ns) AS hi, max(rank) AS top, "
        f"uniqExact(step) AS steps, min(step) AS step_lo, max(step) AS step_hi "
        f"FROM {table} WHERE {_RANGE}{phase}",
        params,
    ).to_pylist()[0]
    t0 = start_ns if start_ns is not None else int(extent["lo"])
    t1 = end_ns if end_ns is not None else int(extent["hi"]) + 1
    if extent["n"] == 0 or t1 <= t0:
        empty: list[Any] = []
        return {
            "metric": metric,
            "start_ns": t0,
            "bin_ns": 1,
            "times_ns": [],
            "rows": [],
            "dur_ms": empty,
            "slowdown_pct": empty,
        }
    bin_ns = max(1, math.ceil((t1 - t0) / max(1, min(bins, int(extent["steps"])))))
    n_bins = math.ceil((t1 - t0) / bin_ns)
    top = int(extent["top"])
    group = max(1, math.ceil((top + 1) / max_rows))
    cells = store.query(
        _CELLS.replace("{rows}", _per_step(metric)),
        {
            **params,
            "t0": t0,
            "t1": t1,
            "group": group,
            "bin": bin_ns,
            "step_lo": extent["step_lo"],
            "step_hi": extent["step_hi"],
        },
    )
    rows = np.asarray(cells.column("row").to_numpy(), dtype=np.int64)
    cols = np.asarray(cells.column("b").to_numpy(), dtype=np.int64)
    values = np.asarray(cells.column("value_ns").to_numpy(), dtype=np.float64)
    row_ids = np.unique(rows)
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
