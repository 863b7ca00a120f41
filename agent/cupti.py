"""Kernel, memcpy and memset activity through cupti-python, and its decoding.

Decoding (:func:`decode_records`) is pure and takes any objects shaped like
cupti-python's activity records (``kind``, ``name``, ``stream_id``,
``device_id``, ``correlation_id``, ``start``, ``end``; ``copy_kind`` for
memcpy; ``external_id`` for external correlation), so it is tested on CPU
machines. A record whose timestamps could not be collected (``start`` or
``end`` 0, or ``end < start``) is counted as dropped and never used.

Collective timing on GPUs (:class:`CollectiveJoin`): the probe pushes an
external correlation id (its own collective id) around every c10d call, so
the NCCL kernels launched inside it carry that id through CUPTI's
EXTERNAL_CORRELATION records. The collective's ``start_ns``/``dur_ns`` then
come from the kernel(s) on the GPU, not from the host: this is the metadata
that ties a kernel to its (process group, seq), whatever the kernel is called
(``ncclKernel_*``, ``ncclDevKernel_*``).

The live source (:class:`CuptiSource`) claims CUPTI's single subscriber slot
first; when another tool (Nsight, a running ``torch.profiler``) holds it, it
backs off cleanly: no kernel capture, one log line, training unaffected. Buffers
are requested at a fixed size and recycled by cupti-python; they are flushed
by the probe's shipper thread, off the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "KIND_CONCURRENT_KERNEL",
    "KIND_EXTERNAL_CORRELATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "CollectiveJoin",
    "CuptiSource",
    "Decoded",
    "decode_records",
    "is_collective_kernel",
]

log = logging.getLogger(__name__)

# CUpti_ActivityKind values (cupti_activity.h); cupti-python's ``kind`` is this int.
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KIND_MEMCPY2 = 22
KIND_EXTERNAL_CORRELATION = 39

#: CUpti_ActivityMemcpyKind → name used as the "kernel" of memcpy rows.
MEMCPY_NAMES = {
    0: "Memcpy",
    1: "Memcpy HtoD",
    2: "Memcpy DtoH",
    3: "Memcpy HtoA",
    4: "Memcpy AtoH",
    5: "Memcpy AtoA",
    6: "Memcpy AtoD",
    7: "Memcpy DtoA",
    8: "Memcpy DtoD",
    9: "Memcpy HtoH",
    10: "Memcpy PtoP",
}

#: Seconds between two forced flushes of partly filled activity buffers.
FORCED_FLUSH_S = 2.0
#: Name prefixes of NCCL's communication kernels, old and new.
COLLECTIVE_PREFIXES = ("ncclKernel_", "ncclDevKernel_", "ncclDevFunc_", "nccl")


def is_collective_kernel(name: str) -> bool:
    """True for NCCL communication kernels (``ncclKernel_*``, ``ncclDevKernel_*``, ...)."""
    return name.startswith(COLLECTIVE_PREFIXES)


class Decoded:
    """The result of decoding one batch of activity records.

    Attributes:
        rows: ``(kind, name, stream, device, correlation, start_ns, dur_ns)`` per
            kernel/memcpy/memset, times shifted by the clock offset.
        external: correlation id → external id, from EXTERNAL_CORRELATION records.
        dropped: records without usable timestamps.
    """

    __slots__ = ("dropped", "external", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, int, int, int, int]] = []
        self.external: dict[int, int] = {}
        self.dropped = 0


def decode_records(records: Iterable[Any], offset_ns: int = 0) -> Decoded:
    """Decode cupti-python activity records into kernel event rows.

    Args:
        records: Activity records (attributes as in cupti-python); other kinds are skipped.
        offset_ns: Added to CUPTI timestamps to get ns since the epoch.

    Returns:
        :class:`Decoded`; records with a zero or inverted timestamp are only counted.
    """
    out = Decoded()
    rows, external = out.rows, out.external
    for r in records:
        kind = int(r.kind)
        if kind in (KIND_CONCURRENT_KERNEL, KIND_KERNEL):
            label, name = "kernel", str(r.name)
        elif kind in (KIND_MEMCPY, KIND_MEMCPY2):
            label, name = "memcpy", MEMCPY_NAMES.get(int(getattr(r, "copy_kind", 0)), "Memcpy")
        elif kind == KIND_MEMSET:
            label, name = "memset", "Memset"
        elif kind == KIND_EXTERNAL_CORRELATION:
            external[int(r.correlation_id)] = int(r.external_id)
            continue
        else:
            continue
        start, end = int(r.start), int(r.end)
        if start <= 0 or end <= 0 or end < start:
            out.dropped += 1
            continue
        rows.append(
            (
                label,
                name,
                int(r.stream_id),
                int(r.device_id),
                int(r.correlation_id),
                start + offset_ns,
                end - start,
            )
        )
    return out


class CollectiveJoin:
    """Gives GPU collectives their device start and duration from correlated NCCL kernels.

    The probe registers each GPU collective under its external id with
    :meth:`expect`; :meth:`feed` takes decoded records; rows come out of
    :meth:`ready` once a kernel was seen for them, or after ``timeout_ns`` with
    their host-side times (the collective launched no kernel CUPTI reported).

    Row layout (the probe's collectives buffer): ``(step, process_group, seq, op,
    bytes, issue_ns, start_ns, dur_ns)``.
    """

    def __init__(self, timeout_ns: int = 10_000_000_000) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[Any]] = {}
        self._span: dict[int, list[int]] = {}
        self._corr: dict[int, int] = {}
        self.timeout_ns = timeout_ns

    def expect(self, uid: int, row: tuple[Any, ...]) -> None:
        """Hold ``row`` (host times) until kernels for external id ``uid`` arrive."""
        with self._lock:
            self._pending[uid] = list(row)

    def feed(self, decoded: Decoded) -> None:
        """Match kernel rows to held collectives through their correlation ids."""
        with self._lock:
            self._corr.update(decoded.external)
            for _kind, _name, _stream, _device, corr, start, dur in decoded.rows:
                uid = self._corr.pop(corr, None)
                if uid is None or uid not in self._pending:
                    continue
                span = self._span.get(uid)
                if span is None:
                    self._span[uid] = [start, start + dur]
                else:
                    span[0] = min(span[0], start)
                    span[1] = max(span[1], start + dur)
            if len(self._corr) > 100_000:
                # Correlations of API calls that launched nothing we track: forget the oldest.
                for key in list(self._corr)[:50_000]:
                    del self._corr[key]

    def ready(self, now_ns: int) -> list[tuple[Any, ...]]:
        """Rows whose kernels were seen (device times) or whose wait timed out (host times)."""
        out: list[tuple[Any, ...]] = []
        with self._lock:
            for uid, row in list(self._pending.items()):
                span = self._span.pop(uid, None)
                if span is not None:
                    row[6], row[7] = span[0], span[1] - span[0]
                elif now_ns - row[5] < self.timeout_ns:
                    continue
                del self._pending[uid]
                out.append(tuple(row))
        return out

    def drain(self) -> list[tuple[Any, ...]]:
        """Every held row (at exit), device times where known."""
        return self.ready(1 << 62)


class CuptiSource:
    """Live CUPTI activity capture for this process.

    Args:
        on_rows: Called (on CUPTI's thread) with each decoded batch.
        buffer_bytes: Size of each activity buffer cupti-python allocates.
    """

    def __init__(self, on_rows: Callable[[Decoded], None], buffer_bytes: int = 8 << 20) -> None:
        self._on_rows = on_rows
        self._buffer_bytes = buffer_bytes
        self._cupti: Any = None
        self._subscriber: Any = None
        self._kinds: list[Any] = []
        self._ext_kind: Any = None
        self.offset_ns = 0
        self._next_forced = 0.0
        self.active = False
        self.dropped = 0
        self.errors = 0

    def start(self) -> bool:
        """Claim CUPTI and enable kernel/memcpy/memset capture; False (logged) when not possible."""
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
            for name in ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET"):
                kind = getattr(cupti.ActivityKind, name)
                cupti.activity_enable(kind)
                self._kinds.append(kind)
            self.offset_ns = self._estimate_offset()
        except Exception:
            log.warning("argus: CUPTI activity capture failed to start", exc_info=True)
            self.stop()
            return False
        try:
            # Optional: ties NCCL kernels to their c10d collective (device start/end of collectives).
            kind = cupti.ActivityKind.EXTERNAL_CORRELATION
            cupti.activity_enable(kind)
            self._kinds.append(kind)
            self._ext_kind = cupti.ExternalCorrelationKind.CUSTOM2
        except Exception:
            log.info("argus: no CUPTI external correlation: collectives keep host-side times", exc_info=True)
            self._ext_kind = None
        self.active = True
        return True

    @property
    def correlates(self) -> bool:
        """True when collectives can be tied to their kernels (external correlation is on)."""
        return self.active and self._ext_kind is not None

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
            decoded = decode_records(activities, self.offset_ns)
            self.dropped += decoded.dropped
            self._on_rows(decoded)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("argus: decoding CUPTI records failed", exc_info=True)

    def push(self, uid: int) -> None:
        """Push external correlation id ``uid`` on this thread (around a c10d call)."""
        self._cupti.activity_push_external_correlation_id(self._ext_kind, uid)

    def pop(self) -> None:
        """Pop the external correlation id pushed by :meth:`push`."""
        self._cupti.activity_pop_external_correlation_id(self._ext_kind)

    def flush(self) -> None:
        """Hand buffers to the decoder (called off the training thread).

        Completed buffers go every call; partly filled ones are forced out every
        :data:`FORCED_FLUSH_S` so that kernel windows get their events in time.
        """
        if not self.active:
            return
        now = time.monotonic()
        forced = now >= self._next_forced
        if forced:
            self._next_forced = now + FORCED_FLUSH_S
        try:
            self._cupti.activity_flush_all(1 if forced else 0)
        except Exception:
            self.errors += 1

    def stop(self) -> None:
        """Flush, disable capture and release the subscriber slot."""
        cupti = self._cupti
        if cupti is None:
            return
        if self.active:
            with contextlib.suppress(Exception):
                cupti.activity_flush_all(1)
        for kind in self._kinds:
            with contextlib.suppress(Exception):
                cupti.activity_disable(kind)
        self._kinds = []
        if self._subscriber is not None:
            with contextlib.suppress(Exception):
                cupti.unsubscribe(self._subscriber)
            self._subscriber = None
        self.active = False
