"""L2: per-phase comparison of ranks — who is slow, and in which phase (DESIGN §5).

Every rank of a synchronous job ends each step at about the same time, so the
step time itself cannot tell the straggler apart: its peers spend the time it
loses waiting for it inside their collectives.

**Who.** Per (rank, step), how late the rank issued the step's last collective
of its widest process group (the last gradient bucket's all-reduce, say),
against the healthy ranks' arrival at that same collective instance
(clock offsets removed, :mod:`argus.analyzer.collectives`). By then a rank has
been delayed by everything it did slower since the previous synchronisation —
a slow forward or backward, a slow batch, a host stall — and its peers waited
exactly that long. Only the positive part counts: a rank that is early at one
step gives nothing back at another, because every step waits for its slowest
rank. Jobs without collective records fall back to **self time**: the step's
time minus the time the rank was blocked in collectives.

**Which phase.** Per (rank, step) the step splits into

* the four phases ``data``, ``forward``, ``backward``, ``optimizer``, each minus
  the blocked wait of the collectives issued inside it, and
* *untracked* host time (the step not covered by phases), minus the blocked
  wait of collectives issued outside any phase.

A phase's blocked wait is the largest wait of the collectives issued in it:
data-parallel all-reduces are issued asynchronously bucket by bucket and the
rank blocks once, at the end of backward, for the last of them, whose wait is
about the whole delay. Each component is compared with the healthy ranks' at
the same step; the components whose excess carries the rank's lateness name
the phase (and feed the cause, :mod:`argus.analyzer.causes`).

Comparison: per step, the reference is the median over the healthy ranks at
*that step*, so anything that hits every rank at once (a slow batch everywhere,
a checkpoint, a GC storm) cancels. A rank's score is its mean positive excess
over the window's steps after dropping its few worst steps (one per ten, at
most :data:`MAX_TRIM`): isolated hiccups are not a fail-slow fault, while a
stall every few steps survives the trim. It is scored with the one-sided rule
of :mod:`argus.analyzer.robust` against a floor of :data:`REL_FLOOR` of the
reference step time, and shrunk toward 0 when the rank has fewer than
:data:`CONFIDENT_STEPS` steps left (a job's first, partial window). The healthy
set is first estimated from per-rank medians, so the per-step references stay
correct with up to half the ranks slow. Ranks are compared with every other
rank of the job: data- and tensor-parallel peers do the same work in each step.

Change against its own past: ranks differ a little for good (one GPU or host
is 1-2 % faster than another), and with few ranks that spread dominates the
robust scale. So each rank's trimmed excess is also compared with its own
level in recent healthy windows (``baseline``, kept by the caller); a rank
whose excess *grew* past the threshold is flagged with only half the evidence
against its peers (a cross-rank score of 0.5). Fail-slow is a change.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.collectives import Decomposition
from argus.analyzer.robust import MAD_TO_SIGMA, grouped_median, one_sided_scores
from argus.analyzer.window import Window
from argus.schema import PHASES

__all__ = ["COMPONENTS", "REL_FLOOR", "WARMUP_STEPS", "PhaseResult", "Slowdown", "compare_phases"]

#: Components of a step's self time: the phases, then untracked host time.
COMPONENTS = (*PHASES, "untracked")
_UNTRACKED = len(PHASES)
#: Steps numbered below this are warm-up (allocation, compilation, first batches) and not compared.
WARMUP_STEPS = 5
#: Smallest excess per step worth a diagnosis, as a fraction of the reference step time.
REL_FLOOR = 0.04
#: Fewest compared steps a rank needs in a window.
MIN_STEPS = 2
#: Below this many kept steps a rank's score is scaled by ``kept / CONFIDENT_STEPS``.
CONFIDENT_STEPS = 8
#: The worst ``min(max(1, ceil(steps / TRIM_DIVISOR)), MAX_TRIM)`` steps of a rank are left out
#: of its score: a few isolated hiccups are dropped, a stall every few steps is not.
TRIM_DIVISOR = 10
MAX_TRIM = 3


@dataclass(frozen=True)
class PhaseResult:
    """L2 outcome for one window; per-rank arrays align with ``rank``.

    Attributes:
        rank: Global ranks compared, sorted, shape ``(n,)``.
        steps: Steps compared per rank.
        score: One-sided robust score of the trimmed mean positive excess; >= 1 = straggler.
        excess_ns: Mean excess per step over the healthy reference, ns: lateness at the step's
            last collective, or self time when the job records no collectives.
        component_excess_ns: Mean excess per step of each of :data:`COMPONENTS`, shape ``(n, 5)``.
        wait_ns: Mean blocked wait per step.
        self_ns: Mean self time per step.
        step_ns: Mean step time per step.
        ref_step_ns: Mean over steps of the healthy reference step time.
        ref_wait_ns: Mean over steps of the healthy reference blocked wait.
        healthy: Ranks in the healthy reference set.
        lost_ns: Per rank, summed positive excess over its steps (the time peers waited for it).
        job_time_ns: Wall time from the end of the window's first compared step to the end of its
            last (each step ends when its slowest rank ends it), ns: ``job_steps`` steps' time.
        excess_matrix: Excess per (rank, step column), NaN where missing; shape ``(n, s)``.
        has_collectives: True when blocked waits were known for most steps.
        trimmed_frac: The trimmed mean excess per step as a fraction of the reference step time
            (what :func:`compare_phases` compares with ``baseline`` next time).
        change_score: One-sided score of ``trimmed_frac`` against the rank's ``baseline``; NaN without one.
    """

    rank: NDArray[np.int64]
    steps: NDArray[np.int64]
    score: NDArray[np.float64]
    excess_ns: NDArray[np.float64]
    component_excess_ns: NDArray[np.float64]
    wait_ns: NDArray[np.float64]
    self_ns: NDArray[np.float64]
    step_ns: NDArray[np.float64]
    ref_step_ns: float
    ref_wait_ns: float
    healthy: NDArray[np.bool_]
    lost_ns: NDArray[np.float64]
    job_time_ns: float
    excess_matrix: NDArray[np.float64]
    has_collectives: bool
    trimmed_frac: NDArray[np.float64]
    change_score: NDArray[np.float64]

    #: Steps ``job_time_ns`` covers (last compared step number − first).
    job_steps: int = 0

    def slowdown(self, ranks: NDArray[np.bool_]) -> Slowdown:
        """The job's estimated loss of throughput caused by the ranks selected by mask ``ranks``.

        Per step the job waits for the slowest of them, ``max_r excess⁺(r, s)``; its mean over
        the compared steps after the first is set against the job's wall time per step
        (``job_time_ns / job_steps``). See :class:`Slowdown`.
        """
        job_step = self.job_time_ns / self.job_steps if self.job_steps > 0 else 0.0
        if not np.any(ranks) or job_step <= 0 or self.excess_matrix.shape[1] < 2:
            return Slowdown(0.0, 0.0, job_step, self.job_steps)
        lost = np.nanmax(np.maximum(self.excess_matrix[ranks], 0.0), axis=0, initial=0.0)[1:]
        waited = min(float(np.nanmean(lost)), job_step)
        return Slowdown(100.0 * waited / job_step, waited, job_step, self.job_steps)

    def slowdown_pct(self, ranks: NDArray[np.bool_]) -> float:
        """``self.slowdown(ranks).pct``."""
        return self.slowdown(ranks).pct


@dataclass(frozen=True)
class Slowdown:
    """A fault's cost to the job over one window's steps: ``pct = 100 · waited_ns / job_step_ns``.

    ``slowdown_pct`` of a diagnosis (DESIGN §5: the job's estimated loss of
    throughput, percent). Every rank of a synchronous job ends each step together,
    so the time the job spends per step waiting for the straggler is lost to all of
    it: without the fault a step would take ``job_step_ns - waited_ns``, and the
    job's throughput (steps per second) would be ``job_step_ns / (job_step_ns -
    waited_ns)`` times what it is. A 2× slower rank that doubles the step time
    costs 50 %. ``job_step_ns`` is wall time between step ends (steps per second
    of the whole job), not the slowest rank's step duration: a rank that pauses
    between steps makes its own step long and its peers' next step long, yet the
    job lost the pause once.

    Attributes:
        pct: Loss of throughput, percent, in [0, 100].
        waited_ns: Mean time per step the job waited for the fault's ranks, ns.
        job_step_ns: Mean job step time (slowest rank) over the same steps, ns.
        steps: Steps it is computed over.
    """

    pct: float
    waited_ns: float
    job_step_ns: float
    steps: int

    @property
    def sums_ns(self) -> tuple[float, float, int]:
        """``(waited ns, job wall time ns, steps)`` summed over the steps (what windows add up)."""
        return self.waited_ns * self.steps, self.job_step_ns * self.steps, self.steps


def _empty() -> PhaseResult:
    z = np.zeros(0)
    return PhaseResult(
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        z,
        z,
        np.zeros((0, len(COMPONENTS))),
        z,
        z,
        z,
        np.nan,
        np.nan,
        np.zeros(0, bool),
        z,
        0.0,
        np.zeros((0, 0)),
        False,
        z,
        z,
    )


def _cells(
    ranks: NDArray[np.int64], step_cols: NDArray[np.int64], rank: NDArray[np.int64], step: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
    """(rank index, step column, found) of rows in the (rank, step) matrices."""
    ri = np.minimum(np.searchsorted(ranks, rank), max(ranks.size - 1, 0))
    si = np.minimum(np.searchsorted(step_cols, step), max(step_cols.size - 1, 0))
    ok = (ranks.size > 0) & (step_cols.size > 0)
    found = ok & (ranks[ri] == rank) & (step_cols[si] == step) if ok else np.zeros(rank.size, bool)
    return ri, si, found


def _blocked(
    w: Window,
    d: Decomposition | None,
    ranks: NDArray[np.int64],
    step_cols: NDArray[np.int64],
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Blocked wait per (component, rank, step) and where any collective was seen; see module doc."""
    n_r, n_s = ranks.size, step_cols.size
    blocked = np.zeros((len(COMPONENTS), n_r, n_s))
    seen = np.zeros((n_r, n_s), bool)
    c = w.collectives
    if d is None or c.rank.size == 0:
        return blocked, seen
    rows = np.flatnonzero(c.in_window)
    cri, csi, found = _cells(ranks, step_cols, c.rank[rows], c.step[rows])
    rows, cri, csi = rows[found], cri[found], csi[found]
    # The phase that contains the issue time; phases and issue times share the rank's clock.
    issue = c.issue_ns[rows]
    comp = np.full(rows.size, _UNTRACKED, np.int64)
    p = w.phases
    if p.rank.size:
        pri, psi, pok = _cells(ranks, step_cols, p.rank, p.step)
        start = np.full((len(PHASES), n_r, n_s), np.iinfo(np.int64).max)
        end = np.full((len(PHASES), n_r, n_s), np.iinfo(np.int64).min)
        start[p.phase[pok], pri[pok], psi[pok]] = p.start_ns[pok]
        end[p.phase[pok], pri[pok], psi[pok]] = p.start_ns[pok] + p.dur_ns[pok]
        for ph in range(len(PHASES)):
            inside = (issue >= start[ph, cri, csi]) & (issue < end[ph, cri, csi])
            comp = np.where(inside & (comp == _UNTRACKED), ph, comp)
    np.maximum.at(blocked, (comp, cri, csi), d.wait_ns[rows])
    seen[cri, csi] = True
    return blocked, seen


