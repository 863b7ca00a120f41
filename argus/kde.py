"""KDE compression of kernel durations, and the mixture rebuilt from it (docs/design.md §5).

A group of durations (one rank, kernel name and stream in one window) is reduced
to a few *clusters*, each ``(count, p50_ns, p99_ns, log_lo, log_hi, sum_ns)``:

1. Durations recorded at a coarse resolution (integer µs in Kineto traces) are
   spread evenly over their resolution bin, so the density has no valleys
   between integers (:func:`spread`).
2. The density of the log durations is estimated with a binned Gaussian KDE,
   Scott's bandwidth ``h = std · n^(-1/5)`` (Scott, *Multivariate Density
   Estimation*, 1992), on a grid fine enough that ``dx <= h/3``.
3. The sample is split at density valleys that are deep enough
   (``f_valley <= VALLEY_RATIO · min(adjacent peaks)``), leave at least
   ``min_count`` samples on each side and separate modes by at least
   ``min_log_gap`` (natural-log units).
4. Each cluster keeps exact statistics of its raw durations. Groups with fewer
   than ``min_kde`` samples skip the KDE and start as one cluster of exact
   quantiles.

The rebuilt distribution (:func:`mixture_cdf`, :func:`mixture_quantile`) is a
count-weighted mixture of log-normals, one per cluster: median ``p50``, log-space
scale ``(ln p99 - ln p50) / z(0.99)``, censored to ``[log_lo, log_hi]`` (mass
beyond a bound sits on it). Its median, p99, minimum and maximum are therefore
those of the raw cluster. A cluster this model fits badly (a skewed or
flat-topped mode, a lone outlier) is split during compression where the two
halves fit best, until the group's fidelity reaches the tolerance, so shape is
carried by more clusters, not by more columns.

Fidelity (:func:`fidelity`) is the Wasserstein-1 distance between the raw
durations and the rebuilt mixture, quantised to the recording resolution,
relative to ``max(IQR, resolution)`` of the raw durations.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr, ndtri

__all__ = [
    "CLUSTER_DTYPE",
    "component_cdf",
    "component_params",
    "compress",
    "fidelity",
    "mixture_cdf",
    "mixture_quantile",
    "spread",
    "wasserstein1",
]

#: One row per cluster; the columns of ``kernel_summaries`` minus the group keys.
CLUSTER_DTYPE = np.dtype(
    [
        ("count", np.int64),
        ("p50_ns", np.float64),
        ("p99_ns", np.float64),
        ("log_lo", np.float64),
        ("log_hi", np.float64),
        ("sum_ns", np.float64),
    ]
)

#: Groups smaller than this are kept as one cluster of exact quantiles.
MIN_KDE = 32
#: A valley splits only where the density is at most this fraction of both neighbouring peaks.
VALLEY_RATIO = 0.75
#: Modes closer than this in ln(ns) are one cluster (0.1 ≈ 10.5 % apart).
MIN_LOG_GAP = 0.1
#: At most this many clusters per group.
MAX_CLUSTERS = 8
#: Target fidelity of a compressed group; worse-fitting clusters are split.
TOLERANCE = 0.02
#: ... and the target W1 never exceeds this fraction of the group's mean duration.
MEAN_TOLERANCE = 0.02
#: A cluster is split by refinement only if both halves keep at least this many samples
#: (1: a lone outlier may become its own cluster, which is what W1 rewards).
MIN_REFINE = 1
#: Refinement tries at most this many cut points per split (evenly spaced by rank).
MAX_CUT_CANDIDATES = 64
#: ... on at most this many order statistics of a part.
MAX_CUT_SAMPLES = 2048
_Z99 = float(ndtri(0.99))
#: Durations are floored at 1 ns before taking logs (0 µs occurs in Kineto traces).
_FLOOR_NS = 1.0


def spread(dur_ns: ArrayLike, resolution_ns: float) -> NDArray[np.float64]:
    """Spread durations recorded at ``resolution_ns`` evenly over their bin.

    The ``m`` copies of a recorded value ``v`` become
    ``v + resolution_ns · ((i + 0.5)/m - 0.5)`` for ``i < m`` (deterministic,
    centred on ``v``), floored at ``resolution_ns / 4`` so that 0 stays positive.

    Args:
        dur_ns: Durations, ns, shape ``(n,)``.
        resolution_ns: Timer resolution, ns (1000 for integer-µs traces).

    Returns:
        Spread durations, ns, float64, same order as ``dur_ns``.
    """
    d = np.asarray(dur_ns, dtype=np.float64)
    if resolution_ns <= 1 or d.size == 0:
        return d.copy()
    order = np.argsort(d, kind="stable")
    s = d[order]
    run_start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    run_len = np.diff(np.r_[run_start, s.size])
    first = np.repeat(run_start, run_len)
    m = np.repeat(run_len, run_len)
    idx = np.arange(s.size) - first
    out = np.empty_like(d)
    out[order] = s + resolution_ns * ((idx + 0.5) / m - 0.5)
    return np.maximum(out, resolution_ns / 4)


def _kde_on_grid(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Binned Gaussian KDE of sorted ``x`` with Scott's bandwidth; returns (grid, density)."""
    n = x.size
    h = float(np.std(x)) * n ** (-0.2)
    lo, hi = x[0] - 3 * h, x[-1] + 3 * h
    size = int(min(8192, max(64, np.ceil((hi - lo) / (h / 3)))))
    grid = np.linspace(lo, hi, size)
    dx = grid[1] - grid[0]
    # Linear binning: each sample shares its weight between the two nearest grid points.
    pos = (x - lo) / dx
    left = np.clip(np.floor(pos).astype(np.int64), 0, size - 2)
    frac = pos - left
    counts = np.bincount(left, 1 - frac, size) + np.bincount(left + 1, frac, size)
    half = int(np.ceil(4 * h / dx))
    k = np.exp(-0.5 * (np.arange(-half, half + 1) * dx / h) ** 2)
    density = np.convolve(counts, k / k.sum(), mode="same")
    return grid, density


