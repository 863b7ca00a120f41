"""A 10,000-rank job streamed through one `argus server` (issue 18): what the server sustains end to end.

One `argus server` on the embedded store (chDB), its analyzer on, window
``--window-s``. ``--agents`` simulated node agents (default 1,250) of
``--ranks-per-agent`` ranks (8) stream a synchronous job's rows to it live, in
``--procs`` simulator processes (default 3), each running its agents as
asyncio tasks. Each agent has its own gRPC channel (its own connection) and one
``argus.v1.Collector/Stream`` call, and speaks the agent's wire protocol:
``Batch`` messages with a unique agent id, sequence numbers from 1, one table's
rows as an Arrow IPC stream (:func:`argus.agent.protocol.ipc_bytes`, the node
agent's encoder), a flush's batches as the members of one message (``--per-table``:
one message each, the wire before flushes), at most :data:`MAX_INFLIGHT` messages
unacknowledged (the node agent's ``max_inflight``); every ``Ack`` is matched to its
message. A stream that ends with
an error is opened again and its unacknowledged batches sent again, as the node
agent does.

The job (:class:`synthetic.fleet.Fleet`, played from one seed in every process
so the job-wide all-reduce waits for the last rank of the whole world): per
rank a ~500 ms step with the four phases and four all-reduces (three in the
node's group of 8, one across the job), a host sample per second, and per
window 50 kernel groups × 3 KDE clusters (150 ``kernel_summaries`` rows); each
rank's attach and its two process groups first (the world group lists every
rank, as the probe records it). From the start of window 2 (windows count from
0, aligned to the server's) one rank, ``--slow-rank``, computes 20 % longer.
Like the node agent, every agent flushes once a second (agents spread evenly
over the second), held while the server has not acknowledged its earlier
batches, for at most :data:`~argus.agent.uploader.HOLD_FLUSHES` seconds
(:func:`argus.agent.uploader.flush_due`): one message, a batch per table with the rows
completed since its last flush, the kernel summaries of a window one second
after the window ends.

Reported (the last line):

- ``offered_rows_per_s``: rows the job made (every table), over its duration
  (from its start to the end of its last window plus :data:`TAIL_S`): the load
  the agents offer; ``stored_rows_per_s``: rows counted in the store at the end
  (every table, this job), over the time from the first batch (the ranks'
  attach rows, half a second before the job's start) to the last
  acknowledgement (a server that falls behind acknowledges late, and holds the
  agents back: at most :data:`MAX_INFLIGHT` batches each in flight). A server
  that keeps up still acknowledges the last rows up to a flush period after the
  job's stop, so keeping up reads as ``stored`` within about 3 % of ``offered``
  (the detail line gives the last ack's delay after the stop);
- ``analysis_lag_s``: the largest, over the job's windows, of the time its
  analysis was written (``analysis_windows.updated_ns``) minus the window's end;
  by design it includes the analyzer's grace for late rows (``max(2 s, window / 4)``)
  and up to one polling interval (half a window);
- ``detected_window``: the window, counted from the slowdown's onset (its first
  window is 1), whose analysis first wrote a diagnosis naming the slowed rank:
  the REST API is polled every 2 s, and the window is the
  newest one analysed when the diagnosis was first seen; ``nan``: never named. A diagnosis
  names its ``rank``, or its ``ranks`` when it is job-level (as in ``bench/detection_live.py``);
  it must name the slowed rank alone;
- ``server_peak_rss_mb``: the largest resident memory of the server's process
  tree (psutil, sampled every 0.5 s, and the kernel's high-water mark of the
  server process);
- ``simulator_cpu_pct``: CPU time of all simulator processes over the
  streaming time, in percent of one core (200 = both cores of a 2-core machine);
- ``lost``: rows the job made that are not in the store at the end. Agents
  stop ``--drain-s`` seconds after the job's end: what they have not sent or
  not had acknowledged by then is lost (the server did not keep up), as it
  would sit in a real agent's spool;
- ``server_cpu_ms_per_rank_s``: what each rank costs the server: CPU time of the
  server's whole process tree (every thread of every process, chDB's engine
  threads included; psutil, :func:`tree_cpu_s`) from the ranks' attach to the
  last acknowledgement, in milliseconds per rank per second of that time
  (0.1 = 100 % of one core for 10,000 ranks);
- ``window_analysis_s``: the server's own ``argus_analysis_window_seconds``
  histogram: its mean read + analyse + write time of one window, over the job's
  windows (``nan`` with ``--no-analyzer``).

The line before the last gives the per-table counts, acks, server CPU and the
diagnoses seen. The simulators share the machine with the server: on a 2-core
machine read the server's figures with ``simulator_cpu_pct`` in mind.

    python bench/scale.py [--agents 1250] [--windows 6] [--window-s 10] [--procs 3] [--drain-s 60]
                          [--keep DIR] [--no-analyzer] [--per-table]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # synthetic/ lives at the root

import grpc  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from argus.agent.protocol import ipc_bytes, table_code  # noqa: E402
from argus.agent.uploader import HOLD_FLUSHES, flush_due  # noqa: E402
from argus.config import MAX_MESSAGE_BYTES  # noqa: E402
from argus.proto import collector_pb2 as pb  # noqa: E402
from argus.proto import collector_pb2_grpc as pb_grpc  # noqa: E402
from argus.window_grid import WindowGrid  # noqa: E402
from synthetic.fleet import Fleet  # noqa: E402

JOB_ID = "scale"
#: Batches sent and not yet acknowledged, per agent (the node agent's ``max_inflight``).
MAX_INFLIGHT = 64
#: The node agent's flush period, s.
FLUSH_S = 1.0
#: The window in which the slowdown begins (windows count from 0).
ONSET_WINDOW = 2
#: Data keeps coming this long after the last window, s (its heartbeats complete the last window).
TAIL_S = 2.0
#: An agent whose stream ended opens a new one this long after, s (the node agent's first back-off).
RECONNECT_S = 0.2
NS = 1_000_000_000


def _table_name(table: pb.Table.ValueType) -> str:
    """The wire table name of ``argus.v1.Table`` value ``table``."""
    return pb.Table.Name(table).lower()


TABLES = ("jobs", "ranks", "steps", "phases", "collectives", "kernel_summaries", "host_samples")


@dataclass(frozen=True)
class Job:
    """What every simulator process plays: the fleet's shape and clock."""

    agents: int
    ranks_per_agent: int
    window_ns: int
    windows: int
    slow_rank: int
    drain_s: float = 60.0
    t0_ns: int = 0
    #: Each table's rows a message of its own (the wire before flushes), not one message a flush.
    per_table: bool = False

    @property
    def onset_ns(self) -> int:
        return self.t0_ns + ONSET_WINDOW * self.window_ns

    @property
    def stop_ns(self) -> int:
        return self.t0_ns + self.windows * self.window_ns + int(TAIL_S * NS)

    def fleet(self) -> Fleet:
        return Fleet(
            self.agents,
            self.ranks_per_agent,
            t0_ns=self.t0_ns,
            window_ns=self.window_ns,
            slow_rank=self.slow_rank,
            onset_ns=self.onset_ns,
        )


