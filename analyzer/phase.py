"""L2: per-phase comparison of ranks — who is slow, and in which phase (docs/design.md §6.6).

Every rank of a synchronous job ends each step at about the same time, so the
step time itself cannot tell the straggler apart: its peers spend the time it
loses waiting for it. L2 therefore compares **self time** — each step minus the
time the rank was blocked at any synchronisation point (collectives, barriers,
broadcasts, point-to-point transfers; :mod:`argus.analyzer.waits`) — split into
the four phases and untracked host time. A rank that waited for another keeps
its self time, however late that wait made it; the rank that made everyone wait
has the excess.

Two references, each per (rank, step):

* **Peers** — the median self time, at the same step, of the healthy ranks of
  the rank's role (:mod:`argus.analyzer.roles`: ranks of different pipeline
  stages are never compared). Anything that hits every rank at once (a slow
  batch everywhere, a checkpoint, a GC storm) cancels. The healthy set comes
  from the one-sided rule of :mod:`argus.analyzer.robust` over per-rank
  medians, so it stays right with up to half of a role slow. Used when the role
  has at least :data:`MIN_PEERS` ranks; its threshold includes, once known, how far the
  rank's mean moved about the others' between healthy windows (``drift_ns``: a busy host's
  scheduler holds one rank back for seconds at a time). In a role of two (a pipeline stage's
  two data-parallel replicas, a tensor position's) each rank is the other's
  reference, step by step: the pair's difference is what one waited for the
  other at the synchronisation points they share, so the later rank is the one
  behind; its noise is the difference's own spread from step to step and, once
  known, how far it moved between healthy windows (``role_drift_ns``).
* **Own past** — the rank's median self time in recent healthy windows
  (``baseline``, kept by the caller), less the change common to the job (the
  level of the ranks that did not change: a slower data epoch for everyone is
  the job's, not a rank's). It finds the ranks behind when more than half of a
  role slowed (three of four ranks, a whole pipeline stage) and ranks of roles
  too small for peers, and it cancels persistent speed differences between ranks.

A rank's statistic is its mean excess per step; the time the job waited for it
is the positive part of each step's excess (being early at one step gives
nothing back at another: every step waits for its slowest rank). One isolated
hiccup — a single step far above the rest, with no other such step on that
rank in this window or the recent ones (``recent_spikes``) — is left out; a
repeating pattern never is: rare large stalls cost the job throughput.
Scores use the one-sided rule against a floor of :data:`REL_FLOOR` of the
reference step time and the per-step noise; they shrink toward 0 below
:data:`CONFIDENT_STEPS` steps (a job's first, partial window).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

from argus.analyzer import dense
from argus.analyzer.collectives import Decomposition
from argus.analyzer.host import HostResult, delay_per_step, host_signals, starved_wait
from argus.analyzer.robust import K_SIGMA, MAD_TO_SIGMA, one_sided_scores, row_nanmedian
from argus.analyzer.roles import Roles, one_role
from argus.analyzer.waits import COMPONENTS, StepTimes, step_times
from argus.analyzer.window import Window

__all__ = [
    "COMPONENTS",
    "MIN_PEERS",
    "PAIR",
    "REL_FLOOR",
    "WARMUP_STEPS",
    "PhaseResult",
    "RankBaseline",
    "Slowdown",
    "compare_phases",
]

F64 = NDArray[np.float64]

#: Steps numbered below this are warm-up (allocation, compilation, first batches) and not compared.
WARMUP_STEPS = 5
#: Smallest excess per step worth a diagnosis, as a fraction of the reference step time.
REL_FLOOR = 0.04
#: Fewest compared steps a rank needs in a window.
MIN_STEPS = 2
#: Below this many steps a rank's score is scaled by ``steps / CONFIDENT_STEPS``.
CONFIDENT_STEPS = 8
#: Healthy windows of a rank before it is scored against its own past: one window's mean says
#: nothing of how far a rank's mean moves between windows with nothing wrong (a shared host's
#: scheduler moves it by several percent), and a score without that drift names noise.
PAST_WINDOWS = 2
#: Fewest ranks in a role for a comparison with its healthy peers' median (with two, the median
#: is the pair's middle: see :data:`PAIR`).
MIN_PEERS = 3
#: A role of this many ranks compares each with the other, step by step (module doc).
PAIR = 2
#: A step whose excess is this many robust sigmas (and :data:`SPIKE_REL` of a step) above the
#: rank's usual level is a spike; one spike alone, not repeated, is a hiccup and left out.
SPIKE_K = 5.0
SPIKE_REL = 0.25


@dataclass(frozen=True)
class RankBaseline:
    """A rank's self time in recent healthy windows (the own-past reference).

    A window's mean is compared with the mean of these windows' means (a median here against a
    mean there would turn every host's right-skewed scheduling stalls into a change).

    Attributes:
        self_ns: Mean self time per step, ns.
        sigma_ns: Robust per-step standard deviation of its self time, ns.
        comp_ns: Mean self time per step of each of :data:`COMPONENTS`, ns, shape ``(5,)``.
        step_ns: Median step time, ns.
        drift_ns: Standard deviation, between those windows, of the rank's mean self time about
            the other ranks' of its role, ns: how much a window's mean moves on this host with
            nothing wrong (0 while unknown).
        comp_drift_ns: The same per component, ns, shape ``(5,)``.
        windows: How many healthy windows these are. A rank is scored against its own past from
            :data:`PAST_WINDOWS` of them; one is enough to say which ranks moved (``behind_ns``).
        role_drift_ns: Standard deviation, between those windows, of the rank's own mean self
            time about its role's median (its own, not pooled; 0 before two windows), ns. In a
            role of two, half of how far the pair's difference moves between windows.
    """

    self_ns: float
    sigma_ns: float
    comp_ns: NDArray[np.float64]
    step_ns: float
    drift_ns: float = 0.0
    comp_drift_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(len(COMPONENTS)))
    windows: int = PAST_WINDOWS
    role_drift_ns: float = 0.0


@dataclass(frozen=True)
class PhaseResult:
    """L2 outcome for one window; per-rank arrays align with ``rank``.

    Attributes:
        rank: Global ranks compared, sorted, shape ``(n,)``.
        steps: Steps compared per rank.
        score: ``fmax(peer_score, past_score)``; >= 1 = straggler, NaN = not compared.
        peer_score: Score against the healthy ranks of its role (NaN: role too small).
        past_score: Score of its change against its own past beyond the job's common change
            (NaN: no history).
        excess_ns: Mean excess self time per step over the reference of its score (ns).
        component_excess_ns: Mean excess per step of each of :data:`COMPONENTS`, shape ``(n, 5)``.
        wait_ns: Mean blocked time per step.
        self_ns: Mean self time per step.
        step_ns: Mean step time per step.
        ref_step_ns, ref_wait_ns, ref_self_ns: The same means of its reference (peers or past).
        healthy: Ranks in their role's healthy reference set.
        lost_ns: Per rank, summed positive excess over its steps.
        excess_matrix: Positive excess per (rank, step column) on the rank's basis, NaN where
            missing; shape ``(n, s)`` — what the job waited for the rank at each step.
        step_cols: Step numbers of the columns.
        has_collectives: True when most rank-steps recorded a synchronisation.
        basis: ``"peers"``, ``"best ranks"`` (its role's best ranks: more than half of the role
            is behind them) or ``"own past"`` per rank (which reference ``excess_ns`` is against).
        roles: The roles compared within.
        spikes: Per rank, steps of this window that are spikes (see :data:`SPIKE_K`).
        times: The window's self/blocked times (for the baselines and the job's accounting).
        behind_ns: Per rank, the mean change of self time per step against its own past beyond
            the job's common change, ns (NaN without history): how far it fell behind the others.
        behind_comp_ns: The same per component of :data:`COMPONENTS`, shape ``(n, 5)``: where
            it fell behind (what grew in it and not in the unchanged ranks).
        job_end_ns: Per step column, when the job ended the step (its slowest rank), ns.
        past_step_ns: Per rank, the median step time of its own past, ns (NaN without history):
            the step :func:`fell_behind` takes its floor from.
        change_sum_ns: Per rank, its self time's change against its own past summed over this
            window's steps, ns (NaN without history), with ``steps``: what a later window of the
            same fault adds to its own (``carried`` of :func:`compare_phases`).
        behind_noise_ns: Per rank, what ``behind_ns`` reaches by chance: :data:`K_SIGMA`
            standard errors of a window's mean change (its per-step noise and its drift between
            windows), ns (NaN without history).
        best_sums: Per rank, ``(sum over its steps of its self time less its scheduling delay
            beyond its role's, ns; steps; sum over its steps of its self time, ns)``, shape
            ``(n, 3)`` (0 in roles of fewer than :data:`MIN_PEERS`): the best-ranks test's
            evidence of this window, which a later window of the same fault pools with its own
            (``best_carried`` of :func:`compare_phases`).
        pair_sums: Per rank of a role of two, ``(its mean excess over its partner per step times
            its steps, ns; steps)``, shape ``(n, 2)`` (0 elsewhere): the pair test's evidence of
            this window, which a later window of the same fault pools with its own
            (``pair_carried`` of :func:`compare_phases`).
        role_behind: Per rank, whether its whole role fell behind the job's common change
            (:func:`_common_change`: the role's mean change, pooled over its ranks' steps, past
            its threshold; the other roles waited for it), shape ``(n,)``: the window holds a
            fault of that role, whichever of its ranks scores (it is no reference of theirs).
    """

    rank: NDArray[np.int64]
    steps: NDArray[np.int64]
    score: NDArray[np.float64]
    peer_score: NDArray[np.float64]
    past_score: NDArray[np.float64]
    excess_ns: NDArray[np.float64]
    component_excess_ns: NDArray[np.float64]
    wait_ns: NDArray[np.float64]
    self_ns: NDArray[np.float64]
    step_ns: NDArray[np.float64]
    ref_step_ns: NDArray[np.float64]
    ref_wait_ns: NDArray[np.float64]
    ref_self_ns: NDArray[np.float64]
    healthy: NDArray[np.bool_]
    lost_ns: NDArray[np.float64]
    excess_matrix: NDArray[np.float64]
    step_cols: NDArray[np.int64]
    has_collectives: bool
    basis: tuple[str, ...]
    roles: Roles
    spikes: NDArray[np.int64]
    times: StepTimes | None = None
    behind_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    behind_comp_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, len(COMPONENTS))))
    job_end_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    past_step_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    change_sum_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    behind_noise_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    best_sums: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 3)))
    pair_sums: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 2)))
    role_behind: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))

    def waited(self, ranks: NDArray[np.bool_]) -> NDArray[np.float64]:
        """Per step column, how much sooner the job would have ended the step without the ranks of mask, ns.

        The job waits each step for its slowest rank: the ranks of ``ranks`` cost it their
        largest excess beyond the largest excess of all the others (had they been on time, the
        step would have waited for the next slowest instead). In a large job whose noise already
        makes some rank late every step, a small straggler costs little.
        """
        if not np.any(ranks) or self.excess_matrix.shape[1] == 0:
            return np.zeros(self.excess_matrix.shape[1])
        x, top, second, top_rank = self._top2
        selected = np.flatnonzero(ranks)
        if selected.size == 1:  # one rank: the rest's largest is the top, or the second when it is the top
            i = int(selected[0])
            rest = np.where(top_rank == i, second, top)
            return np.asarray(np.maximum(x[i] - rest, 0.0))
        mine = np.max(x[ranks], axis=0, initial=0.0)
        rest = np.max(x[~ranks], axis=0, initial=0.0)
        return np.asarray(np.maximum(mine - rest, 0.0))

    @property
    def attributable_ns(self) -> float:
        """Time the job waited over the window for single ranks, ns: per step, the largest excess
        beyond the second largest (what one rank alone held the step up by), summed."""
        _, top, second, _ = self._top2
        return float(np.sum(np.maximum(top - second, 0.0)))

    @cached_property
    def excess_filled(self) -> F64:
        """:attr:`excess_matrix` with NaN (a step a rank did not report) as 0 ns, shape ``(n_ranks,
        n_steps)``: what the job waited for each rank at each step."""
        return np.nan_to_num(self.excess_matrix, nan=0.0)

    @cached_property
    def _top2(self) -> tuple[F64, F64, F64, NDArray[np.int64]]:
        """:attr:`excess_filled`, and per step column the largest, the second largest, and whose."""
        x = self.excess_filled
        if x.shape[0] == 0:
            z = np.zeros(x.shape[1])
            return x, z, z, np.zeros(x.shape[1], np.int64)
        top_rank = np.argmax(x, axis=0)
        cols = np.arange(x.shape[1])
        top = x[top_rank, cols]
        if x.shape[0] == 1:
            return x, top, np.zeros(x.shape[1]), top_rank
        masked = x.copy()
        masked[top_rank, cols] = -np.inf
        return x, top, np.max(masked, axis=0), top_rank

    def slowdown(self, ranks: NDArray[np.bool_]) -> Slowdown:
        """The job's loss of throughput caused by the ranks selected by mask ``ranks`` (:class:`Slowdown`)."""
        ends = self.job_end_ns
        steps = int(self.step_cols[-1] - self.step_cols[0]) if self.step_cols.size >= 2 else 0
        job_step = float(ends[-1] - ends[0]) / steps if steps > 0 else 0.0
        if steps == 0 or job_step <= 0:
            return Slowdown(0.0, 0.0, job_step, steps)
        waited = min(float(np.mean(self.waited(ranks)[1:])), job_step)
        return Slowdown(100.0 * waited / job_step, waited, job_step, steps)

    def slowdown_pct(self, ranks: NDArray[np.bool_]) -> float:
        """``self.slowdown(ranks).pct``."""
        return self.slowdown(ranks).pct


@dataclass(frozen=True)
class Slowdown:
    """A fault's cost to the job over one window's steps: ``pct = 100 · waited_ns / job_step_ns``.

    Every rank of a synchronous job ends each step together, so the time the job
    spends per step waiting for the straggler is lost to all of it. ``job_step_ns``
    is wall time between step ends (steps per second of the whole job), not the
    slowest rank's step duration.

    Attributes:
        pct: Loss of throughput, percent, in [0, 100].
        waited_ns: Mean time per step the job waited for the fault's ranks, ns.
        job_step_ns: Mean job step time over the same steps, ns.
        steps: Steps it is computed over.
    """

    pct: float
    waited_ns: float
    job_step_ns: float
    steps: int


def _empty(roles: Roles) -> PhaseResult:
    z = np.zeros(0)
    zi = np.zeros(0, np.int64)
    return PhaseResult(
        zi, zi, z, z, z, z, np.zeros((0, len(COMPONENTS))), z, z, z, z, z, z,
        np.zeros(0, bool), z, np.zeros((0, 0)), zi, False, (), roles, zi,
    )  # fmt: skip


def _step_columns(w: Window) -> NDArray[np.int64]:
    s = w.steps.step
    return dense.unique(s[s >= WARMUP_STEPS])


def compare_phases(
    w: Window,
    d: Decomposition | None = None,
    roles: Roles | None = None,
    baseline: Mapping[int, RankBaseline] | None = None,
    recent_spikes: Mapping[int, int] | None = None,
    carried: Mapping[int, tuple[float, int]] | None = None,
    best_carried: Mapping[int, tuple[float, int, float]] | None = None,
    host: HostResult | None = None,
    pair_carried: Mapping[int, tuple[float, int]] | None = None,
    levels: Mapping[int, RankBaseline] | None = None,
) -> PhaseResult:
    """Compare every rank's self time, per step and component, with its references (module doc).

    Args:
        w: The window (its steps, phases and collectives are used).
        d: The decomposition of ``w.collectives`` (which instances blocked; see
            :func:`argus.analyzer.waits.blocking_rows`); None without collectives.
        roles: Roles of the ranks (default: one role).
        baseline: Per rank, its self time in recent healthy windows (the analyzer keeps it).
        recent_spikes: Per rank, spikes seen in the recent windows (a second spike is a pattern).
        carried: Per rank, ``(change_sum_ns, steps)`` of the windows just before this one that
            did not become references (the analyzer keeps them): which ranks are behind is
            judged on their change over those windows and this one together, whose mean is less
            noisy than one window's.
        best_carried: Per rank, the ``best_sums`` of those windows, summed: the best-ranks test
            (:func:`_best_ranks`) judges the ranks' mean over those windows and this one, as a
            sequential test would: a fault from the first step that one window's few steps
            leave below the bar is named when the next windows add theirs.
        pair_carried: Per rank, the ``pair_sums`` of those windows, summed: in a role of two the
            difference is judged over those windows and this one (a sequential test, as the
            best ranks' is): a rank behind its partner from the first step by less than one
            window's noise is named when the next windows add their steps.
        host: The window's host signals (:func:`~argus.analyzer.host.host_signals` of ``w.host``,
            which the caller has for the causes already); computed here when None and needed.
        levels: Per rank without a ``baseline``, its means over the same healthy windows (kept
            out of its own past: it was flagged in them, or its partner was): not a reference of
            its own, but its vote on the job's common change (a rank that did not change since
            says the job did not), so a whole role that slowed together is not taken for the job.

    Returns:
        :class:`PhaseResult`; empty when no rank has :data:`MIN_STEPS` steps past warm-up.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: ranks or steps without data
        return _compare(
            w,
            roles,
            baseline or {},
            recent_spikes or {},
            d,
            carried or {},
            best_carried or {},
            host,
            pair_carried or {},
            levels or {},
        )


def _compare(  # noqa: PLR0915  (one pass of array steps over the window; split, they share 30 arrays)
    w: Window,
    roles: Roles | None,
    baseline: Mapping[int, RankBaseline],
    recent_spikes: Mapping[int, int],
    d: Decomposition | None,
    carried: Mapping[int, tuple[float, int]],
    best_carried: Mapping[int, tuple[float, int, float]],
    signals: HostResult | None,
    pair_carried: Mapping[int, tuple[float, int]],
    levels: Mapping[int, RankBaseline] | None = None,
) -> PhaseResult:
    step_cols = _step_columns(w)
    if step_cols.size == 0:
        return _empty(roles or one_role(np.unique(w.steps.rank)))
    t = step_times(w, step_cols, d.instance if d is not None else None)
    ranks = t.rank
    roles = roles if roles is not None and np.all(roles.of(ranks) >= 0) else one_role(ranks)
    role = roles.of(ranks)
    n_r, n_s = ranks.size, step_cols.size
    valid = ~np.isnan(t.step_ns)
    n_steps = valid.sum(axis=1)
    enough = n_steps >= MIN_STEPS
    if not np.any(enough):
        return _empty(roles)
    self_t = np.where(valid, t.self_ns, np.nan)
    comps = np.where(valid[None], t.comp_self_ns, np.nan)
    med_self = np.where(enough, row_nanmedian(self_t), np.nan)
    ref_step = float(np.nanmedian(t.step_ns))

    # --- peers: per role, per step, the healthy ranks' median ---
    healthy = np.zeros(n_r, bool)
    has_peers = np.zeros(n_r, bool)
    peer_ref = np.full((n_r, n_s), np.nan)
    peer_comp = np.full((len(COMPONENTS), n_r, n_s), np.nan)
    peer_step = np.full(n_r, np.nan)
    peer_wait = np.full(n_r, np.nan)
    paired = np.zeros(n_r, bool)
    # Ranks judged against their role's best ranks (more than half of the role behind them), and
    # the uncertainty of that best level (ns per step).
    to_best = np.zeros(n_r, bool)
    shift = np.zeros(n_r)  # added to a best-ranks reference: the minimum's bias, scheduling delay
    host: dict[str, tuple[F64, F64]] = {}
    best_sums = np.zeros((n_r, 3))
    best_prior = np.array([best_carried.get(r, (0.0, 0, 0.0)) for r in ranks.tolist()], np.float64).reshape(
        n_r, 3
    )
    best_score = np.full(n_r, np.nan)  # against the best ranks: the pooled test's own statistic
    pair_sums = np.zeros((n_r, 2))
    pair_prior = np.array([pair_carried.get(r, (0.0, 0)) for r in ranks.tolist()], np.float64).reshape(n_r, 2)
    for g in np.unique(role):
        members = role == g
        scores = one_sided_scores(np.where(members, med_self, np.nan), floor=REL_FLOOR * ref_step)
        ok = scores.healthy & members & enough
        best = _best_ranks(
            w, signals, t, self_t, valid, members & enough, REL_FLOOR * ref_step, host, best_prior, best_sums
        )
        if best is not None:
            ok, shift[members], best_score[members] = best.ok, best.add_ns[members], best.score[members]
            to_best[members & enough] = True
        healthy |= ok
        pair = np.flatnonzero(members & enough)
        if pair.size == PAIR:
            # Each rank of a pair is the other's reference, step by step: the later one is the
            # one its partner waited for at the synchronisation points they share.
            other = pair[::-1]
            paired[pair] = has_peers[pair] = True
            peer_ref[pair] = self_t[other]
            peer_comp[:, pair] = comps[:, other]
            peer_step[pair] = np.nanmean(t.step_ns[other], axis=1)
            peer_wait[pair] = np.nanmean(np.where(valid, t.blocked_ns, np.nan)[other], axis=1)
            continue
        if pair.size < MIN_PEERS or not np.any(ok):
            continue
        has_peers |= members
        peer_ref[members] = np.nanmedian(self_t[ok], axis=0)
        peer_comp[:, members] = np.nanmedian(comps[:, ok], axis=1)[:, None, :]
        peer_step[members] = np.nanmean(np.nanmedian(t.step_ns[ok], axis=0))
        peer_wait[members] = np.nanmean(np.nanmedian(np.where(valid, t.blocked_ns, np.nan)[ok], axis=0))
    peer_ref += shift[:, None]
    x_peer = self_t - peer_ref
    direct = paired | to_best

    # --- own past, less the job's common change ---
    base_self = np.array([baseline[r].self_ns if r in baseline else np.nan for r in ranks.tolist()])
    base_comp = np.array(
        [baseline[r].comp_ns if r in baseline else np.full(len(COMPONENTS), np.nan) for r in ranks.tolist()]
    ).reshape(n_r, len(COMPONENTS))
    base_step = np.array([baseline[r].step_ns if r in baseline else np.nan for r in ranks.tolist()])
    scored_past = np.array([r in baseline and baseline[r].windows >= PAST_WINDOWS for r in ranks.tolist()])
    pair_drift = np.array([2.0 * baseline[r].role_drift_ns if r in baseline else 0.0 for r in ranks.tolist()])
    drift = np.array(
        [
            np.concatenate([[baseline[r].drift_ns], baseline[r].comp_drift_ns])
            if r in baseline
            else np.zeros(1 + len(COMPONENTS))
            for r in ranks.tolist()
        ]
    ).reshape(n_r, 1 + len(COMPONENTS))
    change = self_t - base_self[:, None]
    change_sum = np.where(np.isfinite(base_self) & (n_steps > 0), np.nansum(change, axis=1), np.nan)
    prior = np.array([carried.get(r, (0.0, 0)) for r in ranks.tolist()], dtype=np.float64).reshape(n_r, 2)
    pooled_n = n_steps + prior[:, 1].astype(np.int64)
    # The job's common change also hears the ranks whose healthy windows are no reference of their
    # own (``levels``: a rank flagged in them, and its partner): what every rank shared since.
    vote = _with_levels(ranks, baseline, levels or {})
    vote_change = self_t - vote.self_ns[:, None]
    vote_sum = np.where(np.isfinite(vote.self_ns) & (n_steps > 0), np.nansum(vote_change, axis=1), np.nan)
    pooled = (vote_sum + prior[:, 0]) / np.maximum(pooled_n, 1)
    common, unchanged, role_behind = _common_change(
        pooled, vote.sigma_ns, pooled_n, vote.step_ns, role, vote.windows >= PAST_WINDOWS
    )
    x_past = change - _common_steps(vote_change, unchanged, common)
    comp_change = comps - base_comp.T[:, :, None]  # (5, n, s)
    vote_comp = comps - vote.comp_ns.T[:, :, None]
    x_past_comp = np.stack(
        [comp_change[k] - _common_steps(vote_comp[k], unchanged, 0.0) for k in range(len(COMPONENTS))]
    )
    common_comp = np.nan_to_num(np.nanmean(comp_change - x_past_comp, axis=(1, 2)), nan=0.0)

    # --- scores: the whole self time and each component, each against its own noise ---
    # Extra time in one component (a host stall in untracked time) stands out against that
    # component's noise even when the others' swamp the sum; extra time spread over several
    # (a slower forward and backward) stands out in the sum.
    shrink = np.minimum(1.0, n_steps / CONFIDENT_STEPS)
    past_floor = REL_FLOOR * np.where(np.isfinite(base_step), base_step, ref_step)
    peer_score = np.full(n_r, np.nan)
    past_score = np.full(n_r, np.nan)
    peer_spikes = past_spikes = np.zeros(n_r, np.int64)
    past_stat = np.full(n_r, np.nan)
    for j, (xp, xq) in enumerate(
        [(x_peer, x_past), *((comps[k] - peer_comp[k], x_past_comp[k]) for k in range(len(COMPONENTS)))]
    ):
        sigma_step = _noise(xp, healthy & ~direct, valid)
        # A pair's noise is its own: the spread of the two ranks' difference from step to step
        # (so is a rank's against its role's best ranks).
        p_sigma = np.where(direct, _rank_noise(xp, valid), sigma_step) if np.any(direct) else sigma_step
        p_stat, p_spikes = _mean_excess(xp, valid, p_sigma, ref_step, recent_spikes, ranks)
        q_noise = _rank_noise(xq, valid)
        q_stat, q_spikes = _mean_excess(xq, valid, q_noise, ref_step, recent_spikes, ranks)
        # A pair's difference moves between windows with nothing wrong, as a rank's mean does.
        # The total only: a pair's difference pools over the fault's windows (``pair_carried``).
        p_stat, pair_n = _pooled_pair(p_stat, n_steps, paired & (j == 0), pair_prior, pair_sums)
        pair_err = np.hypot(p_sigma / np.sqrt(np.maximum(pair_n - 1, 1)), pair_drift if j == 0 else 0.0)
        pair_thr = np.fmax(K_SIGMA * pair_err, REL_FLOOR * peer_step)
        peer_score = np.fmax(peer_score, np.where(paired, p_stat / pair_thr, np.nan))
        # Against the best ranks only the total counts (one component's share moves with the
        # scheduler, the total is what the fast ranks waited for), scored by the test that judged
        # it: pooled over the fault's windows, as a pair's difference is.
        peer_score = np.where(to_best & (j == 0), best_score, peer_score)
        # Against the peers' median too, a rank's mean moves between windows with nothing wrong
        # (its drift about the other ranks of its role, once known): not only by its steps' noise.
        peer_err = np.hypot(sigma_step / np.sqrt(np.maximum(n_steps - 1, 1)), drift[:, j])
        for g in np.unique(role[has_peers & ~direct]):
            members = (role == g) & enough
            floor = REL_FLOOR * float(np.nanmedian(peer_step[members]))
            sc = one_sided_scores(np.where(members, p_stat, np.nan), floor=floor, min_scale=peer_err).score
            peer_score[members] = np.fmax(peer_score[members], sc[members])
        # The standard error of a window's mean, and the rank's own drift between windows.
        q_err = np.hypot(q_noise / np.sqrt(np.maximum(n_steps - 1, 1)), drift[:, j])
        q_thr = np.fmax(K_SIGMA * q_err, past_floor)
        past_score = np.fmax(
            past_score, np.where(np.isfinite(q_stat) & enough & scored_past, q_stat / q_thr, np.nan)
        )
        if j == 0:
            peer_spikes, past_spikes, past_stat = p_spikes, q_spikes, q_stat
            behind_noise = K_SIGMA * q_err
            peer_stat, peer_total, past_total = p_stat, peer_score.copy(), past_score.copy()
    # A rank ahead of its reference in total made nobody wait, whatever one component of it did
    # (with most of a role slow, the fast rank's backward can exceed the slow ones'): only its
    # total score counts.
    peer_score = np.where(peer_stat <= 0, peer_total, peer_score)
    past_score = np.where(past_stat <= 0, past_total, past_score)
    peer_score = np.where(enough & has_peers, peer_score * shrink, np.nan)
    past_score = past_score * shrink
    score = np.fmax(peer_score, past_score)

    # The basis of each rank's excess: its peers when it has them and they show more, else its past.
    use_past = ~has_peers | (np.nan_to_num(past_score, nan=-np.inf) > np.nan_to_num(peer_score, nan=-np.inf))
    use_past &= np.isfinite(past_stat) & scored_past
    x = np.where(use_past[:, None], x_past, x_peer)
    comp_ref = np.where(use_past[None, :, None], (base_comp + common_comp).T[:, :, None], peer_comp)
    comp_excess = np.nanmean(comps - comp_ref, axis=2).T
    excess_matrix = np.where(valid, np.maximum(np.nan_to_num(x, nan=0.0), 0.0), np.nan)
    spikes = np.where(use_past, past_spikes, peer_spikes)
    ref_self = np.where(use_past, base_self + common, np.nanmean(peer_ref, axis=1))
    ref_step_r = np.where(use_past, base_step, peer_step)
    basis = tuple(
        "own past" if p else "best ranks" if b else "peers"
        for p, b in zip(use_past.tolist(), to_best.tolist(), strict=True)
    )
    job_end = np.nanmax(t.end_ns, axis=0)
    return PhaseResult(
        rank=ranks.astype(np.int64),
        steps=n_steps.astype(np.int64),
        score=score,
        peer_score=peer_score,
        past_score=past_score,
        excess_ns=np.where(n_steps > 0, np.nanmean(np.where(valid, x, np.nan), axis=1), np.nan),
        component_excess_ns=np.nan_to_num(comp_excess, nan=0.0),
        wait_ns=np.nanmean(np.where(valid, t.blocked_ns, np.nan), axis=1),
        self_ns=np.nanmean(self_t, axis=1),
        step_ns=np.nanmean(t.step_ns, axis=1),
        ref_step_ns=ref_step_r,
        ref_wait_ns=peer_wait,
        ref_self_ns=ref_self,
        healthy=healthy & enough,
        lost_ns=np.nansum(excess_matrix, axis=1),
        excess_matrix=excess_matrix,
        step_cols=step_cols,
        has_collectives=bool(t.synced[valid].mean() >= 0.5) if np.any(valid) else False,
        basis=basis,
        roles=roles,
        spikes=spikes,
        times=t,
        behind_ns=np.nanmean(np.where(valid, x_past, np.nan), axis=1),
        behind_comp_ns=np.nanmean(np.where(valid[None], x_past_comp, np.nan), axis=2).T,
        job_end_ns=job_end,
        past_step_ns=base_step,
        change_sum_ns=change_sum,
        behind_noise_ns=behind_noise,
        best_sums=best_sums,
        pair_sums=pair_sums,
        role_behind=role_behind,
    )


def fell_behind(l2: PhaseResult) -> NDArray[np.bool_]:
    """Per rank of ``l2``, whether its self time grew against its own past more than the job's
    common change by :data:`REL_FLOOR` of its own past's step and by more than chance
    (``behind_noise_ns``); False without history.

    The floor comes from the rank's own past, as ``behind_ns`` does: a rank with few peers or none
    (a pipeline stage's pair, a stage without replicas) falls behind like any other. A rank
    behind by less than its noise is not behind: on a busy host a job-level loss would otherwise
    name whichever ranks the scheduler held up most in that window."""
    floor = REL_FLOOR * np.nan_to_num(l2.past_step_ns, nan=np.inf)
    if l2.behind_noise_ns.size == l2.behind_ns.size:
        floor = np.fmax(floor, l2.behind_noise_ns)
    return np.nan_to_num(l2.behind_ns, nan=-np.inf) >= floor


@dataclass(frozen=True)
class _Levels:
    """Per rank, the means the job's common change is measured from: its own past's, else its
    level's over the same healthy windows (NaN: neither), and how many windows those are (0:
    neither). Shapes ``(n,)``; ``comp_ns`` ``(n, 5)``."""

    self_ns: F64
    sigma_ns: F64
    step_ns: F64
    comp_ns: F64
    windows: NDArray[np.int64]


def _with_levels(
    ranks: NDArray[np.int64], baseline: Mapping[int, RankBaseline], levels: Mapping[int, RankBaseline]
) -> _Levels:
    """:class:`_Levels` of ``ranks``: ``baseline`` where a rank has one, else ``levels``."""
    src = [baseline.get(r, levels.get(r)) for r in ranks.tolist()]
    nan_comp = np.full(len(COMPONENTS), np.nan)
    return _Levels(
        np.array([b.self_ns if b is not None else np.nan for b in src]),
        np.array([b.sigma_ns if b is not None else np.nan for b in src]),
        np.array([b.step_ns if b is not None else np.nan for b in src]),
        np.array([b.comp_ns if b is not None else nan_comp for b in src]).reshape(
            ranks.size, len(COMPONENTS)
        ),
        np.array([b.windows if b is not None else 0 for b in src], np.int64),
    )


def _common_change(
    change: NDArray[np.float64],
    sigma: NDArray[np.float64],
    n_steps: NDArray[np.int64],
    step: NDArray[np.float64],
    role: NDArray[np.int64] | None = None,
    known: NDArray[np.bool_] | None = None,
) -> tuple[float, NDArray[np.bool_], NDArray[np.bool_]]:
    """The job's change of self time per step that every rank shares, the ranks not behind, and
    the ranks of the roles behind as a whole.

    Start from the change nearest zero (a rank that did not change is there whenever one did
    not), flag the ranks past their threshold above it, and take the median change of the others:
    the level of the ranks not behind; a second pass from that level flags a rank that did not
    speed up with the rest. Not a low percentile: a rank that sped up far (a pipeline stage's
    peer freed of a core) would set the level and put every other rank behind. ``change`` is
    pooled over the fault's windows (``carried``): in one window of a 2-core host the slow
    ranks of a 3-of-4 fault stood about one threshold above the fourth, which then hid them.

    A role (``role``, per rank; of its ranks those ``known``: whose reference holds
    :data:`PAST_WINDOWS` windows or more, fewer say nothing yet of how far a mean moves) is
    judged as a whole too: its ranks do the same work, so a fault of the role (a slow pipeline
    stage) moves them alike, and their mean change has the standard error of all their steps
    together. A role whose mean is past that threshold above the level, with ranks outside it
    not behind, is behind with all its ranks: the other roles' change is the job's (they waited
    for it at the synchronisation points they share; a change every rank shares leaves those
    waits as they were). Rank by rank, the two ranks of a slow stage can each stay within their
    noisy steps' threshold, and the median of four ranks then split the stage's slowdown with
    the job. A job of one role is judged rank by rank only.
    0 (and no rank) without history.
    """
    ok = np.isfinite(change)
    rest = np.zeros(change.size, bool)
    whole = np.zeros(change.size, bool)
    if not np.any(ok):
        return 0.0, rest, whole
    se = np.nan_to_num(sigma, nan=0.0) / np.sqrt(np.maximum(n_steps - 1, 1))
    floor = REL_FLOOR * step
    thr = np.fmax(K_SIGMA * se, floor)
    thr = np.where(np.isfinite(thr), thr, 0.0)
    group, judged, role_mean, role_thr = _role_means(change, se, floor, ok, role, known)
    level = float(change[ok][np.argmin(np.abs(change[ok]))])
    for _ in range(2):
        behind = ok & (change - level >= thr)
        slow_roles = judged & (role_mean - level >= role_thr)
        if np.any(slow_roles):  # behind only beside ranks outside it that are not
            free = ok & ~behind
            outside = np.count_nonzero(free) - np.bincount(group[free], minlength=group.max() + 1)[group]
            slow_roles &= outside > 0
        behind |= slow_roles
        if not np.any(ok & ~behind):
            break
        rest, whole = ok & ~behind, slow_roles
        level = float(np.median(change[rest]))
    return level, rest, whole


def _role_means(
    change: F64,
    se: F64,
    floor: F64,
    ok: NDArray[np.bool_],
    role: NDArray[np.int64] | None,
    known: NDArray[np.bool_] | None,
) -> tuple[NDArray[np.int64], NDArray[np.bool_], F64, F64]:
    """Per rank, what :func:`_common_change` judges its role by, in a job of several roles: the
    index of its role (0 for every rank without one), whether it is one of two ``known`` ranks or
    more with a change in its role (those are judged), its role's mean change over them, and the
    threshold of that mean (:data:`K_SIGMA` standard errors of it, at least the role's mean
    floor), ns. All arrays ``(n,)``; a job of one role judges no rank."""
    n = change.size
    group = np.zeros(n, np.int64)
    none = (group, np.zeros(n, bool), np.zeros(n), np.zeros(n))
    if role is None or np.unique(role[ok]).size < 2:
        return none
    _, group = np.unique(role, return_inverse=True)
    group = group.astype(np.int64).reshape(n)
    judged = ok & (known if known is not None else True)
    size = group.max() + 1
    count = np.bincount(group[judged], minlength=size)
    judged &= count[group] >= PAIR
    if not np.any(judged):
        return none
    m = np.maximum(count, 1)
    mean = np.bincount(group[judged], weights=change[judged], minlength=size) / m
    err = np.sqrt(np.bincount(group[judged], weights=se[judged] ** 2, minlength=size)) / m
    role_floor = np.bincount(group[judged], weights=np.nan_to_num(floor[judged]), minlength=size) / m
    thr = np.fmax(K_SIGMA * err, role_floor)
    return group, judged, mean[group], thr[group]


def _expected_max(n: int) -> float:
    """Expected largest of ``n`` standard normal values (Blom's approximation,
    ``Φ⁻¹((n − 0.375) / (n + 0.25))``: 0.0, 0.55, 0.85, 1.03 for n = 1..4; 1.54 for 10): how far
    below the centre the smallest of ``n`` noisy means lies, in standard errors."""
    return float(norm.ppf((n - 0.375) / (n + 0.25))) if n > 1 else 0.0


def _starved_per_step(rq: F64, cpu: F64, members: NDArray[np.bool_]) -> F64:
    """Per rank of ``members``, the run-queue delay per step its own work does not explain, ns (0
    elsewhere and without host samples): :func:`~argus.analyzer.host.starved_wait` (the one owner
    of the rule) with the role's median rank as the ranks that do its work (its CPU time per step,
    its wait per CPU second).

    A rank that works more waits more for a CPU on a busy host, at its own rate for the extra
    work: that is its work's cost, and stays in its self time. A rank held off the CPU more than
    its peers for the same work (a 2-core host's lasting scheduler offsets) is slower by
    construction of the host, not by a fault of its own: that is discounted.
    """
    out = np.zeros(rq.size)
    ok = members & (cpu > 0)
    if not np.any(ok):
        return out
    per_cpu_s = float(np.median(rq[ok] / cpu[ok]))
    out[ok] = np.maximum(starved_wait(rq[ok], cpu[ok], float(np.median(cpu[ok])), per_cpu_s), 0.0)
    return out


@dataclass(frozen=True)
class _Best:
    """A role judged against its best ranks (:func:`_best_ranks`); arrays over the window's ranks.

    Attributes:
        ok: The best ranks (the role's ranks not behind them).
        add_ns: Per rank, what to add to the best ranks' median self time per step for its
            reference, ns: the minimum's bias and its scheduling delay beyond theirs.
        score: Per rank of the role, its pooled excess over the best ranks' level in units of
            its bar (at least 1: behind; at most 0: cleared); NaN outside the role.
    """

    ok: NDArray[np.bool_]
    add_ns: F64
    score: F64


def _best_ranks(
    w: Window,
    signals: HostResult | None,
    t: StepTimes,
    self_t: F64,
    valid: NDArray[np.bool_],
    members: NDArray[np.bool_],
    floor_ns: float,
    host: dict[str, tuple[F64, F64]],
    prior: F64,
    sums: F64,
) -> _Best | None:
    """The role's best ranks when more than half of it (three ranks or more) is behind them; else None.

    With at most half of a role slow, the median of its healthy peers is the reference (the
    one-sided rule sees the slow minority). With more than half slow from a job's first window,
    the median is a slow rank and no history exists: the ranks that do the same work are judged
    against the fastest instead. Per rank, its mean self time per step less its scheduling
    delay beyond its peers' for its work (:func:`_starved_per_step`); the fastest rank's is the
    level, plus its bias: the least of ``n`` noisy means lies :func:`_expected_max` ``(n)``
    standard errors of one rank's mean below their centre (with one fast rank among four, 1.03
    of them). A rank's noise is that of its difference with the fastest rank step by step (what
    every rank shares at a step cancels), as in a pair. It is behind when it exceeds the level by
    :data:`K_SIGMA` times that standard error combined with the spread of the ranks behind (ranks
    slow by one fault are alike; ranks a scheduler spread out are not: the spread of their mean
    self times, scheduling delay included, so that one rank's correction clears that rank alone
    and never raises the others' bar), and by ``floor_ns``; and only when its own self time in
    the window exceeds the fastest rank's: the scheduling correction clears a rank, it never puts
    a faster one behind a rank the host held back (a rank held to a CPU quota, less its wait for
    a CPU, would be the level).

    Evidence pools over the windows of a fault (``prior``, a sequential test): a rank's mean is
    over those windows' steps and this one's, its standard error that of this window's per-step
    noise over all those steps. The bar stays :data:`K_SIGMA` standard errors: one window of few
    steps is judged as before. A rank's score is that test's statistic (its excess over the
    bar), so a rank the test puts behind scores at least 1 in every window it does.

    Args:
        signals: The window's host signals (None: computed from ``w.host`` when needed).
        host: Cache of :func:`~argus.analyzer.host.delay_per_step` for the window (filled on first use).
        prior: Per rank of ``t``, ``(sum of self time less scheduling delay, steps, sum of self
            time)`` of the fault's earlier windows, ns (zeros: none), shape ``(n, 3)``.
        sums: Filled in place for the members: this window's ``(sum, steps, sum)`` (to carry).
    """
    idx = np.flatnonzero(members)
    if idx.size < MIN_PEERS:
        return None
    if "rq" not in host:
        host["rq"] = delay_per_step(
            signals if signals is not None else host_signals(w.host), t.rank, t.step_ns
        )
    starved = _starved_per_step(*host["rq"], members)
    x = np.where(valid[idx], self_t[idx], np.nan)
    steps = np.count_nonzero(np.isfinite(x), axis=1)
    sums[idx, 0] = np.nansum(x, axis=1) - starved[idx] * steps
    sums[idx, 1] = steps
    sums[idx, 2] = np.nansum(x, axis=1)
    total = sums[idx] + prior[idx]
    mean = total[:, 0] / np.maximum(total[:, 1], 1)
    if not np.all(np.isfinite(mean)) or np.any(steps == 0):
        return None
    fastest = int(np.argmin(mean))
    diff = x - x[fastest]
    n = np.count_nonzero(np.isfinite(diff), axis=1) + np.minimum(prior[idx, 1], prior[idx[fastest], 1])
    sd = MAD_TO_SIGMA * row_nanmedian(np.abs(diff - row_nanmedian(diff)[:, None]))
    se = sd / np.sqrt(np.maximum(n - 1, 1))
    # A difference of two ranks has twice one rank's variance: one rank's standard error is 1/√2 of it.
    se_level = float(np.nanmedian(se[np.arange(idx.size) != fastest])) / np.sqrt(2.0)
    se[fastest] = se_level
    if not np.isfinite(se_level):
        return None
    bias = _expected_max(idx.size) * se_level
    # The scheduling correction only clears a rank: no rank is further behind the level rank than
    # its own self time (pooled as the test is) says, so the level rank's wait for a CPU never puts
    # another behind it (a rank held to a CPU quota waits for a CPU most of its step; less that
    # wait it would lead, and every faster rank would look behind it).
    raw = total[:, 2] / np.maximum(total[:, 1], 1)
    excess = np.minimum(mean - float(mean[fastest]), raw - float(raw[fastest])) - bias
    behind = excess >= np.fmax(K_SIGMA * se, floor_ns)
    if 2 * np.count_nonzero(behind) <= idx.size:
        return None
    # The ranks behind are alike in their self time, scheduling delay and all: one rank's
    # correction clears that rank alone (it never widens the others' bar). Their means' spread
    # holds each mean's own noise too (its standard error): only the rest is their unlikeness.
    spread2 = float(np.var(raw[behind], ddof=1) - np.mean(np.square(se[behind])))
    bar = np.fmax(K_SIGMA * np.sqrt(np.square(se) + max(spread2, 0.0)), floor_ns)
    score = excess / bar
    behind = score >= 1.0
    if 2 * np.count_nonzero(behind) <= idx.size:
        return None
    ok = np.zeros(members.size, bool)
    ok[idx[~behind]] = True
    add = bias + np.maximum(starved - float(np.median(starved[idx[~behind]])), 0.0)
    full = np.full(members.size, np.nan)
    full[idx] = score
    return _Best(ok, add, full)


def _pooled_pair(
    stat: F64, n_steps: NDArray[np.int64], paired: NDArray[np.bool_], prior: F64, sums: F64
) -> tuple[F64, NDArray[np.int64]]:
    """A pair's mean difference per step pooled over the fault's earlier windows, and its steps.

    The best ranks' sequential test, for two ranks: the mean over those windows' steps and this
    one's; the caller takes its standard error as this window's per-step noise over all of them.

    Args:
        stat: Per rank, this window's mean excess over its partner per step, ns.
        paired: Ranks of a role of two (the others are returned as they are).
        prior: Per rank, ``(sum ns, steps)`` of the fault's earlier windows, shape ``(n, 2)``.
        sums: Filled in place for the paired ranks: this window's ``(sum ns, steps)`` (to carry).
    """
    ok = paired & np.isfinite(stat)
    sums[ok] = np.stack([stat * n_steps, n_steps], axis=1)[ok]
    n = n_steps + np.where(ok, prior[:, 1], 0).astype(np.int64)
    return np.where(ok, (stat * n_steps + prior[:, 0]) / np.maximum(n, 1), stat), n


def _noise(x: NDArray[np.float64], healthy: NDArray[np.bool_], valid: NDArray[np.bool_]) -> float:
    """Robust per-step standard deviation of the healthy ranks' excess, ns."""
    resid = x[healthy][valid[healthy]]
    resid = resid[np.isfinite(resid)]
    return MAD_TO_SIGMA * float(np.median(np.abs(resid - np.median(resid)))) if resid.size else 0.0


def _common_steps(change: F64, unchanged: NDArray[np.bool_], fallback: float) -> F64:
    """Per step column, the change of the ranks not behind (every rank slower together at one step
    cancels), as a row to subtract; ``fallback`` where no such rank reported."""
    if not np.any(unchanged):
        return np.full((1, change.shape[1]), fallback)
    per_step = np.nanmedian(change[unchanged], axis=0)
    return np.where(np.isfinite(per_step), per_step, fallback)[None, :]


def _rank_noise(x: NDArray[np.float64], valid: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Per rank, the robust per-step standard deviation of its excess, ns (NaN without data)."""
    v = np.where(valid, x, np.nan)
    out = np.full(x.shape[0], np.nan)
    has = np.any(np.isfinite(v), axis=1)
    if np.any(has):
        med = row_nanmedian(v[has])
        out[has] = MAD_TO_SIGMA * row_nanmedian(np.abs(v[has] - med[:, None]))
    return out


def _mean_excess(
    x: NDArray[np.float64],
    valid: NDArray[np.bool_],
    sigma: float | NDArray[np.float64],
    ref_step: float,
    recent_spikes: Mapping[int, int],
    ranks: NDArray[np.int64],
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Per rank, the mean excess per step (a lone hiccup left out) and its spike count.

    The mean is signed (noise averages out; a steady shift or repeated stalls do not); the
    time the job waited for the rank is the positive part, kept apart by the caller.
    """
    n_r = x.shape[0]
    pos = np.where(valid, np.nan_to_num(x, nan=0.0), np.nan)
    level = row_nanmedian(pos)
    sig = np.broadcast_to(np.asarray(sigma, np.float64), (n_r,))
    spike_at = level + np.fmax(SPIKE_K * np.nan_to_num(sig, nan=0.0), SPIKE_REL * ref_step)
    is_spike = valid & (pos > spike_at[:, None])
    spikes = is_spike.sum(axis=1).astype(np.int64)
    recent = np.array([recent_spikes.get(int(r), 0) for r in ranks], np.int64)
    lone = (spikes == 1) & (recent == 0)
    worst = np.nanmax(np.where(is_spike, pos, -np.inf), axis=1)
    total = np.nansum(pos, axis=1) - np.where(lone, worst, 0.0)
    count = valid.sum(axis=1) - lone.astype(np.int64)
    mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    has_x = np.any(valid & np.isfinite(x), axis=1)
    return np.where(has_x, mean, np.nan), spikes
