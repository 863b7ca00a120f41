"""The probe's GPU side: which device a rank uses, and its CUPTI kernel capture.

:class:`GpuCapture` runs :class:`~argus.agent.cupti.CuptiSource` (duty-cycled slices), keeps
the activity buffers CUPTI hands over until the shipper decodes them, ties GPU collectives to
their NCCL kernels (:class:`~argus.agent.cupti.CollectiveJoin`, through an external correlation
id pushed around each c10d call during a slice) and steps aside while the user's
``torch.profiler`` needs CUPTI (:mod:`argus.agent.profiler_yield`). CPU code paths import no
CUDA library: this module imports torch only, and CUPTI/NVML when a capture starts.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from typing import Any

import pyarrow as pa
import torch

from argus import config
from argus.agent.cupti import Activity, CollectiveJoin, CuptiSource, decode
from argus.agent.nvml import cuda_present
from argus.agent.recorder import Recorder

__all__ = ["KERNEL_CAPACITY", "GpuCapture", "detect_device", "gpu_reader"]

log = logging.getLogger(__name__)

#: Kernel/memcpy/memset records held between two shipments.
KERNEL_CAPACITY = 1 << 20


def detect_device() -> str:
    """``cuda:N`` of this rank (its current device, else ``LOCAL_RANK`` modulo the GPUs), or ``cpu``."""
    if not cuda_present() or torch.version.cuda is None:
        return "cpu"
    try:
        if not torch.cuda.is_available():
            return "cpu"
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return f"cuda:{torch.cuda.current_device()}"
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        return f"cuda:{local % max(torch.cuda.device_count(), 1)}"
    except Exception:
        return "cpu"


def gpu_reader(device: str) -> Any:
    """An NVML reader of ``device`` (clocks, temperature, throttling), or None (CPU, no NVML)."""
    if not device.startswith("cuda"):
        return None
    try:
        from argus.agent.nvml import GpuReader

        index = int(device.split(":")[1])
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return GpuReader(uuid)
    except Exception as exc:
        log.info("argus: no NVML GPU signals (%s)", exc)
        return None


class _Correlator:
    """Pushes a fresh external correlation id around each GPU collective."""

    def __init__(self, source: CuptiSource) -> None:
        self._source = source
        self._ids = itertools.count(1)
        self._pushed = threading.local()

    def push(self) -> int:
        uid = next(self._ids)
        try:
            self._source.push(uid)
            self._pushed.ok = True
        except Exception:
            self._pushed.ok = False
            return 0
        return uid

    def pop(self) -> None:
        if getattr(self._pushed, "ok", False):
            self._pushed.ok = False
            with contextlib.suppress(Exception):
                self._source.pop()


class GpuCapture:
    """CUPTI kernel capture for one rank, fed to its :class:`~argus.agent.recorder.Recorder`.

    Build it with :meth:`start`; the shipper thread calls :meth:`edge` at the duty cycle's
    edges, :meth:`rows` and :meth:`take_spans` at each shipment, :meth:`stop` at exit.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.source = CuptiSource(self._on_activity)
        self._correlator = _Correlator(self.source)
        self._activity: list[Activity] = []
        self._activity_rows = 0
        self._activity_lock = threading.Lock()
        self._activity_dropped = 0
        self._cupti_dropped = 0
        #: Wall-clock ns of the duty cycle's next edge (0: at once).
        self.next_edge_ns = 0

    @classmethod
    def start(cls, recorder: Recorder, device: str) -> GpuCapture | None:
        """Claim CUPTI for a CUDA rank; None on CPU, with ``ARGUS_CUPTI=0`` or when CUPTI is taken."""
        if not device.startswith("cuda") or os.environ.get(config.ENV_CUPTI, "1") == "0":
            return None
        capture = cls(recorder)
        if not capture.source.start():
            return None
        recorder.join = CollectiveJoin()
        from argus.agent import profiler_yield

        profiler_yield.install(capture.release, capture.resume)
        return capture

    @property
    def active(self) -> bool:
        """CUPTI is held (not given to torch.profiler, not released after an error)."""
        return self.source.active

    def _on_activity(self, activity: Activity) -> None:
        """A completed CUPTI buffer (CUPTI's thread): keep it for the shipper, bounded by records."""
        n = len(activity)
        with self._activity_lock:
            if self._activity_rows + n > KERNEL_CAPACITY:
                self._activity_dropped += n
                return
            self._activity.append(activity)
            self._activity_rows += n

    def _take_activity(self) -> list[Activity]:
        with self._activity_lock:
            out, self._activity = self._activity, []
            self._activity_rows = 0
        return out

    def edge(self, now_ns: int) -> None:
        """At an edge of the duty cycle, start or end a capture slice (shipper thread)."""
        source = self.source
        if not source.active or now_ns < self.next_edge_ns:
            return  # given to torch.profiler or released on an error, or not yet an edge
        self.next_edge_ns = now_ns + 1_000_000_000  # should update raise: retry in a second, not in a spin
        self.next_edge_ns = source.update(now_ns)
        recorder = self.recorder
        recorder.correlate = self._correlator if source.correlates and recorder.active else None

    def release(self) -> None:
        """Give CUPTI to the user's torch.profiler (see :mod:`argus.agent.profiler_yield`)."""
        self.recorder.correlate = None
        self.source.stop()

    def resume(self) -> None:
        """Take CUPTI back after the user's profiler stopped."""
        if self.recorder.active and self.source.start():
            self.next_edge_ns = 0

    def rows(self, rank: int, now_ns: int, final: bool) -> pa.Table | None:
        """Decode the CUPTI buffers taken since the last shipment (``kernel_events`` of ``rank``);
        collectives whose kernels came (or whose wait ended) go to the recorder's buffer."""
        source, join = self.source, self.recorder.join
        assert join is not None
        source.flush()
        activity = self._take_activity()
        table = None
        if activity:
            decoded = decode(activity, source.offset_ns)
            self._cupti_dropped += decoded.dropped
            join.feed(decoded)
            if len(decoded):
                table = decoded.table(rank)
        for row in join.drain() if final else join.ready(now_ns):
            self.recorder.buffers["collectives"].append(row)
        return table

    def take_spans(self, now_ns: int) -> list[tuple[int, int]]:
        """The spans captured since the last call (``(start_ns, end_ns)``, host clock)."""
        return self.source.take_spans(now_ns)

    def dropped(self) -> int:
        """Records lost so far: over the buffer bound, or with timestamps CUPTI could not collect."""
        return self._activity_dropped + self._cupti_dropped

    def stop(self) -> None:
        """Stop tagging collectives and release CUPTI (at exit)."""
        self.recorder.correlate = None
        self.source.stop()
