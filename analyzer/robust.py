"""One-sided robust outlier scores: the rule every level uses to call a rank slow.

Why one-sided, and why from the faster half
-------------------------------------------
A straggler only ever *adds* time. So when at most half of the ranks are slow,
the faster half of the ranks is made of healthy ranks only, whatever the slow
ones do. A symmetric rule (median ± k·MAD, or an IQR fence on mean pairwise
distances) breaks down exactly there: with half the ranks slow the median sits
between the two populations and every rank looks equally odd.

:func:`one_sided_scores` therefore

1. takes the faster half of the ranks (the ``ceil(n/2)`` smallest values) as a
   first healthy set and estimates a centre (its median) and a scale (its
   MAD × 1.4826) from it. This start has a 50 % breakdown point for one-sided
   contamination;
2. flags every rank above ``centre + k·scale`` and re-estimates centre and scale
   as the median and MAD of the ranks *not* flagged — one reweighting step as in
   the reweighted least-median estimators of Rousseeuw & Leroy, *Robust
   Regression and Outlier Detection* (1987), §4.1. Without slow ranks the
   faster half alone would put the centre at the 25th percentile and the scale
   at ~0.6 σ; the reweighting restores both to the healthy median and σ;
3. scores each rank as ``(x − centre) / max(k·scale, floor)``.

A score of 1 is the detection threshold (docs/design.md §7.2: ``score >= 1`` = past the
threshold); ranks faster than the centre score ≤ 0. ``floor`` is the smallest
excess worth reporting (callers pass a fraction of the reference step or
kernel time) so that very steady metrics do not turn sub-percent differences
into diagnoses. The cost is two partial sorts, O(n).

A rank compared on many metrics at once (one score per kernel) has a highest score that
chance alone pushes up: of 50 healthy kernels, the largest robust z-score is about 2.8
(score 0.56 at k = 5), and 77 % of the healthy ranks of a 10,000-rank job had one at 0.5 or
more. :func:`highest_of` turns the highest of ``m`` scores into the single score that is as
unlikely under noise alone (Šidák's correction: Z. Šidák, "Rectangular confidence regions for
the means of multivariate normal distributions", JASA 62 (1967) 626-633).

Also here: grouped medians over flat arrays (:func:`grouped_median`), used to
reduce per-row values to per-rank or per-instance medians without Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import norm

__all__ = [
    "K_SIGMA",
    "MAD_TO_SIGMA",
    "OutlierScores",
    "grouped_median",
    "highest_of",
    "one_sided_scores",
    "row_nanmedian",
]

#: MAD of a normal distribution times this is its standard deviation.
MAD_TO_SIGMA = 1.4826
#: Detection threshold in robust standard deviations above the healthy centre.
K_SIGMA = 5.0


@dataclass(frozen=True)
class OutlierScores:
    """Result of :func:`one_sided_scores`.

    Attributes:
        score: Per value, ``(x − centre) / threshold``; >= 1 = outlier; NaN where x is NaN.
        centre: Median of the healthy values (same unit as x).
        scale: Robust standard deviation of the healthy values (MAD × 1.4826).
        threshold: ``max(k·scale, floor)``, the excess that scores 1.
        healthy: True for values below the threshold (False where x is NaN).
    """

    score: NDArray[np.float64]
    centre: float
    scale: float
    threshold: float
    healthy: NDArray[np.bool_]

    @property
    def outliers(self) -> NDArray[np.bool_]:
        """True where ``score >= 1``."""
        return np.asarray(np.nan_to_num(self.score, nan=0.0) >= 1.0)


def _median_mad(v: NDArray[np.float64]) -> tuple[float, float]:
    centre = float(np.median(v))
    return centre, MAD_TO_SIGMA * float(np.median(np.abs(v - centre)))


def one_sided_scores(
    x: ArrayLike,
    *,
    k: float = K_SIGMA,
    floor: float = 0.0,
    min_scale: ArrayLike = 0.0,
) -> OutlierScores:
    """Score values where larger means slower against the healthy (faster) part.

    Args:
        x: One value per rank, shape ``(n,)``, larger = slower; NaN = no data.
        k: Threshold in robust standard deviations.
        floor: Smallest excess over the centre that can score 1 (same unit as x).
        min_scale: Lower bound on the scale, scalar or per value ``(n,)`` (e.g. the
            standard error of a per-rank mean estimated from per-step noise).

    Returns:
        :class:`OutlierScores`. With fewer than 2 values every score is 0 (NaN for
        NaN inputs): one rank has no peers.
    """
    values = np.asarray(x, dtype=np.float64)
    valid = ~np.isnan(values)
    v = values[valid]
    if v.size < 2:
        score = np.where(valid, 0.0, np.nan)
        return OutlierScores(score, float(v[0]) if v.size else np.nan, 0.0, np.inf, valid)
    half = np.partition(v, (v.size + 1) // 2 - 1)[: (v.size + 1) // 2]
    centre, scale = _median_mad(half)
    threshold = max(k * scale, floor)
    kept = v[v <= centre + threshold] if threshold > 0 else v[v <= centre]
    centre, scale = _median_mad(kept)
    per_value_scale = np.maximum(scale, np.asarray(min_scale, dtype=np.float64))
    per_value_threshold = np.maximum(k * per_value_scale, floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = (values - centre) / per_value_threshold
    score = np.where(per_value_threshold > 0, score, np.where(values > centre, np.inf, 0.0))
    healthy = valid & (np.nan_to_num(score, nan=np.inf) < 1.0)
    return OutlierScores(score, centre, scale, max(k * scale, floor), healthy)


def highest_of(score: ArrayLike, m: ArrayLike, *, k: float = K_SIGMA) -> NDArray[np.float64]:
    """The single score as unlikely by chance as ``score`` being the highest of ``m`` scores.

    A score ``s`` of :func:`one_sided_scores` is ``s·k`` robust standard deviations; under
    noise alone (normal, independent) the highest of ``m`` reaches it with probability
    ``1 − (1 − Q(s·k))^m`` (``Q`` the normal tail); the result is the score whose tail is that
    probability (Šidák, module doc). ``m = 1`` returns ``score``; scores at or below 0 are kept.

    Args:
        score: Highest score per rank, shape ``(n,)``.
        m: Scores it is the highest of, per rank ``(n,)`` or one for all, >= 1.
        k: The ``k`` the scores were made with.

    Returns:
        Adjusted scores, shape ``(n,)``, never above ``score``.
    """
    s = np.asarray(score, dtype=np.float64)
    count = np.maximum(np.asarray(m, dtype=np.float64), 1.0)
    tail = -np.expm1(count * np.log1p(-norm.sf(s * k)))  # P(highest of m >= s·k)
    return np.where(s > 0, np.minimum(norm.isf(tail) / k, s), s)


def grouped_median(keys: ArrayLike, values: ArrayLike, n_groups: int) -> NDArray[np.float64]:
    """Median of ``values`` per integer key in ``[0, n_groups)``; NaN for empty groups.

    Args:
        keys: Group index per row, shape ``(m,)``, ints in ``[0, n_groups)``.
        values: Value per row, shape ``(m,)``; NaN rows are ignored.
        n_groups: Number of groups.

    Returns:
        Shape ``(n_groups,)``. Even-sized groups take the mean of the middle two.
    """
    k = np.asarray(keys, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(v)
    k, v = k[keep], v[keep]
    out = np.full(n_groups, np.nan)
    if k.size == 0:
        return out
    packed = _packed_sort(k, v, n_groups)
    if packed is not None:
        k, v = packed
    else:
        k, v = _sorted_by_key_and_value(k, v, n_groups)
    counts = np.bincount(k, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out


def _packed_sort(
    k: NDArray[np.int64], v: NDArray[np.float64], n_groups: int
) -> tuple[NDArray[np.int64], NDArray[np.float64]] | None:
    """Keys and values sorted by (key, value) with one sort of int64, where the values are whole
    numbers whose range and the keys fit one int64 together; else None.

    The analyzer's medians are mostly of nanoseconds (timestamps, durations, their differences):
    whole numbers in float64. Each row becomes ``key << bits | (value - min)``; the sorted values
    are the very floats given (a whole float64 below 2**63 converts to int64 and back exactly; a
    -0.0, which would come back as 0.0, takes the float sort).
    On a 10,000-rank window's 680,000 collective rows: one int64 sort instead of a float argsort,
    the keys' radix sort and the gathers.
    """
    lo_v, hi_v = float(v.min()), float(v.max())
    if not (lo_v >= -(2.0**62) and hi_v < 2.0**62) or not np.array_equal(v, np.trunc(v)):
        return None
    zero = v == 0.0
    if np.any(np.signbit(v[zero])):
        return None
    iv = v.astype(np.int64)
    base = int(iv.min())
    bits = (int(iv.max()) - base).bit_length()
    if bits + max(n_groups - 1, 1).bit_length() > 63:
        return None
    packed = np.sort((k << bits) | (iv - base))
    values = (packed & ((1 << bits) - 1)) + base
    return packed >> bits, values.astype(np.float64)


def _sorted_by_key_and_value(
    k: NDArray[np.int64], v: NDArray[np.float64], n_groups: int
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Keys and values sorted by (key, value), any values (not NaN)."""
    # Rows sorted by value, then stably by key: only the values' order within a group matters
    # (equal values may swap), so the value sort need not be stable; the key sort is a radix sort on
    # 16-bit digits (numpy's stable sort of uint16), low digit first. On a 10,000-rank window's
    # 720,000 collective rows: 0.11 s of CPU (two stable sorts) -> 0.02 s; the order np.lexsort((v, k)) gives.
    order = np.argsort(v)
    order = order[_key_order(k[order], n_groups)]
    return k[order], v[order]


