"""The gRPC service in-process on a real chDB store: stream limits (issue 12, "Concurrency")."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.cli import build_parser
from argus.collector.grpc_service import start_collector
from argus.config import DEFAULT_MAX_STREAMS, ServerConfig
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.store import open_store
from tests.collector.wire import batch, channel, sample, stream


def _steps(store, job_id: str) -> int:  # type: ignore[no-untyped-def]
    q = "SELECT count() AS n FROM steps WHERE job_id = {j:String}"
    return int(store.query(q, {"j": job_id}).column("n")[0].as_py())


def test_streams_past_the_limit_are_refused_with_unavailable_and_the_agent_retries(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0", max_streams=2))
    release = threading.Event()
    acks: list[pb.Ack] = []

    def held_open(agent: str) -> Iterator[pb.Batch]:
        yield batch("steps", sample("steps"), seq=1, agent_id=agent)
        release.wait(60)

    def agent(name: str) -> None:
        with channel(server.address) as ch:
            acks.extend(pb_grpc.CollectorStub(ch).Stream(held_open(name), timeout=60))

    holders = [threading.Thread(target=agent, args=(f"node-{n}",)) for n in range(2)]
    up = Uploader(server.address, Spool(tmp_path / "spool", 1 << 30), "node-agent", flush_s=3600)
    try:
        for t in holders:
            t.start()
        deadline = time.monotonic() + 60
        while len(acks) < 2 and time.monotonic() < deadline:  # both streams open and served
            time.sleep(0.05)
        assert len(acks) == 2
        # A third stream: refused at once, the limit named, nothing of it written.
        late = [batch("steps", sample("steps"), seq=1, agent_id="node-late", job_id="job-late")]
        with pytest.raises(grpc.RpcError) as raised:
            stream(server.address, late, timeout_s=20)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "max_streams" in raised.value.details() and "2 agent streams" in raised.value.details()
        assert _steps(store, "job-late") == 0
        # A real node agent refused the same way keeps its batch and its message size, and retries.
        size = up.max_message_bytes
        up.start()
        up.add("job-agent", "steps", sample("steps"))
        up.flush()
        while "max_streams" not in up.stats.last_error and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "UNAVAILABLE" in up.stats.last_error and "max_streams" in up.stats.last_error
        assert up.max_message_bytes == size and up.pending_batches() == 1
    finally:
        release.set()
        for t in holders:
            t.join(60)
    try:
        assert [a.status for a in acks] == [pb.Ack.STORED] * 2
        # With the held streams closed, the agent's retry is served (its back-off is at most 5 s).
        assert up.drain(30) and up.stats.batches_stored == 1
        assert _steps(store, "job-agent") == sample("steps").num_rows
        # And so is a new stream.
        assert [a.status for a in stream(server.address, [batch("steps", sample("steps"), seq=2)])] == [
            pb.Ack.STORED
        ]
    finally:
        # Closed whatever failed: chDB holds one engine path per process, a store left open fails
        # every later test's store.
        up.close()
        server.stop(5)
        store.close()


def test_argus_server_takes_max_streams() -> None:
    args = build_parser().parse_args(["server", "--max-streams", "3"])
    assert ServerConfig.from_args(args).max_streams == 3
    args = build_parser().parse_args(["server"])
    assert ServerConfig.from_args(args).max_streams == DEFAULT_MAX_STREAMS >= 2000


def test_a_stream_reads_ahead_at_most_its_byte_budget() -> None:
    from argus.collector.grpc_service import _Budget

    async def run() -> None:
        budget = _Budget(max_bytes=100)
        await budget.reserve(60)
        second = asyncio.create_task(budget.reserve(60))
        await asyncio.sleep(0.2)
        assert not second.done()  # 120 bytes would be past the budget: it waits
        await budget.release(60)
        await asyncio.wait_for(second, 5)
        await budget.release(60)
        await asyncio.wait_for(budget.reserve(500), 5)  # one batch larger than the budget, when none held

    asyncio.run(run())
