"""The node agent's upload path over real gRPC: spool, replay, acks, rejections, size splits, bounds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from argus.agent.spool import Spool
from argus.agent.uploader import HOLD_FLUSHES, Uploader, flush_due, split_rows
from argus.proto import collector_pb2
from argus.schema import wire_schema
from tests.agent.collector_sink import Sink


def steps(first: int, n: int, rank: int = 0) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "rank": [rank] * n,
            "step": list(range(first, first + n)),
            "start_ns": [1_000 * i for i in range(first, first + n)],
            "dur_ns": [10] * n,
        },
        schema=wire_schema("steps"),
    )


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()


def test_rows_arrive_once_with_offset_and_dropped_counts(sink: Sink, tmp_path: Path) -> None:
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-a", flush_s=0.1)
    up.start()
    up.count_dropped(7)
    up.add("job", "steps", steps(0, 5), clock_offset_ns=42)
    wait_for(lambda: sink.table("steps").num_rows == 5)
    up.close(2)
    batch = sink.servicer.batches[0]
    assert (batch.agent_id, batch.seq, batch.clock_offset_ns, batch.dropped_events) == ("agent-a", 1, 42, 7)
    assert len(up.spool) == 0 and up.stats.batches_stored == 1


def test_collector_down_then_up_replays_the_spool_exactly_once(tmp_path: Path) -> None:
    sink = Sink()
    address = sink.address
    sink.stop()
    up = Uploader(address, Spool(tmp_path, 1 << 30), "agent-b", flush_s=0.1)
    up.start()
    for i in range(10):
        up.add("job", "steps", steps(10 * i, 10))
        up.flush()
    time.sleep(0.5)
    assert len(up.spool) == 10  # nothing acknowledged: all spooled
    port = int(address.rsplit(":", 1)[1])
    sink = Sink(port)
    try:
        wait_for(lambda: len(up.spool) == 0)
        got = sink.table("steps")
        assert sorted(got["step"].to_pylist()) == list(range(100))
    finally:
        up.close(1)
        sink.stop()


def test_a_new_agent_replays_a_dead_agents_spool_under_its_id(sink: Sink, tmp_path: Path) -> None:
    down = Uploader("127.0.0.1:1", Spool(tmp_path, 1 << 30), "agent-old", flush_s=60)
    down.add("job", "steps", steps(0, 3))
    down.flush()
    assert len(down.spool) == 1
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-new", flush_s=0.1)
    up.start()
    try:
        wait_for(lambda: sink.table("steps").num_rows == 3)
        assert [(b.agent_id, b.seq) for b in sink.servicer.batches] == [("agent-old", 1)]
        wait_for(lambda: len(up.spool) == 0)
    finally:
        up.close(1)


def test_rejected_batch_is_logged_counted_and_not_retried(sink: Sink, tmp_path: Path) -> None:
    sink.servicer.reject = lambda b: "bad rows" if b.seq == 1 else None
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-c", flush_s=0.1)
    up.start()
    up.add("job", "steps", steps(0, 4))
    up.flush()
    up.add("job", "steps", steps(4, 4))
    wait_for(lambda: sink.table("steps").num_rows == 4)
    wait_for(lambda: len(up.spool) == 0)
    time.sleep(0.5)
    up.close(1)
    assert up.stats.batches_rejected == 1 and up.stats.rows_rejected == 4
    assert "bad rows" in up.stats.rejections[0]
    assert sink.servicer.received == 2  # the rejected one was sent once
    assert sink.servicer.batches[-1].dropped_events == 4  # and its rows reported as lost


def test_batches_are_split_under_the_message_limit(sink: Sink, tmp_path: Path) -> None:
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-d", flush_s=0.1, max_message_bytes=200_000)
    up.start()
    up.add("job", "steps", steps(0, 40_000))
    wait_for(lambda: sink.table("steps").num_rows == 40_000)
    up.close(1)
    assert len(sink.servicer.batches) > 4
    assert max(b.ByteSize() for b in sink.servicer.batches) <= 200_000


def test_full_spool_drops_oldest_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3_000)
    up = Uploader("127.0.0.1:1", spool, "agent-e", flush_s=60)
    for i in range(20):
        up.add("job", "steps", steps(i * 10, 10))
        up.flush()
    assert spool.size_bytes <= 3_000 and 0 < len(spool) < 20
    assert spool.dropped_rows == 10 * (20 - len(spool))
    # The next batch carries the count of what was lost.
    up.add("job", "steps", steps(999, 1))
    up.flush()
    last = max(spool.seqs("agent-e"))
    batch = collector_pb2.Batch.FromString(spool.read("agent-e", last) or b"")
    assert batch.dropped_events >= 10


def test_split_rows_keeps_every_row() -> None:
    data = steps(0, 10_000)
    parts = split_rows(data, 20_000)
    assert len(parts) > 1 and sum(p.num_rows for p in parts) == 10_000


def test_flush_due_holds_while_batches_are_unacknowledged() -> None:
    assert not flush_due(0.9, unacked=0, flush_s=1.0)
    assert flush_due(1.0, unacked=0, flush_s=1.0)
    assert not flush_due(1.0, unacked=3, flush_s=1.0)
    assert not flush_due(HOLD_FLUSHES - 0.01, unacked=3, flush_s=1.0)
    assert flush_due(HOLD_FLUSHES, unacked=3, flush_s=1.0)


def test_a_collector_that_does_not_acknowledge_gets_fewer_larger_batches(tmp_path: Path) -> None:
    # The collector is down: the first batch stays unacknowledged, so later rows wait for
    # HOLD_FLUSHES flush periods and go as one batch (flush_due), not one batch per period.
    flush_s = 0.5
    up = Uploader("127.0.0.1:1", Spool(tmp_path, 1 << 30), "agent-h", flush_s=flush_s)
    up.start()
    try:
        up.add("job", "steps", steps(0, 5))
        wait_for(lambda: len(up.spool) == 1)
        first = time.monotonic()
        for i in range(1, 4):
            up.add("job", "steps", steps(i * 10, 5))
            time.sleep(0.4 * flush_s)
        assert len(up.spool) == 1, "flushed again while the first batch was unacknowledged"
        wait_for(lambda: len(up.spool) == 2)
        assert time.monotonic() - first >= (HOLD_FLUSHES - 1) * flush_s
        batch = collector_pb2.Batch.FromString(up.spool.read("agent-h", 2) or b"")
        assert pa.ipc.open_stream(batch.arrow_ipc).read_all().num_rows == 15
        assert up.stats.flushes_held == 1
    finally:
        up.close(0)


def _timeslices(thread: threading.Thread) -> int:
    """Times ``thread`` was scheduled onto a CPU so far (a wake-up, or a preemption while it ran)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[2])


def test_the_flush_thread_sleeps_until_a_flush_can_be_due(sink: Sink, tmp_path: Path) -> None:
    # It polled flush_due ten times a flush period: an idle node agent woke ten times a second.
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-w", flush_s=1.0)
    up.start()
    try:
        assert up._flusher is not None
        up.add("job", "steps", steps(0, 4))
        wait_for(lambda: sink.table("steps").num_rows == 4)  # flushed after a period, acknowledged
        before = _timeslices(up._flusher)
        time.sleep(3.0)
        woke = _timeslices(up._flusher) - before
        assert woke <= 8, f"the flush thread woke {woke} times in 3 s with nothing to do"
        up.add("job", "steps", steps(4, 4))  # and still flushes within a period
        wait_for(lambda: sink.table("steps").num_rows == 8)
    finally:
        up.close(1)
