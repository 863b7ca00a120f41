"""The collector's writer thread against real chDB: batches from many threads, in groups, then close."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from argus.collector import ingest
from argus.collector.writer import BatchWriter
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import Store, open_store
from tests.collector.wire import batch, sample


def test_many_threads_each_get_their_own_acks(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    metrics = Metrics()
    writer = BatchWriter(store, metrics, max_group=8)
    acks: dict[int, list[pb.Ack]] = {}

    def agent(n: int) -> None:
        acks[n] = []
        for seq in range(6):
            decoded = ingest.decode(
                batch("steps", sample("steps", n=10, salt=seq), seq=seq, agent_id=f"agent-{n}")
            )
            acks[n].append(writer.write(decoded))
        # A retry of an acknowledged batch.
        acks[n].append(
            writer.write(ingest.decode(batch("steps", sample("steps", n=10), seq=0, agent_id=f"agent-{n}")))
        )

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        for n in range(4):
            assert [(a.seq, a.status) for a in acks[n]] == [(s, pb.Ack.STORED) for s in range(6)] + [
                (0, pb.Ack.DUPLICATE)
            ]
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 4 * 6 * 10
        stored = metrics.registry.get_sample_value(
            "argus_ingest_batches_total", {"table": "steps", "status": "stored"}
        )
        assert stored == 24
    finally:
        assert writer.close(60)
        store.close()


def test_after_close_batches_are_refused_not_lost(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    writer = BatchWriter(store)
    pending = [writer.submit(ingest.decode(batch("steps", sample("steps"), seq=s))) for s in range(5)]
    assert writer.close(60)
    # Submitted before close: stored.
    assert [f.result(0).status for f in pending] == [pb.Ack.STORED] * 5
    with pytest.raises(StoreError, match="shutting down"):
        writer.submit(ingest.decode(batch("steps", sample("steps"), seq=9)))
    assert store.query("SELECT count() AS n FROM ingest_batches").column("n")[0].as_py() == 5
    store.close()


def test_a_batch_whose_waiter_gave_up_is_stored_and_the_writer_goes_on(tmp_path: Path) -> None:
    # A stream that ends while its batch waits in the group cancels that batch's future: the
    # writer must still store it (it is in the group) and keep serving everyone else.
    store = open_store(f"chdb://{tmp_path / 'store'}")
    writer = BatchWriter(store)
    try:
        gone = writer.submit(ingest.decode(batch("steps", sample("steps", n=3), seq=1, agent_id="gone")))
        gone.cancel()
        later = writer.submit(ingest.decode(batch("steps", sample("steps", n=4, salt=2), seq=1))).result(60)
        assert later.status == pb.Ack.STORED and later.rows == 4
    finally:
        assert writer.close(60)
        store.close()


def test_an_event_loop_gets_each_outcome_on_its_own_future(tmp_path: Path) -> None:
    # submit_async: the loop's futures, settled on the loop; a cancelled one does not stop the rest.
    store = open_store(f"chdb://{tmp_path / 'store'}")
    writer = BatchWriter(store)

    async def agents() -> list[pb.Ack]:
        futures = [
            writer.submit_async(ingest.decode(batch("steps", sample("steps", n=3, salt=s), seq=s)))
            for s in range(6)
        ]
        futures[2].cancel()
        rest = futures[:2] + futures[3:]
        return list(await asyncio.wait_for(asyncio.gather(*rest), 60))

    try:
        acks = asyncio.run(agents())
        assert [(a.seq, a.status, a.rows) for a in acks] == [(s, pb.Ack.STORED, 3) for s in (0, 1, 3, 4, 5)]
        # The cancelled batch was in its group: stored too.
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 18
    finally:
        assert writer.close(60)
        store.close()


def _steps_batches(count: int, rows: int, poison_seq: int | None = None) -> list[ingest.Decoded]:
    """``count`` batches of ``rows`` distinct steps each; ``poison_seq``'s last row has step 666666."""
    out = []
    for seq in range(count):
        data = sample("steps", n=rows, salt=seq * rows)
        steps = pa.array(range(seq * rows, (seq + 1) * rows), data.schema.field("step").type)
        if seq == poison_seq:
            steps = pa.array([*steps.to_pylist()[:-1], 666_666], steps.type)
        data = data.set_column(data.schema.get_field_index("step"), "step", steps)
        out.append(ingest.decode(batch("steps", data, seq=seq, agent_id="agent-g")))
    return out


def _step_rows(store: Store) -> tuple[int, int]:
    """Rows of ``steps`` and distinct (rank, step) pairs among them."""
    found = store.query("SELECT count() AS n, uniqExact(rank, step) AS u FROM steps").to_pylist()[0]
    return int(found["n"]), int(found["u"])


