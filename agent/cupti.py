"""Kernel, memcpy and memset activity through CUPTI: duty-cycled capture and its decoding.

Capture is **duty-cycled** (:class:`DutyCycle`, ``ARGUS_CUPTI_DUTY``, default
``1/10``: 1 s of every 10 s). Slices are aligned to epoch multiples of the period
on the wall clock, so every rank of a job (NTP-synced hosts) captures the same
slice of training and, with the period equal to (or dividing) the node agent's
window, each window holds whole slices. Outside a slice no activity kind is
enabled and no external correlation id is pushed: the cost is nil. Each rank
reports the spans it captured; the node agent turns them into
``kernel_summaries.covered_ns`` (the window, under ``always``).

The default stays ``1/10`` until a GPU run of ``bench/overhead.py --cuda --capture
always`` shows always-on capture within its goal (issue 11): the native decode
below removes the per-record Python cost that made continuous capture expensive,
but no GPU has measured it yet.

Two backends read CUPTI (``ARGUS_CUPTI_BACKEND``, :func:`backend_from_env`):

* ``native`` (default): libcupti through ctypes, activity buffers from a bounded
  pool, decoded in columns with numpy on the probe's shipper thread
  (:mod:`argus.agent.cupti_lib`, :mod:`argus.agent.cupti_native`). No Python runs
  per record. Used whenever a libcupti can be loaded.
* ``cupti-python``: cupti-python's activity API, which turns every record into a
  Python object while holding the GIL (about 40 µs of training-thread time per
  kernel on an H200): :func:`collect` keeps one tuple of attributes per record on
  CUPTI's thread, :func:`decode` turns batches of them into the same
  :class:`~argus.agent.cupti_records.Decoded` columns. The fallback where libcupti
  cannot be loaded directly, and the reference the native decoder is tested and
  benchmarked against (``bench/cupti_decode.py``).

Both give the rows in one order (kernels, then memcpys, then memsets), times
shifted onto the epoch clock, and count records whose timestamps could not be
collected (``start`` or ``end`` 0, or ``end < start``) as dropped. Kernel names
are demangled (:func:`~argus.agent.cupti_native.demangle`), as Kineto shows them.
Kernels launched from CUDA graphs carry their ``graph_id`` and ``graph_node_id``.

Collective timing on GPUs (:class:`CollectiveJoin`): during a slice the probe
pushes an external correlation id (its own collective id) around every c10d
call, so the NCCL kernels launched inside it carry that id through CUPTI's
EXTERNAL_CORRELATION records. The collective's ``start_ns``/``dur_ns`` then
come from the kernel(s) on the GPU, not from the host: this is the metadata
that ties a kernel to its (process group, seq), whatever the kernel is called
(``ncclKernel_*``, ``ncclDevKernel_*``).

The live source (:class:`CuptiSource`) claims CUPTI's single subscriber slot
first; when another tool (Nsight, a running ``torch.profiler``) holds it, it
backs off cleanly: no kernel capture, one log line, training unaffected. No
CUDA library is loaded before a GPU rank starts its source.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from argus.agent.cupti_lib import CuptiBusy, CuptiError
from argus.agent.cupti_native import demangle
from argus.agent.cupti_records import (
    KIND_CONCURRENT_KERNEL,
    KIND_EXTERNAL_CORRELATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMCPY2,
    KIND_MEMSET,
    MEMCPY_NAMES,
    MEMSET_NAME,
    Decoded,
)
from argus.agent.rows import CollectiveRow
from argus.config import ENV_CUPTI_BACKEND, ENV_CUPTI_DUTY

__all__ = [
    "DEFAULT_DUTY",
    "KIND_CONCURRENT_KERNEL",
    "KIND_EXTERNAL_CORRELATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "Activity",
    "CollectiveJoin",
    "CuptiBackend",
    "CuptiPython",
    "CuptiSource",
    "Decoded",
    "DutyCycle",
    "backend_from_env",
    "collect",
    "decode",
    "decode_records",
    "duty_from_env",
]

log = logging.getLogger(__name__)

#: ``ARGUS_CUPTI_DUTY``: ``ON/PERIOD`` seconds of capture (``1/10``), or ``always``.
DEFAULT_DUTY = "1/10"
#: Seconds between two forced flushes of partly filled activity buffers during a slice.
FORCED_FLUSH_S = 2.0
#: Bytes of each activity buffer cupti-python allocates (about 70,000 kernel records).
BUFFER_BYTES = 16 << 20
#: Kernel/memcpy/memset records the cupti-python backend holds between two shipments.
OBJECT_CAPACITY = 1 << 20
#: The activity kinds captured; the first is required, the others optional.
CAPTURED_KINDS = (KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET)
#: CUpti_ExternalCorrelationKind CUSTOM2: the kind of the ids the probe pushes around collectives.
EXTERNAL_KIND = 5


# --- duty cycle ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DutyCycle:
    """Capture during the first ``on_ns`` of every ``period_ns``, on the wall clock (ns since the epoch).

    Slices start at epoch multiples of the period, so all ranks capture the
    same slices. ``on_ns >= period_ns`` means always on.
    """

    on_ns: int
    period_ns: int

    def __post_init__(self) -> None:
        if self.period_ns <= 0 or self.on_ns <= 0:
            raise ValueError(
                f"a duty cycle needs on > 0 and period > 0, got {self.on_ns}/{self.period_ns} ns"
            )

    @classmethod
    def parse(cls, text: str) -> DutyCycle:
        """``"ON/PERIOD"`` in seconds (``"1/10"``, ``"0.5/10"``) or ``"always"``.

        Raises:
            ValueError: anything else, or ON <= 0, PERIOD <= 0, ON > PERIOD.
        """
        t = text.strip().lower()
        if t in ("always", "1", "on"):
            return cls(1_000_000_000, 1_000_000_000)
        on_s, sep, period_s = t.partition("/")
        if not sep:
            raise ValueError(f"{ENV_CUPTI_DUTY}={text!r}: expected ON/PERIOD seconds (e.g. 1/10) or 'always'")
        try:
            on, period = round(float(on_s) * 1e9), round(float(period_s) * 1e9)
        except ValueError:
            raise ValueError(f"{ENV_CUPTI_DUTY}={text!r}: ON and PERIOD must be numbers of seconds") from None
        if not 0 < on <= period:
            raise ValueError(f"{ENV_CUPTI_DUTY}={text!r}: needs 0 < ON <= PERIOD")
        return cls(on, period)

    @property
    def always(self) -> bool:
        return self.on_ns >= self.period_ns

    def state(self, now_ns: int) -> tuple[bool, int]:
        """``(capturing, next_change_ns)`` at ``now_ns``; always on: ``(True, now + period)``."""
        if self.always:
            return True, now_ns + self.period_ns
        phase = now_ns % self.period_ns
        begin = now_ns - phase
        if phase < self.on_ns:
            return True, begin + self.on_ns
        return False, begin + self.period_ns

    def covered_ns(self, start_ns: int, end_ns: int) -> int:
        """ns of ``[start_ns, end_ns)`` inside capture slices."""
        if end_ns <= start_ns:
            return 0
        if self.always:
            return end_ns - start_ns
        p, on = self.period_ns, self.on_ns

        def upto(t: int) -> int:  # captured ns in [0, t)
            return (t // p) * on + min(t % p, on)

        return upto(end_ns) - upto(start_ns)


def duty_from_env(environ: dict[str, str] | None = None) -> DutyCycle:
    """The duty cycle in ``$ARGUS_CUPTI_DUTY`` (default :data:`DEFAULT_DUTY`; a bad value is logged)."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_CUPTI_DUTY, "").strip() or DEFAULT_DUTY
    try:
        return DutyCycle.parse(text)
    except ValueError as exc:
        log.warning("argus: %s; using %s", exc, DEFAULT_DUTY)
        return DutyCycle.parse(DEFAULT_DUTY)


