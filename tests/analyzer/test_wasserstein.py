"""W1 between rebuilt mixtures against scipy.stats.wasserstein_distance on the raw samples."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtri
from scipy.stats import wasserstein_distance

from argus.analyzer.wasserstein import (
    U_POINTS,
    U_WEIGHTS,
    _invert_mixtures,
    frechet_median,
    mixture_quantiles,
    w1,
    w1_excess,
)
from argus.kde import component_params, compress, fidelity, mixture_quantile

RNG = np.random.default_rng(11)


def _pairs() -> list[tuple[str, np.ndarray, np.ndarray]]:
    ln = RNG.lognormal
    return [
        ("shifted 10 %", ln(np.log(1e5), 0.1, 5000), ln(np.log(1.1e5), 0.1, 5000)),
        ("wider", ln(np.log(5e4), 0.05, 4000), ln(np.log(5e4), 0.25, 4000)),
        (
            "bimodal vs unimodal",
            np.r_[ln(np.log(2e4), 0.05, 3000), ln(np.log(6e4), 0.05, 3000)],
            ln(np.log(3e4), 0.2, 4000),
        ),
        (
            "slow tail 2 %",
            ln(np.log(1e5), 0.1, 5000),
            np.r_[ln(np.log(1e5), 0.1, 4900), ln(np.log(5e5), 0.1, 100)],
        ),
        ("unequal sizes", ln(np.log(8e3), 0.3, 700), ln(np.log(9e3), 0.3, 20_000)),
    ]


def _quantiles(clusters: np.ndarray) -> np.ndarray:
    c = clusters
    return mixture_quantiles(
        np.zeros(len(c), np.int64), c["count"], c["p50_ns"], c["p99_ns"], c["log_lo"], c["log_hi"], 1
    )[0]


@pytest.mark.parametrize(("name", "a", "b"), _pairs(), ids=[p[0] for p in _pairs()])
def test_quadrature_matches_scipy_on_raw_samples(name: str, a: np.ndarray, b: np.ndarray) -> None:
    """Our W1 quadrature over the empirical quantile functions is scipy's W1 within 1 %."""
    qa, qb = np.quantile(a, U_POINTS), np.quantile(b, U_POINTS)
    ours = float(w1(qa[None, :], qb)[0])
    assert ours == pytest.approx(wasserstein_distance(a, b), rel=0.01)


def _rebuild_error(raw: np.ndarray, clusters: np.ndarray) -> float:
    """W1(raw, its rebuilt mixture), ns (argus.kde.fidelity is relative to max(IQR, 1 ns))."""
    q25, q75 = np.quantile(raw, [0.25, 0.75])
    return fidelity(raw, clusters) * max(q75 - q25, 1.0)


@pytest.mark.parametrize(("name", "a", "b"), _pairs(), ids=[p[0] for p in _pairs()])
def test_w1_of_rebuilt_mixtures_matches_scipy_on_raw_samples(name: str, a: np.ndarray, b: np.ndarray) -> None:
    """After KDE compression (what the store holds), W1 is the raw samples' W1 up to the rebuild errors.

    By the triangle inequality ``|W1(Ma, Mb) − W1(a, b)| <= W1(a, Ma) + W1(b, Mb)``; the quadrature
    adds at most 1 %. In these cases that bound is also within 6 % of the raw W1.
    """
    ca, cb = compress(a), compress(b)
    ours = float(w1(_quantiles(ca)[None, :], _quantiles(cb))[0])
    raw = wasserstein_distance(a, b)
    assert abs(ours - raw) <= _rebuild_error(a, ca) + _rebuild_error(b, cb) + 0.01 * raw
    assert ours == pytest.approx(raw, rel=0.06)


def test_numerical_inversion_agrees_with_kde_mixture_quantile() -> None:
    raw = np.r_[RNG.lognormal(np.log(2e4), 0.05, 3000), RNG.lognormal(np.log(9e4), 0.1, 1000)]
    clusters = compress(raw)
    assert len(clusters) >= 2  # the multi-cluster path
    ours = _quantiles(clusters)
    reference = mixture_quantile(U_POINTS, clusters)
    np.testing.assert_allclose(ours, reference, rtol=1e-2)  # against a 4096-point inversion


def test_many_mixtures_at_once_equal_one_at_a_time() -> None:
    groups = [compress(RNG.lognormal(np.log(1e4 * (i + 1)), 0.1 + 0.05 * i, 2000)) for i in range(5)]
    groups.append(compress(np.r_[RNG.lognormal(9, 0.05, 500), RNG.lognormal(11, 0.05, 500)]))
    item = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    cat = np.concatenate(groups)
    together = mixture_quantiles(
        item, cat["count"], cat["p50_ns"], cat["p99_ns"], cat["log_lo"], cat["log_hi"], len(groups)
    )
    for i, g in enumerate(groups):
        np.testing.assert_allclose(together[i], _quantiles(g), rtol=1e-12)
    assert np.all(np.diff(together, axis=1) >= 0)


