"""Exactly once across a collector killed in the middle of a group (docs/design.md §3): a real collector
process on a real chDB store, killed with SIGKILL between a group's record and its data insert or
between the data insert and its settlement; its batches then come back grouped otherwise, re-split
into parts, or from an older agent, to a new collector on the same store."""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from argus.collector import ingest, ingest_record
from argus.collector.writer import BatchWriter
from argus.proto import collector_pb2 as pb
from argus.schema import TABLES
from argus.store import Store, open_store
from tests.collector.test_writer import _step_rows, _steps_batches
from tests.collector.wire import batch, sample

#: A collector process storing one group of four batches with the writer's code (no earlier group to
#: remember, as after a start), which stops (and
#: says so on stdout) just before its first data insert ("recorded") or just after it ("inserted"),
#: and waits to be killed.
_COLLECTOR = """
import sys, time
from argus.collector import ingest
from argus.store import open_store
from tests.collector.stopping_store import stop_at
from tests.collector import test_exactly_once as here
url, point, build = sys.argv[1:4]
store = open_store(url)
stop_at(store, point)
ingest.write_group(store, getattr(here, build)())
print("done", flush=True)
time.sleep(600)
"""


def _killed_collector(url: str, point: str, build: str) -> None:
    """Run :data:`_COLLECTOR` on ``url`` until it reaches ``point``, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _COLLECTOR, url, point, build],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "the collector never reached the point where it is killed"
        assert proc.stdout.readline().strip() == point
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL


def _old_host_batches() -> list[ingest.Decoded]:
    """Four ``host_samples`` batches of 50 rows from an agent older than the link columns (none of
    the columns with a default), each conformed as the collector does."""
    defaulted = [c.name for c in TABLES["host_samples"].columns if c.default is not None]
    out = []
    for seq in range(4):
        data = sample("host_samples", n=50, salt=seq * 50).drop_columns(defaulted)
        out.append(ingest.decode(batch("host_samples", data, seq=seq, agent_id="agent-old")))
    return out


def _rows(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count() AS n FROM {table}").column("n")[0].as_py())


def _markers(store: Store, table: str) -> int:
    """Marker rows (ingest_record.settle) left in ``table``."""
    found = store.query(f"SELECT count() AS n FROM {table} WHERE startsWith(job_id, 'argus/settle/')")
    return int(found.column("n")[0].as_py())


def _resend(store: Store, regrouped: list[list[ingest.Decoded]]) -> list[pb.Ack]:
    """Each group of ``regrouped`` through a new collector's writer, one after another: their acks."""
    writer = BatchWriter(store)
    acks = []
    try:
        for group in regrouped:
            futures = [writer.submit(d) for d in group]
            acks += [f.result(120) for f in futures]
    finally:
        assert writer.close(60)
    return acks


@pytest.mark.parametrize("point", ["recorded", "inserted"])
def test_a_collector_killed_inside_a_group_leaves_its_batches_stored_once_when_resent(
    tmp_path: Path, point: str
) -> None:
    """Killed after the group's record and before its data insert, the resent batches are stored;
    killed after the data insert and before the settlement, they are not stored again (before: 400
    rows of 200). Either way no marker row stays."""
    url = f"chdb://{tmp_path / 'store'}"
    _killed_collector(url, point, "_steps_batches_4x50")
    store = open_store(url)
    try:
        assert _step_rows(store) == ((0, 0) if point == "recorded" else (200, 200))
        group = _steps_batches(4, 50)
        acks = _resend(store, [group[:1], group[1:3], group[3:]])
        expected = pb.Ack.STORED if point == "recorded" else pb.Ack.DUPLICATE
        assert [(a.status, a.rows) for a in acks] == [(expected, 50)] * 4
        assert _step_rows(store) == (200, 200)
        assert _markers(store, "steps") == 0
        again = _resend(store, [group])
        assert [a.status for a in again] == [pb.Ack.DUPLICATE] * 4
    finally:
        store.close()


