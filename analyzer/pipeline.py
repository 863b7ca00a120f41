"""One job's analysis, window after window: the levels, causes, lost time and lifecycle without any I/O.

:class:`JobAnalysis` holds what must outlive a window — the job's healthy pace
(L1 and lost time), each rank's self time in healthy windows (L2's own-past
reference), the job's healthy profile (what grew), its groups' healthy transfer
times (slow-link history), the ranks' roles, recent stalls, the open diagnoses
— and turns each :class:`~argus.analyzer.window.Window` into the diagnoses to
write and the window's lost-time accounting. The service feeds it windows read
from the store; the detection benchmark feeds it synthetic windows directly.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer import dense
from argus.analyzer.causes import attribute, host_delay_bound
from argus.analyzer.collectives import Decomposition, decompose, slow_links, transfer_medians
from argus.analyzer.findings import KEEP_SCORE, Finding
from argus.analyzer.host import host_signals
from argus.analyzer.iteration import compare_iterations, job_last_end, job_step_times
from argus.analyzer.kernels import score_kernels
from argus.analyzer.lifecycle import OPEN_SCORE, Tracker
from argus.analyzer.links import locate_slow_links
from argus.analyzer.liveness import find_unresponsive, silence_threshold_ns
from argus.analyzer.loss import (
    DEFAULT_MIN_LOSS_PCT,
    Accounting,
    JobProfile,
    account,
    continues,
    held_ranks,
    job_profile,
)
from argus.analyzer.phase import (
    COMPONENTS,
    CONFIDENT_STEPS,
    MIN_PEERS,
    PAIR,
    WARMUP_STEPS,
    PhaseResult,
    RankBaseline,
    compare_phases,
)
from argus.analyzer.robust import MAD_TO_SIGMA
from argus.analyzer.roles import Roles, infer_roles
from argus.analyzer.waits import StepTimes
from argus.analyzer.window import Window
from argus.diagnosis import Diagnosis

__all__ = ["JobAnalysis", "WindowResult"]

#: Job step times of healthy windows (no finding at the opening score, nothing open) kept as the pace.
HISTORY_STEPS = 512
#: Healthy windows of each rank's self time kept as its own-past reference.
RANK_HISTORY_WINDOWS = 8
#: Healthy windows of a rank before its own window-to-window drift is estimated.
DRIFT_WINDOWS = 3
#: Healthy windows of the job's profile kept.
PROFILE_WINDOWS = 8
#: Windows of healthy transfer medians kept per (group, op, size class).
LINK_HISTORY_WINDOWS = 8
#: Windows of a fault (not references) whose change against the ranks' own past is pooled to
#: judge which ranks are behind (:func:`~argus.analyzer.phase.compare_phases`, ``carried``).
CARRIED_WINDOWS = 4
#: Windows over which a rank's stalls count as repeated (a second one is a pattern).
SPIKE_MEMORY_WINDOWS = 6


@dataclass(frozen=True)
class WindowResult:
    """What one window produced.

    Attributes:
        findings: Every finding of the window (before the lifecycle), with their lost-time shares.
        changed: Diagnoses opened, updated or resolved (to write).
        suspects: ``(rank, score)`` of the highest-scoring ranks, best first.
        accounting: The window's lost time and how much of it the findings explain.
        roles: The ranks' roles when they changed in this window (to store), else None.
    """

    findings: list[Finding]
    changed: list[Diagnosis]
    suspects: list[tuple[int, float]]
    accounting: Accounting
    roles: Roles | None = None


@dataclass
class _RankWindow:
    """One healthy window of one rank: its means (the statistic a later window's mean is compared
    with), and how far they sat from the window's other ranks (the rank's own drift)."""

    self_ns: float
    sigma_ns: float
    comp_ns: np.ndarray
    step_ns: float
    self_dev_ns: float
    comp_dev_ns: np.ndarray


class JobAnalysis:
    """Stateful analysis of one job.

    Args:
        job_id: The job.
        window_ns: Analysis window, ns.
        min_loss_pct: Loss threshold, percent of wall time over the confirmation span.
    """

    def __init__(self, job_id: str, window_ns: int, *, min_loss_pct: float = DEFAULT_MIN_LOSS_PCT) -> None:
        self.job_id = job_id
        self.window_ns = window_ns
        self.min_loss_pct = min_loss_pct
        self.tracker = Tracker(job_id, window_ns=window_ns, min_loss_pct=min_loss_pct)
        self._steps: deque[float] = deque(maxlen=HISTORY_STEPS)
        self._links: dict[tuple[str, int], deque[float]] = {}
        self._ranks: dict[int, deque[_RankWindow]] = {}
        #: Per rank, its healthy windows kept out of ``_ranks`` (flagged in them, or its partner
        #: was): with ``_ranks``, its level in every healthy window, the common change's vote.
        self._levels: dict[int, deque[_RankWindow]] = {}
        self._profiles: deque[JobProfile] = deque(maxlen=PROFILE_WINDOWS)
        self._spikes: dict[int, deque[int]] = {}
        #: Per rank, (change_sum_ns, steps) of the recent windows that became no reference.
        self._carried: dict[int, deque[tuple[float, int]]] = {}
        #: Per rank, the best-ranks test's (sum_ns, steps, raw_sum_ns) of those windows
        #: (``PhaseResult.best_sums``).
        self._carried_best: dict[int, deque[tuple[float, int, float]]] = {}
        #: Per rank of a role of two, the pair test's (sum_ns, steps) of those windows
        #: (``PhaseResult.pair_sums``).
        self._carried_pair: dict[int, deque[tuple[float, int]]] = {}
        self._suspects: list[tuple[int, float]] = []
        #: Subjects of the last window's findings at the opening score.
        self._strong: frozenset[str] = frozenset()
        #: Ranks held after the last window (:func:`~argus.analyzer.loss.held_ranks`).
        self._held: frozenset[int] = frozenset()
        self.roles: Roles | None = None
        #: (step, end ns) of the job's newest step seen, for the next window's first step time.
        self._last_end: tuple[int, int] | None = None

    @property
    def typical_step_ns(self) -> float | None:
        """Median of the job's recent step times in healthy windows, ns, or None before any."""
        return float(np.median(self._steps)) if self._steps else None

    @property
    def pace_ns(self) -> float | None:
        """The job's healthy pace: mean step time of its recent healthy windows, ns.

        None until its healthy steps span a whole window (and :data:`CONFIDENT_STEPS` steps): a
        job's first, partial window misses its periodic pauses (checkpoints, evaluation), which
        its pace must include. Whole less the two steps a window cuts at its edges: one window
        whose steps fill it is whole (else the job's second window, a fault's first perhaps,
        would become the pace and its ranks' references unjudged).
        """
        edges = 2.0 * float(np.median(self._steps)) if self._steps else 0.0
        enough = len(self._steps) >= CONFIDENT_STEPS and float(np.sum(self._steps)) >= self.window_ns - edges
        return float(np.mean(self._steps)) if enough else None

    @property
    def pace_sigma_ns(self) -> float:
        """Standard deviation of the healthy step times, ns: periodic pauses (checkpoints) make it
        large, and with it the noise of a window's mean (see :func:`argus.analyzer.loss.account`)."""
        return float(np.std(self._steps)) if len(self._steps) >= CONFIDENT_STEPS else 0.0

    def _level_baselines(self) -> dict[int, RankBaseline]:
        """Per rank without an own past, its means over every healthy window (``_levels``)."""
        wanted = [r for r, w in self._levels.items() if w and not self._ranks.get(r)]
        return self._baselines({r: self._levels[r] for r in wanted}) if wanted else {}

    def _baselines(self, windows: dict[int, deque[_RankWindow]] | None = None) -> dict[int, RankBaseline]:
        """Each rank's own past (:class:`RankBaseline`) from its healthy windows.

        A window's mean moves from window to window with nothing wrong (a shared host's
        scheduler): that drift is part of the noise of an own-past comparison. It is the spread
        of each rank's means about its role's, pooled over the ranks with two windows or more
        (the rank's own once it has :data:`DRIFT_WINDOWS`, if larger); 0 before any two windows.
        """
        source = self._ranks if windows is None else windows
        ranks = [r for r, w in source.items() if w]
        n_comp = 1 + len(COMPONENTS)
        # Ranks with the same number of windows are stacked and reduced along the windows' axis: the
        # same operations per rank as one rank at a time, without 10 numpy calls for each of 10,000.
        by_count: dict[int, list[int]] = {}
        for pos, r in enumerate(ranks):
            by_count.setdefault(len(source[r]), []).append(pos)
        spread = np.zeros((len(ranks), n_comp))
        two = np.zeros(len(ranks), bool)  # ranks with two windows or more
        stats: dict[int, tuple[NDArray[np.float64], ...]] = {}
        for k, positions in by_count.items():
            kept = [source[ranks[p]] for p in positions]
            dev = np.array([[[x.self_dev_ns, *x.comp_dev_ns] for x in w] for w in kept])  # (n, k, 1+C)
            if k >= 2:
                spread[positions] = np.var(dev, axis=1, ddof=1)
                two[positions] = True
            own = np.std(dev, axis=1, ddof=1) if k >= DRIFT_WINDOWS else np.zeros((len(positions), n_comp))
            stats[k] = (
                np.sqrt(spread[positions, 0]),
                own,
                np.mean(np.array([[x.self_ns for x in w] for w in kept]), axis=1),
                np.median(np.array([[x.sigma_ns for x in w] for w in kept]), axis=1),
                np.mean(np.array([[x.comp_ns for x in w] for w in kept]), axis=1),
                np.median(np.array([[x.step_ns for x in w] for w in kept]), axis=1),
            )
        pooled = np.sqrt(np.mean(spread[two], axis=0)) if np.any(two) else np.zeros(n_comp)
        out = {}
        for k, positions in by_count.items():
            role_drift, own, self_ns, sigma_ns, comp_ns, step_ns = stats[k]
            drift = np.fmax(own, pooled)
            for j, p in enumerate(positions):
                out[ranks[p]] = RankBaseline(
                    float(self_ns[j]),
                    float(sigma_ns[j]),
                    comp_ns[j],
                    float(step_ns[j]),
                    float(drift[j, 0]),
                    drift[j, 1:],
                    k,
                    float(role_drift[j]),
                )
        return {r: out[r] for r in ranks}

    def _healthy_profile(self) -> JobProfile | None:
        if not self._profiles:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no host samples in any healthy window
            run_queue = float(np.nanmedian([p.run_queue_ns for p in self._profiles]))
            cpu = float(np.nanmedian([p.cpu_ns for p in self._profiles]))
            # Each rank's own figures: its median over the healthy windows that hold it.
            ranks = np.unique(np.concatenate([p.rank for p in self._profiles]))
            rank_rq = np.full((ranks.size, len(self._profiles)), np.nan)
            rank_cpu = np.full((ranks.size, len(self._profiles)), np.nan)
            for j, p in enumerate(self._profiles):
                at = np.searchsorted(ranks, p.rank)
                rank_rq[at, j], rank_cpu[at, j] = p.rank_run_queue_ns, p.rank_cpu_ns
            rank_rq_med, rank_cpu_med = np.nanmedian(rank_rq, axis=1), np.nanmedian(rank_cpu, axis=1)
        return JobProfile(
            np.median(np.stack([p.comp_ns for p in self._profiles]), axis=0),
            float(np.median([p.transfer_ns for p in self._profiles])),
            float(np.median([p.attributable_ns for p in self._profiles])),
            run_queue,
            cpu,
            ranks,
            rank_rq_med,
            rank_cpu_med,
        )

    def _roles(self, w: Window, d: Decomposition | None, group_sizes: dict[str, int]) -> Roles | None:
        """The roles when they changed (a pipeline keeps its stages through a window without p2p)."""
        ranks = dense.unique(np.concatenate([w.steps.rank, w.status.rank]))
        found = infer_roles(ranks, w.collectives, d, group_sizes)
        has_p2p = d is not None and bool(np.any(d.inst_p2p))
        old = self.roles
        if old is not None and not has_p2p and np.all(old.of(ranks) >= 0) and np.unique(old.stage).size > 1:
            return None  # a window without transfers says nothing about the stages
        same = old is not None and np.array_equal(old.rank, found.rank) and old.labels == found.labels
        if same and old is not None and np.array_equal(old.role, found.role):
            return None
        self.roles = found
        return found

    def analyze(self, w: Window) -> WindowResult:
        """Run L1, L2, L3, liveness, causes, lost-time accounting and the lifecycle on one window."""
        c = w.collectives
        group_sizes = {name: int(m.size) for name, m in w.status.groups.items()}
        d: Decomposition | None = decompose(c, group_sizes=group_sizes) if c.rank.size else None
        changed_roles = self._roles(w, d, group_sizes)
        roles = self.roles
        step, step_ns = job_step_times(w.steps, min_step=WARMUP_STEPS, before=self._last_end)
        self._last_end = job_last_end(w.steps) or self._last_end
        l1 = compare_iterations(step, step_ns, list(self._steps))
        recent = {r: int(sum(v)) for r, v in self._spikes.items()}
        carried = {r: (sum(c for c, _ in v), sum(n for _, n in v)) for r, v in self._carried.items() if v}
        best = {
            r: (sum(c for c, _, _ in v), sum(n for _, n, _ in v), sum(x for _, _, x in v))
            for r, v in self._carried_best.items()
            if v
        }
        pair = {r: (sum(c for c, _ in v), sum(n for _, n in v)) for r, v in self._carried_pair.items() if v}
        host = host_signals(w.host)
        baselines = self._baselines()
        l2 = compare_phases(
            w, d, roles, baselines, recent, carried, best, host, pair, self._level_baselines()
        )
        l3 = score_kernels(w.kernels, roles=roles)
        history = {k: float(np.median(v)) for k, v in self._links.items() if len(v) >= 2}
        links = slow_links(d, c.group_names, history) if d is not None else []
        unresponsive = find_unresponsive(
            w.status,
            w.end_ns,
            silence_ns=silence_threshold_ns(self.window_ns),
            typical_step_ns=self.typical_step_ns,
        )
        watched = {r for d in self.tracker.open for r in d.ranks}
        profile = job_profile(l2, host)
        healthy_profile = self._healthy_profile()
        host_delay = profile.rank_host_delay_ns(healthy_profile) if profile is not None else None
        findings = attribute(
            w,
            l1=l1,
            l2=l2,
            l3=l3,
            host=host,
            links=links,
            unresponsive=unresponsive,
            watched=watched,
            host_delay_ns=host_delay,
        )
        findings = locate_slow_links(findings, w, d)  # a slow group's ranks → the nodes whose link is slow
        findings, acc = account(
            findings,
            l1,
            l2,
            pace_ns=self.pace_ns,
            pace_sigma_ns=self.pace_sigma_ns,
            profile=profile,
            healthy_profile=healthy_profile,
            min_loss_pct=self.min_loss_pct,
            repeated=self._strong,
            held=self._held,
            transfer_host_ns=host_delay_bound(w, l2, l2.rank, host_delay),
        )
        strong = frozenset(f.subject for f in findings if f.score >= OPEN_SCORE)
        repeated = bool(self._strong & strong)
        # A straggler kept at the keep score (nothing repeated at the opening score) is still one:
        # the window is no pace, nor its ranks' own past (``_remember``).
        kept = frozenset(r for f in findings if continues(f, self._held) for r in f.ranks if r in self._held)
        if l2.role_behind.size == l2.rank.size:
            # A role behind the others as a whole holds its fault in this window, whichever of its
            # ranks scores: the window is no pace, nor the role's own past (``_remember``).
            kept |= frozenset(l2.rank[l2.role_behind].tolist())
        self._strong = strong
        self._held = held_ranks(findings, self._held)
        observed = set(dense.unique(w.steps.rank).tolist()) | set(dense.unique(w.host.rank).tolist())
        observed |= set(dense.unique(w.kernels.rank).tolist())
        changed = self.tracker.update(w.start_ns, findings, observed)
        if w.status.rank.size and bool(np.all(w.status.exited)):
            changed += self.tracker.finish()
        lossy = acc.wall_ns > 0 and 100.0 * acc.lost_ns >= self.min_loss_pct * acc.wall_ns
        doubtful = _doubtful(l2, baselines)
        self._remember(w, d, l2, step_ns, findings, profile, lossy, repeated, kept, doubtful)
        if l2.rank.size or l3.rank.size or findings:
            self._suspects = _suspects(l2.rank, l2.score, l3.rank, l3.score, findings, self.tracker.open)
        # A window without comparable data (the job paused or ended) keeps the last suspects.
        return WindowResult(findings, changed, self._suspects, acc, changed_roles)

    def _remember(
        self,
        w: Window,
        d: Decomposition | None,
        l2: PhaseResult,
        step_ns: np.ndarray,
        findings: list[Finding],
        profile: JobProfile | None,
        lossy: bool,
        repeated: bool,
        kept: frozenset[int] = frozenset(),
        doubtful: frozenset[int] = frozenset(),
    ) -> None:
        """Keep what later windows compare with: only a healthy window's numbers become references.

        Healthy: nothing open, no loss at the threshold (a loss nobody explained yet must not
        become the pace that hides it), no finding at the opening score repeated from the
        previous window. A finding at the keep score on a held rank (``kept``: a fault from the
        job's first step that dips below the opening score for a window is still there) keeps
        the window out of the job's pace, profile and link history and out of those ranks' own
        past (and their partners'), as does a role behind the others as a whole
        (``PhaseResult.role_behind``: a slow pipeline stage whose ranks each stay under the
        opening score); the other ranks' own past grows (a rank 0 that a 2-core
        host's scheduler holds back through a job's warm-up must not leave every other rank
        without a reference, to take the fault's first windows as one). A rank with a finding
        at the opening score keeps its window out of its own past; the others' references grow
        (one rank's noise in one window must not keep every reference from growing), as does a
        rank of ``doubtful`` (:func:`_doubtful`: at the keep score against its peers). A rank
        kept out of its own past still has its level in the window: its vote on the job's
        common change (``compare_phases``'s ``levels``).
        """
        for i, r in enumerate(l2.rank.tolist()):
            self._spikes.setdefault(r, deque(maxlen=SPIKE_MEMORY_WINDOWS)).append(int(l2.spikes[i]))
        # A fault's windows would make its own slowdown the reference (and hide it from the evidence).
        healthy = not self.tracker.open and not lossy and not repeated
        if not healthy:
            self._carry(l2)
            return
        self._move_references(l2, kept)
        if l2.times is not None:
            flagged = {r for f in findings if f.score >= OPEN_SCORE for r in f.ranks} | kept
            self._keep_rank_windows(l2.times, l2.roles, flagged | doubtful)
        if kept:  # a held rank's fault is still in the job's steps: no pace, profile or link history
            return
        self._steps.extend(step_ns.tolist())
        if profile is not None:
            self._profiles.append(profile)
        if d is not None:
            slow = {f.group for f in findings if f.cause == "communication"}
            for key, value in transfer_medians(d, w.collectives.group_names).items():
                if key[0] not in slow:
                    self._links.setdefault(key, deque(maxlen=LINK_HISTORY_WINDOWS)).append(value)

    def _move_references(self, l2: PhaseResult, kept: frozenset[int]) -> None:
        """A healthy window moves the references: a change against the old ones is stale, but for
        the ``kept`` ranks, whose fault goes on (their evidence keeps pooling, this window's too)."""
        for carried in (self._carried, self._carried_best, self._carried_pair):
            for r in [r for r in carried if r not in kept]:
                del carried[r]
        if kept:
            self._carry(l2, kept)

    def _keep_rank_windows(self, t: StepTimes, roles: Roles, flagged: set[int]) -> None:
        """A healthy window's entry of each rank: its own past's, or, for the ranks of ``flagged``
        (and their partners), its level's (the common change's vote, never its own reference)."""
        own = _rank_windows(t, roles, flagged)
        for r, entry in own.items():
            self._ranks.setdefault(r, deque(maxlen=RANK_HISTORY_WINDOWS)).append(entry)
        if flagged:
            for r, entry in _rank_windows(t, roles, set()).items():
                if r not in own:
                    self._levels.setdefault(r, deque(maxlen=RANK_HISTORY_WINDOWS)).append(entry)

    def _carry(self, l2: PhaseResult, only: frozenset[int] | None = None) -> None:
        """Keep a window that became no reference: its ranks' change against their own past
        (the baselines it was measured against stay until a healthy window moves them), and the
        best-ranks and pair tests' evidence (``PhaseResult.best_sums``, ``pair_sums``); of the
        ranks of ``only`` alone when given (a window that became the others' reference)."""
        for i, r in enumerate(l2.rank.tolist()):
            if only is not None and r not in only:
                continue
            if np.isfinite(l2.change_sum_ns[i]):
                entry = (float(l2.change_sum_ns[i]), int(l2.steps[i]))
                self._carried.setdefault(r, deque(maxlen=CARRIED_WINDOWS - 1)).append(entry)
            if l2.best_sums.shape[0] == l2.rank.size and l2.best_sums[i, 1] > 0:
                best = (float(l2.best_sums[i, 0]), int(l2.best_sums[i, 1]), float(l2.best_sums[i, 2]))
                self._carried_best.setdefault(r, deque(maxlen=CARRIED_WINDOWS - 1)).append(best)
            if l2.pair_sums.shape[0] == l2.rank.size and l2.pair_sums[i, 1] > 0:
                pair = (float(l2.pair_sums[i, 0]), int(l2.pair_sums[i, 1]))
                self._carried_pair.setdefault(r, deque(maxlen=CARRIED_WINDOWS - 1)).append(pair)


