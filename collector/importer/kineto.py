"""Streaming parser of PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped.

A trace is one JSON object: ``distributedInfo`` (rank, world size, process
groups), ``traceEvents`` (the events) and, in newer Kineto, a
``baseTimeNanoseconds`` that may stand *after* ``traceEvents``. This module
reads such a file once, incrementally, with ijson's C backend (``yajl2_c``),
and keeps only what Argus stores, as columns:

- GPU activity: events of category ``kernel``, ``gpu_memcpy``, ``gpu_memset``
  (name, stream, device, correlation, start, duration);
- NCCL kernels among them, with the collective's metadata where Kineto wrote it
  (``Collective name``, ``In msg nelems``, ``dtype``, ``Process Group Name``);
- steps: ``ProfilerStep#N`` annotations;
- the CPU launch time of each kernel (``cuda_runtime``/``cuda_driver`` events,
  matched by correlation id): a collective's issue time.

Memory stays bounded by the columns kept, not by the file: the top-level object
is built by ijson with a ``map_type`` that hands us the top-level dict, whose
``traceEvents`` list is drained after every chunk (ijson attaches a container to
its parent when the container starts, so every element but the last of that
list is complete). Whatever else a trace holds (CPU ops, flows) is dropped as
soon as it is parsed.

Times: ``ts``/``dur`` are µs, integers or decimals carrying ns
(``1712195495519689.047``); ijson yields those as :class:`decimal.Decimal`, so
they convert to integer ns exactly. They are kept relative to the file until the
time base is known: with ``baseTimeNanoseconds``, epoch ns = base + ts; without
it, ``ts`` is µs since the epoch. A result outside the years 2000-2100 is an
error, not a guess.
"""

from __future__ import annotations

import hashlib
import io
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import numpy as np
from numpy.typing import NDArray

from argus.errors import TraceError
from argus.kernels import KernelEvents, StepSpans, collective_op
from argus.limits import ByteBudget, Gunzip, check_declared

__all__ = [
    "BACKEND",
    "CollectiveMeta",
    "ParsedTrace",
    "ProcessGroup",
    "file_digest",
    "parse_trace",
    "trace_name",
]

#: The ijson backend in use; ``yajl2_c`` unless its C extension is missing.
BACKEND: str
try:
    _ijson: Any = ijson.get_backend("yajl2_c")
    BACKEND = "yajl2_c"
except ImportError:  # pragma: no cover - the wheel ships the C extension
    _ijson = ijson
    BACKEND = ijson.backend

_CATEGORY_KIND = {
    "kernel": 0,
    "Kernel": 0,
    "gpu_memcpy": 1,
    "Memcpy": 1,
    "gpu_memset": 2,
    "Memset": 2,
}
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
_STEP_CATEGORIES = frozenset({"user_annotation", "cpu_op", "Operator", "User annotation"})
_STEP_PREFIX = "ProfilerStep#"
#: Bytes per element of the ``dtype`` names Kineto writes for collectives.
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "int": 4,
    "int32": 4,
    "uint32": 4,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "short": 2,
    "int16": 2,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
#: Plausible epoch range of a trace, ns: 2000-01-01 to 2100-01-01.
_EPOCH_MIN_NS = 946_684_800 * 10**9
_EPOCH_MAX_NS = 4_102_444_800 * 10**9
_CHUNK_BYTES = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ProcessGroup:
    """One entry of ``distributedInfo.pg_config``: name, global ranks, backend ('nccl', ...)."""

    name: str
    ranks: tuple[int, ...]
    backend: str


@dataclass(frozen=True)
class CollectiveMeta:
    """What Kineto wrote about one NCCL kernel; empty strings / 0 where it wrote nothing.

    ``row`` indexes the kernel in :attr:`ParsedTrace.start_ns`; ``bytes`` is the
    input message size (``In msg nelems`` x element size of ``dtype``).
    """

    row: int
    op: str
    bytes: int
    process_group: str


