"""CUPTI activity buffers laid out as libcupti writes them, for tests and ``bench/cupti_decode.py``.

Records use cupti-python's numpy record dtypes (``activity_kernel11_dtype`` ...) when
cupti-python is installed, else replicas with the same sizes and offsets. Kernel names
are real C strings (``ctypes`` buffers) whose addresses go in the records' ``name``
field, as CUPTI's do. :func:`objects` builds, from the same bytes, the Python objects
cupti-python hands to a buffer-completed callback (its ``ActivityKernel11`` ... classes
over the record memory), or plain objects read with ``struct`` without cupti-python.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.agent.cupti_records import (
    KIND_CONCURRENT_KERNEL,
    KIND_EXTERNAL_CORRELATION,
    KIND_MEMCPY,
    KIND_MEMCPY2,
    KIND_MEMSET,
    KIND_RUNTIME,
)

BUFFER_BYTES = 4 << 20


def _replica(size: int, fields: dict[str, tuple[int, str]]) -> np.dtype:
    names = list(fields)
    return np.dtype(
        {
            "names": names,
            "formats": [fields[n][1] for n in names],
            "offsets": [fields[n][0] for n in names],
            "itemsize": size,
        }
    )


#: CUpti_ActivityKernel11 / Memcpy6 / Memset4 / ExternalCorrelation / API (their CUPTI header layouts).
_REPLICAS = {
    KIND_CONCURRENT_KERNEL: _replica(
        224,
        {
            "kind": (0, "<i4"),
            "registers_per_thread": (6, "<u2"),
            "partitioned_global_cache_requested": (8, "<i4"),
            "partitioned_global_cache_executed": (12, "<i4"),
            "start": (16, "<u8"),
            "end": (24, "<u8"),
            "completed": (32, "<u8"),
            "device_id": (40, "<u4"),
            "context_id": (44, "<u4"),
            "stream_id": (48, "<u4"),
            "grid_x": (52, "<i4"),
            "grid_y": (56, "<i4"),
            "grid_z": (60, "<i4"),
            "block_x": (64, "<i4"),
            "block_y": (68, "<i4"),
            "block_z": (72, "<i4"),
            "static_shared_memory": (76, "<i4"),
            "correlation_id": (92, "<u4"),
            "grid_id": (96, "<i8"),
            "name": (104, "<i8"),
            "queued": (120, "<u8"),
            "submitted": (128, "<u8"),
            "launch_type": (136, "u1"),
            "graph_node_id": (144, "<u8"),
            "graph_id": (156, "<u4"),
            "channel_id": (168, "<u4"),
            "cluster_x": (176, "<u4"),
            "cluster_y": (180, "<u4"),
            "cluster_z": (184, "<u4"),
            "priority": (216, "<i4"),
        },
    ),
    KIND_MEMCPY: _replica(
        96,
        {
            "kind": (0, "<i4"),
            "copy_kind": (4, "u1"),
            "src_kind": (5, "u1"),
            "dst_kind": (6, "u1"),
            "bytes": (8, "<u8"),
            "start": (16, "<u8"),
            "end": (24, "<u8"),
            "device_id": (32, "<u4"),
            "context_id": (36, "<u4"),
            "stream_id": (40, "<u4"),
            "correlation_id": (44, "<u4"),
            "graph_node_id": (64, "<u8"),
            "graph_id": (72, "<u4"),
            "copy_count": (88, "<u8"),
        },
    ),
    KIND_MEMSET: _replica(
        88,
        {
            "kind": (0, "<i4"),
            "value": (4, "<u4"),
            "bytes": (8, "<u8"),
            "start": (16, "<u8"),
            "end": (24, "<u8"),
            "device_id": (32, "<u4"),
            "context_id": (36, "<u4"),
            "stream_id": (40, "<u4"),
            "correlation_id": (44, "<u4"),
            "memory_kind": (50, "<u2"),
            "graph_node_id": (64, "<u8"),
            "graph_id": (72, "<u4"),
        },
    ),
    KIND_MEMCPY2: _replica(
        96,
        {
            "kind": (0, "<i4"),
            "copy_kind": (4, "u1"),
            "bytes": (8, "<u8"),
            "start": (16, "<u8"),
            "end": (24, "<u8"),
            "device_id": (32, "<u4"),
            "context_id": (36, "<u4"),
            "stream_id": (40, "<u4"),
            "src_device_id": (44, "<u4"),
            "dst_device_id": (52, "<u4"),
            "correlation_id": (60, "<u4"),
            "graph_node_id": (72, "<u8"),
            "graph_id": (80, "<u4"),
        },
    ),
    KIND_EXTERNAL_CORRELATION: _replica(
        24,
        {
            "kind": (0, "<i4"),
            "external_kind": (4, "<i4"),
            "external_id": (8, "<u8"),
            "correlation_id": (16, "<u4"),
        },
    ),
    KIND_RUNTIME: _replica(
        40,
        {
            "kind": (0, "<i4"),
            "cbid": (4, "<u4"),
            "start": (8, "<u8"),
            "end": (16, "<u8"),
            "process_id": (24, "<u4"),
            "thread_id": (28, "<u4"),
            "correlation_id": (32, "<u4"),
        },
    ),
}
_CUPTI_NAMES = {
    KIND_CONCURRENT_KERNEL: ("activity_kernel11_dtype", "ActivityKernel11"),
    KIND_MEMCPY: ("activity_memcpy6_dtype", "ActivityMemcpy6"),
    KIND_MEMCPY2: ("activity_memcpy_pto_p4_dtype", "ActivityMemcpyPtoP4"),
    KIND_MEMSET: ("activity_memset4_dtype", "ActivityMemset4"),
    KIND_EXTERNAL_CORRELATION: ("activity_external_correlation_dtype", "ActivityExternalCorrelation"),
    KIND_RUNTIME: ("activity_api_dtype", "ActivityAPI"),
}


def cupti_python() -> Any:
    """cupti-python's ``cupti.cupti`` module, or None when it is not installed."""
    try:
        from cupti import cupti
    except ImportError:
        return None
    return cupti


