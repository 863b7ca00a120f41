"""REST API read latency on a 10,000-rank job (one straggler) in an embedded store.

    python bench/api.py [--ranks 10000] [--steps 20] [--repeats 3]

Fills a fresh chDB store (a temporary dir) with a synthetic job (synthetic/wire.py: steps,
phases, collectives, kernels, host samples) and times each endpoint in-process (FastAPI's
TestClient, no network), median of ``--repeats``. The last line is key=value pairs, seconds:
jobs_s, job_s, ranks_page_s (1,000 ranks), heatmap_busy_s, heatmap_phase_s, trace_10_ranks_s,
metrics_s, and heatmap_rows (rows the 10,000 ranks fold into) and straggler_found (1 when the
heatmap's worst row holds the slow rank).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient

from argus.collector.api import create_app
from argus.metrics import Metrics
from argus.store import open_store
from synthetic.wire import insert_direct, synthetic_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    slow = args.ranks * 7 // 9
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"chdb://{tmp}/data")
        insert_direct(store, "big", synthetic_job(world_size=args.ranks, steps=args.steps, slow_rank=slow))
        client = TestClient(create_app(store, metrics=Metrics()))
        paths = {
            "jobs_s": "/api/v1/jobs",
            "job_s": "/api/v1/jobs/big",
            "ranks_page_s": "/api/v1/jobs/big/ranks?limit=1000",
            "heatmap_busy_s": "/api/v1/jobs/big/heatmap",
            "heatmap_phase_s": "/api/v1/jobs/big/heatmap?metric=forward",
            "trace_10_ranks_s": f"/api/v1/jobs/big/trace?ranks={slow - 5}-{slow + 4}",
            "metrics_s": "/metrics",
        }
        figures: dict[str, float] = {}
        for key, path in paths.items():
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                response = client.get(path)
                times.append(time.perf_counter() - start)
                assert response.status_code == 200, response.text
            figures[key] = statistics.median(times)
            print(f"{path}: median {figures[key]:.3f} s over {args.repeats}", flush=True)
        heat = client.get("/api/v1/jobs/big/heatmap").json()
        worst = max(
            range(len(heat["rows"])), key=lambda i: max(v for v in heat["slowdown_pct"][i] if v is not None)
        )
        row = heat["rows"][worst]
        store.close()
    found = int(row["rank_lo"] <= slow <= row["rank_hi"])
    pairs = [f"{k}={v:.3f}" for k, v in figures.items()]
    print(" ".join([*pairs, f"heatmap_rows={len(heat['rows'])}", f"straggler_found={found}"]))


if __name__ == "__main__":
    main()
