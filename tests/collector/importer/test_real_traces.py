"""Must-show 1: the seven real Kineto traces import with the counts of their README, at the true epoch ns."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from argus.collector.importer import ImportResult, import_traces
from argus.store import Store, open_store
from argus.window_grid import WindowGrid


@dataclass(frozen=True)
class Expected:
    """One row of the data README's table."""

    rank: int
    kernels: int
    distinct: int
    nccl: dict[str, int]
    step_ms: list[int]


#: The README table; step durations rounded to whole ms as the README writes them.
README = {
    "job128_rank0.json.gz": Expected(0, 1154, 194, {"sendrecv": 10}, [607, 623]),
    "job128_rank1.json.gz": Expected(1, 1104, 183, {"sendrecv": 10}, [608, 631]),
    "job2_nccl_rank0.json.gz": Expected(0, 2700, 70, {"allreduce": 15, "broadcast": 6}, [222, 220, 225]),
    "job1_ns_resolution_rank0.json.gz": Expected(0, 4350, 77, {}, [35, 72, 96, 96, 96]),
    "diff_control_rank3_of8.json.gz": Expected(
        3, 8568, 170, {"sendrecv": 42, "allreduce": 18}, [75, 77, 76, 77, 78, 81]
    ),
    "diff_test_rank1_of2.json.gz": Expected(
        1, 9876, 131, {"sendrecv": 43, "allreduce": 21}, [100, 122, 166, 82, 107, 166]
    ),
    "no_rank_field.json.gz": Expected(0, 0, 0, {}, [75]),
}
WINDOW_S = 10.0


@pytest.fixture(scope="module")
def imported(
    kineto_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, dict[str, str]]]:
    """Every README file imported into one store, each as its own job; file name → job id."""
    store = open_store(f"chdb://{tmp_path_factory.mktemp('real') / 'data'}")
    jobs: dict[str, str] = {}
    try:
        for name in README:
            result: ImportResult = import_traces(
                store,
                [kineto_dir / name],
                job_id=f"real-{name.split('.')[0]}",
                rank=0 if name == "no_rank_field.json.gz" else None,
                window=WindowGrid.from_seconds(WINDOW_S),
            )
            jobs[name] = result.job_id
        yield store, jobs
    finally:
        store.close()


def _one(store: Store, sql: str, job_id: str) -> list[object]:
    return store.query(sql, {"job": job_id}).to_pylist()


@pytest.mark.parametrize("name", list(README))
def test_counts_match_the_readme(imported: tuple[Store, dict[str, str]], name: str) -> None:
    store, jobs = imported
    job, want = jobs[name], README[name]
    kernels = _one(
        store,
        "SELECT count() AS n, uniqExact(kernel) AS d, any(rank) AS r FROM kernel_events "
        "WHERE job_id = {job:String} AND kind = 'kernel'",
        job,
    )[0]
    assert (kernels["n"], kernels["d"]) == (want.kernels, want.distinct)
    if want.kernels:
        assert kernels["r"] == want.rank
    nccl = _one(
        store, "SELECT op, count() AS n FROM collectives WHERE job_id = {job:String} GROUP BY op", job
    )
    assert {row["op"]: row["n"] for row in nccl} == want.nccl
    flagged = _one(
        store,
        "SELECT sum(count) AS n FROM kernel_summaries WHERE job_id = {job:String} AND collective = 1",
        job,
    )[0]["n"]
    assert (flagged or 0) == sum(want.nccl.values())
    steps = _one(store, "SELECT dur_ns FROM steps WHERE job_id = {job:String} ORDER BY start_ns", job)
    assert [round(r["dur_ns"] / 1e6) for r in steps] == pytest.approx(want.step_ms, abs=1)


@pytest.mark.parametrize("name", list(README))
def test_summaries_cover_every_event_in_aligned_windows(
    imported: tuple[Store, dict[str, str]], name: str
) -> None:
    store, jobs = imported
    rows = _one(
        store,
        "SELECT kind, kernel, stream, sum(count) AS n, min(window_start_ns % window_ns) AS misaligned, "
        "any(window_ns) AS w, groupUniqArray(resolution_ns) AS res FROM kernel_summaries "
        "WHERE job_id = {job:String} GROUP BY kind, kernel, stream",
        jobs[name],
    )
    raw = _one(
        store,
        "SELECT kind, kernel, stream, count() AS n FROM kernel_events "
        "WHERE job_id = {job:String} GROUP BY ALL",
        jobs[name],
    )
    assert {(r["kind"], r["kernel"], r["stream"]): r["n"] for r in rows} == {
        (r["kind"], r["kernel"], r["stream"]): r["n"] for r in raw
    }
    assert all(r["misaligned"] == 0 and r["w"] == WINDOW_S * 1e9 for r in rows)
    # Integer-µs traces are compressed at 1 µs resolution, the ns ones at 1 ns.
    ns_traces = {"job2_nccl_rank0.json.gz", "job1_ns_resolution_rank0.json.gz"}
    assert {x for r in rows for x in r["res"]} <= ({1} if name in ns_traces else {1000})


