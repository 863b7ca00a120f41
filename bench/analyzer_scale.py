"""Scale of the analysis: one window of 10,000 ranks, kernels (L3) and attribution (L2).

**Attribution** (issue 16, "Must show" 3): one 10 s window of a 10,000-rank job
laid out as 5 pipeline stages × 8 tensor-parallel ranks × 250 data-parallel
replicas (:mod:`layout3d`): steps, phases, and per step a GPipe schedule of
point-to-point transfers, tensor-parallel all-reduces and data-parallel
gradient all-reduces — several synchronisation points per step, ~800,000
collective rows — scored by the whole window analysis
(:meth:`argus.analyzer.pipeline.JobAnalysis.analyze`: blocking, roles, L2,
causes, lost time, lifecycle) after two windows that build its references; one
rank 20 % slower. Median of 3 runs of the third window (``attribution_seconds_10k``).

**Kernels** (issue 4, "Must show" 3): one window of 10,000 ranks × 50 kernel groups.

Input: the KDE clusters of one analysis window, as ``kernel_summaries`` holds
them — 50 (kernel, stream) groups, every rank reporting each, 1 cluster per
group for most kernels and 2 for a fifth of them (bimodal kernels), 1 % of the
ranks 20 % slower on every kernel.

* **Ours** — :func:`argus.analyzer.kernels.score_kernels`: rebuild every rank's
  mixture as quantiles, take the W1 Fréchet median of the healthy ranks as the
  reference, score each rank's signed W1 to it (O(n) per group). Median of 3 runs.
* **Reference** — the plain all-pairs mean W1: for every group, every rank's mean
  W1 distance to every other rank (O(n²) per group), on the same quantile rows,
  computed in blocks with NumPy. It runs on the first n ranks of the same input
  for n = 250, 500, 1000, ... while the next size is predicted to finish within
  :data:`ALLPAIRS_BUDGET_S`; the largest size run is reported, with our time on
  the same n ranks.

``peak_rss_mb`` is the process's peak resident memory after our scoring (input
included), before the all-pairs reference runs.

Last line: ``seconds_10k=… peak_rss_mb=… allpairs_seconds=… allpairs_ranks=… attribution_seconds_10k=…
attribution_rows=… attribution_named=…`` (``attribution_named`` is 1 when the slowed rank, and
only it, is flagged). Run: ``python bench/analyzer_scale.py [--ranks 10000] [--kernels 50]``.
"""

from __future__ import annotations

import argparse
import copy
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # synthetic/ lives at the root

from argus.analyzer.kernels import score_kernels
from argus.analyzer.pipeline import JobAnalysis
from argus.analyzer.wasserstein import U_WEIGHTS, mixture_quantiles
from argus.analyzer.window import KernelClusters
from synthetic.layout3d import Layout3D, windows

#: The all-pairs reference must finish within this, seconds.
ALLPAIRS_BUDGET_S = 60.0


def clusters(ranks: int, kernels: int, seed: int = 0) -> KernelClusters:
    """One window's clusters: every rank reports every kernel; see the module doc."""
    rng = np.random.default_rng(seed)
    slow = np.ones(ranks)
    slow[rng.choice(ranks, max(1, ranks // 100), replace=False)] = 1.2
    base = np.geomspace(5e3, 5e6, kernels)
    sigma = rng.uniform(0.03, 0.12, kernels)
    bimodal = rng.random(kernels) < 0.2
    calls = rng.integers(20, 400, kernels)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "kernel", "count", "mu", "sigma")}
    for k in range(kernels):
        # Two modes far enough apart that their clusters do not overlap, as KDE compression makes them.
        modes = ((0.7, 1.0), (0.3, 3.0)) if bimodal[k] else ((1.0, 1.0),)
        for share, factor in modes:
            n_calls = np.maximum(4, (calls[k] * share * rng.uniform(0.9, 1.1, ranks)).astype(np.int64))
            mu = np.log(base[k] * factor * slow) + rng.normal(0, sigma[k] / np.sqrt(n_calls))
            cols["rank"].append(np.arange(ranks))
            cols["kernel"].append(np.full(ranks, k))
            cols["count"].append(n_calls)
            cols["mu"].append(mu)
            cols["sigma"].append(np.full(ranks, sigma[k]))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    mu, sd = c["mu"], c["sigma"]
    return KernelClusters(
        rank=c["rank"].astype(np.int64),
        kernel=c["kernel"].astype(np.int64),
        stream=np.full(mu.size, 7, np.int64),
        collective=np.zeros(mu.size, bool),
        count=c["count"].astype(np.int64),
        p50_ns=np.exp(mu),
        p99_ns=np.exp(mu + 2.326 * sd),
        log_lo=mu - 3.3 * sd,
        log_hi=mu + 3.5 * sd,
        sum_ns=c["count"] * np.exp(mu + 0.5 * sd**2),
        kernel_names=tuple(f"kernel_{k}" for k in range(kernels)),
    )


def subset(kc: KernelClusters, ranks: int) -> KernelClusters:
    keep = kc.rank < ranks
    fields = (
        "rank",
        "kernel",
        "stream",
        "collective",
        "count",
        "p50_ns",
        "p99_ns",
        "log_lo",
        "log_hi",
        "sum_ns",
    )
    return KernelClusters(*(getattr(kc, f)[keep] for f in fields), kernel_names=kc.kernel_names)


def allpairs_mean_w1(kc: KernelClusters, block: int = 256) -> np.ndarray:
    """Per (kernel, rank), the mean W1 distance to every other rank of the kernel: the plain O(n²) rule."""
    out = []
    for k in np.unique(kc.kernel):
        sel = kc.kernel == k
        order = np.argsort(kc.rank[sel], kind="stable")
        rank = kc.rank[sel][order]
        item = np.searchsorted(np.unique(rank), rank)
        q = mixture_quantiles(
            item,
            kc.count[sel][order],
            kc.p50_ns[sel][order],
            kc.p99_ns[sel][order],
            kc.log_lo[sel][order],
            kc.log_hi[sel][order],
            int(item.max()) + 1,
        )
        n = q.shape[0]
        total = np.zeros(n)
        for i in range(0, n, block):
            d = np.einsum("ijk,k->ij", np.abs(q[i : i + block, None, :] - q[None, :, :]), U_WEIGHTS)
            total[i : i + block] = d.sum(axis=1)
        out.append(total / max(n - 1, 1))
    return np.concatenate(out)


def _timed(fn, *args, repeat: int = 1):  # type: ignore[no-untyped-def]
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), result


