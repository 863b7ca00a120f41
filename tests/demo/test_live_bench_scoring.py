"""The scoring of bench/detection_live.py (issue 10's rules), on hand-made runs and diagnoses."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "detection_live.py"
_spec = importlib.util.spec_from_file_location("detection_live", _PATH)
assert _spec is not None and _spec.loader is not None
live = importlib.util.module_from_spec(_spec)
sys.modules["detection_live"] = live
_spec.loader.exec_module(live)

NS = 10**9
W = 5 * NS
T0 = 1_800_000_000 * NS  # the fault starts here


def _diag(rank: int | None, ranks: list[int], cause: str = "compute", **kw: Any) -> dict[str, Any]:
    d = {
        "rank": rank,
        "ranks": ranks,
        "cause": cause,
        "slowdown_pct": 20.0,
        "first_window_ns": T0,
        "last_window_ns": T0 + 2 * W,
        "evidence": {},
    }
    d.update(kw)
    return d


def _timeline(step_s: float, steps_before: int = 10, steps_after: int = 20) -> dict[str, Any]:
    ends = [T0 - round((steps_before - 1 - i) * step_s * NS) - 1 for i in range(steps_before)]
    ends += [ends[-1] + round((i + 1) * step_s * NS) for i in range(steps_after)]
    return {"fault_start_ns": T0, "step_end_ns": ends}


def test_pace_is_the_mean_step_time_of_the_steps_after_the_fault_starts() -> None:
    p = live.pace(_timeline(0.2))
    assert p.steps == 20 and p.step_s == pytest.approx(0.2, rel=1e-6)
    assert p.wall_s == pytest.approx(4.0, rel=1e-6)


@pytest.mark.parametrize(
    ("d", "injected", "verdict"),
    [
        (_diag(3, [3]), {3}, "tp"),
        (_diag(None, [3]), {3}, "none"),  # job-level: not a hit for a single-rank fault
        (_diag(None, []), {3}, "none"),
        (_diag(1, [1]), {3}, "fp"),
        (_diag(None, [3, 0]), {3}, "fp"),  # names a healthy rank
        (_diag(3, [3], last_window_ns=T0 - 2 * W), {3}, "fp"),  # before the fault: healthy then
        (_diag(2, [2]), {2, 3}, "tp"),  # one rank of a stage
        (_diag(None, [2, 3]), {2, 3}, "tp"),  # job-level naming the slow ranks
        (_diag(None, [1, 2]), {2, 3}, "fp"),
        (_diag(0, [0]), set(), "fp"),  # any rank named on a clean job
        (_diag(None, []), set(), "none"),
    ],
)
def test_judge(d: dict[str, Any], injected: set[int], verdict: str) -> None:
    start = T0 if injected else None
    assert live.judge(d, injected, start, W) == verdict


def _run(name: str, scenario: str, ranks: list[int], step_s: float, case: str) -> Any:
    return live.Run(name, case, "dp", scenario, ranks, f"job-{name}", [], 0, _timeline(step_s))


def test_score_cost_lost_time_recall_and_unexplained_share() -> None:
    runs = [
        _run("dp-compute-large", "compute", [2], 0.25, "dp-compute-large"),
        _run("dp-compute-large~twin", "none", [], 0.2, "dp-compute-large"),
        _run("pp-stage1-compute", "compute", [2, 3], 0.4, "pp-stage1-compute"),
        _run("pp-stage1-compute~twin", "none", [], 0.2, "pp-stage1-compute"),
    ]
    found = {
        # lost_s given: it is used; a second, healthy-rank diagnosis is a false positive.
        "job-dp-compute-large": [_diag(2, [2], evidence={"lost_s": 0.5}), _diag(0, [0], "host_stall")],
        "job-dp-compute-large~twin": [],
        # One of the stage's two ranks named, wrong cause, no lost_s: slowdown x span (15 s).
        "job-pp-stage1-compute": [_diag(3, [3], "host_stall")],
        "job-pp-stage1-compute~twin": [_diag(None, [])],
    }
    rows, f = live.score(runs, found, 5.0)
    by = {r.name: r for r in rows}
    dp, pp = by["dp-compute-large"], by["pp-stage1-compute"]
    assert dp.cost == pytest.approx(0.2) and dp.lost_s == pytest.approx(20 * 0.05)
    assert (dp.tp, dp.fp, dp.share, dp.cause_ok) == (1, 1, 1.0, 1)
    assert pp.cost == pytest.approx(0.5) and pp.lost_s == pytest.approx(20 * 0.2)
    assert (pp.tp, pp.share, pp.cause_ok) == (1, 0.5, 0) and pp.explained_s == pytest.approx(3.0)
    assert by["pp-stage1-compute~twin"].other == 1 and by["pp-stage1-compute~twin"].fp == 0
    assert f["precision"] == pytest.approx(2 / 3)
    assert f["recall"] == pytest.approx(0.75)
    assert f["cause_accuracy"] == pytest.approx(0.5)
    # Unexplained: dp 1.0 - 0.5, pp 4.0 - 3.0, over 5.0 lost.
    assert f["unexplained_loss_pct"] == pytest.approx(100 * 1.5 / 5.0)
    assert f["jobs"] == 4 and f["failed_jobs"] == 0


def test_a_small_fault_is_scored_but_not_in_recall_and_no_diagnosis_is_all_unexplained() -> None:
    runs = [
        _run("dp-host_stall-small", "host_stall", [1], 0.21, "dp-host_stall-small"),
        _run("dp-host_stall-small~twin", "none", [], 0.2, "dp-host_stall-small"),
    ]
    rows, f = live.score(runs, {}, 5.0)
    assert not rows[0].counted and math.isnan(f["recall"]) and math.isnan(f["precision"])
    assert f["unexplained_loss_pct"] == pytest.approx(100.0)
