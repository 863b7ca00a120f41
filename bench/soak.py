"""Soak of one `argus server`: agents streaming, readers reading, a client sending bad input (issue 12).

Starts `argus server` (analyzer on, embedded store, ``--max-upload-bytes 1 MiB``), then for
``--minutes``:

- ``--agents`` node agents, each the project's own upload path (:class:`argus.agent.uploader.Uploader`
  over a spool: real batches, sequence numbers and acks over gRPC), each streaming one 8-rank job
  (:func:`synthetic.wire.synthetic_job`: steps, phases, collectives, kernel events, host samples;
  two steps per rank a second) a second at a time, spread over ``--agent-processes`` worker
  processes (default 5): on a cluster every node agent has its own host, so the agents do not
  share one interpreter's lock with each other or with the clients below, whose waits would
  otherwise count in their ack times;
- ``--readers`` REST clients reading traces and heatmaps of those jobs without pause;
- one client sending bad input every second, in turn: an Arrow batch of garbage bytes, a batch
  under an invalid job id, a batch declaring a world size past the limit, a trace upload past
  the upload cap, and a trace that is not JSON. Each must be refused (REJECTED, 413, 422).

Then the agents drain, the server stops, and every row is counted in the store.

Last line:
``acked_rows=… stored_rows=… duplicates=… lost=… ack_p99_ms=… server_peak_rss_mb=… bad_inputs=…``
(``acked_rows``: rows of STORED acks; ``lost``: rows offered but not stored; ``duplicates``: rows
stored more than once; ``ack_p99_ms``: from a batch's send to its ack; ``bad_inputs``: refused as
they should be / sent) plus ``rss_after_first_minute_mb``, ``reads``, ``read_errors`` and
``server_ack_p99_le_ms`` (the server's own view: the bucket of ``argus_ingest_ack_seconds``, from a
batch's arrival on its stream to its ack, that holds its p99; an upper bound). Goals:
``lost=0 duplicates=0``, ack p99 <= 1,000 ms, peak RSS <= 1.5x the RSS after the first minute.

    python bench/soak.py [--minutes 10] [--agents 50] [--agent-processes 5] [--readers 2]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import multiprocessing
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # synthetic/ lives at the root

from scale import start_server  # bench/, the script's own folder

from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.collector.ingest import encode_arrow_ipc
from argus.proto import collector_pb2, collector_pb2_grpc
from argus.store import open_store
from synthetic.wire import synthetic_job

#: Ranks per simulated node agent (one job each).
RANKS = 8
#: Steps a rank makes a second (issue 18's 500 ms step); each is laid out as synthetic_job's.
STEPS_PER_S = 2
#: Tables whose rows are counted, with the key that names one row once.
KEYS = {
    "steps": "rank, step",
    "phases": "rank, step, phase",
    "collectives": "rank, process_group, seq",
    "host_samples": "rank, time_ns",
    "ranks": "rank, time_ns",
    "kernel_events": "rank, stream, start_ns",
}
UPLOAD_CAP = 1 << 20
#: After the soak, how long the agents may take to have every batch acknowledged, seconds.
DRAIN_S = 180.0


def job_id(index: int) -> str:
    """The job of the ``index``-th simulated node agent."""
    return f"soak-{index:03d}"


class Agent(threading.Thread):
    """One node agent: every second, the rows of its job's last second into its uploader."""

    def __init__(self, index: int, target: str, root: Path, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"soak-agent-{index}")
        self.job_id = job_id(index)
        self.stop_event = stop
        self.up = Uploader(
            target, Spool(root / f"spool-{index}", 1 << 30), f"soak-agent-{index}-{time.time_ns()}"
        )
        self.offered: dict[str, int] = dict.fromkeys(KEYS, 0)  # rows added, per table
        self.step = 0

    def run(self) -> None:
        self.up.start()
        t = time.time_ns() - 10**9
        time.sleep(random.random())  # agents out of phase, as on a cluster
        while not self.stop_event.is_set():
            tables = synthetic_job(
                world_size=RANKS,
                steps=STEPS_PER_S,
                start_ns=t,
                first_step=self.step,
                lifecycle=self.step == 0,
            )
            for name, data in tables.items():
                if data.num_rows:
                    self.up.add(self.job_id, name, data)
                    self.offered[name] += data.num_rows
            self.step += STEPS_PER_S
            t += 10**9
            self.stop_event.wait(1.0)