def test_a_group_insert_failing_part_way_stores_nothing_so_a_regrouped_retry_stores_once(
    tmp_path: Path,
) -> None:
    """A real store error in a later block of one group insert (a CHECK constraint the last batch
    breaks) leaves none of the group's rows stored; the same batches resent in other groups (other
    tokens) are then stored exactly once. The store commits a block every 500 rows here, as a server
    whose profile lowers ``min_insert_block_size_rows`` does (by default: about every million rows)."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        store.command("SET min_insert_block_size_rows = 500")
        store.command("ALTER TABLE steps ADD CONSTRAINT poison CHECK step != 666666")
        group = _steps_batches(8, 400, poison_seq=7)
        outcomes = ingest.write_group(store, group)
        assert all(isinstance(o, StoreError) for o in outcomes), outcomes
        assert _step_rows(store) == (0, 0)  # before: the blocks ahead of the bad one stayed stored
        store.command("ALTER TABLE steps DROP CONSTRAINT poison")  # the store recovers
        for regrouped in (group[:3], group[3:5], group[5:]):
            acks = ingest.write_group(store, regrouped)
            assert [a.status for a in acks if isinstance(a, pb.Ack)] == [pb.Ack.STORED] * len(regrouped)
        assert _step_rows(store) == (8 * 400, 8 * 400)
    finally:
        store.close()


def test_a_group_whose_record_fails_stores_nothing_and_is_stored_once_when_resent(tmp_path: Path) -> None:
    """The group's ``ingest_batches`` insert fails (a real constraint on it): it comes before the data,
    so nothing is stored and nothing acknowledged; resent in another grouping, the batches are stored
    once, and again they are duplicates."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        store.command("ALTER TABLE ingest_batches ADD CONSTRAINT down CHECK agent_id != 'agent-g'")
        group = _steps_batches(4, 50)
        outcomes = ingest.write_group(store, group)
        assert all(isinstance(o, StoreError) for o in outcomes), outcomes
        assert _step_rows(store) == (0, 0)
        store.command("ALTER TABLE ingest_batches DROP CONSTRAINT down")
        for regrouped in (group[:1], group[1:]):
            acks = ingest.write_group(store, regrouped)
            assert [a.status for a in acks if isinstance(a, pb.Ack)] == [pb.Ack.STORED] * len(regrouped)
        assert _step_rows(store) == (4 * 50, 4 * 50)
        again = ingest.write_group(store, group)
        assert [a.status for a in again if isinstance(a, pb.Ack)] == [pb.Ack.DUPLICATE] * 4
    finally:
        store.close()


#: A collector process that dies (``os._exit``) the moment a group's rows are in: before anything
#: records them as stored (docs/design.md §3: the record of the group comes before them, the
#: settlement that says they are in after).
_DIES_BEFORE_THE_RECORD = """
import os, sys
from argus.collector import ingest
from argus.store import open_store
from tests.collector.test_writer import _steps_batches
store = open_store(sys.argv[1])
real = store.insert
def insert(table, data, *, dedup_token=None):
    real(table, data, dedup_token=dedup_token)
    if table == "steps":
        os._exit(0)
store.insert = insert
ingest.write_group(store, _steps_batches(4, 50))
os._exit(3)
"""


def test_batches_resent_after_a_collector_died_before_recording_them_are_stored_once(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'store'}"
    died = subprocess.run([sys.executable, "-c", _DIES_BEFORE_THE_RECORD, url], timeout=120, check=False)
    assert died.returncode == 0
    store = open_store(url)
    try:
        assert _step_rows(store) == (4 * 50, 4 * 50)  # the rows are in; nothing says so
        group = _steps_batches(4, 50)
        for regrouped in (group[:1], group[1:]):  # the agents resend them to a new collector
            acks = ingest.write_group(store, regrouped)
            assert [a.status for a in acks if isinstance(a, pb.Ack)] == [pb.Ack.DUPLICATE] * len(regrouped)
        assert _step_rows(store) == (4 * 50, 4 * 50)
    finally:
        store.close()


class _HeldStore:
    """The real store, whose first data insert waits until :attr:`release` is set (the writer busy
    meanwhile), and which records the batches of each group (rows of each ``ingest_batches`` insert)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.entered, self.release = threading.Event(), threading.Event()
        self.groups: list[int] = []

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60)
        self.store.insert(table, data, dedup_token=dedup_token)
        if table == "ingest_batches":
            self.groups.append(data.num_rows)

    def query(self, sql: str, parameters: dict[str, object] | None = None) -> pa.Table:
        return self.store.query(sql, parameters)


def test_batches_arriving_together_wait_for_the_interval_and_go_in_one_group(tmp_path: Path) -> None:
    """After a group of several batches the next starts no sooner than the interval after it: the
    batches that come meanwhile, one by one, are one group (one insert per table), not one each."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    held = _HeldStore(store)
    writer = BatchWriter(cast(Store, held), interval_s=600.0)
    steps = _steps_batches(6, 10)
    try:
        first = writer.submit(steps[0])
        assert held.entered.wait(60)
        together = [writer.submit(d) for d in steps[1:3]]  # queued while the writer is busy
        held.release.set()
        assert [f.result(60).status for f in [first, *together]] == [pb.Ack.STORED] * 3
        later = [writer.submit(steps[3])]
        while not writer._queue.empty():  # the writer took it, and waits for the interval
            threading.Event().wait(0.01)
        later += [writer.submit(d) for d in steps[4:]]
    finally:
        assert writer.close(60)  # closing ends the wait: what is queued is stored at once
    try:
        assert [f.result(0).status for f in later] == [pb.Ack.STORED] * 3
        # Before: the writer took the fourth batch at once, alone: groups [1, 2, 1, 2].
        assert held.groups == [1, 2, 3]
        assert _step_rows(store) == (60, 60)
    finally:
        store.close()


def test_a_lone_client_is_answered_at_once(tmp_path: Path) -> None:
    """One batch at a time (a client that sends and waits) never waits for the interval."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    writer = BatchWriter(store, interval_s=600.0)
    try:
        for decoded in _steps_batches(3, 10):
            assert writer.submit(decoded).result(60).status == pb.Ack.STORED
    finally:
        assert writer.close(60)
        store.close()