def _key_order(k: NDArray[np.int64], n_groups: int) -> NDArray[np.intp]:
    """Stable sort order of group keys ``k`` in ``[0, n_groups)``: LSD radix by 16-bit digits."""
    order: NDArray[np.intp] = np.argsort(k.astype(np.uint16), kind="stable")
    shift = 16
    while n_groups > 1 << shift:
        digit = (k[order] >> shift).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order


def row_nanmedian(x: ArrayLike) -> NDArray[np.float64]:
    """Median of each row of ``x`` (shape ``(..., m)``, along the last axis) ignoring NaN; NaN for a
    row of NaN only (without numpy's warning).

    The same values as ``np.nanmedian(x, axis=-1)`` (the mean of the middle two of an even count,
    as ``(low + high) / 2``), by one sort of the rows: numpy takes a masked-array path for rows
    shorter than 600, which costs about ten times as much on a 10,000-rank window's (rank, step)
    matrices.

    Returns:
        Shape ``x.shape[:-1]``.
    """
    a = np.asarray(x, dtype=np.float64)
    out = np.full(a.shape[:-1], np.nan)
    if a.shape[-1] == 0:
        return out
    ordered = np.sort(a, axis=-1)  # NaN last
    n = np.count_nonzero(~np.isnan(a), axis=-1)
    lo = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0)[..., None], axis=-1)[..., 0]
    hi = np.take_along_axis(ordered, (n // 2)[..., None], axis=-1)[..., 0]
    has = n > 0
    out[has] = ((lo + hi) / 2.0)[has]
    return out