# --- the per-record object path (cupti-python) --------------------------------------------------

_KERNEL_KINDS = frozenset({KIND_CONCURRENT_KERNEL, KIND_KERNEL})
_MEMCPY_KINDS = frozenset({KIND_MEMCPY, KIND_MEMCPY2})
_TAIL = ("stream_id", "device_id", "correlation_id", "start", "end", "graph_id", "graph_node_id")
_kernel_fields = attrgetter("name", *_TAIL)
_memcpy_fields = attrgetter("copy_kind", *_TAIL)
_memset_fields = attrgetter(*_TAIL)


class Activity:
    """One buffer's records as attribute tuples (what :func:`collect` keeps; raw CUPTI timestamps).

    Attributes:
        kernels: ``(name, stream, device, correlation, start, end, graph_id, graph_node_id)`` per kernel.
        memcpys: ``(copy_kind, stream, device, correlation, start, end, graph_id, graph_node_id)``.
        memsets: ``(stream, device, correlation, start, end, graph_id, graph_node_id)`` per memset.
        external: correlation id → external id (EXTERNAL_CORRELATION records).
        skipped: records of other kinds.
    """

    __slots__ = ("external", "kernels", "memcpys", "memsets", "skipped")

    def __init__(self) -> None:
        self.kernels: list[tuple[Any, ...]] = []
        self.memcpys: list[tuple[Any, ...]] = []
        self.memsets: list[tuple[Any, ...]] = []
        self.external: dict[int, int] = {}
        self.skipped = 0

    def __len__(self) -> int:
        return len(self.kernels) + len(self.memcpys) + len(self.memsets)


