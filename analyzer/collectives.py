"""Collective wait/transfer decomposition (docs/design.md §2) and slow-link detection.

Per collective instance (process group, seq), over the ranks that recorded it::

    last_arrival = max(issue over ranks)
    wait(rank)   = last_arrival − issue(rank)        # time spent waiting for late peers
    transfer     = end − last_arrival                # the data movement itself

A slow rank arrives last and waits least; a slow link shows long transfers with
no late arrival.

Clock offsets. Issue times of ranks on different nodes are compared, so an
offset of a few ms between node clocks would read as a few ms of lateness —
as large as a 10 % straggler in a 50 ms step. The *ends* of a synchronising
collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier) are
one instant in true time: the collective completes for everyone when the last
piece of data lands. So each rank's offset is estimated per window as the
median, over its instances, of ``end(rank) − median end of the instance``, and
subtracted before the decomposition. This cancels clock offsets but not
lateness, because a late rank's collective still ends with everyone else's.
The estimate is clamped to ``max_offset_ns`` so that a probe which observes
completion late (at ``wait()``) cannot hide a straggler by more than that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer import dense
from argus.analyzer.robust import grouped_median, one_sided_scores
from argus.analyzer.window import Collectives

__all__ = [
    "MAX_OFFSET_NS",
    "Decomposition",
    "LinkFinding",
    "decompose",
    "is_synchronising",
    "slow_links",
]

#: Largest clock offset between ranks the decomposition corrects, ns.
MAX_OFFSET_NS = 20_000_000
#: A group's transfers must be at least this much longer than the reference to be a slow link.
LINK_MIN_INCREASE = 0.5
#: Fewest complete instances of a group in a window to judge its link.
LINK_MIN_INSTANCES = 3
_SYNC_OPS = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "alltoall", "barrier")


def is_synchronising(op: str) -> bool:
    """True for collectives that complete at one instant on every rank (all-reduce, barrier, ...)."""
    name = op.lower().replace("_base", "").replace("_coalesced", "").replace("_into_tensor", "")
    return any(s in name for s in _SYNC_OPS)


@dataclass(frozen=True)
class Decomposition:
    """Per-row and per-instance decomposition of a window's collectives.

    Row arrays align with the input :class:`~argus.analyzer.window.Collectives`;
    instance arrays are indexed by ``instance``.

    Attributes:
        instance: Instance index of each row.
        issue_ns: Offset-corrected issue time of each row.
        wait_ns: ``last_arrival − issue`` of each row, >= 0.
        transfer_ns: ``end − last_arrival`` of each row (clipped at 0).
        offset_ns: Estimated clock offset of each row's rank (already removed).
        inst_group, inst_seq, inst_op, inst_bytes: The instance's keys.
        inst_ranks: Number of ranks that recorded the instance.
        inst_complete: True when every rank expected in the group recorded it.
        inst_last_arrival_ns: Corrected time the last rank issued it.
        inst_late_ns: ``last_arrival − median issue``: how late the last rank was.
        inst_transfer_ns: Median transfer over the instance's rows.
        inst_last_rank: Global rank that arrived last.
        inst_sender, inst_receiver: Global ranks of a point-to-point instance (-1 for collectives).
    """

    instance: NDArray[np.int64]
    issue_ns: NDArray[np.float64]
    wait_ns: NDArray[np.float64]
    transfer_ns: NDArray[np.float64]
    offset_ns: NDArray[np.float64]
    inst_group: NDArray[np.int64]
    inst_seq: NDArray[np.int64]
    inst_op: NDArray[np.int64]
    inst_bytes: NDArray[np.int64]
    inst_ranks: NDArray[np.int64]
    inst_complete: NDArray[np.bool_]
    inst_last_arrival_ns: NDArray[np.float64]
    inst_late_ns: NDArray[np.float64]
    inst_transfer_ns: NDArray[np.float64]
    inst_last_rank: NDArray[np.int64]
    inst_sender: NDArray[np.int64]
    inst_receiver: NDArray[np.int64]

    @property
    def n_instances(self) -> int:
        return int(self.inst_group.size)

    @property
    def inst_p2p(self) -> NDArray[np.bool_]:
        """True for point-to-point instances (a send and its receive)."""
        return np.asarray(self.inst_sender >= 0)


def decompose(  # noqa: PLR0915  (one pass of array steps; its pieces share the arrays)
    coll: Collectives,
    *,
    group_sizes: dict[str, int] | None = None,
    max_offset_ns: float = MAX_OFFSET_NS,
) -> Decomposition:
    """Decompose every instance of ``coll`` into per-rank wait and transfer.

    Args:
        coll: All rows of the instances to decompose (every rank's row of each).
        group_sizes: Expected ranks per process group name, to mark complete
            instances; default: the most ranks seen in any instance of the group.
        max_offset_ns: Clamp of the per-rank clock-offset estimate, ns.

    Returns:
        :class:`Decomposition`; empty arrays when ``coll`` has no rows.
    """
    n = coll.rank.size
    # An instance is (group, seq) for a collective, (group, sender, receiver, seq) for a
    # point-to-point transfer: a send and its matching receive. Both become one int64 key:
    # a "channel" (the group, or a (group, sender, receiver) triple past the groups) and the seq.
    peer = coll.peers
    p2p = peer >= 0
    is_send = np.zeros(n, bool)
    if coll.op_names:
        is_send = np.array([o == "send" for o in coll.op_names], bool)[coll.op] & p2p
    sender = np.where(p2p, np.where(is_send, coll.rank, peer), -1)
    receiver = np.where(p2p, np.where(is_send, peer, coll.rank), -1)
    channel = coll.group.astype(np.int64).copy()
    triples = np.zeros((0, 3), np.int64)
    if np.any(p2p):
        # (group, sender, receiver) as one int64: ranks and groups below 2**21 each.
        triple = (coll.group[p2p].astype(np.int64) << 42) | (sender[p2p] << 21) | receiver[p2p]
        uniq, pair = np.unique(triple, return_inverse=True)
        mask = (1 << 21) - 1
        triples = np.stack([uniq >> 42, (uniq >> 21) & mask, uniq & mask], axis=1)
        channel[p2p] = len(coll.group_names) + pair.ravel()
    # Unique (channel, seq) pairs, counted over the seqs' span where it is small (one sort else).
    seq = coll.seq & ((np.int64(1) << 40) - 1)
    seq_lo = int(seq.min()) if n else 0
    seq_span = int(seq.max()) - seq_lo + 1 if n else 1
    pairs, instance = dense.unique_inverse(channel * seq_span + (seq - seq_lo))
    inst_keys = ((pairs // seq_span) << 40) | (pairs % seq_span + seq_lo)
    instance = instance.reshape(-1).astype(np.int64)
    n_inst = inst_keys.size
    inst_channel = inst_keys >> 40
    n_groups = len(coll.group_names)
    inst_is_p2p = inst_channel >= n_groups
    t_idx = np.where(inst_is_p2p, inst_channel - n_groups, 0)
    inst_group_of = np.where(inst_is_p2p, triples[t_idx, 0] if triples.size else 0, inst_channel)
    inst_sender = np.where(inst_is_p2p, triples[t_idx, 1] if triples.size else -1, -1)
    inst_receiver = np.where(inst_is_p2p, triples[t_idx, 2] if triples.size else -1, -1)
    end = (coll.start_ns + coll.dur_ns).astype(np.float64)
    issue = coll.issue_ns.astype(np.float64)
    ranks, rank_idx = dense.unique_inverse(coll.rank)

    # Clock offsets from the common end of synchronising collectives.
    sync_op = np.array([is_synchronising(o) for o in coll.op_names], dtype=bool)
    use = sync_op[coll.op] if coll.op_names else np.ones(n, bool)
    inst_count = np.bincount(instance, minlength=n_inst)
    use &= inst_count[instance] >= 2
    med_end = grouped_median(instance[use], end[use], n_inst)
    rank_offset = grouped_median(rank_idx[use], (end - med_end[instance])[use], ranks.size)
    rank_offset = np.clip(np.nan_to_num(rank_offset, nan=0.0), -max_offset_ns, max_offset_ns)
    offset = rank_offset[rank_idx] if n else np.zeros(0)
    issue_c = issue - offset
    end_c = end - offset

    last_arrival = np.full(n_inst, -np.inf)
    np.maximum.at(last_arrival, instance, issue_c)
    wait = last_arrival[instance] - issue_c if n else np.zeros(0)
    transfer = np.maximum(end_c - last_arrival[instance], 0.0) if n else np.zeros(0)

    med_issue = grouped_median(instance, issue_c, n_inst)
    inst_transfer = grouped_median(instance, transfer, n_inst)
    # The row that arrived last: the largest issue per instance (ties: any).
    order = np.lexsort((issue_c, instance))
    last_row = order[np.r_[np.flatnonzero(np.diff(instance[order])), n - 1]] if n else np.zeros(0, np.int64)

    inst_group = inst_group_of.astype(np.int64)
    inst_seq = (inst_keys & ((np.int64(1) << 40) - 1)).astype(np.int64)
    first_row = np.zeros(n_inst, np.int64)
    first_row[instance[::-1]] = np.arange(n)[::-1]
    expected = np.zeros(len(coll.group_names), np.int64)
    np.maximum.at(expected, inst_group, inst_count)
    if group_sizes:
        for g, name in enumerate(coll.group_names):
            if name in group_sizes:
                expected[g] = group_sizes[name]
    return Decomposition(
        instance=instance,
        issue_ns=issue_c,
        wait_ns=np.maximum(wait, 0.0),
        transfer_ns=transfer,
        offset_ns=offset,
        inst_group=inst_group,
        inst_seq=inst_seq,
        inst_op=coll.op[first_row] if n else np.zeros(0, np.int64),
        inst_bytes=coll.bytes[first_row] if n else np.zeros(0, np.int64),
        inst_ranks=inst_count,
        inst_complete=(
            np.where(inst_is_p2p, inst_count >= 2, inst_count >= expected[inst_group])
            if n
            else np.zeros(0, bool)
        ),
        inst_last_arrival_ns=last_arrival,
        inst_late_ns=last_arrival - med_issue,
        inst_transfer_ns=inst_transfer,
        inst_last_rank=coll.rank[last_row] if n else np.zeros(0, np.int64),
        inst_sender=inst_sender.astype(np.int64),
        inst_receiver=inst_receiver.astype(np.int64),
    )


@dataclass(frozen=True)
class LinkFinding:
    """A process group whose transfers are slow without late arrivals.

    Attributes:
        group: Process group name.
        score: ``(ratio − 1) / LINK_MIN_INCREASE`` on the robust scale; >= 1 = slow link.
        transfer_ns: Median transfer of the group's instances in the window.
        reference_ns: What its transfers take elsewhere (other groups, or its own past).
        late_ns: Median lateness of the last arrival in the group's instances.
        instances: Complete instances judged.
        basis: ``"peers"`` (compared with other groups) or ``"history"`` (with its own past).
    """

    group: str
    score: float
    transfer_ns: float
    reference_ns: float
    late_ns: float
    instances: int
    basis: str


#: Layout of an instance key (:func:`_instance_keys`): size and frequency classes take
#: ``_CLASS_SLOTS`` values each, the group's width ``_WIDTH_SLOTS``.
_CLASS_SLOTS = 64
_WIDTH_SLOTS = 4096


def _instance_keys(d: Decomposition) -> NDArray[np.int64]:
    """Per instance, what its transfers are compared by: like instances of like groups.

    (op, message-size class) and the kind of its group — how many ranks take part and how
    often (the log2 of the group's instances in the window): a data-parallel gradient
    all-reduce across nodes and a tensor-parallel all-reduce inside one are different links,
    however similar their messages.
    """
    size_class = np.floor(np.log2(np.maximum(d.inst_bytes, 1))).astype(np.int64)
    per_group = np.bincount(d.inst_group, minlength=int(d.inst_group.max()) + 1 if d.inst_group.size else 0)
    frequency = np.floor(np.log2(np.maximum(per_group[d.inst_group], 1))).astype(np.int64)
    width = np.minimum(d.inst_ranks, _WIDTH_SLOTS - 1)
    return ((d.inst_op * _CLASS_SLOTS + size_class) * _CLASS_SLOTS + frequency) * _WIDTH_SLOTS + width


def _history_key(key: NDArray[np.int64] | int) -> NDArray[np.int64] | int:
    """An instance key without its frequency: one group against its own past (a slow link makes
    its group's instances rarer, and that must not hide the group's history)."""
    return key - ((key // _WIDTH_SLOTS) % _CLASS_SLOTS) * _WIDTH_SLOTS


def slow_links(
    d: Decomposition,
    group_names: tuple[str, ...],
    history: dict[tuple[str, int], float],
    *,
    min_increase: float = LINK_MIN_INCREASE,
) -> list[LinkFinding]:
    """Process groups whose transfers grew without anyone arriving late.

    Each group's complete instances are compared per (op, message-size class)
    with the same kind of instances of other groups — a robust one-sided score
    of the group's median log-transfer — and, for groups with no peers (a job
    with one process group), with the group's own transfers in earlier windows
    (``history``) and, with two groups of a kind, with the other one as well: it must stand
    out from both (two groups slower alike are the host's or the job's). A group is reported
    when its transfers are at least ``1 + min_increase`` times the reference while its last
    arrivals are on average later by less than the extra transfer time (long transfers, not
    late ranks).

    Args:
        d: The window's decomposition.
        group_names: Names indexed by ``d.inst_group``.
        history: ``(group name, key)`` → median transfer, ns, of earlier healthy windows,
            where key is the (op, size class) key of :func:`transfer_medians`.
        min_increase: Relative transfer increase that scores 1.

    Returns:
        One :class:`LinkFinding` per group scoring >= 0.5 (callers apply the threshold).
    """
    ok = d.inst_complete & (d.inst_ranks >= 2)
    if not np.any(ok):
        return []
    keys = _instance_keys(d)[ok]
    group = d.inst_group[ok]
    log_t = np.log(np.maximum(d.inst_transfer_ns[ok], 1.0))
    pairs, pair_idx = dense.unique_pairs(keys, group, len(group_names))
    pair_median = grouped_median(pair_idx, log_t, len(pairs))
    pair_count = np.bincount(pair_idx, minlength=len(pairs))
    late_median = grouped_median(group, d.inst_late_ns[ok], len(group_names))
    # Per (key, group): score, log transfer, log reference, basis.
    score = np.full(len(pairs), np.nan)
    ref = np.full(len(pairs), np.nan)
    basis = np.full(len(pairs), "", dtype=object)
    for key in np.unique(pairs[:, 0]):
        sel = np.flatnonzero(pairs[:, 0] == key)
        if sel.size >= 3:
            res = one_sided_scores(pair_median[sel], floor=np.log1p(min_increase))
            score[sel], ref[sel], basis[sel] = res.score, res.centre, "peers"
            continue
        # Too few groups of this kind for a robust comparison: each against its own history and,
        # where there is one, against the other group of its kind now; a slow link stands out
        # from both (two groups slower alike than before are the host's or the job's, not a link).
        for i in sel:
            base = history.get((group_names[pairs[i, 1]], int(_history_key(int(key)))))
            if base is None or base <= 0:
                continue
            others = pair_median[sel[sel != i]]
            ref[i] = max(np.log(base), float(np.median(others))) if others.size else np.log(base)
            score[i] = (pair_median[i] - ref[i]) / np.log1p(min_increase)
            basis[i] = "history"
    out = []
    for g in np.unique(pairs[:, 1]):
        sel = np.flatnonzero((pairs[:, 1] == g) & ~np.isnan(score))
        if sel.size == 0 or pair_count[pairs[:, 1] == g].sum() < LINK_MIN_INSTANCES:
            continue
        best = sel[np.argmax(score[sel])]
        if score[best] < 0.5:
            continue
        transfer, reference = float(np.exp(pair_median[best])), float(np.exp(ref[best]))
        late_ns = float(late_median[g])
        if late_ns >= transfer - reference:
            continue  # late arrivals explain the time: a straggler, not the link
        out.append(
            LinkFinding(
                group_names[g],
                float(score[best]),
                transfer,
                reference,
                late_ns,
                int(pair_count[pairs[:, 1] == g].sum()),
                str(basis[best]),
            )
        )
    return out


def transfer_medians(d: Decomposition, group_names: tuple[str, ...]) -> dict[tuple[str, int], float]:
    """Median transfer, ns, per (group name, (op, size class) key) of complete instances: history input."""
    ok = d.inst_complete & (d.inst_ranks >= 2)
    if not np.any(ok):
        return {}
    pairs, pair_idx = dense.unique_pairs(
        np.asarray(_history_key(_instance_keys(d)[ok]), np.int64), d.inst_group[ok], len(group_names)
    )
    med = grouped_median(pair_idx, d.inst_transfer_ns[ok], len(pairs))
    return {(group_names[g], int(k)): float(m) for (k, g), m in zip(pairs, med, strict=True)}
