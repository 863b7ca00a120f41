"""An Arrow IPC stream read once, with the decoded size it declares checked before Arrow allocates it.

A record batch with body compression (LZ4 or ZSTD, Arrow IPC format 1.0) prefixes
each buffer with its uncompressed length (int64, ``-1``: stored uncompressed);
Arrow allocates that length before it decompresses. A 16 MiB message can so
declare terabytes. :func:`declared_bytes` walks the stream's messages
(``pyarrow.ipc.MessageReader``) and each record batch's flatbuffer metadata
(``Message.header`` → ``RecordBatch.buffers``, ``RecordBatch.compression``; format
in Arrow's ``format/Message.fbs``) and adds up what the buffers will take decoded,
without decoding them. :func:`scan` walks a stream's messages once and keeps them
(:class:`Scanned`); :func:`read_stream` decodes a walked stream, checking each record batch's
declared size before decoding it. So the collector, which charges a batch what it declares before
decoding it, reads its messages once, not once for the charge and again to decode (on the
collector's loop the first walk was 9 % of its samples, ``bench/scale.py --agents 125``, 12-07).
The stream's schema message is parsed once per distinct schema, not once per batch (a node agent
sends the same few schemas all day; 1,250 of them send 5,000 batches a second).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import pyarrow as pa

__all__ = ["Scanned", "declared_bytes", "read_stream", "scan"]

_T = TypeVar("_T")
_RECORD_BATCH = 3
_DICTIONARY_BATCH = 2  # MessageHeader: Schema 1, DictionaryBatch 2, RecordBatch 3


def _field(meta: bytes, table: int, index: int) -> int | None:
    """Position of field ``index`` of the flatbuffer table at ``table``, None when absent."""
    vtable = table - struct.unpack_from("<i", meta, table)[0]
    if 4 + 2 * index >= struct.unpack_from("<H", meta, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", meta, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _deref(meta: bytes, position: int) -> int:
    return position + int(struct.unpack_from("<I", meta, position)[0])


def _batch_bytes(meta: bytes, body: pa.Buffer) -> int:
    root = _deref(meta, 0)
    kind, header = _field(meta, root, 1), _field(meta, root, 2)
    if kind is None or header is None or meta[kind] not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return 0
    batch = _deref(meta, header)
    if meta[kind] == _DICTIONARY_BATCH:
        data = _field(meta, batch, 1)
        if data is None:
            return 0
        batch = _deref(meta, data)
    if _field(meta, batch, 3) is None:
        # Uncompressed: Arrow reads the buffers in place and refuses one past the body's end,
        # so what they take decoded is at most the body (no walk of every buffer needed).
        return int(body.size)
    buffers = _field(meta, batch, 2)
    if buffers is None:
        return 0
    vector = _deref(meta, buffers)
    count = struct.unpack_from("<I", meta, vector)[0]
    total = 0
    for k in range(count):
        offset, length = struct.unpack_from("<qq", meta, vector + 4 + 16 * k)
        if length < 8:
            total += max(length, 0)
            continue
        if not 0 <= offset <= body.size - 8:
            raise ValueError(f"a buffer at {offset} lies outside the {body.size}-byte body")
        decoded = struct.unpack_from("<q", body.slice(offset, 8).to_pybytes())[0]
        total += length - 8 if decoded < 0 else decoded
    return total


def _declared(message: pa.ipc.Message) -> int:
    """Bytes the record or dictionary batch ``message`` declares decoded (0 for other messages).

    Raises:
        ValueError, struct.error, IndexError: malformed metadata.
    """
    if message.type not in ("record batch", "dictionary"):  # pyarrow's names of the two
        return 0
    body = message.body if message.body is not None else pa.py_buffer(b"")
    return _batch_bytes(message.metadata.to_pybytes(), body)


#: Schemas by the metadata bytes of their schema message (equal bytes, equal schema); at most
#: :data:`_MAX_SCHEMAS` of at most :data:`_MAX_KEY_BYTES` each (a wire schema's message takes
#: under 2 KiB; senders choose these bytes, so what is remembered stays under 16 MiB); any
#: other schema is parsed each time, not remembered.
_schemas: dict[bytes, pa.Schema] = {}
_MAX_SCHEMAS = 256
_MAX_KEY_BYTES = 64 * 1024


def _schema(message: pa.ipc.Message) -> pa.Schema:
    """The schema of the schema message ``message``, parsed once per distinct metadata."""
    if message.metadata.size > _MAX_KEY_BYTES:
        return pa.ipc.read_schema(message)
    key = message.metadata.to_pybytes()
    schema = _schemas.get(key)
    if schema is None:
        schema = pa.ipc.read_schema(message)
        if len(_schemas) < _MAX_SCHEMAS:
            _schemas[key] = schema
    return schema


@dataclass(frozen=True)
class Scanned:
    """An IPC stream's messages walked once (:func:`scan`), nothing decoded: what
    :func:`read_stream` decodes without reading the messages again, and what its record batches
    declare decoded, known before anything is allocated (the collector charges it first,
    :func:`argus.collector.decoded_budget.batch_cost`).

    Attributes:
        payload: The stream as received; ``batches`` are zero-copy slices of it.
        schema: Its schema; None when the walk stopped before one was read.
        batches: Its record batch messages, in order, up to the first problem.
        totals: Bytes ``batches`` declare decoded, cumulative: ``totals[k]`` through ``batches[k]``.
        error: Why the walk stopped early (malformed messages or metadata, no schema first, a
            dictionary or schema message inside the stream); None when it read the whole stream.
    """

    payload: bytes
    schema: pa.Schema | None
    batches: tuple[pa.ipc.Message, ...]
    totals: tuple[int, ...]
    error: ValueError | None

    @property
    def declared(self) -> int:
        """Bytes every record batch walked declares decoded (0: none)."""
        return self.totals[-1] if self.totals else 0


def scan(payload: bytes) -> Scanned:
    """Walk the IPC stream ``payload`` once: its schema (parsed once per distinct schema), its record
    batch messages and what each declares decoded. Never raises: a problem ends the walk and is kept
    in :attr:`Scanned.error`, raised by :func:`read_stream` after the batches before it."""
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
        first = reader.read_next_message()
        schema = _schema(first) if first.type == "schema" else None
    except (struct.error, IndexError, pa.ArrowException, OSError, StopIteration) as exc:
        return Scanned(payload, None, (), (), _malformed("malformed IPC stream", exc))
    if schema is None:
        error = ValueError(f"the stream starts with a {first.type} message, not its schema")
        return Scanned(payload, None, (), (), error)
    batches: list[pa.ipc.Message] = []
    totals: list[int] = []
    walked = _walk(reader, batches, totals)
    return Scanned(payload, schema, tuple(batches), tuple(totals), walked)


def _walk(
    reader: pa.ipc.MessageReader, batches: list[pa.ipc.Message], totals: list[int]
) -> ValueError | None:
    """Append the record batch messages left in ``reader`` to ``batches`` and the bytes they declare
    decoded, cumulative, to ``totals``; the problem that ended the walk early, or None."""
    total = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return None
        except (pa.ArrowException, OSError) as exc:
            return _malformed("malformed IPC message", exc)
        if message.type != "record batch":
            return ValueError(f"a {message.type} message inside the stream; only record batches are read")
        try:
            total += _declared(message)
        except (struct.error, IndexError) as exc:
            return _malformed("malformed IPC message metadata", exc)
        batches.append(message)
        totals.append(total)


def _malformed(what: str, exc: BaseException) -> ValueError:
    error = ValueError(f"{what} ({exc})")
    error.__cause__ = exc
    return error


def read_stream(
    payload: bytes | Scanned, check: Callable[[int], object], pool: pa.MemoryPool | None = None
) -> pa.Table:
    """The table of the IPC stream ``payload``: one schema message, then record batches.

    ``payload``: the stream's bytes, or the stream already walked (:func:`scan`; its messages are
    not read again).

    ``check`` is called with the bytes the stream's record batches declare decoded, in
    total up to and including the next one, before that one is decoded; what it raises
    passes through (it refuses a stream that declares too much before anything is allocated).
    The buffers are not validated (``pa.Table.validate(full=True)`` is the caller's).

    With ``pool``, the decoded (decompressed) buffers are allocated there: every batch is
    checked first, then the stream is read again by Arrow's stream reader, which takes a pool
    (``read_record_batch`` does not: it allocates from Arrow's default pool). For large batches
    (:func:`argus.memory.decoding_pool`); the schema is then parsed once per call.

    Raises:
        ValueError: not a readable stream: malformed messages or metadata, no schema first,
            a dictionary batch (the wire schemas have no dictionary columns), a batch that
            does not match the schema (Arrow's errors are raised as ValueError).
    """
    scanned = payload if isinstance(payload, Scanned) else scan(payload)
    schema = scanned.schema
    if schema is None:  # the walk ended at the first message: nothing to decode before its error
        raise scanned.error or ValueError("malformed IPC stream: no schema")
    batches = []
    for message, total in zip(scanned.batches, scanned.totals, strict=True):
        check(total)
        if pool is None:
            batches.append(_decoded(partial(pa.ipc.read_record_batch, message, schema)))
    if scanned.error is not None:
        raise scanned.error
    if pool is not None:
        stream = pa.py_buffer(scanned.payload)
        return _decoded(lambda: pa.ipc.open_stream(stream, memory_pool=pool).read_all())
    return pa.Table.from_batches(batches, schema)


def _decoded(read: Callable[[], _T]) -> _T:
    """``read()``, Arrow's errors raised as ValueError (an unreadable record batch)."""
    try:
        return read()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"unreadable record batch ({exc})") from exc


def declared_bytes(payload: bytes) -> int:
    """Bytes the record and dictionary batches of the IPC stream ``payload`` declare, decoded.

    Raises:
        ValueError: the messages or their metadata are malformed (``struct.error``
            and Arrow's own errors are raised as ValueError).
    """
    try:
        total = 0
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(payload)):
            total += _declared(message)
        return total
    except (struct.error, IndexError, pa.ArrowException, OSError) as exc:
        raise ValueError(f"malformed IPC message metadata ({exc})") from exc
