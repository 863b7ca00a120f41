"""The one-sided outlier rule: correct with half the ranks slow, silent on healthy noise."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import iqr

from argus.analyzer.robust import K_SIGMA, grouped_median, highest_of, one_sided_scores, row_nanmedian
from argus.analyzer.wasserstein import U_POINTS, w1

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("n", [8, 64, 1000, 10_000])
def test_no_outlier_on_healthy_noise(n: int) -> None:
    x = RNG.normal(100.0, 2.0, n)
    res = one_sided_scores(x, floor=4.0)
    assert not res.outliers.any()
    assert res.centre == pytest.approx(100.0, abs=1.5)


@pytest.mark.parametrize("n", [8, 64, 1000, 10_000])
@pytest.mark.parametrize("slow_share", [1 / 8, 0.25, 0.5])
def test_exactly_the_slow_ranks_are_flagged_up_to_half(n: int, slow_share: float) -> None:
    x = RNG.normal(100.0, 1.0, n)
    slow = RNG.choice(n, max(1, int(slow_share * n)), replace=False)
    x[slow] *= 1.2
    res = one_sided_scores(x, floor=4.0)
    assert set(np.flatnonzero(res.outliers)) == set(slow.tolist())
    # The reference is the healthy ranks', not pulled toward the slow ones.
    assert res.centre == pytest.approx(100.0, abs=1.0)
    if n >= 64:  # a MAD of a handful of values is too noisy to pin down
        assert res.scale == pytest.approx(1.0, rel=0.3)


def test_a_few_much_faster_ranks_are_not_outliers_and_do_not_move_the_reference() -> None:
    x = RNG.normal(100.0, 1.0, 64)
    x[:6] *= 0.5
    res = one_sided_scores(x, floor=4.0)
    assert not res.outliers.any()
    assert res.centre == pytest.approx(100.0, abs=1.0)


def test_floor_keeps_steady_metrics_from_flagging_tiny_differences() -> None:
    x = np.full(16, 100.0)
    x[3] = 101.0  # 1 % slower, with zero noise among the others
    assert one_sided_scores(x, floor=4.0).score[3] == pytest.approx(0.25)
    assert not one_sided_scores(x, floor=4.0).outliers.any()


def test_nan_means_no_data_not_healthy() -> None:
    x = np.array([1.0, 1.1, np.nan, 0.9, 5.0])
    res = one_sided_scores(x, floor=0.2)
    assert np.isnan(res.score[2]) and not res.healthy[2]
    assert res.outliers.tolist() == [False, False, False, False, True]


def test_iqr_fence_on_mean_pairwise_w1_fails_with_half_the_ranks_slow() -> None:
    """Why the analyzer does not use the plain rule: at 50 % slow every rank's mean W1 looks alike."""
    n = 16
    # Its own generator: the claim is about this sample, whichever tests ran before it.
    q = np.sort(np.random.default_rng(5).lognormal(np.log(1e5), 0.05, (n, U_POINTS.size)), axis=1)
    q[: n // 2] *= 1.3
    mean_w1 = np.array([w1(q, q[i]).mean() for i in range(n)])
    fence = np.quantile(mean_w1, 0.75) + 1.5 * iqr(mean_w1)
    assert not (mean_w1 > fence).any()  # the plain fence finds nobody
    ours = one_sided_scores(q.mean(axis=1), floor=0.04 * 1e5)
    assert set(np.flatnonzero(ours.outliers)) == set(range(n // 2))


def test_grouped_median_matches_numpy() -> None:
    keys = RNG.integers(0, 50, 5000)
    values = RNG.normal(size=5000)
    values[::97] = np.nan
    got = grouped_median(keys, values, 52)
    for k in range(52):
        v = values[(keys == k) & ~np.isnan(values)]
        if v.size:
            assert got[k] == pytest.approx(np.median(v))
        else:
            assert np.isnan(got[k])


def test_highest_of_one_score_is_that_score() -> None:
    scores = np.array([-0.3, 0.0, 0.5, 1.0, 4.0])
    np.testing.assert_allclose(highest_of(scores, 1), scores)


def test_the_highest_of_many_noise_scores_is_as_rare_as_one_after_highest_of() -> None:
    # 10,000 healthy ranks, 50 kernels each, scored as one_sided_scores would: z / K_SIGMA.
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((10_000, 50)) / K_SIGMA
    top = scores.max(axis=1)
    single = np.mean(scores[:, 0] >= 0.5)  # one comparison past 0.5: ~0.6 % of ranks
    assert np.mean(top >= 0.5) > 0.2  # the highest of 50 passes it for a quarter of them
    assert np.mean(highest_of(top, 50) >= 0.5) == pytest.approx(single, abs=0.003)


def test_highest_of_keeps_a_real_outlier_and_never_raises_a_score() -> None:
    top = np.array([0.6, 1.0, 4.7, 40.0])
    adjusted = highest_of(top, [50, 50, 50, 500])
    assert np.all(adjusted <= top)
    assert adjusted[2] > 4.5 and adjusted[3] == 40.0
    assert adjusted[0] < 0.5 < adjusted[1]


def test_grouped_median_equals_each_groups_median() -> None:
    """Per key, the median of its values (NaN ignored; ties and even sizes too), NaN for a key with none."""
    rng = np.random.default_rng(40)
    keys = rng.integers(0, 300, 20_000)
    values = np.round(rng.normal(0.0, 1.0, keys.size), 1)  # many ties
    values[rng.random(keys.size) < 0.05] = np.nan
    got = grouped_median(keys, values, 301)
    for g in range(301):
        own = values[(keys == g) & ~np.isnan(values)]
        if own.size:
            assert got[g] == np.median(own)
        else:
            assert np.isnan(got[g])


def test_row_nanmedian_is_numpys_nanmedian_bit_for_bit() -> None:
    """Rows of every length, NaN-only rows, infinities and ties (integers as floats): the same
    values as ``np.nanmedian(x, axis=-1)``, in two and three dimensions."""
    rng = np.random.default_rng(3)
    for trial in range(400):
        rows, m = int(rng.integers(1, 40)), int(rng.integers(0, 25))
        x = rng.lognormal(20, 1, (rows, m)) * rng.choice([1, -1], (rows, m))
        x[rng.random((rows, m)) < rng.random()] = np.nan
        if trial % 3 == 0:
            x = np.round(x / 1e7)
        if x.size and trial % 4 == 0:
            x.flat[rng.integers(0, x.size, 3)] = rng.choice([np.inf, -np.inf], 3)
        x[0] = np.nan
        stacked = np.stack([x, x[::-1]])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN rows
            expected, expected_3d = np.nanmedian(x, axis=-1), np.nanmedian(stacked, axis=-1)
        np.testing.assert_array_equal(row_nanmedian(x), expected)
        np.testing.assert_array_equal(row_nanmedian(stacked), expected_3d)


def test_grouped_median_past_one_16_bit_digit_of_keys() -> None:
    """Keys beyond 65,535 (the key sort's second radix digit): the medians ``np.lexsort`` gives."""
    rng = np.random.default_rng(41)
    n_groups = 200_000
    keys = np.r_[rng.integers(0, n_groups, 60_000), 65_535, 65_536, 65_536, 131_072, n_groups - 1]
    values = np.round(rng.normal(0.0, 1.0, keys.size), 1)  # many ties
    values[rng.random(keys.size) < 0.05] = np.nan
    got = grouped_median(keys, values, n_groups)
    keep = ~np.isnan(values)
    k, v = keys[keep], values[keep]
    order = np.lexsort((v, k))
    k, v = k[order], v[order]
    counts = np.bincount(k, minlength=n_groups)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    want = np.full(n_groups, np.nan)
    has = counts > 0
    want[has] = 0.5 * (v[starts[has] + (counts[has] - 1) // 2] + v[starts[has] + counts[has] // 2])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("scale", "offset"),
    [
        (1e6, 0.0),
        (1e6, 1.797e18),
        (1.0, -5.0),
        (0.0, 7.0),
        (1e6, 5.0e18),
    ],  # the last: past 2**62, sorted as floats
)
def test_grouped_median_of_whole_numbers_is_each_groups_median_bit_for_bit(
    scale: float, offset: float
) -> None:
    """Whole numbers (ns: timestamps, durations and their signed differences, sorted as packed int64
    where they fit): per key, ``np.median`` of its values, the very floats; NaN ignored."""
    rng = np.random.default_rng(42)
    keys = rng.integers(0, 70_000, 50_000)
    values = np.round(rng.normal(0.0, 1.0, keys.size) * scale) + offset  # ties, both signs
    values[rng.random(keys.size) < 0.05] = np.nan
    got = grouped_median(keys, values, 70_001)
    keep = ~np.isnan(values)
    k, v = keys[keep], values[keep]
    order = np.lexsort((v, k))
    k, v = k[order], v[order]
    counts = np.bincount(k, minlength=70_001)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    want = np.full(70_001, np.nan)
    has = counts > 0
    want[has] = 0.5 * (v[starts[has] + (counts[has] - 1) // 2] + v[starts[has] + counts[has] // 2])
    np.testing.assert_array_equal(got, want)


def test_grouped_median_of_negative_zeros_is_negative_zero() -> None:
    """Whole numbers but a -0.0 (not sorted as packed int64, which would give 0.0): kept."""
    got = grouped_median([0, 0, 1, 1], [-0.0, -0.0, 0.0, 2.0], 2)
    assert np.signbit(got[0]) and got[0] == 0.0
    assert got[1] == 1.0
