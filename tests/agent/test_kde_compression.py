"""KDE compression as the node agent uses it (must show 6): clusters, fidelity, µs data, compression ratio."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from argus.agent.protocol import ipc_bytes
from argus.kde import compress, fidelity
from argus.kernels import KernelEvents, summarize
from argus.schema import wire_table
from argus.window_grid import WindowGrid

RNG = np.random.default_rng(11)


def _events(durs: np.ndarray, kernel: str = "k") -> pa.Table:
    n = durs.size
    return wire_table(
        "kernel_events",
        {
            "rank": np.zeros(n, np.uint32),
            "kind": ["kernel"] * n,
            "kernel": [kernel] * n,
            "stream": np.full(n, 7, np.uint32),
            "device": np.zeros(n, np.int32),
            "correlation": np.arange(n, dtype=np.uint64),
            "start_ns": np.arange(n, dtype=np.int64) * 1000,
            "dur_ns": durs.astype(np.int64),
        },
    )


def test_bimodal_two_clusters_unimodal_one() -> None:
    uni = RNG.lognormal(np.log(30_000), 0.08, 10_000)
    bi = np.r_[RNG.lognormal(np.log(30_000), 0.04, 5_000), RNG.lognormal(np.log(75_000), 0.04, 5_000)]
    assert len(compress(uni)) == 1
    assert compress(bi)["count"].tolist() == [5_000, 5_000]


def test_fidelity_on_100k_samples_within_5_percent_and_ratio_printed() -> None:
    durs = np.r_[RNG.lognormal(np.log(50_000), 0.1, 70_000), RNG.lognormal(np.log(140_000), 0.15, 30_000)]
    durs = np.round(durs)
    summaries = summarize(KernelEvents.from_wire(_events(durs)), WindowGrid(10_000_000_000))
    clusters = compress(durs)
    assert fidelity(durs, clusters) < 0.05
    raw_bytes = len(ipc_bytes(_events(durs)))
    packed_bytes = len(ipc_bytes(summaries))
    ratio = raw_bytes / packed_bytes
    print(
        f"kde compression: {durs.size} events, {raw_bytes} B raw -> {summaries.num_rows} clusters, "
        f"{packed_bytes} B; ratio {ratio:.0f}x; fidelity {fidelity(durs, clusters):.4f}"
    )
    assert ratio > 500


def test_integer_microsecond_durations_give_no_spurious_clusters() -> None:
    durs = np.round(RNG.lognormal(np.log(9_000), 0.3, 50_000) / 1000) * 1000
    clusters = compress(durs, resolution_ns=1000)
    assert len(clusters) <= 3
    assert fidelity(durs, clusters, resolution_ns=1000) < 0.05
