"""The ingest path: one gRPC ``Batch`` → validated Arrow columns → one insert, exactly once.

Everything here works on whole Arrow columns (pyarrow compute), never on single
events in Python: decode the IPC stream (zero-copy), check it against
:func:`argus.schema.wire_schema`, add ``job_id`` as a one-entry dictionary column,
insert with ``insert_deduplication_token = "{agent_id}:{seq}"``.

Deduplication (DESIGN §3): every stored batch is recorded in ``ingest_batches``;
a batch whose ``(agent_id, seq)`` is found there is acknowledged as a duplicate
without touching its table. The record is written *after* the data, so a crash
between the two makes the retry insert again with the same token, and
ClickHouse's token deduplication drops it: the table holds the rows once either
way. The same token also covers two collectors racing on one retried batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from argus.collector.metrics import Metrics
from argus.collector.store import Store

from argus.errors import InvalidBatch
from argus.proto import collector_pb2 as pb
from argus.schema import WIRE_TABLES, wire_schema

__all__ = [
    "TABLE_BY_ENUM",
    "Decoded",
    "already_stored",
    "decode",
    "encode_arrow_ipc",
    "ingest",
    "validate_columns",
]

#: Wire table name by ``argus.v1.Table`` enum value (TABLE_UNSPECIFIED is absent).
TABLE_BY_ENUM: dict[int, str] = {pb.Table.Value(name.upper()): name for name in WIRE_TABLES}

#: Columns that must hold no negative value (durations, ns).
_NON_NEGATIVE = ("dur_ns",)


@dataclass(frozen=True)
class Decoded:
    """A batch ready to insert: ``data`` has the wire columns in schema order plus ``job_id``."""

    table: str
    data: pa.Table
    dedup_token: str


def encode_arrow_ipc(data: pa.Table | pa.RecordBatch) -> bytes:
    """Serialize ``data`` as an Arrow IPC *stream*: the form of ``Batch.arrow_ipc``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def _read_ipc(payload: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise InvalidBatch(f"arrow_ipc: not a readable Arrow IPC stream ({exc})") from exc


def validate_columns(table: str, data: pa.Table) -> pa.Table:
    """Check ``data`` against the wire schema of ``table``; return it in schema column order.

    Checks, each naming the column: every wire column present and no other, the
    exact Arrow type (expected vs got), no nulls (also inside list columns), no
    negative ``dur_ns``, at least one row.

    Raises:
        InvalidBatch: the first problem found.
    """
    schema = wire_schema(table)
    got = set(data.column_names)
    missing = [name for name in schema.names if name not in got]
    if missing:
        raise InvalidBatch(f"{table}: missing column(s) {', '.join(missing)}")
    extra = sorted(got - set(schema.names))
    if extra:
        raise InvalidBatch(f"{table}: unknown column(s) {', '.join(extra)}")
    if len(data.column_names) != len(got):
        raise InvalidBatch(f"{table}: a column name appears twice")
    data = data.select(schema.names)
    for field, column in zip(schema, data.columns, strict=True):
        if column.type != field.type:
            raise InvalidBatch(
                f"{table}.{field.name}: wrong Arrow type, expected {field.type}, got {column.type}"
            )
        nulls = column.null_count
        if pa.types.is_list(column.type) and not nulls:
            nulls = pc.list_flatten(column).null_count
        if nulls:
            raise InvalidBatch(f"{table}.{field.name}: {nulls} null value(s); nulls are not allowed")
    if data.num_rows == 0:
        raise InvalidBatch(f"{table}: the batch has no rows")
    for name in _NON_NEGATIVE:
        if name in schema.names:
            smallest = pc.min(data.column(name)).as_py()
            if smallest is not None and smallest < 0:
                raise InvalidBatch(f"{table}.{name}: negative value {smallest}; durations are >= 0 ns")
    return data


def decode(batch: pb.Batch) -> Decoded:
    """Check a batch's header and payload and build the rows to insert.

    Raises:
        InvalidBatch: empty ``agent_id`` or ``job_id``; unknown or unspecified
            ``table``; bytes that are not an Arrow IPC stream; any check of
            :func:`validate_columns`.
    """
    if not batch.agent_id:
        raise InvalidBatch("agent_id: empty; every batch names the agent that sent it")
    if not batch.job_id:
        raise InvalidBatch("job_id: empty; every batch names its job")
    table = TABLE_BY_ENUM.get(batch.table)
    if table is None:
        known = ", ".join(pb.Table.Name(v) for v in TABLE_BY_ENUM)
        raise InvalidBatch(f"table: unknown or unspecified table {batch.table} (expected one of {known})")
    data = validate_columns(table, _read_ipc(batch.arrow_ipc))
    # One dictionary entry, not num_rows copies of the string: job_id is LowCardinality.
    job_id = pa.DictionaryArray.from_arrays(np.zeros(data.num_rows, np.int32), pa.array([batch.job_id]))
    return Decoded(table, data.append_column("job_id", job_id), f"{batch.agent_id}:{batch.seq}")


def already_stored(store: Store, agent_id: str, seq: int) -> int | None:
    """Rows of the stored batch ``(agent_id, seq)``, or None when it was never stored.

    Raises:
        StoreError: the lookup failed.
    """
    found = store.query(
        "SELECT rows FROM ingest_batches WHERE agent_id = {agent_id:String} AND seq = {seq:UInt64} LIMIT 1",
        {"agent_id": agent_id, "seq": seq},
    )
    if found.num_rows == 0:
        return None
    rows: int = found.column(0)[0].as_py()
    return rows


def _record(store: Store, batch: pb.Batch, decoded: Decoded) -> None:
    record = pa.table(
        {
            "agent_id": pa.array([batch.agent_id]),
            "seq": pa.array([batch.seq], pa.uint64()),
            "table_name": pa.array([decoded.table]),
            "rows": pa.array([decoded.data.num_rows], pa.uint64()),
            "job_id": pa.array([batch.job_id]),
        }
    )
    store.insert("ingest_batches", record, dedup_token=decoded.dedup_token)


def ingest(store: Store, batch: pb.Batch, metrics: Metrics | None = None) -> pb.Ack:
    """Store ``batch`` once and return its ``Ack`` (STORED or DUPLICATE).

    Rejections are raised, not returned, so the caller maps every error in one place.

    Raises:
        InvalidBatch: the batch cannot be stored (see :func:`decode`); nothing written.
        StoreError: the store failed; the batch may be retried safely.
    """
    decoded = decode(batch)
    rows = already_stored(store, batch.agent_id, batch.seq)
    if rows is not None:
        if metrics is not None:
            metrics.ingest_batches.labels(decoded.table, "duplicate").inc()
        return pb.Ack(seq=batch.seq, status=pb.Ack.DUPLICATE, rows=rows)
    store.insert(decoded.table, decoded.data, dedup_token=decoded.dedup_token)
    _record(store, batch, decoded)
    if metrics is not None:
        n = decoded.data.num_rows
        metrics.ingest_batches.labels(decoded.table, "stored").inc()
        metrics.ingest_rows.labels(decoded.table).inc(n)
        metrics.ingest_bytes.inc(len(batch.arrow_ipc))
        metrics.agent_dropped.inc(batch.dropped_events)
        metrics.last_ingest.set_to_current_time()
    return pb.Ack(seq=batch.seq, status=pb.Ack.STORED, rows=decoded.data.num_rows)
