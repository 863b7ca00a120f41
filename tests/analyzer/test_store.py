"""The analyzer on a real chDB store: rows in with Store.insert, Analyzer.run_once, diagnoses read back."""

from __future__ import annotations

import argparse
import json

import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from argus.analyzer.lifecycle import Tracker
from argus.analyzer.service import WAIT_WINDOWS, Analyzer, main
from argus.diagnosis import read_diagnoses, read_states
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.schema import wire_schema
from argus.store import Store
from argus.window_grid import WindowGrid
from synthetic.jobs import NS, Fault, JobSpec, simulate

from .conftest import load, rows_between

W = 2.0


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(world=8, windows=12, window_s=W, step_s=0.1, start_offset_s=0.7, seed=21)
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def _end(sim) -> int:  # type: ignore[no-untyped-def]
    return int(sim.windows[-1].end_ns)


def _analyze(store: Store, sim, metrics: Metrics | None = None, **kw: object):  # type: ignore[no-untyped-def]
    a = Analyzer(store, window=WindowGrid.from_seconds(W), metrics=metrics, backlog_s=None, **kw)  # type: ignore[arg-type]
    return a, a.run_once(now_ns=_end(sim) + 10 * NS)


def test_compute_straggler_is_diagnosed_and_exported(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("compute", (5,), 0.3, 9.0),)), "job-compute")
    load(store, sim)
    metrics = Metrics()
    _, written = _analyze(store, sim, metrics)
    diagnoses = read_diagnoses(store, "job-compute")
    assert [(d.rank, d.cause, d.state) for d in diagnoses] == [(5, "compute", "open")]
    d = diagnoses[0]
    onset_window = sim.windows[0].start_ns + int(9.0 // W * W * NS)
    assert onset_window <= d.first_window_ns <= onset_window + int(W * NS)
    assert d.phase in ("forward", "backward") and d.slowdown_pct > 5
    windows = _windows(store, d)
    assert windows >= 3 and d.evidence["wait_ms"] < d.evidence["peer_wait_ms"]
    assert d.evidence["lost_s"] > 0 and "cause_votes" not in d.evidence  # bookkeeping is not evidence
    # Updated every window from its opening (after its confirmation span): one id, a version per window.
    versions = [x for x in written if x.id == d.id]
    confirm = Tracker("x", window_ns=int(W * NS)).confirm_windows
    assert len({x.id for x in written}) == 1 and len(versions) == windows - (confirm - 1)
    assert [v.last_window_ns for v in versions] == sorted(v.last_window_ns for v in versions)
    text = generate_latest(metrics.registry).decode()
    assert 'argus_diagnosis_active{cause="compute",job_id="job-compute"} 1.0' in text
    assert 'argus_straggler_score{job_id="job-compute",rank="5"}' in text
    assert "argus_analysis_lag_seconds" in text


def test_a_job_finished_an_hour_ago_loses_its_series(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("compute", (5,), 0.3, 9.0),)), "job-gone")
    load(store, sim)
    metrics = Metrics()
    analyzer, _ = _analyze(store, sim, metrics)
    assert 'job_id="job-gone"' in generate_latest(metrics.registry).decode()
    analyzer.run_once(now_ns=_end(sim) + 3601 * NS)
    assert 'job_id="job-gone"' not in generate_latest(metrics.registry).decode()


def test_fault_that_stops_is_resolved_once_without_flapping(store: Store) -> None:
    sim = simulate(_spec(windows=18, faults=(Fault("dataloader", (2,), 0.3, 5.0, end_s=21.0),)), "job-end")
    load(store, sim)
    a = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    versions = []
    for k in range(len(sim.windows)):  # window by window, as a server would
        versions += a.run_once(now_ns=int(sim.windows[k].end_ns + 3 * NS))
    assert len({v.id for v in versions}) == 1
    states = [v.state for v in versions]
    assert states[-1] == "resolved" and states.count("resolved") == 1 and set(states[:-1]) == {"open"}
    (d,) = read_diagnoses(store, "job-end")
    assert d.cause == "dataloader" and d.rank == 2 and d.phase == "data" and d.state == "resolved"
    assert d.last_window_ns < sim.windows[0].start_ns + int(22 * NS)


