"""What one analysis window of one job holds: NumPy columns, parsed once (docs/style.md §8).

The store reader (:mod:`argus.analyzer.store_io`) and the synthetic generator
(:mod:`synthetic.jobs`) both build a :class:`Window`; the levels
(L1/L2/L3), liveness and cause attribution only read it. Times are int64 ns
since the epoch, durations int64 ns. Ranks are global ranks. Categorical
columns (phase, process group, op, kernel) are small ints indexing a names tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Collectives",
    "HostSamples",
    "KernelClusters",
    "LinkSamples",
    "Phases",
    "RankStatus",
    "Steps",
    "Window",
    "progress_position",
]

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


def _i64(n: int = 0) -> I64:
    return np.zeros(n, np.int64)


@dataclass(frozen=True)
class Steps:
    """Steps that ended inside the window, one row per (rank, step)."""

    rank: I64 = field(default_factory=_i64)
    step: I64 = field(default_factory=_i64)
    start_ns: I64 = field(default_factory=_i64)
    dur_ns: I64 = field(default_factory=_i64)


@dataclass(frozen=True)
class Phases:
    """Phases of those steps; ``phase`` indexes :data:`argus.schema.PHASES`."""

    rank: I64 = field(default_factory=_i64)
    step: I64 = field(default_factory=_i64)
    phase: I64 = field(default_factory=_i64)
    start_ns: I64 = field(default_factory=_i64)
    dur_ns: I64 = field(default_factory=_i64)


@dataclass(frozen=True)
class Collectives:
    """Every rank's row of each collective instance touched by the window's steps.

    ``group`` indexes ``group_names``; ``op`` indexes ``op_names``. ``in_window``
    marks rows whose own (rank, step) is one of the window's steps (other rows
    are peers' rows of the same instances, needed to decompose them). ``peer`` is
    the point-to-point partner's global rank of a ``send``/``recv`` row (-1 for a
    collective); a send and its receive share (group, sender, receiver, seq).
    ``overlapped`` marks calls the probe knows did not block at issue (DDP buckets);
    ``wait_ns`` is when the rank began waiting for an asynchronous call (0: unknown).
    """

    rank: I64 = field(default_factory=_i64)
    step: I64 = field(default_factory=_i64)
    group: I64 = field(default_factory=_i64)
    seq: I64 = field(default_factory=_i64)
    op: I64 = field(default_factory=_i64)
    bytes: I64 = field(default_factory=_i64)
    issue_ns: I64 = field(default_factory=_i64)
    start_ns: I64 = field(default_factory=_i64)
    dur_ns: I64 = field(default_factory=_i64)
    in_window: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    group_names: tuple[str, ...] = ()
    op_names: tuple[str, ...] = ()
    peer: I64 | None = None
    overlapped: NDArray[np.bool_] | None = None
    wait_ns: I64 | None = None

    @property
    def peers(self) -> I64:
        """``peer`` per row, -1 where the rows carry none."""
        return self.peer if self.peer is not None else np.full(self.rank.size, -1, np.int64)

    @property
    def waits(self) -> I64:
        """``wait_ns`` per row (0 where the rows carry none)."""
        return self.wait_ns if self.wait_ns is not None else np.zeros(self.rank.size, np.int64)

    @property
    def overlaps(self) -> NDArray[np.bool_]:
        """``overlapped`` per row (False where the rows carry none)."""
        return self.overlapped if self.overlapped is not None else np.zeros(self.rank.size, bool)


@dataclass(frozen=True)
class HostSamples:
    """Host samples whose interval ended inside the window (rank >= 0 only).

    ``run_delay_ns``: run-queue delay in the interval, -1 where unknown; None when the rows
    carry none (a synthetic window).
    """

    rank: I64 = field(default_factory=_i64)
    time_ns: I64 = field(default_factory=_i64)
    interval_ns: I64 = field(default_factory=_i64)
    proc_cpu_ns: I64 = field(default_factory=_i64)
    gc_pause_ns: I64 = field(default_factory=_i64)
    gpu_sm_clock_mhz: I64 = field(default_factory=_i64)
    gpu_throttle_reasons: I64 = field(default_factory=_i64)
    run_delay_ns: I64 | None = None

    @property
    def run_delays(self) -> I64:
        """``run_delay_ns`` per row (-1, unknown, where the rows carry none)."""
        return self.run_delay_ns if self.run_delay_ns is not None else np.full(self.rank.size, -1, np.int64)


@dataclass(frozen=True)
class LinkSamples:
    """Node-level link samples whose interval ended inside the window, and the node of each rank.

    One sample row per (node, network interface, interval) (``host_samples`` rows with
    rank -1, :mod:`argus.agent.links`); ``host`` indexes ``host_names``, ``interface``
    indexes ``interface_names``. Byte and packet counts are over ``interval_ns``;
    capacities are bit/s (0 = unknown). ``rank``/``rank_host`` map every rank with a
    known host to its index in ``host_names`` (-1 when its node sent no link samples).
    """

    host: I64 = field(default_factory=_i64)
    interface: I64 = field(default_factory=_i64)
    time_ns: I64 = field(default_factory=_i64)
    interval_ns: I64 = field(default_factory=_i64)
    rx_bytes: I64 = field(default_factory=_i64)
    tx_bytes: I64 = field(default_factory=_i64)
    errors: I64 = field(default_factory=_i64)
    drops: I64 = field(default_factory=_i64)
    tx_capacity_bps: I64 = field(default_factory=_i64)
    rx_capacity_bps: I64 = field(default_factory=_i64)
    qdisc_backlog_bytes: I64 = field(default_factory=_i64)
    qdisc_overlimits: I64 = field(default_factory=_i64)
    qdisc_drops: I64 = field(default_factory=_i64)
    host_names: tuple[str, ...] = ()
    interface_names: tuple[str, ...] = ()
    rank: I64 = field(default_factory=_i64)
    rank_host: I64 = field(default_factory=_i64)


@dataclass(frozen=True)
class KernelClusters:
    """KDE clusters of kernel durations (``kernel_summaries``) of the window's kernel windows.

    One row per cluster; ``kernel`` indexes ``kernel_names``. Clusters of one
    (rank, kernel, stream) from several kernel windows together form that
    rank's mixture for the analysis window.
    """

    rank: I64 = field(default_factory=_i64)
    kernel: I64 = field(default_factory=_i64)
    stream: I64 = field(default_factory=_i64)
    collective: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    count: I64 = field(default_factory=_i64)
    p50_ns: F64 = field(default_factory=lambda: np.zeros(0))
    p99_ns: F64 = field(default_factory=lambda: np.zeros(0))
    log_lo: F64 = field(default_factory=lambda: np.zeros(0))
    log_hi: F64 = field(default_factory=lambda: np.zeros(0))
    sum_ns: F64 = field(default_factory=lambda: np.zeros(0))
    kernel_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankStatus:
    """Identity and liveness of every rank known to the job by the window's end.

    Attributes:
        rank: Global ranks, sorted, shape ``(n,)``.
        exited: True when the rank recorded an ``exit`` at or before the window's end.
        exit_code: Its exit status (0 = normal); 0 when not exited.
        last_seen_ns: Newest timestamp of any row of the rank (heartbeat, step,
            collective, phase) up to the window's end; -1 if none.
        last_progress_ns: Newest end of a step or phase or issue of a collective; -1 if none.
        position: How far the rank got, ``step * 8 + k`` with k = 1..4 for the end of the
            ``data``/``forward``/``backward``/``optimizer`` phase and 5 for the end of the
            step (:func:`progress_position`); -1 if none.
        waiting_since_ns: Issue time of the collective the rank's newest heartbeat shows it
            waiting in, ns; -1 when it waits in none (or sent no heartbeat).
        has_gpu: True when the rank's host samples report a GPU clock.
        host: The rank's host (node) as an index into ``hosts``, from its newest ``attach``
            row; -1 where none is known.
        hosts: Host names indexed by ``host``.
        groups: Process group name → its global ranks (from ``group`` rows; may be empty).
        seq_groups: Process group names indexed by ``seq_group``.
        seq_group, seq_rank, seq_max: One row per (process group, rank) that recorded
            collectives: the newest seq it recorded in that group.
    """

    rank: I64 = field(default_factory=_i64)
    exited: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    exit_code: I64 = field(default_factory=_i64)
    last_seen_ns: I64 = field(default_factory=_i64)
    last_progress_ns: I64 = field(default_factory=_i64)
    position: I64 = field(default_factory=_i64)
    waiting_since_ns: I64 = field(default_factory=_i64)
    has_gpu: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    host: I64 = field(default_factory=_i64)
    hosts: tuple[str, ...] = ()
    groups: dict[str, I64] = field(default_factory=dict)
    seq_groups: tuple[str, ...] = ()
    seq_group: I64 = field(default_factory=_i64)
    seq_rank: I64 = field(default_factory=_i64)
    seq_max: I64 = field(default_factory=_i64)


@dataclass(frozen=True)
class Window:
    """One job's data for the analysis window ``[start_ns, end_ns)``."""

    job_id: str
    start_ns: int
    end_ns: int
    steps: Steps = field(default_factory=Steps)
    phases: Phases = field(default_factory=Phases)
    collectives: Collectives = field(default_factory=Collectives)
    host: HostSamples = field(default_factory=HostSamples)
    kernels: KernelClusters = field(default_factory=KernelClusters)
    status: RankStatus = field(default_factory=RankStatus)
    links: LinkSamples = field(default_factory=LinkSamples)
    #: ``kernel_summaries`` rows starting in the window whose ``window_ns`` is not its length (summarised
    #: with another ``--window-s``): left out of ``kernels``, counted here to be reported.
    mismatched_kernel_rows: int = 0
    #: Rows read and skipped, by table: a value past :mod:`argus.limits` (an older store's).
    skipped_rows: dict[str, int] = field(default_factory=dict)


def progress_position(step: NDArray[np.int64], phase: NDArray[np.int64] | None = None) -> I64:
    """``step * 8 + k``: k = phase index + 1 for a phase end (phase indexes PHASES), 5 for a step end."""
    k = np.full(step.shape, 5, np.int64) if phase is None else phase.astype(np.int64) + 1
    return np.asarray(step, dtype=np.int64) * 8 + k
