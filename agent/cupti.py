"""Kernel, memcpy and memset activity through cupti-python: duty-cycled capture and its decoding.

Capture is **duty-cycled** (:class:`DutyCycle`, ``ARGUS_CUPTI_DUTY``, default
``1/10``: 1 s of every 10 s). cupti-python turns every activity record into
a Python object while holding the GIL, so continuous capture of a GPU job that
launches tens of thousands of kernels a second costs the training thread a
noticeable share of its time; the kernel distributions the analyzer compares
need samples, not every kernel. Slices are aligned to epoch multiples of the
period on the wall clock, so every rank of a job (NTP-synced hosts) captures
the same slice of training and, with the period equal to (or dividing) the
node agent's window, each window holds whole slices. Outside a slice no
activity kind is enabled and no external correlation id is pushed: the cost is
nil. Each rank reports the spans it captured; the node agent turns them into
``kernel_summaries.covered_ns``.

Decoding is split in two. On CUPTI's thread, :func:`collect` makes one pass
over a completed buffer's records and keeps one tuple of attributes per record
(``operator.attrgetter``, no arithmetic, no locks). On the probe's shipper
thread, :func:`decode` turns any number of those batches into columns with
numpy: timestamps shifted onto the epoch clock, durations, and records whose
timestamps could not be collected (``start`` or ``end`` 0, or ``end < start``)
counted as dropped and never used. Both take any objects shaped like
cupti-python's activity records (``kind``, ``name``, ``stream_id``,
``device_id``, ``correlation_id``, ``start``, ``end``; ``copy_kind`` for
memcpy; ``external_id`` for external correlation), so they are tested on CPU
machines; :func:`decode_records` does both at once.

Collective timing on GPUs (:class:`CollectiveJoin`): during a slice the probe
pushes an external correlation id (its own collective id) around every c10d
call, so the NCCL kernels launched inside it carry that id through CUPTI's
EXTERNAL_CORRELATION records. The collective's ``start_ns``/``dur_ns`` then
come from the kernel(s) on the GPU, not from the host: this is the metadata
that ties a kernel to its (process group, seq), whatever the kernel is called
(``ncclKernel_*``, ``ncclDevKernel_*``).

The live source (:class:`CuptiSource`) claims CUPTI's single subscriber slot
first; when another tool (Nsight, a running ``torch.profiler``) holds it, it
backs off cleanly: no kernel capture, one log line, training unaffected.
Buffers are requested at a fixed, large size (few buffer callbacks) and
recycled by cupti-python; the probe's shipper thread flushes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from argus.agent.rows import CollectiveRow
from argus.config import ENV_CUPTI_DUTY
from argus.schema import wire_schema

__all__ = [
    "DEFAULT_DUTY",
    "KIND_CONCURRENT_KERNEL",
    "KIND_EXTERNAL_CORRELATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "Activity",
    "CollectiveJoin",
    "CuptiSource",
    "Decoded",
    "DutyCycle",
    "collect",
    "decode",
    "decode_records",
    "duty_from_env",
]

log = logging.getLogger(__name__)

# CUpti_ActivityKind values (cupti_activity.h); cupti-python's ``kind`` is this int.
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KIND_MEMCPY2 = 22
KIND_EXTERNAL_CORRELATION = 39

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

#: ``ARGUS_CUPTI_DUTY``: ``ON/PERIOD`` seconds of capture (``1/10``), or ``always``.
DEFAULT_DUTY = "1/10"
#: Seconds between two forced flushes of partly filled activity buffers during a slice.
FORCED_FLUSH_S = 2.0
#: Bytes of each activity buffer (about 40,000 kernel records).
BUFFER_BYTES = 16 << 20
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


# --- decoding ------------------------------------------------------------------------------------

_KERNEL_KINDS = frozenset({KIND_CONCURRENT_KERNEL, KIND_KERNEL})
_MEMCPY_KINDS = frozenset({KIND_MEMCPY, KIND_MEMCPY2})
_kernel_fields = attrgetter("name", "stream_id", "device_id", "correlation_id", "start", "end")
_memcpy_fields = attrgetter("copy_kind", "stream_id", "device_id", "correlation_id", "start", "end")
_memset_fields = attrgetter("stream_id", "device_id", "correlation_id", "start", "end")


class Activity:
    """One buffer's records as attribute tuples (what :func:`collect` keeps; raw CUPTI timestamps).

    Attributes:
        kernels: ``(name, stream, device, correlation, start, end)`` per kernel.
        memcpys: ``(copy_kind, stream, device, correlation, start, end)`` per memcpy.
        memsets: ``(stream, device, correlation, start, end)`` per memset.
        external: correlation id → external id (EXTERNAL_CORRELATION records).
    """

    __slots__ = ("external", "kernels", "memcpys", "memsets")

    def __init__(self) -> None:
        self.kernels: list[tuple[Any, ...]] = []
        self.memcpys: list[tuple[Any, ...]] = []
        self.memsets: list[tuple[Any, ...]] = []
        self.external: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.kernels) + len(self.memcpys) + len(self.memsets)


def collect(records: Iterable[Any]) -> Activity:
    """One pass over activity records (on CUPTI's thread): attribute tuples, nothing computed.

    Kinds other than kernel, memcpy, memset and external correlation are skipped.
    """
    out = Activity()
    kernels, memcpys, memsets, external = out.kernels, out.memcpys, out.memsets, out.external
    kf, cf, sf = _kernel_fields, _memcpy_fields, _memset_fields
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
    return out


class Decoded:
    """Decoded activity: ``kernel_events`` columns (times on the epoch clock) and what was left out.

    Attributes:
        kind, name: ``'kernel'``/``'memcpy'``/``'memset'`` and the kernel (or memcpy kind) name, per row.
        stream, device, correlation, start_ns, dur_ns: int64 numpy arrays, one value per row.
        external: correlation id → external id, from EXTERNAL_CORRELATION records.
        dropped: records without usable timestamps (not in the rows).
    """

    __slots__ = (
        "correlation",
        "device",
        "dropped",
        "dur_ns",
        "external",
        "kind",
        "name",
        "start_ns",
        "stream",
    )

    def __init__(self) -> None:
        empty = np.zeros(0, np.int64)
        self.kind: list[str] = []
        self.name: list[str] = []
        self.stream = self.device = self.correlation = self.start_ns = self.dur_ns = empty
        self.external: dict[int, int] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.name)

    @property
    def rows(self) -> list[tuple[str, str, int, int, int, int, int]]:
        """``(kind, name, stream, device, correlation, start_ns, dur_ns)`` per row (tests, small batches)."""
        return list(
            zip(
                self.kind,
                self.name,
                self.stream.tolist(),
                self.device.tolist(),
                self.correlation.tolist(),
                self.start_ns.tolist(),
                self.dur_ns.tolist(),
                strict=True,
            )
        )

    def table(self, rank: int) -> pa.Table:
        """The rows as a ``kernel_events`` wire table of ``rank``."""
        schema = wire_schema("kernel_events")
        n = len(self)
        arrays: list[pa.Array[Any]] = [
            pa.array(np.full(n, rank, np.uint32)),
            pa.array(self.kind, pa.string()),
            pa.array(self.name, pa.string()),
            pa.array(self.stream.astype(np.uint32)),
            pa.array(self.device.astype(np.int32)),
            pa.array(self.correlation.astype(np.uint64)),
            pa.array(self.start_ns),
            pa.array(self.dur_ns),
        ]
        return pa.Table.from_arrays(arrays, schema=schema)


def _ints(values: Sequence[Any]) -> npt.NDArray[np.int64]:
    return np.fromiter(values, np.int64, len(values))


def decode(batches: Sequence[Activity], offset_ns: int = 0) -> Decoded:
    """Columns of every row of ``batches`` (off the training thread; numpy, no per-record Python).

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
    for b in batches:
        out.external.update(b.external)
    names: list[str] = []
    kinds: list[str] = []
    ints: list[list[Any]] = [[], [], [], [], []]  # stream, device, correlation, start, end
    if kernels:
        name, *rest = zip(*kernels, strict=True)
        names += name
        kinds += ["kernel"] * len(kernels)
        for col, values in zip(ints, rest, strict=True):
            col.extend(values)
    if memcpys:
        copy_kind, *rest = zip(*memcpys, strict=True)
        table = np.array(MEMCPY_NAMES, dtype=object)
        codes = np.clip(_ints(copy_kind), 0, len(MEMCPY_NAMES) - 1)
        names += table[codes].tolist()
        kinds += ["memcpy"] * len(memcpys)
        for col, values in zip(ints, rest, strict=True):
            col.extend(values)
    if memsets:
        names += ["Memset"] * len(memsets)
        kinds += ["memset"] * len(memsets)
        for col, values in zip(ints, zip(*memsets, strict=True), strict=True):
            col.extend(values)
    if not names:
        return out
    stream, device, corr, start, end = (_ints(c) for c in ints)
    ok = (start > 0) & (end > 0) & (end >= start)
    out.dropped = int(ok.size - np.count_nonzero(ok))
    if out.dropped:
        keep = np.flatnonzero(ok)
        names = [names[i] for i in keep.tolist()]
        kinds = [kinds[i] for i in keep.tolist()]
        stream, device, corr, start, end = (a[ok] for a in (stream, device, corr, start, end))
    out.kind, out.name = kinds, names
    out.stream, out.device, out.correlation = stream, device, corr
    out.start_ns, out.dur_ns = start + offset_ns, end - start
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
            self._corr.update(decoded.external)
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


class CuptiSource:
    """Live, duty-cycled CUPTI activity capture for this process.

    :meth:`start` claims CUPTI (subscriber slot, buffer callbacks) without
    capturing; :meth:`update`, called by the probe's shipper thread at each
    edge of the duty cycle, enables the activity kinds for a slice and
    disables them after it. :meth:`take_spans` gives the captured spans.

    Args:
        on_activity: Called on CUPTI's thread with each completed buffer's :class:`Activity`.
        duty: When to capture (default: ``$ARGUS_CUPTI_DUTY``, see :func:`duty_from_env`).
        buffer_bytes: Size of each activity buffer cupti-python allocates.
    """

    def __init__(
        self,
        on_activity: Callable[[Activity], None],
        duty: DutyCycle | None = None,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self._on_activity = on_activity
        self.duty = duty if duty is not None else duty_from_env()
        self._buffer_bytes = buffer_bytes
        self._cupti: Any = None
        self._subscriber: Any = None
        self._kinds: list[Any] = []
        self._ext_kind: Any = None
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
        try:
            from cupti import cupti
        except ImportError:
            log.warning(
                "argus: cupti-python is not installed: no GPU kernel capture (pip install cupti-python)"
            )
            return False
        self._cupti = cupti
        try:
            self._subscriber = cupti.subscribe(self._callback, None)
        except Exception as exc:
            log.warning("argus: another CUPTI subscriber holds the slot (%s): no GPU kernel capture", exc)
            return False
        try:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            self._kinds = [getattr(cupti.ActivityKind, n) for n in ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")]
            self.offset_ns = self._estimate_offset()
        except Exception:
            log.warning("argus: CUPTI activity capture failed to start", exc_info=True)
            self.stop()
            return False
        try:
            # Optional: ties NCCL kernels to their c10d collective (device start/end of collectives).
            self._ext_kind = cupti.ExternalCorrelationKind.CUSTOM2
            self._kinds.append(cupti.ActivityKind.EXTERNAL_CORRELATION)
        except Exception:
            log.info("argus: no CUPTI external correlation: collectives keep host-side times", exc_info=True)
            self._ext_kind = None
        self.active = True
        log.info(
            "argus: CUPTI kernel capture for %.3g s of every %.3g s (%s)",
            self.duty.on_ns / 1e9,
            self.duty.period_ns / 1e9,
            ENV_CUPTI_DUTY,
        )
        return True

    @property
    def correlates(self) -> bool:
        """True when collectives can be tied to their kernels now (in a slice, external correlation on)."""
        return self.capturing and self._ext_kind is not None

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
        enabled: list[Any] = []
        for i, kind in enumerate(self._kinds):
            try:
                self._cupti.activity_enable(kind)
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
        if self._ext_kind is not None and self._cupti.ActivityKind.EXTERNAL_CORRELATION not in enabled:
            self._ext_kind = None
        self.capturing = True
        self._span_start = time.time_ns()
        self._next_forced = time.monotonic() + FORCED_FLUSH_S

    def _disable(self) -> None:
        for kind in self._kinds:
            with contextlib.suppress(Exception):
                self._cupti.activity_disable(kind)
        self.capturing = False
        self._spans.append((self._span_start, time.time_ns()))
        with contextlib.suppress(Exception):
            # Hand over the slice's records now (partly filled buffers included).
            self._cupti.activity_flush_all(1)

    def take_spans(self, now_ns: int | None = None) -> list[tuple[int, int]]:
        """Captured spans ``(start_ns, end_ns)`` (host clock) since the last call; an open one ends now."""
        with self._lock:
            out, self._spans = self._spans, []
            if self.capturing:
                now = time.time_ns() if now_ns is None else now_ns
                out.append((self._span_start, now))
                self._span_start = now
        return out

    def _callback(self, *_args: Any) -> None:
        """Subscriber callback: no callback domain is enabled, so it is never called."""

    def _estimate_offset(self) -> int:
        """``time.time_ns() - cupti.get_timestamp()``, from the tightest of a few brackets."""
        best, offset = 1 << 62, 0
        for _ in range(5):
            t0 = time.time_ns()
            c = int(self._cupti.get_timestamp())
            t1 = time.time_ns()
            if t1 - t0 < best:
                best, offset = t1 - t0, (t0 + t1) // 2 - c
        return offset

    def _buffer_requested(self) -> tuple[int, int]:
        return self._buffer_bytes, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        try:
            self._on_activity(collect(activities))
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("argus: reading CUPTI records failed", exc_info=True)

    def push(self, uid: int) -> None:
        """Push external correlation id ``uid`` on this thread (around a c10d call)."""
        self._cupti.activity_push_external_correlation_id(self._ext_kind, uid)

    def pop(self) -> None:
        """Pop the external correlation id pushed by :meth:`push`."""
        self._cupti.activity_pop_external_correlation_id(self._ext_kind)

    def flush(self) -> None:
        """During a slice, force partly filled buffers out every :data:`FORCED_FLUSH_S` (shipper thread)."""
        if not self.capturing:
            return
        now = time.monotonic()
        if now < self._next_forced:
            return
        self._next_forced = now + FORCED_FLUSH_S
        try:
            self._cupti.activity_flush_all(1)
        except Exception:
            self.errors += 1

    def stop(self) -> None:
        """Flush, disable capture and release the subscriber slot (idempotent)."""
        if self._cupti is None:
            return
        with self._lock:
            if self.capturing:
                self._disable()
            self._release()

    def _release(self) -> None:
        if self._subscriber is not None:
            with contextlib.suppress(Exception):
                self._cupti.unsubscribe(self._subscriber)
            self._subscriber = None
        self.active = False
