"""Host signals of one rank, sampled by the shipper thread about once a second.

- process CPU time (user + system) in the interval, from ``time.process_time_ns``;
- run-queue delay in the interval: how long the process's threads were runnable but waited
  for a CPU, from the scheduler's statistics (``/proc/self/task/<tid>/schedstat``, second
  field, ns; Linux with ``CONFIG_SCHED_INFO``; -1 where unknown);
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
import os
import threading
import time
from typing import Any

import psutil

__all__ = ["GcTimer", "HostSampler", "RunDelay"]

_TASKS = "/proc/self/task"


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


class RunDelay:
    """Run-queue delay of this process: the time its threads were runnable but not running, ns.

    The kernel keeps it per thread (``/proc/self/task/<tid>/schedstat``: CPU time, run-queue
    delay, timeslices); :meth:`take` sums the delay over the live threads and returns what
    accrued since the last call. A thread that exited takes its share of the last interval
    with it (an undercount, never a double count). About 10 µs per thread a call.
    """

    def __init__(self) -> None:
        first = self._read()
        self.available = first is not None
        self._last: dict[str, int] = first or {}

    def _read(self) -> dict[str, int] | None:
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return None
        out: dict[str, int] = {}
        for tid in tids:
            try:
                with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                    out[tid] = int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the thread exited, or no scheduler statistics
        return out or None

    def take(self) -> int:
        """Run-queue delay accrued since the last call or construction, ns (a thread new since then:
        all of its own); -1 where unknown."""
        now = self._read() if self.available else None
        if now is None:
            return -1
        delay = sum(v - self._last.get(tid, 0) for tid, v in now.items())
        self._last = now
        return max(delay, 0)


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
        self._run_delay = RunDelay()

    def close(self) -> None:
        self._gc.uninstall()
        if self._gpu is not None:
            self._gpu.close()

    def sample(self) -> tuple[Any, ...]:
        """``(time_ns, interval_ns, proc_cpu_ns, host_cpu_pct, gc_pause_ns, gc_count, rss_bytes,
        gpu_sm_clock_mhz, gpu_temp_c, gpu_power_w, gpu_util_pct, gpu_throttle_reasons,
        run_delay_ns)``."""
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
        return (now, interval, proc_cpu, host_pct, pause_ns, gc_count, rss, *gpu, self._run_delay.take())
