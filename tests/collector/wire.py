"""Test helpers: valid sample batches for every wire table and a plain gRPC client."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
import pyarrow as pa

from argus.collector.ingest import encode_arrow_ipc
from argus.config import MAX_MESSAGE_BYTES
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from synthetic.wire import T0_NS, sample

__all__ = ["T0_NS", "batch", "channel", "sample", "stream"]


def batch(
    table: str,
    data: pa.Table | bytes,
    *,
    seq: int,
    agent_id: str = "node-a-1700000000",
    job_id: str = "job-1",
    dropped_events: int = 0,
) -> pb.Batch:
    payload = data if isinstance(data, bytes) else encode_arrow_ipc(data)
    return pb.Batch(
        agent_id=agent_id,
        seq=seq,
        job_id=job_id,
        table=pb.Table.Value(table.upper()) if table else pb.TABLE_UNSPECIFIED,
        arrow_ipc=payload,
        dropped_events=dropped_events,
    )


def channel(target: str, *, root_cert: bytes | None = None) -> grpc.Channel:
    options = [
        ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if root_cert is not None:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_cert), options=options)
    return grpc.insecure_channel(target, options=options)


def stream(
    target: str,
    batches: Iterable[pb.Batch],
    *,
    metadata: Sequence[tuple[str, str]] | None = None,
    root_cert: bytes | None = None,
    timeout_s: float = 60.0,
) -> list[pb.Ack]:
    """Send ``batches`` on one Stream and return every Ack (raises grpc.RpcError if the stream fails)."""
    with channel(target, root_cert=root_cert) as ch:
        stub = pb_grpc.CollectorStub(ch)
        return list(stub.Stream(iter(list(batches)), metadata=metadata, timeout=timeout_s))
