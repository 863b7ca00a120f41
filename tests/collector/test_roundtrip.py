"""Batches of every wire table over real gRPC into a real `argus server` on chDB, read back."""

from __future__ import annotations

import pyarrow as pa
import pytest
from argus.collector.store import open_store

from argus.proto import collector_pb2 as pb
from argus.schema import wire_schema
from tests.collector.wire import batch, sample, stream

pytestmark = pytest.mark.slow


def _read_back(store_url: str, table: str) -> pa.Table:
    store = open_store(store_url, create=False)
    try:
        names = ", ".join(f"`{n}`" for n in wire_schema(table).names)
        return store.query(f"SELECT job_id, {names} FROM {table} ORDER BY job_id, start_ns, rank")
    finally:
        store.close()


def test_one_batch_round_trip(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    sent = sample("steps", n=7)
    acks = stream(server.grpc_target, [batch("steps", sent, seq=1, job_id="job-rt")])
    assert [(a.seq, a.status, a.rows) for a in acks] == [(1, pb.Ack.STORED, 7)]
    assert server.stop() == 0
    got = _read_back(server.store_url, "steps")
    assert got.column("job_id").to_pylist() == ["job-rt"] * 7
    assert got.drop_columns(["job_id"]).cast(wire_schema("steps")).equals(sent)
