"""Table definitions: the one source of the ClickHouse DDL and the Arrow wire schemas.

Every table has a ``job_id`` key column and a ``stored_at`` column (set by
ClickHouse on insert; retention is a TTL on it, not on event time, because
imported traces are old). Between those sit the *wire columns*: what a batch's
Arrow payload carries, in this order and with these Arrow types. The collector
adds ``job_id`` from the batch header.

Time columns are integer nanoseconds since the Unix epoch (``*_ns``); durations
are ``dur_ns`` (non-negative). Ranks are global ranks in the job's world.

Tables (docs/design.md §4): jobs, ranks, steps, phases, collectives, kernel_summaries,
kernel_events, host_samples, stacks, diagnoses; the analyzer's analysis_windows (lost
time per window), roles and stack_requests; plus ingest_batches, the collector's record of
stored (agent_id, seq) pairs used to acknowledge duplicates.

Schema changes migrate. A column added after a table first shipped carries a
``default`` (a Python value of its type): a store created before it gets the
column on start (``ALTER TABLE … ADD COLUMN IF NOT EXISTS``,
:func:`migration_statements`), and a batch from an older agent that lacks it
still stores, the column filled with its default (:func:`with_defaults`). A
column without a default is part of the original contract: a batch must carry it.

The tables the analyzer reads window by window (steps, phases, collectives, host_samples) are
sorted by the second of the time it selects their rows by, then rank (:func:`by_second`), so a
window's read touches that window's granules whatever the job's length or size. Sort keys do not
migrate (docs/design.md §4): a store keeps the keys it was created with, and one created before
(keys led by the rank or the process group) reads the same rows, at the old cost.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from argus.config import DATABASE, DEFAULT_RETENTION_DAYS

__all__ = [
    "PHASES",
    "TABLES",
    "TABLE_SETTINGS",
    "WIRE_TABLES",
    "Column",
    "TableDef",
    "by_second",
    "create_statements",
    "migration_statements",
    "wire_schema",
    "wire_table",
    "with_defaults",
]

#: Phase names of a training step, in order (docs/design.md §2).
PHASES = ("data", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Column:
    """One column: its ClickHouse type and the Arrow type it travels as.

    ``default`` is set on columns added after their table first shipped (see the module
    docstring): the value an older agent's batch, or an older store's rows, stand for.
    ``epoch`` marks an instant (ns since the epoch) read on the recording host's clock: the
    node agent moves it onto the collector's clock (:func:`argus.agent.clock.shift_times`);
    with ``zero_is_none``, 0 means "none" and stays 0.
    """

    name: str
    ch_type: str
    arrow_type: pa.DataType
    doc: str = ""
    default: Any = None
    epoch: bool = False
    zero_is_none: bool = False

    @property
    def ddl(self) -> str:
        """The column's definition in CREATE and ALTER statements."""
        if self.default is None:
            return f"`{self.name}` {self.ch_type}"
        return f"`{self.name}` {self.ch_type} DEFAULT {_literal(self.default)}"


