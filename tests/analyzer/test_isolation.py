"""Isolation in the analyzer (issue 12): a job whose analysis raises never delays the others.

Real chDB store, two synthetic jobs in it; the one fault injected is a level function of the
analysis raising for the world-4 job only (monkeypatched in those tests alone). Jobs take turns
of a few windows, and an import whose parts lie twenty years apart is analysed where it has data.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from argus.analyzer import pipeline, service
from argus.analyzer.service import MAX_ATTEMPTS, SLICE_WINDOWS, TRAILING_WINDOWS, Analyzer
from argus.diagnosis import read_diagnoses
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.store import Store
from argus.window_grid import WindowGrid
from synthetic.jobs import NS, Fault, JobSpec, simulate
from synthetic.wire import insert_direct, synthetic_job

from .conftest import load

W = 2.0
BACKOFF_S = 1.0


def _sims():  # type: ignore[no-untyped-def]
    base = dict(windows=10, window_s=W, step_s=0.1, start_offset_s=0.7, seed=21)
    slow = simulate(JobSpec(world=8, faults=(Fault("compute", (5,), 0.3, 6.0),), **base), "job-slow")  # type: ignore[arg-type]
    broken = simulate(JobSpec(world=4, **base), "job-broken")  # type: ignore[arg-type]
    return slow, broken


def _break_world_4(monkeypatch: pytest.MonkeyPatch, fail_times: int | None) -> list[int]:
    """Make L1's step-time level raise on windows of the world-4 job (``fail_times`` calls; None = always)."""
    real = pipeline.job_step_times
    calls: list[int] = []

    def level(steps, **kw):  # type: ignore[no-untyped-def]
        if (
            steps.rank.size
            and int(np.max(steps.rank)) < 4
            and (fail_times is None or len(calls) < fail_times)
        ):
            calls.append(1)
            raise ValueError("a level broke on this window")
        return real(steps, **kw)

    monkeypatch.setattr(pipeline, "job_step_times", level)
    return calls


def _statuses(store: Store, job_id: str) -> dict[str, int]:
    t = store.query(
        "SELECT status, count() AS n FROM analysis_windows FINAL WHERE job_id = {j:String} GROUP BY status",
        {"j": job_id},
    ).to_pylist()
    return {r["status"]: int(r["n"]) for r in t}


