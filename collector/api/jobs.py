"""Jobs and ranks as the REST API shows them, read from the store.

Job status (docs/design.md §9.2), derived from the ``ranks`` lifecycle events and the
heartbeats (``host_samples.time_ns``; an attach counts as one too):

- ``finished`` — at least one rank attached and every rank that attached has an
  ``exit`` event after its latest attach; or no rank ever attached and the job
  came from a trace import (``jobs.source = 'import'``: traces are of past runs).
- ``running`` — some attached rank has not exited and the job's newest
  heartbeat is at most ``heartbeat_timeout_ns`` old.
- ``unknown`` — anything else: no lifecycle events, or ranks that went silent
  without exiting (killed, crashed, or their node agent or network is down; the
  analyzer tells a hung rank apart as ``unresponsive``).

A rank's status follows the same rule with its own events and heartbeats.
A job exists when any of ``jobs``, ``ranks`` or ``steps`` has a row for it.
"""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any

from argus.collector.api.params import INT64_MAX, BadParameter, RankSet, decode_cursor, encode_cursor
from argus.errors import NotFound
from argus.render import rfc3339
from argus.store import Store

__all__ = [
    "job_exists",
    "job_status",
    "list_jobs",
    "list_ranks",
    "rank_filter",
    "recent_job_status_counts",
    "require_job",
    "require_ranks",
]


def job_status(
    *, attached: int, exited: int, imported: bool, heartbeat_ns: int, now_ns: int, timeout_ns: int
) -> str:
    """The status rule of this module's docstring, for a job or one rank (``attached`` ≤ 1)."""
    if attached > 0 and exited >= attached:
        return "finished"
    if attached == 0 and imported:
        return "finished"
    if attached > exited and now_ns - heartbeat_ns <= timeout_ns:
        return "running"
    return "unknown"


def rank_filter(column: str, ranks: RankSet | None) -> tuple[str, dict[str, Any]]:
    """SQL condition on ``column`` for ``ranks`` (TRUE when None) and its parameters."""
    if ranks is None:
        return "1", {}
    condition = (
        f"arrayExists((lo, hi) -> toUInt64({column}) BETWEEN lo AND hi, "
        "{rank_lo:Array(UInt64)}, {rank_hi:Array(UInt64)})"
    )
    return condition, {"rank_lo": ranks.lows, "rank_hi": ranks.highs}


def job_exists(store: Store, job_id: str) -> bool:
    """True when ``jobs``, ``ranks`` or ``steps`` has a row of ``job_id``."""
    rows = store.query(
        "SELECT count() AS n FROM ("
        " (SELECT 1 FROM jobs WHERE job_id = {job:String} LIMIT 1)"
        " UNION ALL (SELECT 1 FROM ranks WHERE job_id = {job:String} LIMIT 1)"
        " UNION ALL (SELECT 1 FROM steps WHERE job_id = {job:String} LIMIT 1))",
        {"job": job_id},
    )
    return int(rows.column("n")[0].as_py()) > 0


def require_job(store: Store, job_id: str) -> None:
    """Raises NotFound when ``job_id`` has no rows (:func:`unknown_job`)."""
    if not job_exists(store, job_id):
        raise unknown_job(store, job_id)


#: Most stored job ids compared with an unknown one (difflib costs ~0.2 ms per id).
MAX_SUGGESTION_IDS = 1_000


