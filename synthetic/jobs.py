"""Synthetic training jobs with labelled faults, as analysis windows (benchmarks and tests).

:func:`simulate` plays a synchronous data-parallel job step by step, for every
rank at once, with the probe's recording semantics (docs/design.md §2, the column docs
of :mod:`argus.schema`):

* a step runs ``data → forward → backward → optimizer → untracked host time``;
  ``backward`` issues ``buckets`` all-reduces on the world group ``"0"`` as it
  goes, and blocks at its end until the last one completes, which is when the
  last rank has issued it plus the transfer;
* with ``group_size``, each group of that many consecutive ranks (``"1"``,
  ``"2"``, ...) runs one overlapped all-reduce in forward (it never blocks the
  step, so a slow link there leaves step time flat);
* with ``sync_before_forward``, every step all ranks meet at a barrier on the
  world group between ``data`` and ``forward`` (a job that keeps its data
  order or seeds in lockstep): lateness before it is absorbed there, and the
  gradient all-reduces that follow see the ranks arrive together;
* rows are recorded when the thing they describe completes: a rank blocked in a
  collective forever records neither that collective nor its step;
* each node of 8 ranks has its own clock offset (a few ms) on every timestamp;
* host samples every second per rank carry process CPU time (waiting and
  sleeping burn none) and, on GPU jobs, the SM clock and throttle reasons;
* GPU jobs carry KDE clusters per (rank, kernel) per window for compute kernels
  and the NCCL all-reduce kernel, whose durations are the rank's real
  collective durations (wait + transfer).

Healthy jitter: log-normal noise on every phase, persistent per-rank speed
differences (``rank_spread``), isolated hiccups of single ranks at single steps
(``hiccup_prob``: extra work or a short sleep of up to ``hiccup`` of a step),
every ``spike_every`` steps all ranks run slower together, every
``checkpoint_every`` steps all ranks spend ``checkpoint_s`` writing a
checkpoint, slow warm-up steps, GC pauses, CPU-accounting noise, and (``drift``)
each rank's compute pace moving from window to window as a shared host's scheduler
moves it (a log-normal factor per rank and window). Faults
(:class:`Fault`) start at a given time on given ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from argus.analyzer.window import (
    Collectives,
    HostSamples,
    KernelClusters,
    Phases,
    RankStatus,
    Steps,
    Window,
    progress_position,
)
from argus.schema import PHASES, wire_schema, wire_table
from argus.window_grid import WindowGrid

__all__ = ["FAULT_CAUSE", "Fault", "JobSpec", "Simulation", "simulate"]

#: The diagnosis cause each fault kind must get.
FAULT_CAUSE: dict[str, str | None] = {
    "compute": "compute",
    "host_stall": "host_stall",
    "dataloader": "dataloader",
    "communication": "communication",
    "throttling": "throttling",
    "host_work": "host_stall",
    "hung": "unresponsive",
    "dead": "unresponsive",
    "exit": None,
}
NS = 1_000_000_000
_T0 = 1_700_000_000 * NS


@dataclass(frozen=True)
class Fault:
    """A fault injected from ``onset_s`` (seconds after the job's first window starts).

    ``magnitude`` means, per kind: ``compute``/``throttling`` — relative slowdown
    of forward and backward (0.1 = 10 % slower, 2.0 = 3×); ``host_stall`` — the
    average share of a step lost to a sleep taken every ``period`` steps;
    ``dataloader`` — share of a step added to the data phase; ``host_work`` — share of a
    step of CPU work on the host after ``data``, before the sync point of
    ``JobSpec.sync_before_forward`` (untracked time, as ``host_stall``, but busy); ``communication`` —
    transfer time multiplier of ``group``'s collectives; ``hung``/``dead``/``exit``
    (the rank leaves with exit code 0 and the others go on) — unused. A fault
    with ``end_s`` stops then.
    """

    kind: str
    ranks: tuple[int, ...]
    magnitude: float = 0.0
    onset_s: float = 0.0
    group: str | None = None
    period: int = 3
    end_s: float | None = None

    @property
    def cause(self) -> str | None:
        return FAULT_CAUSE[self.kind]


@dataclass(frozen=True)
class JobSpec:
    """Shape and healthy jitter of a synthetic job; times in seconds."""

    world: int = 8
    windows: int = 5
    window_s: float = 10.0
    step_s: float = 0.5
    gpu: bool = False
    group_size: int = 0
    buckets: int = 4
    kernels: int = 8
    noise: float = 0.04
    rank_spread: float = 0.01
    hiccup_prob: float = 0.01
    hiccup: float = 0.3
    spike_every: int = 7
    spike: float = 0.4
    checkpoint_every: int = 40
    checkpoint_s: float = 1.0
    clock_offset_ms: float = 3.0
    missing: float = 0.0
    start_offset_s: float = 3.7
    end_s: float | None = None
    seed: int = 0
    sync_before_forward: bool = False
    drift: float = 0.0
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @property
    def window_ns(self) -> int:
        return WindowGrid.from_seconds(self.window_s).length_ns


@dataclass
class Simulation:
    """A simulated job: its windows and the truth per window.

    Attributes:
        spec: The job.
        windows: One :class:`~argus.analyzer.window.Window` per analysis window.
        truth: Per window, faulty rank → expected cause, for faults active by the window's end.
        onset_window: Per fault, the index of the window it starts in.
    """

    spec: JobSpec
    windows: list[Window]
    truth: list[dict[int, str]]
    onset_window: list[int]
    build_tables: Callable[[], dict[str, pa.Table]] | None = None

    def tables(self) -> dict[str, pa.Table]:
        """The same job as rows of the store's tables (``job_id`` + wire columns), clock offsets applied."""
        return self.build_tables() if self.build_tables is not None else {}


def _ln(rng: np.random.Generator, shape: tuple[int, ...] | int, sigma: float) -> NDArray[np.float64]:
    return np.exp(rng.normal(-0.5 * sigma * sigma, sigma, shape))


def simulate(spec: JobSpec, job_id: str = "synthetic") -> Simulation:
    """Play ``spec`` and cut it into analysis windows.

    Returns:
        :class:`Simulation` with ``spec.windows`` windows.
    """
    return _Sim(spec, job_id).run()


class _Sim:
    def __init__(self, spec: JobSpec, job_id: str) -> None:
        self.spec = spec
        self.job_id = job_id
        self.rng = np.random.default_rng(spec.seed)
        n = spec.world
        self.n = n
        self.first_window = _T0 - _T0 % spec.window_ns
        self.t_start = self.first_window + int(spec.start_offset_s * NS)
        self.t_end_all = self.first_window + spec.windows * spec.window_ns
        nodes = (np.arange(n) // 8).astype(np.int64)
        node_off = self.rng.uniform(-1, 1, nodes.max() + 1) * spec.clock_offset_ms * 1e6
        self.offset = node_off[nodes].astype(np.int64)
        self.rank_speed = _ln(self.rng, n, spec.rank_spread)
        # Its own generator: a job without drift draws what it always drew.
        self.drift = _ln(np.random.default_rng(spec.seed + 7919), (n, spec.windows + 2), spec.drift)
        if spec.group_size:
            self.tp_group = np.arange(n) // spec.group_size
        else:
            self.tp_group = np.zeros(n, np.int64) - 1

    def _fault_active(self, f: Fault, t: NDArray[np.int64]) -> NDArray[np.bool_]:
        on = t >= self.first_window + int(f.onset_s * NS)
        if f.end_s is not None:
            on &= t < self.first_window + int(f.end_s * NS)
        return on

    def run(self) -> Simulation:
        s, rng, n = self.spec, self.rng, self.n
        step_ns = s.step_s * NS
        t = np.full(n, self.t_start, np.int64) + rng.integers(0, int(0.02 * step_ns), n)
        hang_step = np.full(n, np.iinfo(np.int64).max)  # first step a rank never finishes
        dead_at = np.full(n, np.iinfo(np.int64).max)
        hang_time = None
        rows: dict[str, list[NDArray[np.int64]]] = {k: [] for k in _ROW_KEYS}
        stop = s.end_s and self.first_window + int(s.end_s * NS)
        cpu_trace: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = []
        step = 0
        blocked_from: NDArray[np.int64] | None = None
        self.left = np.full(n, np.iinfo(np.int64).max)
        for f in s.faults:
            if f.kind == "exit":
                self.left[list(f.ranks)] = self.first_window + int(f.onset_s * NS)
        while True:
            live = (t < self.t_end_all) & (t < self.left)
            if stop:
                live &= t < stop
            if not np.any(live) or blocked_from is not None:
                break
            warm = 3.0 if step < 1 else (1.5 if step < 3 else 1.0)
            common = (1.0 + s.spike) if (s.spike_every and step % s.spike_every == s.spike_every - 1) else 1.0
            data = 0.05 * step_ns * _ln(rng, n, s.noise * 2) * warm
            fwd = 0.3 * step_ns * _ln(rng, n, s.noise) * warm * common
            bwd = 0.42 * step_ns * _ln(rng, n, s.noise) * warm * common
            opt = 0.05 * step_ns * _ln(rng, n, s.noise)
            untracked = 0.03 * step_ns * _ln(rng, n, s.noise * 2)
            fwd *= self.rank_speed
            bwd *= self.rank_speed
            if s.drift:
                k = np.clip((t - self.first_window) // s.window_ns, 0, self.drift.shape[1] - 1)
                fwd *= self.drift[np.arange(n), k]
                bwd *= self.drift[np.arange(n), k]
            if step == 0:
                fwd *= rng.uniform(0.7, 1.6, n)
            sleep = np.zeros(n)
            pre_sync = np.zeros(n)  # host work between data and the sync point
            # Isolated hiccups on single ranks: half extra work in forward, half a short sleep.
            hit = rng.random(n) < s.hiccup_prob
            if np.any(hit):
                extra = s.hiccup * step_ns * rng.uniform(0.3, 1.0, int(hit.sum()))
                as_sleep = rng.random(extra.size) < 0.5
                fwd[hit] += np.where(as_sleep, 0.0, extra)
                untracked[hit] += np.where(as_sleep, extra, 0.0)
                sleep[hit] += np.where(as_sleep, extra, 0.0)
            if s.checkpoint_every and step % s.checkpoint_every == s.checkpoint_every - 1:
                ck = s.checkpoint_s * NS * _ln(rng, n, 0.02)
                untracked = untracked + ck
            transfer_mult = {}
            for f in s.faults:
                on = self._fault_active(f, t)
                idx = np.array([r for r in f.ranks if on[r]], np.int64)
                if f.kind in ("compute", "throttling") and idx.size:
                    fwd[idx] *= 1 + f.magnitude
                    bwd[idx] *= 1 + f.magnitude
                elif f.kind == "dataloader" and idx.size:
                    data[idx] += f.magnitude * step_ns * _ln(rng, idx.size, 0.1)
                elif f.kind == "host_stall" and idx.size and step % f.period == 0:
                    stall = f.magnitude * f.period * step_ns * _ln(rng, idx.size, 0.1)
                    untracked[idx] += stall
                    sleep[idx] += stall
                elif f.kind == "host_work" and idx.size:
                    pre_sync[idx] += f.magnitude * step_ns * _ln(rng, idx.size, 0.1)
                elif f.kind == "communication" and np.any(on):
                    transfer_mult[f.group] = f.magnitude
                elif f.kind in ("hung", "dead") and idx.size:
                    hang_step[idx] = np.minimum(hang_step[idx], step)
                    if f.kind == "dead":
                        dead_at[idx] = np.minimum(dead_at[idx], t[idx] + data[idx].astype(np.int64))
            hung_now = hang_step == step
            start = t.copy()
            data_end = start + data.astype(np.int64)
            fwd_start = data_end + pre_sync.astype(np.int64)
            world_seq = step * (s.buckets + 1) if s.sync_before_forward else step * s.buckets
            if s.sync_before_forward and not np.any(hung_now):
                xfer = 0.005 * step_ns * _ln(rng, 1, 0.05)[0] * transfer_mult.get("0", 1.0)
                sync_end = np.full(n, int(fwd_start[live].max()) + int(xfer))
                zeros = np.zeros(n, np.int64)
                self._coll(rows, live, step, zeros, world_seq, "barrier", 0, fwd_start, sync_end)
                fwd_start = sync_end
                world_seq += 1
            fwd_end = fwd_start + fwd.astype(np.int64)
            # Overlapped group all-reduce in forward.
            if s.group_size:
                tp_issue = fwd_start + (fwd / 2).astype(np.int64)
                tp_last = np.full(self.tp_group.max() + 1, np.iinfo(np.int64).min)
                np.maximum.at(tp_last, self.tp_group, tp_issue)
                hung_groups = np.unique(self.tp_group[hung_now])
                tp_xfer = 0.03 * step_ns * _ln(rng, tp_last.size, 0.05)
                for g, m in transfer_mult.items():
                    if g is not None and g != "0":
                        tp_xfer[int(g) - 1] *= m
                tp_end = tp_last[self.tp_group] + tp_xfer[self.tp_group].astype(np.int64)
                ok = ~np.isin(self.tp_group, hung_groups) & live
                self._coll(
                    rows,
                    ok,
                    step,
                    self.tp_group + 1,
                    step,
                    "allreduce",
                    4 << 20,
                    tp_issue,
                    tp_end,
                    overlapped=True,
                )
            # Bucketed world all-reduces in backward; the rank blocks for the last one.
            issues = [fwd_end + (bwd * (b + 1) / s.buckets).astype(np.int64) for b in range(s.buckets)]
            if np.any(hung_now):
                # Peers finish forward and block in backward forever; the hung rank stops in forward.
                self._phase(rows, live & ~hung_now, step, 0, start, data_end)
                self._phase(rows, live & ~hung_now, step, 1, fwd_start, fwd_end)
                self._phase(rows, hung_now & live, step, 0, start, data_end)
                hang_time = data_end
                cpu_trace.append((start, fwd_end, (data * 0.5 + fwd) / np.maximum(fwd_end - start, 1)))
                blocked_from = np.where(hung_now, data_end, fwd_end)
                break
            ends = []
            prev_end = np.iinfo(np.int64).min
            for b in range(s.buckets):
                xfer = 0.02 * step_ns * _ln(rng, 1, 0.05)[0] * transfer_mult.get("0", 1.0)
                end_b = max(int(issues[b][live].max()) + int(xfer), prev_end + int(0.2 * xfer))
                prev_end = end_b
                ends.append(end_b)
                self._coll(
                    rows,
                    live,
                    step,
                    np.zeros(n, np.int64),
                    world_seq + b,
                    "allreduce",
                    25 << 20,
                    issues[b],
                    np.full(n, end_b),
                    overlapped=True,
                )
            bwd_end = np.maximum(fwd_end + bwd.astype(np.int64), ends[-1] + int(0.001 * step_ns))
            opt_end = bwd_end + opt.astype(np.int64)
            step_end = opt_end + untracked.astype(np.int64)
            for p, (a, b) in enumerate(
                ((start, data_end), (fwd_start, fwd_end), (fwd_end, bwd_end), (bwd_end, opt_end))
            ):
                self._phase(rows, live, step, p, a, b)
            rows["s_rank"].append(np.flatnonzero(live))
            rows["s_step"].append(np.full(int(live.sum()), step))
            rows["s_start"].append(start[live])
            rows["s_dur"].append((step_end - start)[live])
            busy = data * 0.5 + pre_sync + fwd + bwd + opt + (untracked - sleep)
            cpu_trace.append((start, step_end, busy / np.maximum(step_end - start, 1)))
            t = np.where(live, step_end, t)
            step += 1
        return self._windows(rows, cpu_trace, hang_step, dead_at, blocked_from, hang_time)

    def _coll(
        self,
        rows: dict[str, list[NDArray[np.int64]]],
        mask: NDArray[np.bool_],
        step: int,
        group: NDArray[np.int64],
        seq: int,
        op: str,
        nbytes: int,
        issue: NDArray[np.int64],
        end: NDArray[np.int64],
        overlapped: bool = False,
    ) -> None:
        idx = np.flatnonzero(mask)
        rows["c_overlapped"].append(np.full(idx.size, int(overlapped)))
        rows["c_op"].append(np.full(idx.size, _OPS.index(op)))
        rows["c_rank"].append(idx)
        rows["c_step"].append(np.full(idx.size, step))
        rows["c_group"].append(np.asarray(group)[idx])
        rows["c_seq"].append(np.full(idx.size, seq))
        rows["c_bytes"].append(np.full(idx.size, nbytes))
        rows["c_issue"].append(issue[idx])
        rows["c_dur"].append(np.maximum(end[idx] - issue[idx], 0))

    def _phase(
        self,
        rows: dict[str, list[NDArray[np.int64]]],
        mask: NDArray[np.bool_],
        step: int,
        phase: int,
        a: NDArray[np.int64],
        b: NDArray[np.int64],
    ) -> None:
        idx = np.flatnonzero(mask)
        rows["p_rank"].append(idx)
        rows["p_step"].append(np.full(idx.size, step))
        rows["p_phase"].append(np.full(idx.size, phase))
        rows["p_start"].append(a[idx])
        rows["p_dur"].append(b[idx] - a[idx])

    # ----------------------------------------------------------------- windows

    def _windows(
        self,
        rows: dict[str, list[NDArray[np.int64]]],
        cpu_trace: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]],
        hang_step: NDArray[np.int64],
        dead_at: NDArray[np.int64],
        blocked_from: NDArray[np.int64] | None,
        hang_time: NDArray[np.int64] | None,
    ) -> Simulation:
        s, n = self.spec, self.n
        cat = {
            k: (np.concatenate(v) if v else np.zeros(0, np.int64)).astype(np.int64) for k, v in rows.items()
        }
        stop = self.first_window + int(s.end_s * NS) if s.end_s else None
        exit_at = np.full(n, np.iinfo(np.int64).max)
        if stop is not None and cat["s_rank"].size:
            last_end = np.zeros(n, np.int64)
            np.maximum.at(last_end, cat["s_rank"], cat["s_start"] + cat["s_dur"])
            exit_at = last_end + int(0.5 * NS)
        exit_at = np.minimum(exit_at, self.left)
        # Host samples: every second per rank, CPU from the step trace.
        phase0 = self.rng.integers(0, NS, n)
        times = np.arange(self.t_start, self.t_end_all + NS, NS)
        sample_t = times[None, :] + phase0[:, None]
        end_of_life = np.minimum(dead_at, exit_at)
        valid = (sample_t <= end_of_life[:, None]) & (sample_t < self.t_end_all) & (sample_t > self.t_start)
        a = np.stack([a for a, _, _ in cpu_trace]).T  # (n, steps)
        b = np.stack([b for _, b, _ in cpu_trace]).T
        f = np.stack([f for _, _, f in cpu_trace]).T
        if s.gpu:
            cpu = np.full(sample_t.shape, 0.9 * NS)
        else:
            # Cumulative CPU time at step ends, interpolated at every sample time of every rank in
            # one call: offsetting rank r's times by r * span keeps the flattened knots increasing.
            knots = np.concatenate([a[:, :1], b], axis=1) - self.t_start
            cum = np.concatenate([np.zeros((n, 1)), np.cumsum((b - a) * f, axis=1)], axis=1)
            span = float(self.t_end_all - self.t_start + 4 * NS)
            shift = np.arange(n)[:, None] * span
            xp = (knots + shift).ravel().astype(np.float64)
            fp = (cum + shift).ravel()  # also offset, so values stay monotone across ranks
            rel = (sample_t - self.t_start).astype(np.float64) + shift
            c_now = np.interp(rel.ravel(), xp, fp).reshape(sample_t.shape) - shift
            c_prev = np.interp((rel - NS).ravel(), xp, fp).reshape(sample_t.shape) - shift
            # Before a rank's first step the interpolation clamps to its neighbour's values: none then.
            c_now = np.clip(c_now, 0.0, None)
            c_prev = np.clip(c_prev, 0.0, None)
            cpu = np.maximum(c_now - c_prev, 0.0) + 0.02 * NS
            cpu = cpu * _ln(self.rng, cpu.shape, s.noise)
        clock = np.full(sample_t.shape, 1410 if s.gpu else 0, np.int64)
        reason = np.zeros(sample_t.shape, np.int64)
        for flt in s.faults:
            if flt.kind == "throttling":
                on = np.zeros(sample_t.shape, bool)
                on[list(flt.ranks)] = self._fault_active(flt, sample_t[list(flt.ranks)])
                clock = np.where(on, int(1410 / (1 + flt.magnitude)), clock)
                reason = np.where(on, 0x20 | 0x40, reason)
        host = {
            "rank": np.broadcast_to(np.arange(n)[:, None], sample_t.shape)[valid],
            "time": sample_t[valid],
            "cpu": cpu[valid].astype(np.int64),
            "gc": (self.rng.exponential(0.002, sample_t.shape) * NS).astype(np.int64)[valid],
            "clock": clock[valid],
            "reason": reason[valid],
        }
        if s.missing > 0:
            cat, host = self._drop(cat, host)
        onset_window = [int(f.onset_s * NS // s.window_ns) for f in s.faults]
        windows, truth = [], []
        for k in range(s.windows):
            w0 = self.first_window + k * s.window_ns
            w1 = w0 + s.window_ns
            windows.append(self._window(cat, host, w0, w1, exit_at, dead_at, blocked_from))
            tr: dict[int, str] = {}
            for fault in s.faults:
                ended = fault.end_s is not None and self.first_window + int(fault.end_s * NS) <= w0
                if self.first_window + int(fault.onset_s * NS) < w1 and not ended and fault.cause:
                    members = fault.ranks
                    if fault.kind == "communication" and fault.group is not None:
                        g = int(fault.group)
                        members = (
                            tuple(int(r) for r in np.flatnonzero(self.tp_group == g - 1))
                            if g
                            else tuple(range(n))
                        )
                    for r in members:
                        tr[int(r)] = str(fault.cause)
            truth.append(tr)
        return Simulation(
            s, windows, truth, onset_window, lambda: self._tables(cat, host, windows, exit_at, dead_at)
        )

    def _tables(
        self,
        cat: dict[str, NDArray[np.int64]],
        host: dict[str, NDArray[np.int64]],
        windows: list[Window],
        exit_at: NDArray[np.int64],
        dead_at: NDArray[np.int64],
    ) -> dict[str, pa.Table]:
        """Every row as the probe and node agent would store it (clock offsets applied)."""
        s, n, off = self.spec, self.n, self.offset
        job = self.job_id

        def table(name: str, cols: Mapping[str, Any]) -> pa.Table:
            return wire_table(name, cols, job)

        sr, pr, cr = cat["s_rank"], cat["p_rank"], cat["c_rank"]
        phase_names = np.array(PHASES, dtype=object)
        out = {
            "steps": table(
                "steps",
                {
                    "rank": sr,
                    "step": cat["s_step"],
                    "start_ns": cat["s_start"] + off[sr],
                    "dur_ns": cat["s_dur"],
                },
            ),
            "phases": table(
                "phases",
                {
                    "rank": pr,
                    "step": cat["p_step"],
                    "phase": phase_names[cat["p_phase"]].tolist(),
                    "start_ns": cat["p_start"] + off[pr],
                    "dur_ns": cat["p_dur"],
                },
            ),
            "collectives": table(
                "collectives",
                {
                    "rank": cr,
                    "step": cat["c_step"],
                    "process_group": [str(g) for g in cat["c_group"].tolist()],
                    "seq": cat["c_seq"],
                    "op": np.array(_OPS, dtype=object)[cat["c_op"]].tolist(),
                    "bytes": cat["c_bytes"],
                    "issue_ns": cat["c_issue"] + off[cr],
                    "start_ns": cat["c_issue"] + off[cr],
                    "dur_ns": cat["c_dur"],
                    "overlapped": cat["c_overlapped"],
                },
            ),
        }
        hr = host["rank"]
        zeros = np.zeros(hr.size)
        out["host_samples"] = table(
            "host_samples",
            {
                "rank": hr,
                "host": [f"node{r // 8}" for r in hr.tolist()],
                "time_ns": host["time"] + off[hr],
                "interval_ns": np.full(hr.size, NS),
                "proc_cpu_ns": host["cpu"],
                "host_cpu_pct": zeros + 50.0,
                "gc_pause_ns": host["gc"],
                "gc_count": np.ones(hr.size, np.int64),
                "rss_bytes": np.full(hr.size, 1 << 30),
                "dropped_events": np.zeros(hr.size, np.int64),
                "gpu_sm_clock_mhz": host["clock"],
                "gpu_temp_c": zeros + (60.0 if s.gpu else 0.0),
                "gpu_power_w": zeros + (300.0 if s.gpu else 0.0),
                "gpu_util_pct": zeros + (90.0 if s.gpu else 0.0),
                "gpu_throttle_reasons": host["reason"],
                "pending_group": [""] * hr.size,
                "pending_seq": np.full(hr.size, -1),
                "pending_op": [""] * hr.size,
                "pending_issue_ns": np.zeros(hr.size, np.int64),
            },
        )
        ev: dict[str, list[object]] = {c: [] for c in wire_schema("ranks").names}

        def rank_row(r: int, event: str, t: int, group: str = "", members: list[int] | None = None) -> None:
            values = {
                "rank": r,
                "event": event,
                "time_ns": t + int(off[r]),
                "local_rank": r % 8,
                "world_size": n,
                "host": f"node{r // 8}",
                "pid": 1000 + r,
                "agent_id": f"agent-node{r // 8}",
                "device": f"cuda:{r % 8}" if s.gpu else "cpu",
                "clock_offset_ns": 0,
                "exit_code": 0,
                "group_name": group,
                "group_ranks": members or [],
                "group_backend": ("nccl" if s.gpu else "gloo") if group else "",
            }
            for c, v in values.items():
                ev[c].append(v)

        for r in range(n):
            rank_row(r, "attach", self.t_start - NS // 2)
            rank_row(r, "group", self.t_start - NS // 4, "0", list(range(n)))
            if s.group_size:
                g = int(self.tp_group[r])
                rank_row(
                    r,
                    "group",
                    self.t_start - NS // 4,
                    str(g + 1),
                    np.flatnonzero(self.tp_group == g).tolist(),
                )
            if exit_at[r] < self.t_end_all:
                rank_row(r, "exit", int(exit_at[r]))
        out["ranks"] = table("ranks", ev)
        ks: dict[str, list[NDArray[np.generic]]] = {c: [] for c in wire_schema("kernel_summaries").names}
        for w in windows:
            k = w.kernels
            if k.rank.size == 0:
                continue
            m = k.rank.size
            for c, v in (
                ("rank", k.rank),
                ("window_start_ns", np.full(m, w.start_ns)),
                ("window_ns", np.full(m, w.end_ns - w.start_ns)),
                ("kind", np.full(m, "kernel", dtype=object)),
                ("kernel", np.array(k.kernel_names, dtype=object)[k.kernel]),
                ("stream", k.stream),
                ("collective", k.collective.astype(np.int64)),
                ("cluster", np.zeros(m, np.int64)),
                ("count", k.count),
                ("p50_ns", k.p50_ns),
                ("p99_ns", k.p99_ns),
                ("log_lo", k.log_lo),
                ("log_hi", k.log_hi),
                ("sum_ns", k.sum_ns),
                ("resolution_ns", np.ones(m, np.int64)),
                ("covered_ns", np.full(m, w.end_ns - w.start_ns)),
                ("graph_id", np.zeros(m, np.int64)),
                ("graph_node_id", np.zeros(m, np.int64)),
            ):
                ks[c].append(v)
        if ks["rank"]:
            out["kernel_summaries"] = table(
                "kernel_summaries", {c: np.concatenate(v).tolist() for c, v in ks.items()}
            )
        return out

    def _drop(
        self, cat: dict[str, NDArray[np.int64]], host: dict[str, NDArray[np.int64]]
    ) -> tuple[dict[str, NDArray[np.int64]], dict[str, NDArray[np.int64]]]:
        """Lose whole 1-second batches of a rank, as a node agent that drops a batch would."""

        def keep(rank: NDArray[np.int64], t: NDArray[np.int64]) -> NDArray[np.bool_]:
            h = (rank * 1_000_003 + (t // NS) * 7919 + self.spec.seed) % 10_000
            return h >= self.spec.missing * 10_000

        out = dict(cat)
        for prefix, tcol in (("s", "s_start"), ("p", "p_start"), ("c", "c_issue")):
            k = keep(cat[f"{prefix}_rank"], cat[tcol])
            for key in cat:
                if key.startswith(prefix + "_"):
                    out[key] = cat[key][k]
        k = keep(host["rank"], host["time"])
        return out, {key: v[k] for key, v in host.items()}

    def _window(
        self,
        cat: dict[str, NDArray[np.int64]],
        host: dict[str, NDArray[np.int64]],
        w0: int,
        w1: int,
        exit_at: NDArray[np.int64],
        dead_at: NDArray[np.int64],
        blocked_from: NDArray[np.int64] | None,
    ) -> Window:
        s, off = self.spec, self.offset
        s_end = cat["s_start"] + cat["s_dur"]
        sel = (s_end >= w0) & (s_end < w1)
        steps = Steps(
            rank=cat["s_rank"][sel],
            step=cat["s_step"][sel],
            start_ns=cat["s_start"][sel] + off[cat["s_rank"][sel]],
            dur_ns=cat["s_dur"][sel],
        )
        key = cat["s_rank"][sel] * 1_000_000 + cat["s_step"][sel]
        pkey = cat["p_rank"] * 1_000_000 + cat["p_step"]
        psel = np.isin(pkey, key)
        phases = Phases(
            rank=cat["p_rank"][psel],
            step=cat["p_step"][psel],
            phase=cat["p_phase"][psel],
            start_ns=cat["p_start"][psel] + off[cat["p_rank"][psel]],
            dur_ns=cat["p_dur"][psel],
        )
        ckey = cat["c_rank"] * 1_000_000 + cat["c_step"]
        in_win = np.isin(ckey, key)
        inst = cat["c_group"] * (1 << 40) + cat["c_seq"]
        csel = np.isin(inst, np.unique(inst[in_win]))
        n_groups = int(self.tp_group.max()) + 2 if s.group_size else 1
        coll = Collectives(
            rank=cat["c_rank"][csel],
            step=cat["c_step"][csel],
            group=cat["c_group"][csel],
            seq=cat["c_seq"][csel],
            op=cat["c_op"][csel],
            bytes=cat["c_bytes"][csel],
            issue_ns=cat["c_issue"][csel] + off[cat["c_rank"][csel]],
            start_ns=cat["c_issue"][csel] + off[cat["c_rank"][csel]],
            dur_ns=cat["c_dur"][csel],
            in_window=in_win[csel],
            group_names=tuple(str(g) for g in range(n_groups)),
            op_names=_OPS,
            overlapped=cat["c_overlapped"][csel].astype(bool),
        )
        hsel = (host["time"] >= w0) & (host["time"] < w1)
        hr = host["rank"][hsel]
        hs = HostSamples(
            rank=hr,
            time_ns=host["time"][hsel] + off[hr],
            interval_ns=np.full(hr.size, NS),
            proc_cpu_ns=host["cpu"][hsel],
            gc_pause_ns=host["gc"][hsel],
            gpu_sm_clock_mhz=host["clock"][hsel],
            gpu_throttle_reasons=host["reason"][hsel],
        )
        kernels = self._kernels(cat, sel, coll, w0) if s.gpu else KernelClusters()
        return Window(
            self.job_id, w0, w1, steps, phases, coll, hs, kernels, self._status(cat, host, w1, exit_at)
        )

    def _status(
        self,
        cat: dict[str, NDArray[np.int64]],
        host: dict[str, NDArray[np.int64]],
        w1: int,
        exit_at: NDArray[np.int64],
    ) -> RankStatus:
        n = self.n
        seen = np.full(n, -1, np.int64)
        prog = np.full(n, -1, np.int64)
        s_end = cat["s_start"] + cat["s_dur"]
        p_end = cat["p_start"] + cat["p_dur"]
        c_end = cat["c_issue"] + cat["c_dur"]
        for r_col, t_col, visible in (
            (cat["s_rank"], s_end, s_end),
            (cat["p_rank"], p_end, p_end),
            (cat["c_rank"], cat["c_issue"], c_end),
        ):
            v = visible < w1
            np.maximum.at(prog, r_col[v], t_col[v])
        pos = np.full(n, -1, np.int64)
        v = s_end < w1
        np.maximum.at(pos, cat["s_rank"][v], progress_position(cat["s_step"][v]))
        v = p_end < w1
        np.maximum.at(pos, cat["p_rank"][v], progress_position(cat["p_step"][v], cat["p_phase"][v]))
        np.maximum.at(seen, np.arange(n), prog)
        hv = host["time"] < w1
        np.maximum.at(seen, host["rank"][hv], host["time"][hv])
        seen = np.where(seen >= 0, seen + self.offset, seen)
        prog = np.where(prog >= 0, prog + self.offset, prog)
        groups = {"0": np.arange(n, dtype=np.int64)}
        if self.spec.group_size:
            order = np.argsort(self.tp_group, kind="stable")
            bounds = np.flatnonzero(np.diff(self.tp_group[order])) + 1
            for g, members in enumerate(np.split(order, bounds)):
                groups[str(g + 1)] = members.astype(np.int64)
        v = c_end < w1
        pair = cat["c_group"][v] * np.int64(n) + cat["c_rank"][v]
        uniq, inv = np.unique(pair, return_inverse=True)
        top = np.full(uniq.size, -1, np.int64)
        np.maximum.at(top, inv, cat["c_seq"][v])
        n_groups = int(self.tp_group.max()) + 2 if self.spec.group_size else 1
        exited = exit_at < w1
        return RankStatus(
            rank=np.arange(n, dtype=np.int64),
            exited=exited,
            exit_code=np.zeros(n, np.int64),
            last_seen_ns=seen,
            last_progress_ns=prog,
            position=pos,
            has_gpu=np.full(n, self.spec.gpu),
            groups=groups,
            seq_groups=tuple(str(g) for g in range(n_groups)),
            seq_group=(uniq // n).astype(np.int64),
            seq_rank=(uniq % n).astype(np.int64),
            seq_max=top,
        )

    def _kernels(
        self, cat: dict[str, NDArray[np.int64]], sel: NDArray[np.bool_], coll: Collectives, w0: int
    ) -> KernelClusters:
        """Clusters of compute kernels (log-normal, scaled by the rank's slowdown) and NCCL kernels."""
        s, n = self.spec, self.n
        rng = np.random.default_rng(s.seed * 7919 + w0 // s.window_ns % 1_000_000)
        steps_per_rank = np.bincount(cat["s_rank"][sel], minlength=n)
        slow = np.ones(n)
        for f in s.faults:
            if (
                f.kind in ("compute", "throttling")
                and self._fault_active(f, np.array([w0 + s.window_ns // 2]))[0]
            ):
                slow[list(f.ranks)] *= 1 + f.magnitude
        k_base = np.geomspace(20e3, 3e6, s.kernels)
        k_sigma = rng.uniform(0.03, 0.12, s.kernels)
        calls = np.maximum(steps_per_rank, 1)[None, :] * rng.integers(2, 40, s.kernels)[:, None]
        ranks = np.broadcast_to(np.arange(n), (s.kernels, n))
        mu = np.log(k_base)[:, None] + np.log(slow)[None, :] + rng.normal(0, 0.005, (s.kernels, n))
        mu = mu + rng.normal(0, 1, (s.kernels, n)) * k_sigma[:, None] / np.sqrt(calls)
        sig = k_sigma[:, None] * np.ones((1, n))
        p50 = np.exp(mu)
        p99 = np.exp(mu + 2.326 * sig)
        lo = mu - 3.2 * sig
        hi = mu + 3.4 * sig
        total = calls * np.exp(mu + 0.5 * sig**2)
        ran = np.broadcast_to(steps_per_rank > 0, (s.kernels, n)).ravel()  # no steps, no kernels
        cols = {
            "rank": ranks.ravel(),
            "kernel": np.repeat(np.arange(s.kernels), n),
            "coll": np.zeros(s.kernels * n, bool),
            "count": calls.ravel(),
            "p50": p50.ravel(),
            "p99": p99.ravel(),
            "lo": lo.ravel(),
            "hi": hi.ravel(),
            "sum": total.ravel(),
        }
        cols = {k: v[ran] for k, v in cols.items()}
        # NCCL kernels: the rank's own collective durations in the window, one exact cluster per rank.
        world = coll.in_window & (coll.group == 0)
        parts = [cols]
        for kid, mask in ((s.kernels, world), (s.kernels + 1, coll.in_window & (coll.group > 0))):
            if not np.any(mask):
                continue
            r, d = coll.rank[mask], np.maximum(coll.dur_ns[mask], 1).astype(np.float64)
            order = np.lexsort((d, r))
            r, d = r[order], d[order]
            ur, start, cnt = np.unique(r, return_index=True, return_counts=True)
            p50 = d[start + (cnt - 1) // 2]
            p99 = d[start + np.minimum(cnt - 1, np.ceil(0.99 * cnt).astype(np.int64) - 1)]
            parts.append(
                {
                    "rank": ur,
                    "kernel": np.full(ur.size, kid),
                    "coll": np.ones(ur.size, bool),
                    "count": cnt,
                    "p50": p50,
                    "p99": p99,
                    "lo": np.log(d[start]),
                    "hi": np.log(d[start + cnt - 1]),
                    "sum": np.add.reduceat(d, start),
                }
            )
        merged = {k: np.concatenate([p[k] for p in parts]) for k in cols}
        names = (
            *(f"void gemm_kernel_{i}<float>(...)" for i in range(s.kernels)),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        )
        return KernelClusters(
            rank=merged["rank"].astype(np.int64),
            kernel=merged["kernel"].astype(np.int64),
            stream=np.where(merged["coll"], 13, 7).astype(np.int64),
            collective=merged["coll"],
            count=merged["count"].astype(np.int64),
            p50_ns=merged["p50"].astype(np.float64),
            p99_ns=np.maximum(merged["p99"], merged["p50"]).astype(np.float64),
            log_lo=merged["lo"].astype(np.float64),
            log_hi=merged["hi"].astype(np.float64),
            sum_ns=merged["sum"].astype(np.float64),
            kernel_names=names,
        )


#: Collective ops the synthetic job issues, in code order.
_OPS = ("allreduce", "barrier")
_ROW_KEYS = (
    "s_rank",
    "s_step",
    "s_start",
    "s_dur",
    "p_rank",
    "p_step",
    "p_phase",
    "p_start",
    "p_dur",
    "c_op",
    "c_rank",
    "c_step",
    "c_group",
    "c_seq",
    "c_bytes",
    "c_issue",
    "c_dur",
    "c_overlapped",
)
