"""Per-rank host signals of a window: CPU use, run-queue delay, GC pauses, GPU clocks and
throttle reasons.

These do not find stragglers; they tell *why* one is slow (:mod:`argus.analyzer.causes`):
extra time burnt on the CPU is extra work (``compute``), extra time without
CPU is a stall (``host_stall``), and so is extra time spent runnable but waiting
for a CPU that other processes held (run-queue delay); a reduced SM clock or a
thermal/power-brake reason is ``throttling``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.window import HostSamples

__all__ = ["THROTTLE_MASK", "HostResult", "host_signals"]

#: NVML clocks-event reasons that mean the GPU slowed itself down: SW power cap (0x4),
#: HW slowdown (0x8), SW thermal (0x20), HW thermal (0x40), HW power brake (0x80).
#: Idle (0x1), application clocks (0x2) and sync boost (0x10) are not faults.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class HostResult:
    """Per-rank host signals over the window; arrays align with ``rank``.

    Attributes:
        rank: Global ranks with host samples, sorted.
        cpu_frac: Process CPU time / wall time over the samples (may exceed 1: threads).
        wait_frac: Run-queue delay / wall time over the samples that know it (may exceed 1:
            threads); NaN where none does.
        gc_frac: GC pause time / wall time.
        sm_clock_mhz: Median SM clock; 0 without a GPU.
        throttled_frac: Fraction of samples with a :data:`THROTTLE_MASK` reason set.
        reasons: OR of all throttle reasons seen.
    """

    rank: NDArray[np.int64]
    cpu_frac: NDArray[np.float64]
    wait_frac: NDArray[np.float64]
    gc_frac: NDArray[np.float64]
    sm_clock_mhz: NDArray[np.float64]
    throttled_frac: NDArray[np.float64]
    reasons: NDArray[np.int64]

    def lookup(self, rank: int) -> int | None:
        """Index of ``rank`` in the arrays, or None."""
        i = int(np.searchsorted(self.rank, rank))
        return i if i < self.rank.size and self.rank[i] == rank else None


def host_signals(h: HostSamples) -> HostResult:
    """Reduce a window's host samples to per-rank signals."""
    ranks, idx = np.unique(h.rank, return_inverse=True)
    n = ranks.size
    wall = np.bincount(idx, h.interval_ns.astype(np.float64), n)
    with np.errstate(divide="ignore", invalid="ignore"):
        cpu = np.bincount(idx, h.proc_cpu_ns.astype(np.float64), n) / wall
        gc = np.bincount(idx, h.gc_pause_ns.astype(np.float64), n) / wall
        delay = h.run_delays
        known = delay >= 0
        wait = np.bincount(idx, np.where(known, delay, 0).astype(np.float64), n) / np.bincount(
            idx, np.where(known, h.interval_ns, 0).astype(np.float64), n
        )
    clock = np.zeros(n)
    if n:
        order = np.lexsort((h.gpu_sm_clock_mhz, idx))
        counts = np.bincount(idx, minlength=n)
        starts = np.r_[0, np.cumsum(counts)[:-1]]
        clock = h.gpu_sm_clock_mhz[order][starts + counts // 2].astype(np.float64)
    bad = (h.gpu_throttle_reasons & THROTTLE_MASK) != 0
    throttled = np.bincount(idx, bad.astype(np.float64), n) / np.maximum(np.bincount(idx, minlength=n), 1)
    reasons = np.zeros(n, np.int64)
    np.bitwise_or.at(reasons, idx, h.gpu_throttle_reasons & THROTTLE_MASK)
    return HostResult(
        ranks.astype(np.int64), np.nan_to_num(cpu), wait, np.nan_to_num(gc), clock, throttled, reasons
    )
