"""Host signals of one rank, sampled by the shipper thread about once a second.

- process CPU time (user + system) in the interval, from ``time.process_time_ns``;
- host CPU use (``psutil``), 0-100 × cores;
- Python GC pauses and their count, from ``gc.callbacks`` (start/stop pairs);
- resident set size;
- on CUDA machines, GPU SM clock, temperature, power, utilisation and the
  clocks-event (throttle) reasons bitmask through NVML (:mod:`argus.agent.nvml`).

A sample row has the ``host_samples`` wire columns minus ``rank``, ``host`` and
``dropped_events``, which the probe adds.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import psutil

__all__ = ["GcTimer", "HostSampler"]


class GcTimer:
    """Accumulates Python GC pause time through ``gc.callbacks``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0 = 0
        self._pause_ns = 0
        self._count = 0
        self._installed = False

    def _callback(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self._t0:
            dt = time.perf_counter_ns() - self._t0
            self._t0 = 0
            with self._lock:
                self._pause_ns += dt
                self._count += 1

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def take(self) -> tuple[int, int]:
        """``(pause_ns, collections)`` since the last call."""
        with self._lock:
            out = (self._pause_ns, self._count)
            self._pause_ns = self._count = 0
        return out


class HostSampler:
    """Produces one host sample per call to :meth:`sample`.

    Args:
        gpu: An NVML reader for this rank's GPU, or None on CPU machines.
    """

    def __init__(self, gpu: Any = None) -> None:
        self._proc = psutil.Process()
        self._ncpu = psutil.cpu_count() or 1
        psutil.cpu_percent(interval=None)
        self._gc = GcTimer()
        self._gc.install()
        self._gpu = gpu
        self._last_ns = time.time_ns()
        self._last_cpu_ns = time.process_time_ns()

    def close(self) -> None:
        self._gc.uninstall()
        if self._gpu is not None:
            self._gpu.close()

    def sample(self) -> tuple[Any, ...]:
        """``(time_ns, interval_ns, proc_cpu_ns, host_cpu_pct, gc_pause_ns, gc_count, rss_bytes,
        gpu_sm_clock_mhz, gpu_temp_c, gpu_power_w, gpu_util_pct, gpu_throttle_reasons)``."""
        now = time.time_ns()
        cpu = time.process_time_ns()
        interval, proc_cpu = now - self._last_ns, cpu - self._last_cpu_ns
        self._last_ns, self._last_cpu_ns = now, cpu
        host_pct = float(psutil.cpu_percent(interval=None)) * self._ncpu
        pause_ns, gc_count = self._gc.take()
        try:
            rss = int(self._proc.memory_info().rss)
        except psutil.Error:
            rss = 0
        gpu = self._gpu.read() if self._gpu is not None else (0, 0.0, 0.0, 0.0, 0)
        return (now, interval, proc_cpu, host_pct, pause_ns, gc_count, rss, *gpu)
