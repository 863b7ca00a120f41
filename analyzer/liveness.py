"""Unresponsive ranks: stopped reporting, or alive but hung (docs/design.md §6.10).

*Stopped reporting*: a rank that has not exited, has completed a step or
phase, and whose newest row of any kind (the ~1 s host samples are its
heartbeat) is older than ``silence_ns`` at the window's end, while other ranks
of the job still report and went on without it or wait for it: one completed a
later (step, phase), or issued or waits in a later seq of a process group, or
its newest heartbeat shows it waiting in a collective. A rank silent where its
peers stopped too, none waiting (the end of training: its teardown, a long
``gc.collect()`` holding the GIL so that the probe's thread cannot beat), is
needed by no one and not named. When every
rank is silent together nothing is said: that is the whole job (or the
collector's feed) stopping, not one rank failing, and a later window will show
which. A rank that recorded an ``exit`` is finished, whatever its code.

*Hung*: every rank still reports, but the job has made no progress (no step,
phase or collective) for ``stall_ns``, and a few ranks stopped at an earlier
point of the step than everyone else — the furthest (step, phase) each rank
completed (:func:`argus.analyzer.window.progress_position`) is behind the
others': their peers went on until they blocked in the next collective, which
the hung ranks never issued. Positions, not timestamps, decide: a rank that
started the step a little late (a hiccup) has an earlier timestamp but the same
position. When positions do not tell (a job with no phases: every rank's last
step end is the same), collectives do: the ranks whose newest seq in a process
group is behind their peers' (peers wait in a collective, per their heartbeats,
that these ranks never issued) are the hung ones. Which collective: where the rank's newest
seq in a process group is behind its peers', the first seq it never issued
(peers' rows show they issued it); otherwise the seq after the last one all
ranks completed in the group its peers used last. A pause of every rank at the
same point (a checkpoint, the end of training) names no one. Of the ranks
behind, one whose newest heartbeat shows it waiting in a collective is blocked,
not hung, while another behind waits in none; and a rank is named only when it
reported through the stall (rows that lag on a loaded host are not a position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.analyzer.window import RankStatus
from argus.schema import PHASES

__all__ = ["HANG_MIN_NS", "HANG_STEPS", "Unresponsive", "find_unresponsive", "silence_threshold_ns"]

#: A job stalled for this many typical steps (and at least HANG_MIN_NS) may be hung.
HANG_STEPS = 10
#: Shortest stall that can be a hang, ns.
HANG_MIN_NS = 3_000_000_000
#: Shortest silence that can be a stopped rank, ns.
SILENCE_MIN_NS = 6_000_000_000


def silence_threshold_ns(window_ns: int) -> int:
    """Silence after which a rank counts as stopped: one window, at least :data:`SILENCE_MIN_NS`."""
    return max(int(window_ns), SILENCE_MIN_NS)


@dataclass(frozen=True)
class Unresponsive:
    """One unresponsive rank.

    Attributes:
        rank: Global rank.
        hung: True when alive but hung; False when it stopped reporting.
        score: Silence (or stall) over its threshold; >= 1.
        evidence: Numbers to check (seconds silent, the collective it never issued, ...).
    """

    rank: int
    hung: bool
    score: float
    evidence: dict[str, Any] = field(default_factory=dict)


def find_unresponsive(
    status: RankStatus,
    window_end_ns: int,
    *,
    silence_ns: int,
    typical_step_ns: float | None,
) -> list[Unresponsive]:
    """Ranks that stopped reporting or hang at ``window_end_ns``.

    Args:
        status: Every known rank's liveness (:class:`~argus.analyzer.window.RankStatus`).
        window_end_ns: End of the analysed window, ns since the epoch.
        silence_ns: Silence that makes a rank stopped (see :func:`silence_threshold_ns`).
        typical_step_ns: The job's recent median step time, ns (None if unknown).

    Returns:
        Unresponsive ranks, stopped ones first; empty when nothing is wrong.
    """
    seen = status.last_seen_ns
    live = ~status.exited & (seen >= 0)
    if not np.any(live):
        return []
    # Before its first step a rank may be slow to start reporting (imports, rendezvous).
    silent = live & (window_end_ns - seen >= silence_ns) & (status.position >= 0)
    # Peers count as still reporting only when clearly fresh: when the whole feed stops, ranks
    # cross the threshold a few ms apart and must not be called silent one by one.
    fresh = live & (window_end_ns - seen < silence_ns // 2)
    out: list[Unresponsive] = []
    if np.any(silent) and np.any(fresh):
        newest_peer = int(seen[fresh].max())
        for i in np.flatnonzero(silent & _left_behind(status, fresh)):
            gap = window_end_ns - int(seen[i])
            out.append(
                Unresponsive(
                    int(status.rank[i]),
                    hung=False,
                    score=gap / silence_ns,
                    evidence={
                        "silent_s": round(gap / 1e9, 3),
                        "last_seen_ns": int(seen[i]),
                        "peers_last_seen_ns": newest_peer,
                    },
                )
            )
        return out
    if np.any(silent):
        return []
    return _hung(status, live & ~silent, window_end_ns, typical_step_ns)


def _left_behind(status: RankStatus, fresh: np.ndarray) -> np.ndarray:
    """Per rank, True when its peers among ``fresh`` went on without it or wait for it.

    Fresh peers went on: one completed a later (step, phase) than the rank's newest, or issued or
    waits in a later seq of a process group the rank recorded in. They wait for it: the newest
    heartbeat of one shows it waiting in a collective. Neither (every rank stopped at the same point,
    none waits: the end of training, its teardown): the rank is not needed, and its silence (a
    process leaving, its probe's thread starved) names no one.
    """
    pos = status.position
    ahead_pos = int(pos[fresh].max()) if np.any(fresh) else -1
    out: np.ndarray = (pos >= 0) & (pos < ahead_pos)
    if np.any(fresh & (_waiting(status) >= 0)):
        out[:] = True
    behind: np.ndarray = out | _behind_in_collectives(status, among=fresh)
    return behind


def _hung(
    status: RankStatus, alive: np.ndarray, window_end_ns: int, typical_step_ns: float | None
) -> list[Unresponsive]:
    prog = status.last_progress_ns
    cand = alive & (prog >= 0)
    if cand.sum() < 2:
        return []
    step = typical_step_ns if typical_step_ns and typical_step_ns > 0 else 0.0
    stall_ns = max(HANG_STEPS * step, HANG_MIN_NS)
    newest = int(prog[cand].max())
    stalled = window_end_ns - newest
    if stalled < stall_ns:
        return []
    # Hung ranks and their blocked peers stay alive: they kept reporting long after progress stopped.
    # (When everything stops at once, the job or its feed stopped: that is not a hang.)
    # Only a rank that reported through the stall is known to be stuck where its rows say; one
    # whose rows lag, on a loaded host or a slow link to the collector, may have moved on since.
    reported = cand & (status.last_seen_ns >= newest + stall_ns // 2)
    if np.count_nonzero(reported) < 2:
        return []
    pos = status.position
    known = cand & (pos >= 0)
    behind = _stopped_first(status, known) & reported
    if not np.any(behind):
        return []
    peers_pos = int(np.median(pos[known & ~behind]))
    out = []
    for i in np.flatnonzero(behind):
        evidence: dict[str, Any] = {
            "stalled_s": round(stalled / 1e9, 3),
            "last_progress_ns": int(prog[i]),
            "at_step": int(pos[i]) // 8,
            "at_phase": _position_name(int(pos[i])),
            "peers_at_step": peers_pos // 8,
            "peers_at_phase": _position_name(peers_pos),
        }
        group, seq = _missing_collective(status, int(i))
        if group is not None:
            evidence["process_group"] = group
            evidence["seq"] = seq
            evidence["collective"] = f"{group}#{seq}"
        out.append(Unresponsive(int(status.rank[i]), hung=True, score=stalled / stall_ns, evidence=evidence))
    return out


def _stopped_first(status: RankStatus, known: np.ndarray) -> np.ndarray:
    """Per rank, True when it stopped before the others among ``known`` (ranks with a position).

    The ranks whose (step, phase) position is behind everyone else's; where positions do not tell,
    those behind in some process group's seqs. A rank whose newest heartbeat shows it waiting in a
    collective is blocked by whoever never issued it: while some rank behind waits in none, the
    waiting ones are not the ones that stopped. None when fewer than two are known or half or more
    stand at the same point (a checkpoint, the end of training).
    """
    none = np.zeros(known.shape, bool)
    pos = status.position
    if known.sum() < 2:
        return none
    low = int(pos[known].min())
    behind = known & (pos == low)
    if behind.sum() * 2 > known.sum() or int(pos[known].max()) == low:
        behind = known & _behind_in_collectives(status)
        if not np.any(behind) or behind.sum() * 2 > known.sum():
            return none
    blocked = _waiting(status) >= 0
    free: np.ndarray = behind & ~blocked
    return free if np.any(free) else behind


def _waiting(status: RankStatus) -> np.ndarray:
    """Per rank, the issue time of the collective its newest heartbeat shows it waiting in, ns; -1 if none."""
    if status.waiting_since_ns.shape == status.rank.shape:
        return status.waiting_since_ns
    return np.full(status.rank.shape, -1, np.int64)  # a window built without heartbeats' pending columns


def _behind_in_collectives(status: RankStatus, among: np.ndarray | None = None) -> np.ndarray:
    """Per rank of ``status``, True when its newest seq in some process group is behind a peer's.

    ``among`` (a mask over ``status.rank``; None: every rank) picks the peers whose newest seq
    counts; a group none of them recorded in is skipped.
    """
    out = np.zeros(status.rank.shape, bool)
    for g in np.unique(status.seq_group):
        rows = status.seq_group == g
        peers = rows if among is None else rows & np.isin(status.seq_rank, status.rank[among])
        if not np.any(peers):
            continue
        late = status.seq_rank[rows][status.seq_max[rows] < int(status.seq_max[peers].max())]
        out |= np.isin(status.rank, late)
    return out


def _position_name(pos: int) -> str:
    k = pos % 8
    return "step end" if k == 5 else (f"{PHASES[k - 1]} end" if 1 <= k <= 4 else "?")


def _missing_collective(status: RankStatus, i: int) -> tuple[str | None, int | None]:
    """(process group, seq) the hung rank ``i`` never issued while its peers wait in it."""
    rank = int(status.rank[i])
    gone = set(status.rank[status.exited].tolist())
    best: tuple[int, str, int] | None = None
    for g in np.unique(status.seq_group):
        name = status.seq_groups[g]
        rows = status.seq_group == g
        members = status.groups.get(name)
        if members is not None and members.size and rank not in set(members.tolist()):
            continue
        mine = rows & (status.seq_rank == rank)
        own = int(status.seq_max[mine].max()) if np.any(mine) else -1
        peer_rows = rows & (status.seq_rank != rank) & ~np.isin(status.seq_rank, list(gone))
        if not np.any(peer_rows):
            continue
        ahead = int(status.seq_max[peer_rows].max()) - own
        # Prefer the group where peers are furthest ahead; on ties the world group "0".
        if best is None or ahead > best[0] or (ahead == best[0] and name == "0"):
            best = (ahead, name, own + 1)
    if best is None:
        return None, None
    return best[1], best[2]
