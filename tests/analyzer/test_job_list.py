"""The live analyzer's job list (issue 39, item 7): bounded in rows read and ids listed, and the
state of idle jobs dropped, on a real chDB store.

Before: every pass grouped four whole tables by job (``store_io.list_jobs``), so the rows read grew
with everything the store ever held and, past the store's timeout, no job was analysed at all;
``Analyzer._jobs`` kept every job ever met.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from argus.analyzer import store_io
from argus.analyzer.service import Analyzer
from argus.diagnosis import read_diagnoses
from argus.store import Store
from argus.window_grid import WindowGrid
from synthetic.jobs import NS, Fault, JobSpec, simulate

from .conftest import load

W = 2.0
#: Rows of the old jobs' steps: far more than the analyzer may read (:data:`READ_LIMIT`).
OLD_ROWS = 600_000
READ_LIMIT = 150_000


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(world=8, windows=12, window_s=W, step_s=0.1, start_offset_s=0.7, seed=21)
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def _end(sim) -> int:  # type: ignore[no-untyped-def]
    return int(sim.windows[-1].end_ns)


def _record(store: Store, job_ids: list[str], agent: str = "agent-1", age_s: int = 0) -> None:
    """The ``ingest_batches`` rows the collector writes for one batch of each job, stored ``age_s`` ago."""
    n = len(job_ids)
    stored = store.query("SELECT toInt64(now()) AS t").column("t")[0].as_py() - age_s
    store.insert(
        "ingest_batches",
        pa.table(
            {
                "job_id": pa.array(job_ids, pa.string()),
                "agent_id": pa.array([agent] * n, pa.string()),
                "seq": pa.array(range(n), pa.uint64()),
                "table_name": pa.array(["steps"] * n, pa.string()),
                "rows": pa.array([1] * n, pa.uint64()),
                "part": pa.array([0] * n, pa.uint64()),
                "stored_at": pa.array(np.full(n, stored, "datetime64[s]")),
            }
        ),
    )


def _old_jobs(store: Store, jobs: int, t0_ns: int) -> list[str]:
    """``jobs`` jobs whose :data:`OLD_ROWS` steps rows (all told) and batches were stored two days ago."""
    ids = [f"old-{i:04d}" for i in range(jobs)]
    per = OLD_ROWS // jobs
    store.insert(
        "steps",
        pa.table(
            {
                "job_id": pa.array(np.repeat(ids, per), pa.string()),
                "rank": pa.array(np.tile(np.arange(per) % 8, jobs), pa.uint32()),
                "step": pa.array(np.tile(np.arange(per) // 8, jobs), pa.uint64()),
                "start_ns": pa.array(t0_ns + np.tile(np.arange(per) // 8, jobs) * NS // 10, pa.int64()),
                "dur_ns": pa.array(np.full(per * jobs, NS // 10), pa.int64()),
            }
        ),
    )
    _record(store, ids, agent="agent-old", age_s=2 * 86_400)
    return ids


def test_the_job_list_reads_only_the_jobs_stored_lately(store: Store) -> None:
    """600,000 old rows of 200 jobs whose batches were stored two days ago, and one live job: the
    analyzer, allowed to read 150,000 rows per query, lists and diagnoses the live job. Before, its
    job list scanned every table whole: TooManyRows, and no job was analysed."""
    sim = simulate(_spec(faults=(Fault("compute", (5,), 0.3, 9.0),)), "job-live")
    load(store, sim)
    _record(store, ["job-live"])
    _old_jobs(store, 200, int(sim.windows[0].start_ns) - 7 * 86_400 * NS)
    bounded = store.reading_at_most(READ_LIMIT)  # type: ignore[attr-defined]
    a = Analyzer(bounded, window=WindowGrid.from_seconds(W))
    a.run_once(now_ns=_end(sim) + 10 * NS)
    assert a.held() == ["job-live"]
    assert [(d.rank, d.cause) for d in read_diagnoses(store, "job-live")] == [(5, "compute")]


def test_ids_listed_are_those_stored_within_the_horizon_at_most_max_active_jobs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 junk job ids stored two days ago are not listed; of 30 stored now, the limit's worth."""
    _record(store, [f"junk-{i:04d}" for i in range(1000)], agent="agent-junk", age_s=2 * 86_400)
    _record(store, [f"new-{i:02d}" for i in range(30)], agent="agent-new")
    assert sorted(store_io.active_job_ids(store, 600, 86_400).live) == [f"new-{i:02d}" for i in range(30)]
    monkeypatch.setitem(store_io.LIMITS, "max_active_jobs", 7)
    assert len(store_io.active_job_ids(store, 600, 86_400).live) == 7


def test_an_idle_job_s_state_is_dropped_and_it_resumes_without_a_second_diagnosis(store: Store) -> None:
    """Two live jobs, one with an open fault. Once the faulty one has stored no batch for longer than
    the horizon, the analyzer holds the other's state only (before: every job ever met). When it
    reports again, it resumes from its stored diagnoses: its fault is not recorded a second time."""
    fault = (Fault("compute", (5,), 0.3, 9.0),)
    sick, well = simulate(_spec(faults=fault), "job-sick"), simulate(_spec(), "job-well")
    load(store, sick)
    load(store, well)
    _record(store, ["job-sick", "job-well"])
    a = Analyzer(store, window=WindowGrid.from_seconds(W))
    now = _end(sick) + 60 * NS  # every window of both analysed, their trailing ones too
    a.run_once(now_ns=now)
    assert a.held() == ["job-sick", "job-well"]
    (opened,) = read_diagnoses(store, "job-sick")
    assert opened.state == "open"
    # job-sick's batches now date from two days ago: idle past the horizon.
    store.command("ALTER TABLE ingest_batches DELETE WHERE job_id = 'job-sick' SETTINGS mutations_sync = 2")
    _record(store, ["job-sick"], agent="agent-2", age_s=2 * 86_400)
    a.run_once(now_ns=now + NS)
    assert a.held() == ["job-well"]
    # It reports again: its state is read back from the store, nothing recorded twice.
    _record(store, ["job-sick"], agent="agent-3")
    a.run_once(now_ns=now + 2 * NS)
    assert a.held() == ["job-sick", "job-well"]
    assert [(d.id, d.state) for d in read_diagnoses(store, "job-sick")] == [(opened.id, "open")]
