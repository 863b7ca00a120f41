"""A fleet of simulated node agents' rows: what 1,250 nodes × 8 ranks send, as wire tables (bench/scale.py).

:class:`Fleet` plays a synchronous job of ``agents × ranks_per_agent`` ranks step
by step, for every rank of the world at once with NumPy, from a seed: every
process that plays the same fleet computes the same timings, so several
simulator processes can each send the rows of their own agents while the
job-wide collective still waits for the last rank of the whole world.

Per rank and step (about :data:`STEP_MS` ms when healthy):

* ``data → forward → [all-reduce in its node's group of 8] → backward →
  [two all-reduces in its group] → [one all-reduce across the whole job] →
  optimizer``: four collectives per step, each ending at its group's last
  arrival plus a transfer time; the step ends with the optimizer;
* log-normal jitter (:data:`NOISE`) on every phase and transfer;
* from ``onset_ns`` on, ``slow_rank`` computes (forward, backward and its compute
  kernels) ``1 + slowdown`` times as long: its group and then the whole job wait for it.

Per rank and second a host sample (the rank's heartbeat); per rank and window
:data:`KERNELS` kernel groups of :data:`CLUSTERS` KDE clusters each (the rows
``kernel_summaries`` holds, as the node agent writes them at the window's end);
at the start, each rank's ``attach`` and its two ``group`` events (the world group
``"0"``, with every rank as a member, and its node's group), as the probe records them.

Times are int64 ns since the epoch on one clock (no clock offsets). Rows of one
agent come out as tables of :func:`argus.schema.wire_table`, ready for
:func:`argus.agent.protocol.ipc_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from argus.schema import PHASES, wire_table

__all__ = ["CLUSTERS", "KERNELS", "STEP_MS", "Fleet"]

#: Mean phase durations of a healthy step, ms (data, forward, backward, optimizer).
PHASE_MS = (20.0, 140.0, 250.0, 30.0)
#: Transfer time of an all-reduce within a node's group, and across the job, ms.
GROUP_XFER_MS = 5.0
WORLD_XFER_MS = 45.0
#: A healthy step, ms.
STEP_MS = sum(PHASE_MS) + 3 * GROUP_XFER_MS + WORLD_XFER_MS
#: Log-normal sigma of every duration.
NOISE = 0.02
#: Kernel groups per rank and window, and KDE clusters per group.
KERNELS = 50
CLUSTERS = 3
#: Collective (NCCL) kernels among them: their durations do not follow the rank's compute.
COLLECTIVE_KERNELS = 2
_MS = 1_000_000
_WORLD_GROUP = "0"
_GROUP_BYTES = 16 << 20
_WORLD_BYTES = 100 << 20


@dataclass
class _Step:
    """One step of the whole world, times relative to the fleet's ``t0_ns`` (float ns), shape (ranks,)."""

    begin: NDArray[np.float64]
    phase_start: NDArray[np.float64]  # (4, ranks)
    phase_dur: NDArray[np.float64]  # (4, ranks)
    issue: NDArray[np.float64]  # (4, ranks): the three group all-reduces, then the world one
    start: NDArray[np.float64]  # (4, ranks): the last arrival
    end: NDArray[np.float64]  # (4, ranks)
    step_end: NDArray[np.float64]


