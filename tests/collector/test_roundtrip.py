"""Batches over real gRPC into a real `argus server` on chDB, read back after it stops."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest

from argus.config import MAX_MESSAGE_BYTES
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.schema import WIRE_TABLES, wire_schema
from argus.store import open_store
from tests.collector.bad_batches import bad_batches
from tests.collector.wire import batch, channel, sample, stream

pytestmark = pytest.mark.slow


def read_back(store_url: str, sql: str) -> pa.Table:
    """Run ``sql`` on a stopped server's store (chDB: one process per data dir)."""
    store = open_store(store_url, create=False)
    try:
        return store.query(sql)
    finally:
        store.close()


def read_table(store_url: str, table: str, job_id: str) -> pa.Table:
    names = ", ".join(f"`{n}`" for n in wire_schema(table).names)
    got = read_back(store_url, f"SELECT {names} FROM {table} WHERE job_id = '{job_id}' ORDER BY {names}")
    return got.cast(wire_schema(table))


def test_every_wire_table_round_trips_and_survives_a_restart(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    sent = {table: sample(table, n=6, salt=i) for i, table in enumerate(sorted(WIRE_TABLES))}
    batches = [batch(t, data, seq=i, job_id="job-rt") for i, (t, data) in enumerate(sent.items())]
    acks = stream(server.grpc_target, batches)
    assert [(a.seq, a.status, a.rows) for a in acks] == [(i, pb.Ack.STORED, 6) for i in range(len(sent))]

    server.restart()
    # The dedup record survived too: a retry of an old batch is a duplicate.
    again = stream(server.grpc_target, [batches[0]])
    assert [(a.status, a.rows) for a in again] == [(pb.Ack.DUPLICATE, 6)]
    assert server.stop() == 0

    for table, data in sent.items():
        assert read_table(server.store_url, table, "job-rt").equals(data), table
    # Restarting again on the same data dir works (the reader released it).
    server.start()


def test_clock_answers_with_the_server_time(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    with channel(server.grpc_target) as ch:
        before = time.time_ns()
        reply = pb_grpc.CollectorStub(ch).Clock(pb.ClockRequest(agent_send_ns=42), timeout=10)
        after = time.time_ns()
    assert reply.agent_send_ns == 42
    assert before <= reply.server_ns <= after


def test_a_duplicate_is_acknowledged_and_stored_once(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    b = batch("kernel_events", sample("kernel_events", n=10), seq=7, job_id="job-dup")
    # A retry after a lost ack: once on the same stream, once on a new one.
    first = stream(server.grpc_target, [b, b])
    second = stream(server.grpc_target, [b])
    statuses = [a.status for a in first + second]
    assert statuses == [pb.Ack.STORED, pb.Ack.DUPLICATE, pb.Ack.DUPLICATE]
    assert all(a.rows == 10 for a in first + second)
    # The same agent id with new sequence numbers, and a restarted agent (new id, seq from 0).
    more = stream(
        server.grpc_target,
        [
            batch("kernel_events", sample("kernel_events", n=3, salt=50), seq=8, job_id="job-dup"),
            batch(
                "kernel_events", sample("kernel_events", n=4, salt=60), seq=0, job_id="job-dup", agent_id="b"
            ),
        ],
    )
    assert [a.status for a in more] == [pb.Ack.STORED, pb.Ack.STORED]
    assert server.stop() == 0
    assert read_table(server.store_url, "kernel_events", "job-dup").num_rows == 17


def test_bad_batches_are_rejected_and_the_stream_goes_on(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    bad = bad_batches(seq0=100)
    good = sample("steps", n=3)
    batches: list[pb.Batch] = []
    for i, (_, b, _) in enumerate(bad):
        batches += [b, batch("steps", good.set_column(0, "rank", pa.array([i] * 3, pa.uint32())), seq=i)]
    acks = stream(server.grpc_target, batches)
    assert len(acks) == len(batches)
    for (case, b, fragment), rejected, stored in zip(bad, acks[0::2], acks[1::2], strict=True):
        assert (rejected.seq, rejected.status, rejected.code) == (
            b.seq,
            pb.Ack.REJECTED,
            "INVALID_ARGUMENT",
        ), case
        assert fragment in rejected.message, (case, rejected.message)
        assert stored.status == pb.Ack.STORED, case
    assert server.stop() == 0
    recorded = read_back(server.store_url, "SELECT seq FROM ingest_batches ORDER BY seq").column("seq")
    assert recorded.to_pylist() == list(range(len(bad)))
    for table in sorted(WIRE_TABLES):
        count = read_back(server.store_url, f"SELECT count() AS n FROM {table}").column("n")[0].as_py()
        assert count == (3 * len(bad) if table == "steps" else 0), table


def test_a_message_over_the_limit_ends_its_stream_and_the_next_is_served(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    huge = batch("steps", b"\0" * (MAX_MESSAGE_BYTES + 1), seq=1)
    with pytest.raises(grpc.RpcError) as raised:
        stream(server.grpc_target, [huge])
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    acks = stream(server.grpc_target, [batch("steps", sample("steps"), seq=2)])
    assert [a.status for a in acks] == [pb.Ack.STORED]
    assert server.stop() == 0
    assert read_back(server.store_url, "SELECT seq FROM ingest_batches").column("seq").to_pylist() == [2]


def test_sigterm_mid_stream_keeps_every_acknowledged_batch(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    acked: list[pb.Ack] = []
    errors: list[grpc.RpcError] = []
    data = sample("steps", n=2000)

    def batches() -> Iterator[pb.Batch]:
        for seq in range(100_000):
            yield batch("steps", data, seq=seq, job_id="job-term")

    def send() -> None:
        with channel(server.grpc_target) as ch:
            try:
                for ack in pb_grpc.CollectorStub(ch).Stream(batches(), timeout=120):
                    acked.append(ack)
            except grpc.RpcError as exc:
                errors.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 60
    while len(acked) < 20 and time.monotonic() < deadline and sender.is_alive():
        time.sleep(0.01)
    assert len(acked) >= 20, server.logs()
    assert server.stop(sig=signal.SIGTERM) == 0
    sender.join(30)
    assert not sender.is_alive()
    assert errors and errors[0].code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert all(a.status == pb.Ack.STORED for a in acked)
    stored = read_back(server.store_url, "SELECT seq, rows FROM ingest_batches ORDER BY seq")
    acked_seqs = {a.seq for a in acked}
    assert acked_seqs <= set(stored.column("seq").to_pylist())
    rows = read_back(server.store_url, "SELECT count() AS n FROM steps").column("n")[0].as_py()
    assert rows == 2000 * stored.num_rows >= 2000 * len(acked_seqs)
    print(f"acked {len(acked)}, stored {stored.num_rows}, stream ended with {errors[0].code()}")


def test_concurrent_streams_from_many_agents(argus_server_factory) -> None:
    """Several agents at once (the chDB deadlock of two threads in one connection stays fixed)."""
    server = argus_server_factory("--no-analyzer")
    results: dict[int, list[pb.Ack]] = {}

    def agent(n: int) -> None:
        batches = [
            batch(
                "kernel_events",
                sample("kernel_events", n=500, salt=s),
                seq=s,
                agent_id=f"node-{n}",
                job_id="j",
            )
            for s in range(8)
        ]
        results[n] = stream(server.grpc_target, batches)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(6))
    for acks in results.values():
        assert [(a.seq, a.status, a.rows) for a in acks] == [(s, pb.Ack.STORED, 500) for s in range(8)]
    assert server.stop() == 0
    assert read_table(server.store_url, "kernel_events", "j").num_rows == 6 * 8 * 500
