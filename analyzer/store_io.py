"""Reading analysis windows from the store, writing the analyzer's accounting back (its I/O;
diagnoses are read and written by :mod:`argus.diagnosis`).

Every query names tables bare and binds ``{name:Type}`` parameters, so it runs
unchanged on chDB and on a ClickHouse server (:mod:`argus.store`).
Arrow results become NumPy columns here, once; nothing past this module sees
Arrow or SQL.

Which rows belong to a window ``[w0, w1)``:

* ``steps`` whose *end* lies in it (a step is recorded when it ends);
* ``phases`` and ``collectives`` of those (rank, step) pairs, plus every other
  rank's row of the same collective instances (needed to decompose them);
* ``host_samples`` whose interval ends in it (rank rows; the node-level link rows, rank -1,
  go to :class:`~argus.analyzer.window.LinkSamples` with each rank's host from its attach);
* ``kernel_summaries`` whose kernel window starts in it (several short kernel
  windows join; a kernel window longer than the analysis window lands in the
  analysis window where it starts);
* liveness (:class:`~argus.analyzer.window.RankStatus`) from everything up to
  ``w1``; callers merge it with what they remembered from earlier windows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from argus.analyzer.roles import Roles
from argus.analyzer.window import (
    Collectives,
    HostSamples,
    KernelClusters,
    LinkSamples,
    Phases,
    RankStatus,
    Steps,
    Window,
)
from argus.limits import LIMITS
from argus.schema import PHASES, wire_table
from argus.store import Store

__all__ = [
    "ActiveJobs",
    "JobSpan",
    "Liveness",
    "active_job_ids",
    "list_jobs",
    "read_data_windows",
    "read_liveness",
    "read_watermark",
    "read_window",
    "write_roles",
    "write_window",
]

#: Steps starting this long before a window are still looked at (a step longer than this is missed).
STEP_LOOKBACK_NS = 600 * 1_000_000_000


def _col(t: pa.Table, name: str, dtype: Any = np.int64) -> NDArray[Any]:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=dtype)


#: Appended to a window's reads: ``LowCardinality(String)`` columns come as Arrow dictionaries
#: (:func:`_encoded`): a 10,000-rank window's 1.5M kernel names as 50 strings and indices; and the
#: Arrow result is not LZ4-compressed (ClickHouse's default), only to be decompressed here: that
#: took about 0.2 s of CPU a window for the kernel summaries alone at 10,000 ranks (engine and
#: pyarrow together; ``bench/window_store.py``). Over HTTP the client's own compression still applies.
_AS_DICTIONARY = (
    " SETTINGS output_format_arrow_low_cardinality_as_dictionary = 1,"
    " output_format_arrow_compression_method = 'none'"
)


def _encoded(t: pa.Table, name: str) -> tuple[NDArray[np.int64], list[str]]:
    """The string column ``name`` as indices into its distinct values, each used by a row (Arrow's
    dictionary encoding: no Python object per row, where a window of 10,000 ranks has millions)."""
    column = t.column(name)
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return np.zeros(0, np.int64), []
    chunks: list[Any] = column.chunks  # pa.DictionaryArray each
    indices = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.int64)
    dictionary = chunks[0].dictionary
    used = np.flatnonzero(np.bincount(indices, minlength=len(dictionary)))
    code = np.zeros(len(dictionary), np.int64)
    code[used] = np.arange(used.size)
    names = [str(v) for v in dictionary.take(used).to_pylist()]
    return code[indices], names


def _codes(
    t: pa.Table, name: str, keep: NDArray[np.bool_] | None = None
) -> tuple[NDArray[np.int64], tuple[str, ...]]:
    """The string column ``name`` (of the rows ``keep``, all by default) as codes into its distinct
    values among those rows, sorted (``np.unique``'s order)."""
    if t.num_rows == 0:
        return np.zeros(0, np.int64), ()
    indices, values = _encoded(t, name)
    if keep is not None:
        indices = indices[keep]
        used = np.flatnonzero(np.bincount(indices, minlength=len(values)))
        if used.size < len(values):
            code = np.zeros(len(values), np.int64)
            code[used] = np.arange(used.size)
            indices, values = code[indices], [values[i] for i in used.tolist()]
    if indices.size == 0:
        return indices, ()
    order = sorted(range(len(values)), key=values.__getitem__)
    code = np.empty(len(values), np.int64)
    code[order] = np.arange(len(values))
    return code[indices], tuple(values[i] for i in order)


@dataclass(frozen=True)
class JobSpan:
    """A job in the store: its id and the time range of its data, ns since the epoch.

    ``imported`` is True once the job's ``jobs`` row says it came from a trace
    import (``source = 'import'``; the importer writes that row after the data).
    """

    job_id: str
    first_ns: int
    last_ns: int
    imported: bool = False


def list_jobs(
    store: Store,
    job: str | None = None,
    until_ns: int | None = None,
    *,
    jobs: Sequence[str] | None = None,
    from_ns: int | None = None,
) -> list[JobSpan]:
    """Every job with data (or only ``job``, or only those of ``jobs``), with the span of its timestamps.

    With ``until_ns``, rows that begin after it are left out: a row stamped decades ahead (a
    clock far off, a crafted batch) does not keep its job due for analysis every window forever.
    With ``from_ns``, rows that begin before it are left out too (``first_ns`` is then the first
    at or after it). Without ``job`` or ``jobs`` this reads four whole tables: the live analyzer
    asks for the ids of :func:`active_job_ids` only.

    Raises:
        StoreError: the query failed.
    """
    if jobs is not None:
        job_only = "job_id IN {jobs:Array(String)}"
    else:
        job_only = "job_id = {job:String}" if job is not None else "1"
    until = "{until:Int64}" if until_ns is not None else str(2**63 - 1)
    since = "{since:Int64}" if from_ns is not None else str(-(2**63))

    def where(begin: str) -> str:
        return f"WHERE {job_only} AND {begin} <= {until} AND {begin} >= {since}"

    sql = f"""
        SELECT job_id, min(t0) AS first_ns, max(t1) AS last_ns FROM (
            SELECT job_id, min(start_ns) AS t0, max(start_ns + dur_ns) AS t1
                FROM steps {where("start_ns")} GROUP BY job_id
            UNION ALL
            SELECT job_id, min(time_ns), max(time_ns) FROM host_samples {where("time_ns")} GROUP BY job_id
            UNION ALL
            SELECT job_id, min(issue_ns), max(issue_ns + dur_ns) FROM collectives {where("issue_ns")}
                GROUP BY job_id
            UNION ALL
            SELECT job_id, min(window_start_ns), max(window_start_ns + window_ns)
                FROM kernel_summaries {where("window_start_ns")} GROUP BY job_id
        ) GROUP BY job_id ORDER BY job_id
    """
    sql = f"""
        SELECT job_id, first_ns, last_ns,
               job_id IN (SELECT job_id FROM jobs WHERE {job_only} AND source = 'import') AS imported
        FROM ({sql})
    """
    params: dict[str, Any] = {}
    if jobs is not None:
        if not jobs:
            return []
        params["jobs"] = list(jobs)
    elif job is not None:
        params["job"] = job
    if until_ns is not None:
        params["until"] = until_ns
    if from_ns is not None:
        params["since"] = from_ns
    t = store.query(sql, params)
    return [
        JobSpan(str(j), int(a), int(b), bool(i))
        for j, a, b, i in zip(
            t.column("job_id").to_pylist(),
            _col(t, "first_ns"),
            _col(t, "last_ns"),
            _col(t, "imported", bool),
            strict=True,
        )
    ]


@dataclass(frozen=True)
class ActiveJobs:
    """What :func:`active_job_ids` found: ids, newest first."""

    #: Jobs with a batch stored lately (``ingest_batches``).
    live: list[str]
    #: Jobs whose trace import was stored lately (their ``jobs`` row, ``source = 'import'``) → when
    #: it was stored, s since the epoch (a later import into the same job changes it).
    imported: dict[str, int]


def active_job_ids(store: Store, idle_s: int, import_idle_s: int) -> ActiveJobs:
    """The jobs the live analyzer looks at in a pass: those with a batch stored in the last
    ``idle_s`` seconds, and those whose import was stored in the last ``import_idle_s`` seconds.

    Bounded whatever the store holds (README "Limits"): at most ``max_active_jobs`` ids of each
    kind (the most lately stored first), and at most ``max_job_list_rows`` rows of
    ``ingest_batches`` read (past it, the ids found in the rows read). Parts and granules stored
    before the horizon are skipped through the ``stored_at`` minmax index
    (:data:`argus.schema.STORED_AT_INDEX`), so the rows read are about those stored within it.
    The horizon is the store's clock (``now()``), which stamped ``stored_at``.

    Raises:
        StoreError: a query failed.
    """
    most = LIMITS["max_active_jobs"]
    live = store.query(
        f"""
        SELECT job_id, max(stored_at) AS seen FROM ingest_batches
        WHERE stored_at >= now() - toIntervalSecond({{idle:UInt32}})
        GROUP BY job_id ORDER BY seen DESC, job_id LIMIT {most}
        SETTINGS max_rows_to_read = {LIMITS["max_job_list_rows"]}, read_overflow_mode = 'break'
        """,
        {"idle": int(idle_s)},
    )
    imported = store.query(
        f"""
        SELECT job_id, toInt64(max(stored_at)) AS seen FROM jobs
        WHERE source = 'import' AND stored_at >= now() - toIntervalSecond({{idle:UInt32}})
        GROUP BY job_id ORDER BY seen DESC, job_id LIMIT {most}
        """,
        {"idle": int(import_idle_s)},
    )
    return ActiveJobs(
        [str(j) for j in live.column("job_id").to_pylist()],
        {
            str(j): int(t)
            for j, t in zip(imported.column("job_id").to_pylist(), _col(imported, "seen"), strict=True)
        },
    )


def read_data_windows(store: Store, job_id: str, window_ns: int) -> NDArray[np.int64]:
    """Starts of the windows, ns, in which ``job_id`` has a row (a step's or collective's start or
    end, a host sample, a kernel summary), ascending: what is worth analysing of a job whose data
    has gaps (an imported trace may span years with nothing between its parts)."""
    sql = """
        SELECT DISTINCT intDiv(t, {w:Int64}) * {w:Int64} AS w FROM (
            SELECT arrayJoin([start_ns, start_ns + dur_ns]) AS t FROM steps WHERE job_id = {job:String}
            UNION ALL
            SELECT arrayJoin([issue_ns, start_ns + dur_ns]) FROM collectives WHERE job_id = {job:String}
            UNION ALL
            SELECT time_ns FROM host_samples WHERE job_id = {job:String}
            UNION ALL
            SELECT window_start_ns FROM kernel_summaries WHERE job_id = {job:String}
        ) WHERE t >= 0 ORDER BY w
    """
    return _col(store.query(sql, {"job": job_id, "w": window_ns}), "w")


def _steps_filter() -> str:
    return (
        "job_id = {job:String} AND start_ns >= {lo:Int64} AND start_ns < {w1:Int64} "
        "AND start_ns + dur_ns >= {w0:Int64} AND start_ns + dur_ns < {w1:Int64}"
    )


@dataclass(frozen=True)
class Liveness:
    """Per-rank newest timestamps and collective seqs seen up to a window's end (merge across windows).

    Attributes:
        last_seen: Rank → newest timestamp of any of its rows, ns.
        last_progress: Rank → newest end of a step or phase or issue of a collective, ns.
        max_seq: (process group, rank) → newest seq it recorded or waits in.
        position: Rank → furthest (step, phase) it completed (:func:`progress_position`).
        heartbeat: Rank → (time of its newest host sample, ns; issue time of the collective that
            sample shows it waiting in, ns, or -1 when it waits in none).
    """

    last_seen: dict[int, int] = field(default_factory=dict)
    last_progress: dict[int, int] = field(default_factory=dict)
    max_seq: dict[tuple[str, int], int] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    heartbeat: dict[int, tuple[int, int]] = field(default_factory=dict)

    def merge(self, newer: Liveness) -> Liveness:
        """This liveness updated by ``newer`` (a later read): the newest of each value, per key."""

        def newest(old: dict[Any, int], new: dict[Any, int]) -> dict[Any, int]:
            out, get = dict(old), old.get
            out.update({k: v if v > (o := get(k, -1)) else o for k, v in new.items()})
            return out

        beats, beat_of = dict(self.heartbeat), self.heartbeat.get
        beats.update({r: b for r, b in newer.heartbeat.items() if b[0] >= beat_of(r, (-1, -1))[0]})
        return Liveness(
            newest(self.last_seen, newer.last_seen),
            newest(self.last_progress, newer.last_progress),
            newest(self.max_seq, newer.max_seq),
            newest(self.position, newer.position),
            beats,
        )


def read_liveness(store: Store, job_id: str, lo_ns: int, w1_ns: int) -> Liveness:
    """Newest heartbeat/progress per rank and newest seq per (group, rank) in ``[lo_ns, w1_ns)``.

    A rank's newest seq in a group is the newest it recorded or was waiting in (its heartbeats'
    ``pending_seq``; point-to-point ops left out, their seqs are not shared by the group).
    """
    # A phase's number (1 for the first of PHASES) by transform(): indexOf() over the phase names
    # took a third of the query's CPU (a 10,000-rank job: 1.4 million phases in the two windows read).
    p = {
        "job": job_id,
        "lo": lo_ns,
        "w1": w1_ns,
        "phases": list(PHASES),
        "phase_no": list(range(1, len(PHASES) + 1)),
    }
    t = store.query(
        """
        SELECT rank, max(t) AS seen_ns, maxIf(t, prog = 1) AS progress_ns, max(prog) AS has_progress,
               max(pos) AS position,
               min(prog) = 0 AS has_beat, maxIf(t, prog = 0) AS beat_ns, argMaxIf(w, t, prog = 0) AS waiting
        FROM (
            SELECT toInt64(rank) AS rank, time_ns AS t, 0 AS prog, toInt64(-1) AS pos,
                   if(pending_seq >= 0, toInt64(pending_issue_ns), toInt64(-1)) AS w FROM host_samples
                WHERE job_id = {job:String} AND rank >= 0 AND time_ns >= {lo:Int64} AND time_ns < {w1:Int64}
            UNION ALL
            SELECT toInt64(rank), start_ns + dur_ns, 1, toInt64(step) * 8 + 5, toInt64(-1) FROM steps
                WHERE job_id = {job:String}
                    AND start_ns + dur_ns >= {lo:Int64} AND start_ns + dur_ns < {w1:Int64}
            UNION ALL
            SELECT toInt64(rank), start_ns + dur_ns, 1,
                   toInt64(step) * 8 + transform(phase, {phases:Array(String)}, {phase_no:Array(UInt8)}, 0),
                   toInt64(-1)
                FROM phases
                WHERE job_id = {job:String}
                    AND start_ns + dur_ns >= {lo:Int64} AND start_ns + dur_ns < {w1:Int64}
            UNION ALL
            SELECT toInt64(rank), issue_ns, 1, toInt64(-1), toInt64(-1) FROM collectives
                WHERE job_id = {job:String} AND issue_ns >= {lo:Int64} AND issue_ns < {w1:Int64}
        ) GROUP BY rank
        """,
        p,
    )
    ranks = _col(t, "rank")
    seen = _col(t, "seen_ns")
    prog = _col(t, "progress_ns")
    anyp = _col(t, "has_progress", bool)
    pos = _col(t, "position")
    # A collective's row is written once it completes; the one a rank waits in shows in its
    # heartbeats (pending_seq), so a rank's newest seq counts what it issued and still waits in.
    s = store.query(
        """
        SELECT process_group, rank, max(q) AS seq FROM (
            SELECT process_group, toInt64(rank) AS rank, toInt64(seq) AS q FROM collectives
                WHERE job_id = {job:String} AND issue_ns >= {lo:Int64} AND issue_ns < {w1:Int64}
                    AND peer < 0
            UNION ALL
            SELECT toString(pending_group), toInt64(rank), pending_seq FROM host_samples
                WHERE job_id = {job:String} AND rank >= 0 AND time_ns >= {lo:Int64}
                    AND time_ns < {w1:Int64} AND pending_seq >= 0 AND pending_group != ''
                    AND pending_op NOT IN ('send', 'recv')
        ) GROUP BY process_group, rank
        """,
        p,
    )
    # The newest heartbeat (host sample) of each rank, and the collective it shows the rank waiting in.
    has_beat = _col(t, "has_beat", bool)
    beats = zip(_col(t, "beat_ns")[has_beat].tolist(), _col(t, "waiting")[has_beat].tolist(), strict=True)
    group, group_names = _encoded(s, "process_group")
    return Liveness(
        heartbeat=dict(zip(ranks[has_beat].tolist(), beats, strict=True)),
        last_seen=dict(zip(ranks.tolist(), seen.tolist(), strict=True)),
        last_progress=dict(zip(ranks[anyp].tolist(), prog[anyp].tolist(), strict=True)),
        position=dict(zip(ranks[pos >= 0].tolist(), pos[pos >= 0].tolist(), strict=True)),
        max_seq=dict(
            zip(
                zip(map(group_names.__getitem__, group.tolist()), _col(s, "rank").tolist(), strict=True),
                _col(s, "seq").tolist(),
                strict=True,
            )
        ),
    )


def read_watermark(store: Store, job_id: str, since_ns: int) -> int | None:
    """The time up to which every rank still reporting has its rows stored, ns (None: no heartbeat).

    The oldest, over the ranks with a heartbeat (host sample) since ``since_ns`` that have not
    exited, of their newest heartbeat: node agents send a rank's rows in order, so a heartbeat
    stored means the rows before it are too.

    Raises:
        StoreError: the query failed.
    """
    t = store.query(
        """
        SELECT min(t) AS mark, count() AS ranks FROM (
            SELECT rank, max(time_ns) AS t FROM host_samples
            WHERE job_id = {job:String} AND rank >= 0 AND time_ns >= {since:Int64} GROUP BY rank
        ) WHERE toUInt32(rank) NOT IN (
            SELECT rank FROM ranks WHERE job_id = {job:String} AND event = 'exit'
        )
        """,
        {"job": job_id, "since": since_ns},
    )
    if t.num_rows == 0 or int(t.column("ranks")[0].as_py() or 0) == 0:
        return None
    return int(t.column("mark")[0].as_py())


def _rank_table(store: Store, job_id: str, w1: int) -> pa.Table:
    return store.query(
        """
        SELECT toInt64(rank) AS rank, event, time_ns, exit_code, device, host
        FROM ranks WHERE job_id = {job:String} AND time_ns < {w1:Int64}
        ORDER BY time_ns
        """
        + _AS_DICTIONARY,
        {"job": job_id, "w1": w1},
    )


def _group_members(store: Store, job_id: str, w1: int) -> dict[str, NDArray[np.int64]]:
    """Each process group's members (sorted), from its newest ``group`` row before ``w1``.

    Every member reports its group: the world group of a 10,000-rank job is 10,000 rows of
    10,000 members each, so the rows are reduced in the store, one list per group.
    """
    t = store.query(
        """
        SELECT group_name, argMax(group_ranks, time_ns) AS members FROM ranks
        WHERE job_id = {job:String} AND time_ns < {w1:Int64} AND event = 'group' AND group_name != ''
        GROUP BY group_name
        """,
        {"job": job_id, "w1": w1},
    )
    members = t.column("members").combine_chunks()
    return {
        str(name): np.sort(np.asarray(members[i].values.to_numpy(zero_copy_only=False), np.int64))
        for i, name in enumerate(t.column("group_name").to_pylist())
    }


def _newest(
    rank: NDArray[np.int64], selected: NDArray[np.bool_]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Of rows in time order (``rank`` per row), each rank's newest ``selected`` row: the ranks
    that have one (sorted) and those rows' indices."""
    rows = np.flatnonzero(selected)[::-1]
    ranks, first = np.unique(rank[rows], return_index=True)
    return ranks, rows[first]


def _status(
    rt: pa.Table, live: Liveness, host_gpu: NDArray[np.int64], groups: dict[str, NDArray[np.int64]]
) -> RankStatus:
    """Every rank known by the window's end (``ranks`` rows ``rt`` in time order, ``live``), with
    NumPy over the rows: a 10,000-rank job has 30,000 of them and 10,000 ranks each window."""
    rank = _col(rt, "rank")
    seq_keys = list(live.max_seq)
    known = [rank, np.fromiter(live.last_seen, np.int64, len(live.last_seen))]
    known.append(np.fromiter((r for (_, r) in seq_keys), np.int64, len(seq_keys)))
    ranks = np.unique(np.concatenate(known))
    event, event_names = _encoded(rt, "event")
    device, device_names = _encoded(rt, "device")
    exit_row = event == (event_names.index("exit") if "exit" in event_names else -1)
    cuda = np.array([str(d).startswith("cuda") for d in device_names], bool)
    attach_row = event == (event_names.index("attach") if "attach" in event_names else -1)
    gpu_row = attach_row & cuda[device] if cuda.size else np.zeros(rank.size, bool)
    exited = np.zeros(ranks.size, bool)
    exit_code = np.zeros(ranks.size, np.int64)
    # A rank's newest exit row counts.
    exit_rank, exit_rows = _newest(rank, exit_row)
    at = np.searchsorted(ranks, exit_rank)
    exited[at] = True
    exit_code[at] = _col(rt, "exit_code")[exit_rows]
    has_gpu = np.isin(ranks, host_gpu) | np.isin(ranks, rank[gpu_row])
    host_code, host_names = _encoded(rt, "host")
    # A rank's newest attach row names its host.
    attach_rank, attach_rows = _newest(rank, attach_row)
    host = np.full(ranks.size, -1, np.int64)
    host[np.searchsorted(ranks, attach_rank)] = host_code[attach_rows]
    if "" in host_names:  # an attach row without a host names none
        host[host == host_names.index("")] = -1
    seq_groups = tuple(sorted({g for (g, _) in seq_keys}))
    gidx = {g: i for i, g in enumerate(seq_groups)}
    seq_group = np.fromiter((gidx[g] for (g, _) in seq_keys), np.int64, len(seq_keys))
    seq_rank = known[2]
    by_key = np.lexsort((seq_rank, seq_group))  # the keys' order, (group name, rank), unique
    seen, progress, position, beats = live.last_seen, live.last_progress, live.position, live.heartbeat
    return RankStatus(
        rank=ranks,
        exited=exited,
        exit_code=exit_code,
        last_seen_ns=_per_rank(ranks, seen.keys(), seen.values(), len(seen)),
        last_progress_ns=_per_rank(ranks, progress.keys(), progress.values(), len(progress)),
        position=_per_rank(ranks, position.keys(), position.values(), len(position)),
        waiting_since_ns=_per_rank(ranks, beats.keys(), (w for (_, w) in beats.values()), len(beats)),
        has_gpu=has_gpu,
        host=host,
        hosts=tuple(host_names),
        groups=groups,
        seq_groups=seq_groups,
        seq_group=seq_group[by_key],
        seq_rank=seq_rank[by_key],
        seq_max=np.fromiter(live.max_seq.values(), np.int64, len(seq_keys))[by_key],
    )


def _per_rank(
    ranks: NDArray[np.int64], keys: Iterable[int], values: Iterable[int], n: int
) -> NDArray[np.int64]:
    """Per rank of ``ranks`` (sorted, unique): its value among the ``n`` ``keys`` → ``values`` (a dict's
    keys and values, in their order), -1 where it has none."""
    key = np.fromiter(keys, np.int64, n)
    value = np.fromiter(values, np.int64, n)
    out = np.full(ranks.size, -1, np.int64)
    if ranks.size == 0:
        return out
    at = np.minimum(np.searchsorted(ranks, key), ranks.size - 1)
    found = ranks[at] == key
    out[at[found]] = value[found]
    return out


def read_window(store: Store, job_id: str, w0: int, w1: int, live: Liveness) -> Window:
    """Read the window ``[w0, w1)`` of ``job_id``; ``live`` is the caller's merged liveness up to ``w1``.

    Raises:
        StoreError: a query failed.
    """
    p = {"job": job_id, "w0": w0, "w1": w1, "lo": w0 - STEP_LOOKBACK_NS}
    f = _steps_filter()
    st = store.query(
        f"SELECT toInt64(rank) AS rank, toInt64(step) AS step, start_ns, dur_ns FROM steps WHERE {f}"
        + _AS_DICTIONARY,
        p,
    )
    p["from"], p["reach"] = _reach(st, w0 - STEP_LOOKBACK_NS)
    # Every (rank, step) of the window's rows, those past the limits too: a phase or collective of
    # one of those is skipped and counted as such below, as the store's own (rank, step) IN did.
    pairs = (_col(st, "rank"), _col(st, "step"))
    skipped: dict[str, int] = {}
    keep = _within_limits({"step": pairs[1]}, skipped, "steps")
    steps = Steps(pairs[0][keep], pairs[1][keep], _col(st, "start_ns")[keep], _col(st, "dur_ns")[keep])
    # The phases and collectives of the window's steps: read by time alone and matched to the steps
    # here. The time bounds (_reach) let the sort keys (argus.schema.by_second) skip all but the
    # window's granules and leave out no row of the window; matching (rank, step) in the query
    # (an IN subquery over steps, once per table) took more CPU than reading the rows past them.
    # Each column becomes NumPy once and rows are dropped from the arrays.
    ph = store.query(
        f"""SELECT rank, step, phase, start_ns, dur_ns FROM phases
            WHERE job_id = {{job:String}} AND start_ns >= {{lo:Int64}} - {STEP_LOOKBACK_NS}
                AND start_ns + dur_ns >= {{from:Int64}}
                AND start_ns + dur_ns < {{w1:Int64}} + {{reach:Int64}}"""
        + _AS_DICTIONARY,
        p,
    )
    ph_rank, ph_step = _col(ph, "rank"), _col(ph, "step")
    keep = _within_limits({"step": ph_step}, skipped, "phases", _pairs_in(ph_rank, ph_step, *pairs))
    phase_code = {name: i for i, name in enumerate(PHASES)}
    indices, names = _encoded(ph, "phase")
    pc = np.array([phase_code.get(n, -1) for n in names], np.int64)[indices]
    keep &= pc >= 0  # an unknown phase name is ignored, not fatal
    phases = Phases(
        ph_rank[keep], ph_step[keep], pc[keep], _col(ph, "start_ns")[keep], _col(ph, "dur_ns")[keep]
    )
    co = store.query(
        """SELECT rank, step, process_group, seq, op, bytes, issue_ns, start_ns, dur_ns, peer, overlapped,
                  wait_ns
           FROM collectives
           WHERE job_id = {job:String}
               AND issue_ns >= {from:Int64} - greatest({reach:Int64}, 0)
               AND issue_ns < {w1:Int64} + greatest({reach:Int64}, 0)"""
        + _AS_DICTIONARY,
        p,
    )
    c = {name: _col(co, name) for name in ("rank", "step", "seq", "issue_ns")}
    c["group"] = _encoded(co, "process_group")[0]
    keep = _within_limits(
        {"step": c["step"], "seq": c["seq"]}, skipped, "collectives", _instances(c, p, pairs)
    )
    del c["group"]
    c = {name: values[keep] for name, values in c.items()}
    group, group_names = _codes(co, "process_group", keep)
    op, op_names = _codes(co, "op", keep)
    coll = Collectives(
        c["rank"],
        c["step"],
        group,
        c["seq"],
        op,
        _col(co, "bytes")[keep],
        c["issue_ns"],
        _col(co, "start_ns")[keep],
        _col(co, "dur_ns")[keep],
        _pairs_in(c["rank"], c["step"], steps.rank, steps.step),
        group_names,
        op_names,
        _col(co, "peer")[keep],
        _col(co, "overlapped", bool)[keep],
        _col(co, "wait_ns")[keep],
    )
    hs = store.query(
        """SELECT toInt64(rank) AS rank, time_ns, interval_ns, proc_cpu_ns, gc_pause_ns,
                  toInt64(gpu_sm_clock_mhz) AS clock, toInt64(gpu_throttle_reasons) AS reasons,
                  run_delay_ns
           FROM host_samples
           WHERE job_id = {job:String} AND rank >= 0 AND time_ns >= {w0:Int64} AND time_ns < {w1:Int64}"""
        + _AS_DICTIONARY,
        p,
    )
    host = HostSamples(
        _col(hs, "rank"),
        _col(hs, "time_ns"),
        _col(hs, "interval_ns"),
        _col(hs, "proc_cpu_ns"),
        _col(hs, "gc_pause_ns"),
        _col(hs, "clock"),
        _col(hs, "reasons"),
        _col(hs, "run_delay_ns"),
    )
    # A row summarises [window_start_ns, + its window_ns): one of another length (an agent or an
    # import with another --window-s) is not this window's; it is left out and counted, never misread.
    # Left out by the query: reading window_ns beside the rows took a fifth of its CPU.
    ks_where = (
        "WHERE job_id = {job:String} AND window_start_ns >= {w0:Int64} AND window_start_ns < {w1:Int64}"
    )
    ks = store.query(
        f"""SELECT rank, kernel, stream, collective, count, p50_ns, p99_ns, log_lo, log_hi, sum_ns
            FROM kernel_summaries {ks_where} AND window_ns = {{w1:Int64}} - {{w0:Int64}}"""
        + _AS_DICTIONARY,
        p,
    )
    other = store.query(
        f"SELECT count() AS n FROM kernel_summaries {ks_where} AND window_ns != {{w1:Int64}} - {{w0:Int64}}",
        p,
    )
    mismatched = int(other.column("n")[0].as_py())
    kernel, kernel_names = _codes(ks, "kernel")
    kernels = KernelClusters(
        _col(ks, "rank"),
        kernel,
        _col(ks, "stream"),
        _col(ks, "collective", bool),
        _col(ks, "count"),
        _col(ks, "p50_ns", np.float64),
        _col(ks, "p99_ns", np.float64),
        _col(ks, "log_lo", np.float64),
        _col(ks, "log_hi", np.float64),
        _col(ks, "sum_ns", np.float64),
        kernel_names,
    )
    host_gpu = host.rank[host.gpu_sm_clock_mhz > 0]
    rt = _rank_table(store, job_id, w1)
    status = _status(rt, live, host_gpu, _group_members(store, job_id, w1))
    links = _links(store, p, rt)
    return Window(job_id, w0, w1, steps, phases, coll, host, kernels, status, links, mismatched, skipped)


def _pairs_in(
    a: NDArray[np.int64], b: NDArray[np.int64], set_a: NDArray[np.int64], set_b: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """Per row ``(a, b)``: True when it is one of the pairs ``(set_a, set_b)`` (SQL's ``(a, b) IN``).

    By a table over the set's ranges where it is small (a window's steps span a few step numbers
    of each rank, its collective instances a few seqs of each group), else ``np.isin`` of keys:
    ``a << 40 | b`` where the values allow (ranks < 2**20 and steps < 2**40, :mod:`argus.limits`),
    the 16 bytes of the pair otherwise (an older store's rows past the limits). numpy's sort of
    both sides took a quarter of a 10,000-rank window's read (680,000 collective rows, 170,000 steps).
    """
    if set_a.size == 0 or a.size == 0:
        return np.zeros(a.size, bool)
    a0, a1, b0, b1 = int(set_a.min()), int(set_a.max()), int(set_b.min()), int(set_b.max())
    n_b = b1 - b0 + 1
    cells = (a1 - a0 + 1) * n_b
    if cells <= 4 * (a.size + set_a.size):
        table = np.zeros(cells + 1, bool)  # the last cell: every pair outside the ranges
        table[(set_a - a0) * n_b + (set_b - b0)] = True
        # Differences wrap where they overflow; read unsigned, a wrapped one is past the range.
        da, db = a - a0, b - b0
        inside = (da.view(np.uint64) <= a1 - a0) & (db.view(np.uint64) <= b1 - b0)
        found: NDArray[np.bool_] = table[np.where(inside, da * n_b + db, cells)]
        return found
    low = min(a0, b0, int(a.min()), int(b.min()))
    if low >= 0 and max(a1, int(a.max())) < 1 << 23 and max(b1, int(b.max())) < 1 << 40:
        return np.isin((a << 40) + b, (set_a << 40) + set_b)

    def pair(x: NDArray[np.int64], y: NDArray[np.int64]) -> NDArray[np.void]:
        return np.ascontiguousarray(np.stack([x, y], axis=1)).view(np.dtype((np.void, 16))).ravel()

    return np.isin(pair(a, b), pair(set_a, set_b))


def _instances(
    c: dict[str, NDArray[np.int64]], p: dict[str, Any], pairs: tuple[NDArray[np.int64], NDArray[np.int64]]
) -> NDArray[np.bool_]:
    """Per row of the collectives read around a window (``c``: their rank, step, seq, issue_ns and
    process group's code; ``p``: the window's bounds): True when it was issued within ``p["reach"]``
    of ``[p["from"], p["w1"])`` and its instance (process group, seq) has a row issued in that span
    by one of the window's steps ``pairs`` (rank, step): every rank's row of the window's collective
    instances."""
    issue, group, seq = c["issue_ns"], c["group"], c["seq"]
    own = (issue >= p["from"]) & (issue < p["w1"]) & _pairs_in(c["rank"], c["step"], *pairs)
    near: NDArray[np.bool_] = (issue >= p["from"] - p["reach"]) & (issue < p["w1"] + p["reach"])
    return near & _pairs_in(group, seq, group[own], seq[own])


def _reach(st: pa.Table, lo_ns: int) -> tuple[int, int]:
    """Where a window's phases and collectives are read from, ns, and how far past its steps, ns.

    ``st``: the window's ``steps`` rows; ``lo_ns``: the earliest start they may have (the window's
    start less :data:`STEP_LOOKBACK_NS`). A step's phases and collectives lie within it, so they
    begin after the earliest start of the window's steps; the bound keeps the longest of those
    steps to spare (``reach``: a clock re-estimate between a step's start and its rows moves them
    by far less). Where the window holds a rank's step 0, ``lo_ns``: a rank's first step also
    holds the collectives it issued before its first phase (DDP's first broadcast), and the
    importer's step 0 those issued before the trace's first step. The other ranks' rows of the
    window's collective instances are read within ``reach`` of these bounds on either side: a
    rank that issued one more than the longest of the window's steps before the others had been
    waiting in it longer than any of their steps took.

    Returns:
        ``(from_ns, reach_ns)``; ``(lo_ns, 0)`` for a window without steps.
    """
    if st.num_rows == 0:
        return lo_ns, 0
    start, dur = _col(st, "start_ns"), _col(st, "dur_ns")
    reach = int(dur.max())
    if np.any(_col(st, "step") == 0):
        return lo_ns, reach
    return max(lo_ns, int(start.min()) - reach), reach


def _within_limits(
    columns: dict[str, NDArray[np.int64]],
    skipped: dict[str, int],
    table: str,
    keep: NDArray[np.bool_] | None = None,
) -> NDArray[np.bool_]:
    """Which rows of ``keep`` (all by default) to keep: those whose ``columns`` (name → values, read
    as int64: past 2**63 they are negative) lie within ``[0, LIMITS[max_<name>]]``; the rows of
    ``keep`` dropped are added to ``skipped[table]``. Ingest refuses such rows (:mod:`argus.limits`);
    a store written before it did may hold some, and one of them would fail every window of its
    job (a step of 2**64-1 reads -1)."""
    rows = next(iter(columns.values())).size
    ok = np.ones(rows, bool) if keep is None else keep.copy()
    for name, values in columns.items():
        ok &= (values >= 0) & (values <= LIMITS[f"max_{name}"])
    wanted = rows if keep is None else int(np.count_nonzero(keep))
    bad = wanted - int(np.count_nonzero(ok))
    if bad:
        skipped[table] = skipped.get(table, 0) + bad
    return ok


def _links(store: Store, p: dict[str, Any], rt: pa.Table) -> LinkSamples:
    """The window's link samples (rank -1 rows of host_samples) and each rank's host."""
    ls = store.query(
        """SELECT host, net_if, time_ns, interval_ns,
                  toInt64(net_rx_bytes) AS rx, toInt64(net_tx_bytes) AS tx,
                  toInt64(net_errors) AS errors, toInt64(net_drops) AS drops,
                  toInt64(net_tx_capacity_bps) AS tx_cap, toInt64(net_rx_capacity_bps) AS rx_cap,
                  toInt64(net_qdisc_backlog_bytes) AS backlog, toInt64(net_qdisc_overlimits) AS overlimits,
                  toInt64(net_qdisc_drops) AS qdrops
           FROM host_samples
           WHERE job_id = {job:String} AND rank = -1 AND net_if != ''
               AND time_ns >= {w0:Int64} AND time_ns < {w1:Int64}""",
        p,
    )
    if ls.num_rows == 0:
        return LinkSamples()
    host, host_names = _codes(ls, "host")
    interface, interface_names = _codes(ls, "net_if")
    index = {h: i for i, h in enumerate(host_names)}
    attach = np.array([e == "attach" for e in rt.column("event").to_pylist()], bool)
    hosts = np.asarray(rt.column("host").to_pylist(), dtype=object)
    rank_host = dict(zip(_col(rt, "rank")[attach].tolist(), hosts[attach].tolist(), strict=True))
    ranks = np.array(sorted(rank_host), np.int64)
    return LinkSamples(
        host,
        interface,
        _col(ls, "time_ns"),
        _col(ls, "interval_ns"),
        _col(ls, "rx"),
        _col(ls, "tx"),
        _col(ls, "errors"),
        _col(ls, "drops"),
        _col(ls, "tx_cap"),
        _col(ls, "rx_cap"),
        _col(ls, "backlog"),
        _col(ls, "overlimits"),
        _col(ls, "qdrops"),
        host_names,
        interface_names,
        ranks,
        np.array([index.get(str(rank_host[r]), -1) for r in ranks.tolist()], np.int64),
    )


def write_window(
    store: Store,
    job_id: str,
    window_start_ns: int,
    window_ns: int,
    *,
    status: str,
    wall_ns: float,
    steps: int,
    lost_ns: float,
    explained_ns: float,
    updated_ns: int,
) -> None:
    """Record one analysed (or failed) window's lost-time accounting in ``analysis_windows``.

    Raises:
        StoreError: the insert failed.
    """
    row = {
        "window_start_ns": [int(window_start_ns)],
        "window_ns": [int(window_ns)],
        "status": [status],
        "wall_ns": [round(wall_ns)],
        "steps": [int(steps)],
        "lost_ns": [round(lost_ns)],
        "explained_ns": [round(min(explained_ns, lost_ns))],
        "updated_ns": [int(updated_ns)],
    }
    store.insert("analysis_windows", wire_table("analysis_windows", row, job_id))


def write_roles(store: Store, job_id: str, roles: Roles, updated_ns: int) -> None:
    """Record every rank's inferred role in ``roles`` (a new version per rank).

    Raises:
        StoreError: the insert failed.
    """
    sizes = np.bincount(roles.role, minlength=roles.n_roles)
    row = {
        "rank": roles.rank.tolist(),
        "role": [roles.labels[g] for g in roles.role.tolist()],
        "pipeline_stage": roles.stage.tolist(),
        "role_size": sizes[roles.role].tolist(),
        "updated_ns": [int(updated_ns)] * roles.rank.size,
    }
    store.insert("roles", wire_table("roles", row, job_id))