def collect(records: Iterable[Any]) -> Activity:
    """One pass over activity records (on CUPTI's thread): attribute tuples, nothing computed.

    Kinds other than kernel, memcpy, memset and external correlation are skipped (and counted).
    """
    out = Activity()
    kernels, memcpys, memsets, external = out.kernels, out.memcpys, out.memsets, out.external
    kf, cf, sf = _kernel_fields, _memcpy_fields, _memset_fields
    skipped = 0
    for r in records:
        kind = r.kind
        if kind in _KERNEL_KINDS:
            kernels.append(kf(r))
        elif kind in _MEMCPY_KINDS:
            memcpys.append(cf(r))
        elif kind == KIND_MEMSET:
            memsets.append(sf(r))
        elif kind == KIND_EXTERNAL_CORRELATION:
            external[r.correlation_id] = r.external_id
        else:
            skipped += 1
    out.skipped = skipped
    return out


def _ints(values: Sequence[Any]) -> npt.NDArray[np.int64]:
    return np.fromiter(values, np.int64, len(values))


def decode(  # noqa: C901  (one loop per record kind, as cupti-python hands them over)
    batches: Sequence[Activity], offset_ns: int = 0
) -> Decoded:
    """Columns of every row of ``batches`` (off the training thread; numpy after one zip per kind).

    Args:
        batches: What :func:`collect` returned, oldest first.
        offset_ns: Added to CUPTI timestamps to get ns since the epoch.

    Returns:
        :class:`Decoded`: kernels, then memcpys, then memsets; rows with a zero
        or inverted timestamp are only counted in ``dropped``.
    """
    out = Decoded()
    kernels = [k for b in batches for k in b.kernels]
    memcpys = [m for b in batches for m in b.memcpys]
    memsets = [m for b in batches for m in b.memsets]
    external: dict[int, int] = {}
    for b in batches:
        external.update(b.external)
        out.skipped += b.skipped
    out.external_correlation = np.fromiter(external, np.int64, len(external))
    out.external_id = np.fromiter(external.values(), np.uint64, len(external))
    names: list[str] = [*MEMCPY_NAMES, MEMSET_NAME]
    name_ids: list[npt.NDArray[np.int64]] = []
    kinds: list[npt.NDArray[np.uint8]] = []
    ints: list[list[Any]] = [[], [], [], [], [], [], []]  # stream, device, corr, start, end, graph, node
    if kernels:
        name, *rest = zip(*kernels, strict=True)
        table = {n: i for i, n in enumerate(names)}
        ids: dict[str, int] = {}
        for raw in set(name):
            text = demangle(raw or "")
            i = table.get(text)
            if i is None:
                i = table[text] = len(names)
                names.append(text)
            ids[raw] = i
        name_ids.append(np.fromiter((ids[n] for n in name), np.int64, len(name)))
        kinds.append(np.zeros(len(kernels), np.uint8))
        for col, values in zip(ints, rest, strict=True):
            col.extend(values)
    if memcpys:
        copy_kind, *rest = zip(*memcpys, strict=True)
        name_ids.append(np.clip(_ints(copy_kind), 0, len(MEMCPY_NAMES) - 1))
        kinds.append(np.ones(len(memcpys), np.uint8))
        for col, values in zip(ints, rest, strict=True):
            col.extend(values)
    if memsets:
        name_ids.append(np.full(len(memsets), len(MEMCPY_NAMES), np.int64))
        kinds.append(np.full(len(memsets), 2, np.uint8))
        for col, values in zip(ints, zip(*memsets, strict=True), strict=True):
            col.extend(values)
    out.names = names
    if not kinds:
        return out
    stream, device, corr, start, end, graph, node = (_ints(c) for c in ints)
    kind, name_id = np.concatenate(kinds), np.concatenate(name_ids).astype(np.int32)
    ok = (start > 0) & (end > 0) & (end >= start)
    out.dropped = int(ok.size - np.count_nonzero(ok))
    if out.dropped:
        kind, name_id = kind[ok], name_id[ok]
        stream, device, corr, start, end, graph, node = (
            a[ok] for a in (stream, device, corr, start, end, graph, node)
        )
    out.kind, out.name_id = kind, name_id
    out.stream, out.device, out.correlation = stream, device, corr
    out.start_ns, out.dur_ns = start + offset_ns, end - start
    out.graph_id, out.graph_node_id = graph, node
    return out


