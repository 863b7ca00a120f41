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

from argus.analyzer import dense
from argus.analyzer.window import HostSamples

F64 = NDArray[np.float64]

__all__ = ["THROTTLE_MASK", "HostResult", "delay_per_step", "host_signals", "starved_wait"]

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
    ranks, idx = dense.unique_inverse(h.rank)
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


def starved_wait(
    wait: F64 | float, cpu: F64 | float, work_cpu: F64 | float, wait_per_cpu: F64 | float
) -> F64:
    """Per rank, the run-queue delay its own work does not explain: what other processes on its
    host cost it (negative: it waited less than its work would). Any one unit for ``wait``,
    ``cpu`` and ``work_cpu`` (shares of wall time, ns per step), the result in it; arrays
    broadcast.

    Its work explains its CPU time up to ``work_cpu`` (that of the ranks that do its work) at
    ``wait_per_cpu`` (their run-queue delay per CPU second), and its CPU time beyond that at the
    rate it got itself (``wait / cpu``). A rank that works more waits more per CPU second than its
    peers on a busy host, not only in proportion: they sleep in the synchronisations between
    short bursts of work and, woken, run soon; its extra work keeps it runnable for long
    stretches, which wait at the host's full rate (measured: 10 s per CPU second against its
    peers' 7-9 s, four-rank jobs at load 10-30 on 2 cores). So a slow rank's own extra work's wait
    is never the host's doing; a rank held off the CPU more than its peers for the same work is.
    The one owner of this rule: the causes (:mod:`argus.analyzer.causes`, is a straggler
    starved?) and the best-ranks reference (:mod:`argus.analyzer.phase`, what to discount before
    ranks that do the same work are compared) both read it.
    """
    wait_a, cpu_a = np.asarray(wait, np.float64), np.asarray(cpu, np.float64)
    own_rate = np.divide(wait_a, cpu_a, out=np.zeros(np.broadcast(wait_a, cpu_a).shape), where=cpu_a > 0)
    shared = np.minimum(cpu_a, work_cpu)
    return np.asarray(wait_a - shared * wait_per_cpu - np.maximum(cpu_a - work_cpu, 0.0) * own_rate)


def delay_per_step(host: HostResult, ranks: NDArray[np.int64], step_ns: F64) -> tuple[F64, F64]:
    """Per rank of ``ranks`` (sorted), its run-queue delay and its CPU time per step, ns: its share
    of wall time (:func:`host_signals`) times its mean step (``step_ns``, shape ``(n, steps)``,
    NaN where missing); 0 where its run-queue delay is unknown."""
    rq, cpu = np.zeros(ranks.size), np.zeros(ranks.size)
    known = np.isin(host.rank, ranks) & np.isfinite(host.wait_frac)
    if not np.any(known):
        return rq, cpu
    idx = np.searchsorted(ranks, host.rank[known])
    step = np.nan_to_num(np.nanmean(step_ns, axis=1), nan=0.0)
    rq[idx] = host.wait_frac[known] * step[idx]
    cpu[idx] = host.cpu_frac[known] * step[idx]
    return rq, cpu
