"""Roles: which ranks do the same work, inferred from point-to-point partners and collectives.

Ranks of different roles do different work by design — pipeline stages with
unequal layers, the first stage's data, the last stage's loss — so the analyzer
compares phases and kernels only among ranks of one role (docs/design.md §6.5). A pure
data-parallel job is the one-role case.

* **Pipeline stage**, from point-to-point transfers: ranks joined by
  ``send``/``recv`` form chains (one per data-parallel replica of the
  pipeline); the head of a chain is the end that sends first in time
  (activations flow before gradients), and a rank's stage is its distance from
  the head. Rings and other shapes (a ring exchange, a halo swap) are
  symmetric: one stage.
* **Collective signature**, from the process groups: how many instances of
  each (op, group size) the rank takes part in per step. Data-parallel replicas
  and the positions of a tensor-parallel group (equal shards of each layer)
  share it; stages with different gradient buckets, or a rank that runs
  collectives its peers do not, do not. A signature that would split the job
  into many small roles (data-dependent collectives) is not used.

A role is (stage, signature). Roles are labelled ``stage S`` (pipelines),
``role K`` (signatures alone) or ``all``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from argus.analyzer import dense
from argus.analyzer.collectives import Decomposition
from argus.analyzer.window import Collectives

__all__ = ["Roles", "infer_roles", "one_role"]

#: Signatures are ignored when they would leave roles of fewer ranks than this on average.
MIN_MEAN_ROLE_SIZE = 2.0


@dataclass(frozen=True)
class Roles:
    """The role of every rank.

    Attributes:
        rank: Global ranks, sorted, shape ``(n,)``.
        role: Role index per rank, ``0..n_roles-1``.
        stage: Pipeline stage per rank (0 without pipelines).
        labels: Label of each role index.
    """

    rank: NDArray[np.int64]
    role: NDArray[np.int64]
    stage: NDArray[np.int64]
    labels: tuple[str, ...]

    @property
    def n_roles(self) -> int:
        return len(self.labels)

    def of(self, ranks: NDArray[np.int64]) -> NDArray[np.int64]:
        """Role index of each of ``ranks`` (-1 for ranks unknown here)."""
        i = np.searchsorted(self.rank, ranks)
        i = np.minimum(i, max(self.rank.size - 1, 0))
        known = (
            (self.rank.size > 0) & (self.rank[i] == ranks) if self.rank.size else np.zeros(ranks.size, bool)
        )
        return np.where(known, self.role[i] if self.rank.size else -1, -1)

    def label(self, rank: int) -> str | None:
        """The role label of ``rank``, or None when unknown."""
        r = int(self.of(np.array([rank], np.int64))[0])
        return self.labels[r] if r >= 0 else None

    def size(self, role: int) -> int:
        """Ranks of role index ``role``."""
        return int(np.sum(self.role == role))


def one_role(ranks: NDArray[np.int64]) -> Roles:
    """Every rank in one role (``all``)."""
    ranks = np.unique(ranks)
    zeros = np.zeros(ranks.size, np.int64)
    return Roles(ranks, zeros, zeros.copy(), ("all",))


def _stages(ranks: NDArray[np.int64], d: Decomposition) -> NDArray[np.int64]:  # noqa: C901  (the chain walk)
    """Pipeline stage of each rank from the point-to-point instances (0 outside chains)."""
    stage = np.zeros(ranks.size, np.int64)
    p2p = d.inst_p2p & d.inst_complete
    if not np.any(p2p):
        return stage
    snd = np.searchsorted(ranks, d.inst_sender[p2p])
    rcv = np.searchsorted(ranks, d.inst_receiver[p2p])
    ok = (snd < ranks.size) & (rcv < ranks.size)
    ok &= (ranks[np.minimum(snd, ranks.size - 1)] == d.inst_sender[p2p]) & (
        ranks[np.minimum(rcv, ranks.size - 1)] == d.inst_receiver[p2p]
    )
    snd, rcv = snd[ok], rcv[ok]
    when = d.inst_last_arrival_ns[p2p][ok]
    keep = snd != rcv
    snd, rcv, when = snd[keep], rcv[keep], when[keep]
    # Per undirected edge, the first transfer in time and who sent it.
    edge = np.minimum(snd, rcv).astype(np.int64) * ranks.size + np.maximum(snd, rcv)
    order = np.lexsort((when, edge))
    firsts = order[np.r_[True, np.diff(edge[order]) != 0]] if order.size else order
    first: dict[tuple[int, int], tuple[float, int]] = {
        (int(min(a, b)), int(max(a, b))): (float(t), int(a))
        for a, b, t in zip(snd[firsts].tolist(), rcv[firsts].tolist(), when[firsts].tolist(), strict=True)
    }
    neighbours: dict[int, set[int]] = {}
    for a, b in first:
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    seen: set[int] = set()
    for start in sorted(neighbours):
        if start in seen:
            continue
        component, todo = [], [start]
        seen.add(start)
        while todo:
            u = todo.pop()
            component.append(u)
            for v in neighbours[u] - seen:
                seen.add(v)
                todo.append(v)
        ends = [u for u in component if len(neighbours[u]) == 1]
        if len(ends) != 2 or any(len(neighbours[u]) > 2 for u in component):
            continue  # a ring or another symmetric shape: one stage
        head = next(
            (u for u in ends if first[(min(u, *neighbours[u]), max(u, *neighbours[u]))][1] == u), None
        )
        if head is None:
            head = min(ends)
        prev, u, k = -1, head, 0
        while True:
            stage[u] = k
            nxt = [v for v in neighbours[u] if v != prev]
            if not nxt:
                break
            prev, u, k = u, nxt[0], k + 1
    return stage


def _signatures(ranks: NDArray[np.int64], c: Collectives, group_sizes: dict[str, int]) -> NDArray[np.int64]:
    """Per rank, an id of its collective signature (instances per step of each (op, group size))."""
    rows = c.in_window & (c.peers < 0)
    if not np.any(rows):
        return np.zeros(ranks.size, np.int64)
    ri = np.searchsorted(ranks, c.rank[rows])
    ri = np.minimum(ri, ranks.size - 1)
    ok = ranks[ri] == c.rank[rows]
    size = np.array([group_sizes.get(g, 0) for g in c.group_names], np.int64)[c.group[rows]][ok]
    # A kind is an (op, group size) pair; its columns in (op, size) order.
    kind = c.op[rows][ok].astype(np.int64) * (int(size.max(initial=0)) + 1) + size
    kinds, k_idx = dense.unique_inverse(kind)
    counts = np.zeros((ranks.size, kinds.size))
    np.add.at(counts, (ri[ok], k_idx), 1.0)
    step = c.step[rows][ok].astype(np.int64)
    if step.size:
        step -= step.min()
    span = int(step.max(initial=0)) + 1
    rank_steps = dense.unique(ri[ok].astype(np.int64) * span + step)
    steps = np.bincount(rank_steps // span, minlength=ranks.size).astype(np.float64)
    per_step = np.round(counts / np.maximum(steps, 1.0)[:, None], 1)
    # One id per distinct row: hash the rows, then confirm equal hashes are equal rows.
    weights = np.random.default_rng(0).random(per_step.shape[1])
    _, sig = np.unique(np.round(per_step @ weights, 6), return_inverse=True)
    return np.asarray(sig.ravel(), np.int64)


def infer_roles(
    ranks: NDArray[np.int64], c: Collectives, d: Decomposition | None, group_sizes: dict[str, int]
) -> Roles:
    """Roles of ``ranks`` from one window's collectives (see the module doc).

    Args:
        ranks: Global ranks to label, any order.
        c: The window's collective rows.
        d: Their decomposition (None: no collectives, one role).
        group_sizes: Ranks per process group name.
    """
    ranks = np.unique(ranks)
    if d is None or ranks.size == 0:
        return one_role(ranks)
    stage = _stages(ranks, d)
    sig = _signatures(ranks, c, group_sizes)
    key = np.stack([stage, sig], axis=1)
    uniq, role = np.unique(key, axis=0, return_inverse=True)
    if ranks.size / uniq.shape[0] < MIN_MEAN_ROLE_SIZE and uniq.shape[0] > np.unique(stage).size:
        uniq, role = np.unique(stage[:, None], axis=0, return_inverse=True)
        uniq = np.concatenate([uniq, np.zeros_like(uniq)], axis=1)
    role = np.asarray(role.ravel(), np.int64)
    pipelined = np.unique(stage).size > 1
    labels = []
    for k, (s, _) in enumerate(uniq.tolist()):
        same_stage = int(np.sum(uniq[:, 0] == s))
        if pipelined:
            labels.append(f"stage {s}" if same_stage == 1 else f"stage {s} role {k}")
        else:
            labels.append("all" if uniq.shape[0] == 1 else f"role {k}")
    return Roles(ranks, role, stage, tuple(labels))
