"""The collector's writer thread against real chDB: batches from many threads, in groups, then close."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from argus.collector import ingest
from argus.collector.writer import BatchWriter
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import open_store
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
