"""Lost time: every second a job loses against its own healthy pace is accounted for (docs/design.md §6.2).

Definitions (one of each, used everywhere):

* A window's **wall time** is the wall time of its steps: the sum of the job's
  step times (:func:`argus.analyzer.iteration.job_step_times`, each step ending
  when its slowest rank ends it).
* Its **lost time** is that wall time minus what the same steps take at the
  job's **healthy pace** — the *mean* step time of its recent healthy windows
  (means, so that rare long steps count) — and at least the time the job waited
  per step for the ranks behind (what it would have saved without them, even
  when a rank was slow from the start and the pace never saw it healthy); once
  a pace is known, only for a finding repeated from the previous window. A
  finding that dips below the opening score but stays at the keep score on a rank
  still *held* (a rank a finding named at the opening score in the previous window,
  or held then and kept since) makes the loss too, pace or not: the hysteresis of
  the lifecycle (:mod:`argus.analyzer.lifecycle`), applied to lost time: one
  weaker window of a fault from the job's first step must not count as lossless,
  and so become the healthy pace that hides the fault.
* The findings of the window **share** it: each claims the time the job waited
  for it (``Finding.waited_ns``, per step: the slowest of its ranks, as the job
  waits for the slowest); a fault without per-step evidence (a slow link, a
  hung rank) claims its window slowdown. Claims are scaled down together when
  they add up to more than the lost time (two stragglers in parallel cost the
  job the larger of the two, not the sum), so the shares of a window sum to at
  most its lost time.
* What no finding claims is **unexplained**. What of it no single rank
  explains either (the job waited at some steps for one rank beyond all others:
  :attr:`~argus.analyzer.phase.PhaseResult.attributable_ns`, beyond what it
  waited so in its healthy windows: on a shared host every step waits for
  whichever rank the scheduler held up, and the pace includes that) becomes, at or above
  the loss threshold, the **job-level finding** (``rank: null``, subject
  ``job``), its cause from what grew against the job's own healthy profile:
  compute phases → ``compute``, ``data`` → ``dataloader``, untracked host time →
  ``host_stall``, transfers (the least-blocked rank's blocked time: what nobody
  waits for but the link) → ``communication``, and, when no rank behind explains
  it, the ranks' wait for a CPU beyond what their own work explains
  (:meth:`JobProfile.host_delay_ns`: a busier host), with the transfer time
  that wait explains (the bound of :func:`argus.analyzer.causes.host_delay_bound`:
  a transfer waits for its ranks on one host in turn) → ``host_stall``; ``unknown``
  when nothing identifiable grew. Its loss must also stand out from the noise of a window's
  mean step time (:data:`JOB_K_SIGMA` standard errors of the healthy steps):
  a job whose pace includes periodic pauses (checkpoints, evaluation) has
  windows that differ by whole pauses.

``slowdown_pct`` of a diagnosis is ``100 · lost / wall`` summed over its span
(:mod:`argus.analyzer.lifecycle`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.causes import HIDDEN_SHARE
from argus.analyzer.findings import JOB_SUBJECT, KEEP_SCORE, STRAGGLER_CAUSES, Finding
from argus.analyzer.host import HostResult, delay_per_step, starved_wait
from argus.analyzer.iteration import IterationResult
from argus.analyzer.phase import COMPONENTS, PhaseResult, fell_behind
from argus.config import DEFAULT_MIN_LOSS_PCT
from argus.diagnosis import Cause

__all__ = [
    "DEFAULT_MIN_LOSS_PCT",
    "Accounting",
    "JobProfile",
    "account",
    "continues",
    "held_ranks",
    "job_profile",
]

#: A component explains the job's loss when its growth covers at least this share of it.
GROWTH_SHARE = 1 / 3
#: A job-level loss must exceed this many standard errors of a window's mean step time.
JOB_K_SIGMA = 2.0


@dataclass(frozen=True)
class JobProfile:
    """The job's per-step time by component, averaged over its ranks (ns per step).

    Attributes:
        comp_ns: Mean self time per step of each of :data:`COMPONENTS`, shape ``(5,)``.
        transfer_ns: Mean over steps of the least-blocked rank's blocked time (the part of a
            synchronisation nobody waits for but the data movement).
        attributable_ns: Mean over steps of the time the job waited for one rank beyond all
            the others (:attr:`~argus.analyzer.phase.PhaseResult.attributable_ns` per step).
        run_queue_ns: Mean over its ranks with host samples of their run-queue delay per step
            (runnable, waiting for a CPU; :func:`~argus.analyzer.host.delay_per_step`), NaN
            without any.
        cpu_ns: The same ranks' mean CPU time per step, NaN without any.
        rank: The ranks (sorted) that ``rank_run_queue_ns`` and ``rank_cpu_ns`` align with.
        rank_run_queue_ns, rank_cpu_ns: Per rank, its run-queue delay and CPU time per step
            (in a profile of healthy windows, each rank's median over them), NaN where it has
            no host samples.
    """

    comp_ns: NDArray[np.float64]
    transfer_ns: float
    attributable_ns: float = 0.0
    run_queue_ns: float = math.nan
    cpu_ns: float = math.nan
    rank: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    rank_run_queue_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    rank_cpu_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def host_delay_ns(self, healthy: JobProfile | None) -> float:
        """The run-queue delay per step its ranks' own work does not explain against the job's
        healthy windows (``healthy``), ns: what a busier host cost every rank, on average
        (:func:`~argus.analyzer.host.starved_wait`, the one rule, with the healthy windows as
        the work's reference: their CPU time per step, their delay per CPU second). NaN without
        host samples now or then."""
        if healthy is None or not healthy.cpu_ns > 0 or not np.isfinite(self.run_queue_ns + self.cpu_ns):
            return math.nan
        rate = healthy.run_queue_ns / healthy.cpu_ns
        return float(starved_wait(self.run_queue_ns, self.cpu_ns, healthy.cpu_ns, rate))

    def rank_host_delay_ns(self, healthy: JobProfile | None) -> NDArray[np.float64]:
        """Per rank of :attr:`rank`, its run-queue delay per step its own work does not explain
        against its own healthy windows (``healthy``'s per-rank figures: its CPU time per step
        then, its delay per CPU second then; :func:`~argus.analyzer.host.starved_wait`), ns. Each
        rank against itself, not the job's mean: ranks that differ by their work (a pipeline's
        stages, a rank 0 that logs) wait at different rates on a healthy host, and those
        differences must not read as delay. NaN where the rank has no host samples now or then.
        """
        out = np.full(self.rank.size, np.nan)
        if healthy is None or healthy.rank.size == 0 or self.rank.size == 0:
            return out
        at = np.minimum(np.searchsorted(healthy.rank, self.rank), healthy.rank.size - 1)
        known = healthy.rank[at] == self.rank
        h_rq = np.where(known, healthy.rank_run_queue_ns[at], np.nan)
        h_cpu = np.where(known, healthy.rank_cpu_ns[at], np.nan)
        ok = (h_cpu > 0) & np.isfinite(h_rq) & np.isfinite(self.rank_run_queue_ns + self.rank_cpu_ns)
        out[ok] = starved_wait(
            self.rank_run_queue_ns[ok], self.rank_cpu_ns[ok], h_cpu[ok], h_rq[ok] / h_cpu[ok]
        )
        return out


def job_profile(l2: PhaseResult, host: HostResult | None = None) -> JobProfile | None:
    """The :class:`JobProfile` of one window's L2 result and host signals (None without steps)."""
    t = l2.times
    if t is None or t.step_ns.size == 0 or not np.any(np.isfinite(t.step_ns)):
        return None
    comp = np.nanmean(np.nanmean(t.comp_self_ns, axis=1), axis=1)
    least_blocked = np.nanmin(t.blocked_ns, axis=0)
    run_queue = cpu = math.nan
    rank_rq = rank_cpu = np.full(t.rank.size, np.nan)
    if host is not None:
        sampled = np.isin(t.rank, host.rank[np.isfinite(host.wait_frac)])
        if np.any(sampled):
            rq_ns, cpu_ns = delay_per_step(host, t.rank, t.step_ns)
            run_queue, cpu = float(np.mean(rq_ns[sampled])), float(np.mean(cpu_ns[sampled]))
            rank_rq, rank_cpu = np.where(sampled, rq_ns, np.nan), np.where(sampled, cpu_ns, np.nan)
    return JobProfile(
        np.nan_to_num(comp, nan=0.0),
        float(np.nan_to_num(np.nanmean(least_blocked), nan=0.0)),
        l2.attributable_ns / max(l2.step_cols.size, 1),
        run_queue,
        cpu,
        np.asarray(t.rank, np.int64),
        rank_rq,
        rank_cpu,
    )


@dataclass(frozen=True)
class Accounting:
    """One window's lost time and who accounts for it.

    Attributes:
        wall_ns: Wall time of the window's steps, ns.
        steps: Steps it covers.
        lost_ns: Lost time, ns (>= 0).
        explained_ns: The part the findings' shares cover, ns.
        pace_ns: The healthy mean step time it was measured against, ns (NaN before one is known).
    """

    wall_ns: float
    steps: int
    lost_ns: float
    explained_ns: float
    pace_ns: float

    @property
    def unexplained_ns(self) -> float:
        return max(self.lost_ns - self.explained_ns, 0.0)


def continues(f: Finding, held: frozenset[int]) -> bool:
    """Whether ``f`` keeps a straggler of the held ranks going: a straggler finding at the keep
    score on a rank of ``held`` (:func:`held_ranks` of the previous window). Only stragglers: a
    slow link or a job-level loss names every rank of its group or job, and a rank's own noise
    must not keep those going."""
    return f.family == "straggler" and f.score >= KEEP_SCORE and not held.isdisjoint(f.ranks)


def held_ranks(findings: list[Finding], held: frozenset[int]) -> frozenset[int]:
    """The ranks held after a window: named by a straggler finding at the opening score in it, or
    held before (``held``) and kept by one at the keep score (:func:`continues`)."""
    strong = {r for f in findings if f.family == "straggler" and f.score >= 1.0 for r in f.ranks}
    kept = {r for f in findings if continues(f, held) for r in f.ranks if r in held}
    return frozenset(strong | kept)


def _claim(f: Finding, wall_ns: float) -> float:
    if f.waited_ns:
        return float(np.sum(f.waited_ns))
    return max(f.slowdown_pct, 0.0) / 100.0 * wall_ns


def account(
    findings: list[Finding],
    l1: IterationResult,
    l2: PhaseResult,
    *,
    pace_ns: float | None,
    pace_sigma_ns: float = 0.0,
    profile: JobProfile | None,
    healthy_profile: JobProfile | None,
    min_loss_pct: float = DEFAULT_MIN_LOSS_PCT,
    repeated: frozenset[str] = frozenset(),
    held: frozenset[int] = frozenset(),
    transfer_host_ns: float = math.nan,
) -> tuple[list[Finding], Accounting]:
    """Share the window's lost time among ``findings`` and add the job-level finding (module doc).

    Args:
        findings: The window's findings (:func:`argus.analyzer.causes.attribute`).
        l1: The window's L1 result (job step times).
        l2: The window's L2 result (who waited for whom).
        pace_ns: The job's healthy mean step time, ns (None before one is known).
        pace_sigma_ns: The standard deviation of its healthy step times, ns.
        profile: This window's :class:`JobProfile`.
        healthy_profile: The job's profile in recent healthy windows (None before one is known).
        min_loss_pct: The loss threshold (percent of wall time) of a job-level finding's score.
        repeated: Subjects of the previous window's findings at the opening score.
        held: Ranks held after the previous window (:func:`continues`): a finding at the keep
            score on one of them makes the loss.
        transfer_host_ns: The transfer time per step the ranks' run-queue delays can explain, ns
            (:func:`~argus.analyzer.causes.host_delay_bound` over the job's ranks; NaN unknown).

    Returns:
        ``(findings with lost_ns and wall_ns set, plus the job-level finding if any; accounting)``.
    """
    wall = float(np.sum(l1.step_ns)) if l1.step_ns.size else 0.0
    n = int(l1.step_ns.size)
    # At least the time the job waited for the ranks behind (what it would have saved without
    # them: a window's mean step time is noisier than that). Sub-threshold findings share the loss
    # but do not make it: a healthy job waits each step for whichever rank is slowest by noise,
    # and that is part of its pace; once a pace is known, only a finding repeated from the
    # previous window makes it (noise does not pick the same rank twice); a finding that only dipped to
    # the keep score on a rank held from the previous window makes it too (module doc).
    waited = [
        np.asarray(f.waited_ns)
        for f in findings
        if f.waited_ns
        and ((f.score >= 1.0 and (pace_ns is None or f.subject in repeated)) or continues(f, held))
    ]
    waited_union = float(np.sum(np.max(np.stack(waited), axis=0))) if waited else 0.0
    lost = max(wall - n * pace_ns if pace_ns is not None else 0.0, waited_union, 0.0)
    claims = [_claim(f, wall) for f in findings]
    # Findings past the threshold are served first; weaker ones share what is left.
    shares = [0.0] * len(findings)
    left = lost
    for strong in (True, False):
        idx = [i for i, f in enumerate(findings) if (f.score >= 1.0) == strong]
        total = sum(claims[i] for i in idx)
        scale = min(1.0, left / total) if total > 0 else 0.0
        for i in idx:
            shares[i] = claims[i] * scale
        left -= sum(shares[i] for i in idx)
    shared = [replace(f, lost_ns=c, wall_ns=wall) for f, c in zip(findings, shares, strict=True)]
    explained = sum(shares)
    acc = Accounting(wall, n, lost, explained, float(pace_ns) if pace_ns is not None else float("nan"))
    named = {f.rank for f in findings if f.rank is not None}
    job = _job_finding(
        acc, l1, l2, profile, healthy_profile, min_loss_pct, pace_sigma_ns, named, transfer_host_ns
    )
    if job is not None:
        shared.append(job)
        acc = replace(acc, explained_ns=acc.explained_ns + job.lost_ns)
    return shared, acc


def _growth(
    l2: PhaseResult,
    profile: JobProfile | None,
    healthy: JobProfile | None,
    behind: tuple[int, ...],
    per_step: float,
    transfer_host_ns: float,
) -> tuple[dict[str, float], NDArray[np.float64]]:
    """What grew, ns per step, by name (``data``, ``compute``, ``untracked``, ``transfer``,
    ``run_queue``), and the components' growth (:data:`COMPONENTS`); empty without a profile.

    In the ranks ``behind``, against their own past beyond what the ranks not behind share (a
    checkpoint every rank takes is no rank's cause), when their change explains the loss
    (``per_step``); else (no rank behind, or a few behind by little while every rank slowed) in the
    job as a whole against its healthy windows, with its ranks' wait for a CPU beyond their work's
    (a busier host slows every phase and transfer of every rank; the ranks behind are judged
    against the ranks not behind, who share the host) and the transfer time that wait explains
    (``transfer_host_ns``: a transfer waits for its ranks on a CPU in turn,
    :func:`~argus.analyzer.causes.host_delay_bound`, as the slow-link rule reads it).
    """
    if profile is None or healthy is None:
        return {}, np.zeros(len(COMPONENTS))
    d = profile.comp_ns - healthy.comp_ns
    mine = np.isin(l2.rank, behind)
    host_delay = profile.host_delay_ns(healthy)
    transfer = profile.transfer_ns - healthy.transfer_ns
    if behind and float(np.mean(l2.behind_ns[mine])) >= GROWTH_SHARE * per_step:
        d = np.nanmean(l2.behind_comp_ns[mine], axis=0)
        host_delay = math.nan
    elif np.isfinite(host_delay) and np.isfinite(transfer_host_ns):
        covered = min(max(transfer, 0.0), transfer_host_ns)
        transfer, host_delay = transfer - covered, host_delay + covered
    growth = {
        "data": float(d[0]),
        "compute": float(d[1] + d[2] + d[3]),
        "untracked": float(d[4]),
        "transfer": transfer,
        **({"run_queue": host_delay} if np.isfinite(host_delay) else {}),
    }
    return growth, d


def _job_finding(
    acc: Accounting,
    l1: IterationResult,
    l2: PhaseResult,
    profile: JobProfile | None,
    healthy: JobProfile | None,
    min_loss_pct: float,
    pace_sigma_ns: float,
    named: set[int],
    transfer_host_ns: float,
) -> Finding | None:
    # The job-level finding claims only what no single rank explains: a step that waited for one
    # rank beyond all the others (a first, not yet repeated stall that no finding took) is that
    # rank's, unexplained perhaps, but not the job's. Only beyond what the healthy windows waited
    # so: every step waits for whichever rank is slowest by noise, and the pace includes it.
    usual = healthy.attributable_ns * acc.steps if healthy is not None else 0.0
    unexplained = acc.lost_ns - max(acc.explained_ns, l2.attributable_ns - usual)
    if acc.wall_ns <= 0 or unexplained <= 0 or not np.isfinite(acc.pace_ns) or min_loss_pct <= 0:
        return None
    # The job's loss must stand out from the noise of a window's mean step time, which periodic
    # pauses (a checkpoint every few windows) make large: K standard errors at least.
    noise_pct = 100.0 * JOB_K_SIGMA * pace_sigma_ns / np.sqrt(max(acc.steps, 1)) / acc.pace_ns
    score = 100.0 * unexplained / acc.wall_ns / max(min_loss_pct, noise_pct)
    if score < 0.5:
        return None
    per_step = unexplained / max(acc.steps, 1)
    behind, knock_on = _ranks_behind(l2)
    growth, d = _growth(l2, profile, healthy, behind, per_step, transfer_host_ns)
    cause = Cause.UNKNOWN
    phase = None
    if growth:
        name, grown = max(growth.items(), key=lambda kv: kv[1])
        if grown >= GROWTH_SHARE * per_step:
            cause = {
                "data": Cause.DATALOADER,
                "compute": Cause.COMPUTE,
                "untracked": Cause.HOST_STALL,
                "run_queue": Cause.HOST_STALL,
                "transfer": Cause.COMMUNICATION,
            }[name]
            if name == "data":
                phase = "data"
            elif name == "compute":
                phase = COMPONENTS[1 + int(np.argmax(d[1:4]))]
    evidence: dict[str, Any] = {
        "unexplained_ms_per_step": _ms(per_step),
        "job_step_ms": _ms(acc.wall_ns / max(acc.steps, 1)),
        "healthy_step_ms": _ms(acc.pace_ns),
        "growth_ms_per_step": {k: _ms(v) for k, v in growth.items()},
        "ranks_behind": len(behind),
        **({"knock_on_ranks": list(knock_on)} if knock_on else {}),
        **{k: v for k, v in l1.evidence().items() if k in ("onset_step", "spike_steps")},
    }
    # One rank behind whose own change explains the loss names the fault (a straggler's cause):
    # the loss is that rank's (a rank alone in its role, with one window of own past, has no score
    # of its own). Like the job's loss, it opens only when held for two windows.
    own = _explains(l2, behind, per_step) if cause in STRAGGLER_CAUSES else None
    rank = None
    if own is not None and own[0] not in named:
        rank = own[0]
        evidence["behind_ms_per_step"] = _ms(own[1])
        evidence["basis"] = "own past"
    return Finding(
        cause=cause.value,
        rank=rank,
        ranks=behind,
        group=None,
        phase=phase,
        kernel=None,
        score=score,
        slowdown_pct=100.0 * unexplained / acc.wall_ns,
        subject=JOB_SUBJECT if rank is None else f"rank:{rank}",
        evidence=evidence,
        lost_ns=unexplained,
        wall_ns=acc.wall_ns,
        job_loss=True,
    )


def _explains(l2: PhaseResult, behind: tuple[int, ...], per_step_ns: float) -> tuple[int, float] | None:
    """``(rank, change ns per step)`` of the rank of ``behind`` when it is the only one, has no
    score of its own (no peers in its role, one window of own past: nothing judged its change
    against noise, so nothing cleared it) and its change against its own past covers
    :data:`GROWTH_SHARE` of the job's unexplained loss per step (``per_step_ns``); else None."""
    if len(behind) != 1:
        return None
    i = int(np.flatnonzero(l2.rank == behind[0])[0])
    change = float(l2.behind_ns[i])
    return (behind[0], change) if np.isnan(l2.score[i]) and change >= GROWTH_SHARE * per_step_ns else None


def _ranks_behind(l2: PhaseResult) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ranks behind, and the ranks behind that are their knock-on.

    Behind: self time grown against its own past, beyond the job's common change, by the floor
    and by more than its noise (:func:`~argus.analyzer.phase.fell_behind`); none when every rank
    slowed alike (the job is slower, no rank stands out). Knock-on: behind by under
    :data:`~argus.analyzer.causes.HIDDEN_SHARE` of the most-behind rank's change (the ranks that
    wait for a straggler on a shared host lose some of their cores to it; ranks slow alike all
    stay). Both sorted by rank.
    """
    if l2.rank.size == 0:
        return (), ()
    fell = fell_behind(l2)
    if not np.any(fell):
        return (), ()
    change = l2.behind_ns
    small = fell & (change < HIDDEN_SHARE * float(np.max(change[fell])))
    return tuple(int(r) for r in l2.rank[fell & ~small]), tuple(int(r) for r in l2.rank[small])


def _ms(ns: float) -> float | None:
    return None if not np.isfinite(ns) else round(ns / 1e6, 3)