def test_frechet_median_minimises_the_sum_of_w1_distances() -> None:
    """The pointwise median of quantile rows is the W1 Fréchet median: no row nor the mean does better."""
    rows = np.sort(RNG.lognormal(10, 0.3, (9, U_POINTS.size)), axis=1)
    rows[:4] *= 1.5  # four slow ranks of nine
    med = frechet_median(rows)
    cost = w1(rows, med).sum()
    assert cost <= w1(rows, rows.mean(axis=0)).sum()
    for r in rows:
        assert cost <= w1(rows, r).sum() + 1e-9
    assert U_WEIGHTS.sum() == pytest.approx(1.0)


def test_one_sided_excess_ignores_the_faster_side() -> None:
    ref = np.linspace(1.0, 2.0, U_POINTS.size) * 1e5
    faster, slower = ref * 0.8, ref * 1.2
    assert w1_excess(faster[None, :], ref)[0] == 0.0
    assert w1_excess(slower[None, :], ref)[0] == pytest.approx(w1(slower[None, :], ref)[0])


def _reference_quantiles(
    item: np.ndarray,
    count: np.ndarray,
    p50: np.ndarray,
    p99: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    n: int,
) -> np.ndarray:
    """The quantiles as computed before issue 40's rewrite, one mixture at a time: one cluster in
    closed form; disjoint clusters (taken in order of ``lo``) cluster by cluster; overlapping
    clusters through the module's numerical inversion."""
    out = np.empty((n, U_POINTS.size))
    for i in range(n):
        rows = np.flatnonzero(item == i)
        rows = rows[np.argsort(lo[rows], kind="stable")]
        c, a, b, lw, h = count[rows], p50[rows], p99[rows], lo[rows], hi[rows]
        if rows.size > 1 and np.any(h[:-1] > lw[1:]):
            out[i] = _invert_mixtures(np.zeros(rows.size, np.int64), c.astype(float), a, b, lw, h)[0]
            continue
        weight = c / c.sum()
        end = np.cumsum(weight)
        end[-1] = 1.0
        j = np.minimum(np.searchsorted(end, U_POINTS, side="right"), rows.size - 1)
        v = np.clip((U_POINTS - (end[j] - weight[j])) / weight[j], 0.0, 1.0)
        mu, sigma = component_params(a, b)
        with np.errstate(invalid="ignore"):
            z = np.nan_to_num(ndtri(v) * sigma[j], nan=0.0)
        out[i] = np.exp(np.clip(mu[j] + z, lw[j], h[j]))
    return out


def test_mixtures_of_every_kind_equal_the_one_at_a_time_reference() -> None:
    """All mixtures of a window in one pass (single clusters, disjoint clusters in any order, clusters
    with no spread, overlapping clusters) give each mixture's quantiles as computed alone."""
    rng = np.random.default_rng(40)
    cols: dict[str, list[float]] = {k: [] for k in ("item", "count", "p50", "p99", "lo", "hi")}
    n = 400
    for i in range(n):
        k = int(rng.choice([1, 1, 2, 3, 5]))
        overlap = k > 1 and rng.random() < 0.2
        centre = np.log(1e4) + np.cumsum(rng.uniform(0.05 if overlap else 0.6, 1.0, k))
        counts = rng.integers(1, 100, k)
        # No quadrature point on a boundary between two clusters, where the quantile jumps and the
        # side it lands on depends on the last bit of a cumulative sum.
        while np.any(np.abs(np.subtract.outer(np.cumsum(counts) / counts.sum(), U_POINTS)) < 1e-9):
            counts = rng.integers(1, 100, k)
        for c in rng.permutation(k):  # clusters not in order of their range
            sigma = 0.0 if rng.random() < 0.1 else rng.uniform(0.01, 0.1)
            mu = centre[c]
            cols["item"].append(i)
            cols["count"].append(int(counts[c]))
            cols["p50"].append(np.exp(mu))
            cols["p99"].append(np.exp(mu + 2.326 * sigma))
            cols["lo"].append(mu - (0.3 if overlap else 0.25) - 3 * sigma)
            cols["hi"].append(mu + (0.3 if overlap else 0.25) + 3 * sigma)
    a = {k: np.array(v) for k, v in cols.items()}
    args = (a["item"].astype(np.int64), a["count"], a["p50"], a["p99"], a["lo"], a["hi"], n)
    ours = mixture_quantiles(*args)
    reference = _reference_quantiles(*args)
    np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=0)
    assert np.all(np.diff(ours, axis=1) >= 0)
