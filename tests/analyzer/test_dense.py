"""``dense.unique`` is ``np.unique`` exactly, on the counting path and on the sorting one."""

from __future__ import annotations

import numpy as np
import pytest

from argus.analyzer import dense

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint64])
@pytest.mark.parametrize(
    ("n", "lo", "hi"),
    [
        (1, 7, 8),  # one key
        (1000, -20, 50),  # negative keys, counted
        (100_000, -30_000, 30_000),  # a span wider than an int16 holds
        (200_000, 0, 40_000),  # ranks of a 40,000-rank window: counted
        (50, 0, 10**12),  # ns-wide keys: sorted
    ],
)
def test_unique_is_numpys_unique(dtype: type[np.integer], n: int, lo: int, hi: int) -> None:
    if np.iinfo(dtype).min > lo or np.iinfo(dtype).max < hi:
        pytest.skip("keys outside the dtype")
    x = RNG.integers(lo, hi, n).astype(dtype)
    for ours, flags in (
        (lambda k: (dense.unique(k),), {}),
        (dense.unique_inverse, {"return_inverse": True}),
        (dense.unique_counts, {"return_counts": True}),
        (dense.unique_all, {"return_inverse": True, "return_counts": True}),
    ):
        want = np.unique(x, **flags)
        want = want if isinstance(want, tuple) else (want,)
        got = ours(x)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_empty_and_float_keys_go_to_numpy() -> None:
    empty = dense.unique_inverse(np.zeros(0, np.int64))
    assert empty[0].size == 0 and empty[1].size == 0
    x = np.array([2.5, 1.0, 2.5])
    np.testing.assert_array_equal(dense.unique(x), [1.0, 2.5])


@pytest.mark.parametrize(("lo", "hi"), [(0, 50), (-(10**6), 10**9)])
def test_unique_pairs_is_numpys_unique_of_rows(lo: int, hi: int) -> None:
    a = RNG.integers(lo, hi, 5000)
    a[::7] = a[0]  # repeated pairs
    b = RNG.integers(0, 30, a.size)
    b[::7] = b[0]
    got_pairs, got_inverse = dense.unique_pairs(a, b, 30)
    want_pairs, want_inverse = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
    np.testing.assert_array_equal(got_pairs, want_pairs)
    np.testing.assert_array_equal(got_inverse, want_inverse.ravel())