def unknown_job(store: Store, job_id: str) -> NotFound:
    """The NotFound of an unknown ``job_id``, naming up to three stored ids like it (difflib's
    ratio of at least 0.6: a typo, a cut-off date) — the user most often mistyped one of them.

    Only ids whose length allows that ratio (``2 * min / (a + b) >= 0.6``: between 3/7 and 7/3
    of the unknown one's) are read, at most :data:`MAX_SUGGESTION_IDS` of them, the newest jobs'
    first: the answer costs a bounded read and compare, however many jobs the store holds.
    """
    size = len(job_id)
    rows = store.query(
        "SELECT job_id FROM (SELECT job_id, max(time_ns) AS t FROM ranks "
        "WHERE lengthUTF8(job_id) BETWEEN {lo:UInt32} AND {hi:UInt32} GROUP BY job_id) "
        "ORDER BY t DESC LIMIT {n:UInt32}",
        {"lo": (3 * size + 6) // 7, "hi": 7 * size // 3, "n": MAX_SUGGESTION_IDS},
    )
    ids = [str(v) for v in rows.column("job_id").to_pylist()]
    close = difflib.get_close_matches(job_id, ids, n=3)
    return NotFound(
        f"no job {job_id!r}"
        + (f"; the closest: {', '.join(map(repr, close))}" if close else "")
        + "; `argus jobs` lists the jobs"
    )


_JOB_KEYS = """
SELECT job_id, minIf(t, t > 0) AS first_ns FROM (
    SELECT job_id, minIf(start_ns, start_ns > 0) AS t FROM jobs GROUP BY job_id
    UNION ALL SELECT job_id, min(time_ns) AS t FROM ranks GROUP BY job_id
    UNION ALL SELECT job_id, min(start_ns) AS t FROM steps GROUP BY job_id
) WHERE {where}
GROUP BY job_id
HAVING {after:UInt8} = 0 OR first_ns < {after_ns:Int64}
    OR (first_ns = {after_ns:Int64} AND job_id > {after_job:String})
ORDER BY first_ns DESC, job_id
LIMIT {limit:UInt32}
"""

_JOB_ROWS = """
SELECT job_id, max(world_size) AS ws, minIf(start_ns, start_ns > 0) AS first_ns,
       anyIf(command, command != '') AS cmd, anyIf(source, source != '') AS src
FROM jobs WHERE job_id IN {ids:Array(String)} GROUP BY job_id
"""

_RANK_SUMMARY = """
SELECT job_id, countIf(has_attach) AS n_attached, countIf(has_attach AND exited) AS n_exited,
       countIf(has_attach AND exited AND code != 0) AS n_failed, uniqExactIf(r_host, r_host != '') AS hosts,
       max(ws) AS world, minIf(attach_t, has_attach) AS first_attach, max(attach_t) AS last_attach,
       maxIf(exit_t, exited) AS last_exit
FROM (
    SELECT job_id, rank,
           countIf(event = 'attach') > 0 AS has_attach,
           maxIf(time_ns, event = 'attach') AS attach_t,
           maxIf(time_ns, event = 'exit') AS exit_t,
           countIf(event = 'exit') > 0 AND exit_t >= attach_t AS exited,
           argMaxIf(exit_code, time_ns, event = 'exit') AS code,
           argMaxIf(host, time_ns, event = 'attach') AS r_host,
           max(world_size) AS ws
    FROM ranks WHERE job_id IN {ids:Array(String)} GROUP BY job_id, rank
) GROUP BY job_id
"""


def _by_job(store: Store, sql: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {row["job_id"]: row for row in store.query(sql, {"ids": ids}).to_pylist()}


def _summaries(store: Store, ids: list[str], now_ns: int, timeout_ns: int) -> list[dict[str, Any]]:
    jobs = _by_job(store, _JOB_ROWS, ids)
    ranks = _by_job(store, _RANK_SUMMARY, ids)
    beats = _by_job(
        store,
        "SELECT job_id, max(time_ns) AS beat FROM host_samples WHERE job_id IN {ids:Array(String)} "
        "GROUP BY job_id",
        ids,
    )
    open_diagnoses = _by_job(
        store,
        "SELECT job_id, count() AS n FROM diagnoses FINAL "
        "WHERE job_id IN {ids:Array(String)} AND state = 'open' GROUP BY job_id",
        ids,
    )
    analysed = _by_job(store, _ANALYSED, ids)
    out = []
    for job_id in ids:
        job = jobs.get(job_id, {})
        rank = ranks.get(job_id, {})
        attached = int(rank.get("n_attached", 0))
        exited = int(rank.get("n_exited", 0))
        heartbeat = max(int(beats.get(job_id, {}).get("beat", 0)), int(rank.get("last_attach", 0)))
        source = job.get("src") or ""
        status = job_status(
            attached=attached,
            exited=exited,
            imported=source == "import",
            heartbeat_ns=heartbeat,
            now_ns=now_ns,
            timeout_ns=timeout_ns,
        )
        starts = [t for t in (job.get("first_ns"), rank.get("first_attach")) if t]
        out.append(
            {
                "job_id": job_id,
                "status": status,
                "world_size": max(int(job.get("ws", 0)), int(rank.get("world", 0))),
                **_times(
                    start=min(starts) if starts else None,
                    end=int(rank["last_exit"]) if status == "finished" and rank.get("last_exit") else None,
                    last_seen=heartbeat or None,
                ),
                "ranks_attached": attached,
                "ranks_exited": exited,
                "ranks_failed": int(rank.get("n_failed", 0)),
                "hosts": int(rank.get("hosts", 0)),
                "source": source,
                "command": job.get("cmd") or "",
                "open_diagnoses": int(open_diagnoses.get(job_id, {}).get("n", 0)),
                **_loss(analysed.get(job_id, {})),
            }
        )
    return out


#: Per job, its analysed windows' lost-time accounting (argus.analyzer.loss).
_ANALYSED = """
SELECT job_id, count() AS windows, countIf(status = 'failed') AS failed, sum(wall_ns) AS wall,
       sum(steps) AS steps, sum(lost_ns) AS lost, sum(explained_ns) AS explained
FROM analysis_windows FINAL WHERE job_id IN {ids:Array(String)} GROUP BY job_id
"""


def _times(**moments: int | None) -> dict[str, Any]:
    """``{name}_ns`` and its RFC 3339 ``{name}_at`` for each moment (ns since the epoch or None)."""
    out: dict[str, Any] = {}
    for name, ns in moments.items():
        out[f"{name}_ns"] = ns
        out[f"{name}_at"] = rfc3339(ns)
    return out


def _loss(row: dict[str, Any]) -> dict[str, Any]:
    """The job's lost time and the share of it no diagnosis accounts for (0 when nothing was lost)."""
    lost = int(row.get("lost", 0))
    unexplained = max(lost - int(row.get("explained", 0)), 0)
    return {
        "windows_analysed": int(row.get("windows", 0)),
        "windows_failed": int(row.get("failed", 0)),
        "analysed_s": round(int(row.get("wall", 0)) / 1e9, 3),
        "steps_analysed": int(row.get("steps", 0)),
        "lost_s": round(lost / 1e9, 3),
        "unexplained_loss_ratio": round(unexplained / lost, 4) if lost > 0 else 0.0,
    }


def list_jobs(
    store: Store,
    *,
    limit: int,
    cursor: str | None,
    now_ns: int,
    timeout_ns: int,
    job_id: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of jobs, newest first (by first attach), and the next page's cursor.

    With ``job_id``, only that job (an empty list when it does not exist).

    Raises:
        BadParameter: ``cursor`` is not one this function made.
    """
    after_ns, after_job = decode_cursor(cursor, (int, str)) if cursor else (0, "")
    where, params = "1", {}
    if job_id is not None:
        where, params = "job_id = {job:String}", {"job": job_id}
    keys = store.query(
        _JOB_KEYS.replace("{where}", where),
        {
            **params,
            "after": 1 if cursor else 0,
            "after_ns": min(max(after_ns, -(2**63)), INT64_MAX),
            "after_job": after_job,
            "limit": limit + 1,
        },
    ).to_pylist()
    page = keys[:limit]
    items = _summaries(store, [k["job_id"] for k in page], now_ns, timeout_ns)
    nxt = encode_cursor([page[-1]["first_ns"], page[-1]["job_id"]]) if len(keys) > limit else None
    return items, nxt


def recent_job_status_counts(store: Store, *, since_ns: int, now_ns: int, timeout_ns: int) -> Counter[str]:
    """How many jobs with a lifecycle event or heartbeat since ``since_ns`` have each status."""
    rows = store.query(
        "SELECT DISTINCT job_id FROM ("
        " SELECT job_id FROM ranks WHERE time_ns >= {since:Int64}"
        " UNION ALL SELECT job_id FROM host_samples WHERE time_ns >= {since:Int64})",
        {"since": since_ns},
    ).to_pylist()
    ids = [r["job_id"] for r in rows]
    return Counter(j["status"] for j in _summaries(store, ids, now_ns, timeout_ns)) if ids else Counter()


_RANK_KEYS = """
SELECT r FROM (
    SELECT toInt64(rank) AS r FROM ranks WHERE job_id = {job:String}
    UNION ALL SELECT DISTINCT toInt64(rank) AS r FROM steps WHERE job_id = {job:String}
    UNION ALL SELECT DISTINCT toInt64(rank) AS r FROM host_samples WHERE job_id = {job:String} AND rank >= 0
) WHERE r > {after:Int64} AND {ranks}
GROUP BY r ORDER BY r LIMIT {limit:UInt32}
"""

_RANK_ROWS = """
SELECT toInt64(rank) AS r,
       countIf(event = 'attach') > 0 AS has_attach,
       maxIf(time_ns, event = 'attach') AS attach_t,
       countIf(event = 'exit') > 0 AND maxIf(time_ns, event = 'exit') >= attach_t AS exited,
       maxIf(time_ns, event = 'exit') AS exit_t,
       argMaxIf(exit_code, time_ns, event = 'exit') AS code,
       argMaxIf(host, time_ns, event = 'attach') AS r_host,
       argMaxIf(pid, time_ns, event = 'attach') AS r_pid,
       argMaxIf(local_rank, time_ns, event = 'attach') AS r_local,
       argMaxIf(device, time_ns, event = 'attach') AS r_device,
       argMaxIf(clock_offset_ns, time_ns, event IN ('attach', 'clock')) AS r_offset,
       max(world_size) AS ws
FROM ranks WHERE job_id = {job:String} AND toInt64(rank) IN {ids:Array(Int64)} GROUP BY r
"""


def list_ranks(
    store: Store,
    job_id: str,
    *,
    ranks: RankSet | None,
    limit: int,
    cursor: str | None,
    now_ns: int,
    timeout_ns: int,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of a job's ranks in rank order, and the next page's cursor.

    Raises:
        NotFound: no such job.
        BadParameter: ``cursor`` is not one this function made.
    """
    require_job(store, job_id)
    (after,) = decode_cursor(cursor, (int,)) if cursor else (-1,)
    condition, params = rank_filter("r", ranks)
    keys = store.query(
        _RANK_KEYS.replace("{ranks}", condition),
        {**params, "job": job_id, "after": max(-1, min(after, INT64_MAX)), "limit": limit + 1},
    ).to_pylist()
    page = [int(k["r"]) for k in keys[:limit]]
    if not page:
        return [], None
    rows = {r["r"]: r for r in store.query(_RANK_ROWS, {"job": job_id, "ids": page}).to_pylist()}
    beats = {
        r["r"]: r
        for r in store.query(
            "SELECT toInt64(rank) AS r, max(time_ns) AS beat, any(host) AS h FROM host_samples "
            "WHERE job_id = {job:String} AND toInt64(rank) IN {ids:Array(Int64)} GROUP BY r",
            {"job": job_id, "ids": page},
        ).to_pylist()
    }
    groups: dict[int, list[dict[str, Any]]] = {}
    for g in store.query(
        "SELECT DISTINCT toInt64(rank) AS r, group_name AS name, group_backend AS backend, "
        "toInt64(length(group_ranks)) AS size FROM ranks WHERE job_id = {job:String} AND event = 'group' "
        "AND toInt64(rank) IN {ids:Array(Int64)} ORDER BY r, name",
        {"job": job_id, "ids": page},
    ).to_pylist():
        groups.setdefault(g.pop("r"), []).append(g)
    imported = bool(
        store.query(
            "SELECT count() AS n FROM jobs WHERE job_id = {job:String} AND source = 'import'", {"job": job_id}
        )
        .column("n")[0]
        .as_py()
    )
    items = [
        {
            **_rank_item(rank, rows.get(rank), beats.get(rank), imported, now_ns, timeout_ns),
            "groups": groups.get(rank, []),
        }
        for rank in page
    ]
    return items, encode_cursor([page[-1]]) if len(keys) > limit else None


#: Values for a rank seen only in timings or heartbeats (no lifecycle event).
_EMPTY_RANK: dict[str, Any] = {
    "has_attach": False,
    "attach_t": 0,
    "exited": False,
    "exit_t": 0,
    "code": 0,
    "r_host": "",
    "r_pid": 0,
    "r_local": -1,
    "r_device": "",
    "r_offset": 0,
    "ws": 0,
}


def _rank_item(
    rank: int,
    row: dict[str, Any] | None,
    beat: dict[str, Any] | None,
    imported: bool,
    now_ns: int,
    timeout_ns: int,
) -> dict[str, Any]:
    r = row if row is not None else _EMPTY_RANK
    attached = bool(r["has_attach"])
    exited = attached and bool(r["exited"])
    heartbeat = max(int(beat["beat"]) if beat else 0, int(r["attach_t"]))
    return {
        "rank": rank,
        "status": job_status(
            attached=int(attached),
            exited=int(exited),
            imported=imported,
            heartbeat_ns=heartbeat,
            now_ns=now_ns,
            timeout_ns=timeout_ns,
        ),
        "host": r["r_host"] or (beat["h"] if beat else ""),
        "pid": int(r["r_pid"]),
        "local_rank": int(r["r_local"]),
        "device": r["r_device"],
        "world_size": int(r["ws"]),
        "clock_offset_ns": int(r["r_offset"]),
        **_times(attach=int(r["attach_t"]) if attached else None, exit=int(r["exit_t"]) if exited else None),
        "exit_code": int(r["code"]) if exited else None,
        **_times(last_seen=heartbeat or None),
    }


_WORLD = """
SELECT max(n) AS n FROM (
    SELECT toInt64(max(world_size)) AS n FROM jobs WHERE job_id = {job:String}
    UNION ALL SELECT if(count() = 0, 0, greatest(toInt64(max(world_size)), toInt64(max(rank)) + 1)) AS n
        FROM ranks WHERE job_id = {job:String}
    UNION ALL SELECT if(count() = 0, 0, toInt64(max(rank)) + 1) AS n FROM steps WHERE job_id = {job:String}
)
"""


def require_ranks(store: Store, job_id: str, ranks: RankSet | None, name: str = "ranks") -> None:
    """Raises BadParameter naming the ranks of ``ranks`` that ``job_id`` does not have.

    A job's ranks are ``0 .. world size − 1``: the largest world size any rank or node reported, or
    one past the largest rank stored when none did. Ranks of the world that have not attached yet
    are the job's. A job with no rank known yet accepts any selection.

    Raises:
        NotFound: no such job.
        BadParameter: some selected ranks are ``>=`` the world size.
    """
    require_job(store, job_id)
    if ranks is None:
        return
    rows = store.query(_WORLD, {"job": job_id}).to_pylist()
    world = int(rows[0]["n"] or 0) if rows else 0
    beyond = [(max(lo, world), hi) for lo, hi in ranks.ranges if hi >= world]
    if world <= 0 or not beyond:
        return
    named = ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in beyond)
    raise BadParameter(
        name, f"job {job_id!r} has no rank(s) {named}: its world size is {world} (ranks 0-{world - 1})"
    )
