"""L3: per (kernel, stream), each rank's Wasserstein-1 distance to its healthy peers (docs/design.md §6.7).

For every (kernel, stream) group of a window:

1. Each rank's duration distribution is the count-weighted mixture of
   log-normals rebuilt from its KDE clusters (:mod:`argus.kde`); clusters of
   several kernel windows inside the analysis window simply join the mixture.
2. A first healthy set comes from the exact per-rank mean duration
   (``Σ sum_ns / Σ count``) with the one-sided rule of :mod:`argus.analyzer.robust`,
   which stays right with up to half the ranks slow.
3. The reference distribution is the W1 Fréchet median of the healthy ranks —
   the pointwise median of their quantile functions
   (:func:`argus.analyzer.wasserstein.frechet_median`).
4. Each rank's W1 distance to the reference splits into the area where its
   quantile function lies above the reference (W1⁺, slower) and below it
   (W1⁻, faster). Its statistic is ``W1⁺ − W1⁻`` — which equals its mean
   duration minus the reference's — scored with the one-sided rule against a
   floor of :data:`REL_FLOOR` of the reference mean. Noise in a distribution's
   *shape* (the mixing weights of a bimodal kernel jitter from rank to rank)
   adds to both sides alike and cancels, while a rank that got slower, in its
   body or only in a slow tail, moves the statistic by the time it loses per
   call; a rank whose NCCL kernels are shorter because it waits less comes out
   negative and is never flagged. (Scoring W1 itself, or W1⁺ alone, does not
   work: both are positive for every rank, so the faster half of the ranks
   says nothing about the noise, and shape noise alone pushes healthy ranks
   of a multimodal kernel past any threshold.) W1 and W1⁺ are kept as evidence.

Cost: one pass over the clusters plus, per group, a median over the healthy
ranks' quantile rows — O(n·|U|) per group instead of the O(n²·|U|) of mean
pairwise distances (``bench/analyzer_scale.py`` measures both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.robust import one_sided_scores
from argus.analyzer.roles import Roles
from argus.analyzer.wasserstein import U_WEIGHTS, frechet_median, mixture_quantiles, w1_both
from argus.analyzer.window import KernelClusters

__all__ = ["COLLECTIVE_REL_FLOOR", "MIN_RANKS", "REL_FLOOR", "KernelScores", "score_kernels"]

_T = TypeVar("_T", bound=np.generic)

#: Smallest W1 excess worth a diagnosis, as a fraction of the reference mean duration.
REL_FLOOR = 0.05
#: The floor for communication kernels: their durations include the wait for late peers and
#: swing with arrival order, so only a slow link's large increase counts.
COLLECTIVE_REL_FLOOR = 0.5
#: Fewest ranks reporting a (kernel, stream) for it to be compared.
MIN_RANKS = 3
#: Fewest kernel calls a rank needs in the window for its mixture to be compared.
MIN_CALLS = 4


@dataclass(frozen=True)
class KernelScores:
    """L3 outcome: one row per compared (kernel, stream, rank).

    Attributes:
        kernel: Kernel name index into ``kernel_names``.
        stream: CUDA stream.
        collective: True for communication kernels.
        rank: Global rank.
        score: One-sided robust W1 score; >= 1 = outlier.
        w1_ns: W1 distance to the reference, ns.
        w1_excess_ns: Its slower part, ns.
        mean_ns: The rank's exact mean duration, ns.
        ref_mean_ns: Mean of the reference distribution, ns.
        excess_ns: ``Σ sum_ns − count · ref_mean``: extra kernel time of the rank in the window, ns.
        kernel_names: Names indexed by ``kernel``.
    """

    kernel: NDArray[np.int64]
    stream: NDArray[np.int64]
    collective: NDArray[np.bool_]
    rank: NDArray[np.int64]
    score: NDArray[np.float64]
    w1_ns: NDArray[np.float64]
    w1_excess_ns: NDArray[np.float64]
    mean_ns: NDArray[np.float64]
    ref_mean_ns: NDArray[np.float64]
    excess_ns: NDArray[np.float64]
    kernel_names: tuple[str, ...]


def _no_scores(names: tuple[str, ...]) -> KernelScores:
    z, zi = np.zeros(0), np.zeros(0, np.int64)
    return KernelScores(zi, zi, np.zeros(0, bool), zi, z, z, z, z, z, z, names)


def _group_order(*keys: NDArray[np.int64]) -> NDArray[np.intp] | None:
    """The stable order that sorts rows by ``keys`` (first key major), as ``np.lexsort(keys[::-1])``;
    None when the rows are in that order already (a window read in the store's order often is).

    The keys are packed into one int64 where they fit (one sort instead of one per key).
    """
    n = keys[0].size
    packed = np.zeros(n, np.int64)
    room = 1
    for key in keys:
        lo, hi = (int(key.min()), int(key.max())) if n else (0, 0)
        span = hi - lo + 1
        room *= span
        if room >= 2**62:
            return np.lexsort(keys[::-1])
        packed *= span
        packed += key - lo
    if bool(np.all(packed[1:] >= packed[:-1])):
        return None
    return np.argsort(packed, kind="stable")


def score_kernels(
    kc: KernelClusters,
    *,
    roles: Roles | None = None,
    rel_floor: float = REL_FLOOR,
    collective_rel_floor: float = COLLECTIVE_REL_FLOOR,
) -> KernelScores:
    """Score every rank of every (kernel, stream, role) group with :data:`MIN_RANKS` or more ranks.

    Args:
        kc: The window's clusters.
        roles: Ranks are compared only within their role (:mod:`argus.analyzer.roles`);
            default: one role.
        rel_floor: Floor of the W1 excess that scores 1, fraction of the reference mean.
        collective_rel_floor: The same for communication kernels.

    Returns:
        :class:`KernelScores`, rows grouped by (kernel, stream, role) and sorted by rank inside.
    """
    if kc.rank.size == 0:
        return _no_scores(kc.kernel_names)
    role_of = roles.of(kc.rank) if roles is not None else np.zeros(kc.rank.size, np.int64)
    # Sort clusters by (role, kernel, stream, rank): a (group, rank) item is contiguous.
    order = _group_order(role_of, kc.kernel, kc.stream, kc.rank)

    def sort(x: NDArray[_T]) -> NDArray[_T]:
        return x if order is None else x[order]

    kern, strm, rank, role = sort(kc.kernel), sort(kc.stream), sort(kc.rank), sort(role_of)
    count = sort(kc.count).astype(np.float64)
    total = sort(kc.sum_ns)
    new_item = np.r_[
        True,
        (kern[1:] != kern[:-1]) | (strm[1:] != strm[:-1]) | (rank[1:] != rank[:-1]) | (role[1:] != role[:-1]),
    ]
    item = np.cumsum(new_item) - 1
    n_items = int(item[-1]) + 1 if item.size else 0
    first = np.flatnonzero(new_item)
    item_count = np.bincount(item, count, n_items)
    item_sum = np.bincount(item, total, n_items)
    item_kern, item_strm, item_rank, item_role = kern[first], strm[first], rank[first], role[first]
    item_coll = np.zeros(n_items, bool)
    item_coll[item[sort(kc.collective)]] = True  # any of the item's clusters
    new_group = np.r_[
        True,
        (item_kern[1:] != item_kern[:-1])
        | (item_strm[1:] != item_strm[:-1])
        | (item_role[1:] != item_role[:-1]),
    ]
    group_start = np.flatnonzero(new_group)
    group_end = np.r_[group_start[1:], n_items]
    p50, p99 = sort(kc.p50_ns), sort(kc.p99_ns)
    log_lo, log_hi = sort(kc.log_lo), sort(kc.log_hi)
    item_row_end = np.r_[first[1:], item.size]

    keep_items: list[NDArray[np.int64]] = []
    cols: dict[str, list[NDArray[np.float64]]] = {k: [] for k in ("score", "w1", "w1x", "mean", "ref", "ex")}
    for g0, g1 in zip(group_start, group_end, strict=True):
        items = np.arange(g0, g1)
        items = items[item_count[items] >= MIN_CALLS]
        if items.size < MIN_RANKS:
            continue
        sel = np.arange(first[g0], item_row_end[g1 - 1])
        sel = sel[item_count[item[sel]] >= MIN_CALLS]
        local = np.searchsorted(items, item[sel])
        q = mixture_quantiles(local, count[sel], p50[sel], p99[sel], log_lo[sel], log_hi[sel], items.size)
        mean = item_sum[items] / item_count[items]
        healthy = one_sided_scores(mean, floor=rel_floor * float(np.median(mean))).healthy
        ref = frechet_median(q[healthy]) if np.any(healthy) else frechet_median(q)
        ref_mean = float(np.dot(ref, U_WEIGHTS))
        dist, dist_plus = w1_both(q, ref)
        # W1⁺ − W1⁻: the slower part of the distance minus the faster part (see the module doc).
        signed = 2 * dist_plus - dist
        floor = collective_rel_floor if np.any(item_coll[items]) else rel_floor
        res = one_sided_scores(signed, floor=floor * ref_mean)
        keep_items.append(items)
        cols["score"].append(res.score)
        cols["w1"].append(dist)
        cols["w1x"].append(dist_plus)
        cols["mean"].append(mean)
        cols["ref"].append(np.full(items.size, ref_mean))
        cols["ex"].append(item_sum[items] - item_count[items] * ref_mean)
    if not keep_items:
        return _no_scores(kc.kernel_names)
    idx = np.concatenate(keep_items)
    return KernelScores(
        kernel=item_kern[idx].astype(np.int64),
        stream=item_strm[idx].astype(np.int64),
        collective=item_coll[idx],
        rank=item_rank[idx].astype(np.int64),
        score=np.concatenate(cols["score"]),
        w1_ns=np.concatenate(cols["w1"]),
        w1_excess_ns=np.concatenate(cols["w1x"]),
        mean_ns=np.concatenate(cols["mean"]),
        ref_mean_ns=np.concatenate(cols["ref"]),
        excess_ns=np.concatenate(cols["ex"]),
        kernel_names=kc.kernel_names,
    )