@dataclass
class SimResult:
    """One simulator process's counts (rows by table), times (ns since the epoch) and CPU time."""

    offered: dict[str, int] = field(default_factory=dict)
    #: Rows the job made (sent or not: a server far behind holds the agents back).
    produced: dict[str, int] = field(default_factory=dict)
    acked_rows: int = 0
    batches: int = 0
    acked: int = 0
    not_stored: list[str] = field(default_factory=list)
    first_send_ns: int = 0
    last_send_ns: int = 0
    last_ack_ns: int = 0
    cpu_s: float = 0.0
    error: str = ""
    #: Streams that ended with an error, by gRPC status code.
    stream_errors: dict[str, int] = field(default_factory=dict)
    #: Streams opened again after one ended with an error.
    reconnects: int = 0


@dataclass
class _Block:
    """Rows of a process's agents, due at ``due_ns``; each agent takes its ``rows_per_agent`` slice."""

    due_ns: int
    table: str
    data: pa.Table
    rows_per_agent: int


class _Producer:
    """Makes the rows of agents ``[a0, a1)`` block by block, in order of when they are due."""

    def __init__(self, job: Job, a0: int, a1: int) -> None:
        self.job, self.a0, self.a1 = job, a0, a1
        self.fleet = job.fleet()
        self.blocks: list[_Block | None] = []
        self.taken: list[int] = []
        self._step = 0
        self._second = 1
        self._window = 0
        self.done = False
        self.produced: dict[str, int] = {}

    def _block(self, due: int, table: str, data: pa.Table) -> _Block:
        return _Block(due, table, data, data.num_rows // (self.a1 - self.a0))

    def produce(self, horizon_ns: int) -> None:
        """Make every block due by ``horizon_ns`` (capped at the job's stop)."""
        job, new = self.job, []
        horizon = min(horizon_ns, job.stop_ns)
        while (due := self.fleet.step_end_ns(self._step)) <= horizon:
            for table, data in self.fleet.steps(self._step, self.a0, self.a1).items():
                new.append(self._block(due, table, data))
            self._step += 1
        while (due := job.t0_ns + self._second * NS) <= horizon:
            new.append(
                self._block(due, "host_samples", self.fleet.host_samples(self._second, self.a0, self.a1))
            )
            self._second += 1
        while self._window < job.windows:
            w0 = job.t0_ns + self._window * job.window_ns
            due = w0 + job.window_ns + NS  # the agent holds a window until its steps have ended
            if due > horizon:
                break
            new.append(
                self._block(due, "kernel_summaries", self.fleet.kernel_summaries(w0, self.a0, self.a1))
            )
            self._window += 1
        for b in new:
            self.produced[b.table] = self.produced.get(b.table, 0) + b.data.num_rows
        new.sort(key=lambda b: b.due_ns)
        self.blocks.extend(new)
        self.taken.extend([0] * len(new))
        self.fleet.forget(self._step - 2)
        self.done = horizon >= job.stop_ns

    def take(self, index: int) -> None:
        """An agent took its slice of block ``index``; the block is freed once every agent has."""
        self.taken[index] += 1
        if self.taken[index] == self.a1 - self.a0:
            self.blocks[index] = None


async def _agent(
    a: int, channel: grpc.aio.Channel, prod: _Producer, result: SimResult, agent_id: str
) -> None:
    """One node agent: lifecycle rows, then a flush a second until the job's stop; waits for every ack.

    Like the node agent, when its stream ends with an error it opens a new one (after
    :data:`RECONNECT_S`) and sends every unacknowledged batch again; the server deduplicates them.
    """
    job, local = prod.job, a - prod.a0
    stub = pb_grpc.CollectorStub(channel)
    inflight: dict[int, tuple[str, int, pb.Batch]] = {}
    room = asyncio.Semaphore(MAX_INFLIGHT)
    settled = asyncio.Event()  # set when every batch sent is acknowledged
    seq = 0

    def failed(exc: grpc.aio.AioRpcError | asyncio.InvalidStateError, how: str = "") -> None:
        # A write to a call the server already ended raises InvalidStateError, not the call's error.
        code = (exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "FINISHED") + how
        result.stream_errors[code] = result.stream_errors.get(code, 0) + 1

    async def read_acks(call: Any) -> None:
        try:
            async for ack in call:
                if ack.seq not in inflight:
                    continue  # acknowledged on an earlier stream, sent again on this one
                table, rows, _ = inflight.pop(ack.seq)
                room.release()
                if not inflight:
                    settled.set()
                result.acked += 1
                result.last_ack_ns = max(result.last_ack_ns, time.time_ns())
                if ack.status in (pb.Ack.STORED, pb.Ack.DUPLICATE) and ack.rows == rows:
                    result.acked_rows += rows
                else:
                    result.not_stored.append(
                        f"{agent_id}:{ack.seq} {table} {ack.status} {ack.code} {ack.message}"
                    )
        except grpc.aio.AioRpcError as exc:  # the stream ended: what is in flight is sent again
            failed(exc)

    stream: list[Any] = []  # the open call and its ack reader

    async def reopen() -> None:
        """A new stream, every batch in flight sent on it again, in order."""
        while True:
            if stream:
                stream[0].cancel()
                stream[1].cancel()
                stream.clear()
                result.reconnects += 1
                await asyncio.sleep(RECONNECT_S)
            call = stub.Stream()  # type: ignore[call-arg]  # aio: requests are written
            stream[:] = [call, asyncio.create_task(read_acks(call))]
            try:
                for n in sorted(inflight):
                    await call.write(inflight[n][2])
                return
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                failed(exc, " (write)")

    async def send(flush: dict[str, pa.Table]) -> None:
        """One flush: its tables as members of one message, as the node agent sends them
        (``Uploader.flush``), or one message each (``Job.per_table``)."""
        nonlocal seq
        members = []
        for table, data in flush.items():
            seq += 1
            members.append(
                pb.Batch(
                    agent_id=agent_id,
                    seq=seq,
                    job_id=JOB_ID,
                    table=table_code(table),
                    arrow_ipc=ipc_bytes(data),
                )
            )
        messages = [[m] for m in members] if job.per_table or len(members) == 1 else [members]
        for message in messages:
            await room.acquire()
            batch = (
                message[0]
                if len(message) == 1
                else pb.Batch(agent_id=agent_id, seq=message[0].seq, members=message)
            )
            names = [_table_name(m.table) for m in message]
            rows = sum(flush[name].num_rows for name in names)
            inflight[batch.seq] = ("+".join(names), rows, batch)
            try:
                await stream[0].write(batch)
            # The stream ended (its error, or a write to a call already finished): a new one, this
            # batch included.
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                failed(exc, " (write)")
                await reopen()
            result.batches += 1
        now = time.time_ns()
        result.first_send_ns = min(result.first_send_ns or now, now)
        result.last_send_ns = max(result.last_send_ns, now)
        for table, data in flush.items():
            result.offered[table] = result.offered.get(table, 0) + data.num_rows

    await reopen()
    # A rank attaches half a second before the job's first step, not when the simulator connected
    # (up to a window earlier): sending its rows then would count that idle lead in the rates.
    attach_ns = job.t0_ns - NS // 2
    await asyncio.sleep(max(0.0, (attach_ns - time.time_ns()) / NS))
    lifecycle = prod.fleet.lifecycle(a, attach_ns)
    for table, data in lifecycle.items():
        prod.produced[table] = prod.produced.get(table, 0) + data.num_rows
    await send(lifecycle)
    # Agents flush spread evenly over each second, as independent nodes do, and hold a flush while
    # the server has not acknowledged their earlier batches, as the node agent does (flush_due).
    last = job.t0_ns + int(NS * FLUSH_S * ((local + 0.5) / (prod.a1 - prod.a0) - 1))
    index = 0
    while True:
        await asyncio.sleep(max(0.0, (last + FLUSH_S * NS - time.time_ns()) / NS))
        if not flush_due((time.time_ns() - last) / NS, len(inflight), FLUSH_S):
            settled.clear()
            hold_s = (last + HOLD_FLUSHES * FLUSH_S * NS - time.time_ns()) / NS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), max(hold_s, 0.0))
        last = time.time_ns()
        upto = min(last, job.stop_ns)
        parts: dict[str, list[pa.Table]] = {}
        while index < len(prod.blocks) and (block := prod.blocks[index]) is not None and block.due_ns <= upto:
            n = block.rows_per_agent
            parts.setdefault(block.table, []).append(block.data.slice(local * n, n))
            prod.take(index)
            index += 1
        if parts:
            # One record batch per table, as the node agent sends (Uploader.flush).
            await send(
                {t: pa.concat_tables(d).combine_chunks() if len(d) > 1 else d[0] for t, d in parts.items()}
            )
        if upto >= job.stop_ns:
            break
    while True:  # every batch acknowledged, on this stream or a new one
        call, reader = stream
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.done_writing()
        await reader
        if not inflight:
            break
        await reopen()