def decode_records(records: Iterable[Any], offset_ns: int = 0) -> Decoded:
    """:func:`collect` then :func:`decode` of one batch of cupti-python-shaped records."""
    return decode([collect(records)], offset_ns)


class CollectiveJoin:
    """Gives GPU collectives their device start and duration from correlated NCCL kernels.

    The probe registers each GPU collective under its external id with
    :meth:`expect`; :meth:`feed` takes decoded records; rows come out of
    :meth:`ready` once a kernel was seen for them, or after ``timeout_ns`` with
    their host-side times (the collective launched no kernel CUPTI reported).

    Rows are the probe's :class:`~argus.agent.rows.CollectiveRow`.
    """

    def __init__(self, timeout_ns: int = 10_000_000_000) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, CollectiveRow] = {}
        self._span: dict[int, list[int]] = {}
        self._corr: dict[int, int] = {}
        self.timeout_ns = timeout_ns

    def expect(self, uid: int, row: CollectiveRow) -> None:
        """Hold ``row`` (host times) until kernels for external id ``uid`` arrive."""
        with self._lock:
            self._pending[uid] = row

    def feed(self, decoded: Decoded) -> None:
        """Match kernel rows to held collectives through their correlation ids."""
        with self._lock:
            corr, ext = decoded.external_correlation.tolist(), decoded.external_id.tolist()
            self._corr.update(zip(corr, ext, strict=True))
            if not self._corr or not len(decoded):
                return
            watched = np.fromiter(self._corr, np.int64, len(self._corr))
            hits = np.flatnonzero(np.isin(decoded.correlation, watched))
            corrs = decoded.correlation[hits].tolist()
            starts = decoded.start_ns[hits].tolist()
            ends = (decoded.start_ns[hits] + decoded.dur_ns[hits]).tolist()
            for corr, start, end in zip(corrs, starts, ends, strict=True):
                uid = self._corr.pop(corr, None)
                if uid is None or uid not in self._pending:
                    continue
                span = self._span.get(uid)
                if span is None:
                    self._span[uid] = [start, end]
                else:
                    span[0] = min(span[0], start)
                    span[1] = max(span[1], end)
            if len(self._corr) > 100_000:
                # Correlations of API calls that launched nothing we track: forget the oldest.
                for key in list(self._corr)[:50_000]:
                    del self._corr[key]

    def ready(self, now_ns: int) -> list[CollectiveRow]:
        """Rows whose kernels were seen (device times) or whose wait timed out (host times)."""
        out: list[CollectiveRow] = []
        with self._lock:
            for uid, held in list(self._pending.items()):
                span = self._span.pop(uid, None)
                if span is None and now_ns - held.issue_ns < self.timeout_ns:
                    continue
                del self._pending[uid]
                out.append(
                    held if span is None else held._replace(start_ns=span[0], dur_ns=span[1] - span[0])
                )
        return out

    def drain(self) -> list[CollectiveRow]:
        """Every held row (at exit), device times where known."""
        return self.ready(1 << 62)