def test_rank_that_stops_reporting_is_unresponsive(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("dead", (6,), 0.0, 9.3),)), "job-dead")
    load(store, sim)
    _analyze(store, sim)
    (d,) = read_diagnoses(store, "job-dead")
    assert (d.rank, d.cause) == (6, "unresponsive")


def test_hung_rank_names_the_collective_its_peers_wait_in(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("hung", (1,), 0.0, 9.3),)), "job-hung")
    load(store, sim)
    _analyze(store, sim)
    (d,) = read_diagnoses(store, "job-hung")
    assert (d.rank, d.cause) == (1, "unresponsive") and d.evidence["hung"] is True
    assert d.evidence["process_group"] == "0" and isinstance(d.evidence["seq"], int)
    assert d.group == "0"


def test_rank_that_exits_normally_is_not_diagnosed(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("exit", (6,), 0.0, 9.3),)), "job-exit")
    load(store, sim)
    _analyze(store, sim)
    assert read_diagnoses(store, "job-exit") == []


def test_imperfect_data_gives_no_false_diagnosis(store: Store) -> None:
    """Lost batches, a batch arriving after its window was analysed, clock offsets of 5 ms,
    and a job that starts and ends mid-window."""
    sim = simulate(
        _spec(windows=14, missing=0.05, clock_offset_ms=5.0, start_offset_s=1.3, end_s=24.9, seed=22),
        "job-messy",
    )
    t0 = sim.windows[0].start_ns
    late = load(store, sim, hold=rows_between(3, t0 + 10 * NS, t0 + 13 * NS))
    assert late  # rank 3's rows of 3 s are held back
    a = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    written = a.run_once(now_ns=t0 + 16 * NS)  # windows up to 14 s analysed without them
    for name, table in late.items():
        store.insert(name, table)
    written += a.run_once(now_ns=_end(sim) + 10 * NS)
    assert written == [] and read_diagnoses(store, "job-messy") == []


def test_a_window_waits_for_a_rank_whose_rows_are_late_then_goes_on_without_it(store: Store) -> None:
    """A node agent behind on its spool: rank 3's rows from 6 s on arrive late. Windows past 6 s wait
    for them (their analysis would see rank 3 missing), and are analysed once they arrive; a rank that
    never catches up holds them back at most WAIT_WINDOWS windows."""
    sim = simulate(_spec(windows=10), "job-behind")
    t0 = sim.windows[0].start_ns
    late = load(store, sim, hold=rows_between(3, t0 + 6 * NS, t0 + 30 * NS))
    a = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    a.run_once(now_ns=t0 + 12 * NS)
    waiting = a._jobs["job-behind"].cursor_ns
    assert waiting <= t0 + 6 * NS + int(W * NS)  # stopped at the window rank 3 has not reported past
    for name, table in late.items():
        store.insert(name, table)
    a.run_once(now_ns=t0 + 12 * NS)
    assert a._jobs["job-behind"].cursor_ns > waiting  # went on once the rows were in

    other = simulate(_spec(windows=10, seed=23), "job-stuck")
    t1 = other.windows[0].start_ns
    load(store, other, hold=rows_between(3, t1 + 6 * NS, t1 + 30 * NS))
    b = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None, job="job-stuck")
    now = t1 + 18 * NS
    b.run_once(now_ns=now)
    # Never caught up: windows older than WAIT_WINDOWS (+1) windows are analysed anyway.
    assert b._jobs["job-stuck"].cursor_ns >= now - (WAIT_WINDOWS + 1) * int(W * NS) - int(W * NS)


def test_restarted_analyzer_continues_the_open_diagnosis(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("compute", (4,), 0.4, 5.0),)), "job-restart")
    load(store, sim)
    t0 = sim.windows[0].start_ns
    first = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None).run_once(now_ns=t0 + 18 * NS)
    assert {d.id for d in first} and all(d.state == "open" for d in first)
    second = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None).run_once(
        now_ns=_end(sim) + 10 * NS
    )
    assert {d.id for d in second} == {d.id for d in first}
    assert len(read_diagnoses(store, "job-restart")) == 1


