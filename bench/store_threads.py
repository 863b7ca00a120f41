"""The store under the collector's concurrency: threads inserting and querying at once, no deadlock.

    python bench/store_threads.py [--url chdb://DIR] [--threads 8] [--seconds 300] [--rows 8192]

Opens a fresh store (a temporary chDB data dir unless ``--url``) and runs ``--threads`` threads
for ``--seconds``, each without pause: insert ``--rows`` raw kernel events with a dedup token
(as a collector's writer does), look the batch up in ``ingest_batches`` and record it there, then
query the table (a count and an aggregate over the thread's rows, as the analyzer and the API do).
A watchdog ends the run when no call has returned for ``--stall-s``: that is a deadlock (or a
store that stopped answering) and prints every thread's stack.

Last line: ``threads=8 seconds=300 inserts=… queries=… rows_per_s=… p99_call_s=… max_call_s=…
errors=0 deadlock=0`` (``deadlock=1`` ends the run early).
"""

from __future__ import annotations

import argparse
import faulthandler
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.schema import wire_schema
from argus.store import Store, open_store

T0_NS = 1_790_000_000_000_000_000


def kernel_events(job: str, rank: int, rows: int, part: int) -> pa.Table:
    """``rows`` raw kernel events of ``rank`` (``job_id`` first), like one CUPTI buffer."""
    rng = np.random.default_rng(rank * 7919 + part)
    dur = rng.lognormal(np.log(20_000), 0.5, rows).astype(np.int64)
    names = pa.array([f"void at::native::elementwise_kernel<128, 4, op_{k}>" for k in range(64)])
    columns = {
        "rank": pa.array(np.full(rows, rank, np.uint32)),
        "kind": pa.array(["kernel"] * rows, pa.string()),
        "kernel": names.take(pa.array(rng.integers(0, 64, rows))),
        "stream": pa.array(rng.integers(7, 9, rows).astype(np.uint32)),
        "device": pa.array(np.zeros(rows, np.int32)),
        "correlation": pa.array(np.arange(rows, dtype=np.uint64)),
        "start_ns": pa.array(T0_NS + part * 10**9 + np.cumsum(dur + 1_000)),
        "dur_ns": pa.array(dur),
        "graph_id": pa.array(np.zeros(rows, np.uint32)),
        "graph_node_id": pa.array(np.zeros(rows, np.uint64)),
    }
    data = pa.table(columns, schema=wire_schema("kernel_events"))
    return data.add_column(0, "job_id", pa.array([job] * rows, pa.string()))


class Worker(threading.Thread):
    """One stream thread: insert, record, query, again, until ``stop``."""

    def __init__(self, store: Store, rank: int, rows: int, stop: threading.Event, beat: list[float]) -> None:
        super().__init__(name=f"worker-{rank}", daemon=True)
        self.store, self.rank, self.rows, self.stop, self.beat = store, rank, rows, stop, beat
        self.inserts = self.queries = self.errors = 0
        self.calls: list[float] = []
        self.payloads = [kernel_events("bench", rank, rows, p) for p in range(4)]

    def _call(self, fn: object, *args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)  # type: ignore[operator]
        finally:
            took = time.perf_counter() - t0
            self.calls.append(took)
            self.beat[0] = time.monotonic()

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            agent = f"agent-{self.rank}"
            try:
                self._call(
                    self.store.query,
                    "SELECT agent_id, seq, rows FROM ingest_batches "
                    "WHERE agent_id IN {a:Array(String)} AND seq IN {s:Array(UInt64)}",
                    {"a": [agent], "s": [seq]},
                )
                data = self.payloads[seq % len(self.payloads)]
                self._call(self.store.insert, "kernel_events", data, dedup_token=f"{agent}:{seq}")
                record = pa.table(
                    {
                        "agent_id": [agent],
                        "seq": pa.array([seq], pa.uint64()),
                        "table_name": ["kernel_events"],
                        "rows": pa.array([data.num_rows], pa.uint64()),
                        "job_id": ["bench"],
                    }
                )
                self._call(self.store.insert, "ingest_batches", record)
                self.inserts += 1
                self._call(
                    self.store.query,
                    "SELECT count() AS n, sum(dur_ns) AS d, uniqExact(kernel) AS k FROM kernel_events "
                    "WHERE job_id = 'bench' AND rank = {r:UInt32}",
                    {"r": self.rank},
                )
                self.queries += 2
            except Exception as exc:
                self.errors += 1
                print(f"{self.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                time.sleep(0.1)
            seq += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="store URL (default: a temporary chDB data dir)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rows", type=int, default=8192, help="kernel events per insert")
    parser.add_argument("--stall-s", type=float, default=60.0, help="no call returning this long = deadlock")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(args.url or f"chdb://{tmp}/store")
        stop = threading.Event()
        beat = [time.monotonic()]
        workers = [Worker(store, r, args.rows, stop, beat) for r in range(args.threads)]
        start = time.monotonic()
        for w in workers:
            w.start()
        deadlock = 0
        while time.monotonic() - start < args.seconds:
            time.sleep(1.0)
            if time.monotonic() - beat[0] > args.stall_s:
                deadlock = 1
                print(f"no store call returned for {args.stall_s:.0f} s: stacks follow", file=sys.stderr)
                faulthandler.dump_traceback(all_threads=True)
                break
        stop.set()
        for w in workers:
            w.join(args.stall_s if not deadlock else 1.0)
        elapsed = time.monotonic() - start
        if not deadlock:
            store.close()
    calls = sorted(c for w in workers for c in w.calls)
    inserts = sum(w.inserts for w in workers)
    p99 = calls[int(0.99 * (len(calls) - 1))] if calls else 0.0
    print(
        f"store {args.url or 'chdb (temporary)'}: {inserts} batches of {args.rows} rows in {elapsed:.0f} s, "
        f"median call {statistics.median(calls) if calls else 0:.4f} s",
        file=sys.stderr,
    )
    print(
        f"threads={args.threads} seconds={elapsed:.0f} inserts={inserts} "
        f"queries={sum(w.queries for w in workers)} rows_per_s={inserts * args.rows / elapsed:.0f} "
        f"p99_call_s={p99:.4f} max_call_s={calls[-1] if calls else 0:.4f} "
        f"errors={sum(w.errors for w in workers)} deadlock={deadlock}"
    )
    if deadlock:
        sys.exit(1)


if __name__ == "__main__":
    main()
