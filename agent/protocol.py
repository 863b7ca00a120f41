"""The probe ↔ node agent protocol on the node's unix socket.

A connection carries length-prefixed frames in both directions::

    u32 payload length | u8 frame type | u64 message sequence | payload

Probe → agent: one ``HELLO`` first (JSON identity of the rank), then ``BATCH``
frames (``u8`` table code of ``argus.v1.Table``, then an Arrow IPC stream of
exactly :func:`argus.schema.wire_schema` of that table), ``CAPTURE`` frames
(JSON ``{"spans": [[start_ns, end_ns], ...]}``: when the rank's CUPTI capture
ran, host clock), and a ``BYE`` (JSON ``{"exit_code": int}``) when the process
exits. Agent → probe: ``ACK`` once the rows of a ``BATCH`` or ``CAPTURE`` are
durable (in the spool; kernel events and spans: their window's summaries),
carrying the frame's message sequence; it acknowledges every frame up to that
one. A frame that is durable while one before it is not (held in a kernel
window) gets an ``ACK_ONE``, which acknowledges that frame alone; the agent sends
it to probes whose HELLO has ``version`` >= 2 (older ones wait for the ``ACK``).
A ``BATCH`` or ``CAPTURE`` the agent cannot decode or validate (unreadable or invalid
Arrow data, another schema, bad JSON) is refused: a ``REFUSED`` carrying its sequence
(that frame alone) tells the probe to drop it, counted; a probe whose HELLO has
``version`` < 3 does not know ``REFUSED`` and gets the frame acknowledged instead (it
drops it as delivered). Either way the connection goes on and the frame is never resent.
A probe resends frames that were never acknowledged when it reconnects to a
(restarted) agent.

Agent → probe, when the node agent cannot sample the rank with py-spy
(:mod:`argus.agent.captures`): ``SAMPLE`` (JSON ``{"capture_id", "duration_ms"}``): the probe
samples its own threads for that long and sends the rows as a ``stacks`` ``BATCH``.

Any client may send ``DUMP`` (JSON ``{"job_id", "start_ns", "end_ns"}``) to ask
the agent to upload the raw kernel events it still holds for that range; the
agent answers with an ``ACK`` whose sequence is the number of rows queued.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
from typing import Any

import pyarrow as pa

from argus.ipc_size import read_stream
from argus.limits import check_declared
from argus.proto import collector_pb2
from argus.schema import WIRE_TABLES, wire_schema, with_defaults

__all__ = [
    "HEADER",
    "MAX_FRAME_BYTES",
    "FrameType",
    "ProtocolError",
    "decode_batch",
    "decode_json",
    "encode_batch",
    "encode_frame",
    "encode_json",
    "ipc_bytes",
    "read_frame",
    "table_code",
    "table_name",
]

#: Frame header: payload length, frame type, message sequence.
HEADER = struct.Struct("<IBQ")
#: Larger frames are a protocol error (a probe never builds one this big).
MAX_FRAME_BYTES = 256 * 1024 * 1024


class FrameType(enum.IntEnum):
    """Kinds of frame on the probe socket."""

    HELLO = 1
    BATCH = 2
    BYE = 3
    ACK = 4
    DUMP = 5
    CAPTURE = 6
    ACK_ONE = 7
    SAMPLE = 8
    REFUSED = 9


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid frame (the connection is dropped)."""


_CODES: dict[str, collector_pb2.Table.ValueType] = {
    name: collector_pb2.Table.Value(name.upper()) for name in WIRE_TABLES
}
_NAMES: dict[int, str] = {int(code): name for name, code in _CODES.items()}


def table_code(name: str) -> collector_pb2.Table.ValueType:
    """``argus.v1.Table`` enum value of a wire table name (``"steps"`` → 3)."""
    return _CODES[name]


def table_name(code: int) -> str:
    """Wire table name of an ``argus.v1.Table`` value.

    Raises:
        ProtocolError: the code names no wire table.
    """
    try:
        return _NAMES[code]
    except KeyError:
        raise ProtocolError(f"unknown table code {code}") from None


def encode_frame(kind: FrameType, seq: int, payload: bytes = b"") -> bytes:
    """One frame: header + payload."""
    return HEADER.pack(len(payload), int(kind), seq) + payload


def encode_json(kind: FrameType, seq: int, doc: dict[str, Any]) -> bytes:
    """A frame whose payload is a JSON object."""
    return encode_frame(kind, seq, json.dumps(doc, separators=(",", ":")).encode())


def decode_json(payload: bytes) -> dict[str, Any]:
    """The JSON object of a HELLO, BYE or DUMP payload.

    Raises:
        ProtocolError: not a JSON object.
    """
    try:
        doc = json.loads(payload)
    except ValueError as exc:
        raise ProtocolError(f"bad JSON payload: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProtocolError("JSON payload is not an object")
    return doc


def ipc_bytes(data: pa.RecordBatch | pa.Table) -> bytes:
    """Arrow IPC *stream* bytes of a record batch or table."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue())


def encode_batch(seq: int, table: str, data: pa.RecordBatch | pa.Table) -> bytes:
    """A BATCH frame for ``table``; ``data`` must have the table's wire schema."""
    return encode_frame(FrameType.BATCH, seq, bytes([table_code(table)]) + ipc_bytes(data))


def decode_batch(payload: bytes) -> tuple[str, pa.Table]:
    """Table name and rows of a BATCH payload, checked against the wire schema.

    Columns added to a table later (they carry a default, :mod:`argus.schema`) may be
    absent, as in a batch of an older probe: they are filled with their default.

    What its record batches declare decoded (LZ4/ZSTD bodies) is checked against
    ``max_batch_decoded_bytes`` (:mod:`argus.limits`, as at the collector) from the IPC
    metadata before Arrow allocates it (:func:`argus.ipc_size.read_stream`): a
    frame of a few kilobytes that inflates to gigabytes is refused, never inflated. Every
    buffer is checked (``validate(full=True)``: offsets, lengths, UTF-8) before any compute
    kernel reads it: a crafted batch is refused here, never read past a buffer's end.

    Raises:
        ProtocolError: unknown table, unreadable or invalid Arrow data, a declared decoded
            size past the limit, or a different schema.
    """
    if not payload:
        raise ProtocolError("empty BATCH payload")
    name = table_name(payload[0])

    def within_limit(decoded: int) -> None:
        try:
            check_declared(f"{name} batch: decoded size", decoded, "max_batch_decoded_bytes")
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc

    try:
        data = read_stream(payload[1:], within_limit)
        data.validate(full=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ProtocolError(f"bad Arrow IPC in {name} batch: {exc}") from exc
    data = with_defaults(name, data)
    if not data.schema.equals(wire_schema(name)):
        raise ProtocolError(f"{name} batch schema differs from the wire schema: {data.schema}")
    return name, data


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return None
            raise ProtocolError("connection closed inside a frame")
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket) -> tuple[FrameType, int, bytes] | None:
    """Read one frame (blocking); None at a clean end of stream.

    Raises:
        ProtocolError: a malformed or oversized frame, or EOF inside a frame.
        OSError: the socket failed (including its timeout).
    """
    header = _read_exact(sock, HEADER.size)
    if header is None:
        return None
    length, kind, seq = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes is over the limit")
    try:
        frame_type = FrameType(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame type {kind}") from None
    payload = _read_exact(sock, length) if length else b""
    if payload is None:
        raise ProtocolError("connection closed inside a frame")
    return frame_type, seq, payload