def read_forever(http: str, jobs: list[str], stop: threading.Event, counts: dict[str, int]) -> None:
    """GET traces and heatmaps of random jobs until ``stop``; count answers and errors (status >= 500)."""
    rng = random.Random(1)
    while not stop.is_set():
        job = rng.choice(jobs)
        path = rng.choice(
            [f"/trace?max_events=20000&start={time.time_ns() - 30 * 10**9}", "/heatmap?bins=30"]
        )
        try:
            with urllib.request.urlopen(f"{http}/api/v1/jobs/{job}{path}", timeout=30) as answer:
                answer.read()
            counts["reads"] += 1
        except urllib.error.HTTPError as exc:
            counts["reads"] += 1
            if exc.code >= 500:
                counts["read_errors"] += 1
            elif exc.code != 404:  # a job whose first batch is not stored yet
                counts["read_refusals"] += 1
        except OSError:
            counts["read_errors"] += 1


def _batch(job_id: str, table: str, payload: bytes, seq: int) -> collector_pb2.Batch:
    return collector_pb2.Batch(
        agent_id="soak-bad-client",
        seq=seq,
        job_id=job_id,
        table=collector_pb2.Table.Value(table.upper()),
        arrow_ipc=payload,
    )


def send_bad_forever(target: str, http: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """One bad input a second, in turn; ``counts['refused']`` counts those refused as they should be."""
    ranks = synthetic_job(world_size=2, steps=1)["ranks"].slice(0, 1)
    too_big = ranks.set_column(
        ranks.schema.get_field_index("world_size"), "world_size", pa.array([1 << 31], pa.uint32())
    )
    good = encode_arrow_ipc(synthetic_job(world_size=2, steps=1)["steps"])
    batches = [
        ("soak-bad", "steps", b"\xff" * 4096),
        ("bad/job/id", "steps", good),
        ("soak-bad", "ranks", encode_arrow_ipc(too_big)),
    ]
    seq = 0
    turn = 0
    with grpc.insecure_channel(target) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        while not stop.wait(1.0):
            kind = turn % (len(batches) + 2)
            turn += 1
            counts["sent"] += 1
            if kind < len(batches):
                job, table, payload = batches[kind]
                seq += 1
                try:
                    (ack,) = list(stub.Stream(iter([_batch(job, table, payload, seq)]), timeout=30))
                    counts["refused"] += ack.status == collector_pb2.Ack.REJECTED
                except grpc.RpcError:
                    pass  # an ended stream is no refusal with a reason
                continue
            body = gzip.compress(b"0" * (4 * UPLOAD_CAP)) if kind == len(batches) else b"{not json"
            counts["refused"] += _upload(http, body) in {413, 422}


def _upload(http: str, trace: bytes) -> int:
    """POST one trace file as multipart/form-data; the HTTP status."""
    boundary = "soakboundary"
    body = io.BytesIO()
    body.write(
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="r0.json.gz"\r\n'.encode()
    )
    body.write(b"Content-Type: application/octet-stream\r\n\r\n" + trace + f"\r\n--{boundary}--\r\n".encode())
    request = urllib.request.Request(
        f"{http}/api/v1/jobs/soak-upload/traces",
        data=body.getvalue(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def count_rows(data_dir: Path, jobs: list[str]) -> tuple[int, int]:
    """Rows stored of ``jobs`` in the tables of :data:`KEYS`, and how many of them are duplicates."""
    store = open_store(f"chdb://{data_dir}")
    try:
        stored = duplicates = 0
        for table, key in KEYS.items():
            row = store.query(
                f"SELECT count() AS n, uniqExact(job_id, {key}) AS u FROM {table} "
                "WHERE job_id IN {jobs:Array(String)}",
                {"jobs": jobs},
            ).to_pylist()[0]
            stored += int(row["n"])
            duplicates += int(row["n"]) - int(row["u"])
        return stored, duplicates
    finally:
        store.close()


def run_agents(indices: list[int], target: str, root: str, seconds: float, out: Any) -> None:
    """Worker process: the agents ``indices`` stream for ``seconds``, drain, and put their tallies
    on ``out`` (a multiprocessing queue): offered and acknowledged rows, ack times (ms), drain (s)."""
    stop = threading.Event()
    agents = [Agent(i, target, Path(root), stop) for i in indices]
    for agent in agents:
        agent.start()
    time.sleep(seconds)
    stop.set()
    for agent in agents:
        agent.join(10)
        agent.up.flush()
    drained_by = time.monotonic() + DRAIN_S
    while any(a.up.pending_batches() for a in agents) and time.monotonic() < drained_by:
        time.sleep(0.5)
    drain_s = DRAIN_S - (drained_by - time.monotonic())
    for agent in agents:
        agent.up.close(drain_s=0)
    out.put(
        {
            "offered": sum(sum(a.offered.values()) for a in agents),
            "acked": sum(a.up.stats.rows_stored for a in agents),
            "ack_ms": [ms for a in agents for ms in a.up.stats.ack_ms],
            "drain_s": drain_s,
        }
    )


def server_ack_p99_ms(http: str) -> float:
    """The upper bound of the ``argus_ingest_ack_seconds`` bucket that holds the server's p99, ms."""
    with urllib.request.urlopen(f"{http}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    (family,) = (f for f in text_string_to_metric_families(text) if f.name == "argus_ingest_ack_seconds")
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    total = buckets[-1][1] if buckets else 0.0
    return next((le * 1e3 for le, n in buckets if total and n >= 0.99 * total), float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--agent-processes", type=int, default=5)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="argus-soak-"))
    server, target, http = start_server(
        root / "data", root / "server.log", 5.0, "--max-upload-bytes", str(UPLOAD_CAP)
    )
    stop = threading.Event()
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    jobs = [job_id(i) for i in range(args.agents)]
    shares = [list(range(args.agents))[k :: args.agent_processes] for k in range(args.agent_processes)]
    workers = [
        spawn.Process(
            target=run_agents, args=(indices, target, str(root), args.minutes * 60, results), daemon=True
        )
        for indices in shares
        if indices
    ]
    try:
        counts = {"reads": 0, "read_errors": 0, "read_refusals": 0, "sent": 0, "refused": 0}
        others = [
            threading.Thread(target=read_forever, args=(http, jobs, stop, counts), daemon=True)
            for _ in range(args.readers)
        ]
        others.append(
            threading.Thread(target=send_bad_forever, args=(target, http, stop, counts), daemon=True)
        )
        for worker in workers:
            worker.start()
        for thread in others:
            thread.start()
        ps = psutil.Process(server.pid)
        start = time.monotonic()
        first_minute = min(60.0, args.minutes * 60 / 5)
        rss_first = peak = 0.0
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            rss = ps.memory_info().rss / 2**20
            peak = max(peak, rss)
            if elapsed >= first_minute and not rss_first:
                rss_first = rss
            time.sleep(1.0)
        stop.set()
        for thread in others:
            thread.join(60)
        tallies = []
        for _ in workers:
            tallies.append(results.get(timeout=DRAIN_S + 120))
            peak = max(peak, ps.memory_info().rss / 2**20)
        server_p99 = server_ack_p99_ms(http)
    finally:
        for worker in workers:
            worker.join(10)
        server.terminate()
        server.wait(60)
    offered = sum(t["offered"] for t in tallies)
    acked = sum(t["acked"] for t in tallies)
    drain_s = max(t["drain_s"] for t in tallies)
    stored, duplicates = count_rows(root / "data", jobs)
    acks = np.concatenate([np.asarray(t["ack_ms"], float) for t in tallies])
    p99 = float(np.percentile(acks, 99)) if acks.size else float("nan")
    shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps({"offered_rows": offered, "minutes": args.minutes, "agents": args.agents, **counts}),
        file=sys.stderr,
    )
    lost = offered - (stored - duplicates)
    print(
        f"acked_rows={acked} stored_rows={stored} duplicates={duplicates} lost={lost} ack_p99_ms={p99:.0f} "
        f"server_peak_rss_mb={peak:.0f} bad_inputs={counts['refused']}/{counts['sent']} "
        f"rss_after_first_minute_mb={rss_first:.0f} drain_s={drain_s:.0f} reads={counts['reads']} "
        f"read_errors={counts['read_errors']} server_ack_p99_le_ms={server_p99:.0f}"
    )


if __name__ == "__main__":
    main()
