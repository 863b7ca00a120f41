"""Cause attribution: the levels' results of one window → findings with one cause each (docs/design.md §6.9).

Order of the rules, each applied to what the earlier ones left:

1. ``unresponsive`` — from :mod:`argus.analyzer.liveness`; those ranks leave
   every other comparison.
2. Straggler ranks — L2 self-time score or L3 compute-kernel score >= 0.5 (the
   lifecycle opens a diagnosis at 1 and keeps it down to 0.5). A rank's L3 score is
   the highest of its kernels', which chance alone lifts: it makes the rank a
   candidate when, as the single score equally unlikely by chance
   (:func:`argus.analyzer.robust.highest_of`), it is >= 0.5, or, for the ranks of
   an open diagnosis, as it is. Each gets one of:

   * ``throttling`` — it runs on a GPU whose SM clock is at least
     :data:`CLOCK_DROP` below its peers', or that reports thermal/power-brake
     reasons in most samples while its peers do not;
   * ``dataloader`` — the ``data`` phase carries at least half of its excess;
   * ``host_stall`` or ``compute`` (:func:`_stall_or_compute`) — ``host_stall`` when the
     extra time sits in untracked host time, or when the rank spent it runnable but
     waiting for a CPU held by other processes (its run-queue delay beyond what its own
     CPU work explains, :func:`_starved`); else by a majority of three votes: is the extra
     time spent on the CPU (process CPU time against the ranks that do the same work, GC
     pauses), does it come in spikes on a few steps or evenly, and did its kernels get slower.

   A straggler hidden behind the strongest one, or behind a strong one that fell
   behind the others (its excess under half of that one's, step by step;
   :func:`_drop_hidden`), is that one's knock-on and is not named, whatever its
   score: the ranks waiting for a straggler on a shared host slow down too.
   When more than :data:`MAX_INDIVIDUAL` ranks share a cause, they become one
   finding with ``rank = None`` and every rank listed. A straggler compared
   against fewer than :data:`MIN_REFERENCE` healthy ranks ``needs_confirmation``;
   if, besides, half the compared ranks or more look slow (2 of 4), it is
   ``ambiguous`` (the lifecycle then asks for a strong score held for two windows);
   never in a role of two, whose comparison has a side (the rank its partner waited for).
3. ``communication`` — a process group with long transfers and no late
   arrival (:func:`argus.analyzer.collectives.slow_links`); L3 adds the
   communication kernel of its ranks that is slowest against its peers. A group
   judged against its own past only is not a slow link when its ranks on one host
   waited for a CPU, beyond their own work's wait, summed, at least as long per step
   as its extra transfers cost (a busier host: :func:`_links`). Only
   when a window has no collective records at all (an imported kernel trace)
   do slower communication kernels alone make the finding, and then only
   while no rank is a compute straggler: a straggler makes its peers'
   communication kernels *longer*, because they include the wait.

``slowdown_pct`` of a finding is its window's estimate; a diagnosis's is
``100 · lost / wall`` over its span, from the lost-time shares of
:mod:`argus.analyzer.loss` (each finding carries ``waited_ns``, how long the job
waited for it per step, which those shares are cut by). Roles: ranks are
compared only within their role (:mod:`argus.analyzer.roles`); the role goes
into the evidence.

A diagnosis's ``score`` is the latest window's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from argus.analyzer import dense
from argus.analyzer.collectives import LinkFinding
from argus.analyzer.findings import KEEP_SCORE, Finding
from argus.analyzer.host import HostResult, starved_wait
from argus.analyzer.iteration import IterationResult
from argus.analyzer.kernels import KernelScores
from argus.analyzer.liveness import Unresponsive
from argus.analyzer.phase import COMPONENTS, PAIR, SPIKE_REL, PhaseResult, fell_behind
from argus.analyzer.robust import highest_of, row_nanmedian
from argus.analyzer.window import Window
from argus.diagnosis import Cause

__all__ = ["CLOCK_DROP", "CPU_SHARE", "MAX_INDIVIDUAL", "STARVED_SHARE", "attribute"]

#: More ranks than this with one cause become one many-rank finding.
MAX_INDIVIDUAL = 4
#: A GPU clock this much below the peers' median is throttling.
CLOCK_DROP = 0.05
#: Extra CPU time below this share of the extra self time means the extra time was not CPU work.
CPU_SHARE = 0.5
#: Run-queue delay beyond what its CPU time explains, at this share of a rank's extra self time or
#: more: the rank was starved of CPU by other processes on its host (``host_stall``).
STARVED_SHARE = 0.5
#: With fewer healthy ranks than this as the reference, one window cannot open a diagnosis.
MIN_REFERENCE = 4
#: A rank's median step excess (from the fault's onset) below this share of its mean excess: the
#: excess comes in a minority of steps (pauses), not a steady slowdown. The median, not the
#: share of the worst steps, because per-step noise concentrates any excess in some steps.
SPIKY_TYPICAL = 0.5
#: A straggler whose lead over a stronger one, summed over the window's steps, is under this share
#: of the stronger one's lead over it hid behind it (:func:`_drop_hidden`). Two equally slow ranks
#: lead each other alike (a ratio near 1); a rank the job never waited for, near 0.
HIDDEN_SHARE = 1 / 3
_COMPUTE_PHASES = ("forward", "backward", "optimizer")


def _r(x: float, nd: int = 3) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _ms(ns: float) -> float | None:
    return _r(ns / 1e6)


class _Context:
    """Lookups shared by the rules of one window."""

    def __init__(self, w: Window, l2: PhaseResult, l3: KernelScores, host: HostResult) -> None:
        self.w, self.l2, self.l3, self.host = w, l2, l3, host
        self.l2_index = {int(r): i for i, r in enumerate(l2.rank)}
        self.role = l2.roles.of(l2.rank)
        self.group_of = _groups_of(w)
        gpu_ranks = set(w.status.rank[w.status.has_gpu].tolist()) if w.status.rank.size else set()
        gpu_ranks |= set(host.rank[host.sm_clock_mhz > 0].tolist())
        self.gpu = gpu_ranks
        healthy = l2.rank[l2.healthy] if l2.rank.size else host.rank
        peer = np.isin(host.rank, healthy)
        if not np.any(peer):
            peer = np.ones(host.rank.size, bool)
        self.peer_cpu = float(np.median(host.cpu_frac[peer])) if host.rank.size else np.nan
        # Per rank of L2, the CPU share of the ranks that do its work: its role's healthy ranks
        # (a pipeline's stages do different work), in a role of two its partner.
        self._work_cpu: dict[int, float] = {}
        if host.rank.size and l2.rank.size:
            cpu_of = dict(zip(host.rank.tolist(), host.cpu_frac.tolist(), strict=True))
            for g in np.unique(self.role).tolist():
                members = l2.rank[self.role == g].tolist()
                if len(members) == PAIR:
                    pairs = zip(members, members[::-1], strict=True)
                    self._work_cpu.update({r: cpu_of[o] for r, o in pairs if o in cpu_of})
                    continue
                ok = [cpu_of[r] for r in l2.rank[(self.role == g) & l2.healthy].tolist() if r in cpu_of]
                if ok:
                    self._work_cpu.update(dict.fromkeys(members, float(np.median(ok))))
        self.peer_gc = float(np.median(host.gc_frac[peer])) if host.rank.size else np.nan
        cpu = host.cpu_frac[peer]
        self.cpu_noise = 1.4826 * float(np.median(np.abs(cpu - np.median(cpu)))) if cpu.size else np.inf
        # Run-queue delay the peers pay per unit of CPU time they get: on a busy host every
        # runnable thread waits about alike for each slice it runs, so a rank with more CPU
        # work also waits more; only the wait beyond that is the host's doing (starved).
        known = peer & np.isfinite(host.wait_frac)
        self.peer_wait = float(np.median(host.wait_frac[known])) if np.any(known) else np.nan
        self.wait_per_cpu = (
            float(np.median(host.wait_frac[known] / np.maximum(host.cpu_frac[known], 1e-3)))
            if np.any(known)
            else np.nan
        )
        starved = host.wait_frac[known] - host.cpu_frac[known] * self.wait_per_cpu
        self.starved_noise = (
            1.4826 * float(np.median(np.abs(starved - np.median(starved)))) if starved.size else np.inf
        )
        on_gpu = peer & (host.sm_clock_mhz > 0)
        self.peer_clock = float(np.median(host.sm_clock_mhz[on_gpu])) if np.any(on_gpu) else np.nan
        self.peer_throttled = float(np.median(host.throttled_frac[on_gpu])) if np.any(on_gpu) else 0.0
        # Per rank, its compute kernel that scores highest: (score, kernel, W1 excess, mean, peers' mean).
        self.top_kernel: dict[int, tuple[float, int, float, float, float]] = {}
        #: Per rank, its top compute-kernel score as the single score as unlikely by chance
        #: (:func:`~argus.analyzer.robust.highest_of` of its kernels scored): what makes it a candidate.
        self.top_kernel_alone: dict[int, float] = {}
        rows = np.flatnonzero(~l3.collective & np.isfinite(l3.score))
        if rows.size:
            # Per rank (ascending), its highest-scoring row, the first of ties; and its rows scored.
            ranks, of_rank, scored = dense.unique_all(l3.rank[rows])
            top = np.full(ranks.size, -np.inf)
            np.maximum.at(top, of_rank, l3.score[rows])
            at_top = l3.score[rows] == top[of_rank]
            best = np.full(ranks.size, l3.rank.size, np.intp)
            np.minimum.at(best, of_rank[at_top], rows[at_top])
            alone = highest_of(l3.score[best], scored)
            self.top_kernel_alone = dict(zip(l3.rank[best].tolist(), alone.tolist(), strict=True))
            for j in best.tolist():
                self.top_kernel[int(l3.rank[j])] = (
                    float(l3.score[j]),
                    int(l3.kernel[j]),
                    float(l3.w1_excess_ns[j]),
                    float(l3.mean_ns[j]),
                    float(l3.ref_mean_ns[j]),
                )

    @cached_property
    def step_shares(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """:func:`step_shares` of every rank of L2, by its index there."""
        return step_shares(self.l2.excess_matrix)

    def work_cpu(self, rank: int) -> float:
        """The CPU share of the ranks that do ``rank``'s work (its role's healthy ranks, its partner
        in a role of two; every healthy rank where its role has none): what its own is compared with."""
        return self._work_cpu.get(rank, self.peer_cpu)

    def role_counts(self, i: int) -> tuple[int, int, int]:
        """Of rank index ``i``'s role in L2: ranks compared, those looking slow, healthy.

        Looking slow: at the keep score (:data:`KEEP_SCORE`) and not hidden behind rank ``i``
        (:func:`_hidden_behind`: the job waited for ``i`` at the steps the other was late, and
        would have had it been on time). A rank that waits for a straggler on a shared host slows
        a little too (the straggler's extra work takes its cores): that is ``i``'s knock-on, not a
        second slow rank that would leave the reference in doubt."""
        l2 = self.l2
        same = self.role == self.role[i]
        scored = same & np.isfinite(l2.score)
        slow = scored & (l2.score >= KEEP_SCORE)
        x = l2.excess_filled
        hidden = [j for j in np.flatnonzero(slow).tolist() if j != i and _hidden_behind(x, j, [i]) == i]
        return int(np.sum(scored)), int(np.sum(slow)) - len(hidden), int(np.sum(l2.healthy & same))

    def throttle(self, rank: int) -> dict[str, Any] | None:
        i = self.host.lookup(rank)
        if i is None or rank not in self.gpu or not np.isfinite(self.peer_clock) or self.peer_clock <= 0:
            return None
        clock = float(self.host.sm_clock_mhz[i])
        drop = 1.0 - clock / self.peer_clock
        reasons = float(self.host.throttled_frac[i])
        if drop >= CLOCK_DROP or (reasons >= 0.5 and self.peer_throttled < 0.1):
            return {
                "sm_clock_mhz": _r(clock, 0),
                "peer_sm_clock_mhz": _r(self.peer_clock, 0),
                "clock_drop_pct": _r(100 * drop, 1),
                "throttled_sample_share": _r(reasons, 2),
                "throttle_reasons": int(self.host.reasons[i]),
            }
        return None


def _straggler(ctx: _Context, rank: int) -> Finding | None:
    l2 = ctx.l2
    i = ctx.l2_index.get(rank)
    l2_score = float(l2.score[i]) if i is not None and np.isfinite(l2.score[i]) else 0.0
    top = ctx.top_kernel.get(rank)
    l3_score = top[0] if top else 0.0
    score = max(l2_score, l3_score)
    if score < KEEP_SCORE:
        return None
    ev: dict[str, Any] = {}
    comp = np.zeros(len(COMPONENTS))
    extra_self_frac = np.nan
    if i is not None:
        comp = l2.component_excess_ns[i]
        extra_self_frac = float(l2.excess_ns[i] / l2.step_ns[i]) if l2.step_ns[i] > 0 else np.nan
        ev.update(
            {
                "l2_score": _r(l2_score),
                "compared_with": l2.basis[i],
                "role": l2.roles.label(rank),
                "excess_ms_per_step": _ms(l2.excess_ns[i]),
                "phase_excess_ms": {c: _ms(v) for c, v in zip(COMPONENTS, comp, strict=True)},
                "self_ms": _ms(l2.self_ns[i]),
                "peer_self_ms": _ms(l2.ref_self_ns[i]),
                "step_ms": _ms(l2.step_ns[i]),
                "wait_ms": _ms(l2.wait_ns[i]),
                "peer_wait_ms": _ms(l2.ref_wait_ns[i]),
                "steps_compared": int(l2.steps[i]),
            }
        )
        ev.update(_stalls(l2, i))
    kernel = None
    if top:
        kernel = ctx.l3.kernel_names[top[1]]
        ev.update(
            {
                "l3_score": _r(l3_score),
                "kernel": kernel,
                "kernel_w1_excess_us": _r(top[2] / 1e3),
                "kernel_mean_us": _r(top[3] / 1e3),
                "peer_kernel_mean_us": _r(top[4] / 1e3),
            }
        )
        if l3_score < 1.0:
            kernel = None
    pos = np.maximum(comp, 0.0)
    total = float(pos.sum())
    cause: Cause
    throttle = ctx.throttle(rank)
    if throttle is not None:
        cause = Cause.THROTTLING
        ev.update(throttle)
    elif total > 0 and pos[0] >= 0.5 * total:
        cause = Cause.DATALOADER
    else:
        cause = _stall_or_compute(ctx, rank, i, pos, total, extra_self_frac, l3_score, ev)
    phase = _phase(cause, comp)
    waited: tuple[float, ...] = ()
    if i is not None:
        mask = l2.rank == rank
        slowdown = l2.slowdown(mask).pct
        waited = tuple(l2.waited(mask).tolist())
    else:
        slowdown = _kernel_slowdown(ctx, rank, ev)
    thin = False
    ambiguous = False
    if i is not None and l2_score >= l3_score:
        compared, slow, healthy = ctx.role_counts(i)
        # Own-past evidence, or peers too few to be sure: one window is not enough.
        thin = l2.basis[i] == "own past" or healthy < MIN_REFERENCE
        # Half the role or more looks slow against a thin reference (2 of 4): the one-sided rule is
        # at its breakdown point, and on a shared host the scheduler slows ranks in such sets (two
        # ranks sharing a core with another process). Not so against the role's best ranks: there
        # the ranks behind are alike, by more than their spread and beyond their scheduling delay;
        # nor in a role of two, whose comparison has a side: the rank its partner waited for at the
        # synchronisation points they share (its partner's score is the negative of its own).
        pair = int(np.count_nonzero(ctx.role == ctx.role[i])) == PAIR
        ambiguous = l2.basis[i] == "peers" and not pair and healthy < MIN_REFERENCE and 2 * slow >= compared
        if ambiguous:
            ev["ranks_looking_slow"] = f"{slow} of {compared}"
    return Finding(
        cause=cause.value,
        rank=rank,
        ranks=(rank,),
        group=ctx.group_of.get(rank),
        phase=phase,
        kernel=kernel,
        score=score,
        slowdown_pct=slowdown,
        subject=f"rank:{rank}",
        evidence=ev,
        waited_ns=waited,
        needs_confirmation=thin,
        ambiguous=ambiguous,
    )


def _stalls(l2: PhaseResult, i: int) -> dict[str, Any]:
    """``spiky`` evidence: the rank's excess comes in stalls (steps well above its usual level)."""
    e = l2.excess_matrix[i]
    e = e[np.isfinite(e)]
    if e.size == 0:
        return {}
    ref = float(l2.ref_step_ns[i]) if np.isfinite(l2.ref_step_ns[i]) else float(np.median(l2.step_ns))
    big = np.sort(e[e >= SPIKE_REL * ref])[::-1]
    share = float(big.sum() / e.sum()) if e.sum() > 0 else 0.0
    spiky = bool(big.size >= 1 and share >= 0.5 and big.size <= max(1, e.size // 3))
    out: dict[str, Any] = {"spiky": spiky}
    if spiky:
        out["stalls"] = int(big.size)
        out["stall_ms"] = [_ms(v) for v in big[:10]]
    return out


def step_shares(excess: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """How each rank's step excess is spread over its steps, from the fault's onset: for all ranks
    at once (a window of 10,000 ranks has thousands of candidates).

    The onset is a rank's first step whose excess reaches half its largest: a steady slowdown
    that began late in the window leaves its excess in the last steps, which is no spike.

    Args:
        excess: Per rank (rows) and step (columns, in step order), the step's excess, ns; NaN
            where the rank has no such step. Shape ``(ranks, steps)``.

    Returns:
        ``(spiky, typical)``, each of shape ``(ranks,)``: *spiky*, the share of the rank's
        positive excess carried by its worst third of steps (1/3 = even, 1 = spikes; NaN when it
        has no positive excess); *typical*, its median signed excess over its mean (1 = steady,
        0 = spikes; a step faster than its reference counts below zero, so noise around a steady
        slowdown leaves the median near the mean; NaN when the largest or the mean excess is not
        positive).
    """
    n, m = excess.shape
    if m == 0:
        return np.full(n, np.nan), np.full(n, np.nan)
    finite = np.isfinite(excess)
    x = np.where(finite, excess, -np.inf)
    largest = x.max(axis=1, initial=-np.inf)
    # The onset: the first finite step reaching half the largest (the largest itself, at worst).
    onset = np.argmax(finite & (x >= 0.5 * largest[:, None]), axis=1)
    tail = finite & (np.arange(m)[None, :] >= onset[:, None])
    count = tail.sum(axis=1)
    typical = np.full(n, np.nan)
    mean = np.where(tail, excess, 0.0).sum(axis=1) / np.maximum(count, 1)
    ok = (largest > 0) & (mean > 0)
    if np.any(ok):
        median = row_nanmedian(np.where(tail[ok], excess[ok], np.nan))
        typical[ok] = median / mean[ok]
    positive = np.where(tail, np.maximum(excess, 0.0), 0.0)
    ordered = -np.sort(-positive, axis=1)  # largest first; steps before the onset count as 0
    worst = np.take_along_axis(np.cumsum(ordered, axis=1), np.maximum(-(-count // 3), 1)[:, None] - 1, axis=1)
    total = positive.sum(axis=1)
    spiky = np.where(largest > 0, worst[:, 0] / np.where(total > 0, total, 1.0), np.nan)
    return spiky, typical


def _stall_or_compute(
    ctx: _Context,
    rank: int,
    i: int | None,
    pos: np.ndarray,
    total: float,
    extra_self_frac: float,
    l3_score: float,
    ev: dict[str, Any],
) -> Cause:
    """``host_stall`` or ``compute``: where the time went, then how it was spent.

    * Location first: when untracked host time (the step outside data, forward, backward
      and optimizer: the training loop's own host code, a checkpoint, a blocked thread)
      carries half the excess or more, it is ``host_stall``, whether the host slept or
      worked (host work before a barrier is no slower compute).
    * Then the run queue: a CPU-starved rank (:func:`_starved`) is ``host_stall``.
    * Inside the compute phases, by votes: CPU (CPU ranks, when the excess is well above
      the peers' CPU-accounting noise: extra CPU below :data:`CPU_SHARE` of the extra self
      time votes stall, else compute; GC pauses explaining half of it vote stall) and
      spikiness (a median step excess under :data:`SPIKY_TYPICAL` of the mean votes stall:
      pauses, not slower work); kernels that got slower vote compute. The
      majority wins; a tie goes to compute.
    """
    host = ctx.host
    spiky = _spiky_vote(ctx, i, ev)
    h = host.lookup(rank)
    starved = _starved(ctx, rank, h, extra_self_frac, ev)
    if total > 0 and pos[-1] >= 0.5 * total and l3_score < 1.0:
        return Cause.HOST_STALL
    if starved:
        return Cause.HOST_STALL
    votes: list[bool] = []  # True = stall
    cpu_vote: bool | None = None
    if h is not None and rank not in ctx.gpu and np.isfinite(extra_self_frac) and extra_self_frac > 0:
        extra_cpu = float(host.cpu_frac[h]) - ctx.work_cpu(rank)
        extra_gc = float(host.gc_frac[h]) - ctx.peer_gc
        rho = extra_cpu / extra_self_frac
        ev.update(
            {
                "cpu_pct": _r(100 * host.cpu_frac[h], 1),
                "peer_cpu_pct": _r(100 * ctx.work_cpu(rank), 1),
                "extra_cpu_share": _r(rho, 2),
                "gc_pct": _r(100 * host.gc_frac[h], 2),
                "peer_gc_pct": _r(100 * ctx.peer_gc, 2),
            }
        )
        if extra_gc >= 0.5 * extra_self_frac:
            cpu_vote = True
        elif extra_self_frac >= 4 * ctx.cpu_noise:
            cpu_vote = rho < CPU_SHARE
    if cpu_vote is not None:
        votes.append(cpu_vote)
    if spiky is not None:
        votes.append(spiky)
    if l3_score >= 1.0:
        votes.append(False)
    return Cause.HOST_STALL if 2 * sum(votes) > len(votes) else Cause.COMPUTE


def _starved(ctx: _Context, rank: int, h: int | None, extra_self_frac: float, ev: dict[str, Any]) -> bool:
    """True when rank ``rank`` (host index ``h``) spent at least :data:`STARVED_SHARE` of its extra
    self time runnable but waiting for a CPU, beyond the wait its own work explains, and that
    beyond the peers' noise: a CPU-starved rank, slowed by other processes on its host, not by its
    own work. Records the run-queue evidence in ``ev``.

    What its own work explains: :func:`~argus.analyzer.host.starved_wait` (the one owner of the
    rule): its CPU time up to that of the ranks that do its work (:meth:`_Context.work_cpu`) at
    its peers' wait per CPU second, its extra CPU time at the wait per CPU second it got itself.
    The starved share is the wait past that, at most its extra self time less its extra CPU time
    and that time's wait at its own rate (a rank's threads wait for a CPU outside its self time
    too: a rank whose extra work and its wait explain all its extra self time is not starved,
    whatever else it waited). ``beyond`` (its wait past all its CPU time at its peers' rate) must
    stand out from the peers' noise of the same. Both measures of its wait are fractions of the
    wall time; ``extra_self_frac`` is its extra self time as one.

    CPU ranks only, as the CPU vote: on a GPU rank the host threads wait while kernels run, and
    their run-queue delay need not lengthen the step.
    """
    if (
        h is None
        or rank in ctx.gpu
        or not np.isfinite(ctx.host.wait_frac[h])
        or not np.isfinite(ctx.peer_wait)
    ):
        return False
    wait, cpu = float(ctx.host.wait_frac[h]), float(ctx.host.cpu_frac[h])
    beyond = wait - cpu * ctx.wait_per_cpu
    ev["cpu_wait_pct"] = _r(100 * wait, 1)
    ev["peer_cpu_wait_pct"] = _r(100 * ctx.peer_wait, 1)
    if not np.isfinite(extra_self_frac) or extra_self_frac <= 0:
        return False
    # The wait its own work does not explain, and its extra self time less its extra CPU work and
    # the wait that came with it at its own rate (not all of a rank's wait is in its self time).
    work = max(cpu - ctx.work_cpu(rank), 0.0) * (1.0 + wait / cpu) if cpu > 0 else 0.0
    host_wait = float(starved_wait(wait, cpu, ctx.work_cpu(rank), ctx.wait_per_cpu))
    unexplained = min(host_wait, extra_self_frac - work)
    ev["starved_share"] = _r(unexplained / extra_self_frac, 2)
    starved = unexplained >= STARVED_SHARE * extra_self_frac and beyond >= 4 * ctx.starved_noise
    if starved:
        ev["cpu_starved"] = True
    return bool(starved)


def _spiky_vote(ctx: _Context, i: int | None, ev: dict[str, Any]) -> bool | None:
    """True when rank ``i``'s excess comes in pauses (its typical share, :func:`step_shares`, is
    under :data:`SPIKY_TYPICAL`); None when unknown.

    Records ``excess_in_worst_third_of_steps`` and ``median_to_mean_excess`` in ``ev``.
    """
    if i is None:
        return None
    spiky, typical = ctx.step_shares
    if np.isfinite(spiky[i]):
        ev["excess_in_worst_third_of_steps"] = _r(spiky[i], 2)
    if not np.isfinite(typical[i]):
        return None
    ev["median_to_mean_excess"] = _r(typical[i], 2)
    return bool(typical[i] < SPIKY_TYPICAL)


def _phase(cause: Cause, comp: np.ndarray) -> str | None:
    if cause is Cause.DATALOADER:
        return "data"
    if cause is Cause.HOST_STALL:
        j = int(np.argmax(comp))
        return None if comp[j] <= 0 or COMPONENTS[j] == "untracked" else COMPONENTS[j]
    idx = [COMPONENTS.index(p) for p in _COMPUTE_PHASES]
    j = idx[int(np.argmax(comp[idx]))]
    return COMPONENTS[j] if comp[j] > 0 else None


def _kernel_slowdown(ctx: _Context, rank: int, ev: dict[str, Any]) -> float:
    """Extra kernel time of ``rank`` in slower-than-peers compute kernels, percent of the window.

    Without step records the job waited, at most, for that extra time; the numbers go into ``ev``.
    """
    sel = (ctx.l3.rank == rank) & ~ctx.l3.collective & (np.nan_to_num(ctx.l3.score) >= 1.0)
    window_ns = max(ctx.w.end_ns - ctx.w.start_ns, 1)
    extra = max(float(ctx.l3.excess_ns[sel].sum()), 0.0)
    ev.update({"extra_kernel_ms_in_window": _ms(extra), "window_ms": _ms(window_ns)})
    return float(min(100.0, 100.0 * extra / window_ns))


def _groups_of(w: Window) -> dict[int, str]:
    """Per rank, the process group most of its collectives of the window were in."""
    c = w.collectives
    rows = c.in_window
    if not np.any(rows):
        return {}
    n_groups = max(len(c.group_names), 1)
    keys, counts = dense.unique_counts(c.rank[rows].astype(np.int64) * n_groups + c.group[rows])
    rank, group = keys // n_groups, keys % n_groups
    order = np.lexsort((-counts, rank))
    first = order[np.r_[True, np.diff(rank[order]) != 0]]
    return {int(r): c.group_names[int(g)] for r, g in zip(rank[first], group[first], strict=True)}


def _drop_hidden(found: list[Finding], l2: PhaseResult) -> list[Finding]:
    """Drop the stragglers that hid behind another one (in a window with one at the opening score
    of 1).

    The job waits at each step for its slowest rank, so a rank costs it time only at the steps
    where it is later than the others. Rank ``r`` hid behind straggler ``s`` when, summed over the
    window's steps, ``s``'s excess led ``r``'s by more than all of ``r``'s excess, and ``r``'s led
    ``s``'s by under :data:`HIDDEN_SHARE` of that: the job waited for ``s``, and would have waited
    for it had ``r`` been on time. ``s`` is the strongest straggler (by score) or any straggler
    at the opening score that fell behind the others (:func:`fell_behind`: its own past less the
    job's common change; extra work of its own, not the host's slowdown of every rank), and ``r``
    hides behind it whatever ``r``'s score: the score says how sure a rank is behind its own
    reference, the excess what the job waited for (a rank with a quiet past scores high on the
    little it slowed while waiting for a stage whose noisy steps score lower). A pipeline's slow
    stage, recorded: ``tests/data/real_runs/stage``. The relation orders the ranks by their summed
    excess (``s``'s exceeds ``r``'s), so the straggler a rank hid behind, or the one that one hid
    behind in turn, stays. The ranks that wait for a straggler grow their own time too where they
    share its host (its extra work takes the cores theirs runs on): that growth is the kept
    straggler's knock-on (``knock_on_ranks``), not a second fault. Ranks slow alike lead each
    other alike and all stay; a second fault under half as large as the first is named
    once the first is gone.
    """
    rows = {int(r): i for i, r in enumerate(l2.rank.tolist())}
    row = {id(f): rows[f.rank] for f in found if f.rank is not None and f.rank in rows}
    strong = sorted((g for g in found if id(g) in row and g.score >= 1.0), key=lambda g: -g.score)
    if not strong:
        return found
    x = l2.excess_filled
    fell = fell_behind(l2)
    # The strongest straggler, and every strong one that fell behind the others.
    refs = [row[id(g)] for k, g in enumerate(strong) if k == 0 or fell[row[id(g)]]]
    owner: dict[int, int] = {}  # hidden rank's row -> row of the straggler it hid behind
    for f in found:
        s = _hidden_behind(x, row[id(f)], refs) if id(f) in row else None
        if s is not None:
            owner[row[id(f)]] = s
    out = [f for f in found if row.get(id(f)) not in owner]
    # Ranks that fell behind their own past with no finding of their own (the job-level
    # finding's ranks) are a straggler's knock-on by the same rule.
    named = {row[id(f)] for f in out if id(f) in row}
    for i in np.flatnonzero(fell).tolist():
        s = _hidden_behind(x, i, refs) if i not in named and i not in owner else None
        if s is not None:
            owner[i] = s
    hidden: dict[int, list[int]] = {}  # kept straggler's row -> rows hidden behind it
    for i, first in owner.items():
        s = first
        while s in owner:  # it hid behind one that hid in turn (each has more summed excess)
            s = owner[s]
        hidden.setdefault(s, []).append(i)
    for k, f in enumerate(out):
        mine = hidden.get(row[id(f)], []) if id(f) in row else []
        if not mine:
            continue
        # Without the straggler its knock-on goes too: the job would have waited only for the
        # slowest of the rest (the hidden ranks of every straggler gone with it).
        rest = np.ones(x.shape[0], bool)
        rest[[*owner, row[id(f)]]] = False
        waited = np.maximum(x[row[id(f)]] - np.max(x[rest], axis=0, initial=0.0), 0.0)
        evidence = {**f.evidence, "knock_on_ranks": sorted(int(l2.rank[i]) for i in mine)}
        out[k] = replace(f, waited_ns=tuple(waited.tolist()), evidence=evidence)
    return out


def _hidden_behind(x: NDArray[np.float64], i: int, refs: list[int]) -> int | None:
    """The first of the rows ``refs`` that row ``i`` of the excess ``x`` (rank, step) hid behind
    (:func:`_drop_hidden`), or None."""
    mine = x[i]
    for s in refs:
        if s == i:
            continue
        behind = float(np.sum(np.maximum(x[s] - mine, 0.0)))
        ahead = float(np.sum(np.maximum(mine - x[s], 0.0)))
        if behind > float(np.sum(mine)) and ahead < HIDDEN_SHARE * behind:
            return s
    return None


def _merge_many(found: list[Finding], l2: PhaseResult) -> list[Finding]:
    """Stragglers of one cause become one many-rank finding when there are more than
    :data:`MAX_INDIVIDUAL` of them, or when half of the compared ranks or more are behind."""
    by_cause: dict[str, list[Finding]] = {}
    for f in found:
        by_cause.setdefault(f.cause, []).append(f)
    out: list[Finding] = []
    compared = int(np.sum(np.isfinite(l2.score)))
    for cause, fs in by_cause.items():
        slow = sum(f.score >= 1.0 for f in fs)
        if slow <= MAX_INDIVIDUAL and not (slow >= 2 and 2 * slow >= compared):
            out.extend(fs)
            continue
        ranks = tuple(sorted(f.rank for f in fs if f.rank is not None))
        mask = np.isin(l2.rank, ranks)
        top = sorted(fs, key=lambda f: -f.score)
        phase = Counter(f.phase for f in fs).most_common(1)[0][0]
        kernel = Counter(f.kernel for f in fs).most_common(1)[0][0]
        slowdown = l2.slowdown(mask).pct if np.any(mask) else max(f.slowdown_pct for f in fs)
        out.append(
            Finding(
                cause=cause,
                rank=None,
                ranks=ranks,
                group=None,
                phase=phase,
                kernel=kernel,
                score=top[0].score,
                slowdown_pct=slowdown,
                subject="many",
                needs_confirmation=any(f.needs_confirmation for f in fs),
                ambiguous=any(f.ambiguous for f in fs),
                member_scores={int(f.rank): f.score for f in fs if f.rank is not None},
                waited_ns=tuple(l2.waited(mask).tolist()) if np.any(mask) else (),
                evidence={
                    "ranks_slow": len(ranks),
                    "top": [{"rank": f.rank, "score": _r(f.score)} for f in top[:10]],
                    "example": top[0].evidence,
                },
            )
        )
    return out


def _link_waited(w: Window, l2: PhaseResult, group: str, link: LinkFinding) -> tuple[float, ...]:
    """Per step column, the extra transfer time of ``group`` the job waited for, ns.

    What nobody waits for but the data movement is the least-blocked rank's blocked time in the
    group's instances (its last arrival waits for no one); the part of it beyond the reference
    transfer (``1 − reference / transfer``) is what the slow link costs each step. Overlapped
    calls that never blocked cost nothing.
    """
    t = l2.times
    c = w.collectives
    if t is None or group not in c.group_names or link.transfer_ns <= 0 or t.step.size == 0:
        return ()
    g = c.group_names.index(group)
    rows = np.flatnonzero((c.group == g) & c.in_window & (t.row_blocked_ns > 0))
    n_s = t.step.size
    if rows.size == 0:
        return tuple([0.0] * n_s)
    ri = np.searchsorted(t.rank, c.rank[rows])
    si = np.searchsorted(t.step, c.step[rows])
    ok = (ri < t.rank.size) & (si < n_s)
    ok &= (t.rank[np.minimum(ri, t.rank.size - 1)] == c.rank[rows]) & (
        t.step[np.minimum(si, n_s - 1)] == c.step[rows]
    )
    per = np.zeros((t.rank.size, n_s))
    np.add.at(per, (ri[ok], si[ok]), t.row_blocked_ns[rows][ok])
    members = np.isin(t.rank, dense.unique(c.rank[c.group == g]))
    least = np.min(per[members], axis=0) if np.any(members) else np.zeros(n_s)
    excess = max(0.0, 1.0 - link.reference_ns / link.transfer_ns)
    return tuple((least * excess).tolist())


def _links(
    w: Window,
    l2: PhaseResult,
    links: list[LinkFinding],
    l1: IterationResult,
    stragglers: dict[int, float],
    host_delay_ns: NDArray[np.float64] | None,
) -> list[Finding]:
    """Slow links as findings (module doc, rule 3).

    A link judged against its own past only (``basis`` ``history``: no group of its kind stands
    beside it now to share what the host does to all) is the host's, not the link's, when its
    ranks waited longer for a CPU than their own work explains (``host_delay_ns``, per rank of
    ``l2`` and step, against the job's healthy windows) by at least what the link's extra
    transfers cost each step: every transfer needs its ranks on a CPU, so a busier host
    lengthens them all; that lost time is the job-level finding's, whose cause then names the
    run queue. A ring's transfer passes through each of its ranks in turn, so it can wait for
    each one's delay: the bound is the delays summed over the group's ranks on one host, the
    most of any host (:func:`host_delay_bound`).
    """
    out = []
    for link in links:
        if link.score < KEEP_SCORE:
            continue
        waited = _link_waited(w, l2, link.group, link)
        members = w.status.groups.get(link.group)
        if members is None or members.size == 0:
            c = w.collectives
            g = c.group_names.index(link.group)
            members = dense.unique(c.rank[c.group == g])
        history = link.basis == "history" and bool(waited)
        if history and host_delay_bound(w, l2, members, host_delay_ns) >= float(np.mean(waited)):
            continue
        ranks = tuple(int(r) for r in np.sort(members))
        if any(stragglers.get(r, 0.0) >= link.score for r in ranks):
            continue  # a late rank that stands out more than the link: the rank, not the link
        out.append(
            Finding(
                cause=Cause.COMMUNICATION.value,
                rank=None,
                ranks=ranks,
                group=link.group,
                phase=None,
                kernel=None,
                score=link.score,
                slowdown_pct=l1.slowdown_pct,
                subject=f"group:{link.group}",
                waited_ns=waited,
                evidence={
                    "transfer_ms": _ms(link.transfer_ns),
                    "reference_transfer_ms": _ms(link.reference_ns),
                    "late_arrival_ms": _ms(link.late_ns),
                    "instances": link.instances,
                    "compared_with": link.basis,
                    **l1.evidence(),
                },
            )
        )
    return out


def host_delay_bound(
    w: Window, l2: PhaseResult, members: NDArray[np.int64], host_delay_ns: NDArray[np.float64] | None
) -> float:
    """The most run-queue delay a transfer among ``members`` can owe its ranks' host, ns per step:
    per host (``w.status.host``), the delays of the members on it summed (signed, so that ranks'
    noise about their healthy delay cancels as it adds up); the largest, at least 0. A member
    of unknown host counts alone. Summed per host, never over the job: a ring waits for each of
    its ranks in turn, but noise summed over thousands of ranks would excuse any link. CPU
    ranks only: a GPU rank's transfers run on its device, not waiting for a CPU (as
    :func:`_starved`). NaN without delays.
    """
    st = w.status
    if host_delay_ns is None or host_delay_ns.size != l2.rank.size or st.host.size != st.rank.size:
        return math.nan
    on = np.isin(l2.rank, members) & np.isfinite(host_delay_ns)
    host = np.full(l2.rank.size, -1, np.int64)
    if st.rank.size:
        at = np.minimum(np.searchsorted(st.rank, l2.rank), st.rank.size - 1)
        same = st.rank[at] == l2.rank
        host = np.where(same, st.host[at], -1)
        if st.has_gpu.size == st.rank.size:
            on &= ~(same & st.has_gpu[at])
    if not np.any(on):
        return math.nan
    # A rank of unknown host is a host of its own.
    host = np.where(host >= 0, host, -1 - np.arange(l2.rank.size))[on]
    _, idx = np.unique(host, return_inverse=True)
    return max(float(np.max(np.bincount(idx, weights=host_delay_ns[on]))), 0.0)


def _kernel_links(ctx: _Context, l1: IterationResult, taken: set[str]) -> list[Finding]:
    """Communication kernels slower on some ranks while nobody is a compute straggler."""
    l3 = ctx.l3
    sel = l3.collective & (np.nan_to_num(l3.score) >= KEEP_SCORE)
    if not np.any(sel):
        return []
    ranks = np.unique(l3.rank[sel])
    best = int(np.flatnonzero(sel)[np.argmax(l3.score[sel])])
    group = None
    for name, members in sorted(ctx.w.status.groups.items(), key=lambda kv: kv[1].size):
        if np.all(np.isin(ranks, members)):
            group = name
            break
    if group is not None and f"group:{group}" in taken:
        return []
    subject = f"group:{group}" if group is not None else "ranks:" + ",".join(str(r) for r in ranks)
    return [
        Finding(
            cause=Cause.COMMUNICATION.value,
            rank=int(ranks[0]) if ranks.size == 1 else None,
            ranks=tuple(int(r) for r in ranks),
            group=group,
            phase=None,
            kernel=l3.kernel_names[int(l3.kernel[best])],
            score=float(l3.score[best]),
            slowdown_pct=l1.slowdown_pct,
            subject=subject,
            evidence={
                "kernel_w1_excess_us": _r(l3.w1_excess_ns[best] / 1e3),
                "kernel_mean_us": _r(l3.mean_ns[best] / 1e3),
                "peer_kernel_mean_us": _r(l3.ref_mean_ns[best] / 1e3),
                **l1.evidence(),
            },
        )
    ]


def attribute(
    w: Window,
    *,
    l1: IterationResult,
    l2: PhaseResult,
    l3: KernelScores,
    host: HostResult,
    links: list[LinkFinding],
    unresponsive: list[Unresponsive],
    watched: Collection[int] = (),
    host_delay_ns: NDArray[np.float64] | None = None,
) -> list[Finding]:
    """Turn one window's level results into findings, one cause each (rules in the module doc).

    ``watched``: ranks of the job's open diagnoses; their top kernel counts at face value.
    ``host_delay_ns``: per rank of ``l2``, its run-queue delay per step beyond its own work's
    against the job's healthy windows (:meth:`~argus.analyzer.loss.JobProfile.rank_host_delay_ns`;
    NaN unknown; None: none known).

    Returns:
        Findings with ``score >= KEEP_SCORE``; the lifecycle decides which open or update diagnoses.
    """
    out: list[Finding] = []
    gone = set()
    for u in unresponsive:
        gone.add(u.rank)
        no_steps = w.steps.rank.size == 0
        out.append(
            Finding(
                cause=Cause.UNRESPONSIVE.value,
                rank=u.rank,
                ranks=(u.rank,),
                group=u.evidence.get("process_group"),
                phase=None,
                kernel=None,
                score=u.score,
                slowdown_pct=100.0 if (u.hung or no_steps) else l1.slowdown_pct,
                subject=f"rank:{u.rank}",
                evidence={"hung": u.hung, **u.evidence},
            )
        )
    ctx = _Context(w, l2, l3, host)
    candidates = set(l2.rank[np.nan_to_num(l2.score) >= KEEP_SCORE].tolist())
    # A rank's top kernel is the highest of its many: chance alone lifts it (robust.highest_of);
    # the ranks of an open diagnosis keep the plain threshold (the lifecycle's hysteresis).
    candidates |= {
        r
        for r, t in ctx.top_kernel.items()
        if (t[0] if r in watched else ctx.top_kernel_alone[r]) >= KEEP_SCORE
    }
    found = []
    for rank in sorted(candidates - gone):
        f = _straggler(ctx, int(rank))
        if f is not None:
            f.evidence.update(l1.evidence())
            found.append(f)
    out.extend(_merge_many(_drop_hidden(found, l2), l2))
    stragglers = {f.rank: f.score for f in found if f.rank is not None and f.score >= 1.0}
    comm = [_with_link_kernel(ctx, f) for f in _links(w, l2, links, l1, stragglers, host_delay_ns)]
    out.extend(comm)
    if not stragglers and w.collectives.rank.size == 0:
        out.extend(_kernel_links(ctx, l1, {f.subject for f in comm}))
    return out


def _with_link_kernel(ctx: _Context, f: Finding) -> Finding:
    """Name the communication kernel of a slow link's ranks that is slowest against its peers."""
    l3 = ctx.l3
    sel = l3.collective & np.isin(l3.rank, f.ranks) & np.isfinite(l3.score)
    if not np.any(sel):
        return f
    best = int(np.flatnonzero(sel)[np.argmax(l3.score[sel])])
    if l3.score[best] < KEEP_SCORE:
        return f
    evidence = {
        **f.evidence,
        "kernel_l3_score": _r(l3.score[best]),
        "kernel_mean_us": _r(l3.mean_ns[best] / 1e3),
        "peer_kernel_mean_us": _r(l3.ref_mean_ns[best] / 1e3),
    }
    return replace(f, kernel=l3.kernel_names[int(l3.kernel[best])], evidence=evidence)