def test_a_failing_job_is_retried_then_skipped_and_never_delays_the_other(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow, broken = _sims()
    load(store, slow)
    load(store, broken)
    _break_world_4(monkeypatch, None)
    metrics = Metrics()
    a = Analyzer(
        store, window=WindowGrid.from_seconds(W), metrics=metrics, backlog_s=None, retry_backoff_s=BACKOFF_S
    )
    now = max(int(slow.windows[-1].end_ns), int(broken.windows[-1].end_ns)) + 10 * NS
    a.run_once(now_ns=now)
    # The first pass: the slow rank of the healthy job is diagnosed, whatever the other job does.
    (d,) = read_diagnoses(store, "job-slow")
    assert (d.rank, d.cause) == (5, "compute")
    assert "failed" not in _statuses(store, "job-slow")
    assert a.retrying() and _statuses(store, "job-broken") == {}  # its first window waits for a retry
    # Backoff: no attempt before it is due, then doubling waits until MAX_ATTEMPTS attempts.
    t = now
    for attempt in range(1, MAX_ATTEMPTS):
        a.run_once(now_ns=t + int(BACKOFF_S * 2 ** (attempt - 1) * NS) - 1)
        assert a.retrying() and _statuses(store, "job-broken") == {}
        t += int(BACKOFF_S * 2 ** (attempt - 1) * NS)
        a.run_once(now_ns=t)
    assert not a.retrying()
    statuses = _statuses(store, "job-broken")
    failed = statuses["failed"]
    assert failed >= len(broken.windows) - 1  # each window with steps skipped (the later ones at once)
    text = generate_latest(metrics.registry).decode()
    assert f'argus_analysis_failures_total{{job_id="job-broken"}} {float(failed)}' in text
    assert 'argus_analysis_failures_total{job_id="job-slow"}' not in text
    # A skipped window's whole wall time is unexplained loss.
    assert 'argus_unexplained_loss_ratio{job_id="job-broken"} 1.0' in text
    assert read_diagnoses(store, "job-broken") == []


def test_a_window_that_fails_once_is_analysed_on_its_retry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, broken = _sims()
    load(store, broken)
    calls = _break_world_4(monkeypatch, 1)
    metrics = Metrics()
    a = Analyzer(
        store, window=WindowGrid.from_seconds(W), metrics=metrics, backlog_s=None, retry_backoff_s=BACKOFF_S
    )
    now = int(broken.windows[-1].end_ns) + 10 * NS
    a.run_once(now_ns=now)
    assert calls == [1] and a.retrying()
    a.run_once(now_ns=now + int(BACKOFF_S * NS))
    assert not a.retrying()
    assert "failed" not in _statuses(store, "job-broken")
    assert "argus_analysis_failures_total{" not in generate_latest(metrics.registry).decode()


class _FailingReadsOf:
    """The real store, except that every query about one job fails (that job's partition is down)."""

    def __init__(self, store: Store, job_id: str) -> None:
        self._store = store
        self.url = store.url
        self.job_id = job_id
        self.down = True

    def query(self, sql, parameters=None):  # type: ignore[no-untyped-def]
        if self.down and (parameters or {}).get("job") == self.job_id:
            raise StoreError(f"reads of {self.job_id}: injected failure")
        return self._store.query(sql, parameters)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


def test_a_store_error_of_one_job_stops_only_that_job(store: Store) -> None:
    slow, broken = _sims()
    load(store, broken)  # listed first (jobs go in id order): its error comes before the other job
    load(store, slow)
    flaky = _FailingReadsOf(store, "job-broken")
    a = Analyzer(flaky, window=WindowGrid.from_seconds(W), backlog_s=None)  # type: ignore[arg-type]
    now = max(int(slow.windows[-1].end_ns), int(broken.windows[-1].end_ns)) + 10 * NS
    with pytest.raises(StoreError, match="job-broken"):
        a.run_once(now_ns=now)  # raised after the pass
    (d,) = read_diagnoses(store, "job-slow")
    assert (d.rank, d.cause) == (5, "compute")
    assert _statuses(store, "job-broken") == {}  # nothing skipped: analysed once the store answers
    flaky.down = False
    a.run_once(now_ns=now)
    statuses = _statuses(store, "job-broken")
    assert "failed" not in statuses and statuses["analysed"] >= len(broken.windows)


def test_jobs_take_turns_of_a_few_windows(store: Store) -> None:
    slow, broken = _sims()
    load(store, broken)
    load(store, slow)
    a = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    now = max(int(slow.windows[-1].end_ns), int(broken.windows[-1].end_ns)) + 10 * NS
    a.run_once(now_ns=now, budget_s=0)  # one round of turns
    assert _statuses(store, "job-broken") == {"analysed": SLICE_WINDOWS}
    assert _statuses(store, "job-slow") == {"analysed": SLICE_WINDOWS}
    a.run_once(now_ns=now)  # then on, until nothing is due
    assert _statuses(store, "job-slow")["analysed"] >= len(slow.windows)


def test_an_import_whose_parts_lie_twenty_years_apart_delays_nothing(store: Store) -> None:
    slow, _ = _sims()
    load(store, slow)
    t0 = int(slow.windows[0].start_ns)
    # Listed first (jobs go in id order): two parts of a trace import, twenty years apart.
    old = t0 - 20 * 365 * 86_400 * NS
    insert_direct(store, "a-import", synthetic_job(world_size=2, steps=3, start_ns=old))
    insert_direct(
        store, "a-import", synthetic_job(world_size=2, steps=3, start_ns=t0, first_step=3, lifecycle=False)
    )
    store.insert(
        "jobs",
        pa.table(
            {
                "job_id": ["a-import"],
                "world_size": pa.array([2], pa.uint32()),
                "start_ns": [old],
                "command": [""],
                "source": ["import"],
            }
        ),
    )
    a = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    now = int(slow.windows[-1].end_ns) + 10 * NS
    started = time.monotonic()
    a.run_once(now_ns=now)
    assert time.monotonic() - started < 120
    (d,) = read_diagnoses(store, "job-slow")
    assert (d.rank, d.cause) == (5, "compute")
    # Only the windows near its rows were analysed (each part's and the trailing ones), not the
    # 315 million 2 s windows between them.
    assert 2 <= _statuses(store, "a-import")["analysed"] <= 2 * (2 + TRAILING_WINDOWS)


def _rows_past_the_limits(store: Store, sim) -> None:  # type: ignore[no-untyped-def]
    """Issue 39: a step of 2**64-1 (one steps row and the collective of that step), written
    straight into the store as one written before ingest refused such rows would hold: after
    ``toInt64`` it reads -1 and ``np.bincount`` raised in the roles, failing every window."""
    tables = sim.tables()
    co = tables["collectives"].slice(0, 1).to_pylist()[0]
    st = tables["steps"].filter(pa.compute.equal(tables["steps"].column("rank"), co["rank"])).to_pylist()
    step = next(s for s in st if s["start_ns"] <= co["issue_ns"] < s["start_ns"] + s["dur_ns"])
    bad = {**step, "step": 2**64 - 1}
    store.insert("steps", pa.Table.from_pylist([bad], schema=tables["steps"].schema))
    store.insert(
        "collectives", pa.Table.from_pylist([{**co, "step": 2**64 - 1}], schema=tables["collectives"].schema)
    )


def test_rows_past_the_limits_in_an_older_store_are_skipped_and_counted(store: Store) -> None:
    slow, _ = _sims()
    load(store, slow)
    _rows_past_the_limits(store, slow)
    metrics = Metrics()
    a = Analyzer(
        store, window=WindowGrid.from_seconds(W), metrics=metrics, backlog_s=None, retry_backoff_s=0.0
    )
    now = int(slow.windows[-1].end_ns) + 10 * NS
    for _ in range(MAX_ATTEMPTS):
        a.run_once(now_ns=now)
    assert "failed" not in _statuses(store, "job-slow")
    (d,) = read_diagnoses(store, "job-slow")
    assert (d.rank, d.cause) == (5, "compute")
    text = generate_latest(metrics.registry).decode()
    assert 'argus_analysis_skipped_rows_total{table="steps"} 1.0' in text
    assert 'argus_analysis_skipped_rows_total{table="collectives"}' in text


@pytest.mark.parametrize("stage", ["read", "write"])
def test_any_exception_in_a_window_is_that_job_s_failed_window_never_the_pass_s(
    store: Store, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """Issue 39: the read and the L5/write stages were contained only for store errors, so a
    ValueError there (a 5,000-digit line number in ``with_top_frames``) stopped the pass on
    every pass, and the jobs sorted after it were never analysed."""
    slow, broken = _sims()
    load(store, broken)  # listed first (jobs go in id order)
    load(store, slow)
    if stage == "read":
        real_read = service.read_window

        def read(store, job_id, *args):  # type: ignore[no-untyped-def]
            if job_id == "job-broken":
                raise ValueError("a row the analyzer cannot represent")
            return real_read(store, job_id, *args)

        monkeypatch.setattr(service, "read_window", read)
    else:
        real_write = service.write_window

        def write(store, job_id, *args, status, **kw):  # type: ignore[no-untyped-def]
            if job_id == "job-broken" and status == "analysed":
                raise ValueError("invalid literal for int() with base 10")
            return real_write(store, job_id, *args, status=status, **kw)

        monkeypatch.setattr(service, "write_window", write)
    metrics = Metrics()
    a = Analyzer(
        store, window=WindowGrid.from_seconds(W), metrics=metrics, backlog_s=None, retry_backoff_s=0.0
    )
    now = max(int(slow.windows[-1].end_ns), int(broken.windows[-1].end_ns)) + 10 * NS
    for _ in range(MAX_ATTEMPTS):
        a.run_once(now_ns=now)
    (d,) = read_diagnoses(store, "job-slow")
    assert (d.rank, d.cause) == (5, "compute")
    assert "failed" not in _statuses(store, "job-slow")
    assert _statuses(store, "job-broken").get("failed", 0) >= len(broken.windows) - 1
    text = generate_latest(metrics.registry).decode()
    assert 'argus_analysis_failures_total{job_id="job-broken"}' in text
