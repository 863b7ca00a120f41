"""The node agent's kernel windows, closed: summaries to the uploader, their frames acknowledged.

Kernel events wait in :class:`argus.agent.kernels.KernelWindows` until their window and its
grace have passed. :class:`WindowCloser` closes the windows that are ready (every half
second, in a thread of its own), queues their ``kernel_summaries`` rows on the uploader,
releases the probe frames that carried their events (:meth:`argus.agent.acks.Acks.release`:
acknowledged once the summaries are spooled), and counts the events dropped (late, too far
ahead of the clock, over the bound of held events). A ``DUMP`` request reads the raw events
still held (:meth:`WindowCloser.raw`).
"""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa

from argus.agent.acks import Acks
from argus.agent.clock import CollectorClock
from argus.agent.kernels import KernelWindows
from argus.agent.uploader import Uploader

__all__ = ["WindowCloser"]

log = logging.getLogger(__name__)

#: Seconds between two looks for windows ready to close.
CLOSE_EVERY_S = 0.5


class WindowCloser:
    """Closes kernel windows into summaries on the uploader.

    Args:
        windows: Kernel events held for their window.
        uploader: Queue of rows for the collector.
        acks: What the probes are owed.
        clock: Offset to the collector's clock (windows are on its time).
    """

    def __init__(self, windows: KernelWindows, uploader: Uploader, acks: Acks, clock: CollectorClock) -> None:
        self.windows, self.uploader, self.acks, self.clock = windows, uploader, acks, clock
        self._lock = threading.Lock()
        self._drops_reported = 0

    def run(self, stop: threading.Event) -> None:
        """Close the windows that are ready until ``stop`` is set (a thread's target)."""
        while not stop.wait(CLOSE_EVERY_S):
            try:
                self.close(self.windows.ready(time.time_ns() + self.clock.current_ns))
            except Exception:
                log.warning("argus agent: compressing kernel windows failed", exc_info=True)

    def flush_all(self) -> None:
        """Close every open window, ready or not (at stop)."""
        self.close(self.windows.flush_all())

    def close(self, summaries: list[tuple[str, pa.Table]]) -> None:
        """Queue the summaries of windows just closed, release the frames done with, count drops."""
        for job_id, rows in summaries:
            self.uploader.add(job_id, "kernel_summaries", rows, self.clock.current_ns)
        self.acks.release(self.windows.released(), self.uploader.generation)
        w = self.windows
        with self._lock:
            dropped, self._drops_reported = w.dropped_events - self._drops_reported, w.dropped_events
        if dropped > 0:
            log.warning(
                "argus agent: %d kernel events dropped (so far: %d after their window closed, %d too far "
                "ahead of the clock, %d over the bound of held events)",
                dropped,
                w.late_events,
                w.future_events,
                w.overflow_events,
            )
            self.uploader.count_dropped(dropped)

    def raw(self, job_id: str, start_ns: int, end_ns: int) -> int:
        """Queue the raw kernel events of ``job_id`` in ``[start_ns, end_ns)`` still held; returns rows."""
        data = self.windows.raw(job_id, start_ns, end_ns)
        self.uploader.add(job_id, "kernel_events", data, self.clock.current_ns)
        return data.num_rows
