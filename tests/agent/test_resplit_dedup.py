"""A batch re-split after a too-large refusal keeps its deduplication identity: each part carries
its parent's (agent_id, seq) and a part index; on real gRPC, the real collector and chDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from argus.agent.spool import Spool
from argus.agent.uploader import Uploader, split_parts
from argus.collector import grpc_service, ingest
from argus.proto import collector_pb2 as pb
from tests.agent.chdb_collector import chdb_collector
from tests.agent.test_node_agent import wait_for
from tests.agent.test_uploader import steps
from tests.collector.wire import batch, stream


def part(data: object, agent_id: str, seq: int, parent_seq: int, index: int) -> pb.Batch:
    b = batch("steps", data, seq=seq, agent_id=agent_id)  # type: ignore[arg-type]
    b.parent.CopyFrom(pb.Batch.Parent(agent_id="parent-agent", seq=parent_seq, part=index))
    return b


def test_replayed_parts_are_duplicates_and_distinct_parts_are_all_stored(tmp_path: Path) -> None:
    rows = steps(0, 8)
    halves = [rows.slice(0, 4), rows.slice(4)]
    quarters = [rows.slice(4, 2), rows.slice(6)]  # the halves of part 3
    with chdb_collector(tmp_path) as collector:
        acks = stream(
            collector.address,
            [
                part(halves[0], "sender-1", 1, 5, 2),
                part(halves[1], "sender-1", 2, 5, 3),  # distinct parts: both stored
                part(halves[1], "sender-2", 9, 5, 3),  # the same part replayed by another agent
                part(quarters[1], "sender-2", 10, 5, 7),  # a part of a stored part
                part(rows, "sender-2", 11, 5, 1),  # their ancestor, the batch whole
                part(halves[0], "sender-2", 12, 6, 2),  # same rows, another parent: stored
            ],
        )
        assert [a.status for a in acks] == [pb.Ack.STORED, pb.Ack.STORED] + [pb.Ack.DUPLICATE] * 3 + [
            pb.Ack.STORED
        ]
        assert [a.seq for a in acks] == [1, 2, 9, 10, 11, 12]  # each ack names the sender's seq
        assert collector.rows("SELECT count() FROM steps") == [(12,)]
        recorded = collector.rows("SELECT agent_id, seq, part, rows FROM ingest_batches")
        assert sorted(recorded) == [
            ("parent-agent", 5, 2, 4),
            ("parent-agent", 5, 3, 4),
            ("parent-agent", 6, 2, 4),
        ]
        # A whole batch stored, then its parts (an agent that re-split it after the ack was lost).
        (whole,) = stream(collector.address, [batch("steps", steps(100, 6), seq=3, agent_id="a")])
        late = [part(steps(100 + 3 * i, 3), "b", 1 + i, 0, 2 + i) for i in range(2)]
        for b in late:
            b.parent.agent_id, b.parent.seq = "a", 3
        assert whole.status == pb.Ack.STORED
        assert [a.status for a in stream(collector.address, late)] == [pb.Ack.DUPLICATE] * 2
        assert collector.rows("SELECT count() FROM steps WHERE step >= 100") == [(6,)]


def test_a_batch_stored_whole_then_resplit_by_the_next_agent_is_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The collector takes messages of at most 4 MiB, under the agent's 16 MiB.
    monkeypatch.setattr(grpc_service, "MAX_MESSAGE_BYTES", 4 << 20)
    with chdb_collector(tmp_path) as collector:
        # A dead agent's batch of ~6 MiB was stored (by a collector with a larger limit) but its
        # ack was lost: it is still in that agent's spool.
        data = steps(0, 200_000)
        whole = batch("steps", data, seq=7, agent_id="dead-agent")
        whole.job_id = "job"
        ingest.ingest(collector.store, whole)
        spool = Spool(tmp_path / "spool", 1 << 30)
        spool.put("dead-agent", 7, data.num_rows, whole.SerializeToString())
        up = Uploader(collector.address, spool, "new-agent", flush_s=3600)
        up.start()
        try:
            wait_for(lambda: len(spool) == 0, timeout=60)  # refused as too large, re-split, acknowledged
            assert "RESOURCE_EXHAUSTED" in up.stats.last_error
            assert up.stats.batches_duplicate >= 2 and up.stats.batches_stored == 0
            assert collector.rows("SELECT count(), uniqExact(step) FROM steps") == [(200_000, 200_000)]
            # Fresh rows, split under the lowered limit, are all stored once.
            up.add("job", "steps", steps(200_000, 200_000))
            up.flush()
            wait_for(lambda: len(spool) == 0 and collector.rows("SELECT count() FROM steps") >= [(400_000,)])
            assert collector.rows("SELECT count(), uniqExact(step) FROM steps") == [(400_000, 400_000)]
        finally:
            up.close(1)


def test_split_parts_number_the_halves_in_heap_order() -> None:
    data = steps(0, 200_000)
    parts = split_parts(data, 1 << 20, part=3)
    assert sum(t.num_rows for _, t in parts) == 200_000 and len(parts) > 2
    for index, _ in parts:  # every part descends from 3
        assert index >> (index.bit_length() - 2) == 3
    assert len({i for i, _ in parts}) == len(parts)