class CuptiBackend(Protocol):
    """What :class:`CuptiSource` needs of a CUPTI binding (kinds are CUpti_ActivityKind values).

    Every method but :meth:`take` and :attr:`lost` may raise; the source logs and goes on.
    """

    name: str

    def claim(self) -> None:
        """Take CUPTI's subscriber slot and register buffer callbacks (raises CuptiBusy when taken)."""

    def enable(self, kind: int) -> None: ...

    def disable(self, kind: int) -> None: ...

    def flush(self) -> None:
        """Complete every buffer now, partly filled ones included."""

    def push(self, external_kind: int, uid: int) -> None: ...

    def pop(self, external_kind: int) -> None: ...

    def timestamp(self) -> int:
        """CUPTI's clock now, ns."""

    def take(self, offset_ns: int) -> Decoded:
        """Decode what completed since the last call (shipper thread)."""

    @property
    def lost(self) -> int:
        """Records lost so far (no buffer, unreadable buffer tails, a full queue)."""

    def release(self) -> None:
        """Give the subscriber slot back."""


class CuptiPython:
    """The cupti-python backend: records become Python objects, :func:`collect` keeps their fields.

    Raises:
        CuptiError: cupti-python is not installed.
    """

    name = "cupti-python"

    def __init__(self, buffer_bytes: int = BUFFER_BYTES, capacity: int = OBJECT_CAPACITY) -> None:
        try:
            from cupti import cupti
        except ImportError as exc:
            raise CuptiError("cupti-python is not installed (pip install cupti-python)") from exc
        self._cupti: Any = cupti
        self._buffer_bytes = buffer_bytes
        self._capacity = capacity
        self._subscriber: Any = None
        self._lock = threading.Lock()
        self._batches: list[Activity] = []
        self._rows = 0
        self._lost = 0
        self.errors = 0

    def claim(self) -> None:
        cupti = self._cupti
        try:
            self._subscriber = cupti.subscribe(_never_called, None)
        except Exception as exc:
            raise CuptiBusy(str(exc)) from exc
        try:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        except Exception:
            self.release()
            raise

    def enable(self, kind: int) -> None:
        self._cupti.activity_enable(kind)

    def disable(self, kind: int) -> None:
        self._cupti.activity_disable(kind)

    def flush(self) -> None:
        self._cupti.activity_flush_all(1)

    def push(self, external_kind: int, uid: int) -> None:
        self._cupti.activity_push_external_correlation_id(external_kind, uid)

    def pop(self, external_kind: int) -> None:
        self._cupti.activity_pop_external_correlation_id(external_kind)

    def timestamp(self) -> int:
        return int(self._cupti.get_timestamp())

    def take(self, offset_ns: int) -> Decoded:
        with self._lock:
            batches, self._batches, self._rows = self._batches, [], 0
        return decode(batches, offset_ns)

    @property
    def lost(self) -> int:
        return self._lost

    def release(self) -> None:
        if self._subscriber is not None:
            with contextlib.suppress(Exception):
                self._cupti.unsubscribe(self._subscriber)
            self._subscriber = None

    def _buffer_requested(self) -> tuple[int, int]:
        return self._buffer_bytes, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        try:
            activity = collect(activities)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("argus: reading CUPTI records failed", exc_info=True)
            return
        n = len(activity)
        with self._lock:
            if self._rows + n > self._capacity:
                self._lost += n
                return
            self._batches.append(activity)
            self._rows += n


