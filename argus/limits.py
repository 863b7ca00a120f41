"""Every limit the server applies to what an input declares, in one table.

A count or size an input declares (a world size, a rank, a process group's
members, a collective's element count) is checked against :data:`LIMITS` before
anything is allocated or computed from it; :func:`check_declared` raises with a
message naming the field, the value and the limit. The README's "Limits" table
lists these with their defaults and flags.

    limit                 default           flag                  applies to
    max_upload_bytes      2 GiB             --max-upload-bytes    POST .../traces: request body and
                                                                  decompressed JSON text, per request
    max_world_size        1,048,576         (none)                world_size of a wire row or a trace
    max_rank              max_world_size-1  (none)                rank, group members
    max_group_ranks       max_world_size    (none)                members of one process group
    max_elements          2**48             (none)                a collective's element count (trace)
    max_stream            2**32-1           (none)                a kernel's stream id (trace)
    max_device            2**31-1           (none)                a kernel's device index (trace)
    max_message_bytes     16 MiB            (none)                one gRPC message (argus.config)
    max_batch_decoded_bytes 256 MiB         (none)                an Arrow IPC batch's buffers once
                                                                  decompressed (LZ4/ZSTD bodies)
    max_streams           2,048             --max-streams         agent streams open at once (gRPC)
    max_decoded_bytes     1 GiB             --max-decoded-bytes   agent batches held from read to written,
                                                                  all streams: payload + declared decoded
                                                                  (past it a stream waits)
    max_read_rows         1,000,000,000     --max-read-rows       rows one REST read may scan (422)
    max_execution_time    60 s              (none)                every store call (argus.store)
    max_memory_usage      4 GiB             (none)                every store call (argus.store)

A trace upload past ``max_upload_bytes`` is refused with 413 (:class:`TooLarge`)
and writes nothing; gzip is inflated in chunks of at most :data:`INFLATE_CHUNK_BYTES`,
so the server never holds more than that of a decompressed body at once.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import BinaryIO

from argus.config import (
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_MAX_UPLOAD_BYTES,
    DEFAULT_STORE_MEMORY_BYTES,
    DEFAULT_STORE_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
)
from argus.errors import TooLarge

__all__ = [
    "DEFAULT_MAX_UPLOAD_BYTES",
    "INFLATE_CHUNK_BYTES",
    "LIMITS",
    "MAX_ELEMENTS",
    "MAX_GROUP_RANKS",
    "MAX_RANK",
    "MAX_WORLD_SIZE",
    "WIRE_COLUMN_LIMITS",
    "WIRE_LENGTH_LIMITS",
    "ByteBudget",
    "Gunzip",
    "check_declared",
]

#: Largest world size a job may declare (2**20 ranks: ten times the largest jobs run today).
MAX_WORLD_SIZE = 1 << 20
#: Largest rank (ranks are 0 .. world size - 1).
MAX_RANK = MAX_WORLD_SIZE - 1
#: Most members of one process group.
MAX_GROUP_RANKS = MAX_WORLD_SIZE
#: Largest element count of one collective (2**48 elements: 256 TiB of bytes).
MAX_ELEMENTS = 1 << 48
#: Most decompressed bytes produced per inflate call.
INFLATE_CHUNK_BYTES = 1 << 16

#: Limit name → value, for messages and the README.
LIMITS: dict[str, int] = {
    "max_upload_bytes": DEFAULT_MAX_UPLOAD_BYTES,
    "max_world_size": MAX_WORLD_SIZE,
    "max_rank": MAX_RANK,
    "max_group_ranks": MAX_GROUP_RANKS,
    "max_elements": MAX_ELEMENTS,
    "max_stream": 2**32 - 1,
    "max_device": 2**31 - 1,
    "max_message_bytes": MAX_MESSAGE_BYTES,
    "max_batch_decoded_bytes": 16 * MAX_MESSAGE_BYTES,
    "max_decoded_bytes": DEFAULT_MAX_DECODED_BYTES,
    "max_execution_time": DEFAULT_STORE_TIMEOUT_S,
    "max_memory_usage": DEFAULT_STORE_MEMORY_BYTES,
}


#: Wire columns (any table) whose largest value is checked against a limit; list columns per member.
WIRE_COLUMN_LIMITS: dict[str, str] = {
    "world_size": "max_world_size",
    "rank": "max_rank",
    "group_ranks": "max_rank",
}
#: Wire list columns whose length (members per row) is checked against a limit.
WIRE_LENGTH_LIMITS: dict[str, str] = {"group_ranks": "max_group_ranks"}


def check_declared(field: str, value: int, limit: str, *, lowest: int = 0) -> int:
    """Return ``value`` when ``lowest <= value <= LIMITS[limit]``.

    Raises:
        ValueError: ``"{field}: {value} is larger than the limit {limit} = {max}"`` (or below ``lowest``);
            each entry wraps it in its own error (InvalidBatch, TraceError).
    """
    top = LIMITS[limit]
    if value > top:
        raise ValueError(f"{field}: {value} is larger than the limit {limit} = {top}")
    if value < lowest:
        raise ValueError(f"{field}: {value} is below {lowest}")
    return value


@dataclass
class ByteBudget:
    """Bytes an upload may still use; :meth:`take` refuses past ``limit``.

    Shared by every file of one request, so many small gzip bombs add up.
    """

    limit: int
    what: str = "the upload"
    used: int = 0

    def take(self, n: int) -> None:
        """Count ``n`` more bytes.

        Raises:
            TooLarge: past ``limit`` (answered 413); names the limit and its flag.
        """
        self.used += n
        if self.used > self.limit:
            raise TooLarge(
                f"{self.what} is larger than {self.limit} bytes decompressed "
                f"(max_upload_bytes, --max-upload-bytes)"
            )


class Gunzip:
    """A gzip stream read in bounded chunks: ``read(n)`` inflates at most ``n`` bytes at a time.

    ``zlib.decompressobj(wbits=31)`` with ``max_length``; concatenated gzip members
    (``cat a.gz b.gz``) are read in turn, as ``gzip`` does.

    Raises (from ``read``):
        EOFError: the stream ends inside a member (truncated file).
        zlib.error: the bytes are not gzip.
    """

    def __init__(self, raw: BinaryIO, read_bytes: int = INFLATE_CHUNK_BYTES) -> None:
        self._raw = raw
        self._read_bytes = read_bytes
        self._inflate = zlib.decompressobj(wbits=31)
        self._tail = b""

    def read(self, size: int = INFLATE_CHUNK_BYTES) -> bytes:
        """At most ``min(size, INFLATE_CHUNK_BYTES)`` decompressed bytes; ``b""`` at the end."""
        size = INFLATE_CHUNK_BYTES if size < 0 else min(size, INFLATE_CHUNK_BYTES)
        while True:
            if self._inflate.eof:
                rest = self._inflate.unused_data or self._raw.read(self._read_bytes)
                if not rest:
                    return b""
                self._inflate = zlib.decompressobj(wbits=31)
                self._tail = rest
            data = self._tail or self._raw.read(self._read_bytes)
            if not data:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            out = self._inflate.decompress(data, size)
            self._tail = self._inflate.unconsumed_tail
            if out:
                return out
