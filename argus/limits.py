"""Every limit the server applies to what an input declares, in one table.

A count or size an input declares (a world size, a rank, a process group's
members, a collective's element count) is checked against :data:`LIMITS` before
anything is allocated or computed from it; :func:`check_declared` raises with a
message naming the field, the value and the limit. The README's "Limits" table
lists these with their defaults and flags.

    limit                 default           flag                  applies to
    max_upload_bytes      2 GiB             --max-upload-bytes    POST .../traces: request body and
                                                                  decompressed JSON text, per request,
                                                                  and of all uploads parsed at once
    max_inflate_ratio     200               (none)                JSON text of a gzipped trace file per
                                                                  compressed byte read (+ 1 MiB)
    max_upload_parse_s    120 s             --max-upload-parse-s  CPU seconds parsing one upload
    max_world_size        1,048,576         (none)                world_size of a wire row or a trace
    max_rank              max_world_size-1  (none)                rank, group members
    max_group_ranks       max_world_size    (none)                members of one process group
    max_elements          2**48             (none)                a collective's element count (trace)
    max_stream            2**32-1           (none)                a kernel's stream id (trace)
    max_device            2**31-1           (none)                a kernel's device index (trace)
    max_step              2**40-1           (none)                a step number (wire rows, ProfilerStep#N):
                                                                  the analyzer packs rank << 40 | step
    max_seq               2**40-1           (none)                a collective's seq (and pending_seq): the
                                                                  analyzer packs group << 40 | seq
    max_frame_label_bytes 8,192             (none)                one frame of a stack, 'function (file:line)'
    max_frame_line        2**31-1           (none)                a frame's line number (CPython's is a C int)
    max_message_bytes     16 MiB            (none)                one gRPC message (argus.config)
    max_batch_decoded_bytes 256 MiB         (none)                an Arrow IPC batch's buffers once
                                                                  decompressed (LZ4/ZSTD bodies)
    max_streams           2,048             --max-streams         agent streams open at once (gRPC)
    max_decoded_bytes     1 GiB             --max-decoded-bytes   agent batches held from read to written,
                                                                  all streams: payload + declared decoded
                                                                  (past it a stream waits)
    max_read_rows         1,000,000,000     --max-read-rows       rows one REST read may scan (422)
    max_execution_time    60 s              (none)                every store call (argus.store)
    max_active_jobs       10,000            (none)                jobs the analyzer lists per pass (those
                                                                  with batches stored most lately first)
    max_job_list_rows     10,000,000        (none)                ingest_batches rows read per pass to list
                                                                  them (after the stored_at index)
    max_memory_usage      4 GiB             (none)                every store call (argus.store)
    concurrent_part_removal_threshold 2**62 (none)              every table (argus.schema.TABLE_SETTINGS):
                                                                  outdated parts removed by the cleanup
                                                                  thread alone, no 128-thread pool kept
    engine dirty_decay_ms 1,000 ms          JE_MALLOC_CONF        the embedded engine's freed pages given
                                                                  back within a second (argus.memory)

A stored row past one of these (a store written before a limit existed) is skipped by the
analyzer where it reads it, and counted (``argus_analysis_skipped_rows_total``).

A trace upload past ``max_upload_bytes``, ``max_inflate_ratio`` or ``max_upload_parse_s`` is
refused with 413 (:class:`TooLarge`) and writes nothing; gzip is inflated in chunks of at most
:data:`INFLATE_CHUNK_BYTES`, so the server never holds more than that of a decompressed body at
once. Why 200: real Kineto traces gzip 13-23x (the seven of the shared test data) and 5-30x in
general; gzip itself reaches about 1,000x only on runs of one byte, which no trace is. A file past
200x is such a run (a 1 MB gzip of one 1 GiB JSON string), refused after 200 bytes of text per
compressed byte, not parsed for a minute.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from argus.config import (
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_MAX_UPLOAD_BYTES,
    DEFAULT_MAX_UPLOAD_PARSE_S,
    DEFAULT_STORE_MEMORY_BYTES,
    DEFAULT_STORE_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
)
from argus.errors import TooLarge

__all__ = [
    "DEFAULT_MAX_UPLOAD_BYTES",
    "INFLATE_CHUNK_BYTES",
    "INFLATE_SLACK_BYTES",
    "LIMITS",
    "MAX_ELEMENTS",
    "MAX_FRAME_LABEL_BYTES",
    "MAX_FRAME_LINE",
    "MAX_GROUP_RANKS",
    "MAX_RANK",
    "MAX_SEQ",
    "MAX_STEP",
    "MAX_WORLD_SIZE",
    "WIRE_COLUMN_LIMITS",
    "WIRE_LENGTH_LIMITS",
    "ByteBudget",
    "Gunzip",
    "SharedBytes",
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
#: Largest step number: the analyzer packs ``rank << 40 | step`` into one int64 (ranks need 20 bits).
MAX_STEP = (1 << 40) - 1
#: Largest collective sequence number: the analyzer packs ``group << 40 | seq`` into one int64.
MAX_SEQ = (1 << 40) - 1
#: Longest frame label of a stack, ``function (file:line)``, bytes: twice Linux's PATH_MAX (a path
#: and a qualified name); the analyzer parses every label of a capture.
MAX_FRAME_LABEL_BYTES = 8192
#: Largest line number of a frame (CPython keeps line numbers in a C int).
MAX_FRAME_LINE = 2**31 - 1
#: Most decompressed bytes produced per inflate call.
INFLATE_CHUNK_BYTES = 1 << 16
#: JSON text a gzipped file may inflate to beyond ``max_inflate_ratio`` times its bytes read (a
#: small file's header inflates more than its average).
INFLATE_SLACK_BYTES = 1 << 20

#: Limit name → value, for messages and the README.
LIMITS: dict[str, int] = {
    "max_upload_bytes": DEFAULT_MAX_UPLOAD_BYTES,
    "max_inflate_ratio": 200,
    "max_upload_parse_s": int(DEFAULT_MAX_UPLOAD_PARSE_S),
    "max_world_size": MAX_WORLD_SIZE,
    "max_rank": MAX_RANK,
    "max_group_ranks": MAX_GROUP_RANKS,
    "max_elements": MAX_ELEMENTS,
    "max_stream": 2**32 - 1,
    "max_device": 2**31 - 1,
    "max_step": MAX_STEP,
    "max_seq": MAX_SEQ,
    "max_frame_label_bytes": MAX_FRAME_LABEL_BYTES,
    "max_frame_line": MAX_FRAME_LINE,
    "max_message_bytes": MAX_MESSAGE_BYTES,
    "max_batch_decoded_bytes": 16 * MAX_MESSAGE_BYTES,
    "max_decoded_bytes": DEFAULT_MAX_DECODED_BYTES,
    "max_execution_time": DEFAULT_STORE_TIMEOUT_S,
    "max_memory_usage": DEFAULT_STORE_MEMORY_BYTES,
    "max_active_jobs": 10_000,
    "max_job_list_rows": 10_000_000,
}


#: Wire columns (any table) whose largest value is checked against a limit; list columns per member.
WIRE_COLUMN_LIMITS: dict[str, str] = {
    "world_size": "max_world_size",
    "rank": "max_rank",
    "group_ranks": "max_rank",
    "peer": "max_rank",
    "step": "max_step",
    "seq": "max_seq",
    "pending_seq": "max_seq",
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


class SharedBytes:
    """Bytes that every upload parsed at once may take together, bounded by ``limit``; thread-safe.

    Each upload's :class:`ByteBudget` takes its text from here as it inflates it and gives it
    back when the upload is done (:meth:`ByteBudget.release`), so uploads parsed at the same time
    share one ``max_upload_bytes`` instead of each holding its own.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Count ``n`` more bytes.

        Raises:
            TooLarge: past ``limit``; the ``n`` bytes are not counted.
        """
        with self._lock:
            if self.used + n > self.limit:
                raise TooLarge(
                    f"the uploads being parsed now are larger than {self.limit} bytes of text together "
                    "(max_upload_bytes, --max-upload-bytes); send it again when they are done"
                )
            self.used += n

    def give_back(self, n: int) -> None:
        """``n`` bytes counted by :meth:`take` are no longer held."""
        with self._lock:
            self.used -= n


@dataclass
class ByteBudget:
    """What an upload may still use: bytes of text, text per compressed byte, CPU seconds.

    Shared by every file of one request, so many small gzip bombs add up; with ``shared``, the
    text is also taken from the budget of every upload parsed at once. ``max_parse_s`` counts
    the CPU time (``time.thread_time``) of the thread that parses, from the budget's creation:
    what others run beside it does not count against it.
    """

    limit: int
    what: str = "the upload"
    used: int = 0
    max_parse_s: float | None = None
    shared: SharedBytes | None = None
    started_s: float = field(default_factory=time.thread_time)

    def take(self, n: int) -> None:
        """Count ``n`` more bytes of text, and check the time used so far.

        Raises:
            TooLarge: past ``limit``, past ``shared``'s limit, or past ``max_parse_s`` (answered
                413); the message names the limit and its flag.
        """
        if self.shared is not None:
            self.shared.take(n)
        self.used += n
        if self.used > self.limit:
            raise TooLarge(
                f"{self.what} is larger than {self.limit} bytes decompressed "
                f"(max_upload_bytes, --max-upload-bytes)"
            )
        if self.max_parse_s is not None and time.thread_time() - self.started_s > self.max_parse_s:
            raise TooLarge(
                f"{self.what} took more than {self.max_parse_s:g} s of CPU to parse, after {self.used} bytes "
                "of text (max_upload_parse_s, --max-upload-parse-s)"
            )

    def check_ratio(self, name: str, text_bytes: int, read_bytes: int) -> None:
        """Refuse a gzipped file whose ``text_bytes`` of text came from ``read_bytes`` compressed bytes
        at more than ``max_inflate_ratio`` per byte (plus :data:`INFLATE_SLACK_BYTES`).

        Raises:
            TooLarge: past the ratio (answered 413).
        """
        ratio = LIMITS["max_inflate_ratio"]
        if text_bytes > ratio * read_bytes + INFLATE_SLACK_BYTES:
            raise TooLarge(
                f"{name}: {text_bytes} bytes of text from {read_bytes} gzip bytes, more than "
                f"{ratio} per byte (max_inflate_ratio); real traces compress 5-30x"
            )

    def release(self) -> None:
        """The upload is done: give its text back to ``shared``."""
        if self.shared is not None:
            self.shared.give_back(self.used)
            self.used = 0


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
