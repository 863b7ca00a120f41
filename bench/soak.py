"""Soak of one `argus server` and one real node agent: good traffic flowing, readers reading, bad input
arriving (issues 12 and 39).

Starts `argus server` (analyzer on, embedded store, window 5 s, ``--max-upload-bytes 1 MiB`` and
``--max-decoded-bytes`` of ``--max-decoded-mb``, small so that the compressed batches below press on
it) and one real `argus agent` on its own unix socket, then for ``--minutes``:

- ``--agents`` simulated node agents, each the project's own upload path
  (:class:`argus.agent.uploader.Uploader` over a spool: real batches, sequence numbers and acks
  over gRPC), each streaming one 8-rank job (:func:`synthetic.wire.synthetic_job`: steps, phases,
  collectives, kernel events, host samples; two steps per rank a second) a second at a time,
  spread over ``--agent-processes`` worker processes: on a cluster every node agent has its own
  host, so the agents do not share one interpreter's lock with each other or with the clients
  below, whose waits would otherwise count in their ack times;
- ``--probe-ranks`` probes (the probe's own :class:`argus.agent.sink.AgentLink`) of one job sending
  their steps and phases through the real node agent every second;
- ``--readers`` REST clients reading traces and heatmaps of those jobs without pause.

From the end of the first minute (so that ``rss_after_first_minute_mb`` is the server's RSS under
good traffic alone), bad input arrives beside them, every second a round of
(:mod:`synthetic.bad_inputs` makes them, the same code the tests use):

- into the node agent, on a fresh probe connection (as a crash-looping rank opens): a kernel-events
  frame with string offsets 1 GiB past its data and a negative ``dur_ns`` (must be ``REFUSED``,
  the agent alive), and a steps frame of one good row and three bad ones (null, rank past the
  limit, end before start: must be dropped and counted, ``argus_agent_dropped_events_total``);
- over gRPC, one stream: a batch of garbage bytes, one under an invalid job id, one declaring a
  world size past the limit, six crafted batches (steps and sequence numbers past 2**40, a
  5,000-digit and a 2**31 line number, a 40 kB frame label), a ZSTD batch declaring 1 TiB decoded
  (each must be ``REJECTED``), and valid steps of ``--new-jobs-per-s`` job ids never seen before
  (stored: each a job of its own for the analyzer);
- a trace upload past the upload cap or one that is not JSON, in turn (413, 422);

and every ``--burst-every-s`` seconds ``--burst-streams`` streams at once each send two ZSTD
batches of a few kB that decode to ``--inflate-mb`` and are refused once decoded (one holds an
unknown column, the other's last row ends before it starts): the server holds them decoded until
it refuses them, within the decoded-bytes budget (past it the streams wait).

Then the probes, agents and node agent drain, the server stops, and every good row is counted in
the store.

Last line:
``acked_rows=… stored_rows=… duplicates=… lost=… ack_p99_ms=… server_peak_rss_mb=… rss_limit_mb=…
rss_held=… bad_inputs=… bad_<kind>=…`` (``acked_rows``: rows of STORED acks and of the probes' acks;
``lost``: good rows offered but not stored; ``duplicates``: rows stored more than once;
``ack_p99_ms``: from a batch's send to its ack; ``server_peak_rss_mb``: the server's peak RSS, its
kernel high-water mark (``VmHWM``); ``rss_limit_mb``: ``rss_after_first_minute_mb`` plus the
decoded-bytes budget; ``bad_inputs``: refused or dropped as they should be / sent, all kinds, then
per kind) plus ``new_jobs`` (stored / sent), ``agent_alive``, ``agent_peak_rss_mb``,
``analysis_lag_s``, ``drain_s``, ``reads``, ``read_errors`` and ``server_ack_p99_le_ms`` (the
server's own view: the bucket of ``argus_ingest_ack_seconds``, from a batch's arrival on its
stream to its ack, that holds its p99; an upper bound), ``active_parts_max`` (the most active
parts of one table as the server left the store: merges kept up, nothing piled up). Goals:
``lost=0 duplicates=0``, every bad input refused or dropped, ``rss_held=yes`` (peak RSS within
the budget plus the first minute's), ack p99 <= 1,000 ms.

    python bench/soak.py [--minutes 10] [--agents 50] [--agent-processes 5] [--readers 2]
        [--probe-ranks 4] [--max-decoded-mb 128] [--inflate-mb 32] [--burst-streams 8]
        [--burst-every-s 10] [--new-jobs-per-s 5]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import logging
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # synthetic/ lives at the root

from scale import start_server  # bench/, the script's own folder

from argus.agent.sink import AgentLink
from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.collector.ingest import encode_arrow_ipc
from argus.proto import collector_pb2, collector_pb2_grpc
from argus.store import open_store
from synthetic.bad_inputs import (
    bad_steps,
    corrupt_kernel_events,
    inflating_steps,
    past_what_the_analyzer_represents,
    zstd_bomb,
)
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
#: The server's and the node agent's analysis window, seconds.
WINDOW_S = 5.0
#: The job whose probes send through the real node agent, and the tables they send.
PROBE_JOB = "soak-node"
PROBE_TABLES = ("steps", "phases")
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


def _batch(job_id: str, table: str, payload: bytes, seq: int, agent_id: str) -> collector_pb2.Batch:
    return collector_pb2.Batch(
        agent_id=agent_id,
        seq=seq,
        job_id=job_id,
        table=collector_pb2.Table.Value(table.upper()),
        arrow_ipc=payload,
    )


def _hello(job: str, rank: int, world_size: int) -> dict[str, Any]:
    """A probe's HELLO (protocol version 3: it knows ``REFUSED``)."""
    return {
        "version": 3,
        "job_id": job,
        "rank": rank,
        "local_rank": rank,
        "world_size": world_size,
        "host": "soak-node",
        "pid": os.getpid(),
        "device": "cpu",
        "command": "bench/soak.py",
        "attach_ns": time.time_ns(),
    }


