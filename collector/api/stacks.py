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

from dataclasses import dataclass
from typing import Any

from fastapi.responses import PlainTextResponse

from argus.collector.api.jobs import require_job
from argus.collector.api.params import INT64_MAX, decode_cursor, encode_cursor
from argus.store import Store, given_conditions

__all__ = ["MAX_FOLDED_STACKS", "StackQuery", "folded", "list_stacks", "stacks_answer"]

#: Most lines of a folded answer (distinct stacks), those with the most samples.
MAX_FOLDED_STACKS = 100_000

_COLUMNS = "rank, pid, capture_id, time_ns, duration_ns, sampler, thread, frames, count, idle, gil"
_ORDER = "time_ns, capture_id, rank, thread, frames, idle, gil"


@dataclass(frozen=True)
class StackQuery:
    """Which stack rows of a job a request asks for (None: any).

    Attributes:
        job_id: The job.
        rank: Only this rank's rows.
        start_ns: Only captures that end at or after this time, ns since the epoch.
        end_ns: Only captures that begin at or before this time, ns since the epoch.
        capture: Only this capture's rows (a ``capture_id``).
    """

    job_id: str
    rank: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    capture: str | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        """The SQL condition on the ``stacks`` table and its parameters."""
        where, params = given_conditions(
            {
                "job_id = {job:String}": self.job_id,
                "rank = {rank:UInt32}": self.rank,
                "capture_id = {capture:String}": self.capture,
                "time_ns + duration_ns >= {lo:Int64}": self.start_ns,
                "time_ns <= {hi:Int64}": self.end_ns,
            }
        )
        return " AND ".join(where), params


def list_stacks(
    store: Store, query: StackQuery, *, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page (at most ``limit`` rows) of the stack rows ``query`` asks for, and the next cursor.

    Raises:
        NotFound: no such job.
        BadParameter: ``cursor`` is not one this function made.
    """
    require_job(store, query.job_id)
    where, params = query.where()
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
        {**params, "limit": limit + 1},
    ).to_pylist()
    items = [{**r, "idle": bool(r["idle"]), "gil": bool(r["gil"])} for r in rows[:limit]]
    if len(rows) <= limit:
        return items, None
    last = items[-1]
    key = [last["time_ns"], last["capture_id"], last["rank"], last["thread"], last["frames"]]
    return items, encode_cursor([*key, int(last["idle"]), int(last["gil"])])


def folded(store: Store, query: StackQuery) -> str:
    """The folded-stacks text of the rows ``query`` asks for (module docstring); empty when none.

    Raises:
        NotFound: no such job.
    """
    require_job(store, query.job_id)
    where, params = query.where()
    rows = store.query(
        f"SELECT thread, frames, n FROM (SELECT thread, frames, sum(count) AS n FROM stacks WHERE {where} "
        "GROUP BY thread, frames ORDER BY n DESC, thread, frames LIMIT {most:UInt32}) "
        "ORDER BY thread, frames",
        {**params, "most": MAX_FOLDED_STACKS},
    ).to_pylist()
    return "".join(
        f"{r['thread']};{r['frames']} {r['n']}\n" if r["frames"] else f"{r['thread']} {r['n']}\n"
        for r in rows
    )


def stacks_answer(store: Store, query: StackQuery, *, collapsed: bool, limit: int, cursor: str | None) -> Any:
    """The endpoint's answer: a ``{"items", "next"}`` page, or the folded text (``collapsed``).

    Raises:
        NotFound: no such job.
        BadParameter: a cursor this API did not make.
    """
    if collapsed:
        return PlainTextResponse(folded(store, query))
    items, nxt = list_stacks(store, query, limit=limit, cursor=cursor)
    return {"items": items, "next": nxt}