async def _simulate(target: str, job: Job, a0: int, a1: int, ready: Any, start: Any) -> SimResult:
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES + (64 << 10))]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(a0, a1)]
    await asyncio.gather(*(asyncio.wait_for(c.channel_ready(), 120) for c in channels))
    ready.put(a0)
    t0 = await asyncio.get_running_loop().run_in_executor(None, start.get)
    job = Job(**{**job.__dict__, "t0_ns": t0})
    prod = _Producer(job, a0, a1)
    result = SimResult()
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])

    async def produce() -> None:
        while not prod.done:
            prod.produce(time.time_ns() + 2 * NS)  # ahead of the agents that take the rows
            await asyncio.sleep(0.2)

    stamp = time.time_ns()
    producer = asyncio.create_task(produce())
    prod.produce(time.time_ns() + 2 * NS)
    # An agent that fails stops alone (reported); the others go on.
    runs = [
        _agent(a, ch, prod, result, f"scale-{a}-{stamp}")
        for a, ch in zip(range(a0, a1), channels, strict=True)
    ]
    agents = asyncio.gather(*runs, return_exceptions=True)
    try:
        # What is not acknowledged by then counts as lost: the server did not keep up.
        ended = await asyncio.wait_for(agents, (job.stop_ns - time.time_ns()) / NS + job.drain_s)
        for exc in ended:
            if isinstance(exc, grpc.aio.AioRpcError):
                code = f"{exc.code().name} (write)"
                result.stream_errors[code] = result.stream_errors.get(code, 0) + 1
            elif isinstance(exc, BaseException):
                result.error = repr(exc)
    except TimeoutError:
        result.error = f"not every batch was acknowledged {job.drain_s:g} s after the job's end"
    except Exception as exc:  # reported by the parent, with the counts so far
        result.error = repr(exc)
    producer.cancel()
    result.produced = prod.produced
    result.cpu_s = sum(me.cpu_times()[:2]) - cpu0
    for c in channels:
        await c.close(None)
    return result