class Probes(threading.Thread):
    """``ranks`` probes of job :data:`PROBE_JOB` sending their steps and phases through the real node
    agent every second (their own :class:`AgentLink` each, as in a training process)."""

    def __init__(self, sock: str, ranks: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak-probes")
        self.links = [AgentLink(sock, _hello(PROBE_JOB, r, ranks)) for r in range(ranks)]
        self.ranks = ranks
        self.stop_event = stop
        self.offered = 0

    def run(self) -> None:
        t, step = time.time_ns() - 10**9, 0
        while not self.stop_event.is_set():
            tables = synthetic_job(
                world_size=self.ranks, steps=STEPS_PER_S, start_ns=t, first_step=step, lifecycle=False
            )
            for rank, link in enumerate(self.links):
                for name in PROBE_TABLES:
                    rows = tables[name].filter(pc.equal(tables[name]["rank"], rank))
                    link.enqueue(name, rows)
                    self.offered += rows.num_rows
                link.pump()
            step += STEPS_PER_S
            t += 10**9
            deadline = time.monotonic() + 1.0
            while not self.stop_event.is_set() and time.monotonic() < deadline:
                for link in self.links:
                    link.pump()
                self.stop_event.wait(0.05)
        for link in self.links:
            link.close(0, 60.0)

    @property
    def acked(self) -> int:
        return sum(link.acked_rows for link in self.links)


def _grpc_bad_inputs() -> list[tuple[str, str, str, bytes]]:
    """The batches each round sends over gRPC that must be ``REJECTED``: ``(kind, job, table, payload)``."""
    ranks = synthetic_job(world_size=2, steps=1)["ranks"].slice(0, 1)
    too_big = ranks.set_column(
        ranks.schema.get_field_index("world_size"), "world_size", pa.array([1 << 31], pa.uint32())
    )
    good = encode_arrow_ipc(synthetic_job(world_size=2, steps=1)["steps"])
    bad = [
        ("garbage", "soak-bad", "steps", b"\xff" * 4096),
        ("bad_job_id", "bad/job/id", "steps", good),
        ("world_size", "soak-bad", "ranks", encode_arrow_ipc(too_big)),
        ("zstd_bomb", "soak-bad", "kernel_events", zstd_bomb()),
    ]
    bad += [
        ("crafted", "soak-crafted", table, encode_arrow_ipc(data))
        for _, table, data, _ in past_what_the_analyzer_represents()
    ]
    return bad


class BadInputs:
    """The bad input of the soak, and what became of it: ``sent[kind]``, ``refused[kind]`` (refused
    as it should be: ``REFUSED`` by the node agent, ``REJECTED`` by the collector, 413/422)."""

    def __init__(self, target: str, http: str, sock: str, args: argparse.Namespace) -> None:
        self.target, self.http, self.sock, self.args = target, http, sock, args
        self.sent: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.errors: list[str] = []
        self._seq = 0
        self._lock = threading.Lock()

    def _next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _count(self, kind: str, refused: bool) -> None:
        with self._lock:
            self.sent[kind] += 1
            self.refused[kind] += refused

    def rounds(self, start: threading.Event, stop: threading.Event) -> None:
        """From ``start`` until ``stop``, one round a second: into the agent, over gRPC, an upload."""
        start.wait()
        bad = _grpc_bad_inputs()
        steps = encode_arrow_ipc(synthetic_job(world_size=2, steps=2)["steps"])
        turn = 0
        with grpc.insecure_channel(self.target) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            while not stop.wait(1.0):
                self._into_the_agent()
                requests = [
                    (kind, _batch(job, table, payload, self._next_seq(), "soak-bad-client"))
                    for kind, job, table, payload in bad
                ]
                requests += [
                    (
                        "new_jobs",
                        _batch(f"soak-new-{turn}-{k}", "steps", steps, self._next_seq(), "soak-bad-client"),
                    )
                    for k in range(self.args.new_jobs_per_s)
                ]
                try:
                    acks = list(stub.Stream(iter([b for _, b in requests]), timeout=60))
                except grpc.RpcError as exc:  # an ended stream is no refusal with a reason
                    self.errors.append(f"bad stream: {exc.code()}")
                    acks = []
                status = {a.seq: a.status for a in acks}
                for kind, b in requests:
                    want = collector_pb2.Ack.STORED if kind == "new_jobs" else collector_pb2.Ack.REJECTED
                    self._count(kind, status.get(b.seq) == want)
                body = gzip.compress(b"0" * (4 * UPLOAD_CAP)) if turn % 2 else b"{not json"
                self._count("upload", _upload(self.http, body) in {413, 422})
                turn += 1

    def _into_the_agent(self) -> None:
        """A corrupt frame and a frame of bad rows, on a fresh probe connection."""
        link = AgentLink(self.sock, _hello("soak-agent-bad", 3, 4))
        link.enqueue("kernel_events", corrupt_kernel_events(3))
        link.enqueue("steps", bad_steps(3))
        answered = link.flush(30.0)
        self._count("corrupt_frame", answered and link.refused_rows == 4)
        with self._lock:
            self.sent["bad_rows"] += 3  # refused: the agent's dropped events, counted at the end
            self.errors += [] if answered else ["a bad frame unanswered in 30 s"]
        link.close(0, 1.0)

    def bursts(self, start: threading.Event, stop: threading.Event) -> None:
        """From ``start`` until ``stop``, every ``--burst-every-s``: ``--burst-streams`` streams at once,
        each two ZSTD batches that decode to ``--inflate-mb`` and are refused once decoded."""
        start.wait()
        payloads = [inflating_steps(self.args.inflate_mb << 20, extra_column=e) for e in (False, True)]
        while not stop.is_set():
            streams = [
                threading.Thread(target=self._inflating_stream, args=(payloads, n), daemon=True)
                for n in range(self.args.burst_streams)
            ]
            for thread in streams:
                thread.start()
            for thread in streams:
                thread.join(300)
            stop.wait(self.args.burst_every_s)

    def _inflating_stream(self, payloads: list[bytes], n: int) -> None:
        batches = [_batch("soak-inflating", "steps", p, self._next_seq(), f"soak-zstd-{n}") for p in payloads]
        try:
            with grpc.insecure_channel(self.target) as channel:
                acks = list(collector_pb2_grpc.CollectorStub(channel).Stream(iter(batches), timeout=300))
        except grpc.RpcError as exc:
            with self._lock:
                self.errors.append(f"inflating stream: {exc.code()}")
            acks = []
        status = {a.seq: a.status for a in acks}
        for b in batches:
            self._count("inflating", status.get(b.seq) == collector_pb2.Ack.REJECTED)


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


def count_rows(data_dir: Path, jobs: dict[str, tuple[str, ...]]) -> tuple[int, int, dict[str, int]]:
    """Rows stored of each job of ``jobs`` in its tables (of :data:`KEYS`), how many of them are
    duplicates, and the active parts of each table as the server left them (merges kept up)."""
    store = open_store(f"chdb://{data_dir}")
    try:
        found = store.query(
            "SELECT table, count() AS n FROM system.parts WHERE active AND database = currentDatabase() "
            "GROUP BY table"
        ).to_pylist()
        parts = {str(row["table"]): int(row["n"]) for row in found}
        stored = duplicates = 0
        for table, key in KEYS.items():
            names = [job for job, tables in jobs.items() if table in tables]
            row = store.query(
                f"SELECT count() AS n, uniqExact(job_id, {key}) AS u FROM {table} "
                "WHERE job_id IN {jobs:Array(String)}",
                {"jobs": names},
            ).to_pylist()[0]
            stored += int(row["n"])
            duplicates += int(row["n"]) - int(row["u"])
        return stored, duplicates, parts
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


def server_metrics(http: str) -> dict[str, float]:
    """From the server's ``/metrics``: ``ack_p99_le_ms``, the upper bound of the
    ``argus_ingest_ack_seconds`` bucket that holds its p99 (ms); ``agent_dropped``, events agents
    and probes reported dropped; ``analysis_lag_s``."""
    with urllib.request.urlopen(f"{http}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ack = families["argus_ingest_ack_seconds"]
    buckets = [(float(s.labels["le"]), s.value) for s in ack.samples if s.name.endswith("_bucket")]
    total = buckets[-1][1] if buckets else 0.0
    p99 = next((le * 1e3 for le, n in buckets if total and n >= 0.99 * total), float("nan"))

    def total_of(name: str) -> float:
        family = families.get(name)
        return sum(s.value for s in family.samples if not s.name.endswith("_created")) if family else 0.0

    return {
        "ack_p99_le_ms": p99,
        "agent_dropped": total_of("argus_agent_dropped_events"),
        "analysis_lag_s": total_of("argus_analysis_lag_seconds"),
    }


def peak_rss_mb(pid: int) -> float:
    """The process's peak RSS since it started (the kernel's high-water mark, ``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def start_agent(root: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    """A real `argus agent` on ``root/a.sock``, uploading to ``target``; the process and its socket."""
    sock = root / "a.sock"
    command = [sys.executable, "-m", "argus.cli", "agent", "--socket", str(sock), "--collector", target]
    command += ["--spool", str(root / "agent-spool"), "--window-s", str(WINDOW_S)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env["ARGUS_AGENT_DRAIN_S"] = str(DRAIN_S)
    with (root / "agent.log").open("wb") as log:
        agent = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while not sock.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            raise SystemExit(f"argus agent did not start:\n{(root / 'agent.log').read_text()}")
        time.sleep(0.1)
    return agent, str(sock)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--agent-processes", type=int, default=5)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--probe-ranks", type=int, default=4, help="probes through the real node agent")
    parser.add_argument(
        "--max-decoded-mb", type=int, default=128, help="the server's --max-decoded-bytes, MiB"
    )
    parser.add_argument(
        "--inflate-mb", type=int, default=32, help="what one compressed batch decodes to, MiB"
    )
    parser.add_argument("--burst-streams", type=int, default=8)
    parser.add_argument("--burst-every-s", type=float, default=10.0)
    parser.add_argument("--new-jobs-per-s", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    # The probe warns of each frame the node agent refuses; the soak counts them instead.
    logging.getLogger(AgentLink.__module__).setLevel(logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="argus-soak-"))
    budget = args.max_decoded_mb << 20
    server, target, http = start_server(
        root / "data", root / "server.log", WINDOW_S,
        "--max-upload-bytes", str(UPLOAD_CAP), "--max-decoded-bytes", str(budget),
    )  # fmt: skip
    agent, sock = start_agent(root, target)
    stop, bad_start = threading.Event(), threading.Event()
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
    bad = BadInputs(target, http, sock, args)
    probes = Probes(sock, args.probe_ranks, stop)
    try:
        counts = {"reads": 0, "read_errors": 0, "read_refusals": 0}
        others = [
            threading.Thread(target=read_forever, args=(http, jobs, stop, counts), daemon=True)
            for _ in range(args.readers)
        ]
        others += [
            threading.Thread(target=bad.rounds, args=(bad_start, stop), daemon=True),
            threading.Thread(target=bad.bursts, args=(bad_start, stop), daemon=True),
        ]
        for worker in workers:
            worker.start()
        for thread in [probes, *others]:
            thread.start()
        ps = psutil.Process(server.pid)
        start = time.monotonic()
        first_minute = min(60.0, args.minutes * 60 / 5)
        rss_first, rss_every_10_s = 0.0, []
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            if elapsed >= first_minute and not rss_first:
                rss_first = ps.memory_info().rss / 2**20
                bad_start.set()  # the bad input arrives from here on
            if elapsed >= 10 * len(rss_every_10_s):
                rss_every_10_s.append(round(ps.memory_info().rss / 2**20))
            time.sleep(0.5)
        bad_start.set()
        stop.set()
        for thread in [probes, *others]:
            thread.join(DRAIN_S)
        tallies = [results.get(timeout=DRAIN_S + 120) for _ in workers]
        agent_alive = agent.poll() is None
        agent_peak = peak_rss_mb(agent.pid) if agent_alive else float("nan")
        agent.terminate()  # drains its spool to the server for at most DRAIN_S
        agent.wait(DRAIN_S + 30)
        spool_left = sum(1 for _ in (root / "agent-spool").rglob("*.batch"))
        figures = server_metrics(http)
        peak = peak_rss_mb(server.pid)
    finally:
        for worker in workers:
            worker.join(10)
        if agent.poll() is None:
            agent.kill()
        server.terminate()
        server.wait(60)
    offered = sum(t["offered"] for t in tallies) + probes.offered
    acked = sum(t["acked"] for t in tallies) + probes.acked
    drain_s = max(t["drain_s"] for t in tallies)
    stored, duplicates, parts = count_rows(
        root / "data", {**dict.fromkeys(jobs, tuple(KEYS)), PROBE_JOB: PROBE_TABLES}
    )
    acks = np.concatenate([np.asarray(t["ack_ms"], float) for t in tallies])
    p99 = float(np.percentile(acks, 99)) if acks.size else float("nan")
    bad.refused["bad_rows"] = int(figures["agent_dropped"])
    shutil.rmtree(root, ignore_errors=True)
    detail = {
        "offered_rows": offered,
        "agent_spool_batches_left": spool_left,
        "errors": bad.errors[:20],
        **counts,
    }
    detail["rss_mb_every_10_s"] = rss_every_10_s
    detail["active_parts"] = parts
    print(json.dumps({**detail, **vars(args)}), file=sys.stderr)
    lost = offered - (stored - duplicates)
    kinds = [k for k in bad.sent if k != "new_jobs"]
    refused = sum(min(bad.refused[k], bad.sent[k]) for k in kinds)
    limit = rss_first + args.max_decoded_mb
    yes = {True: "yes", False: "no"}
    last = {
        "acked_rows": acked, "stored_rows": stored, "duplicates": duplicates, "lost": lost,
        "ack_p99_ms": f"{p99:.0f}", "server_peak_rss_mb": f"{peak:.0f}", "rss_limit_mb": f"{limit:.0f}",
        "rss_held": yes[peak <= limit], "rss_after_first_minute_mb": f"{rss_first:.0f}",
        "max_decoded_mb": args.max_decoded_mb, "bad_inputs": f"{refused}/{sum(bad.sent[k] for k in kinds)}",
        **{f"bad_{k}": f"{bad.refused[k]}/{bad.sent[k]}" for k in kinds},
        "new_jobs": f"{bad.refused['new_jobs']}/{bad.sent['new_jobs']}", "agent_alive": yes[agent_alive],
        "agent_peak_rss_mb": f"{agent_peak:.0f}", "analysis_lag_s": f"{figures['analysis_lag_s']:.1f}",
        "drain_s": f"{drain_s:.0f}", "reads": counts["reads"], "read_errors": counts["read_errors"],
        "server_ack_p99_le_ms": f"{figures['ack_p99_le_ms']:.0f}",
        "active_parts_max": max(parts.values(), default=0),
    }  # fmt: skip
    print(" ".join(f"{key}={value}" for key, value in last.items()))


if __name__ == "__main__":
    main()
