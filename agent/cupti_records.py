"""CUPTI activity records: kind codes, the byte layouts Argus reads, and the decoded columns.

Both decoders produce a :class:`Decoded`: the native one
(:mod:`argus.agent.cupti_native`, numpy over the raw activity buffers) and the
per-record object one (:func:`argus.agent.cupti.collect`/:func:`~argus.agent.cupti.decode`,
over cupti-python's record objects).

Layouts (:data:`LAYOUTS`) are written from the CUPTI headers' structs
(``CUpti_ActivityKernel9`` ... ``13``, ``CUpti_ActivityMemcpy5`` ... ``7``,
``CUpti_ActivityMemcpyPtoP4``, ``CUpti_ActivityMemset4``/``5``,
``CUpti_ActivityExternalCorrelation``); a test checks them against cupti-python's
numpy dtypes (``activity_kernel11_dtype`` ...) where that package is installed.
Later versions of a struct append fields, so the fields Argus reads keep their
offsets: a layout applies to every record of its kind at least ``min_size``
bytes long. Which version a libcupti writes is not guessed from its release: the
live source measures each kind's record size from libcupti itself
(:mod:`argus.agent.cupti_lib`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from argus.schema import wire_schema

__all__ = [
    "EVENT_KINDS",
    "KIND_CONCURRENT_KERNEL",
    "KIND_DRIVER",
    "KIND_EXTERNAL_CORRELATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMCPY2",
    "KIND_MEMSET",
    "KIND_OVERHEAD",
    "KIND_RUNTIME",
    "LAYOUTS",
    "MEMCPY_NAMES",
    "MEMSET_NAME",
    "Decoded",
    "Layout",
]

# CUpti_ActivityKind values (cupti_activity.h); a record's first 4 bytes, cupti-python's ``kind``.
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_DRIVER = 4
KIND_RUNTIME = 5
KIND_CONCURRENT_KERNEL = 10
KIND_OVERHEAD = 17
KIND_MEMCPY2 = 22
KIND_EXTERNAL_CORRELATION = 39

#: ``kernel_events.kind`` values; :attr:`Decoded.kind` holds indices into it.
EVENT_KINDS = ("kernel", "memcpy", "memset")

#: CUpti_ActivityMemcpyKind → name used as the "kernel" of memcpy rows (index = copy kind).
MEMCPY_NAMES = (
    "Memcpy",
    "Memcpy HtoD",
    "Memcpy DtoH",
    "Memcpy HtoA",
    "Memcpy AtoH",
    "Memcpy AtoA",
    "Memcpy AtoD",
    "Memcpy DtoA",
    "Memcpy DtoD",
    "Memcpy HtoH",
    "Memcpy PtoP",
)
#: The "kernel" name of memset rows.
MEMSET_NAME = "Memset"


@dataclass(frozen=True)
class Layout:
    """Where the fields Argus reads sit in one kind of activity record.

    Attributes:
        event: Index into :data:`EVENT_KINDS`, or -1 for external-correlation records.
        min_size: Bytes of the shortest struct version holding every field below.
        fields: Column name → ``(byte offset, numpy dtype)``. Columns: ``start``,
            ``end`` (ns, CUPTI clock), ``device``, ``stream``, ``correlation``,
            ``graph_id``, ``graph_node_id``, and ``name`` (a ``const char *``,
            kernels), ``copy_kind`` (memcpys), ``external_id`` (external correlation).
    """

    event: int
    min_size: int
    fields: dict[str, tuple[int, str]]


_KERNEL = Layout(
    0,
    160,
    {
        "start": (16, "u8"),
        "end": (24, "u8"),
        "device": (40, "u4"),
        "stream": (48, "u4"),
        "correlation": (92, "u4"),
        "name": (104, "u8"),
        "graph_node_id": (144, "u8"),
        "graph_id": (156, "u4"),
    },
)
_MEMCPY = Layout(
    1,
    80,
    {
        "copy_kind": (4, "u1"),
        "start": (16, "u8"),
        "end": (24, "u8"),
        "device": (32, "u4"),
        "stream": (40, "u4"),
        "correlation": (44, "u4"),
        "graph_node_id": (64, "u8"),
        "graph_id": (72, "u4"),
    },
)
_MEMCPY_PTOP = Layout(
    1,
    88,
    {
        "copy_kind": (4, "u1"),
        "start": (16, "u8"),
        "end": (24, "u8"),
        "device": (32, "u4"),
        "stream": (40, "u4"),
        "correlation": (60, "u4"),
        "graph_node_id": (72, "u8"),
        "graph_id": (80, "u4"),
    },
)
_MEMSET = Layout(
    2,
    80,
    {
        "start": (16, "u8"),
        "end": (24, "u8"),
        "device": (32, "u4"),
        "stream": (40, "u4"),
        "correlation": (44, "u4"),
        "graph_node_id": (64, "u8"),
        "graph_id": (72, "u4"),
    },
)
_EXTERNAL = Layout(-1, 24, {"external_id": (8, "u8"), "correlation": (16, "u4")})

#: CUpti_ActivityKind → the layout Argus decodes it with. Other kinds are skipped.
LAYOUTS: dict[int, Layout] = {
    KIND_KERNEL: _KERNEL,
    KIND_CONCURRENT_KERNEL: _KERNEL,
    KIND_MEMCPY: _MEMCPY,
    KIND_MEMCPY2: _MEMCPY_PTOP,
    KIND_MEMSET: _MEMSET,
    KIND_EXTERNAL_CORRELATION: _EXTERNAL,
}

_INT_COLUMNS = ("stream", "device", "correlation", "start_ns", "dur_ns", "graph_id", "graph_node_id")


class Decoded:
    """Decoded activity: ``kernel_events`` columns (times on the epoch clock) and what was left out.

    Rows are kernels, then memcpys, then memsets, each in record order.

    Attributes:
        kind: uint8 index into :data:`EVENT_KINDS` per row.
        name_id: int32 index into ``names`` per row (kernel name, or memcpy kind / memset name).
        names: The name table ``name_id`` indexes.
        stream, device, correlation, start_ns, dur_ns, graph_id, graph_node_id: int64
            numpy arrays, one value per row (``graph_id``/``graph_node_id`` 0 outside CUDA graphs).
        external_correlation, external_id: EXTERNAL_CORRELATION records, in order: a CUPTI
            correlation id (int64) and the external id pushed around the call (uint64) each.
            :attr:`external` is them as a dict (a later record wins).
        dropped: Records without usable timestamps (start or end 0, or end < start; not in the rows).
        skipped: Records of kinds not decoded (API, overhead, ... records).
        refused: Buffer tails that could not be read (a record cut by the buffer's end, or of a
            kind whose size is unknown); each lost at least one record.
    """

    __slots__ = (
        "correlation",
        "device",
        "dropped",
        "dur_ns",
        "external_correlation",
        "external_id",
        "graph_id",
        "graph_node_id",
        "kind",
        "name_id",
        "names",
        "refused",
        "skipped",
        "start_ns",
        "stream",
    )

    def __init__(self) -> None:
        empty = np.zeros(0, np.int64)
        self.kind: npt.NDArray[np.uint8] = np.zeros(0, np.uint8)
        self.name_id: npt.NDArray[np.int32] = np.zeros(0, np.int32)
        self.names: Sequence[str] = ()
        self.stream = self.device = self.correlation = empty
        self.start_ns = self.dur_ns = self.graph_id = self.graph_node_id = empty
        self.external_correlation = empty
        self.external_id = np.zeros(0, np.uint64)
        self.dropped = self.skipped = self.refused = 0

    def __len__(self) -> int:
        return int(self.kind.size)

    @property
    def external(self) -> dict[int, int]:
        """CUPTI correlation id → external id (the EXTERNAL_CORRELATION records; a later one wins)."""
        return dict(zip(self.external_correlation.tolist(), self.external_id.tolist(), strict=True))

    @property
    def name(self) -> list[str]:
        """The name of each row."""
        names = self.names
        return [names[i] for i in self.name_id.tolist()]

    @property
    def kinds(self) -> list[str]:
        """The ``kernel_events.kind`` of each row."""
        return [EVENT_KINDS[k] for k in self.kind.tolist()]

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """``(kind, name, stream, device, correlation, start_ns, dur_ns, graph_id, graph_node_id)`` rows.

        For tests and small batches; bulk users read the columns.
        """
        ints = [getattr(self, c).tolist() for c in _INT_COLUMNS]
        return list(zip(self.kinds, self.name, *ints, strict=True))

    def table(self, rank: int) -> pa.Table:
        """The rows as a ``kernel_events`` wire table of ``rank`` (strings built by Arrow, not per row)."""
        schema = wire_schema("kernel_events")
        n = len(self)
        kinds = pa.DictionaryArray.from_arrays(self.kind.astype(np.int32), pa.array(EVENT_KINDS))
        names = pa.DictionaryArray.from_arrays(self.name_id, pa.array(list(self.names), pa.string()))
        columns: dict[str, Any] = {
            "rank": pa.array(np.full(n, rank, np.uint32)),
            "kind": kinds.cast(pa.string()),
            "kernel": names.cast(pa.string()),
            "stream": pa.array(self.stream.astype(np.uint32)),
            "device": pa.array(self.device.astype(np.int32)),
            "correlation": pa.array(self.correlation.astype(np.uint64)),
            "start_ns": pa.array(self.start_ns),
            "dur_ns": pa.array(self.dur_ns),
            "graph_id": pa.array(self.graph_id.astype(np.uint32)),
            "graph_node_id": pa.array(self.graph_node_id.astype(np.uint64)),
        }
        return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
