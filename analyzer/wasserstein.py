"""Wasserstein-1 between rebuilt kernel-duration mixtures, vectorised over ranks.

In one dimension ``W1(F, G) = ∫₀¹ |F⁻¹(u) − G⁻¹(u)| du`` (Villani, *Optimal
Transport*, 2009, remark 2.19), so once every rank's mixture is evaluated at a
fixed set of probabilities, distances to a reference are a weighted row sum.

Quadrature: the probabilities are the midpoints of the cells of
:data:`U_EDGES`, which are finer in the tails (down to 0.1 % cells) so that a
tail that grows (a rare slow mode) is not averaged away; the weights are the
cell widths. The mixture of a rank (count-weighted log-normals censored to
``[log_lo, log_hi]``, :mod:`argus.kde`) has its quantile function in closed form
when it has one cluster, ``exp(clip(mu + sigma·z_u, log_lo, log_hi))``; mixtures of
several clusters are inverted numerically from their CDF on a per-mixture log
grid, all mixtures at once (:func:`mixture_quantiles`).

Reference: the pointwise median of quantile functions over a set of ranks is
the W1 *Fréchet median* of their distributions — it minimises
``Σᵢ W1(Fᵢ, G)`` over G, because the integrand ``Σᵢ |Qᵢ(u) − Q_G(u)|`` is
minimised at each u by the median, and a pointwise median of non-decreasing
functions is itself non-decreasing. Comparing each rank with that one
reference costs O(n·|U|) instead of the O(n²·|U|) of all pairwise distances.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri

from argus.kde import component_cdf, component_params

__all__ = [
    "U_EDGES",
    "U_POINTS",
    "U_WEIGHTS",
    "frechet_median",
    "mixture_quantiles",
    "w1",
    "w1_excess",
]

#: Probability cells of the W1 quadrature: 2.5 % cells in the body, finer in both tails.
U_EDGES = np.unique(
    np.r_[
        0.0,
        0.001,
        0.005,
        0.01,
        0.02,
        0.035,
        np.linspace(0.05, 0.95, 37),
        0.965,
        0.98,
        0.99,
        0.995,
        0.999,
        1.0,
    ]
)
#: Quadrature points (cell midpoints) and weights (cell widths); weights sum to 1.
U_POINTS = 0.5 * (U_EDGES[1:] + U_EDGES[:-1])
U_WEIGHTS = np.diff(U_EDGES)
_Z = ndtri(U_POINTS)
#: Log-grid points per mixture of several clusters when inverting its CDF numerically.
GRID_POINTS = 192


def mixture_quantiles(
    item: ArrayLike,
    count: ArrayLike,
    p50_ns: ArrayLike,
    p99_ns: ArrayLike,
    log_lo: ArrayLike,
    log_hi: ArrayLike,
    n_items: int,
) -> NDArray[np.float64]:
    """Quantile functions, ns, of ``n_items`` rebuilt mixtures at :data:`U_POINTS`.

    Args:
        item: Mixture index of each cluster, shape ``(m,)``, ints in ``[0, n_items)``,
            sorted ascending (clusters of one mixture are contiguous).
        count, p50_ns, p99_ns, log_lo, log_hi: The clusters' columns of
            ``kernel_summaries`` (:data:`argus.kde.CLUSTER_DTYPE`), shape ``(m,)``.
        n_items: Number of mixtures; each must have at least one cluster.

    Returns:
        Shape ``(n_items, len(U_POINTS))``, non-decreasing along axis 1.

    Raises:
        ValueError: ``item`` is not sorted, or a mixture has no cluster.
    """
    it = np.asarray(item, dtype=np.int64)
    if it.size and np.any(np.diff(it) < 0):
        raise ValueError("clusters must be sorted by mixture index")
    per_item = np.bincount(it, minlength=n_items)
    if np.any(per_item == 0):
        raise ValueError("every mixture needs at least one cluster")
    cnt = np.asarray(count, dtype=np.float64)
    p50 = np.asarray(p50_ns, dtype=np.float64)
    p99 = np.asarray(p99_ns, dtype=np.float64)
    lo = np.asarray(log_lo, dtype=np.float64)
    hi = np.asarray(log_hi, dtype=np.float64)
    out = np.empty((n_items, U_POINTS.size))
    single = per_item[it] == 1
    if np.any(single):
        mu, sigma = component_params(p50[single], p99[single])
        x = mu[:, None] + sigma[:, None] * _Z[None, :]
        out[it[single]] = np.exp(np.clip(x, lo[single, None], hi[single, None]))
    multi = ~single
    if np.any(multi):
        out_items = np.unique(it[multi])
        out[out_items] = _invert_mixtures(it[multi], cnt[multi], p50[multi], p99[multi], lo[multi], hi[multi])
    return out


def _invert_mixtures(
    item: NDArray[np.int64],
    count: NDArray[np.float64],
    p50: NDArray[np.float64],
    p99: NDArray[np.float64],
    lo: NDArray[np.float64],
    hi: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Quantiles of several multi-cluster mixtures (``item`` sorted) by CDF inversion on a log grid."""
    starts = np.flatnonzero(np.r_[True, item[1:] != item[:-1]])
    n = starts.size
    row = np.repeat(np.arange(n), np.diff(np.r_[starts, item.size]))
    g_lo = np.minimum.reduceat(lo, starts)
    g_hi = np.maximum.reduceat(hi, starts)
    span = np.maximum(g_hi - g_lo, 1e-12)
    grid = g_lo[:, None] + span[:, None] * np.linspace(0.0, 1.0, GRID_POINTS)[None, :]
    weight = count / np.add.reduceat(count, starts)[row]
    comp = component_cdf(grid[row], p50[:, None], p99[:, None], lo[:, None], hi[:, None])
    cdf = np.add.reduceat(comp * weight[:, None], starts, axis=0)
    cdf = np.maximum.accumulate(np.clip(cdf, 0.0, 1.0), axis=1)
    cdf[:, -1] = 1.0
    # Offsetting row r by 2r makes the whole flattened CDF sorted, so one
    # searchsorted inverts every mixture at every probability.
    offset = 2.0 * np.arange(n)[:, None]
    flat = (cdf + offset).ravel()
    target = U_POINTS[None, :] + offset
    j = (
        np.searchsorted(flat, target.ravel(), side="left").reshape(n, -1)
        - np.arange(n)[:, None] * GRID_POINTS
    )
    j = np.clip(j, 1, GRID_POINTS - 1)
    rows = np.arange(n)[:, None]
    f0, f1 = cdf[rows, j - 1], cdf[rows, j]
    x0, x1 = grid[rows, j - 1], grid[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(f1 > f0, (U_POINTS[None, :] - f0) / (f1 - f0), 1.0)
    x = x0 + np.clip(t, 0.0, 1.0) * (x1 - x0)
    x = np.where(U_POINTS[None, :] <= cdf[:, :1], g_lo[:, None], x)
    return np.asarray(np.exp(x))


def frechet_median(quantiles: NDArray[np.float64]) -> NDArray[np.float64]:
    """W1 Fréchet median of distributions given by quantile rows ``(n, |U|)``: pointwise median."""
    return np.asarray(np.median(quantiles, axis=0))


def w1(quantiles: NDArray[np.float64], reference: NDArray[np.float64]) -> NDArray[np.float64]:
    """W1 distance, ns, of each quantile row ``(n, |U|)`` to ``reference`` ``(|U|,)``; shape ``(n,)``."""
    return np.asarray(np.abs(quantiles - reference[None, :]) @ U_WEIGHTS)


def w1_excess(quantiles: NDArray[np.float64], reference: NDArray[np.float64]) -> NDArray[np.float64]:
    """One-sided W1, ns: the part of each row's W1 to ``reference`` where the row is slower.

    ``∫ max(Q(u) − Q_ref(u), 0) du``; :func:`w1` is this plus the faster part.
    Shape ``(n,)``.
    """
    return np.asarray(np.maximum(quantiles - reference[None, :], 0.0) @ U_WEIGHTS)
