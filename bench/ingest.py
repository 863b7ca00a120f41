"""Ingest throughput of `argus server` on the embedded store, against chDB's own insert speed.

Starts `argus server --no-analyzer` on a temporary chDB data dir, then N client
processes (default 4) each stream raw kernel events (rank, kernel, stream,
start_ns, dur_ns, plus the other wire columns of ``kernel_events``) for a fixed
time, keeping a few batches in flight, and count only the events acknowledged
as STORED. In the same run the very same Arrow batches are inserted straight
into chDB (a second data dir, same dedup tokens, same threads) as the engine's
ceiling.

Last line:
``events_per_s=… engine_events_per_s=… ratio_to_engine=… clients=4 server_peak_rss_mb=…``

    python bench/ingest.py [--seconds 10] [--clients 4] [--batch-rows 65536]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pyarrow as pa

from argus.collector.ingest import encode_arrow_ipc
from argus.config import MAX_MESSAGE_BYTES
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.schema import wire_schema

T0_NS = 1_790_000_000_000_000_000
#: Distinct payloads per client, cycled (each with its own seq, so each is stored).
PAYLOADS_PER_CLIENT = 4


def kernel_events(rank: int, rows: int, part: int, kernels: int) -> pa.Table:
    """``rows`` raw kernel events of one rank, like a CUPTI activity buffer: ns times, ~40-char names."""
    rng = np.random.default_rng(rank * 1000 + part)
    names = pa.array([f"void at::native::elementwise_kernel<128, 4, op_{k}>" for k in range(kernels)])
    dur = rng.lognormal(np.log(20_000), 0.5, rows).astype(np.int64)
    start = T0_NS + part * 10**9 + np.cumsum(dur + 1_000)
    columns = {
        "rank": pa.array(np.full(rows, rank, np.uint32)),
        "kind": pa.array(np.full(rows, "kernel", object), pa.string()),
        "kernel": names.take(pa.array(rng.integers(0, kernels, rows))),
        "stream": pa.array(rng.integers(7, 9, rows).astype(np.uint32)),
        "device": pa.array(np.zeros(rows, np.int32)),
        "correlation": pa.array(np.arange(part * rows, (part + 1) * rows, dtype=np.uint64)),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(dur),
        "graph_id": pa.array(np.zeros(rows, np.uint32)),
        "graph_node_id": pa.array(np.zeros(rows, np.uint64)),
    }
    return pa.table(columns, schema=wire_schema("kernel_events"))


def client(
    target: str,
    rank: int,
    rows: int,
    kernels: int,
    window: int,
    seconds: float,
    ready: Any,
    out: Any,
) -> None:
    """One node agent: build its batches, wait at ``ready``, stream for ``seconds``, count rows acked STORED.

    Puts ``(rows stored, batches not stored, start time, last ack time, CPU s)`` on ``out``.
    """
    payloads = [encode_arrow_ipc(kernel_events(rank, rows, p, kernels)) for p in range(PAYLOADS_PER_CLIENT)]
    in_flight = threading.Semaphore(window)
    agent_id = f"bench-{rank}-{time.time_ns()}"
    stop_at = float("inf")

    def batches():  # type: ignore[no-untyped-def]
        seq = 0
        while time.time() < stop_at:
            in_flight.acquire()
            yield pb.Batch(
                agent_id=agent_id,
                seq=seq,
                job_id="bench",
                table=pb.KERNEL_EVENTS,
                arrow_ipc=payloads[seq % len(payloads)],
            )
            seq += 1

    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    stored = other = 0
    with grpc.insecure_channel(target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        ready.wait()
        start_at = last_ack = time.time()
        stop_at = start_at + seconds
        cpu_start = time.process_time()
        for ack in pb_grpc.CollectorStub(channel).Stream(batches()):
            in_flight.release()
            if ack.status == pb.Ack.STORED:
                stored += ack.rows
            else:
                other += 1
            last_ack = time.time()
    out.put((stored, other, start_at, last_ack, time.process_time() - cpu_start))


def engine_ceiling(data_dir: Path, tables: list[pa.Table], threads: int, seconds: float) -> tuple[int, float]:
    """Insert ``tables`` (with job_id) straight into chDB from ``threads`` threads for ``seconds``.

    Returns (rows, elapsed s). Prints the CPU time per million rows (all threads, chDB's own included).
    """
    from argus.store import open_store

    store = open_store(f"chdb://{data_dir}")
    rows = [0] * threads
    stop_at = time.perf_counter() + seconds

    def work(i: int) -> None:
        seq = 0
        while time.perf_counter() < stop_at:
            table = tables[(i + seq) % len(tables)]
            store.insert("kernel_events", table, dedup_token=f"engine-{i}:{seq}")
            rows[i] += table.num_rows
            seq += 1

    start, cpu_start = time.perf_counter(), sum(psutil.Process().cpu_times()[:2])
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    cpu = sum(psutil.Process().cpu_times()[:2]) - cpu_start
    store.close()
    print(f"engine: {sum(rows)} rows in {elapsed:.2f} s; CPU s per million rows {cpu / sum(rows) * 1e6:.2f}")
    return sum(rows), elapsed


def engine_tables(clients: int, rows: int, kernels: int) -> list[pa.Table]:
    """The clients' batches as the collector inserts them: wire columns plus a job_id dictionary column."""
    tables = []
    for rank in range(clients):
        for part in range(PAYLOADS_PER_CLIENT):
            t = kernel_events(rank, rows, part, kernels)
            job = pa.DictionaryArray.from_arrays(np.zeros(t.num_rows, np.int32), pa.array(["bench"]))
            tables.append(t.append_column("job_id", job))
    return tables


def start_server(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "argus.cli", "server", "--no-analyzer", "--store", f"chdb://{data_dir}"]
    command += ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    out = log.with_suffix(".out")
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.match(r"argus server: gRPC on (\S+?),", out.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"argus server did not start:\n{log.read_text()}")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="streaming time (default %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default %(default)s)")
    parser.add_argument(
        "--batch-rows", type=int, default=65536, help="events per batch (default %(default)s)"
    )
    parser.add_argument(
        "--kernels", type=int, default=200, help="distinct kernel names (default %(default)s)"
    )
    parser.add_argument(
        "--window", type=int, default=4, help="batches in flight per client (default %(default)s)"
    )
    parser.add_argument("--server-only", action="store_true", help="skip the engine ceiling")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="argus-bench-ingest-") as tmp:
        root = Path(tmp)
        # The engine's ceiling is measured before and after the server run (half the time each),
        # so a change in machine load during the run weighs on both sides alike.
        engine_runs: list[tuple[int, float]] = []
        tables = [] if args.server_only else engine_tables(args.clients, args.batch_rows, args.kernels)
        engine_s = min(args.seconds, 10.0) / 2
        if tables:
            engine_runs.append(engine_ceiling(root / "engine-data", tables, args.clients, engine_s))
        events_per_s, rss_mb = server_run(root, args)
        if tables:
            engine_runs.append(engine_ceiling(root / "engine-data", tables, args.clients, engine_s))
    engine = sum(r for r, _ in engine_runs) / sum(t for _, t in engine_runs) if engine_runs else float("nan")
    print(
        f"events_per_s={events_per_s:.0f} engine_events_per_s={engine:.0f} "
        f"ratio_to_engine={events_per_s / engine:.3f} clients={args.clients} server_peak_rss_mb={rss_mb:.0f}"
    )


