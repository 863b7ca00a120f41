"""Timeline export: a job's steps, phases, collectives and kernels as Chrome trace JSON.

The JSON Object Format of the Trace Event Format (what Perfetto and
chrome://tracing open): complete events (``"ph": "X"``) with ``ts``/``dur`` in
µs. One process per rank (``pid`` = rank, named ``rank N (host)``), threads as
lanes: ``tid`` 0 steps, 1 phases, 10+i one per process group (collectives from
issue to end; ``args.wait_us`` is issue to transfer start), 1000+stream one per
CUDA stream (kernels, memcpy, memset from ``kernel_events``).

``ts`` is relative to ``otherData.base_ns`` (ns since the epoch): µs since the
epoch do not fit a double at ns precision. At most ``max_events`` events, the
earliest first; ``otherData.truncated`` says when more were in the range.
"""

from __future__ import annotations

from typing import Any

from argus.collector.api.jobs import rank_filter, require_job
from argus.collector.api.params import RankSet
from argus.store import Store

__all__ = ["chrome_trace"]

_TID_STEPS = 0
_TID_PHASES = 1
_TID_GROUPS = 10
_TID_STREAMS = 1000

_QUERIES = {
    "steps": "SELECT rank, step, start_ns AS t, dur_ns AS d FROM steps",
    "phases": "SELECT rank, step, phase, start_ns AS t, dur_ns AS d FROM phases",
    "collectives": (
        "SELECT rank, step, process_group, seq, op, bytes, issue_ns AS t, start_ns, "
        "start_ns + dur_ns - issue_ns AS d FROM collectives"
    ),
    "kernel_events": (
        "SELECT rank, kind, kernel, stream, device, correlation, start_ns AS t, dur_ns AS d "
        "FROM kernel_events"
    ),
}


def _rows(
    store: Store, table: str, job_id: str, start_ns: int, end_ns: int, ranks: RankSet | None, limit: int
) -> list[dict[str, Any]]:
    condition, params = rank_filter("rank", ranks)
    begin = "issue_ns" if table == "collectives" else "start_ns"
    sql = (
        f"{_QUERIES[table]} WHERE job_id = {{job:String}} AND {condition} "
        f"AND {begin} <= {{end:Int64}} AND start_ns + dur_ns >= {{start:Int64}} "
        f"ORDER BY {begin} LIMIT {{limit:UInt64}}"
    )
    return store.query(
        sql, {**params, "job": job_id, "start": start_ns, "end": end_ns, "limit": limit}
    ).to_pylist()


def _cutoff(
    store: Store, job_id: str, start_ns: int, end_ns: int, ranks: RankSet | None, max_events: int
) -> int | None:
    """When the earliest event past the first ``max_events`` of the four tables begins, ns; None
    when there are no more than ``max_events`` (one query, its rows only timestamps)."""
    condition, params = rank_filter("rank", ranks)
    parts = []
    for table in _QUERIES:
        begin = "issue_ns" if table == "collectives" else "start_ns"
        parts.append(
            f"SELECT {begin} AS t FROM {table} WHERE job_id = {{job:String}} AND {condition} "
            f"AND {begin} <= {{end:Int64}} AND start_ns + dur_ns >= {{start:Int64}}"
        )
    found = store.query(
        "SELECT t FROM (" + " UNION ALL ".join(parts) + ") ORDER BY t LIMIT 1 OFFSET {skip:UInt64}",
        {**params, "job": job_id, "start": start_ns, "end": end_ns, "skip": max_events},
    )
    return int(found.column("t")[0].as_py()) if found.num_rows else None