def test_job128_ranks_overlap_in_time(imported: tuple[Store, dict[str, str]]) -> None:
    store, _ = imported
    rows = [
        _one(store, "SELECT step, start_ns, dur_ns FROM steps WHERE job_id = {job:String} ORDER BY step", job)
        for job in ("real-job128_rank0", "real-job128_rank1")
    ]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] == [551, 552]
    for a, b in zip(*rows, strict=True):
        overlap = min(a["start_ns"] + a["dur_ns"], b["start_ns"] + b["dur_ns"]) - max(
            a["start_ns"], b["start_ns"]
        )
        assert overlap > 0.99 * min(a["dur_ns"], b["dur_ns"])
    # ... and at the epoch of the run (2023-04-29 UTC).
    assert 1_682_700_000 * 10**9 < rows[0][0]["start_ns"] < 1_682_800_000 * 10**9


def test_base_time_nanoseconds_after_trace_events(
    imported: tuple[Store, dict[str, str]], kineto_dir: Path
) -> None:
    store, jobs = imported
    with gzip.open(kineto_dir / "job2_nccl_rank0.json.gz", "rt") as f:
        text = f.read()
    assert text.index('"baseTimeNanoseconds"') > text.index('"traceEvents"')
    base = int(re.search(r'"baseTimeNanoseconds":\s*(\d+)', text)[1])  # type: ignore[index]
    ts = re.search(r'"name": "ProfilerStep#4".*?"ts": (\d+)\.(\d+)', text, re.S)
    assert ts is not None
    want = base + int(ts[1]) * 1000 + int(ts[2].ljust(3, "0"))
    first = _one(
        store,
        "SELECT min(start_ns) AS s FROM steps WHERE job_id = {job:String}",
        jobs["job2_nccl_rank0.json.gz"],
    )
    assert first[0]["s"] == want == 1_716_423_322_416_788_066


def test_nanosecond_decimals_are_exact(imported: tuple[Store, dict[str, str]], kineto_dir: Path) -> None:
    store, jobs = imported
    with gzip.open(kineto_dir / "job1_ns_resolution_rank0.json.gz", "rt") as f:
        text = f.read()
    found = re.findall(r'"cat": "kernel", [^\n]*\n\s*"ts": (\d+)\.(\d+), "dur": (\d+)\.(\d+)', text)
    assert len(found) == 4350
    want = {
        (int(a) * 1000 + int(b.ljust(3, "0")), int(c) * 1000 + int(d.ljust(3, "0"))) for a, b, c, d in found
    }
    assert any(float(f"{a}.{b}") * 1000 != int(a) * 1000 + int(b.ljust(3, "0")) for a, b, _, _ in found)
    got = _one(
        store,
        "SELECT start_ns, dur_ns FROM kernel_events WHERE job_id = {job:String} AND kind = 'kernel'",
        jobs["job1_ns_resolution_rank0.json.gz"],
    )
    assert want <= {(r["start_ns"], r["dur_ns"]) for r in got}


def test_collective_metadata_of_job2(imported: tuple[Store, dict[str, str]]) -> None:
    store, jobs = imported
    rows = _one(
        store,
        "SELECT step, process_group, seq, op, bytes, issue_ns, start_ns FROM collectives "
        "WHERE job_id = {job:String} ORDER BY seq",
        jobs["job2_nccl_rank0.json.gz"],
    )
    assert [r["seq"] for r in rows] == list(range(21))
    assert {r["process_group"] for r in rows} == {"0"}
    assert all(r["bytes"] > 0 for r in rows)
    issue = np.array([r["issue_ns"] for r in rows])
    assert np.all(np.diff(issue) > 0) and all(r["issue_ns"] <= r["start_ns"] for r in rows)
    assert {r["step"] for r in rows} == {4, 5, 6}
    # pg_config's group lands in `ranks`, with its members and backend.
    groups = _one(
        store,
        "SELECT group_name, group_ranks, group_backend FROM ranks "
        "WHERE job_id = {job:String} AND event = 'group'",
        jobs["job2_nccl_rank0.json.gz"],
    )
    assert groups == [{"group_name": "0", "group_ranks": [0, 1], "group_backend": "nccl"}]


def test_every_rank_attaches_and_exits_normally(imported: tuple[Store, dict[str, str]]) -> None:
    store, jobs = imported
    for name, job in jobs.items():
        rows = _one(
            store,
            "SELECT event, exit_code, time_ns FROM ranks WHERE job_id = {job:String} ORDER BY time_ns",
            job,
        )
        events = [r["event"] for r in rows]
        assert events[0] == "attach" and events[-1] == "exit" and rows[-1]["exit_code"] == 0, name
        job_rows = _one(store, "SELECT source, world_size FROM jobs WHERE job_id = {job:String}", job)
        assert [r["source"] for r in job_rows] == ["import"]
