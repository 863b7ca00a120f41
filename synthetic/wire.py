"""A synthetic training job's timings as wire tables, and two ways to store them.

``sample`` makes ``n`` valid rows of any wire table, distinct and deterministic (the base
that tests and ``synthetic.bad_inputs`` alter one value of). ``synthetic_job`` makes what node
agents would send for a job of ``world_size``
ranks: attach/group events, steps with the four phases, one allreduce per
step, a few kernels, and host samples (heartbeats); one rank can be slow in a
phase. ``insert_direct`` writes them with ``Store.insert``; ``send_grpc`` sends
them to a real collector as Arrow IPC batches through the generated stubs.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

from argus.proto import collector_pb2, collector_pb2_grpc
from argus.schema import TABLES, wire_schema, wire_table
from argus.store import Store

__all__ = ["T0_NS", "LiveFeed", "diagnosis_row", "insert_direct", "sample", "send_grpc", "synthetic_job"]

#: The time of :func:`sample`'s rows, ns since the epoch (2026-09-21).
T0_NS = 1_790_000_000_000_000_000

_PHASE_MS = {"data": 2.0, "forward": 10.0, "backward": 20.0, "optimizer": 3.0}


def _table(name: str, columns: dict[str, list[object]]) -> pa.Table:
    return wire_table(name, columns)


def _column(field: pa.Field, n: int, salt: int) -> pa.Array:
    """Distinct, deterministic values of the field's wire type (ASCII/Unicode strings, lists)."""
    t = field.type
    i = np.arange(n, dtype=np.int64) + salt
    if pa.types.is_string(t):
        return pa.array([f"{field.name}-{salt}-{k}-ü" for k in range(n)])
    if pa.types.is_list(t):
        return pa.array([[k, k + 1, k + 2] for k in range(n)], t)
    if pa.types.is_floating(t):
        return pa.array((i * 0.5 + 0.25).astype(t.to_pandas_dtype()), t)
    if field.name.endswith("_ns"):
        base = 0 if field.name in {"dur_ns", "window_ns", "interval_ns"} else T0_NS
        return pa.array(base + i * 1000 + 7, t)
    return pa.array((i % 100).astype(t.to_pandas_dtype()), t)


def sample(table: str, n: int = 5, salt: int = 0) -> pa.Table:
    """``n`` rows with exactly the wire columns of ``table`` (values from ``salt`` on; times from
    :data:`T0_NS`, durations small and positive)."""
    schema = wire_schema(table)
    return pa.table([_column(f, n, salt) for f in schema], schema=schema)


