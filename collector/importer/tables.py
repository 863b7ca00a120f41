"""The rows one parsed Kineto trace contributes to each table (schema of :mod:`argus.schema`).

Pure functions from a :class:`~argus.collector.importer.kineto.ParsedTrace` and the
rank it is imported as to Arrow tables whose columns are ``job_id`` plus the
table's wire columns, ready for :meth:`Store.insert`.

Choices (each is what live capture would have recorded, as far as a trace tells):

- ``steps.step`` is the profiler's step number ``N`` of ``ProfilerStep#N``: it
  counts from the profiler's start, so the same step has the same number on
  every rank of a job traced with one schedule.
- Collectives are the NCCL kernels. ``op`` comes from the kernel's ``Collective
  name`` when Kineto wrote one, else from its name (``ncclKernel_SendRecv_...`` →
  ``sendrecv``); ``bytes`` is ``In msg nelems`` x element size, 0 when unknown;
  ``process_group`` is the kernel's ``Process Group Name``, else the one group of
  ``pg_config``, else ``"0"`` (the default group). ``issue_ns`` is the CPU launch
  of the kernel (matched by correlation id), else the kernel's start; ``start_ns``
  and ``dur_ns`` are the kernel's. ``seq`` counts per process group from 0 in
  issue order, so traces of ranks profiled over the same steps line up. ``step``
  is the ``ProfilerStep`` in which the collective was issued (the step before the
  first one if it was issued earlier).
- ``kernel_summaries``: :func:`argus.kernels.summarize`, the node agent's summary
  and window rule, at the trace's recording resolution.
- ``ranks``: an ``attach`` row at the trace's first event, a ``group`` row per
  process group of ``pg_config`` (else the default group ``"0"`` of all
  ``world_size`` ranks), and an ``exit`` row with exit code 0 at its last event:
  an imported rank is finished, not unresponsive.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from argus.collector.importer.kineto import ParsedTrace
from argus.kernels import KINDS, summarize
from argus.schema import wire_table
from argus.window_grid import WindowGrid

__all__ = [
    "DEFAULT_GROUP",
    "RankTrace",
    "collectives_table",
    "jobs_table",
    "kernel_events_table",
    "kernel_summaries_table",
    "ranks_table",
    "steps_table",
]

#: Name of the default process group (torch.distributed's WORLD) when a trace names none.
DEFAULT_GROUP = "0"


@dataclass(frozen=True)
class RankTrace:
    """A parsed trace and the job and rank it is imported as."""

    trace: ParsedTrace
    job_id: str
    rank: int
    world_size: int


def _table(name: str, job_id: str, columns: Mapping[str, Any]) -> pa.Table:
    return wire_table(name, columns, job_id)


def _full(size: int, value: object) -> list[object]:
    return [value] * size


def steps_table(rt: RankTrace) -> pa.Table:
    """``steps`` rows: one per ``ProfilerStep#N``."""
    t = rt.trace
    return _table(
        "steps",
        rt.job_id,
        {
            "rank": np.full(t.step.size, rt.rank, np.uint32),
            "step": t.step.astype(np.uint64),
            "start_ns": t.step_start_ns,
            "dur_ns": t.step_dur_ns,
        },
    )


def _dictionary(codes: NDArray[np.integer], values: Sequence[str]) -> pa.DictionaryArray[Any, Any]:
    """Strings as indices into ``values``, no string per row (ClickHouse reads it as String)."""
    return pa.DictionaryArray.from_arrays(codes.astype(np.int32), pa.array(values, pa.string()))


def kernel_events_table(rt: RankTrace, rows: slice = slice(None)) -> pa.Table:
    """``kernel_events`` rows: the raw kernels, memcpys and memsets (``rows`` selects a slice).

    ``job_id``, ``kind`` and ``kernel`` are dictionary-encoded (a trace has a few
    hundred distinct kernel names over many thousand events); the other columns
    have the wire types.
    """
    t = rt.trace
    codes = t.kernel_code[rows]
    n = codes.size
    columns = {
        "job_id": _dictionary(np.zeros(n, np.int32), [rt.job_id]),
        "rank": pa.array(np.full(n, rt.rank, np.uint32)),
        "kind": _dictionary(t.kind[rows], KINDS),
        "kernel": _dictionary(codes, t.kernel_names),
        "stream": pa.array(t.stream[rows].astype(np.uint32)),
        "device": pa.array(t.device[rows].astype(np.int32)),
        "correlation": pa.array(t.correlation[rows].astype(np.uint64)),
        "start_ns": pa.array(t.start_ns[rows]),
        "dur_ns": pa.array(t.dur_ns[rows]),
        # Kineto traces name no CUDA graph: every kernel counts as launched eagerly.
        "graph_id": pa.array(np.zeros(n, np.uint32)),
        "graph_node_id": pa.array(np.zeros(n, np.uint64)),
    }
    return pa.table(columns)