def _never_called(*_args: Any) -> None:
    """Subscriber callback: no callback domain is enabled, so it is never called."""


def backend_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """Backends to try, in order, per ``$ARGUS_CUPTI_BACKEND`` (default: native, then cupti-python)."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV_CUPTI_BACKEND, "").strip().lower()
    if choice in ("cupti-python", "cupti_python", "python", "object"):
        return ["cupti-python"]
    if choice not in ("", "native"):
        log.warning("argus: %s=%r is not native or cupti-python; using native", ENV_CUPTI_BACKEND, choice)
    return ["native", "cupti-python"]


def _open_backend(name: str) -> CuptiBackend:
    if name == "native":
        from argus.agent.cupti_lib import NativeCupti

        return NativeCupti()
    return CuptiPython()


class CuptiSource:
    """Live, duty-cycled CUPTI activity capture for this process.

    :meth:`start` claims CUPTI (subscriber slot, buffer callbacks) without
    capturing; :meth:`update`, called by the probe's shipper thread at each
    edge of the duty cycle, enables the activity kinds for a slice and
    disables them after it. :meth:`take` decodes what was captured;
    :meth:`take_spans` gives the captured spans.

    Args:
        duty: When to capture (default: ``$ARGUS_CUPTI_DUTY``, see :func:`duty_from_env`).
        backend: The CUPTI binding (default: the first of :func:`backend_from_env` that loads).
    """

    def __init__(self, duty: DutyCycle | None = None, backend: CuptiBackend | None = None) -> None:
        self.duty = duty if duty is not None else duty_from_env()
        self.backend: CuptiBackend | None = backend
        self._kinds: list[int] = []
        self._correlate = False
        self._lock = threading.Lock()
        self._span_start = 0
        self._spans: list[tuple[int, int]] = []
        self.offset_ns = 0
        self._next_forced = 0.0
        #: CUPTI is claimed (subscribed, callbacks registered).
        self.active = False
        #: Activity kinds are enabled now (inside a slice).
        self.capturing = False
        self.errors = 0

    def start(self) -> bool:
        """Claim CUPTI (no capture until :meth:`update`); False (logged) when not possible."""
        backend = self.backend
        if backend is None:
            reasons = []
            for name in backend_from_env():
                try:
                    backend = _open_backend(name)
                    break
                except CuptiError as exc:
                    reasons.append(f"{name}: {exc}")
            if backend is None:
                log.warning("argus: no GPU kernel capture (%s)", "; ".join(reasons))
                return False
            self.backend = backend
        try:
            backend.claim()
        except CuptiBusy as exc:
            log.warning("argus: another CUPTI subscriber holds the slot (%s): no GPU kernel capture", exc)
            return False
        except Exception:
            log.warning("argus: CUPTI activity capture failed to start", exc_info=True)
            return False
        try:
            self.offset_ns = self._estimate_offset()
        except Exception:
            log.warning("argus: CUPTI's clock cannot be read: no GPU kernel capture", exc_info=True)
            self._release()
            return False
        self._kinds = [*CAPTURED_KINDS, KIND_EXTERNAL_CORRELATION]
        self.active = True
        log.info(
            "argus: CUPTI kernel capture (%s) for %.3g s of every %.3g s (%s)",
            backend.name,
            self.duty.on_ns / 1e9,
            self.duty.period_ns / 1e9,
            ENV_CUPTI_DUTY,
        )
        return True

    @property
    def correlates(self) -> bool:
        """True when collectives can be tied to their kernels now (in a slice, external correlation on)."""
        return self.capturing and self._correlate

    @property
    def lost(self) -> int:
        """Records lost so far by the backend (see :attr:`CuptiBackend.lost`)."""
        return self.backend.lost if self.backend is not None else 0

    def update(self, now_ns: int) -> int:
        """Enable or disable capture as the duty cycle says at ``now_ns``; returns the next edge (ns)."""
        on, next_ns = self.duty.state(now_ns)
        with self._lock:
            if self.active and on != self.capturing:
                if on:
                    self._enable()
                else:
                    self._disable()
        return next_ns

    def _enable(self) -> None:
        assert self.backend is not None
        enabled: list[int] = []
        for i, kind in enumerate(self._kinds):
            try:
                self.backend.enable(kind)
            except Exception:
                if i == 0:
                    log.warning(
                        "argus: CUPTI kernel activity cannot be enabled: no GPU kernel capture", exc_info=True
                    )
                    self._release()
                    return
                log.info("argus: CUPTI activity %s unavailable", kind, exc_info=True)
                continue
            enabled.append(kind)
        self._kinds = enabled
        self._correlate = KIND_EXTERNAL_CORRELATION in enabled
        self.capturing = True
        self._span_start = time.time_ns()
        self._next_forced = time.monotonic() + FORCED_FLUSH_S

    def _disable(self) -> None:
        assert self.backend is not None
        for kind in self._kinds:
            with contextlib.suppress(Exception):
                self.backend.disable(kind)
        self.capturing = False
        self._spans.append((self._span_start, time.time_ns()))
        with contextlib.suppress(Exception):
            # Hand over the slice's records now (partly filled buffers included).
            self.backend.flush()

    def take(self) -> Decoded:
        """Decode the records completed since the last call (shipper thread; an empty Decoded on errors)."""
        if self.backend is None:
            return Decoded()
        try:
            return self.backend.take(self.offset_ns)
        except Exception:
            self.errors += 1
            if self.errors <= 3:
                log.warning("argus: decoding CUPTI records failed", exc_info=True)
            return Decoded()

    def take_spans(self, now_ns: int | None = None) -> list[tuple[int, int]]:
        """Captured spans ``(start_ns, end_ns)`` (host clock) since the last call; an open one ends now."""
        with self._lock:
            out, self._spans = self._spans, []
            if self.capturing:
                now = time.time_ns() if now_ns is None else now_ns
                out.append((self._span_start, now))
                self._span_start = now
        return out

    def _estimate_offset(self) -> int:
        """``time.time_ns() - CUPTI's timestamp``, from the tightest of a few brackets."""
        assert self.backend is not None
        best, offset = 1 << 62, 0
        for _ in range(5):
            t0 = time.time_ns()
            c = self.backend.timestamp()
            t1 = time.time_ns()
            if t1 - t0 < best:
                best, offset = t1 - t0, (t0 + t1) // 2 - c
        return offset

    def push(self, uid: int) -> None:
        """Push external correlation id ``uid`` on this thread (around a c10d call)."""
        assert self.backend is not None
        self.backend.push(EXTERNAL_KIND, uid)

    def pop(self) -> None:
        """Pop the external correlation id pushed by :meth:`push`."""
        assert self.backend is not None
        self.backend.pop(EXTERNAL_KIND)

    def flush(self) -> None:
        """During a slice, force partly filled buffers out every :data:`FORCED_FLUSH_S` (shipper thread)."""
        if not self.capturing or self.backend is None:
            return
        now = time.monotonic()
        if now < self._next_forced:
            return
        self._next_forced = now + FORCED_FLUSH_S
        try:
            self.backend.flush()
        except Exception:
            self.errors += 1

    def stop(self) -> None:
        """Flush, disable capture and release the subscriber slot (idempotent)."""
        if self.backend is None:
            return
        with self._lock:
            if self.capturing:
                self._disable()
            self._release()

    def _release(self) -> None:
        if self.backend is not None:
            with contextlib.suppress(Exception):
                self.backend.release()
        self.active = False
