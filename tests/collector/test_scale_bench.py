"""bench/scale.py's core at a tiny scale: its simulated agents' batches all stored, its line parses."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from argus.collector.grpc_service import start_collector
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import open_store

_PATH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
_spec = importlib.util.spec_from_file_location("scale_bench", _PATH)
assert _spec is not None and _spec.loader is not None
scale = importlib.util.module_from_spec(_spec)
sys.modules["scale_bench"] = scale
_spec.loader.exec_module(scale)

LINE = re.compile(
    r"^ranks=(\d+) agents=(\d+) offered_rows_per_s=(\d+) stored_rows_per_s=(\d+) analysis_lag_s=(\S+) "
    r"detected_window=(\S+) server_peak_rss_mb=(\d+) simulator_cpu_pct=(\d+) lost=(\d+) "
    r"server_cpu_ms_per_rank_s=(\S+) window_analysis_s=(\S+)$"
)


def test_four_agents_stream_two_windows_and_lose_nothing(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    collector = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0"))
    try:
        job = scale.Job(agents=4, ranks_per_agent=8, window_ns=scale.NS, windows=2, slow_rank=5, drain_s=20)
        ready: queue.Queue[int] = queue.Queue()
        start: queue.Queue[int] = queue.Queue()
        out: list[scale.SimResult] = []

        def simulate() -> None:
            out.append(asyncio.run(scale._simulate(collector.address, job, 0, 4, ready, start)))

        sim = threading.Thread(target=simulate)
        sim.start()
        ready.get(timeout=60)
        t0 = -(-(time.time_ns() + scale.NS // 2) // job.window_ns) * job.window_ns
        start.put(t0)
        sim.join(60)
        (result,) = out
        assert result.error == ""
        assert result.batches == result.acked and not result.not_stored
        counts = {
            t: int(store.query(f"SELECT count() AS n FROM {t} WHERE job_id = 'scale'").column("n")[0].as_py())
            for t in scale.TABLES
        }
    finally:
        collector.stop(5)
        store.close()
    assert counts == result.produced == result.offered
    # 32 ranks, ~8 steps of ~0.5 s, four phases and four collectives a step, 150 clusters a window.
    assert counts["kernel_summaries"] == 32 * 150 * 2
    assert counts["ranks"] == 32 * 3 and counts["jobs"] == 4
    assert counts["phases"] == counts["collectives"] == 4 * counts["steps"] > 0
    watch = scale.Watch(os.getpid(), "http://127.0.0.1:1", job.slow_rank)
    job = scale.Job(**{**job.__dict__, "t0_ns": t0})
    cost = scale.ServerCost(cpu_s=3.2, wall_s=10.0)
    stages = {"read": 0.5, "analyse": 1.0, "write": 0.25}
    line = scale.report(job, [result], counts, {0: t0 + 2 * scale.NS}, watch, 2**30, cost, stages)
    found = LINE.match(line)
    assert found, line
    assert found.group(1, 2, 7, 9) == ("32", "4", "1024", "0")
    assert float(found.group(5)) == float("inf")  # window 1 was never analysed: no analyzer here
    # 3.2 CPU-s over 10 s for 32 ranks: 10 ms per rank per second; a window: read + analyse + write.
    assert float(found.group(10)) == 10.0 and float(found.group(11)) == 1.75
    no_analyzer = LINE.match(scale.report(job, [result], counts, {}, watch, 2**30, cost, {}))
    assert no_analyzer and no_analyzer.group(11) == "nan"


def test_server_cpu_counts_every_process_of_the_tree() -> None:
    """A child's CPU is the server's too (a busy child, the parent idle)."""
    spin = (
        "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
        "print('spun', flush=True)\ntime.sleep(60)"
    )
    me = psutil.Process()
    before = scale.tree_cpu_s(me)
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
        assert scale.tree_cpu_s(me) - before >= 0.5
    finally:
        child.kill()
        child.wait()