def record_dtypes() -> tuple[dict[int, np.dtype], str]:
    """Kind → record dtype, and where they come from (``cupti-python X`` or ``replica``)."""
    cupti = cupti_python()
    if cupti is None:
        return dict(_REPLICAS), "replica"
    from importlib.metadata import version

    dtypes = {kind: np.dtype(getattr(cupti, d)) for kind, (d, _) in _CUPTI_NAMES.items()}
    return dtypes, f"cupti-python {version('cupti-python')}"


def sizes() -> dict[int, int]:
    """Kind → record bytes of :func:`record_dtypes` (kernels of both kernel kinds)."""
    dtypes, _ = record_dtypes()
    out = {k: d.itemsize for k, d in dtypes.items()}
    out[3] = out[KIND_CONCURRENT_KERNEL]
    return out


class Names:
    """Kernel names as C strings that stay alive; ``pointer(i)`` is the address of name ``i``."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self._buffers = [ctypes.create_string_buffer(n.encode()) for n in self.names]
        self.pointers = np.array([ctypes.addressof(b) for b in self._buffers], np.int64)


@dataclass
class Buffers:
    """Activity buffers in one memory array, as CUPTI fills them (records end to end, 8-aligned).

    ``buffers`` is ``(start byte, valid bytes)`` per buffer; ``offsets`` the byte offset of
    every record in the memory, ``kinds`` its kind, in order.
    """

    memory: np.ndarray
    buffers: list[tuple[int, int]]
    offsets: np.ndarray
    kinds: np.ndarray
    names: Names
    dtypes: dict[int, np.dtype]
    keep: list[Any] = field(default_factory=list)

    def per_buffer(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(buffer index, record offsets, kinds)`` per buffer."""
        bounds = np.searchsorted(self.offsets, [s for s, _ in self.buffers] + [self.memory.size])
        for b in range(len(self.buffers)):
            lo, hi = bounds[b], bounds[b + 1]
            yield b, self.offsets[lo:hi], self.kinds[lo:hi]


def _dtype(dtypes: dict[int, np.dtype], kind: int) -> np.dtype:
    return dtypes[KIND_CONCURRENT_KERNEL if kind == 3 else kind]


def lay_out(
    records: Sequence[tuple[int, dict[str, Any]]],
    names: Names,
    buffer_bytes: int = BUFFER_BYTES,
    dtypes: dict[int, np.dtype] | None = None,
) -> Buffers:
    """Write ``(kind, field values)`` records into buffers of ``buffer_bytes``, filling each as CUPTI does.

    A field value ``name`` is an index into ``names`` (its pointer is written); kind 3 (KERNEL)
    records use the concurrent-kernel layout.
    """
    kinds = np.array([k for k, _ in records], np.int64)
    columns: dict[int, dict[str, list[Any]]] = {}
    for kind, values in records:
        cols = columns.setdefault(kind, {})
        count = int(np.count_nonzero(kinds == kind))
        for k in values:
            cols.setdefault(k, [0] * count)
    seen: dict[int, int] = {}
    for kind, values in records:
        i = seen.get(kind, 0)
        seen[kind] = i + 1
        for k, v in values.items():
            columns[kind][k][i] = v
    arrays = {kind: {k: np.asarray(v) for k, v in cols.items()} for kind, cols in columns.items()}
    return lay_out_columns(kinds, arrays, names, buffer_bytes, dtypes)


