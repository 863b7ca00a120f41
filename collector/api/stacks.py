"""``GET /api/v1/jobs/{job_id}/stacks``: the sampled stacks of a job's ranks (the ``stacks`` table).

Rows come in capture order (``time_ns``, then capture, rank, thread, most samples first within a
thread); pages are keyed on that order. ``capture=`` keeps one capture's rows (its
``capture_id``: a diagnosis's ``evidence.stacks.capture_id``, what the page's flame graph
draws). ``format=collapsed`` answers Brendan Gregg's folded
text instead, one ``thread;frame;…;frame count`` line per stack summed over the rows asked for,
which flamegraph.pl, speedscope and inferno read: at most :data:`MAX_FOLDED_STACKS` lines, the
stacks with the most samples (what a flame graph shows anyway).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import PlainTextResponse

from argus.collector.api.jobs import require_job
from argus.collector.api.params import INT64_MAX, decode_cursor, encode_cursor
from argus.store import Store

__all__ = ["MAX_FOLDED_STACKS", "folded", "list_stacks", "stacks_answer"]

#: Most lines of a folded answer (distinct stacks), those with the most samples.
MAX_FOLDED_STACKS = 100_000

_COLUMNS = "rank, pid, capture_id, time_ns, duration_ns, sampler, thread, frames, count, idle, gil"
_ORDER = "time_ns, capture_id, rank, thread, frames, idle, gil"


def _filter(
    rank: int | None, start_ns: int | None, end_ns: int | None, capture: str | None = None
) -> tuple[str, dict[str, Any]]:
    where = ["job_id = {job:String}"]
    params: dict[str, Any] = {}
    if rank is not None:
        where.append("rank = {rank:UInt32}")
        params["rank"] = rank
    if capture is not None:
        where.append("capture_id = {capture:String}")
        params["capture"] = capture
    if start_ns is not None:
        where.append("time_ns + duration_ns >= {lo:Int64}")
        params["lo"] = start_ns
    if end_ns is not None:
        where.append("time_ns <= {hi:Int64}")
        params["hi"] = end_ns
    return " AND ".join(where), params


def list_stacks(
    store: Store,
    job_id: str,
    *,
    rank: int | None,
    start_ns: int | None,
    end_ns: int | None,
    limit: int,
    cursor: str | None,
    capture: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of a job's stack rows captured in [start_ns, end_ns] (ns), of one capture when
    ``capture`` (a ``capture_id``) is given, and the next cursor.

    Raises:
        NotFound: no such job.
        BadParameter: ``cursor`` is not one this function made.
    """
    require_job(store, job_id)
    where, params = _filter(rank, start_ns, end_ns, capture)
    if cursor:
        key = decode_cursor(cursor, (int, str, int, str, str, int, int))
        key[0] = max(-INT64_MAX, min(int(key[0]), INT64_MAX))
        where += (
            " AND (time_ns, capture_id, rank, thread, frames, idle, gil) > "
            "({c0:Int64}, {c1:String}, {c2:UInt32}, {c3:String}, {c4:String}, {c5:UInt8}, {c6:UInt8})"
        )
        params.update({f"c{i}": v for i, v in enumerate(key)})
    rows = store.query(
        f"SELECT {_COLUMNS} FROM stacks WHERE {where} ORDER BY {_ORDER} LIMIT {{limit:UInt32}}",
        {**params, "job": job_id, "limit": limit + 1},
    ).to_pylist()
    items = [{**r, "idle": bool(r["idle"]), "gil": bool(r["gil"])} for r in rows[:limit]]
    if len(rows) <= limit:
        return items, None
    last = items[-1]
    key = [last["time_ns"], last["capture_id"], last["rank"], last["thread"], last["frames"]]
    return items, encode_cursor([*key, int(last["idle"]), int(last["gil"])])


def folded(
    store: Store,
    job_id: str,
    *,
    rank: int | None,
    start_ns: int | None,
    end_ns: int | None,
    capture: str | None = None,
) -> str:
    """The folded-stacks text of the rows asked for (module docstring); empty when none.

    Raises:
        NotFound: no such job.
    """
    require_job(store, job_id)
    where, params = _filter(rank, start_ns, end_ns, capture)
    rows = store.query(
        f"SELECT thread, frames, n FROM (SELECT thread, frames, sum(count) AS n FROM stacks WHERE {where} "
        "GROUP BY thread, frames ORDER BY n DESC, thread, frames LIMIT {most:UInt32}) "
        "ORDER BY thread, frames",
        {**params, "job": job_id, "most": MAX_FOLDED_STACKS},
    ).to_pylist()
    return "".join(
        f"{r['thread']};{r['frames']} {r['n']}\n" if r["frames"] else f"{r['thread']} {r['n']}\n"
        for r in rows
    )


def stacks_answer(
    store: Store,
    job_id: str,
    rank: int | None,
    start_ns: int | None,
    end_ns: int | None,
    *,
    collapsed: bool,
    limit: int,
    cursor: str | None,
    capture: str | None = None,
) -> Any:
    """The endpoint's answer: a ``{"items", "next"}`` page, or the folded text (``collapsed``).

    Raises:
        NotFound: no such job.
        BadParameter: a cursor this API did not make.
    """
    if collapsed:
        text = folded(store, job_id, rank=rank, start_ns=start_ns, end_ns=end_ns, capture=capture)
        return PlainTextResponse(text)
    items, nxt = list_stacks(
        store,
        job_id,
        rank=rank,
        start_ns=start_ns,
        end_ns=end_ns,
        limit=limit,
        cursor=cursor,
        capture=capture,
    )
    return {"items": items, "next": nxt}
