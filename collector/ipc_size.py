"""The decoded size an Arrow IPC stream declares, read before Arrow allocates it.

A record batch with body compression (LZ4 or ZSTD, Arrow IPC format 1.0) prefixes
each buffer with its uncompressed length (int64, ``-1``: stored uncompressed);
Arrow allocates that length before it decompresses. A 16 MiB message can so
declare terabytes. :func:`declared_bytes` walks the stream's messages
(``pyarrow.ipc.MessageReader``) and each record batch's flatbuffer metadata
(``Message.header`` → ``RecordBatch.buffers``, ``RecordBatch.compression``; format
in Arrow's ``format/Message.fbs``) and adds up what the buffers will take decoded,
without decoding them.
"""

from __future__ import annotations

import struct

import pyarrow as pa

__all__ = ["declared_bytes"]

_RECORD_BATCH = 3
_DICTIONARY_BATCH = 4


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


def declared_bytes(payload: bytes) -> int:
    """Bytes the record and dictionary batches of the IPC stream ``payload`` declare, decoded.

    Raises:
        ValueError: the messages or their metadata are malformed (``struct.error``
            and Arrow's own errors are raised as ValueError).
    """
    try:
        total = 0
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(payload)):
            if message.type in ("record batch", "dictionary batch"):
                body = message.body if message.body is not None else pa.py_buffer(b"")
                total += _batch_bytes(message.metadata.to_pybytes(), body)
        return total
    except (struct.error, IndexError, pa.ArrowException, OSError) as exc:
        raise ValueError(f"malformed IPC message metadata ({exc})") from exc