def _lateness(
    w: Window, d: Decomposition, ranks: NDArray[np.int64], step_cols: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Per (rank, step): how late the rank issued the step's last collective, ns, vs healthy peers.

    The collective of a (rank, step) is the one of its widest process group that it
    issued last in the step (the data-parallel all-reduce of the last gradient
    bucket, say): by then the rank has been delayed by everything it did slower
    since the previous synchronisation. The reference arrival of an instance is
    the median corrected issue time of the healthy ranks; healthy is decided
    from a first pass against the instance's 25th-percentile arrival, which at
    most half of the ranks being late cannot move.
    """
    n_r, n_s = ranks.size, step_cols.size
    out = np.full((n_r, n_s), np.nan)
    c = w.collectives
    rows = np.flatnonzero(c.in_window)
    cri, csi, found = _cells(ranks, step_cols, c.rank[rows], c.step[rows])
    rows, cri, csi = rows[found], cri[found], csi[found]
    if rows.size == 0:
        return out
    cell = cri * n_s + csi
    width = d.inst_ranks[d.instance[rows]]
    order = np.lexsort((d.issue_ns[rows], width, cell))
    last = order[np.r_[np.flatnonzero(np.diff(cell[order])), order.size - 1]]
    chosen, c_ri, c_si = rows[last], cri[last], csi[last]
    inst = d.instance[chosen]

    # First pass: lateness against each instance's 25th-percentile arrival.
    all_inst, all_issue = d.instance, d.issue_ns
    srt = np.lexsort((all_issue, all_inst))
    counts = np.bincount(all_inst, minlength=d.n_instances)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    q25 = np.full(d.n_instances, np.nan)
    has = counts > 0
    q25[has] = all_issue[srt][starts[has] + (counts[has] - 1) // 4]
    first = d.issue_ns[chosen] - q25[inst]
    per_rank = grouped_median(c_ri, first, n_r)
    healthy_rank = one_sided_scores(per_rank, floor=REL_FLOOR * _typical_step(w)).healthy
    # Second pass: the healthy ranks' median arrival per instance.
    rank_idx = np.searchsorted(ranks, c.rank)
    in_range = rank_idx < n_r
    ok = np.zeros(c.rank.size, bool)
    ok[in_range] = (ranks[rank_idx[in_range]] == c.rank[in_range]) & healthy_rank[rank_idx[in_range]]
    ref = grouped_median(all_inst[ok], all_issue[ok], d.n_instances)
    ref = np.where(np.isnan(ref), q25, ref)
    out[c_ri, c_si] = d.issue_ns[chosen] - ref[inst]
    return out


def _typical_step(w: Window) -> float:
    d = w.steps.dur_ns[w.steps.step >= WARMUP_STEPS]
    return float(np.median(d)) if d.size else 0.0


def _step_columns(w: Window) -> NDArray[np.int64]:
    s = w.steps.step
    return np.unique(s[s >= WARMUP_STEPS])


def compare_phases(
    w: Window, d: Decomposition | None, baseline: Mapping[int, float] | None = None
) -> PhaseResult:
    """Compare every rank's self time, per step and component, with the healthy ranks'.

    Args:
        w: The window (its steps, phases and collectives are used).
        d: Decomposition of ``w.collectives`` (None when the job records no collectives).
        baseline: Per rank, its ``trimmed_frac`` in recent healthy windows (the analyzer keeps it).

    Returns:
        :class:`PhaseResult`; empty when no rank has :data:`MIN_STEPS` steps past warm-up.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: ranks or steps without data
        return _compare_phases(w, d, baseline)


def _compare_phases(  # noqa: PLR0915  (one pass of array steps over the window; split, they share 30 arrays)
    w: Window, d: Decomposition | None, baseline: Mapping[int, float] | None
) -> PhaseResult:
    st = w.steps
    keep = st.step >= WARMUP_STEPS
    if not np.any(keep):
        return _empty()
    ranks = np.unique(st.rank)
    step_cols = _step_columns(w)
    n_r, n_s = ranks.size, step_cols.size
    ri = np.searchsorted(ranks, st.rank[keep])
    si = np.searchsorted(step_cols, st.step[keep])
    step_dur = np.full((n_r, n_s), np.nan)
    step_dur[ri, si] = st.dur_ns[keep]

    phase_dur = np.full((len(PHASES), n_r, n_s), np.nan)
    p = w.phases
    if p.rank.size:
        pri, psi, pok = _cells(ranks, step_cols, p.rank, p.step)
        phase_dur[p.phase[pok], pri[pok], psi[pok]] = p.dur_ns[pok]
    blocked, seen = _blocked(w, d, ranks, step_cols)
    has_phase = ~np.all(np.isnan(phase_dur), axis=0)
    comps = np.full((len(COMPONENTS), n_r, n_s), np.nan)
    comps[: len(PHASES)] = np.where(has_phase, np.nan_to_num(phase_dur, nan=0.0), np.nan)
    comps[_UNTRACKED] = step_dur - np.where(has_phase, np.nansum(phase_dur, axis=0), 0.0)
    comps = np.maximum(comps - blocked, 0.0)
    self_t = step_dur - blocked.sum(axis=0)
    wait = blocked.sum(axis=0)

    valid = ~np.isnan(step_dur)
    late = _lateness(w, d, ranks, step_cols) if d is not None else None
    use_late = late is not None and np.isfinite(late[valid]).mean() >= 0.5
    if late is not None and use_late:
        valid &= np.isfinite(late)
    n_steps = valid.sum(axis=1)
    enough = n_steps >= MIN_STEPS
    basis = late if late is not None and use_late else self_t
    per_rank = np.where(enough, np.nanmedian(np.where(valid, basis, np.nan), axis=1), np.nan)
    ref_step = float(np.nanmedian(step_dur))
    provisional = one_sided_scores(per_rank, floor=REL_FLOOR * ref_step)
    healthy = provisional.healthy
    if not np.any(healthy):
        return _empty()
    ref_comp = np.nanmedian(comps[:, healthy], axis=1)
    comp_excess = comps - ref_comp[:, None, :]
    if late is not None and use_late:
        excess = late  # already relative to the healthy ranks' arrival
    else:
        excess = self_t - np.nanmedian(self_t[healthy], axis=0)[None, :]

    # Mean excess without each rank's few worst steps (see MAX_TRIM).
    ex0 = np.where(valid, excess, np.nan)
    ex0 = np.where(valid & np.isnan(ex0), 0.0, ex0)  # a step no healthy rank reported: no evidence
    total = np.nansum(ex0, axis=1)
    drop = np.minimum(np.maximum(1, np.ceil(n_steps / TRIM_DIVISOR)), MAX_TRIM).astype(np.int64)
    kept = np.maximum(n_steps - drop, 1)
    # Only the time a rank made the others wait counts: being early at one step gives nothing
    # back at another (each step waits for its slowest rank).
    ascending = np.cumsum(np.sort(np.where(valid, np.maximum(ex0, 0.0), np.inf), axis=1), axis=1)
    ascending = np.where(np.isfinite(ascending), ascending, 0.0)
    kept_sum = ascending[np.arange(n_r), np.minimum(kept, max(n_s, 1)) - 1] if n_s else np.zeros(n_r)
    trimmed = np.where(enough, kept_sum / kept, np.nan)
    mean_excess = np.where(n_steps > 0, total / np.maximum(n_steps, 1), np.nan)
    # Per-step noise of healthy ranks bounds the scale of a per-rank mean from below.
    resid = excess[healthy][valid[healthy]]
    sigma_step = MAD_TO_SIGMA * float(np.median(np.abs(resid - np.median(resid)))) if resid.size else 0.0
    ref_step_time = float(np.nanmean(np.nanmedian(step_dur[healthy], axis=0)))
    scores = one_sided_scores(
        trimmed, floor=REL_FLOOR * ref_step_time, min_scale=sigma_step / np.sqrt(np.maximum(n_steps - 1, 1))
    )
    cross = scores.score
    trimmed_frac = trimmed / ref_step_time if ref_step_time > 0 else np.full(n_r, np.nan)
    change = np.full(n_r, np.nan)
    if baseline:
        base = np.array([baseline.get(int(r), np.nan) for r in ranks])
        delta = trimmed_frac - base
        if np.sum(~np.isnan(delta)) >= 2:
            change = one_sided_scores(
                delta, floor=REL_FLOOR, min_scale=sigma_step / ref_step_time / np.sqrt(np.maximum(kept, 1))
            ).score
    # A rank whose excess over its own past is past the threshold needs only half the evidence
    # against its peers: persistent speed differences between ranks cancel in the change.
    confirmed = np.nan_to_num(change) >= 1.0
    score = np.where(confirmed & (np.nan_to_num(cross) >= 0.5), np.fmax(cross, change), cross)
    # Few steps are thin evidence: shrink the score toward 0 below CONFIDENT_STEPS kept steps.
    shrink = np.minimum(1.0, kept / CONFIDENT_STEPS)
    score = np.where(enough, score * shrink, np.nan)
    with np.errstate(all="ignore"):
        comp_mean = np.nanmean(comp_excess, axis=2).T
        wait_mean = np.nanmean(np.where(valid, wait, np.nan), axis=1)
        self_mean = np.nanmean(np.where(valid, self_t, np.nan), axis=1)
        step_mean = np.nanmean(step_dur, axis=1)
        step_end = np.full((n_r, n_s), np.nan)
        step_end[ri, si] = (st.start_ns[keep] + st.dur_ns[keep]).astype(np.float64)
        job_end = np.nanmax(step_end, axis=0)  # a step ends for the job when its slowest rank ends it
        job_time = float(job_end[-1] - job_end[0]) if n_s >= 2 else 0.0
    lost = np.nansum(np.maximum(ex0, 0.0), axis=1)
    return PhaseResult(
        rank=ranks.astype(np.int64),
        steps=n_steps.astype(np.int64),
        score=score,
        excess_ns=mean_excess,
        component_excess_ns=np.nan_to_num(comp_mean, nan=0.0),
        wait_ns=wait_mean,
        self_ns=self_mean,
        step_ns=step_mean,
        ref_step_ns=ref_step_time,
        ref_wait_ns=float(np.nanmean(np.nanmedian(np.where(valid, wait, np.nan)[healthy], axis=0))),
        healthy=scores.healthy & enough,
        trimmed_frac=trimmed_frac,
        change_score=change,
        lost_ns=lost,
        job_time_ns=job_time,
        excess_matrix=ex0,
        has_collectives=bool(seen[valid].mean() >= 0.5) if np.any(valid) else False,
        job_steps=int(step_cols[-1] - step_cols[0]) if n_s >= 2 else 0,
    )
