"""A job's diagnoses for the REST API: one page of :func:`argus.diagnosis.read_diagnoses`.

Each item is exactly :meth:`argus.diagnosis.Diagnosis.to_dict` (docs/design.md §7), its ``summary``
written here, when read (:func:`argus.summary.summary`, with the host and pid of the rank it names).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from argus.collector.api.jobs import require_job
from argus.collector.api.params import INT64_MAX, decode_cursor, encode_cursor
from argus.diagnosis import read_diagnoses
from argus.store import Store
from argus.summary import Identity, summary

__all__ = ["list_diagnoses"]


def _identity(store: Store, job_id: str, ranks: list[int]) -> Identity:
    """Host and pid of each of ``ranks`` of ``job_id`` (its newest attach), for the summaries."""
    if not ranks:
        return {}
    rows = store.query(
        "SELECT toInt64(rank) AS r, argMaxIf(host, time_ns, event = 'attach') AS h, "
        "argMaxIf(pid, time_ns, event = 'attach') AS p FROM ranks WHERE job_id = {job:String} "
        "AND toInt64(rank) IN {ids:Array(Int64)} GROUP BY r HAVING countIf(event = 'attach') > 0",
        {"job": job_id, "ids": sorted(set(ranks))},
    ).to_pylist()
    return {int(r["r"]): (str(r["h"]), int(r["p"])) for r in rows}


def list_diagnoses(
    store: Store,
    job_id: str,
    *,
    state: str | None,
    cause: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``job_id``'s diagnoses, newest first (by first window), and the next cursor.

    Raises:
        NotFound: no such job.
        BadParameter: ``cursor`` is not one this function made.
    """
    require_job(store, job_id)
    after = None
    if cursor:
        after_ns, after_id = decode_cursor(cursor, (int, str))
        after = (max(-(2**63), min(after_ns, INT64_MAX)), after_id)
    found = read_diagnoses(
        store, job_id, state=state, cause=cause, newest_first=True, after=after, limit=limit + 1
    )
    page = found[:limit]
    identity = _identity(store, job_id, [d.rank for d in page if d.rank is not None])
    items = [replace(d, summary=summary(d, identity)).to_dict() for d in page]
    nxt = encode_cursor([items[-1]["first_window_ns"], items[-1]["id"]]) if len(found) > limit else None
    return items, nxt