def _step_of(t: ParsedTrace, times_ns: NDArray[np.int64]) -> NDArray[np.uint64]:
    """The ``ProfilerStep`` number in which each time falls (the one before the first if earlier)."""
    if t.step.size == 0:
        return np.zeros(times_ns.size, np.uint64)
    idx = np.searchsorted(t.step_start_ns, times_ns, side="right") - 1
    steps = np.where(idx >= 0, t.step[np.maximum(idx, 0)], t.step[0] - 1)
    return np.maximum(steps, 0).astype(np.uint64)


def collectives_table(rt: RankTrace) -> pa.Table:
    """``collectives`` rows: one per NCCL kernel, ``seq`` per process group in issue order."""
    t = rt.trace
    rows = np.array([c.row for c in t.collectives], dtype=np.intp)
    single = t.process_groups[0].name if len(t.process_groups) == 1 else DEFAULT_GROUP
    groups = np.array([c.process_group or single for c in t.collectives], dtype=object)
    start = t.start_ns[rows]
    launch = t.launch_ns[rows]
    issue = np.where(launch >= 0, launch, start)
    order = np.lexsort((start, issue))
    seq = np.zeros(rows.size, np.uint64)
    counters: Counter[str] = Counter()
    for i in order:
        seq[i] = counters[groups[i]]
        counters[groups[i]] += 1
    return _table(
        "collectives",
        rt.job_id,
        {
            "rank": np.full(rows.size, rt.rank, np.uint32),
            "step": _step_of(t, issue),
            "process_group": groups.tolist(),
            "seq": seq,
            "op": [c.op for c in t.collectives],
            "bytes": np.array([c.bytes for c in t.collectives], np.uint64),
            "issue_ns": issue,
            "start_ns": start,
            "dur_ns": t.dur_ns[rows],
        },
    )


def kernel_summaries_table(rt: RankTrace, grid: WindowGrid) -> pa.Table:
    """``kernel_summaries`` rows: :func:`argus.kernels.summarize` of the trace's GPU activity.

    The one summary and window rule of live capture: a kernel belongs to the window in
    which the ``ProfilerStep`` that launched it ends. Durations are compressed at the
    trace's resolution (1000 ns for integer-µs traces).
    """
    t = rt.trace
    rows = summarize(
        t.kernel_events(rt.rank), grid, steps=t.step_spans(rt.rank), resolution_ns=t.resolution_ns
    )
    return rows.add_column(0, "job_id", pa.array([rt.job_id] * rows.num_rows, pa.string()))


def _device(t: ParsedTrace) -> str:
    devices = t.device[t.device >= 0]
    if devices.size == 0:
        return ""
    return f"cuda:{int(np.bincount(devices).argmax())}"


def ranks_table(rt: RankTrace) -> pa.Table:
    """``ranks`` rows: attach, one ``group`` row per process group, exit (code 0)."""
    t = rt.trace
    groups = [
        (g.name, list(g.ranks), g.backend) for g in t.process_groups if rt.rank in g.ranks or not g.ranks
    ]
    if not t.process_groups:
        groups = [(DEFAULT_GROUP, list(range(rt.world_size)), t.backend)]
    events = ["attach"] + ["group"] * len(groups) + ["exit"]
    n = len(events)
    return _table(
        "ranks",
        rt.job_id,
        {
            "rank": _full(n, rt.rank),
            "event": events,
            "time_ns": [t.first_ns] * (n - 1) + [t.last_ns],
            "local_rank": _full(n, -1),
            "world_size": _full(n, rt.world_size),
            "host": _full(n, ""),
            "pid": _full(n, t.pid),
            "agent_id": _full(n, f"import:{t.digest}"),
            "device": _full(n, _device(t)),
            "clock_offset_ns": _full(n, 0),
            "exit_code": _full(n, 0),
            "group_name": ["", *(g[0] for g in groups), ""],
            "group_ranks": [[], *(g[1] for g in groups), []],
            "group_backend": ["", *(g[2] for g in groups), ""],
        },
    )


def jobs_table(job_id: str, traces: list[RankTrace]) -> pa.Table:
    """The one ``jobs`` row of an import: world size, first event, ``source='import'``."""
    return _table(
        "jobs",
        job_id,
        {
            "world_size": [max(rt.world_size for rt in traces)],
            "start_ns": [min(rt.trace.first_ns for rt in traces)],
            "command": [""],
            "source": ["import"],
        },
    )
