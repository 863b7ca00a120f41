"""A job's diagnoses for the REST API: one page of :func:`argus.diagnosis.read_diagnoses`.

Each item is exactly :meth:`argus.diagnosis.Diagnosis.to_dict` (DESIGN §5).
"""

from __future__ import annotations

from typing import Any

from argus.collector.api.jobs import require_job
from argus.collector.api.params import INT64_MAX, decode_cursor, encode_cursor
from argus.diagnosis import read_diagnoses
from argus.store import Store

__all__ = ["list_diagnoses"]


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
    items = [d.to_dict() for d in found[:limit]]
    nxt = encode_cursor([items[-1]["first_window_ns"], items[-1]["id"]]) if len(found) > limit else None
    return items, nxt