@dataclass
class Fleet:
    """The simulated job; see the module doc.

    Args:
        agents: Node agents (nodes).
        ranks_per_agent: Ranks per node; also the size of each node's process group.
        t0_ns: When every rank's first step begins, ns since the epoch.
        window_ns: The kernel-summary window, ns (windows aligned to epoch multiples of it).
        slow_rank: The rank slowed from ``onset_ns``; None for a healthy job.
        onset_ns: When the slowdown begins, ns since the epoch.
        slowdown: The slow rank's extra compute time, a fraction (0.2 = 20 % longer).
        seed: Seed of every random draw.
    """

    agents: int
    ranks_per_agent: int
    t0_ns: int
    window_ns: int
    slow_rank: int | None = None
    onset_ns: int = 0
    slowdown: float = 0.2
    seed: int = 0
    _steps: list[_Step] = field(default_factory=list, repr=False)

    @property
    def world(self) -> int:
        return self.agents * self.ranks_per_agent

    def host(self, agent: int) -> str:
        return f"node{agent:04d}"

    def step(self, k: int) -> _Step:
        """Step ``k`` of every rank (played on first use; steps are played in order)."""
        while len(self._steps) <= k:
            self._steps.append(self._play(len(self._steps)))
        return self._steps[k]

    def forget(self, before: int) -> None:
        """Free steps before ``before`` (their rows were sent); they cannot be asked for again."""
        for i in range(min(before, len(self._steps))):
            self._steps[i] = None  # type: ignore[call-overload]

    def _play(self, k: int) -> _Step:
        n, g = self.world, self.ranks_per_agent
        rng = np.random.default_rng((self.seed, k))
        begin = self._steps[k - 1].step_end if k else np.zeros(n)
        dur = np.array(PHASE_MS)[:, None] * _MS * rng.lognormal(0.0, NOISE, (4, n))
        if self.slow_rank is not None and begin[self.slow_rank] + self.t0_ns >= self.onset_ns:
            dur[1:3, self.slow_rank] *= 1 + self.slowdown
        xfer = rng.lognormal(0.0, NOISE, (4, n // g)).repeat(g, axis=1) * _MS
        xfer[:3] *= GROUP_XFER_MS
        xfer[3] *= WORLD_XFER_MS

        def last_in_group(t: NDArray[np.float64]) -> NDArray[np.float64]:
            return np.asarray(t.reshape(-1, g).max(axis=1).repeat(g))

        issue, start, end = np.empty((4, n)), np.empty((4, n)), np.empty((4, n))
        phase_start = np.empty((4, n))
        phase_start[0] = begin
        phase_start[1] = begin + dur[0]
        issue[0] = phase_start[1] + dur[1]  # after forward, in its node's group
        start[0] = last_in_group(issue[0])
        end[0] = start[0] + xfer[0]
        phase_start[2] = end[0]
        issue[1] = phase_start[2] + dur[2]  # after backward, twice in its group
        start[1] = last_in_group(issue[1])
        end[1] = start[1] + xfer[1]
        issue[2] = start[2] = end[1]
        end[2] = start[2] + xfer[2]
        issue[3] = end[2]  # then across the whole job
        start[3] = np.full(n, issue[3].max())
        end[3] = start[3] + xfer[3]
        phase_start[3] = end[3]
        return _Step(begin, phase_start, dur, issue, start, end, end[3] + dur[3])

    def step_end_ns(self, k: int) -> int:
        """When the last rank ended step ``k``, ns since the epoch."""
        return self.t0_ns + int(self.step(k).step_end.max())

    def lifecycle(self, agent: int, time_ns: int) -> dict[str, pa.Table]:
        """Agent ``agent``'s ``jobs`` row and its ranks' ``attach`` and ``group`` events at ``time_ns``."""
        g = self.ranks_per_agent
        own = np.arange(agent * g, (agent + 1) * g, dtype=np.uint32)
        node_group = str(1 + agent)
        rank = np.repeat(own, 3)
        event = np.tile(np.array(["attach", "group", "group"], object), g)
        group = np.tile(np.array(["", _WORLD_GROUP, node_group], object), g)
        sizes = np.tile(np.array([0, self.world, g]), g)
        values = np.concatenate(
            [np.concatenate([np.arange(self.world, dtype=np.uint32), own]) for _ in range(g)]
        )
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        members = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32()))
        n = rank.size
        ranks = wire_table(
            "ranks",
            {
                "rank": rank,
                "event": event,
                "time_ns": np.full(n, time_ns, np.int64),
                "local_rank": (rank % g).astype(np.int32),
                "world_size": np.full(n, self.world, np.uint32),
                "host": np.full(n, self.host(agent), object),
                "pid": (1000 + rank % g).astype(np.uint32),
                "agent_id": np.full(n, "", object),
                "device": np.array([f"cuda:{int(r) % g}" for r in rank], object),
                "clock_offset_ns": np.zeros(n, np.int64),
                "exit_code": np.zeros(n, np.int32),
                "group_name": group,
                "group_ranks": members,
                "group_backend": np.where(group == "", "", "nccl").astype(object),
            },
        )
        jobs = wire_table(
            "jobs",
            {"world_size": [self.world], "start_ns": [time_ns], "command": ["scale"], "source": ["live"]},
        )
        return {"jobs": jobs, "ranks": ranks}

    def steps(self, k: int, a0: int, a1: int) -> dict[str, pa.Table]:
        """``steps``, ``phases`` and ``collectives`` of step ``k`` of agents ``[a0, a1)``, in rank order
        (every agent's rows contiguous and as many: slice by agent)."""
        g = self.ranks_per_agent
        lo, hi = a0 * g, a1 * g
        s, t0, n = self.step(k), self.t0_ns, hi - lo
        rank = np.arange(lo, hi, dtype=np.uint32)
        out = {
            "steps": wire_table(
                "steps",
                {
                    "rank": rank,
                    "step": np.full(n, k, np.uint64),
                    "start_ns": _ns(t0, s.begin[lo:hi]),
                    "dur_ns": _dur(t0, s.begin[lo:hi], s.step_end[lo:hi]),
                },
            )
        }
        # (rank, phase) order; the same per collective.
        out["phases"] = wire_table(
            "phases",
            {
                "rank": np.repeat(rank, 4),
                "step": np.full(4 * n, k, np.uint64),
                "phase": np.tile(np.array(PHASES, object), n),
                "start_ns": _ns(t0, s.phase_start[:, lo:hi].T.ravel()),
                "dur_ns": _dur(
                    t0, s.phase_start[:, lo:hi].T.ravel(), (s.phase_start + s.phase_dur)[:, lo:hi].T.ravel()
                ),
            },
        )
        which = np.tile(np.arange(4), n)
        node_group = np.repeat(np.arange(1 + a0, 1 + a1).astype(str).astype(object), 4 * g)
        world = which == 3
        out["collectives"] = wire_table(
            "collectives",
            {
                "rank": np.repeat(rank, 4),
                "step": np.full(4 * n, k, np.uint64),
                "process_group": np.where(world, _WORLD_GROUP, node_group),
                "seq": np.where(world, k, 3 * k + np.minimum(which, 2)).astype(np.uint64),
                "op": np.full(4 * n, "allreduce", object),
                "bytes": np.where(world, _WORLD_BYTES, _GROUP_BYTES).astype(np.uint64),
                "issue_ns": _ns(t0, s.issue[:, lo:hi].T.ravel()),
                "start_ns": _ns(t0, s.start[:, lo:hi].T.ravel()),
                "dur_ns": _dur(t0, s.start[:, lo:hi].T.ravel(), s.end[:, lo:hi].T.ravel()),
            },
        )
        return out

    def host_samples(self, second: int, a0: int, a1: int) -> pa.Table:
        """Host samples of agents ``[a0, a1)`` for second ``second`` (ending at ``t0 + second`` s)."""
        g = self.ranks_per_agent
        n = (a1 - a0) * g
        return wire_table(
            "host_samples",
            {
                "rank": np.arange(a0 * g, a1 * g, dtype=np.int32),
                "host": np.repeat(np.array([self.host(a) for a in range(a0, a1)], object), g),
                "time_ns": np.full(n, self.t0_ns + second * 1_000_000_000, np.int64),
                "interval_ns": np.full(n, 1_000_000_000, np.int64),
                "proc_cpu_ns": np.full(n, 950_000_000, np.int64),
                "host_cpu_pct": np.full(n, 100.0 * g, np.float32),
                "gc_pause_ns": np.zeros(n, np.int64),
                "gc_count": np.zeros(n, np.uint32),
                "rss_bytes": np.full(n, 4 << 30, np.uint64),
                "dropped_events": np.zeros(n, np.uint64),
                "gpu_sm_clock_mhz": np.full(n, 1980, np.uint32),
                "gpu_temp_c": np.full(n, 60.0, np.float32),
                "gpu_power_w": np.full(n, 500.0, np.float32),
                "gpu_util_pct": np.full(n, 95.0, np.float32),
                "gpu_throttle_reasons": np.zeros(n, np.uint64),
                "pending_group": np.full(n, "", object),
                "pending_seq": np.full(n, -1, np.int64),
                "pending_op": np.full(n, "", object),
                "pending_issue_ns": np.zeros(n, np.int64),
            },
        )

    def kernel_summaries(self, window_start_ns: int, a0: int, a1: int) -> pa.Table:
        """KDE clusters of agents ``[a0, a1)`` for the window at ``window_start_ns``: KERNELS × CLUSTERS
        rows per rank, rank order."""
        g = self.ranks_per_agent
        rng = np.random.default_rng((self.seed, window_start_ns // self.window_ns, a0))
        per_rank = KERNELS * CLUSTERS
        n = (a1 - a0) * g * per_rank
        rank = np.repeat(np.arange(a0 * g, a1 * g, dtype=np.uint32), per_rank)
        kernel = np.tile(np.repeat(np.arange(KERNELS), CLUSTERS), (a1 - a0) * g)
        cluster = np.tile(np.arange(CLUSTERS, dtype=np.uint16), n // CLUSTERS)
        base = np.geomspace(5e3, 5e6, KERNELS)[kernel] * np.array([1.0, 1.6, 2.5])[cluster]
        sigma = 0.05
        p50 = base * rng.lognormal(0.0, NOISE / 4, n)
        collective = kernel >= KERNELS - COLLECTIVE_KERNELS
        if self.slow_rank is not None and window_start_ns >= self.onset_ns:
            p50[(rank == self.slow_rank) & ~collective] *= 1 + self.slowdown
        count = np.maximum(4, np.array([60, 30, 10])[cluster] * rng.uniform(0.9, 1.1, n)).astype(np.uint64)
        names = np.array(
            [f"void gemm_kernel_{k}<float, 128, 64>" for k in range(KERNELS - COLLECTIVE_KERNELS)]
            + [f"ncclDevKernel_AllReduce_Sum_bf16_RING_LL_{k}" for k in range(COLLECTIVE_KERNELS)],
            object,
        )
        return wire_table(
            "kernel_summaries",
            {
                "rank": rank,
                "window_start_ns": np.full(n, window_start_ns, np.int64),
                "window_ns": np.full(n, self.window_ns, np.int64),
                "kind": np.full(n, "kernel", object),
                "kernel": names[kernel],
                "stream": np.where(collective, 20, 7).astype(np.uint32),
                "collective": collective.astype(np.uint8),
                "cluster": cluster,
                "count": count,
                "p50_ns": p50,
                "p99_ns": p50 * np.exp(2.326 * sigma),
                "log_lo": np.log(p50) - 3.0 * sigma,
                "log_hi": np.log(p50) + 3.5 * sigma,
                "sum_ns": count * p50 * np.exp(sigma**2 / 2),
                "resolution_ns": np.ones(n, np.int64),
                "covered_ns": np.full(n, self.window_ns, np.int64),
            },
        )


def _ns(t0: int, rel: NDArray[np.float64]) -> NDArray[np.int64]:
    """Float ns after ``t0`` as int64 ns since the epoch (added in int64: float64 cannot hold epochs)."""
    return np.int64(t0) + np.rint(rel).astype(np.int64)


def _dur(t0: int, start: NDArray[np.float64], end: NDArray[np.float64]) -> NDArray[np.int64]:
    """Durations in int64 ns from the rounded ends, so that ``start_ns + dur_ns`` is the very
    nanosecond the next event of the rank is stamped at when it follows at once (a phase's end
    and the collective it issues, a collective's end and the next one's issue). Rounding the
    duration on its own puts the end a nanosecond after that event as often as not, and a rank
    with an event inside its collective call was busy through it, and made the whole instance
    asynchronous: on 10,000 ranks, 8 of a window's 19 job-wide all-reduces."""
    return _ns(t0, end) - _ns(t0, start)
