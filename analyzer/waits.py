"""Where each rank waited in each step, and the self time left: every synchronisation point counts.

A rank of a synchronous job spends each step either on its own work or blocked
at a synchronisation point — a collective (all-reduce, all-gather, broadcast,
barrier, ...) or a point-to-point ``recv``/``send` — waiting for the last
arrival and for the transfer. Whatever slows a rank's own work (compute, a
host stall, a slow batch) grows its *self time*; the time its peers spend
waiting for it grows their *blocked* time, not their self time. So a rank whose
lateness is fully explained by waiting on another (a pipeline stage blocked in
``recv`` on a slow upstream stage, a tensor-parallel partner waiting in every
all-reduce, a rank absorbing a peer's lateness at a barrier before forward)
keeps its self time: it is never the culprit. This is the wait-state view of
parallel performance analysis: Böhme, Geimer, Wolf and Arnold, "Identifying the
root causes of wait states in large-scale parallel applications", ICPP 2010,
attribute waiting time at each synchronisation to the delay of the late
process; here the delay itself is what remains of each rank's step once its
waits are taken out.

**Which rows blocked the rank.** A collective call returns at once when it is
asynchronous (DDP's gradient buckets, ``isend``, ``async_op=True``) and blocks
otherwise. The probe sees the issue and the completion of each; the rank was
*not* blocked on a row if it did anything else in between — issued another
collective, began or ended a phase. So a row blocked its rank from issue to end
exactly when no other event of that rank lies strictly inside that span, and,
for a collective, no other participant of the same instance was busy during
its call either (the same code runs on every rank: one rank computing through
it shows the call is asynchronous; the two ends of a transfer are different
calls, a blocking ``recv`` of an ``isend``). A call waited later (``isend``/``irecv`` and their ``wait()``:
``collectives.wait_ns``) blocked from the wait to its end, whatever the rank did
before. Calls the probe knows to be overlapped (DDP's gradient buckets,
``collectives.overlapped``) block only at the rank's last one of the step in
their group, when the rank's next event follows its end: at once (within
:data:`RESUME_NS`), or whenever it is the end of the backward phase, which waits for
every DDP bucket (the time from the call's end to it is DDP's copy-back of the
gradients and, on a busy host, the woken rank waiting for a core). One that ends
while the rank works on blocked nobody. Blocking spans of one rank
never overlap, so their sum is the rank's blocked time. Times of one rank share
its clock, so no offset correction is needed here.

**Components.** Per (rank, step) the self time splits into the four phases
(each minus the blocking spans issued inside it) and *untracked* host time (the
step outside phases, minus the spans issued outside any phase).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer import dense
from argus.analyzer.window import Collectives, Window
from argus.schema import PHASES

__all__ = ["COMPONENTS", "UNTRACKED", "StepTimes", "cells", "step_times"]

#: Components of a step's self time: the phases, then untracked host time.
COMPONENTS = (*PHASES, "untracked")
UNTRACKED = len(PHASES)
_TIME_BITS = 40  # relative times up to ~1,100 s share an int64 key with the rank index
#: A rank that waited for an overlapped call resumes within this long of its end, ns.
RESUME_NS = 5_000_000
_BACKWARD = PHASES.index("backward")


@dataclass(frozen=True)
class StepTimes:
    """Per (rank, step) times of one window; matrices are ``(n_ranks, n_steps)``, NaN where missing.

    Attributes:
        rank: Global ranks, sorted, shape ``(n,)``.
        step: Step numbers compared, sorted, shape ``(s,)``.
        step_ns: Step duration.
        end_ns: Step end, ns since the epoch (the rank's clock).
        blocked_ns: Time blocked at synchronisation points inside the step.
        self_ns: ``step_ns − blocked_ns``.
        comp_self_ns: Self time per component of :data:`COMPONENTS`, shape ``(5, n, s)``.
        synced: True where the rank recorded at least one synchronisation row in the step.
        row_blocked_ns: Per collective row of the window, the time it blocked its rank inside its
            step, ns (0 for rows that did not block, or of steps not laid out).
    """

    rank: NDArray[np.int64]
    step: NDArray[np.int64]
    step_ns: NDArray[np.float64]
    end_ns: NDArray[np.float64]
    blocked_ns: NDArray[np.float64]
    self_ns: NDArray[np.float64]
    comp_self_ns: NDArray[np.float64]
    synced: NDArray[np.bool_]
    row_blocked_ns: NDArray[np.float64]


def cells(
    ranks: NDArray[np.int64], step_cols: NDArray[np.int64], rank: NDArray[np.int64], step: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
    """(rank index, step column, found) of rows in the (rank, step) matrices."""
    ri = np.minimum(np.searchsorted(ranks, rank), max(ranks.size - 1, 0))
    si = np.minimum(np.searchsorted(step_cols, step), max(step_cols.size - 1, 0))
    ok = (ranks.size > 0) & (step_cols.size > 0)
    found = ok & (ranks[ri] == rank) & (step_cols[si] == step) if ok else np.zeros(rank.size, bool)
    return ri, si, found


def _event_keys(ri: NDArray[np.int64], t: NDArray[np.int64], t0: int) -> NDArray[np.int64]:
    rel = np.clip(t - t0, 0, (1 << _TIME_BITS) - 1)
    return (ri << _TIME_BITS) | rel


def blocking_rows(  # noqa: PLR0915  (one pass of array steps; its pieces share the arrays)
    w: Window, ranks: NDArray[np.int64], instance: NDArray[np.int64] | None = None
) -> NDArray[np.bool_]:
    """Per collective row of ``w``: True when it blocked its rank from :func:`block_start` to its end.

    See the module doc.

    Args:
        w: The window.
        ranks: Ranks laid out (rows of other ranks are False).
        instance: Instance index per row (:class:`~argus.analyzer.collectives.Decomposition`):
            when one participant of an instance did something else during its call, the call
            was asynchronous for every participant.
    """
    c, p = w.collectives, w.phases
    n = c.rank.size
    if n == 0 or ranks.size == 0:
        return np.zeros(n, bool)
    end = c.start_ns + c.dur_ns
    c_ri = np.searchsorted(ranks, c.rank)
    c_ok = (c_ri < ranks.size) & (ranks[np.minimum(c_ri, ranks.size - 1)] == c.rank)
    c_ri = np.where(c_ok, c_ri, 0)
    p_ri = np.searchsorted(ranks, p.rank)
    p_ok = (p_ri < ranks.size) & (ranks[np.minimum(p_ri, max(ranks.size - 1, 0))] == p.rank)
    p_end = p.start_ns + p.dur_ns
    times = [c.issue_ns[c_ok], p.start_ns[p_ok], p_end[p_ok]]
    owners = [c_ri[c_ok], p_ri[p_ok], p_ri[p_ok]]
    t0 = int(min(int(np.min(x)) for x in times if x.size))
    # Every event of every rank in (rank, time) order; a row's own issue is one of them, so the
    # event after it says whether the rank did anything before the row's end.
    keys = _event_keys(np.concatenate(owners), np.concatenate(times), t0)
    order = np.argsort(keys, kind="stable")
    events = keys[order]
    row_of = np.concatenate([np.flatnonzero(c_ok), np.full(keys.size - int(c_ok.sum()), -1)])[order]
    at = np.empty(n, np.int64)
    at[row_of[row_of >= 0]] = np.flatnonzero(row_of >= 0)
    hi = _event_keys(c_ri, end, t0)
    following = np.full(n, np.iinfo(np.int64).max)
    rows_ok = np.flatnonzero(c_ok)
    nxt = at[rows_ok] + 1
    # Events at the very same time as the issue are not "in between".
    lo = _event_keys(c_ri, c.issue_ns, t0)
    has = nxt < events.size
    following[rows_ok[has]] = events[nxt[has]]
    same_time = np.zeros(n, bool)
    same_time[rows_ok[has]] = events[nxt[has]] == lo[rows_ok[has]]
    if np.any(same_time):  # rare: step past events stamped at the issue instant
        idx = np.flatnonzero(same_time)
        later = np.searchsorted(events, lo[idx], side="right")
        ok2 = later < events.size
        following[idx] = np.where(ok2, events[np.minimum(later, events.size - 1)], np.iinfo(np.int64).max)
    busy = c_ok & (following < hi)
    # An asynchronous call waited later (isend/irecv and their wait()) blocked from the wait on:
    # busy only if the rank did something between the wait and the end.
    waited = c_ok & (c.waits > c.issue_ns)
    if np.any(waited):
        idx = np.flatnonzero(waited)
        after_wait = np.searchsorted(events, _event_keys(c_ri[idx], c.waits[idx], t0), side="right")
        nxt_wait = np.where(
            after_wait < events.size, events[np.minimum(after_wait, events.size - 1)], np.iinfo(np.int64).max
        )
        busy[idx] = nxt_wait < hi[idx]
    if instance is not None and instance.size == n:
        # One participant busy during its call: the collective did not block anyone (the same code
        # runs on every rank). Not so for a transfer, whose two ends are two different calls (a
        # blocking recv of an isend), nor for calls waited later, judged by their own wait.
        alike = ~waited & (c.peers < 0)
        busy_inst = np.zeros(int(instance.max()) + 1 if n else 0, bool)
        np.logical_or.at(busy_inst, instance[alike], busy[alike])
        busy |= busy_inst[instance] & alike
    blocking = ~busy & (end > block_start(c))
    overlapped = c.overlaps & c_ok
    if np.any(overlapped):
        # Overlapped calls (DDP buckets) block only where the rank waits for them: its last of the
        # step in that group when the rank's next event follows its end at once, or is the end of
        # backward (which waits for every bucket: on a busy host the woken rank may wait tens of ms
        # for a core); one that ends while the rank works on blocked nobody.
        idx = np.flatnonzero(overlapped)
        # One key per (rank, step, group), dense: the steps' span times the groups, per rank.
        step = c.step[idx].astype(np.int64) & 0xFFFFFF
        step -= step.min()
        group = c.group[idx].astype(np.int64) & 0xFFFF
        key = (c_ri[idx].astype(np.int64) * (int(step.max()) + 1) + step) * (int(group.max()) + 1) + group
        uniq, inv = dense.unique_inverse(key)
        last_issue = np.full(uniq.size, np.iinfo(np.int64).min)
        np.maximum.at(last_issue, inv, c.issue_ns[idx])
        cand = idx[c.issue_ns[idx] == last_issue[inv]]
        after = np.searchsorted(events, hi[cand], side="left")
        has_next = after < events.size
        nxt_key = events[np.minimum(after, events.size - 1)]
        same_rank = (nxt_key >> _TIME_BITS) == c_ri[cand]
        gap = (nxt_key & ((1 << _TIME_BITS) - 1)) - (hi[cand] & ((1 << _TIME_BITS) - 1))
        backward = p_ok & (p.phase == _BACKWARD)
        ends_backward = np.isin(nxt_key, _event_keys(p_ri[backward], p_end[backward], t0))
        waited_for = has_next & same_rank & ((gap <= RESUME_NS) | ends_backward)
        blocking[idx] = False
        blocking[cand] = waited_for & ~busy[cand] & (end[cand] > c.issue_ns[cand])
    out: NDArray[np.bool_] = blocking & c_ok
    return out


def block_start(c: Collectives) -> NDArray[np.int64]:
    """Per row, when a call that blocked its rank began to: its wait, for one waited later, else its issue."""
    waits = c.waits
    return np.where(waits > c.issue_ns, waits, c.issue_ns)


def step_times(
    w: Window, step_cols: NDArray[np.int64], instance: NDArray[np.int64] | None = None
) -> StepTimes:
    """Self and blocked time of every (rank, step) of ``w`` for the steps in ``step_cols``.

    Args:
        w: The window (steps, phases, collectives).
        step_cols: Step numbers to lay out, sorted (the caller drops warm-up steps).
        instance: Instance index per collective row (see :func:`blocking_rows`).

    Returns:
        :class:`StepTimes` over the ranks that recorded steps.
    """
    st = w.steps
    ranks = dense.unique(st.rank)
    n_r, n_s = ranks.size, step_cols.size
    shape = (n_r, n_s)
    step_ns = np.full(shape, np.nan)
    start = np.full(shape, np.nan)
    ri, si, ok = cells(ranks, step_cols, st.rank, st.step)
    step_ns[ri[ok], si[ok]] = st.dur_ns[ok]
    start[ri[ok], si[ok]] = st.start_ns[ok]
    end = start + step_ns

    phase_dur = np.full((len(PHASES), *shape), np.nan)
    p = w.phases
    pri, psi, pok = cells(ranks, step_cols, p.rank, p.step)
    # A step may hold several rows of one phase (micro-batches, a pipeline schedule): they add up.
    _add_nan(phase_dur, (p.phase[pok], pri[pok], psi[pok]), p.dur_ns[pok].astype(np.float64))

    blocked = np.zeros((len(COMPONENTS), *shape))
    synced = np.zeros(shape, bool)
    c = w.collectives
    row_blocked = np.zeros(c.rank.size)
    rows = np.flatnonzero(c.in_window)
    if rows.size and n_s:
        cri, csi, found = cells(ranks, step_cols, c.rank[rows], c.step[rows])
        rows, cri, csi = rows[found], cri[found], csi[found]
        synced[cri, csi] = True
        keep = blocking_rows(w, ranks, instance)[rows]
        rows, cri, csi = rows[keep], cri[keep], csi[keep]
        issue = block_start(c)[rows].astype(np.float64)
        finish = (c.start_ns[rows] + c.dur_ns[rows]).astype(np.float64)
        # Only the part of a span inside its step counts (a call may straddle a step boundary).
        lo = np.fmax(issue, start[cri, csi])
        hi = np.fmin(finish, end[cri, csi])
        span = np.maximum(np.nan_to_num(hi - lo, nan=0.0), 0.0)
        row_blocked[rows] = span
        comp = _component_of(w, ranks, c.rank[rows], block_start(c)[rows])
        np.add.at(blocked, (comp, cri, csi), span)

    has_phase = ~np.all(np.isnan(phase_dur), axis=0)
    comps = np.full((len(COMPONENTS), *shape), np.nan)
    comps[: len(PHASES)] = np.where(has_phase, np.nan_to_num(phase_dur, nan=0.0), np.nan)
    comps[UNTRACKED] = step_ns - np.where(has_phase, np.nansum(phase_dur, axis=0), 0.0)
    comp_self = np.maximum(comps - blocked, 0.0)
    total_blocked = np.where(np.isnan(step_ns), np.nan, blocked.sum(axis=0))
    self_ns = np.maximum(step_ns - total_blocked, 0.0)
    return StepTimes(ranks, step_cols, step_ns, end, total_blocked, self_ns, comp_self, synced, row_blocked)


def _add_nan(
    a: NDArray[np.float64], index: tuple[NDArray[np.int64], ...], values: NDArray[np.float64]
) -> None:
    """``a[index] += values`` where NaN cells count as 0 once written to."""
    hit = np.zeros(a.shape, bool)
    hit[index] = True
    a[hit & np.isnan(a)] = 0.0
    np.add.at(a, index, values)


def _component_of(
    w: Window, ranks: NDArray[np.int64], rank: NDArray[np.int64], issue: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Component index of each collective row: the phase row of its rank containing the issue time.

    Rows issued outside every phase row of their rank are untracked host time.
    """
    comp = np.full(issue.size, UNTRACKED, np.int64)
    p = w.phases
    if p.rank.size == 0 or issue.size == 0:
        return comp
    p_ri = np.searchsorted(ranks, p.rank)
    ok = (p_ri < ranks.size) & (ranks[np.minimum(p_ri, ranks.size - 1)] == p.rank)
    t0 = int(min(int(p.start_ns[ok].min()) if np.any(ok) else 0, int(issue.min())))
    keys = _event_keys(p_ri[ok], p.start_ns[ok], t0)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    ends = (p.start_ns + p.dur_ns)[ok][order]
    codes = p.phase[ok][order]
    owner = p_ri[ok][order]
    c_ri = np.searchsorted(ranks, rank)
    at = np.searchsorted(keys, _event_keys(c_ri, issue, t0), side="right") - 1
    j = np.maximum(at, 0)
    inside = (at >= 0) & (owner[j] == c_ri) & (issue < ends[j]) if keys.size else np.zeros(issue.size, bool)
    return np.where(inside, codes[j] if keys.size else UNTRACKED, comp)