def _doubtful(l2: PhaseResult, baselines: dict[int, RankBaseline]) -> frozenset[int]:
    """Ranks at the keep score against the median of their role's healthy peers (a role of
    :data:`~argus.analyzer.phase.MIN_PEERS` or more) whose bar already held their drift: no
    healthy reference of themselves.

    A rank that sits under the opening score window after window (its excess inside the bar its
    drift sets) would otherwise make each of those windows its own past and grow its drift by its
    own excess: its slowness would become its normal. Its peers' references still grow. Only once
    the rank's bar holds a drift (its baseline's, from two healthy windows of some rank): before,
    a clean rank's mean moving between windows reaches the keep score often, and leaving out the
    windows where it moved most would measure the drift low (a clean drifting job then opens).
    Once it is in the bar, the keep score is at least 2.5 standard errors of the rank's mean,
    which a clean rank seldom reaches. Not in a role of two: there a rank's score is its
    difference from its partner, and leaving it out leaves the partner out too
    (:func:`_rank_windows`): a pipeline stage whose warm-up is noisy would take the fault's first
    windows as its own past.
    """
    role = l2.roles.of(l2.rank)
    groups, sizes = np.unique(role, return_counts=True)
    large = np.isin(role, groups[sizes >= MIN_PEERS])
    drifted = np.array([r in baselines and baselines[r].drift_ns > 0 for r in l2.rank.tolist()], bool)
    high = np.nan_to_num(l2.peer_score) >= KEEP_SCORE
    return frozenset(l2.rank[large & drifted & high].tolist())


