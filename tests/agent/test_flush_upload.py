"""The node agent sends a flush as one message (``Batch.members``, docs/design.md §3): on real gRPC, the
real collector and chDB; a flush too large for the collector goes again as its members (parts when
still too large), stored once even when it was stored whole before its ack was lost; a collector that
does not know flushes gets each batch alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.collector import grpc_service, ingest
from argus.proto import collector_pb2 as pb
from tests.agent.chdb_collector import chdb_collector
from tests.agent.test_node_agent import wait_for
from tests.agent.test_uploader import steps

JOBS = ("job-a", "job-b", "job-c")


def _steps_by_job(collector: object) -> list[tuple[object, ...]]:
    return collector.rows(  # type: ignore[attr-defined, no-any-return]
        "SELECT job_id, count(), uniqExact(step) FROM steps GROUP BY job_id ORDER BY job_id"
    )


def test_a_flush_of_several_batches_is_one_message_and_one_ack(tmp_path: Path) -> None:
    with chdb_collector(tmp_path) as collector:
        spool = Spool(tmp_path / "spool", 1 << 30)
        up = Uploader(collector.address, spool, "agent-f", flush_s=3600)
        up.start()
        try:
            for i, job in enumerate(JOBS):
                up.add(job, "steps", steps(100 * i, 10 + i))
            assert up.flush() == 3
            (seq,) = spool.seqs("agent-f")  # one message spooled, under its first member's seq
            message = pb.Batch.FromString(spool.read("agent-f", seq) or b"")
            assert [(m.job_id, m.seq) for m in message.members] == [(j, seq + i) for i, j in enumerate(JOBS)]
            wait_for(lambda: len(spool) == 0, timeout=60)
            assert (up.stats.batches_spooled, up.stats.batches_stored, up.stats.rows_stored) == (1, 1, 33)
            assert _steps_by_job(collector) == [("job-a", 10, 10), ("job-b", 11, 11), ("job-c", 12, 12)]
        finally:
            up.close(1)


def test_a_flush_stored_whole_then_refused_as_too_large_is_resent_as_its_members_and_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The collector takes messages of at most 4 MiB, under the agent's 16 MiB.
    monkeypatch.setattr(grpc_service, "MAX_MESSAGE_BYTES", 4 << 20)
    with chdb_collector(tmp_path) as collector:
        # A dead agent's flush of three ~1.6 MiB batches (one per job) was stored whole (by a
        # collector with a larger limit) but its ack was lost: it is still in that agent's spool.
        members = []
        for i, job in enumerate(JOBS):
            member = pb.Batch(
                agent_id="dead-agent",
                seq=7 + i,
                job_id=job,
                table=pb.STEPS,
                arrow_ipc=ingest.encode_arrow_ipc(steps(100_000 * i, 50_000)),
            )
            assert ingest.ingest(collector.store, member).status == pb.Ack.STORED
            members.append(member)
        flush = pb.Batch(agent_id="dead-agent", seq=7, members=members)
        assert flush.ByteSize() > 4 << 20
        spool = Spool(tmp_path / "spool", 1 << 30)
        spool.put("dead-agent", 7, 150_000, flush.SerializeToString())
        up = Uploader(collector.address, spool, "new-agent", flush_s=3600)
        up.start()
        try:
            wait_for(lambda: len(spool) == 0, timeout=60)  # refused, re-split into its members, duplicates
            assert "RESOURCE_EXHAUSTED" in up.stats.last_error
            assert up.stats.batches_duplicate == 3 and up.stats.batches_stored == 0
            assert _steps_by_job(collector) == [(job, 50_000, 50_000) for job in JOBS]
            # Fresh rows: a flush under the lowered limit, all stored once.
            for i, job in enumerate(JOBS):
                up.add(job, "steps", steps(1_000_000 + 100_000 * i, 50_000))
            up.flush()
            wait_for(lambda: len(spool) == 0, timeout=60)
            assert _steps_by_job(collector) == [(job, 100_000, 100_000) for job in JOBS]
        finally:
            up.close(1)


def test_a_collector_that_refuses_a_flush_whole_gets_each_batch_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An older collector: no flushes, so a flush is a batch of no job and no table, refused whole.
    monkeypatch.setattr(grpc_service.ingest, "flush_members", lambda batch: ())
    with chdb_collector(tmp_path) as collector:
        spool = Spool(tmp_path / "spool", 1 << 30)
        up = Uploader(collector.address, spool, "agent-f", flush_s=3600)
        up.start()
        try:
            for i, job in enumerate(JOBS):
                up.add(job, "steps", steps(100 * i, 10))
            up.flush()
            wait_for(lambda: len(spool) == 0, timeout=60)
            assert not up.flushes and up.stats.rows_rejected == 0
            assert up.stats.batches_stored == 3
            for i, job in enumerate(JOBS):
                up.add(job, "steps", steps(100 * i + 50, 10))
            up.flush()
            wait_for(lambda: len(spool) == 0, timeout=60)
            assert up.stats.batches_stored == 6 and up.stats.rows_rejected == 0
            assert _steps_by_job(collector) == [(job, 20, 20) for job in JOBS]
        finally:
            up.close(1)