@dataclass(frozen=True)
class ParsedTrace:
    """The columns of one trace file that Argus stores; rank-agnostic.

    GPU activity arrays all have shape ``(n,)``, in file order; times are
    integer ns since the epoch.

    Attributes:
        name: The file's name, for messages.
        digest: BLAKE2b-128 hex digest of the file's bytes as read (compressed or not).
        rank: ``distributedInfo.rank``; None when the file has none.
        world_size: ``distributedInfo.world_size``; None when absent.
        backend: ``distributedInfo.backend`` ('nccl', 'gloo', ...) or ''.
        process_groups: ``distributedInfo.pg_config``, empty when absent.
        resolution_ns: 1000 when every GPU duration is a whole µs, else 1.
        kind: Code into :data:`KINDS`, int8.
        kernel_code: Index into ``kernel_names``, int32.
        kernel_names: Distinct names of GPU activities.
        stream, device, correlation: From the event's ``args`` (0, -1, 0 when absent), int64.
        start_ns, dur_ns: int64.
        launch_ns: CPU launch time of each activity (matched by correlation), -1 if unknown.
        collectives: One entry per NCCL kernel, in file order.
        step, step_start_ns, step_dur_ns: ``ProfilerStep#N`` events, sorted by start.
        pid: The process id of the first ``ProfilerStep`` event (0 if none).
        first_ns, last_ns: Earliest start and latest end of the events kept.
    """

    name: str
    digest: str
    rank: int | None
    world_size: int | None
    backend: str
    process_groups: tuple[ProcessGroup, ...]
    resolution_ns: int
    kind: NDArray[np.int8]
    kernel_code: NDArray[np.int32]
    kernel_names: tuple[str, ...]
    stream: NDArray[np.int64]
    device: NDArray[np.int64]
    correlation: NDArray[np.int64]
    start_ns: NDArray[np.int64]
    dur_ns: NDArray[np.int64]
    launch_ns: NDArray[np.int64]
    collectives: tuple[CollectiveMeta, ...]
    step: NDArray[np.int64]
    step_start_ns: NDArray[np.int64]
    step_dur_ns: NDArray[np.int64]
    pid: int
    first_ns: int
    last_ns: int

    @property
    def is_collective(self) -> NDArray[np.bool_]:
        """Mask over the GPU activities: True for NCCL kernels, shape ``(n,)``."""
        mask = np.zeros(self.start_ns.size, dtype=bool)
        mask[[c.row for c in self.collectives]] = True
        return mask

    def kernel_events(self, rank: int) -> KernelEvents:
        """The GPU activities as :class:`~argus.kernels.KernelEvents` of ``rank``.

        Each is placed in a step by its CPU launch where the trace has it, else by its GPU start.
        """
        return KernelEvents(
            rank=np.full(self.start_ns.size, rank, np.int64),
            kind=self.kind.astype(np.int64),
            kernel=self.kernel_code.astype(np.int64),
            names=self.kernel_names,
            stream=self.stream,
            start_ns=self.start_ns,
            when_ns=np.where(self.launch_ns >= 0, self.launch_ns, self.start_ns),
            dur_ns=self.dur_ns,
            # Kineto traces name no CUDA graph: every kernel counts as launched eagerly.
            graph_id=np.zeros(self.start_ns.size, np.int64),
            graph_node_id=np.zeros(self.start_ns.size, np.uint64),
        )

    def step_spans(self, rank: int) -> StepSpans:
        """The ``ProfilerStep`` spans as :class:`~argus.kernels.StepSpans` of ``rank``."""
        return StepSpans.of(np.full(self.step.size, rank, np.int64), self.step_start_ns, self.step_dur_ns)


