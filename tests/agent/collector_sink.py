"""A minimal in-memory ``argus.v1.Collector`` over real gRPC, for the agent's own tests.

It decodes each batch's Arrow payload (a flush's members one by one) and keeps the rows
per table, deduplicating by (agent id, seq) like the real collector; it can be told to reject batches, or
to end the stream on some (as a collector failing to store them does).
End-to-end tests use the real ``argus server`` instead.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent import futures
from typing import Any

import grpc
import pyarrow as pa

from argus.proto import collector_pb2, collector_pb2_grpc
from argus.schema import wire_schema


class SinkServicer(collector_pb2_grpc.CollectorServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[tuple[str, int]] = set()
        self.tables: dict[str, list[pa.Table]] = defaultdict(list)
        self.batches: list[collector_pb2.Batch] = []
        self.reject: Any = None  # callable(batch) -> message or None
        self.fail: Any = None  # callable(batch) -> message: end the stream with INTERNAL, or None
        self.failed: list[int] = []  # seqs the stream ended on
        self.clock_skew_ns = 0
        self.received = 0
        self.stack_captures: list[collector_pb2.StackCapture] = []  # sent on every STORED ack

    def Stream(self, request_iterator: Any, context: Any) -> Any:
        for batch in request_iterator:
            self.received += 1
            if not batch.members:
                yield self._one(batch, context)
                continue
            # A flush: each member as a batch of its own, one Ack (docs/design.md §3).
            acks = [self._one(member, context) for member in batch.members]
            rows = sum(a.rows for a in acks)
            statuses = {a.status for a in acks}
            if collector_pb2.Ack.REJECTED in statuses:
                yield collector_pb2.Ack(
                    seq=batch.seq, status=collector_pb2.Ack.REJECTED, rows=rows, members=acks
                )
                continue
            both = statuses == {collector_pb2.Ack.DUPLICATE}
            yield collector_pb2.Ack(
                seq=batch.seq,
                status=collector_pb2.Ack.DUPLICATE if both else collector_pb2.Ack.STORED,
                rows=rows,
                stack_captures=list(self.stack_captures) if not both else [],
            )

    def _one(self, batch: collector_pb2.Batch, context: Any) -> collector_pb2.Ack:
        """The Ack of one batch (alone or a flush's member); ends the stream as ``fail`` says."""
        key = (batch.agent_id, batch.seq)
        with self.lock:
            if key in self.seen:
                return collector_pb2.Ack(seq=batch.seq, status=collector_pb2.Ack.DUPLICATE)
        name = collector_pb2.Table.Name(batch.table).lower()
        broken = self.fail(batch) if self.fail else None
        if broken is not None:
            self.failed.append(batch.seq)
            context.abort(grpc.StatusCode.INTERNAL, broken)
        reason = self.reject(batch) if self.reject else None
        if reason is None:
            try:
                data = pa.ipc.open_stream(batch.arrow_ipc).read_all()
                if not data.schema.equals(wire_schema(name)):
                    reason = f"schema of {name} differs"
            except Exception as exc:
                reason = str(exc)
        if reason is not None:
            return collector_pb2.Ack(
                seq=batch.seq, status=collector_pb2.Ack.REJECTED, code="INVALID_ARGUMENT", message=reason
            )
        with self.lock:
            self.seen.add(key)
            self.batches.append(batch)
            self.tables[name].append(data.append_column("job_id", pa.array([batch.job_id] * data.num_rows)))
        return collector_pb2.Ack(
            seq=batch.seq,
            status=collector_pb2.Ack.STORED,
            rows=data.num_rows,
            stack_captures=list(self.stack_captures),
        )

    def Clock(self, request: Any, context: Any) -> Any:
        return collector_pb2.ClockReply(
            agent_send_ns=request.agent_send_ns, server_ns=time.time_ns() + self.clock_skew_ns
        )

    def table(self, name: str) -> pa.Table:
        with self.lock:
            parts = list(self.tables.get(name, []))
        if not parts:
            schema = wire_schema(name).append(pa.field("job_id", pa.string()))
            return schema.empty_table()
        return pa.concat_tables(parts)


class Sink:
    """A running sink server on 127.0.0.1 (``port`` 0 = ephemeral)."""

    def __init__(self, port: int = 0) -> None:
        self.servicer = SinkServicer()
        self._port = port
        self.server: Any = None
        self.start()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        collector_pb2_grpc.add_CollectorServicer_to_server(self.servicer, self.server)
        self._port = self.server.add_insecure_port(f"127.0.0.1:{self._port}")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def stop(self) -> None:
        self.server.stop(grace=None)

    def table(self, name: str) -> pa.Table:
        return self.servicer.table(name)