def _split_points(x: NDArray[np.float64], min_count: int, min_log_gap: float) -> list[float]:
    """Valleys of the KDE of sorted log durations ``x`` that pass every split rule."""
    grid, f = _kde_on_grid(x)
    interior = np.arange(1, f.size - 1)
    valleys = interior[(f[interior] < f[interior - 1]) & (f[interior] <= f[interior + 1])]
    if valleys.size == 0:
        return []
    cuts = list(valleys)
    # Merge the weakest boundary until every boundary passes all three rules.
    while cuts:
        edges = [0, *cuts, f.size]
        peaks = [int(edges[i] + np.argmax(f[edges[i] : edges[i + 1]])) for i in range(len(edges) - 1)]
        counts = np.diff(np.searchsorted(x, [-np.inf, *grid[cuts], np.inf]))
        worst, worst_badness = -1, 0.0
        for j, cut in enumerate(cuts):
            left, right = peaks[j], peaks[j + 1]
            ratio = f[cut] / max(min(f[left], f[right]), 1e-300)
            fails = (
                ratio > VALLEY_RATIO
                or counts[j] < min_count
                or counts[j + 1] < min_count
                or grid[right] - grid[left] < min_log_gap
            )
            badness = ratio + (1.0 if fails else 0.0)
            if fails and badness >= worst_badness:
                worst, worst_badness = j, badness
        if worst < 0:
            break
        del cuts[worst]
    if len(cuts) >= MAX_CLUSTERS:
        depth = sorted(cuts, key=lambda c: f[c])[: MAX_CLUSTERS - 1]
        cuts = sorted(depth)
    return [float(grid[c]) for c in cuts]


def _sorted_quantile(raw: NDArray[np.float64], p: float) -> float:
    """``np.quantile(raw, p)`` (linear) of an already sorted ``raw``, without sorting again."""
    pos = (raw.size - 1) * p
    below = int(pos)
    above = min(below + 1, raw.size - 1)
    return float(raw[below] + (pos - below) * (raw[above] - raw[below]))


def _cluster_stats(raw: NDArray[np.float64]) -> tuple[int, float, float, float, float, float]:
    """Statistics of one cluster's sorted durations, in :data:`CLUSTER_DTYPE` order."""
    return (
        int(raw.size),
        _sorted_quantile(raw, 0.5),
        _sorted_quantile(raw, 0.99),
        math.log(max(float(raw[0]), _FLOOR_NS)),
        math.log(max(float(raw[-1]), _FLOOR_NS)),
        float(raw.sum()),
    )