def _literal(value: Any) -> str:
    """A ClickHouse literal for a column default (ints, floats, strings, lists of those)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise TypeError(f"no ClickHouse literal for a default of type {type(value).__name__}")


@dataclass(frozen=True)
class TableDef:
    """One table: wire columns, sort key, engine; see the module docstring."""

    name: str
    columns: tuple[Column, ...]
    order_by: tuple[str, ...]
    doc: str
    engine: str = "MergeTree"
    #: True when node agents fill it through gRPC batches.
    wire: bool = True
    #: Data-skipping indexes, ``name expression TYPE type GRANULARITY n`` each.
    indexes: tuple[str, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _c(
    name: str,
    ch_type: str,
    arrow_type: pa.DataType,
    doc: str = "",
    default: Any = None,
    *,
    epoch: bool = False,
    zero_is_none: bool = False,
) -> Column:
    return Column(name, ch_type, arrow_type, doc, default, epoch, zero_is_none)


_RANK = _c("rank", "UInt32", pa.uint32(), "global rank")
_STEP = _c("step", "UInt64", pa.uint64(), "training step number, per rank from 0")
_START = _c("start_ns", "Int64", pa.int64(), "start, ns since the epoch", epoch=True)
_DUR = _c("dur_ns", "Int64", pa.int64(), "duration, ns (>= 0)")

#: The minmax index on ``stored_at`` of the tables read by when rows were stored (the analyzer's job
#: list): parts and granules stored before the horizon are skipped, not read.
STORED_AT_INDEX = "stored_at_minmax stored_at TYPE minmax GRANULARITY 1"


def by_second(time: str) -> tuple[str, str, str]:
    """The sort key of a per-rank event table read by ``time`` (an expression of its columns, ns):
    job, the second ``time`` falls in, rank.

    The second leads so that a read bounded in ``time`` (an analysis window, its liveness) touches
    only the granules of that span, not one or more granules of every rank or process group (a
    key led by the rank spreads a 10,000-rank window over 10,000 places); rank follows so that a
    read of a few ranks (the REST trace) still skips most granules within each second. ClickHouse
    prunes with the key for conditions on ``time`` itself (``intDiv`` is monotonic).
    """
    return ("job_id", f"intDiv({time}, 1000000000)", "rank")


#: A minmax index on ``start_ns`` of a table sorted by its rows' end (:func:`by_second` of
#: ``start_ns + dur_ns``): reads by start (the REST heatmap, the trace) skip granules too.
START_INDEX = "start_minmax start_ns TYPE minmax GRANULARITY 1"

JOBS = TableDef(
    "jobs",
    (
        _c("world_size", "UInt32", pa.uint32()),
        _c("start_ns", "Int64", pa.int64(), "when the first rank attached (or trace start)", epoch=True),
        _c("command", "String", pa.string(), "the command line of the job, if known"),
        _c("source", "LowCardinality(String)", pa.string(), "'live' or 'import'"),
    ),
    ("job_id",),
    "One row per job per reporting node; queries aggregate by job_id.",
    indexes=(STORED_AT_INDEX,),
)

RANKS = TableDef(
    "ranks",
    (
        _RANK,
        _c(
            "event",
            "LowCardinality(String)",
            pa.string(),
            "'attach', 'group', 'exit', or 'clock' (the node agent's offset for the rank changed)",
        ),
        _c("time_ns", "Int64", pa.int64(), epoch=True),
        _c("local_rank", "Int32", pa.int32()),
        _c("world_size", "UInt32", pa.uint32()),
        _c("host", "LowCardinality(String)", pa.string()),
        _c("pid", "UInt32", pa.uint32()),
        _c("agent_id", "String", pa.string()),
        _c("device", "LowCardinality(String)", pa.string(), "'cpu', 'cuda:0', ..."),
        _c(
            "clock_offset_ns",
            "Int64",
            pa.int64(),
            "offset the node agent added to this rank's times from time_ns on (local clock → collector's)",
        ),
        _c("exit_code", "Int32", pa.int32(), "exit status for 'exit' (0 = normal), else 0"),
        _c("group_name", "String", pa.string(), "process group name for 'group', else ''"),
        _c("group_ranks", "Array(UInt32)", pa.list_(pa.uint32()), "global ranks of the group"),
        _c("group_backend", "LowCardinality(String)", pa.string(), "'gloo', 'nccl', ... or ''"),
    ),
    ("job_id", "rank", "time_ns"),
    "Rank lifecycle and identity: attach, each process group it belongs to, clock offset changes, exit.",
)

STEPS = TableDef(
    "steps",
    (_RANK, _STEP, _START, _DUR),
    by_second("start_ns + dur_ns"),
    "One row per training step per rank (optimizer step to optimizer step); sorted by its end, the "
    "time a window owns it by.",
    indexes=(START_INDEX,),
)

PHASES_TABLE = TableDef(
    "phases",
    (
        _RANK,
        _STEP,
        _c("phase", "LowCardinality(String)", pa.string(), "one of PHASES"),
        _START,
        _DUR,
    ),
    by_second("start_ns + dur_ns"),
    "Phases data/forward/backward/optimizer inside each step; sorted by their end, as steps.",
    indexes=(START_INDEX,),
)

COLLECTIVES = TableDef(
    "collectives",
    (
        _RANK,
        _STEP,
        _c("process_group", "LowCardinality(String)", pa.string(), "process group name"),
        _c("seq", "UInt64", pa.uint64(), "per (rank, process_group) sequence number from 0"),
        _c("op", "LowCardinality(String)", pa.string(), "'allreduce', 'broadcast', ..."),
        _c("bytes", "UInt64", pa.uint64(), "message size in bytes"),
        _c("issue_ns", "Int64", pa.int64(), "when the rank called the collective", epoch=True),
        _c("start_ns", "Int64", pa.int64(), "when the transfer started (issue_ns if unknown)", epoch=True),
        _c("dur_ns", "Int64", pa.int64(), "start to end"),
        _c(
            "peer",
            "Int32",
            pa.int32(),
            "point-to-point partner's global rank (send: destination, recv: source); -1 for collectives",
            default=-1,
        ),
        _c(
            "overlapped",
            "UInt8",
            pa.uint8(),
            "1 when the call returned at once and the rank went on working (DDP's gradient buckets): "
            "it blocked the rank only where the rank waited for it",
            default=0,
        ),
        _c(
            "wait_ns",
            "Int64",
            pa.int64(),
            "when the rank began waiting for an asynchronous call (its later wait(); point-to-point "
            "isend/irecv): it blocked from then to the end; 0 when unknown or waited from the issue",
            default=0,
            epoch=True,
            zero_is_none=True,
        ),
    ),
    by_second("issue_ns"),
    "Every collective instance per rank, sorted by its issue. Collectives: (process_group, seq) "
    "matches across ranks. Point-to-point (op 'send'/'recv', peer >= 0): seq counts the rank's "
    "transfers to (send) or from (recv) that peer in the group, so the k-th send from A to B pairs "
    "with B's k-th recv from A.",
)

KERNEL_SUMMARIES = TableDef(
    "kernel_summaries",
    (
        _RANK,
        _c("window_start_ns", "Int64", pa.int64(), epoch=True),
        _c("window_ns", "Int64", pa.int64()),
        _c("kind", "LowCardinality(String)", pa.string(), "'kernel', 'memcpy' or 'memset'"),
        _c("kernel", "LowCardinality(String)", pa.string(), "kernel name"),
        _c("stream", "UInt32", pa.uint32()),
        _c("collective", "UInt8", pa.uint8(), "1 for communication (NCCL) kernels"),
        _c("cluster", "UInt16", pa.uint16(), "cluster index within the group"),
        _c("count", "UInt64", pa.uint64()),
        _c("p50_ns", "Float64", pa.float64()),
        _c("p99_ns", "Float64", pa.float64()),
        _c("log_lo", "Float64", pa.float64(), "ln of the smallest duration in ns"),
        _c("log_hi", "Float64", pa.float64(), "ln of the largest duration in ns"),
        _c("sum_ns", "Float64", pa.float64(), "total duration of the cluster"),
        _c("resolution_ns", "Int64", pa.int64(), "timer resolution of the raw durations"),
        _c(
            "covered_ns",
            "Int64",
            pa.int64(),
            "ns of the window the rank's capture ran (window_ns when throughout): count and sum_ns "
            "cover only this time; scale by window_ns / covered_ns for whole-window totals",
        ),
        _c(
            "graph_id",
            "UInt32",
            pa.uint32(),
            "CUDA graph the group's kernels ran in (CUPTI graphId, per process); 0: launched eagerly",
            default=0,
        ),
        _c(
            "graph_node_id",
            "UInt64",
            pa.uint64(),
            "the graph node (CUPTI graphNodeId) when every kernel of the group ran at that one node, else 0",
            default=0,
        ),
    ),
    ("job_id", "window_start_ns", "kernel", "rank"),
    "KDE clusters of kernel durations per (window, rank, kind, kernel, stream, graph_id); see argus.kde.",
)

KERNEL_EVENTS = TableDef(
    "kernel_events",
    (
        _RANK,
        _c("kind", "LowCardinality(String)", pa.string(), "'kernel', 'memcpy' or 'memset'"),
        _c("kernel", "LowCardinality(String)", pa.string()),
        _c("stream", "UInt32", pa.uint32()),
        _c("device", "Int32", pa.int32()),
        _c("correlation", "UInt64", pa.uint64(), "CUPTI correlation id, 0 if unknown"),
        _START,
        _DUR,
        _c(
            "graph_id",
            "UInt32",
            pa.uint32(),
            "CUDA graph the kernel ran in (CUPTI graphId, per process); 0: launched eagerly",
            default=0,
        ),
        _c(
            "graph_node_id",
            "UInt64",
            pa.uint64(),
            "its node in that graph (CUPTI graphNodeId, per process); 0: launched eagerly",
            default=0,
        ),
    ),
    ("job_id", "rank", "start_ns"),
    "Raw kernel, memcpy and memset events: streamed when asked for, filled by trace import.",
)

HOST_SAMPLES = TableDef(
    "host_samples",
    (
        _c("rank", "Int32", pa.int32(), "-1 for node-level samples"),
        _c("host", "LowCardinality(String)", pa.string()),
        _c("time_ns", "Int64", pa.int64(), "end of the sampling interval", epoch=True),
        _c("interval_ns", "Int64", pa.int64()),
        _c("proc_cpu_ns", "Int64", pa.int64(), "process CPU time (user+system) in the interval"),
        _c("host_cpu_pct", "Float32", pa.float32(), "host CPU use, 0-100 x cores"),
        _c("gc_pause_ns", "Int64", pa.int64(), "Python GC pause time in the interval"),
        _c("gc_count", "UInt32", pa.uint32()),
        _c("rss_bytes", "UInt64", pa.uint64()),
        _c("dropped_events", "UInt64", pa.uint64(), "events the probe lost in the interval"),
        _c("gpu_sm_clock_mhz", "UInt32", pa.uint32(), "0 without a GPU"),
        _c("gpu_temp_c", "Float32", pa.float32()),
        _c("gpu_power_w", "Float32", pa.float32()),
        _c("gpu_util_pct", "Float32", pa.float32()),
        _c("gpu_throttle_reasons", "UInt64", pa.uint64(), "NVML clocks-event reasons bitmask"),
        _c(
            "pending_group",
            "LowCardinality(String)",
            pa.string(),
            "process group of the rank's oldest pending collective at time_ns, '' when none",
        ),
        _c(
            "pending_seq",
            "Int64",
            pa.int64(),
            "its seq (as in collectives.seq): issued by the rank, not complete at time_ns; -1 when none",
        ),
        _c("pending_op", "LowCardinality(String)", pa.string(), "its op ('allreduce', ...), '' when none"),
        _c(
            "pending_issue_ns",
            "Int64",
            pa.int64(),
            "when the rank issued it, ns since the epoch; 0 when none",
            epoch=True,
            zero_is_none=True,
        ),
        # Link telemetry: node-level rows (rank -1), one per network interface per interval,
        # written by the node agent (argus.agent.links). Counts are over the interval.
        _c("net_if", "LowCardinality(String)", pa.string(), "network interface of a link row, else ''", ""),
        _c("net_rx_bytes", "UInt64", pa.uint64(), "bytes received on net_if in the interval", 0),
        _c("net_tx_bytes", "UInt64", pa.uint64(), "bytes sent on net_if in the interval", 0),
        _c("net_rx_packets", "UInt64", pa.uint64(), "packets received in the interval", 0),
        _c("net_tx_packets", "UInt64", pa.uint64(), "packets sent in the interval", 0),
        _c("net_errors", "UInt64", pa.uint64(), "receive + transmit errors in the interval", 0),
        _c("net_drops", "UInt64", pa.uint64(), "packets net_if dropped (both ways) in the interval", 0),
        _c(
            "net_tx_capacity_bps",
            "UInt64",
            pa.uint64(),
            "what net_if can send, bit/s: its link speed, or its root qdisc's shaping rate when lower; "
            "0 when unknown",
            0,
        ),
        _c("net_rx_capacity_bps", "UInt64", pa.uint64(), "what net_if can receive, bit/s (link speed)", 0),
        _c("net_qdisc_backlog_bytes", "UInt64", pa.uint64(), "bytes in net_if's root qdisc at time_ns", 0),
        _c(
            "net_qdisc_overlimits",
            "UInt64",
            pa.uint64(),
            "times the root qdisc held a packet back (a shaper at its rate) in the interval",
            0,
        ),
        _c("net_qdisc_drops", "UInt64", pa.uint64(), "packets the root qdisc dropped in the interval", 0),
        _c(
            "run_delay_ns",
            "Int64",
            pa.int64(),
            "time the rank's threads were runnable but waited for a CPU in the interval (the kernel's "
            "run-queue delay, /proc schedstat); -1 where unknown and on node-level rows",
            -1,
        ),
    ),
    by_second("time_ns"),
    "Host signals per rank and interval; also the rank's heartbeat (with the collective it waits in). "
    "Rows with rank -1 are the node's: one per network interface (net_if) per interval.",
)

STACKS = TableDef(
    "stacks",
    (
        _RANK,
        _c(
            "pid",
            "UInt32",
            pa.uint32(),
            "the rank's process id (its DataLoader workers' threads read 'name [pid N]')",
        ),
        _c(
            "capture_id",
            "String",
            pa.string(),
            "the capture: the request_id of the stack_requests row it answers",
        ),
        _c("time_ns", "Int64", pa.int64(), "when the capture began", epoch=True),
        _c("duration_ns", "Int64", pa.int64(), "how long it sampled (0: one dump)"),
        _c(
            "sampler",
            "LowCardinality(String)",
            pa.string(),
            "'py-spy' (non-blocking dumps), 'py-spy-native' (one blocking dump, native frames) or "
            "'in-process' (the probe sampled its own threads; no idle or GIL state)",
        ),
        _c("thread", "String", pa.string(), "thread name"),
        _c("frames", "String", pa.string(), "the stack, root to leaf: ';'-joined 'function (file:line)'"),
        _c("count", "UInt32", pa.uint32(), "samples that found the thread in this stack"),
        _c("idle", "UInt8", pa.uint8(), "1: the thread was not running in these samples"),
        _c("gil", "UInt8", pa.uint8(), "1: it held the GIL in these samples"),
    ),
    ("job_id", "rank", "time_ns"),
    "Sampled CPU stacks of flagged ranks and a healthy peer (argus.agent.stacks), one row per "
    "(capture, thread, stack, idle, gil).",
)

STACK_REQUESTS = TableDef(
    "stack_requests",
    (
        _c("request_id", "String", pa.string(), "the capture's id (stacks.capture_id)"),
        _c("diagnosis_id", "String", pa.string(), "the diagnosis that asked for it"),
        _c("cause", "LowCardinality(String)", pa.string(), "the diagnosis's cause when it asked"),
        _c("ranks", "Array(UInt32)", pa.list_(pa.uint32()), "the ranks to sample: flagged, then the peer"),
        _c("flagged", "Array(UInt32)", pa.list_(pa.uint32()), "the diagnosis's ranks among them"),
        _c("peer", "Int32", pa.int32(), "the healthy peer of the same role, -1 when none"),
        _c("duration_ms", "UInt32", pa.uint32(), "how long to sample"),
        _c("blocking", "UInt8", pa.uint8(), "1: one blocking dump with native frames (a hung rank)"),
        _c("requested_ns", "Int64", pa.int64(), "when the analyzer asked"),
    ),
    ("job_id", "requested_ns"),
    "Stack captures the analyzer asks for; collectors pass the pending ones to node agents "
    "(argus.collector.captures).",
    wire=False,
)

DIAGNOSES = TableDef(
    "diagnoses",
    (
        _c("id", "String", pa.string()),
        _c("rank", "Nullable(Int32)", pa.int32()),
        _c("ranks", "Array(UInt32)", pa.list_(pa.uint32())),
        _c("process_group", "Nullable(String)", pa.string()),
        _c("cause", "LowCardinality(String)", pa.string()),
        _c("phase", "Nullable(String)", pa.string()),
        _c("kernel", "Nullable(String)", pa.string()),
        _c("score", "Float64", pa.float64()),
        _c("slowdown_pct", "Float64", pa.float64()),
        _c("first_window_ns", "Int64", pa.int64()),
        _c("last_window_ns", "Int64", pa.int64()),
        _c("state", "LowCardinality(String)", pa.string(), "'open' or 'resolved'"),
        _c("evidence", "String", pa.string(), "JSON object"),
        _c("updated_ns", "Int64", pa.int64(), "version: the newest row per id wins"),
        _c(
            "analysed_to_ns",
            "Int64",
            pa.int64(),
            "end of the analysis window whose analysis wrote this version (where a restart resumes)",
            default=0,
        ),
        _c(
            "tracker",
            "String",
            pa.string(),
            "the analyzer's bookkeeping of an open diagnosis (JSON: subject, cause votes, lost-time sums)",
            default="",
        ),
    ),
    ("job_id", "id"),
    "Diagnoses written by the analyzer (argus.diagnosis.Diagnosis); read with FINAL.",
    engine="ReplacingMergeTree(updated_ns)",
    wire=False,
)

ANALYSIS_WINDOWS = TableDef(
    "analysis_windows",
    (
        _c("window_start_ns", "Int64", pa.int64()),
        _c("window_ns", "Int64", pa.int64()),
        _c("status", "LowCardinality(String)", pa.string(), "'analysed' or 'failed'"),
        _c("wall_ns", "Int64", pa.int64(), "wall time of the window's steps (a failed window: the window)"),
        _c("steps", "UInt32", pa.uint32()),
        _c("lost_ns", "Int64", pa.int64(), "time lost against the job's healthy pace (argus.analyzer.loss)"),
        _c("explained_ns", "Int64", pa.int64(), "the part of lost_ns the window's diagnoses account for"),
        _c("updated_ns", "Int64", pa.int64(), "version: the newest row per window wins"),
    ),
    ("job_id", "window_start_ns"),
    "One row per analysed window of a job: its lost time and how much of it is explained; read with FINAL.",
    engine="ReplacingMergeTree(updated_ns)",
    wire=False,
)

ROLES = TableDef(
    "roles",
    (
        _RANK,
        _c("role", "String", pa.string(), "label of the rank's role ('all', 'stage 1', ...)"),
        _c("pipeline_stage", "Int32", pa.int32(), "pipeline stage from point-to-point partners (0 without)"),
        _c("role_size", "UInt32", pa.uint32(), "ranks sharing the role"),
        _c("updated_ns", "Int64", pa.int64(), "version: the newest row per rank wins"),
    ),
    ("job_id", "rank"),
    "Roles the analyzer inferred (argus.analyzer.roles); ranks are compared within theirs. Read with FINAL.",
    engine="ReplacingMergeTree(updated_ns)",
    wire=False,
)

INGEST_BATCHES = TableDef(
    "ingest_batches",
    (
        _c("agent_id", "String", pa.string()),
        _c("seq", "UInt64", pa.uint64()),
        _c("table_name", "LowCardinality(String)", pa.string()),
        _c("rows", "UInt64", pa.uint64()),
        _c("part", "UInt64", pa.uint64(), "part of a re-split batch (collector.ingest; 0: whole)", 0),
        _c(
            "token",
            "String",
            pa.string(),
            "dedup token of the insert holding its rows ('': recorded after)",
            "",
        ),
        _c("landed", "UInt8", pa.uint8(), "0: recorded before its insert, stored once that token settles", 1),
        _c(
            "settled",
            "Array(String)",
            pa.list_(pa.string()),
            "'1:token' (landed) or '0:token' (not): earlier inserts settled (collector.ingest_record)",
            [],
        ),
    ),
    ("agent_id", "seq"),
    "Every batch stored (or about to be), so a retried one is acknowledged as a duplicate, and how earlier "
    "group inserts settled (collector.ingest_record); the analyzer lists the jobs "
    "with batches stored lately from it (``stored_at``, a minmax index: old parts are skipped).",
    wire=False,
    indexes=(STORED_AT_INDEX,),
)

TABLES: dict[str, TableDef] = {
    t.name: t
    for t in (
        JOBS,
        RANKS,
        STEPS,
        PHASES_TABLE,
        COLLECTIVES,
        KERNEL_SUMMARIES,
        KERNEL_EVENTS,
        HOST_SAMPLES,
        STACKS,
        DIAGNOSES,
        ANALYSIS_WINDOWS,
        ROLES,
        INGEST_BATCHES,
        STACK_REQUESTS,
    )
}
#: Tables node agents fill through gRPC, by name.
WIRE_TABLES: dict[str, TableDef] = {n: t for n, t in TABLES.items() if t.wire}


@functools.cache
def wire_schema(table: str) -> pa.Schema:
    """The Arrow schema a batch for ``table`` carries (no job_id); built once per table.

    Raises:
        KeyError: ``table`` is not a table of this module.
    """
    return pa.schema([pa.field(c.name, c.arrow_type) for c in TABLES[table].columns])


def with_defaults(table: str, data: pa.Table) -> pa.Table:
    """``data`` with every absent column of ``table`` that has a ``default`` added, filled with it.

    Columns present, and absent ones without a default, are left for the caller to check.

    Raises:
        KeyError: ``table`` is not a table of this module.
    """
    present = set(data.column_names)
    for column in TABLES[table].columns:
        if column.default is not None and column.name not in present:
            filled = pa.array([column.default] * data.num_rows, column.arrow_type)
            data = data.append_column(pa.field(column.name, column.arrow_type), filled)
    return data


def wire_table(table: str, columns: Mapping[str, Any], job_id: str | None = None) -> pa.Table:
    """Build a table of ``table``'s wire schema from columns of values (defaulted ones may be absent).

    Args:
        table: A table of this module.
        columns: Column name → sequence of values (or an Arrow/NumPy array), all of one length.
        job_id: When given, a leading ``job_id`` string column holding it (what the store takes).

    Raises:
        KeyError: a column without a default is missing.
    """
    schema = wire_schema(table)
    size = len(next(iter(columns.values()))) if columns else 0
    arrays = []
    for column in TABLES[table].columns:
        values = columns.get(column.name)
        if values is None:
            if column.default is None:
                raise KeyError(f"{table}: no values for column {column.name}")
            values = [column.default] * size
        arrays.append(pa.array(values, column.arrow_type))
    if job_id is None:
        return pa.Table.from_arrays(arrays, schema=schema)
    arrays.insert(0, pa.array([job_id] * size, pa.string()))
    return pa.Table.from_arrays(arrays, schema=schema.insert(0, pa.field("job_id", pa.string())))


#: How many recent insert tokens each table remembers for deduplication.
DEDUP_WINDOW = 100_000
#: Outdated parts a table must have at once before ClickHouse removes them in parallel
#: (``concurrent_part_removal_threshold``, default 100): never, for us. Past the default, one cleanup
#: runs on a pool of up to 128 threads (``max_parts_cleaning_thread_pool_size``), which stay in the
#: engine's global pool, idle, for the life of the process: in the embedded store (chDB) that is
#: the server's own memory. Measured (chDB 4.4, 2026-12-07): 400 one-row-group inserts, then the
#: cleanup, took the engine from 19 to 144 threads for good; `bench/soak.py`'s server grew 35-40 MB
#: at that moment (120 threads, their stacks and allocator caches). Removed by the cleanup thread
#: alone, 791 outdated parts went in one pass of a few seconds.
PART_REMOVAL_THRESHOLD = 1 << 62
#: Settings every MergeTree table carries beside its deduplication window (applied to older stores
#: by :func:`migration_statements`).
TABLE_SETTINGS: dict[str, int] = {"concurrent_part_removal_threshold": PART_REMOVAL_THRESHOLD}


def _engine(table: TableDef, cluster: str | None) -> str:
    if cluster is None:
        return table.engine
    args = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
    if table.engine.startswith("ReplacingMergeTree("):
        version = table.engine[len("ReplacingMergeTree(") : -1]
        return f"ReplicatedReplacingMergeTree({args}, {version})"
    return f"Replicated{table.engine}({args})"


def create_statements(
    *,
    database: str = DATABASE,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    cluster: str | None = None,
) -> list[str]:
    """CREATE statements for the database and every table, in order.

    Without ``cluster``: MergeTree-family tables. With ``cluster``: each table
    becomes ``<name>_local`` (Replicated*MergeTree, ``ON CLUSTER``) plus a
    ``Distributed`` table ``<name>`` sharded by ``cityHash64(job_id)``, so one
    job's rows stay on one shard.

    Raises:
        ValueError: ``retention_days`` < 1.
    """
    if retention_days < 1:
        raise ValueError(f"retention_days must be >= 1, got {retention_days}")
    on_cluster = f" ON CLUSTER {cluster}" if cluster else ""
    dedup_setting = (
        f"replicated_deduplication_window = {DEDUP_WINDOW}"
        if cluster
        else f"non_replicated_deduplication_window = {DEDUP_WINDOW}"
    )
    settings = ", ".join([dedup_setting, *(f"{name} = {value}" for name, value in TABLE_SETTINGS.items())])
    statements = [f"CREATE DATABASE IF NOT EXISTS {database}{on_cluster}"]
    for table in TABLES.values():
        local = f"{table.name}_local" if cluster else table.name
        columns = ",\n    ".join(
            ["job_id LowCardinality(String)"]
            + [c.ddl for c in table.columns]
            + ["stored_at DateTime DEFAULT now()"]
            + [f"INDEX {index}" for index in table.indexes]
        )
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {database}.{local}{on_cluster} (\n    {columns}\n)\n"
            f"ENGINE = {_engine(table, cluster)}\n"
            f"ORDER BY ({', '.join(table.order_by)})\n"
            f"TTL stored_at + INTERVAL {retention_days} DAY\n"
            f"SETTINGS {settings}"
        )
        if cluster:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {database}.{table.name}{on_cluster} "
                f"AS {database}.{local}\n"
                f"ENGINE = Distributed({cluster}, {database}, {local}, cityHash64(job_id))"
            )
    return statements


def migration_statements(*, database: str = DATABASE, cluster: str | None = None) -> list[str]:
    """``ALTER TABLE … ADD COLUMN IF NOT EXISTS`` for every column with a default, in table order,
    then ``ADD INDEX IF NOT EXISTS`` for every index, then ``MODIFY SETTING`` of :data:`TABLE_SETTINGS`.

    Idempotent: run on every start, they add to a store created before a column existed
    what it lacks (ClickHouse fills old parts with the default on read; an index added so covers
    the parts written after it). With ``cluster``, both the ``<name>_local`` table and its
    ``Distributed`` table get the column, the ``<name>_local`` table the index.
    """
    on_cluster = f" ON CLUSTER {cluster}" if cluster else ""
    statements = []
    for table in TABLES.values():
        targets = [f"{table.name}_local", table.name] if cluster else [table.name]
        for i, column in enumerate(table.columns):
            if column.default is None:
                continue
            after = table.columns[i - 1].name if i else "job_id"
            for target in targets:
                statements.append(
                    f"ALTER TABLE {database}.{target}{on_cluster} "
                    f"ADD COLUMN IF NOT EXISTS {column.ddl} AFTER `{after}`"
                )
        local = f"{table.name}_local" if cluster else table.name
        for index in table.indexes:
            statements.append(f"ALTER TABLE {database}.{local}{on_cluster} ADD INDEX IF NOT EXISTS {index}")
        modify = ", ".join(f"{name} = {value}" for name, value in TABLE_SETTINGS.items())
        statements.append(f"ALTER TABLE {database}.{local}{on_cluster} MODIFY SETTING {modify}")
    return statements