def attribution(slow_rank: int = 1234) -> tuple[float, int, bool]:
    """Seconds to analyse the third window of the 10,000-rank 3-D job, its rows, whether it named the rank."""
    ws = windows(Layout3D(slow=(slow_rank,)), 3)
    ja = JobAnalysis("scale", ws[0].end_ns - ws[0].start_ns)
    for w in ws[:2]:
        ja.analyze(w)
    times = []
    flagged: set[int] = set()
    for _ in range(3):
        fresh = copy.deepcopy(ja)
        t0 = time.perf_counter()
        result = fresh.analyze(ws[2])
        times.append(time.perf_counter() - t0)
        flagged = {r for f in result.findings if f.score >= 1.0 for r in f.ranks}
    return float(np.median(times)), int(ws[2].collectives.rank.size), flagged == {slow_rank}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=50)
    args = parser.parse_args()
    kc = clusters(args.ranks, args.kernels)
    print(f"input: {args.ranks} ranks x {args.kernels} kernel groups = {kc.rank.size} clusters", flush=True)
    cpu0 = time.process_time()
    seconds, scores = _timed(score_kernels, kc, repeat=3)
    cpu = (time.process_time() - cpu0) / 3
    # Peak memory of the process so far: the input and our scoring (the all-pairs reference after
    # this allocates large blocks of its own).
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    flagged = set(scores.rank[scores.score >= 1].tolist())
    slow = set(kc.rank[kc.p50_ns > 1.1 * np.median(kc.p50_ns[kc.kernel == kc.kernel[0]])].tolist())
    print(
        f"ours: {seconds:.3f} s wall ({cpu:.3f} s CPU) for {args.ranks} ranks; "
        f"{len(flagged)} ranks flagged, {len(flagged & slow)} of them among the slowed ones",
        flush=True,
    )

    n, allpairs_s, allpairs_n, ours_n_s = 250, 0.0, 0, 0.0
    while n <= args.ranks:
        sub = subset(kc, n)
        t, _ = _timed(allpairs_mean_w1, sub)
        ours_t, _ = _timed(score_kernels, sub, repeat=3)
        print(f"n={n}: all-pairs mean W1 {t:.2f} s, ours {ours_t:.3f} s ({t / ours_t:.0f}x)", flush=True)
        allpairs_s, allpairs_n, ours_n_s = t, n, ours_t
        if t * 4 > ALLPAIRS_BUDGET_S:  # the next size (2n) takes ~4x as long
            break
        n *= 2
    print(f"at {allpairs_n} ranks ours took {ours_n_s:.3f} s")
    attr_s, attr_rows, named = attribution()
    print(f"attribution: {attr_s:.3f} s for one window of {attr_rows} collective rows; named: {named}")
    print(
        f"seconds_10k={seconds:.3f} peak_rss_mb={peak_mb:.0f} "
        f"allpairs_seconds={allpairs_s:.2f} allpairs_ranks={allpairs_n} "
        f"attribution_seconds_10k={attr_s:.3f} attribution_rows={attr_rows} attribution_named={int(named)}"
    )


if __name__ == "__main__":
    main()