def simulator(target: str, job: Job, a0: int, a1: int, ready: Any, start: Any, out: Any) -> None:
    """Process entry: agents ``[a0, a1)``; puts a :class:`SimResult` on ``out``."""
    out.put(asyncio.run(_simulate(target, job, a0, a1, ready, start)))


# --- the server and what it stored ------------------------------------------------------------------


def start_server(
    data_dir: Path, log: Path, window_s: float, *flags: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """`argus server` on free ports, with ``flags`` besides; returns the process, its gRPC address
    and its HTTP URL (bench/soak.py starts its server here too)."""
    command = [sys.executable, "-m", "argus.cli", "server", "--store", f"chdb://{data_dir}"]
    command += ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--window-s", str(window_s)]
    command += flags
    out = log.with_suffix(".out")
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.match(r"argus server: gRPC on (\S+?), HTTP on (\S+?),", out.read_text())
        if found:
            return proc, found.group(1), found.group(2)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"argus server did not start:\n{log.read_text()}")


class Watch(threading.Thread):
    """Samples the server's process tree RSS every 0.5 s, and polls its diagnoses every 2 s."""

    def __init__(self, pid: int, http: str, slow_rank: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.http, self.slow_rank = http, slow_rank
        self.peak_rss = 0
        self.first_named_ns: int | None = None
        self.first_named = ""
        self.seen: dict[str, str] = {}
        self.stop = threading.Event()

    def _rss(self) -> int:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                total += p.memory_info().rss
        return total

    def _diagnoses(self) -> None:
        try:
            with urllib.request.urlopen(f"{self.http}/api/v1/jobs/{JOB_ID}/diagnoses", timeout=5) as r:
                items = json.load(r)["items"]
        except Exception:  # the job is not known yet, or the server is busy: next second
            return
        for d in items:
            self.seen.setdefault(
                d["id"], f"rank={d['rank']} ranks={d['ranks'][:5]} {d['cause']} {d['state']}"
            )
            names = {d["rank"]} if d["rank"] is not None else set(d["ranks"])
            if names == {self.slow_rank} and self.first_named_ns is None:
                self.first_named_ns = time.time_ns()
                self.first_named = self.seen[d["id"]]

    def run(self) -> None:
        tick = 0
        while not self.stop.wait(0.5):
            try:
                self.peak_rss = max(self.peak_rss, self._rss())
            except psutil.Error:
                return
            tick += 1
            if tick % 4 == 0:
                self._diagnoses()


def tree_cpu_s(proc: psutil.Process) -> float:
    """CPU time (user + system, s) of ``proc`` and every process below it, all threads, so far.

    Children that ended and were waited for count through ``proc``'s ``children_*`` times; one
    that ends between two samples without being waited for is missed (the server starts none).
    """
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it ended meanwhile
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return float(total)


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """CPU time (user + system, s) of each thread of process ``pid`` so far: tid -> (its name, s).

    The name is the kernel's (``/proc/PID/task/TID/comm``): the embedded engine names its threads
    (merges, query pipelines), the server its own (:mod:`argus.threads`); a thread started without
    a name of its own carries its starter's (the event loop's decode pool counts as ``argus-grpc``),
    and Python 3.11's other threads read ``python``. A thread that ended is missing; one that
    cannot be read is left out.
    """
    out = {}
    with contextlib.suppress(psutil.Error):
        for t in psutil.Process(pid).threads():
            with contextlib.suppress(OSError):
                name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
                out[t.id] = (name, t.user_time + t.system_time)
    return out


def by_thread_name(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two :func:`thread_cpu_s` samples, summed by thread name (digits
    dropped: a pool's threads are one name), largest first. Threads that ended between them are
    not counted."""
    spent: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        key = name.rstrip("0123456789").rstrip("-_ ") or name
        spent[key] = spent.get(key, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def analysis_seconds(http: str) -> dict[str, float]:
    """Mean wall time of a window's analysis stages so far, s (``argus_analysis_window_seconds``)."""
    try:
        with urllib.request.urlopen(f"{http}/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:
        return {}
    sums: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "argus_analysis_window_seconds":
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    sums.setdefault(sample.labels["stage"], {})[sample.name.rsplit("_", 1)[1]] = sample.value
    return {stage: v["sum"] / v["count"] for stage, v in sums.items() if v.get("count")}


def lag_metric(http: str) -> float:
    """``argus_analysis_lag_seconds`` now (nan when it cannot be read)."""
    try:
        with urllib.request.urlopen(f"{http}/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:
        return float("nan")
    found = re.search(r"^argus_analysis_lag_seconds (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def peak_hwm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def stored(data_dir: Path, job: Job) -> tuple[dict[str, int], dict[int, int]]:
    """Rows of the job per table, and per analysed window (index from 0) when its analysis was written."""
    from argus.store import open_store

    store = open_store(f"chdb://{data_dir}")
    try:
        counts = {}
        for table in TABLES:
            t = store.query(
                f"SELECT count() AS n FROM {table} WHERE job_id = {{job:String}}", {"job": JOB_ID}
            )
            counts[table] = int(t.column("n")[0].as_py())
        t = store.query(
            "SELECT window_start_ns, updated_ns FROM analysis_windows FINAL WHERE job_id = {job:String}",
            {"job": JOB_ID},
        )
        written = {
            (int(str(w)) - job.t0_ns) // job.window_ns: int(str(u))
            for w, u in zip(
                t.column("window_start_ns").to_pylist(), t.column("updated_ns").to_pylist(), strict=True
            )
        }
    finally:
        store.close()
    return counts, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1250, help="node agents (default %(default)s)")
    parser.add_argument("--ranks-per-agent", type=int, default=8, help="ranks per node (default %(default)s)")
    parser.add_argument(
        "--windows", type=int, default=6, help="analysis windows streamed (default %(default)s)"
    )
    parser.add_argument(
        "--window-s", type=float, default=10.0, help="the server's window (default %(default)s)"
    )
    parser.add_argument("--procs", type=int, default=3, help="simulator processes (default %(default)s)")
    parser.add_argument("--slow-rank", type=int, default=None, help="the slowed rank (default: world × 0.43)")
    parser.add_argument(
        "--drain-s",
        type=float,
        default=60.0,
        help="agents give up this long after the job's end (default %(default)s)",
    )
    parser.add_argument(
        "--no-analyzer",
        action="store_true",
        help="run the server without its analyzer: what ingest alone sustains (no lag, no detection)",
    )
    parser.add_argument(
        "--per-table",
        action="store_true",
        help="agents send each table's batch as a message of its own (the wire before flushes)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the store and the server's log in this new directory"
    )
    args = parser.parse_args()
    print(
        run(
            args.agents,
            args.ranks_per_agent,
            args.windows,
            args.window_s,
            args.procs,
            args.slow_rank,
            args.drain_s,
            args.keep,
            args.no_analyzer,
            args.per_table,
        )
    )


def run(
    agents: int,
    ranks_per_agent: int,
    windows: int,
    window_s: float,
    procs: int,
    slow_rank: int | None,
    drain_s: float = 60.0,
    keep: Path | None = None,
    no_analyzer: bool = False,
    per_table: bool = False,
) -> str:
    """Run the benchmark; return its last line (printing progress on the way)."""
    world = agents * ranks_per_agent
    slow = slow_rank if slow_rank is not None else int(world * 0.43) + 1
    window_ns = WindowGrid.from_seconds(window_s).length_ns
    procs = max(1, min(procs, agents))
    job = Job(agents, ranks_per_agent, window_ns, windows, slow, drain_s, per_table=per_table)
    with tempfile.TemporaryDirectory(prefix="argus-bench-scale-") as tmp:
        root = Path(tmp) if keep is None else keep
        root.mkdir(parents=True, exist_ok=keep is None)
        flags = ["--no-analyzer"] if no_analyzer else []
        server, target, http = start_server(root / "store", root / "server.log", window_s, *flags)
        try:
            ctx = mp.get_context("spawn")
            ready, out = ctx.Queue(), ctx.Queue()
            starts = [ctx.Queue() for _ in range(procs)]
            bounds = [agents * i // procs for i in range(procs + 1)]
            sims = [
                ctx.Process(
                    target=simulator, args=(target, job, bounds[i], bounds[i + 1], ready, starts[i], out)
                )
                for i in range(procs)
            ]
            for p in sims:
                p.start()
            for _ in sims:
                ready.get(timeout=300)
            # The job starts at a window boundary, a moment after every agent is connected.
            t0 = -(-(time.time_ns() + 2 * NS) // window_ns) * window_ns
            job = Job(**{**job.__dict__, "t0_ns": t0})
            watch = Watch(server.pid, http, slow)
            watch.start()
            server_ps = psutil.Process(server.pid)
            for q in starts:
                q.put(t0)
            # The server's cost is counted from the ranks' attach (the first batch) to the last ack.
            time.sleep(max(0.0, (t0 - NS // 2 - time.time_ns()) / NS))
            cpu0, wall0, threads0 = tree_cpu_s(server_ps), time.monotonic(), thread_cpu_s(server.pid)
            print(
                f"{world} ranks on {agents} agents in {procs} processes -> argus server pid {server.pid}; "
                f"{windows} windows of {window_s:g} s, rank {slow} 20 % slower from window {ONSET_WINDOW}",
                flush=True,
            )
            results: list[SimResult] = [out.get(timeout=windows * window_s + 900) for _ in sims]
            cost = ServerCost(
                tree_cpu_s(server_ps) - cpu0,
                time.monotonic() - wall0,
                by_thread_name(threads0, thread_cpu_s(server.pid)),
            )
            for p in sims:
                p.join(30)
            # Wait for the analysis of the last window: the lag gauge is 0 once nothing due waits.
            poll_s = min(max(window_s / 2, 0.5), 5.0)
            grace_s = max(2.0, window_s / 4)
            ready_at = job.t0_ns + windows * window_ns + int((grace_s + poll_s + 1) * NS)
            give_up = time.time_ns() + int(max(6 * window_s, 60) * NS)
            while (
                not no_analyzer
                and time.time_ns() < give_up
                and (time.time_ns() < ready_at or lag_metric(http) != 0.0)
            ):
                time.sleep(0.5)
            stages = analysis_seconds(http)
            watch.stop.set()
            watch.join(5)
            rss = max(watch.peak_rss, peak_hwm_bytes(server.pid))
        finally:
            server.terminate()
            server.wait(60)
        counts, written = stored(root / "store", job)
    return report(job, results, counts, written, watch, rss, cost, stages)


@dataclass(frozen=True)
class ServerCost:
    """CPU time of the server's process tree (:func:`tree_cpu_s`) over ``wall_s`` seconds of streaming."""

    cpu_s: float
    wall_s: float
    #: Of ``cpu_s``, the server process's by thread name (:func:`by_thread_name`), s.
    threads: dict[str, float] = field(default_factory=dict)

    def thread_pct(self) -> dict[str, int]:
        """``threads`` in percent of one core over ``wall_s``, those at 0.5 % or more."""
        wall = max(self.wall_s, 1e-9)
        return {k: round(100 * v / wall) for k, v in self.threads.items() if v >= 0.005 * wall}

    def ms_per_rank_s(self, ranks: int) -> float:
        """Server CPU milliseconds per rank per second of streaming."""
        return self.cpu_s * 1000 / max(ranks * self.wall_s, 1e-9)


#: The stages of one window's analysis in ``argus_analysis_window_seconds``, in order.
STAGES = ("read", "analyse", "write")


def report(
    job: Job,
    results: list[SimResult],
    counts: dict[str, int],
    written: dict[int, int],
    watch: Watch,
    rss: int,
    cost: ServerCost,
    stages: dict[str, float],
) -> str:
    """Print the details; return the last line.

    ``stages``: mean seconds of a window's analysis by stage (:func:`analysis_seconds`); empty
    without an analyzer, and ``window_analysis_s`` is then ``nan``.
    """
    offered: dict[str, int] = {}
    for r in results:
        for t, n in r.offered.items():
            offered[t] = offered.get(t, 0) + n
        if r.error or r.stream_errors:
            print(
                f"simulator: {r.error or 'ok'}; streams ended by an error: {r.stream_errors}, "
                f"opened again: {r.reconnects}"
            )
    total_offered, total_stored = sum(offered.values()), sum(counts.values())
    first = min(r.first_send_ns for r in results if r.first_send_ns)
    last_send = max(r.last_send_ns for r in results)
    last_ack = max(r.last_ack_ns for r in results)
    send_s, ack_s = (last_send - first) / NS, (last_ack - first) / NS
    not_stored = [x for r in results for x in r.not_stored]
    unacked = sum(r.batches - r.acked for r in results)
    produced: dict[str, int] = {}
    for r in results:
        for t, n in r.produced.items():
            produced[t] = produced.get(t, 0) + n
    total_produced = sum(produced.values())
    lost = max(total_produced - total_stored, 0)
    lags = [
        (written[k] - (job.t0_ns + (k + 1) * job.window_ns)) / NS if k in written else math.inf
        for k in range(job.windows)
    ]
    detected = float("nan")
    if watch.first_named_ns is not None:
        done = [k for k, t in written.items() if t <= watch.first_named_ns]
        if done:
            detected = max(done) - ONSET_WINDOW + 1
    sim_cpu = sum(r.cpu_s for r in results)
    world = job.agents * job.ranks_per_agent
    window_s = sum(stages[k] for k in STAGES) if all(k in stages for k in STAGES) else float("nan")
    job_s = (job.stop_ns - job.t0_ns) / NS
    print(
        "per table made/sent/stored: "
        + " ".join(f"{t}={produced.get(t, 0)}/{offered.get(t, 0)}/{counts.get(t, 0)}" for t in TABLES)
        + f"; batches {sum(r.batches for r in results)}, unacked {unacked}, not stored {len(not_stored)}"
        + (f" (first: {not_stored[0]})" if not_stored else "")
        + f"; rows sent {total_offered}, streaming {send_s:.1f} s for a {job_s:.0f} s job, last ack "
        + f"{ack_s - send_s:+.1f} s after the last send, "
        + f"{(last_ack - job.stop_ns) / NS:+.1f} s after the job's stop"
        + f"; lags per window {[round(x, 2) for x in lags]}"
        + f"; server CPU {cost.cpu_s / max(cost.wall_s, 1e-9) * 100:.0f} % over {cost.wall_s:.1f} s"
        + f" (% of a core by thread: {cost.thread_pct()})"
        + f"; a window's analysis, mean s by stage: { {k: round(v, 2) for k, v in stages.items()} }"
        + f"; first naming the slowed rank: {watch.first_named or '-'}"
        + f"; diagnoses seen {sorted(watch.seen.values())}",
        flush=True,
    )
    return (
        f"ranks={world} agents={job.agents} "
        f"offered_rows_per_s={total_produced / job_s:.0f} "
        f"stored_rows_per_s={total_stored / max(ack_s, 1e-9):.0f} "
        f"analysis_lag_s={max(lags):.2f} detected_window={detected:.0f} "
        f"server_peak_rss_mb={rss / 2**20:.0f} simulator_cpu_pct={sim_cpu / max(send_s, 1e-9) * 100:.0f} "
        f"lost={lost} server_cpu_ms_per_rank_s={cost.ms_per_rank_s(world):.4f} "
        f"window_analysis_s={window_s:.2f}"
    )


if __name__ == "__main__":
    main()