def test_parts_of_a_batch_resent_after_the_collector_died_are_not_stored_again(tmp_path: Path) -> None:
    """The agent re-split a batch of the killed collector's group (its halves are parts 2 and 3 of it,
    heap order) and sends them in separate groups, the rest beside a new batch: each part is a
    duplicate of the stored whole, and only the new batch is stored."""
    url = f"chdb://{tmp_path / 'store'}"
    _killed_collector(url, "inserted", "_steps_batches_4x50")
    store = open_store(url)
    try:
        group = _steps_batches(5, 50)  # the killed group's four, and a fifth never sent before
        whole = group[1]
        halves = [
            dataclasses.replace(
                whole, data=whole.data.slice(25 * half, 25), seq=100 + half, parent=("agent-g", 1, 2 + half)
            )
            for half in (0, 1)
        ]
        acks = _resend(store, [group[:1], halves[:1], halves[1:], group[2:]])
        assert [(a.seq, a.status) for a in acks] == [
            (0, pb.Ack.DUPLICATE),
            (100, pb.Ack.DUPLICATE),
            (101, pb.Ack.DUPLICATE),
            (2, pb.Ack.DUPLICATE),
            (3, pb.Ack.DUPLICATE),
            (4, pb.Ack.STORED),
        ]
        assert _step_rows(store) == (250, 250)
    finally:
        store.close()


def test_an_older_agents_batches_resent_after_the_collector_died_are_stored_once(tmp_path: Path) -> None:
    """Batches without the columns added since (filled with their defaults) from a group whose
    collector was killed after its data insert: resent grouped otherwise, stored once."""
    url = f"chdb://{tmp_path / 'store'}"
    _killed_collector(url, "inserted", "_old_host_batches")
    store = open_store(url)
    try:
        assert _rows(store, "host_samples") == 200
        group = _old_host_batches()
        acks = _resend(store, [group[2:], group[:2]])
        assert [a.status for a in acks] == [pb.Ack.DUPLICATE] * 4
        assert _rows(store, "host_samples") == 200
        assert _markers(store, "host_samples") == 0
    finally:
        store.close()


def test_an_older_collectors_record_still_makes_a_duplicate(tmp_path: Path) -> None:
    """A record written after the rows by an older collector (no token, no landed column given) is a
    stored batch: its resend is a duplicate, with no settling."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        (old,) = _steps_batches(1, 5)
        store.insert("steps", ingest.with_job_id([old]), dedup_token=old.dedup_token)
        record = pa.table(
            {
                "agent_id": ["agent-g"],
                "seq": pa.array([0], pa.uint64()),
                "part": pa.array([0], pa.uint64()),
                "table_name": ["steps"],
                "rows": pa.array([5], pa.uint64()),
                "job_id": ["job-1"],
            }
        )
        store.insert("ingest_batches", record)
        (ack,) = ingest.write_group(store, [old])
        assert isinstance(ack, pb.Ack) and (ack.status, ack.rows) == (pb.Ack.DUPLICATE, 5)
        assert _step_rows(store) == (5, 5)
    finally:
        store.close()


def _steps_batches_4x50() -> list[ingest.Decoded]:
    return _steps_batches(4, 50)


def test_the_writer_makes_no_insert_more_per_group_and_the_next_record_settles_the_last(
    tmp_path: Path,
) -> None:
    """Per group: the record, then one insert per table, as before records came first; the group's
    inserts are written down as landed by the next group's record, so a duplicate of them reaching a
    new collector is answered from the store, with no marker."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    inserts: list[tuple[str, int]] = []
    real_insert = store.insert

    def counting(table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        inserts.append((table, data.num_rows))
        real_insert(table, data, dedup_token=dedup_token)

    store.insert = counting  # type: ignore[method-assign]  # the real store, its calls counted
    mixed = [
        ingest.decode(batch(table, sample(table, n=3, salt=s), seq=s, agent_id=f"agent-{table}"))
        for s in (1, 2)
        for table in ("steps", "phases")
    ]
    writer = ingest_record.Groups()  # what the collector's writer keeps between its groups
    try:
        acks = [a for g in (mixed[:2], mixed[2:]) for a in ingest.write_group(store, g, groups=writer)]
        assert [a.status for a in acks if isinstance(a, pb.Ack)] == [pb.Ack.STORED] * 4
        assert inserts == [("ingest_batches", 2), ("steps", 3), ("phases", 3)] * 2
        first = store.query("SELECT settled FROM ingest_batches WHERE seq = 2 AND agent_id = 'agent-steps'")
        assert len(first.column("settled")[0].as_py()) == 2  # the first group's two inserts, landed
        inserts.clear()
        again = ingest.write_group(store, mixed[:2], groups=ingest_record.Groups())  # nothing in memory
        assert [a.status for a in again if isinstance(a, pb.Ack)] == [pb.Ack.DUPLICATE] * 2
        assert inserts == []  # no marker: the settlement was found
    finally:
        store.close()
