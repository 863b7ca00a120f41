"""The server-wide budget of decoded batch bytes: live gRPC streams of ZSTD batches, and its order."""

from __future__ import annotations

import asyncio
import threading
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from argus import ipc_size
from argus.collector import ingest
from argus.collector.decoded_budget import DecodedBudget, batch_cost
from argus.collector.grpc_service import DECODE_ON_LOOP_BYTES, start_collector
from argus.config import ServerConfig
from argus.errors import InvalidBatch
from argus.ipc_size import declared_bytes, scan
from argus.memory import decoding_pool
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import open_store
from synthetic.bad_inputs import inflating_steps, zstd_ipc
from tests.collector.wire import batch, sample, stream

#: The budget of the live test, bytes: a little over two of its batches.
BUDGET_BYTES = 6 << 20


def test_compressed_batches_of_many_streams_hold_at_most_the_budget_until_written(tmp_path: Path) -> None:
    """Two agents stream ZSTD batches that decode to ~2.5 MiB each; the batches the server holds
    decoded and not yet written (counted beside the writer, from each batch's Arrow table) never
    pass the budget, and every batch is stored: the streams waited, nothing was refused."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(
        store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0", max_decoded_bytes=BUDGET_BYTES)
    )
    writer = server.servicer.writer
    held = {"now": 0, "peak": 0}
    submit = writer.submit_async

    def counted(decoded: Any) -> Any:  # the real writer, with the bytes it holds counted
        future = submit(decoded)
        size = decoded.data.nbytes
        held["now"] += size
        held["peak"] = max(held["peak"], held["now"])
        future.add_done_callback(lambda _: held.__setitem__("now", held["now"] - size))
        return future

    writer.submit_async = counted  # type: ignore[method-assign]
    payloads = [zstd_ipc(sample("steps", n=80_000, salt=k)) for k in range(12)]
    assert all(len(p) * 4 < declared_bytes(p) for p in payloads)  # compressed: they inflate
    acks: dict[str, list[pb.Ack]] = {}

    def agent(name: str) -> None:
        acks[name] = stream(
            server.address,
            (batch("steps", p, seq=k, agent_id=name) for k, p in enumerate(payloads)),
            timeout_s=120,
        )

    threads = [threading.Thread(target=agent, args=(f"agent-{n}",)) for n in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        for name, got in acks.items():
            assert [a.status for a in got] == [pb.Ack.STORED] * len(payloads), name
        assert len(acks) == 3
        rows = store.query("SELECT count() AS n FROM steps").column("n")[0].as_py()
        assert rows == 3 * 12 * 80_000
        budget = server.servicer.decoded
        assert held["peak"] <= budget.peak <= BUDGET_BYTES
        assert budget.held == 0 and budget.waited > 0
    finally:
        server.stop()
        store.close()


def test_refused_compressed_batches_of_many_streams_are_not_held_past_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six streams each send three ZSTD batches of a few kB that decode to 2.5 MiB and are refused
    once decoded: where they are decoded (an unknown column) or where the writer checks their
    values (a row ends before it starts). The decoded tables still alive (a weak reference to
    each, from its hand-off to the writer, or from its refusal at decoding, until collected)
    never pass the budget: a refusal waiting for its ack holds its message, not the frames that
    raised it with the rows in their locals (which kept every stream's refused batches alive past
    their charge: 40 MiB against a 6 MiB budget)."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(
        store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0", max_decoded_bytes=BUDGET_BYTES)
    )
    writer = server.servicer.writer
    alive = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def track(data: pa.Table) -> None:
        size = data.nbytes
        with lock:
            alive["now"] += size
            alive["peak"] = max(alive["peak"], alive["now"])
        weakref.finalize(data, gone, size)

    def gone(size: int) -> None:
        with lock:
            alive["now"] -= size

    submit, conform = writer.submit_async, ingest.conform

    def submitted(decoded: Any) -> Any:  # the real writer, the tables handed to it counted
        track(decoded.data)
        return submit(decoded)

    def conformed(table: str, data: pa.Table) -> pa.Table:  # the real check, the tables it refuses counted
        try:
            return conform(table, data)
        except InvalidBatch:
            track(data)
            raise

    writer.submit_async = submitted  # type: ignore[method-assign]
    monkeypatch.setattr(ingest, "conform", conformed)
    payloads = [inflating_steps(5 << 19, extra_column=k == 1) for k in range(3)]
    assert all(len(p) * 100 < declared_bytes(p) for p in payloads)
    acks: dict[str, list[pb.Ack]] = {}

    def agent(name: str) -> None:
        batches = (batch("steps", p, seq=k, agent_id=name) for k, p in enumerate(payloads))
        acks[name] = stream(server.address, batches, timeout_s=120)

    threads = [threading.Thread(target=agent, args=(f"agent-{n}",)) for n in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert len(acks) == 6
        for name, got in acks.items():
            assert [a.status for a in got] == [pb.Ack.REJECTED] * 3, name
            assert "steps.dur_ns: negative value -1" in got[0].message
            assert "steps: unknown column(s) bogus" in got[1].message
        assert alive["peak"] <= BUDGET_BYTES, alive
    finally:
        server.stop()
        store.close()


def test_a_small_payload_that_decodes_large_is_decoded_and_refused_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 kB ZSTD batches that decode to 4 MiB are decoded in a decoding thread, not on the
    collector's event loop (there, their decoding held every stream's acks: 10-400 ms per 32 MiB
    batch in bench/soak.py's bursts): the decision is what a batch costs decoded, not its payload.
    The one whose last row ends before it starts is refused there too, never handed to the writer,
    whose next group may be half a second away while it holds its charge."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0"))
    decode, where, handed, pools = ingest.decode, [], [], []
    submit = server.servicer.writer.submit_async

    def decoded_where(one: pb.Batch, pool: Any = None, walked: Any = None) -> ingest.Decoded:  # noted
        where.append(threading.current_thread().name)
        pools.append(pool)
        return decode(one, pool, walked)

    def submitted(decoded: Any) -> Any:  # the real writer, what it is handed noted
        handed.append(decoded.seq)
        return submit(decoded)

    monkeypatch.setattr(ingest, "decode", decoded_where)
    server.servicer.writer.submit_async = submitted  # type: ignore[method-assign]
    payloads = [inflating_steps(4 << 20, extra_column=k == 1) for k in range(2)]
    assert all(len(p) < DECODE_ON_LOOP_BYTES < batch_cost(scan(p)) for p in payloads)
    try:
        acks = stream(
            server.address, (batch("steps", p, seq=k + 1) for k, p in enumerate(payloads)), timeout_s=60
        )
        assert [a.status for a in acks] == [pb.Ack.REJECTED] * 2
        assert "ends before it starts" in acks[0].message or "dur_ns" in acks[0].message, acks[0].message
        assert len(where) == 2 and all(w.startswith("argus-decode") for w in where), where
        assert pools == [decoding_pool()] * 2  # pages given back when freed (argus/memory.py)
        assert handed == []
    finally:
        server.stop()
        store.close()


def test_streams_get_in_first_come_first_served_and_a_batch_over_the_budget_gets_in_alone() -> None:
    async def scenario() -> list[str]:
        budget = DecodedBudget(10)
        order: list[str] = []

        async def take(name: str, size: int) -> None:
            await budget.acquire(size)
            order.append(name)

        await take("a1", 6)
        a2 = asyncio.create_task(take("a2", 6))  # does not fit: waits
        await asyncio.sleep(0)
        b1 = asyncio.create_task(take("b1", 3))  # fits, but a2 came first
        c1 = asyncio.create_task(take("c1", 4))  # will be cancelled while waiting
        await asyncio.sleep(0)
        assert order == ["a1"] and budget.held == 6
        c1.cancel()
        budget.release(6)  # a1 written: a2 and then b1 get in, c1 is gone
        await asyncio.gather(a2, b1)
        assert budget.held == 9
        big = asyncio.create_task(take("big", 25))  # larger than the whole budget
        await asyncio.sleep(0)
        assert "big" not in order
        budget.release(6)
        budget.release(3)
        await big
        assert budget.held == 25 and budget.peak == 25
        return order

    assert asyncio.run(scenario()) == ["a1", "a2", "b1", "big"]


def test_a_batch_costs_its_payload_plus_what_it_declares_decoded() -> None:
    payload = zstd_ipc(sample("steps", n=10_000))
    assert batch_cost(scan(payload)) == len(payload) + declared_bytes(payload)
    assert batch_cost(scan(b"not arrow")) == len(b"not arrow")


def test_each_payload_is_walked_once_for_its_charge_and_its_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush's members, one a large batch decoded in a thread, and a lone batch, through the real
    collector: each record batch's metadata is read once (the walk that charges it is the one decoded)."""
    members = [
        batch(t, sample(t, n=50, salt=k), seq=k + 1, agent_id="node-w")
        for k, t in enumerate(("steps", "phases"))
    ]
    large = batch("steps", zstd_ipc(sample("steps", n=20_000, salt=9)), seq=3, agent_id="node-w")
    lone = batch("host_samples", sample("host_samples", n=20), seq=4, agent_id="node-w")
    messages = [pb.Batch(agent_id="node-w", seq=1, members=[*members, large]), lone]
    payloads = [*(m.arrow_ipc for m in members), large.arrow_ipc, lone.arrow_ipc]
    record_batches = sum(len(scan(p).batches) for p in payloads)
    assert batch_cost(scan(large.arrow_ipc)) > DECODE_ON_LOOP_BYTES  # decoded in a thread
    walked = ipc_size._declared
    read: list[int] = []
    monkeypatch.setattr(ipc_size, "_declared", lambda message: read.append(1) or walked(message))
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0"))
    try:
        acks = stream(server.address, messages, timeout_s=60)
    finally:
        server.stop()
        store.close()
    assert [a.status for a in acks] == [pb.Ack.STORED, pb.Ack.STORED]
    assert len(read) == record_batches