def trace_name(source: Path | BinaryIO) -> str:
    """A name for ``source`` in messages: its path, or the file object's ``name``, or ``<stream>``."""
    if isinstance(source, Path):
        return str(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


class _Reader:
    """Raw bytes of a source, hashed as they are read; replays the bytes sniffed for gzip."""

    def __init__(self, raw: BinaryIO, head: bytes) -> None:
        self._raw = raw
        self._head = head
        self.hash = hashlib.blake2b(head, digest_size=16)
        #: Bytes read from the source so far (the sniffed head included).
        self.read_bytes = len(head)

    def read(self, size: int = -1) -> bytes:
        head, self._head = self._head, b""
        if head and 0 <= size <= len(head):
            self._head = head[size:]
            return head[:size]
        data = self._raw.read(size - len(head) if size >= 0 else -1)
        self.hash.update(data)
        self.read_bytes += len(data)
        return head + data

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("a trace is read once, front to back")


def _ns(value: Any) -> int:
    """µs (int or Decimal, as ijson yields them) to integer ns, rounded half-even below 1 ns."""
    if type(value) is int:
        return value * 1000
    if type(value) is Decimal:
        return int((value * 1000).to_integral_value())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return round(value * 1000)
    raise ValueError(f"not a number: {value!r}")


def _int(value: Any, default: int) -> int:
    if value is None:
        return default
    if type(value) is int:
        return value
    return int(value)


def _op_name(raw: str) -> str:
    """Normalise a collective's name: 'all_reduce', '_allgather_base' → 'allreduce', 'allgather'."""
    name = raw.lower().removeprefix("nccl:").strip("_")
    return name.removesuffix("_base").replace("_", "")


def _backend_of(config: str) -> str:
    """'cuda:nccl' → 'nccl'; 'cpu:gloo,cuda:nccl' → 'nccl'; 'gloo' → 'gloo'."""
    parts = [p.strip() for p in config.split(",") if p.strip()]
    for part in parts:
        if part.startswith("cuda:"):
            return part.removeprefix("cuda:")
    return parts[0].rpartition(":")[2] if parts else ""


class _Builder:
    """Column builders for one trace; :meth:`add` takes each parsed event once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0  # events seen, = index of the next event in traceEvents
        self.kind = array("b")
        self.kernel_code = array("i")
        self.stream = array("q")
        self.device = array("q")
        self.correlation = array("q")
        self.start = array("q")
        self.dur = array("q")
        self.names: dict[str, int] = {}
        self.nccl_op: list[str | None] = []  # per name code: op from the kernel name, None if not NCCL
        self.collectives: list[CollectiveMeta] = []
        self.launch_corr = array("q")
        self.launch_start = array("q")
        self.step = array("q")
        self.step_start = array("q")
        self.step_dur = array("q")
        self.pid = 0

    def _fail(self, index: int, event: dict[str, Any], problem: str) -> TraceError:
        return TraceError(
            f"{self.name}: traceEvents[{index}] ({event.get('name', '?')!r}, ph {event.get('ph', '?')!r}) "
            f"{problem}"
        )

    def add(self, events: list[dict[str, Any]]) -> None:
        """Take complete events; raises TraceError naming the event's index in ``traceEvents``."""
        index = self.count
        try:
            for event in events:
                if event.get("ph") == "X":
                    self._add_complete(index, event)
                index += 1
        except TraceError:
            raise
        except (ValueError, TypeError, AttributeError, ArithmeticError) as exc:
            raise self._fail(index, event, f"has a malformed field: {exc}") from exc
        self.count = index

    def _add_complete(self, index: int, event: dict[str, Any]) -> None:
        ts = event.get("ts")
        dur = event.get("dur")
        if ts is None or dur is None:
            raise self._fail(index, event, f"has no {'ts' if ts is None else 'dur'}")
        cat = event.get("cat")
        kind = _CATEGORY_KIND.get(cat) if isinstance(cat, str) else None
        if kind is not None:
            self._add_activity(kind, event, _ns(ts), _ns(dur))
        elif cat in _LAUNCH_CATEGORIES:
            corr = (event.get("args") or {}).get("correlation")
            # cudaLaunchKernel(ExC), cuLaunchKernel(Ex): kernel launches; memcpy/sync calls are not kept.
            if corr is not None and "Launch" in str(event.get("name")):
                self.launch_corr.append(_int(corr, 0))
                self.launch_start.append(_ns(ts))
        elif cat in _STEP_CATEGORIES:
            name = event.get("name")
            if isinstance(name, str) and name.startswith(_STEP_PREFIX):
                self.step.append(check_declared("ProfilerStep#N", int(name[len(_STEP_PREFIX) :]), "max_step"))
                self.step_start.append(_ns(ts))
                self.step_dur.append(_ns(dur))
                if not self.pid and type(event.get("pid")) is int:
                    self.pid = event["pid"]

    def _add_activity(self, kind: int, event: dict[str, Any], start: int, dur: int) -> None:
        if dur < 0:
            raise ValueError(f"negative duration {dur} ns")
        name = event.get("name")
        if not isinstance(name, str):
            raise ValueError("no name")
        code = self.names.get(name)
        if code is None:
            code = self.names[name] = len(self.names)
            # A kernel whose name says which collective it runs (argus.kernels owns the rule).
            self.nccl_op.append(collective_op(name) if kind == 0 else None)
        args = event.get("args") or {}
        row = len(self.start)
        self.kind.append(kind)
        self.kernel_code.append(code)
        self.stream.append(check_declared("stream", _int(args.get("stream"), 0), "max_stream"))
        self.device.append(check_declared("device", _int(args.get("device"), -1), "max_device", lowest=-1))
        self.correlation.append(_int(args.get("correlation"), 0))
        self.start.append(start)
        self.dur.append(dur)
        collective = args.get("Collective name")
        if kind == 0 and (collective is not None or self.nccl_op[code] is not None):
            nelems = check_declared("In msg nelems", _int(args.get("In msg nelems"), 0), "max_elements")
            dtype = str(args.get("dtype", "")).lower()
            self.collectives.append(
                CollectiveMeta(
                    row=row,
                    op=_op_name(str(collective)) if collective is not None else str(self.nccl_op[code]),
                    bytes=nelems * _DTYPE_BYTES.get(dtype, 0),
                    process_group=str(args.get("Process Group Name", "")),
                )
            )


def _open_bytes(raw: BinaryIO, name: str) -> tuple[Any, _Reader]:
    """A binary stream of the JSON text in ``raw`` (gunzipped if gzip), and its hashing reader."""
    try:
        head = raw.read(2)
    except OSError as exc:
        raise TraceError(f"{name}: cannot read: {exc}") from exc
    reader = _Reader(raw, head)
    if head == _GZIP_MAGIC:
        return Gunzip(reader), reader  # type: ignore[arg-type]
    return reader, reader


def _chunks(
    stream: Any,
    name: str,
    builder: _Builder,
    budget: ByteBudget | None = None,
    gzipped: _Reader | None = None,
) -> Iterator[tuple[int, bytes]]:
    """The JSON text of ``stream`` in chunks with their offsets; each counted against ``budget``,
    and, for a gzip file (``gzipped``: its compressed bytes), its inflation ratio checked."""
    offset = 0
    while True:
        try:
            chunk = stream.read(_CHUNK_BYTES)
            if budget is not None:
                budget.take(len(chunk))
                if gzipped is not None:
                    budget.check_ratio(name, offset + len(chunk), gzipped.read_bytes)
        except EOFError as exc:
            raise TraceError(
                f"{name}: the gzip stream ends early (truncated file?) near byte {offset} "
                f"of the JSON text, after traceEvents[{builder.count - 1}]"
            ) from exc
        except (OSError, zlib.error) as exc:
            raise TraceError(f"{name}: cannot read near byte {offset} of the JSON text: {exc}") from exc
        if not chunk:
            return
        yield offset, chunk
        offset += len(chunk)


def _drain(top: dict[str, Any] | None, builder: _Builder, *, final: bool) -> None:
    """Hand the complete events of the top-level ``traceEvents`` list to ``builder`` and drop them."""
    if top is None:
        return
    events = top.get("traceEvents")
    if not isinstance(events, list):
        return
    done = len(events) if final else len(events) - 1
    if done > 0:
        builder.add(events[:done])
        del events[:done]


def _distributed_info(
    top: dict[str, Any], name: str
) -> tuple[int | None, int | None, str, list[ProcessGroup]]:
    info = top.get("distributedInfo") or {}
    if not isinstance(info, dict):
        raise TraceError(f"{name}: distributedInfo is not an object")
    try:
        rank = None if info.get("rank") is None else check_declared("rank", int(info["rank"]), "max_rank")
        world = None if info.get("world_size") is None else int(info["world_size"])
        if world is not None:
            check_declared("world_size", world, "max_world_size")
        groups = [
            ProcessGroup(
                name=str(pg.get("pg_name", "")),
                ranks=_group_ranks(pg.get("ranks") or ()),
                backend=_backend_of(str(pg.get("backend_config", ""))),
            )
            for pg in info.get("pg_config") or ()
        ]
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceError(f"{name}: malformed distributedInfo: {exc}") from exc
    return rank, world, str(info.get("backend", "")), groups


def _group_ranks(ranks: Any) -> tuple[int, ...]:
    """A process group's members, each a rank within limits, at most ``max_group_ranks`` of them."""
    if not isinstance(ranks, list | tuple):
        raise TypeError(f"ranks is {type(ranks).__name__}, not a list")
    check_declared("pg_config.ranks (members)", len(ranks), "max_group_ranks")
    return tuple(check_declared("pg_config.ranks", int(r), "max_rank") for r in ranks)


def _launch_times(builder: _Builder, correlation: NDArray[np.int64]) -> NDArray[np.int64]:
    """CPU launch time, relative ns, of each activity by correlation id; -1 where none matches."""
    corr = np.frombuffer(builder.launch_corr, dtype=np.int64)
    start = np.frombuffer(builder.launch_start, dtype=np.int64)
    out = np.full(correlation.size, -1, dtype=np.int64)
    if corr.size == 0 or correlation.size == 0:
        return out
    order = np.argsort(corr, kind="stable")
    sorted_corr = corr[order]
    pos = np.minimum(np.searchsorted(sorted_corr, correlation), sorted_corr.size - 1)
    hit = (sorted_corr[pos] == correlation) & (correlation != 0)
    out[hit] = start[order[pos[hit]]]
    return out


def parse_trace(
    source: Path | BinaryIO, *, name: str | None = None, budget: ByteBudget | None = None
) -> ParsedTrace:
    """Parse one Kineto trace, streaming; nothing of the file is held but the kept columns.

    Args:
        source: A path, or a binary file object positioned at the start of the
            trace (plain JSON or gzip; detected from the first bytes).
        name: The name used in messages (default: the path or the object's ``name``).
        budget: Bytes of JSON text (after gunzip), text per gzip byte and CPU time the trace
            may use (:class:`argus.limits.ByteBudget`); None: no cap.

    Returns:
        The trace's columns at epoch ns.

    Raises:
        TraceError: unreadable or truncated gzip, invalid or truncated JSON (the
            message names the byte offset and the last complete event), a complete
            event without ``ts`` or ``dur`` or with a malformed field (names its
            index in ``traceEvents``), no ``traceEvents``, or times that do not land
            between the years 2000 and 2100, or a declared size (world size,
            rank, group member, element count) past :data:`argus.limits.LIMITS`.
        TooLarge: the text is past ``budget``, inflates past ``max_inflate_ratio``, or parsing
            is past ``budget.max_parse_s`` (gzip is inflated 64 KiB at a time).
    """
    name = name or trace_name(source)
    if not isinstance(source, Path):
        return _parse(source, name, budget)
    try:
        raw = source.open("rb")
    except OSError as exc:
        raise TraceError(f"{name}: cannot open: {exc}") from exc
    with raw:
        return _parse(raw, name, budget)


def _parse(raw: BinaryIO, name: str, budget: ByteBudget | None = None) -> ParsedTrace:
    stream, reader = _open_bytes(raw, name)
    builder = _Builder(name)
    holder: list[dict[str, Any]] = []

    class _TopMap(dict[str, Any]):
        """ijson's ``map_type``: the first one created is the top-level object; see the module doc."""

        def __init__(self) -> None:
            holder.append(self)
            del _TopMap.__init__  # later maps are plain dict construction (C speed)

    result = ijson.sendable_list()
    coro = _ijson.items_coro(result, "", map_type=_TopMap)
    offset = 0
    try:
        for offset, chunk in _chunks(stream, name, builder, budget, None if stream is reader else reader):
            if offset == 0 and not chunk.lstrip()[:1] == b"{":
                raise TraceError(f"{name}: not a Kineto trace: the JSON text must be an object")
            coro.send(chunk)
            _drain(holder[0] if holder else None, builder, final=False)
        coro.close()
    except ijson.JSONError as exc:
        what = "ends early (truncated file?)" if "premature EOF" in str(exc) else "is not valid JSON"
        raise TraceError(
            f"{name}: the JSON text {what} near byte {offset}, after traceEvents[{builder.count - 1}]: {exc}"
        ) from exc
    if not result or not isinstance(result[0], dict):
        raise TraceError(f"{name}: not a Kineto trace: the JSON text must be an object")
    top = result[0]
    if "traceEvents" not in top:
        raise TraceError(f"{name}: not a Kineto trace: no traceEvents")
    _drain(top, builder, final=True)
    return _finish(builder, top, reader.hash.hexdigest())


def _finish(builder: _Builder, top: dict[str, Any], digest: str) -> ParsedTrace:
    name = builder.name
    rank, world, backend, groups = _distributed_info(top, name)
    base = top.get("baseTimeNanoseconds")
    try:
        base_ns = 0 if base is None else int(base)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{name}: baseTimeNanoseconds is not an integer: {base!r}") from exc

    def col(a: array[int], dtype: type[np.generic]) -> NDArray[Any]:
        # A view, no copy: the builder's array lives on as the column's buffer.
        return np.frombuffer(a, dtype=dtype) if len(a) else np.empty(0, dtype)

    start = col(builder.start, np.int64)
    start += base_ns
    dur = col(builder.dur, np.int64)
    correlation = col(builder.correlation, np.int64)
    launch = _launch_times(builder, correlation)
    launch[launch >= 0] += base_ns
    step_start = col(builder.step_start, np.int64)
    step_start += base_ns
    step_dur = col(builder.step_dur, np.int64)
    order = np.argsort(step_start, kind="stable")
    ends = np.concatenate([start + dur, step_start + step_dur])
    starts = np.concatenate([start, step_start])
    if starts.size == 0:
        first = last = base_ns
    else:
        first, last = int(starts.min()), int(ends.max())
        if first < _EPOCH_MIN_NS or last > _EPOCH_MAX_NS:
            how = "with" if base is not None else "without"
            raise TraceError(
                f"{name}: event times do not land between the years 2000 and 2100 ({how} "
                f"baseTimeNanoseconds): earliest {first} ns since the epoch; relative `ts` needs "
                "baseTimeNanoseconds"
            )
    resolution = 1000 if dur.size and not np.any(dur % 1000) else 1
    return ParsedTrace(
        name=name,
        digest=digest,
        rank=rank,
        world_size=world,
        backend=backend,
        process_groups=tuple(groups),
        resolution_ns=resolution,
        kind=col(builder.kind, np.int8),
        kernel_code=col(builder.kernel_code, np.int32),
        kernel_names=tuple(builder.names),
        stream=col(builder.stream, np.int64),
        device=col(builder.device, np.int64),
        correlation=correlation,
        start_ns=start,
        dur_ns=dur,
        launch_ns=launch,
        collectives=tuple(builder.collectives),
        step=col(builder.step, np.int64)[order],
        step_start_ns=step_start[order],
        step_dur_ns=step_dur[order],
        pid=builder.pid,
        first_ns=first,
        last_ns=last,
    )


def file_digest(path: Path) -> str:
    """BLAKE2b-128 hex digest of a file's bytes: :attr:`ParsedTrace.digest` without parsing.

    Raises:
        TraceError: the file cannot be read.
    """
    digest = hashlib.blake2b(digest_size=16)
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from exc
    return digest.hexdigest()