def synthetic_job(
    *,
    world_size: int = 4,
    steps: int = 20,
    start_ns: int | None = None,
    slow_rank: int | None = None,
    slow_phase: str = "forward",
    slow_factor: float = 3.0,
    exited: bool = False,
    host_prefix: str = "node",
    first_step: int = 0,
    lifecycle: bool = True,
) -> dict[str, pa.Table]:
    """Wire tables (no job_id) of one job; ``start_ns`` defaults to ``steps`` × step time ago.

    Every rank's step is data+forward+backward+optimizer+allreduce; ``slow_rank``'s
    ``slow_phase`` takes ``slow_factor`` × as long, and its peers wait for it in the allreduce.
    ``first_step`` numbers the steps (and collective seqs) of a later chunk of the same job;
    ``lifecycle=False`` leaves out the attach and group events (sent with the first chunk).
    """
    phase_ns = {p: int(ms * 1e6) for p, ms in _PHASE_MS.items()}
    slow_extra = int(phase_ns[slow_phase] * (slow_factor - 1)) if slow_rank is not None else 0
    step_ns = sum(phase_ns.values()) + slow_extra + 1_000_000
    t0 = start_ns if start_ns is not None else time.time_ns() - steps * step_ns - 1_000_000_000
    ranks = range(world_size)
    hosts = [f"{host_prefix}{r // 2}" for r in ranks]
    r_cols: dict[str, list[object]] = {c: [] for c in wire_schema("ranks").names}

    def rank_event(rank: int, event: str, t: int, **extra: object) -> None:
        row = {
            "rank": rank,
            "event": event,
            "time_ns": t,
            "local_rank": rank % 2,
            "world_size": world_size,
            "host": hosts[rank],
            "pid": 1000 + rank,
            "agent_id": f"agent-{hosts[rank]}",
            "device": "cpu",
            "clock_offset_ns": 0,
            "exit_code": 0,
            "group_name": "",
            "group_ranks": [],
            "group_backend": "",
        }
        row.update(extra)
        for k, v in row.items():
            r_cols[k].append(v)

    for r in ranks if lifecycle else ():
        rank_event(r, "attach", t0 - 1000)
        rank_event(
            r, "group", t0 - 500, group_name="default_pg", group_ranks=list(ranks), group_backend="gloo"
        )
    s_cols: dict[str, list[object]] = {c: [] for c in wire_schema("steps").names}
    p_cols: dict[str, list[object]] = {c: [] for c in wire_schema("phases").names}
    c_cols: dict[str, list[object]] = {c: [] for c in wire_schema("collectives").names}
    k_cols: dict[str, list[object]] = {c: [] for c in wire_schema("kernel_events").names}
    # Columns added later (with a default: the node's link telemetry) are filled by wire_table.
    h_cols: dict[str, list[object]] = {
        c.name: [] for c in TABLES["host_samples"].columns if c.default is None
    }
    for i in range(steps):
        begin, step = t0 + i * step_ns, first_step + i
        for r in ranks:
            t = begin
            for phase, base_dur in phase_ns.items():
                dur = base_dur + (slow_extra if r == slow_rank and phase == slow_phase else 0)
                for k, v in zip(p_cols, (r, step, phase, t, dur), strict=True):
                    p_cols[k].append(v)
                if phase in ("forward", "backward"):
                    row = (r, "kernel", f"gemm_{phase}", 7, 0, step * 10 + r, t + 100_000, dur // 2, 0, 0)
                    for k, v in zip(k_cols, row, strict=True):
                        k_cols[k].append(v)
                t += dur
            issue = t
            last_arrival = begin + step_ns - 1_000_000
            end = last_arrival + 800_000
            row = (
                r,
                step,
                "default_pg",
                step,
                "allreduce",
                4 << 20,
                issue,
                last_arrival,
                end - last_arrival,
                -1,
                0,
                0,
            )
            for k, v in zip(c_cols, row, strict=True):
                c_cols[k].append(v)
            for k, v in zip(s_cols, (r, step, begin, end - begin), strict=True):
                s_cols[k].append(v)
    last = t0 + steps * step_ns
    for r in ranks:
        for beat in itertools.count():
            t = t0 + beat * 1_000_000_000
            if t > last:
                break
            h_cols["rank"].append(r)
            h_cols["host"].append(hosts[r])
            h_cols["time_ns"].append(t)
            h_cols["interval_ns"].append(1_000_000_000)
            h_cols["proc_cpu_ns"].append(950_000_000)  # a busy training process
            h_cols["host_cpu_pct"].append(100.0)
            h_cols["rss_bytes"].append(2 << 30)
            h_cols["pending_group"].append("")
            h_cols["pending_seq"].append(-1)
            h_cols["pending_op"].append("")
            for name, values in h_cols.items():
                if name not in (
                    "rank",
                    "host",
                    "time_ns",
                    "interval_ns",
                    "proc_cpu_ns",
                    "host_cpu_pct",
                    "rss_bytes",
                    "pending_group",
                    "pending_seq",
                    "pending_op",
                ):
                    values.append(0)
        if exited:
            rank_event(r, "exit", last + 1000)
    return {
        "ranks": _table("ranks", r_cols),
        "steps": _table("steps", s_cols),
        "phases": _table("phases", p_cols),
        "collectives": _table("collectives", c_cols),
        "kernel_events": _table("kernel_events", k_cols),
        "host_samples": _table("host_samples", h_cols),
    }


def insert_direct(store: Store, job_id: str, tables: dict[str, pa.Table]) -> None:
    """Write ``tables`` into ``store`` under ``job_id`` (what the collector does for a batch)."""
    for name, data in tables.items():
        store.insert(name, data.add_column(0, "job_id", pa.array([job_id] * data.num_rows, pa.string())))


def _ipc(data: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return bytes(sink.getvalue().to_pybytes())


def send_grpc(
    address: str,
    job_id: str,
    tables: dict[str, pa.Table],
    *,
    agent_id: str | None = None,
    token: str | None = None,
    dropped_events: int = 0,
) -> list[collector_pb2.Ack]:
    """Send ``tables`` (empty ones left out) to the collector at ``address`` as one stream; return the acks.

    Raises:
        AssertionError: a batch was not stored.
    """
    agent = agent_id or f"test-agent-{time.time_ns()}"
    batches = [
        collector_pb2.Batch(
            agent_id=agent,
            seq=seq,
            job_id=job_id,
            table=collector_pb2.Table.Value(name.upper()),
            arrow_ipc=_ipc(data),
            dropped_events=dropped_events if seq == 0 else 0,
        )
        for seq, (name, data) in enumerate((n, t) for n, t in tables.items() if t.num_rows)
    ]
    metadata = (("authorization", f"Bearer {token}"),) if token else None

    def requests() -> Iterator[collector_pb2.Batch]:
        yield from batches

    with grpc.insecure_channel(address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        acks = list(stub.Stream(requests(), metadata=metadata, timeout=60))
    stored = {collector_pb2.Ack.Status.STORED, collector_pb2.Ack.Status.DUPLICATE}
    assert [a.seq for a in acks] == [b.seq for b in batches], acks
    assert all(a.status in stored for a in acks), [(a.seq, a.code, a.message) for a in acks]
    return acks


def diagnosis_row(
    job_id: str, did: str, *, state: str, updated_ns: int, first_ns: int, **extra: Any
) -> pa.Table:
    """One ``diagnoses`` row as the analyzer writes it (rank 2, compute, forward); ``extra`` overrides."""
    row = {
        "job_id": job_id,
        "id": did,
        "rank": 2,
        "ranks": [2],
        "process_group": None,
        "cause": "compute",
        "phase": "forward",
        "kernel": None,
        "score": 2.5,
        "slowdown_pct": 31.0,
        "first_window_ns": first_ns,
        "last_window_ns": first_ns + 60 * 10**9,
        "state": state,
        "evidence": json.dumps({"forward_ms": {"rank": 30.0, "peers_median": 10.0}}),
        "updated_ns": updated_ns,
        "analysed_to_ns": 0,
        "tracker": "",
    }
    row.update(extra)
    schema = pa.schema(
        [pa.field("job_id", pa.string())]
        + [pa.field(c.name, c.arrow_type) for c in TABLES["diagnoses"].columns]
    )
    return pa.Table.from_pylist([row], schema=schema)


class LiveFeed(threading.Thread):
    """A running job: sends the steps that have elapsed since the last send every ``period_s``.

    The first send backfills ``backfill_s`` of history. Stop with :meth:`stop`; errors of a
    send are kept in ``errors`` (the feed goes on).
    """

    STEP_NS = 56_000_000  # synthetic_job's step with a 3x slower forward on one rank

    def __init__(
        self,
        target: str,
        job_id: str,
        *,
        world_size: int,
        slow_rank: int,
        backfill_s: float = 10.0,
        period_s: float = 0.5,
    ) -> None:
        super().__init__(daemon=True)
        self.target, self.job_id, self.world_size, self.slow_rank = target, job_id, world_size, slow_rank
        self.period_s = period_s
        self.next_ns = time.time_ns() - int(backfill_s * 1e9)
        self.step = 0
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def send_elapsed(self) -> None:
        steps = (time.time_ns() - self.next_ns) // self.STEP_NS
        if steps <= 0:
            return
        tables = synthetic_job(
            world_size=self.world_size,
            steps=steps,
            start_ns=self.next_ns,
            slow_rank=self.slow_rank,
            first_step=self.step,
            lifecycle=self.step == 0,
        )
        send_grpc(self.target, self.job_id, tables)
        self.next_ns += steps * self.STEP_NS
        self.step += steps

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            try:
                self.send_elapsed()
            except Exception as exc:  # kept for the test to report; a feed must not die silently
                self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)
