"""A job's diagnoses, read from the ``diagnoses`` table with FINAL (newest row per id).

Each item is exactly :meth:`argus.diagnosis.Diagnosis.to_dict` (DESIGN §5), its ``summary``
written here, when read (:func:`argus.summary.summary`, with the host and pid of the rank it names).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from argus.collector.api_jobs import require_job
from argus.collector.api_params import INT64_MAX, decode_cursor, encode_cursor
from argus.collector.store import Store
from argus.diagnosis import Diagnosis
from argus.errors import StoreError
from argus.summary import Identity, summary

__all__ = ["finite", "list_diagnoses"]

_SQL = """
SELECT id, job_id, rank, ranks, process_group, cause, phase, kernel, score, slowdown_pct,
       first_window_ns, last_window_ns, state, evidence
FROM diagnoses FINAL
WHERE job_id = {job:String}
  AND ({state:String} = '' OR state = {state:String})
  AND ({cause:String} = '' OR cause = {cause:String})
  AND ({after:UInt8} = 0 OR first_window_ns < {after_ns:Int64}
       OR (first_window_ns = {after_ns:Int64} AND id > {after_id:String}))
ORDER BY first_window_ns DESC, id
LIMIT {limit:UInt32}
"""


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None: JSON has none."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


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


def _diagnosis(row: dict[str, Any], identity: Identity | None = None) -> dict[str, Any]:
    row["group"] = row.pop("process_group")
    try:
        evidence = json.loads(row["evidence"]) if row["evidence"] else {}
    except ValueError:
        evidence = {"unparsed": row["evidence"]}
    row["evidence"] = finite(evidence) if isinstance(evidence, dict) else {"value": finite(evidence)}
    for key in ("score", "slowdown_pct"):
        # The contract says float; a non-finite value (an analyzer bug) must not break the list.
        if not math.isfinite(row[key]):
            row[key] = 0.0 if math.isnan(row[key]) else math.copysign(1.7976931348623157e308, row[key])
    try:
        d = Diagnosis.from_dict(row)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"diagnosis {row.get('id')!r} in the store is malformed: {exc}") from exc
    return replace(d, summary=summary(d, identity)).to_dict()


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
    after_ns, after_id = decode_cursor(cursor, (int, str)) if cursor else (0, "")
    rows = store.query(
        _SQL,
        {
            "job": job_id,
            "state": state or "",
            "cause": cause or "",
            "after": 1 if cursor else 0,
            "after_ns": max(-(2**63), min(after_ns, INT64_MAX)),
            "after_id": after_id,
            "limit": limit + 1,
        },
    ).to_pylist()
    identity = _identity(store, job_id, [r["rank"] for r in rows[:limit] if r["rank"] is not None])
    items = [_diagnosis(row, identity) for row in rows[:limit]]
    nxt = encode_cursor([items[-1]["first_window_ns"], items[-1]["id"]]) if len(rows) > limit else None
    return items, nxt