def server_run(root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Stream from the clients into a fresh server; return (events stored per s, server peak RSS MiB)."""
    server, target = start_server(root / "server-data", root / "server.log")
    try:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        # Every client builds its batches and connects first; then all start together.
        ready = ctx.Barrier(args.clients + 1)
        procs = [
            ctx.Process(
                target=client,
                args=(target, rank, args.batch_rows, args.kernels, args.window, args.seconds, ready, queue),
            )
            for rank in range(args.clients)
        ]
        for p in procs:
            p.start()
        server_ps = psutil.Process(server.pid)
        ready.wait(timeout=300)
        print(f"streaming for {args.seconds} s into argus server pid {server.pid}", flush=True)
        server_cpu_start = sum(server_ps.cpu_times()[:2])
        results = [queue.get(timeout=args.seconds + 300) for _ in procs]
        server_cpu = sum(server_ps.cpu_times()[:2]) - server_cpu_start
        for p in procs:
            p.join()
        rss_mb = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(60)
    stored = sum(r[0] for r in results)
    not_stored = sum(r[1] for r in results)
    # From the first start to the last ack: batches in flight at the stop count, and so does their time.
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)
    client_cpu = sum(r[4] for r in results)
    per_m = 1e6 / max(stored, 1)
    print(
        f"server: {stored} events stored in {elapsed:.2f} s, {not_stored} batches not stored; CPU s per "
        f"million events: server {server_cpu * per_m:.2f}, clients {client_cpu * per_m:.2f}",
        flush=True,
    )
    return stored / elapsed, rss_mb


if __name__ == "__main__":
    main()