def test_argus_analyze_once_prints_the_diagnoses(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    sim = simulate(_spec(faults=(Fault("host_stall", (7,), 0.2, 7.0),)), "job-cli")
    load(store, sim)
    url = store.url
    assert (
        main(
            argparse.Namespace(
                store=url, window_s=W, once=True, job="job-cli", min_loss_pct=5.0, stack_interval_s=300.0
            )
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "job-cli" in out and "host_stall rank 7" in out
    (d,) = read_diagnoses(store, "job-cli")
    assert json.loads(json.dumps(d.to_dict()))["cause"] == "host_stall"


def _windows_uninterrupted(sim) -> int:  # type: ignore[no-untyped-def]
    """Windows an uninterrupted analysis of ``sim`` keeps its one diagnosis for."""
    from argus.analyzer.pipeline import JobAnalysis

    ja = JobAnalysis("x", int(W * NS))
    for w in sim.windows:
        ja.analyze(w)
    (d,) = ja.tracker.open
    return sum(ja.tracker.state(d.id)["cause_votes"].values())


def _windows(store: Store, d) -> int:  # type: ignore[no-untyped-def]
    """Windows the stored open diagnosis ``d`` was seen in (the tracker's bookkeeping in the store)."""
    return sum(read_states(store, d.job_id)[d.id].tracker["cause_votes"].values())


class _FailOnce:
    """The real store, except that the first insert into ``diagnoses`` fails (a store outage)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.url = store.url
        self.failed = False

    def insert(self, table: str, data, *, dedup_token: str | None = None) -> None:  # type: ignore[no-untyped-def]
        if table == "diagnoses" and not self.failed:
            self.failed = True
            raise StoreError("diagnoses: injected failure")
        self._store.insert(table, data, dedup_token=dedup_token)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


def test_a_failed_write_is_retried_without_counting_the_window_twice(store: Store) -> None:
    sim = simulate(_spec(faults=(Fault("compute", (2,), 0.4, 3.0),)), "job-retry")
    load(store, sim)
    flaky = _FailOnce(store)
    a = Analyzer(flaky, window=WindowGrid.from_seconds(W), backlog_s=None)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        a.run_once(now_ns=_end(sim) + 10 * NS)
    a.run_once(now_ns=_end(sim) + 10 * NS)
    (d,) = read_diagnoses(store, "job-retry")
    assert flaky.failed and d.rank == 2 and d.cause == "compute"
    # The same answer as an analysis that never failed: every window counted once.
    clean = _windows_uninterrupted(sim)
    assert _windows(store, d) == clean and d.first_window_ns <= sim.windows[0].start_ns + 6 * NS


def _mark_imported(store: Store, job_id: str, sim) -> None:  # type: ignore[no-untyped-def]
    """The ``jobs`` row a trace import writes last (``source = 'import'``)."""
    row = {"world_size": [sim.spec.world], "start_ns": [int(sim.windows[0].start_ns)], "command": [""]}
    row["source"] = ["import"]
    table = pa.table(row).cast(wire_schema("jobs"))
    store.insert("jobs", table.add_column(0, "job_id", pa.array([job_id] * table.num_rows, pa.string())))


def test_an_imported_job_is_analysed_whole_a_live_one_from_the_backlog(store: Store) -> None:
    spec = _spec(faults=(Fault("compute", (5,), 0.3, 9.0),))
    now = _end(simulate(spec, "x")) + 7200 * NS  # both jobs ended two hours ago
    live, imported = simulate(spec, "old-live"), simulate(spec, "old-import")
    load(store, live)
    assert (
        Analyzer(store, window=WindowGrid.from_seconds(W), job="old-live").run_once(now_ns=now) == []
    )  # past the backlog
    load(store, imported)
    a = Analyzer(
        store, window=WindowGrid.from_seconds(W), job="old-import"
    )  # the server's default backlog (an hour)
    assert a.run_once(now_ns=now) == []  # met mid-import: its jobs row is not written yet
    _mark_imported(store, "old-import", imported)
    found = a.run_once(now_ns=now + 1)
    assert {(d.rank, d.cause) for d in found} == {(5, "compute")}
    assert min(d.first_window_ns for d in found) < now - 3600 * NS
    assert a.run_once(now_ns=now + 2) == []  # analysed once


def _faults_by_key(store: Store, job_id: str) -> dict[tuple[int | None, str], list[str]]:
    out: dict[tuple[int | None, str], list[str]] = {}
    for d in read_diagnoses(store, job_id):
        out.setdefault((d.rank, d.cause), []).append(d.id)
    return out


@pytest.mark.parametrize("window_s", [W, 5.0])
def test_a_fresh_analyzer_over_an_analysed_store_records_no_fault_twice(
    store: Store, window_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `argus demo --data-dir D`, then `argus server --store chdb://D/store` (another window size)
    and `argus analyze --once`: one fault resolved while the job ran, one resolved when it ended."""
    faults = (Fault("dataloader", (2,), 0.4, 3.0, end_s=11.0), Fault("compute", (5,), 0.4, 15.0))
    sim = simulate(_spec(windows=14, end_s=26.5, faults=faults), "job-again")
    load(store, sim)
    live = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    for w in sim.windows:  # window by window, as the demo's server did
        live.run_once(now_ns=int(w.end_ns + 3 * NS))
    live.run_once(now_ns=_end(sim) + 30 * NS)
    first = read_diagnoses(store, "job-again")
    assert {(d.rank, d.cause, d.state) for d in first} == {
        (2, "dataloader", "resolved"),
        (5, "compute", "resolved"),
    }
    states = read_states(store, "job-again")
    assert all(states[d.id].analysed_to_ns > d.last_window_ns for d in first)

    browse = Analyzer(
        store, window=WindowGrid.from_seconds(window_s)
    )  # a server's defaults: an hour of backlog
    assert browse.run_once(now_ns=_end(sim) + 60 * NS) == []
    assert (
        main(
            argparse.Namespace(
                store=store.url,
                window_s=window_s,
                once=True,
                job=None,
                min_loss_pct=5.0,
                stack_interval_s=300.0,
            )
        )
        == 0
    )
    assert read_diagnoses(store, "job-again") == first
    assert all(len(ids) == 1 for ids in _faults_by_key(store, "job-again").values())
    out = capsys.readouterr().out  # --once prints what is stored, though it wrote nothing
    assert "dataloader rank 2" in out and "compute rank 5" in out


def test_a_restart_mid_job_continues_without_recording_a_resolved_fault_again(store: Store) -> None:
    faults = (Fault("dataloader", (2,), 0.4, 3.0, end_s=11.0), Fault("compute", (5,), 0.4, 15.0))
    sim = simulate(_spec(windows=18, faults=faults), "job-mid")
    load(store, sim)
    t0 = sim.windows[0].start_ns
    before = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    for k in range(14):  # the dataloader fault is resolved by then, the compute one is open
        before.run_once(now_ns=int(sim.windows[k].end_ns + 3 * NS))
    states = {(d.rank, d.cause): d.state for d in read_diagnoses(store, "job-mid")}
    assert states == {(2, "dataloader"): "resolved", (5, "compute"): "open"}
    after = Analyzer(store, window=WindowGrid.from_seconds(W), backlog_s=None)
    written = after.run_once(now_ns=_end(sim) + 10 * NS)
    assert {(d.rank, d.cause) for d in written} == {(5, "compute")}  # continued, not opened again
    (compute,) = [d for d in read_diagnoses(store, "job-mid") if d.cause == "compute"]
    assert compute.state == "open" and compute.last_window_ns >= t0 + 32 * NS
    assert all(len(ids) == 1 for ids in _faults_by_key(store, "job-mid").values())


def test_a_row_stamped_in_2100_does_not_keep_its_job_due_forever(store: Store) -> None:
    """A job with one steps row stamped in the year 2100 besides its real rows: once its real rows
    are analysed and an hour has passed, it is no longer due, and its series are forgotten."""
    sim = simulate(_spec(), "job-2100")
    load(store, sim)
    far = 4_102_444_800 * NS  # 2100-01-01
    row = {"job_id": ["job-2100"], "rank": [0], "step": [1], "start_ns": [far], "dur_ns": [NS]}
    schema = wire_schema("steps").insert(0, pa.field("job_id", pa.string()))
    store.insert("steps", pa.table({k: row.get(k, [0]) for k in schema.names}, schema=schema))
    metrics = Metrics()
    analyzer, _ = _analyze(store, sim, metrics)
    analyzer.run_once(now_ns=_end(sim) + 3601 * NS)
    assert "job-2100" not in analyzer._due and analyzer.lag_s(_end(sim) + 3601 * NS) == 0.0
    assert 'job_id="job-2100"' not in generate_latest(metrics.registry).decode()