def _segments_w1(
    raw: NDArray[np.float64], starts: NDArray[np.intp], ends: NDArray[np.intp], resolution_ns: float
) -> NDArray[np.float64]:
    """W1, ns, between each segment ``raw[s:e]`` of sorted ``raw`` and its own one-cluster rebuild.

    Vectorised over segments: the closed-form quantile function of the cluster
    :func:`_cluster_stats` would keep (numpy's linear quantiles), quantised to
    ``resolution_ns``, matched with the sorted samples at mid-probabilities.
    """
    lengths = ends - starts

    def quantile(p: float) -> NDArray[np.float64]:
        pos = (lengths - 1) * p
        below = np.floor(pos).astype(np.intp)
        above = np.minimum(below + 1, lengths - 1)
        a, b = raw[starts + below], raw[starts + above]
        return np.asarray(a + (pos - below) * (b - a))

    mu, sigma = component_params(quantile(0.5), quantile(0.99))
    log_lo = np.log(np.maximum(raw[starts], _FLOOR_NS))
    log_hi = np.log(np.maximum(raw[ends - 1], _FLOOR_NS))
    seg = np.repeat(np.arange(starts.size), lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    k = np.arange(seg.size) - offsets[seg]
    u = (k + 0.5) / lengths[seg]
    q = np.exp(np.clip(mu[seg] + sigma[seg] * ndtri(u), log_lo[seg], log_hi[seg]))
    if resolution_ns > 1:
        q = np.round(q / resolution_ns) * resolution_ns
    return np.asarray(np.add.reduceat(np.abs(raw[starts[seg] + k] - q), offsets) / lengths)


def _best_cut(raw: NDArray[np.float64], resolution_ns: float) -> int:
    """Where to split a sorted part so that its two rebuilds fit best; 0 when it cannot be split.

    Cuts lie between distinct values and leave at least :data:`MIN_REFINE`
    samples each side; at most :data:`MAX_CUT_CANDIDATES`, evenly spaced by rank,
    are tried, on at most :data:`MAX_CUT_SAMPLES` evenly spaced order statistics
    of a large part (W1 of the thinned part tracks W1 of the whole).
    """
    m = raw.size
    if m > MAX_CUT_SAMPLES:
        thin = raw[np.linspace(0, m - 1, MAX_CUT_SAMPLES).round().astype(np.intp)]
        cut = _best_cut(thin, resolution_ns)
        return int(np.searchsorted(raw, thin[cut], side="left")) if cut else 0
    cuts = np.flatnonzero(raw[1:] != raw[:-1]) + 1
    cuts = cuts[(cuts >= MIN_REFINE) & (cuts <= m - MIN_REFINE)]
    if cuts.size == 0:
        return 0
    if cuts.size > MAX_CUT_CANDIDATES:
        cuts = np.unique(cuts[np.linspace(0, cuts.size - 1, MAX_CUT_CANDIDATES).round().astype(np.intp)])
    c = cuts.size
    w1 = _segments_w1(
        raw,
        np.concatenate([np.zeros(c, np.intp), cuts]),
        np.concatenate([cuts, np.full(c, m, np.intp)]),
        resolution_ns,
    )
    return int(cuts[np.argmin(cuts * w1[:c] + (m - cuts) * w1[c:])])


def _refine(
    parts: list[NDArray[np.float64]], resolution_ns: float, target_ns: float
) -> list[NDArray[np.float64]]:
    """Split the worst-fitting part where it fits best until the group's rebuild W1 is within ``target_ns``.

    The parts do not overlap and each rebuilt component stays inside its part's
    range, so the group's W1 is the count-weighted sum of the parts' W1. A split
    that would not lower the error is not made; that part is left as it is.
    """
    total = sum(p.size for p in parts)

    def weighted_w1(pieces: list[NDArray[np.float64]]) -> list[float]:
        sizes = np.array([p.size for p in pieces], dtype=np.intp)
        ends = np.cumsum(sizes)
        w1 = _segments_w1(np.concatenate(pieces), ends - sizes, ends, resolution_ns)
        return [float(e) * p.size / total for p, e in zip(pieces, w1, strict=True)]

    errors = weighted_w1(parts)
    done = [False] * len(parts)
    while len(parts) < MAX_CLUSTERS and sum(errors) > target_ns:
        candidates = [i for i in np.argsort(errors)[::-1] if not done[i] and errors[i] > 0]
        if not candidates:
            break
        i = int(candidates[0])
        cut = _best_cut(parts[i], resolution_ns)
        halves = [parts[i][:cut], parts[i][cut:]]
        split = weighted_w1(halves) if 0 < cut < parts[i].size else []
        if not split or sum(split) >= errors[i]:
            done[i] = True
            continue
        parts[i : i + 1] = halves
        errors[i : i + 1] = split
        done[i : i + 1] = [False, False]
    return parts


def compress(
    dur_ns: ArrayLike,
    resolution_ns: float = 1,
    *,
    min_kde: int = MIN_KDE,
    min_count: int | None = None,
    min_log_gap: float = MIN_LOG_GAP,
    tolerance: float = TOLERANCE,
    mean_tolerance: float = MEAN_TOLERANCE,
) -> NDArray[np.void]:
    """Compress one group of durations into clusters: KDE valleys, then refinement.

    After splitting at density valleys, the cluster whose one-component rebuild
    fits worst (a skewed or flat-topped mode, a lone outlier) is split where its
    two halves fit best, until the whole group's fidelity is within ``tolerance``
    or :data:`MAX_CLUSTERS` is reached. Small groups (< ``min_kde``) skip the KDE
    and are refined the same way, so a handful of distinct values ends up exact.

    Args:
        dur_ns: Durations of one (rank, kernel, stream, window) group, ns, shape ``(n,)``.
        resolution_ns: Timer resolution of ``dur_ns``, ns (1 for CUPTI, 1000 for
            integer-µs profiler traces).
        min_kde: Groups with fewer samples skip the KDE.
        min_count: Fewest samples on each side of a valley split; default ``max(8, n/1000)``.
        min_log_gap: Fewest ln(ns) units between the modes on two sides of a valley split.
        tolerance: Target fidelity (W1 / max(IQR, resolution)) of the whole group;
            raised to ``1/sqrt(n)`` for small groups, where sampling noise dominates.
        mean_tolerance: ... but the rebuild's W1 stays within this fraction of the
            group's mean duration (what cross-rank scoring is relative to).

    Returns:
        Array of :data:`CLUSTER_DTYPE`, sorted by duration; empty for empty input.

    Raises:
        ValueError: a duration is negative or not finite.
    """
    raw = np.asarray(dur_ns, dtype=np.float64).ravel()
    if raw.size == 0:
        return np.empty(0, CLUSTER_DTYPE)
    if not np.all(np.isfinite(raw)) or raw.min() < 0:
        raise ValueError("durations must be finite and >= 0 ns")
    raw = np.sort(raw)
    cuts: list[float] = []
    if raw.size >= min_kde and raw[-1] > raw[0]:
        # spread() keeps sorted input sorted, so x is sorted too.
        x = np.log(np.maximum(spread(raw, resolution_ns), _FLOOR_NS))
        need = min_count if min_count is not None else max(8, raw.size // 1000)
        cuts = _split_points(x, need, min_log_gap)
        parts = [p for p in np.split(raw, np.searchsorted(x, cuts)) if p.size]
    else:
        parts = [raw]
    scale = max(_sorted_quantile(raw, 0.75) - _sorted_quantile(raw, 0.25), float(resolution_ns), 1.0)
    # A sample of n differs from its own distribution by about 0.9/sqrt(n) in this
    # measure (two samples of one distribution by about 1.3/sqrt(n)): refining
    # below 1/sqrt(n) would fit the noise, not the kernel. But ranks are compared
    # relative to their mean duration, and a multi-modal group's IQR is of the
    # order of its mean: there the rebuild must also be within mean_tolerance of
    # the mean, or two ranks with the same durations could be rebuilt apart.
    target_ns = min(max(tolerance, 1.0 / math.sqrt(raw.size)) * scale, mean_tolerance * float(raw.mean()))
    parts = _refine(parts, resolution_ns, target_ns)
    return np.array([_cluster_stats(p) for p in parts], dtype=CLUSTER_DTYPE)


def component_params(p50_ns: ArrayLike, p99_ns: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Log-space ``(mu, sigma)`` of each cluster's log-normal; broadcasts over arrays of clusters."""
    mu = np.log(np.maximum(np.asarray(p50_ns, dtype=np.float64), _FLOOR_NS))
    top = np.log(np.maximum(np.asarray(p99_ns, dtype=np.float64), _FLOOR_NS))
    return mu, np.maximum(top - mu, 0.0) / _Z99


def component_cdf(
    x: ArrayLike, p50_ns: ArrayLike, p99_ns: ArrayLike, log_lo: ArrayLike, log_hi: ArrayLike
) -> NDArray[np.float64]:
    """CDF at log durations ``x`` (ln ns) of censored cluster log-normals; all arguments broadcast.

    Vectorised for the analyzer: pass ``x`` as ``(..., 1)`` against cluster arrays ``(k,)``.
    """
    x = np.asarray(x, dtype=np.float64)
    mu, sigma = component_params(p50_ns, p99_ns)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (x - mu) / sigma
    z = np.where(sigma > 0, z, np.where(x >= mu, np.inf, -np.inf))
    cdf = ndtr(z)
    return np.where(x < log_lo, 0.0, np.where(x >= log_hi, 1.0, cdf))


def mixture_cdf(x_log: ArrayLike, clusters: NDArray[np.void]) -> NDArray[np.float64]:
    """CDF of the rebuilt mixture at log durations ``x_log`` (ln ns), shape of ``x_log``.

    Args:
        x_log: Points, ln(ns), any shape.
        clusters: One group's clusters, :data:`CLUSTER_DTYPE`, shape ``(k,)``.

    Raises:
        ValueError: ``clusters`` is empty.
    """
    if clusters.size == 0:
        raise ValueError("cannot rebuild a distribution from no clusters")
    x = np.asarray(x_log, dtype=np.float64)
    w = clusters["count"] / clusters["count"].sum()
    c = clusters
    comp = component_cdf(x[..., None], c["p50_ns"], c["p99_ns"], c["log_lo"], c["log_hi"])
    return np.asarray(comp @ w)


def mixture_quantile(
    u: ArrayLike, clusters: NDArray[np.void], resolution_ns: float = 1, grid_size: int = 4096
) -> NDArray[np.float64]:
    """Quantile function of the rebuilt mixture, ns, quantised to ``resolution_ns``.

    Inverts :func:`mixture_cdf` on a grid of ``grid_size`` log points spanning
    the clusters' ``[log_lo, log_hi]``.

    Args:
        u: Probabilities in [0, 1], any shape.
        clusters: One group's clusters, :data:`CLUSTER_DTYPE`.
        resolution_ns: Values are rounded to multiples of this (1 = none).
    """
    lo, hi = float(clusters["log_lo"].min()), float(clusters["log_hi"].max())
    if hi <= lo:
        q = np.full(np.shape(u), np.exp(lo))
    else:
        # The CDF jumps at every cluster's bounds (censored mass, point masses): put grid
        # points on each bound and just below it, so the inversion lands on the atom itself.
        atoms = np.concatenate([clusters["log_lo"], clusters["log_hi"]])
        grid = np.unique(
            np.concatenate([np.linspace(lo, hi, grid_size), atoms, np.nextafter(atoms, -np.inf)])
        )
        grid = grid[(grid >= lo) & (grid <= hi)]
        cdf = np.maximum.accumulate(mixture_cdf(grid, clusters))
        cdf[-1] = 1.0
        # Where the CDF jumps (censoring mass at log_lo, point masses), interp picks the jump point.
        q = np.exp(np.interp(np.asarray(u, dtype=np.float64), cdf, grid))
        q = np.where(np.asarray(u) <= cdf[0], np.exp(lo), q)
    if resolution_ns > 1:
        q = np.round(q / resolution_ns) * resolution_ns
    return np.asarray(q, dtype=np.float64)


def wasserstein1(a_sorted: NDArray[np.float64], b_sorted: NDArray[np.float64]) -> float:
    """Wasserstein-1 distance between two equal-size sorted samples: ``mean |a_i - b_i|``."""
    if a_sorted.shape != b_sorted.shape:
        raise ValueError("samples must have the same shape")
    return float(np.mean(np.abs(a_sorted - b_sorted)))


def fidelity(dur_ns: ArrayLike, clusters: NDArray[np.void], resolution_ns: float = 1) -> float:
    """W1(raw, rebuilt mixture) / max(IQR(raw), resolution_ns) — the fidelity of docs/design.md §5.

    The mixture's quantile function is evaluated at the ``n`` mid-probabilities
    ``(i + 0.5)/n`` and matched with the sorted raw durations, which is the
    W1 distance between the empirical distribution and the mixture (midpoint rule).

    Returns:
        Unitless relative error; 0 is a perfect rebuild.
    """
    raw = np.sort(np.asarray(dur_ns, dtype=np.float64).ravel())
    if raw.size == 0:
        raise ValueError("no durations")
    u = (np.arange(raw.size) + 0.5) / raw.size
    rebuilt = mixture_quantile(u, clusters, resolution_ns)
    q25, q75 = np.quantile(raw, [0.25, 0.75])
    return wasserstein1(raw, rebuilt) / max(float(q75 - q25), float(resolution_ns), 1.0)