def chrome_trace(
    store: Store,
    job_id: str,
    *,
    start_ns: int | None,
    end_ns: int | None,
    ranks: RankSet | None,
    max_events: int,
) -> dict[str, Any]:
    """The trace document of ``job_id`` for events overlapping [start_ns, end_ns].

    Args:
        start_ns, end_ns: ns since the epoch; None = unbounded.
        ranks: Ranks to include; None = all.
        max_events: Bound on complete events (metadata events come on top).

    Raises:
        NotFound: no such job.
    """
    require_job(store, job_id)
    lo = start_ns if start_ns is not None else 0
    hi = end_ns if end_ns is not None else 2**63 - 1
    # Rows of the four tables together, not each, stop at max_events: those before the first
    # event past them (what the server holds as dicts is bounded by max_events, not 4 times it).
    cutoff = _cutoff(store, job_id, lo, hi, ranks, max_events)
    until = hi if cutoff is None else min(hi, cutoff - 1)
    tables = {t: _rows(store, t, job_id, lo, until, ranks, max_events + 1) for t in _QUERIES}
    firsts = [rows[0]["t"] for rows in tables.values() if rows]
    base = start_ns if start_ns is not None else (min(firsts) if firsts else 0)

    def us(ns: int) -> float:
        return round((ns - base) / 1000, 3)

    groups = sorted({c["process_group"] for c in tables["collectives"]})
    group_tid = {g: _TID_GROUPS + i for i, g in enumerate(groups)}
    events: list[dict[str, Any]] = []
    for s in tables["steps"]:
        events.append(_complete(f"step {s['step']}", "step", s["rank"], _TID_STEPS, us(s["t"]), s["d"]))
        events[-1]["args"] = {"step": s["step"]}
    for p in tables["phases"]:
        events.append(_complete(p["phase"], "phase", p["rank"], _TID_PHASES, us(p["t"]), p["d"]))
        events[-1]["args"] = {"step": p["step"]}
    for c in tables["collectives"]:
        events.append(
            _complete(c["op"], "collective", c["rank"], group_tid[c["process_group"]], us(c["t"]), c["d"])
        )
        events[-1]["args"] = {
            "process_group": c["process_group"],
            "seq": c["seq"],
            "bytes": c["bytes"],
            "step": c["step"],
            "wait_us": round((c["start_ns"] - c["t"]) / 1000, 3),
        }
    for k in tables["kernel_events"]:
        events.append(
            _complete(k["kernel"], k["kind"], k["rank"], _TID_STREAMS + k["stream"], us(k["t"]), k["d"])
        )
        events[-1]["args"] = {"stream": k["stream"], "device": k["device"], "correlation": k["correlation"]}
    events.sort(key=lambda e: e["ts"])
    truncated = cutoff is not None or len(events) > max_events
    del events[max_events:]
    return {
        "traceEvents": _metadata(store, job_id, events, groups) + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "job_id": job_id,
            "base_ns": base,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "truncated": truncated,
        },
    }


def _complete(name: str, cat: str, rank: int, tid: int, ts: float, dur_ns: int) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": rank,
        "tid": tid,
        "ts": ts,
        "dur": max(dur_ns, 0) / 1000,
    }


def _metadata(
    store: Store, job_id: str, events: list[dict[str, Any]], groups: list[str]
) -> list[dict[str, Any]]:
    """process_name/thread_name events for every (rank, lane) that has events."""
    ranks = sorted({e["pid"] for e in events})
    hosts = {
        r["rank"]: r["host"]
        for r in store.query(
            "SELECT rank, argMax(host, time_ns) AS host FROM ranks "
            "WHERE job_id = {job:String} AND event = 'attach' GROUP BY rank",
            {"job": job_id},
        ).to_pylist()
    }
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    lane_names = {_TID_STEPS: "steps", _TID_PHASES: "phases"}
    lane_names.update({_TID_GROUPS + i: f"collectives {g}" for i, g in enumerate(groups)})
    out: list[dict[str, Any]] = []
    for rank in ranks:
        name = f"rank {rank}" + (f" ({hosts[rank]})" if hosts.get(rank) else "")
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": name}})
        out.append(
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
        )
    for pid, tid in lanes:
        name = lane_names.get(tid, f"stream {tid - _TID_STREAMS}")
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append(
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    return out
