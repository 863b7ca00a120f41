"""L3: per (kernel, stream), W1 of each rank's rebuilt mixture to its healthy peers."""

from __future__ import annotations

import numpy as np

from argus.analyzer.kernels import _group_order, score_kernels
from argus.analyzer.window import KernelClusters
from argus.kde import compress

RNG = np.random.default_rng(3)


def _clusters(samples: dict[tuple[int, str, bool], np.ndarray]) -> KernelClusters:
    """KDE-compress raw durations per (rank, kernel, collective) into the window's cluster columns."""
    names = tuple(sorted({k for _, k, _ in samples}))
    cols: dict[str, list[float]] = {
        c: [] for c in ("rank", "kernel", "coll", "count", "p50", "p99", "lo", "hi", "sum")
    }
    for (rank, kernel, coll), raw in samples.items():
        for c in compress(raw):
            for key, value in (
                ("rank", rank),
                ("kernel", names.index(kernel)),
                ("coll", coll),
                ("count", c["count"]),
                ("p50", c["p50_ns"]),
                ("p99", c["p99_ns"]),
                ("lo", c["log_lo"]),
                ("hi", c["log_hi"]),
                ("sum", c["sum_ns"]),
            ):
                cols[key].append(value)
    a = {k: np.array(v) for k, v in cols.items()}
    return KernelClusters(
        rank=a["rank"].astype(np.int64),
        kernel=a["kernel"].astype(np.int64),
        stream=np.where(a["coll"].astype(bool), 13, 7).astype(np.int64),
        collective=a["coll"].astype(bool),
        count=a["count"].astype(np.int64),
        p50_ns=a["p50"],
        p99_ns=a["p99"],
        log_lo=a["lo"],
        log_hi=a["hi"],
        sum_ns=a["sum"],
        kernel_names=names,
    )


def _flagged(kc: KernelClusters, kernel: str) -> set[int]:
    s = score_kernels(kc)
    k = s.kernel_names.index(kernel)
    sel = (s.kernel == k) & (s.score >= 1.0)
    return set(s.rank[sel].tolist())


def test_half_the_ranks_slow_on_one_kernel_are_exactly_the_outliers() -> None:
    n, slow = 32, set(range(0, 32, 2))
    samples = {}
    for r in range(n):
        f = 1.2 if r in slow else 1.0
        samples[(r, "gemm", False)] = RNG.lognormal(np.log(50_000 * f), 0.05, 400)
        samples[(r, "softmax", False)] = RNG.lognormal(np.log(8_000), 0.08, 400)
    kc = _clusters(samples)
    assert _flagged(kc, "gemm") == slow
    assert _flagged(kc, "softmax") == set()


def test_a_slow_tail_is_found_though_the_median_is_unchanged() -> None:
    samples = {}
    for r in range(16):
        raw = RNG.lognormal(np.log(20_000), 0.05, 2000)
        if r == 7:
            raw[:100] *= 4  # 5 % of calls four times slower
        samples[(r, "attn", False)] = raw
    kc = _clusters(samples)
    assert _flagged(kc, "attn") == {7}
    s = score_kernels(kc)
    assert abs(np.median(s.mean_ns) - 20_000) < 1_000


def test_shorter_communication_kernels_of_a_straggler_are_not_flagged() -> None:
    """A straggler waits least: its NCCL kernels are the shortest; the peers' long ones are the reference."""
    samples = {}
    for r in range(16):
        wait = 0.0 if r == 5 else 3e6
        samples[(r, "ncclDevKernel_AllReduce", True)] = RNG.lognormal(np.log(1e6), 0.1, 300) + wait
    assert _flagged(_clusters(samples), "ncclDevKernel_AllReduce") == set()


def test_ranks_with_too_few_calls_or_too_few_peers_are_not_compared() -> None:
    samples = {(r, "rare", False): RNG.lognormal(10, 0.1, 2) for r in range(8)}
    samples |= {(r, "two_ranks", False): RNG.lognormal(10, 0.1, 100) for r in range(2)}
    assert score_kernels(_clusters(samples)).rank.size == 0


def test_clusters_of_several_kernel_windows_join_one_mixture() -> None:
    """Two 5 s kernel windows in one 10 s analysis window: the rank's clusters simply add up."""
    one = {
        (r, "k", False): RNG.lognormal(np.log(1e4 * (1.3 if r == 3 else 1.0)), 0.05, 500) for r in range(12)
    }
    two = {
        (r, "k", False): RNG.lognormal(np.log(1e4 * (1.3 if r == 3 else 1.0)), 0.05, 500) for r in range(12)
    }
    a, b = _clusters(one), _clusters(two)
    joined = KernelClusters(
        *(np.concatenate([getattr(a, f), getattr(b, f)]) for f in ("rank", "kernel", "stream", "collective")),
        *(
            np.concatenate([getattr(a, f), getattr(b, f)])
            for f in ("count", "p50_ns", "p99_ns", "log_lo", "log_hi", "sum_ns")
        ),
        kernel_names=a.kernel_names,
    )
    s = score_kernels(joined)
    assert set(s.rank[s.score >= 1].tolist()) == {3}
    assert int(s.rank.size) == 12
    i = int(np.flatnonzero(s.rank == 3)[0])
    assert s.mean_ns[i] / s.ref_mean_ns[i] > 1.25


def test_group_order_is_the_stable_lexsort_order() -> None:
    """Rows sorted by (role, kernel, stream, rank) as ``np.lexsort`` sorts them, ties (the clusters of
    one rank's mixture) in their order; None for rows in that order already; past int64, lexsort."""
    rng = np.random.default_rng(40)
    n = 5000
    role = rng.integers(-1, 3, n)
    kernel, stream, rank = rng.integers(0, 7, n), rng.choice([7, 13, 2**31], n), rng.integers(0, 50, n)
    order = _group_order(role, kernel, stream, rank)
    assert order is not None
    np.testing.assert_array_equal(order, np.lexsort((rank, stream, kernel, role)))
    assert _group_order(role[order], kernel[order], stream[order], rank[order]) is None
    huge = rng.integers(0, 2**40, n)
    np.testing.assert_array_equal(_group_order(huge, huge, rank), np.lexsort((rank, huge, huge)))
