"""The probe's GPU side: which device a rank uses, and its CUPTI kernel capture.

:class:`GpuCapture` runs :class:`~argus.agent.cupti.CuptiSource` (duty-cycled slices; its
backend keeps what CUPTI hands over, bounded, until the shipper takes it decoded), ties GPU collectives to
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
from argus.agent.cupti import CollectiveJoin, CuptiSource
from argus.agent.nvml import cuda_present
from argus.agent.recorder import Recorder

__all__ = ["GpuCapture", "detect_device", "gpu_reader"]

log = logging.getLogger(__name__)


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
        self.source = CuptiSource()
        self._correlator = _Correlator(self.source)
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
        decoded = source.take()
        self._cupti_dropped += decoded.dropped
        join.feed(decoded)
        table = decoded.table(rank) if len(decoded) else None
        for row in join.drain() if final else join.ready(now_ns):
            self.recorder.buffers["collectives"].append(row)
        return table

    def take_spans(self, now_ns: int) -> list[tuple[int, int]]:
        """The spans captured since the last call (``(start_ns, end_ns)``, host clock)."""
        return self.source.take_spans(now_ns)

    def dropped(self) -> int:
        """Records lost so far: over the backend's bound, or with timestamps CUPTI could not collect."""
        return self._cupti_dropped + self.source.lost

    def stop(self) -> None:
        """Stop tagging collectives and release CUPTI (at exit)."""
        self.recorder.correlate = None
        self.source.stop()