def _rank_windows(t: StepTimes, roles: Roles, flagged: set[int]) -> dict[int, _RankWindow]:
    """Each rank's healthy-window entry (ranks in ``flagged`` and ranks with too few steps left out).

    Every rank's reference comes from the same windows: the job's common change between then
    and now is only measurable against references of one period. So a rank flagged in a role
    of two keeps its partner's window out too: the pair is compared as one difference.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(t.self_ns, axis=1)
        comp_means = np.nan_to_num(np.nanmean(t.comp_self_ns, axis=2), nan=0.0)  # (5, n)
    role = roles.of(t.rank)
    if flagged:
        groups, sizes = np.unique(role, return_counts=True)
        for g in groups[sizes == PAIR].tolist():
            pair = set(t.rank[role == g].tolist())
            if pair & flagged:
                flagged = flagged | pair
    typical = np.full(t.rank.size, np.nan)
    comp_typical = np.zeros_like(comp_means)
    for g in np.unique(role):
        members = (role == g) & np.isfinite(means)
        if np.any(members):
            typical[role == g] = np.median(means[members])
            comp_typical[:, role == g] = np.median(comp_means[:, members], axis=1)[:, None]
    # Per rank: mean, MAD and median of its finite self times, and the median of its step times,
    # for all ranks at once (10,000 ranks: one NumPy pass instead of 10,000 rows of small calls).
    keep = np.isfinite(t.self_ns).sum(axis=1) >= CONFIDENT_STEPS
    if flagged:
        keep &= ~np.isin(t.rank, np.fromiter(flagged, np.int64, len(flagged)))
    rows = np.flatnonzero(keep)
    self_ns = t.self_ns[rows]
    mean_ns, sigma_ns = _row_stats(self_ns, mad=True)
    step_ns, _ = _row_stats(t.step_ns[rows], mad=False)
    comp = np.ascontiguousarray(comp_means[:, rows].T)  # (kept, 5)
    comp_dev = np.ascontiguousarray((comp_means - comp_typical)[:, rows].T)
    dev = (means - typical)[rows]
    return {
        r: _RankWindow(m, s, comp[j], st, d, comp_dev[j])
        for j, (r, m, s, st, d) in enumerate(
            zip(
                t.rank[rows].tolist(),
                mean_ns.tolist(),
                (MAD_TO_SIGMA * sigma_ns).tolist(),
                step_ns.tolist(),
                dev.tolist(),
                strict=True,
            )
        )
    }


def _row_stats(x: NDArray[np.float64], *, mad: bool) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per row of ``x`` ``(n, s)``, over its finite values (NaN where a row has none): with ``mad``,
    their mean and median absolute deviation from their median; without it, their median (and zeros).

    The same numbers as ``np.mean``, ``np.median`` (and ``np.nanmedian``) of each row's finite values
    in their order, bit for bit: rows are packed left by their count of finite values and reduced a
    count at a time, so each row's sum runs over the same values in the same order as one row alone.
    """
    finite = np.isfinite(x)
    count = finite.sum(axis=1)
    packed = np.take_along_axis(x, np.argsort(~finite, axis=1, kind="stable"), axis=1)
    first = np.full(x.shape[0], np.nan)
    second = np.zeros(x.shape[0]) if not mad else np.full(x.shape[0], np.nan)
    for k in np.unique(count[count > 0]).tolist():
        rows = np.flatnonzero(count == k)
        own = packed[rows, :k]
        if not mad:
            first[rows] = np.median(own, axis=1)
            continue
        med = np.median(own, axis=1)
        first[rows] = np.mean(own, axis=1)
        second[rows] = np.median(np.abs(own - med[:, None]), axis=1)
    return first, second


def _suspects(
    r2: np.ndarray,
    s2: np.ndarray,
    r3: np.ndarray,
    s3: np.ndarray,
    findings: list[Finding],
    open_: list[Diagnosis],
    top: int = 5,
) -> list[tuple[int, float]]:
    """The ``top`` ranks by score over L2, L3, this window's findings and the open diagnoses."""
    best: dict[int, float] = {}
    for d in open_:
        for r in d.ranks[:top]:
            best[r] = max(best.get(r, 0.0), d.score)
    for ranks, scores in ((r2, s2), (r3, s3)):
        ok = np.isfinite(scores)
        if not np.any(ok):
            continue
        order = np.argsort(-scores[ok])[:top]
        for r, s in zip(ranks[ok][order].tolist(), scores[ok][order].tolist(), strict=True):
            best[r] = max(best.get(r, 0.0), s)
    for f in findings:
        for r in f.ranks:
            best[r] = max(best.get(r, 0.0), f.score)
    return sorted(best.items(), key=lambda kv: -kv[1])[:top]
