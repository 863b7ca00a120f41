"""The gRPC service in-process on a real chDB store: stream limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from argus.collector.grpc_service import start_collector
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.store import open_store
from tests.collector.wire import batch, channel, sample, stream


def test_streams_past_the_thread_limit_are_refused_not_parked(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    server = start_collector(store, Metrics(), "127.0.0.1:0", max_workers=2)
    release = threading.Event()
    acks: list[pb.Ack] = []

    def held_open(agent: str) -> Iterator[pb.Batch]:
        yield batch("steps", sample("steps"), seq=1, agent_id=agent)
        release.wait(60)

    def agent(name: str) -> None:
        with channel(server.address) as ch:
            acks.extend(pb_grpc.CollectorStub(ch).Stream(held_open(name), timeout=60))

    holders = [threading.Thread(target=agent, args=(f"node-{n}",)) for n in range(2)]
    try:
        for t in holders:
            t.start()
        deadline = time.monotonic() + 60
        while len(acks) < 2 and time.monotonic() < deadline:  # both streams open and served
            time.sleep(0.05)
        assert len(acks) == 2
        with pytest.raises(grpc.RpcError) as raised:
            stream(
                server.address, [batch("steps", sample("steps"), seq=1, agent_id="node-late")], timeout_s=20
            )
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        release.set()
        for t in holders:
            t.join(60)
    assert [a.status for a in acks] == [pb.Ack.STORED] * 2
    # With the streams closed, a new one is served.
    assert [a.status for a in stream(server.address, [batch("steps", sample("steps"), seq=2)])] == [
        pb.Ack.STORED
    ]
    server.stop(5)
    store.close()