def lay_out_columns(
    kinds: np.ndarray,
    columns: dict[int, dict[str, np.ndarray]],
    names: Names,
    buffer_bytes: int = BUFFER_BYTES,
    dtypes: dict[int, np.dtype] | None = None,
) -> Buffers:
    """:func:`lay_out` for many records: ``columns[kind][field]`` holds the values of that kind's records."""
    dtypes = dtypes or record_dtypes()[0]
    size_of = np.zeros(256, np.int64)
    for k in np.unique(kinds).tolist():
        size_of[k] = _dtype(dtypes, k).itemsize
    sizes = size_of[kinds]
    # Fill buffers in order: a record that does not fit starts the next buffer.
    csum = np.concatenate([[0], np.cumsum(sizes)])
    offsets = np.empty(kinds.size, np.int64)
    starts, valid = [], []
    base, i = 0, 0
    while i < kinds.size:
        j = int(np.searchsorted(csum, csum[i] + buffer_bytes, "right")) - 1
        offsets[i:j] = base + csum[i:j] - csum[i]
        starts.append(base)
        valid.append(int(csum[j] - csum[i]))
        base += buffer_bytes
        i = j
    memory = np.zeros(max(base, 8), np.uint8)
    words64 = memory.view(np.uint64)
    for kind in np.unique(kinds).tolist():
        sel = np.flatnonzero(kinds == kind)
        dt = _dtype(dtypes, kind)
        recs = np.zeros(sel.size, dt)
        recs["kind"] = kind
        for k, v in columns.get(kind, {}).items():
            recs[k] = names.pointers[np.asarray(v)] if k == "name" else v
        words = dt.itemsize // 8
        idx = (offsets[sel] // 8)[:, None] + np.arange(words)
        words64[idx] = recs.view(np.uint64).reshape(sel.size, words)
    return Buffers(memory, list(zip(starts, valid, strict=True)), offsets, kinds.copy(), names, dtypes)


# --- the objects cupti-python hands over -----------------------------------------------------------


class _Record:
    """A record read field by field with ``struct`` (stand-in for cupti-python's record classes)."""

    __slots__ = ("__dict__",)


def _plain(memory: np.ndarray, offset: int, dt: np.dtype) -> Any:
    obj = _Record()
    raw = memory[offset : offset + dt.itemsize].tobytes()
    for name in dt.names or ():
        sub, off = dt.fields[name][:2]
        if sub.kind in "iu" and sub.shape == ():
            code = {1: "b", 2: "h", 4: "i", 8: "q"}[sub.itemsize]
            (value,) = struct.unpack_from("<" + (code.upper() if sub.kind == "u" else code), raw, off)
            if name == "name":
                value = ctypes.string_at(value).decode() if value else ""
            setattr(obj, name, value)
    return obj


def objects(bufs: Buffers, buffer: int) -> list[Any]:
    """The objects of ``buffer``'s whole records, as cupti-python builds them for a completed buffer.

    Only records that end within the buffer's valid bytes are handed over (a cut one is not a record).
    """
    cupti = cupti_python()
    base = bufs.memory.ctypes.data
    start, valid = bufs.buffers[buffer]
    offsets, kinds = next((o, k) for b, o, k in bufs.per_buffer() if b == buffer)
    sizes = np.array([_dtype(bufs.dtypes, int(k)).itemsize for k in kinds], np.int64)
    whole = offsets + sizes <= start + valid
    offsets, kinds = offsets[whole], kinds[whole]
    out = []
    if cupti is not None:
        classes = {k: getattr(cupti, c) for k, (_, c) in _CUPTI_NAMES.items()}
        classes[3] = classes[KIND_CONCURRENT_KERNEL]
        for off, kind in zip(offsets.tolist(), kinds.tolist(), strict=True):
            out.append(classes[kind].from_ptr(base + off, readonly=True))
        return out
    for off, kind in zip(offsets.tolist(), kinds.tolist(), strict=True):
        out.append(_plain(bufs.memory, off, _dtype(bufs.dtypes, kind)))
    return out


def object_path(bufs: Buffers, offset_ns: int = 0) -> Any:
    """Today's path over ``bufs``: cupti-python's objects, :func:`collect` per buffer, one :func:`decode`."""
    from argus.agent.cupti import collect, decode

    return decode([collect(objects(bufs, b)) for b in range(len(bufs.buffers))], offset_ns)


# --- realistic streams of records ----------------------------------------------------------------

#: Kernel names of the kinds a training job launches: NCCL (both families), cuBLAS, PyTorch (mangled).
NCCL_NAMES = (
    "ncclKernel_AllReduce_RING_LL_Sum_float",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t",
)


def kernel_names(count: int) -> list[str]:
    """``count`` distinct kernel names: NCCL ones, cuBLAS-style, and Itanium-mangled C++ ones."""
    out = list(NCCL_NAMES)
    i = 0
    while len(out) < count:
        base = f"kernel{i}_{'xyzw'[i % 4]}"
        out.append(f"_ZN2at6native{len(base)}{base}IfEEvPT_i" if i % 3 == 0 else f"sm90_xmma_gemm_{base}")
        i += 1
    return out[:count]


def realistic(
    n: int,
    seed: int = 0,
    names: int = 300,
    mix: tuple[float, float, float, float] = (0.80, 0.07, 0.05, 0.08),
    bad_timestamps: float = 0.01,
    graphs: float = 0.2,
    buffer_bytes: int = BUFFER_BYTES,
    hostile: bool = False,
) -> Buffers:
    """``n`` records, kinds interleaved at random in ``mix`` (kernel, memcpy, memset, external
    correlation), timestamps rising, a share of them zero or inverted, a share of the kernels
    launched from CUDA graphs. ``hostile`` fills small fields (stream, device, grid, ...) with
    values equal to record kinds, so that many words inside records look like record starts.
    """
    rng = np.random.default_rng(seed)
    table = Names(kernel_names(names))
    kinds = rng.choice(
        [KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_EXTERNAL_CORRELATION], size=n, p=mix
    ).astype(np.int64)
    corr = np.arange(1, n + 1)
    start_all = 1_700_000_000_000 + np.cumsum(rng.integers(100, 5_000, n))
    dur_all = rng.integers(1_000, 90_000, n)
    small = [1, 2, 3, 10, 39] if hostile else [7, 13, 14, 20]
    cols: dict[int, dict[str, Any]] = {}
    for kind in (KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_EXTERNAL_CORRELATION):
        sel = kinds == kind
        m = int(sel.sum())
        c: dict[str, Any] = {"correlation_id": corr[sel]}
        if kind == KIND_EXTERNAL_CORRELATION:
            c.update(external_kind=5, external_id=rng.integers(1, 10_000, m))
            cols[kind] = c
            continue
        start = start_all[sel].copy()
        end = start + dur_all[sel]
        r = rng.random(m)
        start[r < bad_timestamps / 3] = 0
        end[(r >= bad_timestamps / 3) & (r < 2 * bad_timestamps / 3)] = 0
        inverted = (r >= 2 * bad_timestamps / 3) & (r < bad_timestamps)
        end[inverted] = start[inverted] - 5
        in_graph = rng.random(m) < graphs
        c.update(
            start=start,
            end=end,
            device_id=rng.choice([0, 1, 2, 3] if hostile else [0], m),
            context_id=1,
            stream_id=rng.choice(small, m),
            graph_id=np.where(in_graph, rng.integers(1, 5, m), 0),
            graph_node_id=np.where(in_graph, rng.integers(1, 1 << 40, m), 0),
        )
        if kind == KIND_CONCURRENT_KERNEL:
            one = 1 if not hostile else rng.choice([1, 2, 3, 10, 39], m)
            c.update(
                name=rng.integers(0, names, m),
                grid_x=rng.integers(1, 4096, m),
                grid_y=one,
                grid_z=one,
                block_x=rng.choice([128, 256, 512], m),
                block_y=one,
                block_z=one,
                cluster_x=one,
                cluster_y=one,
                cluster_z=one,
                partitioned_global_cache_requested=rng.integers(0, 4, m),
                registers_per_thread=rng.integers(16, 255, m),
                channel_id=rng.integers(0, 40, m),
                queued=start - 500,
                submitted=start - 300,
                completed=end,
            )
        elif kind == KIND_MEMCPY:
            c.update(copy_kind=rng.integers(0, 13, m), bytes=rng.integers(1, 1 << 30, m))
        else:
            c.update(value=0, bytes=rng.integers(1, 1 << 20, m))
        cols[kind] = c
    return lay_out_columns(kinds, cols, table, buffer_bytes)
