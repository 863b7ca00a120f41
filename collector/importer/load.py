"""Import of PyTorch profiler (Kineto) traces into the tables live capture fills (docs/design.md §8.3).

One trace file per rank, plain or gzipped Chrome-trace JSON. Each file is
parsed whole, streaming (:mod:`argus.collector.importer.kineto`), into Arrow tables
(:mod:`argus.collector.importer.tables`) before anything is written; then the
tables of every file are inserted, ``ranks`` and ``jobs`` last. A file that
cannot be parsed writes nothing; a failed insert is rolled back (``ALTER TABLE
... DELETE`` of the import's ranks, synchronously), so the same import can be
run again. (No deduplication tokens: ClickHouse would remember a token after the
rollback deleted its rows and drop the retry.)

Memory: a trace is held as the numpy columns :mod:`argus.collector.importer.kineto`
keeps, the small tables (steps, collectives, KDE summaries, ranks) are built
before the first insert, and the raw kernel events are turned into Arrow in
slices of :data:`_INSERT_ROWS` rows as they are inserted.

Ranks: ``distributedInfo.rank`` of each file; a file without one takes the
``rank`` argument (``--rank``). Two files claiming the same rank of one job are
refused, and so is a rank already stored for the job (a second import of the
same trace included).

Default job id: ``import-`` followed by 12 hex digits of the BLAKE2b hash of the
sorted BLAKE2b-128 digests of the files' bytes as stored. Importing the same
files again yields the same id (and is refused as a duplicate); the ranks of one
job imported by separate commands need an explicit ``--job-id``.

Upload (``argus import --server URL``): ``POST {URL}/api/v1/jobs/{job_id}/traces``,
``multipart/form-data`` with one part named ``file`` per trace (the part's file
name is used in messages) and an optional query parameter ``rank``; the server
calls :func:`import_traces` with the uploaded file objects and answers with the
:class:`ImportResult` as JSON (``job_id``, ``ranks``, ``rows``), or 422 with the
:class:`TraceError` message as ``detail``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from argus.collector.importer.kineto import ParsedTrace, file_digest, parse_trace, trace_name
from argus.collector.importer.tables import (
    RankTrace,
    collectives_table,
    jobs_table,
    kernel_events_table,
    kernel_summaries_table,
    ranks_table,
    steps_table,
)
from argus.config import DEFAULT_WINDOW
from argus.errors import StoreError, TraceError
from argus.jobid import check_job_id
from argus.limits import ByteBudget, check_declared
from argus.store import Store, open_store
from argus.window_grid import WindowGrid

__all__ = ["ImportResult", "default_job_id", "import_parsed", "import_traces", "main"]

log = logging.getLogger(__name__)

#: Rows per insert of the raw kernel events: bounds the memory of one insert (Arrow slice
#: and chDB's copy of it) whatever the size of the trace.
_INSERT_ROWS = 65_536
#: Tables keyed by rank, in insert order; ``jobs`` follows them.
_RANK_TABLES = ("steps", "collectives", "kernel_events", "kernel_summaries", "ranks")
# One import at a time per process: the duplicate-rank check and the inserts must not interleave.
_IMPORT_LOCK = threading.Lock()


@dataclass(frozen=True)
class ImportResult:
    """What one import wrote: the job, its ranks, and rows per table."""

    job_id: str
    ranks: list[int]
    rows: dict[str, int] = field(default_factory=dict)


def default_job_id(digests: Sequence[str]) -> str:
    """The job id of an import without ``--job-id``: see the module docstring.

    Args:
        digests: BLAKE2b-128 hex digests of the files (:func:`kineto.file_digest`), any order.
    """
    joined = "\n".join(sorted(digests)).encode()
    return "import-" + hashlib.blake2b(joined, digest_size=6).hexdigest()


def _assign_ranks(traces: list[ParsedTrace], rank: int | None) -> list[int]:
    ranks: list[int] = []
    owner: dict[int, str] = {}
    for t in traces:
        if t.rank is None:
            if rank is None:
                raise TraceError(
                    f"{t.name}: the trace names no rank (no distributedInfo.rank); give it with "
                    "--rank R (the `rank` parameter of an upload), one such file per import"
                )
            r = rank
        else:
            r = t.rank
            if rank is not None and rank != r:
                raise TraceError(f"{t.name}: --rank {rank} contradicts distributedInfo.rank {r} of the trace")
        try:
            check_declared("rank", r, "max_rank")
        except ValueError as exc:
            raise TraceError(f"{t.name}: {exc}") from exc
        if r in owner:
            raise TraceError(f"{t.name}: claims rank {r}, as does {owner[r]}: one file per rank")
        owner[r] = t.name
        ranks.append(r)
    return ranks


def _check_job_id(job_id: str | None) -> None:
    if job_id is not None:
        try:
            check_job_id(job_id)
        except ValueError as exc:
            raise TraceError(f"--job-id: {exc}") from exc


def _stored_ranks(store: Store, job_id: str) -> set[int]:
    table = store.query("SELECT DISTINCT rank FROM ranks WHERE job_id = {job_id:String}", {"job_id": job_id})
    return {int(r) for r in table.column(0).to_numpy()}


def _build(rt: RankTrace, grid: WindowGrid) -> dict[str, list[pa.Table]]:
    """The small tables of one rank (everything but the raw kernel events), built before any insert."""
    return {
        "steps": [steps_table(rt)],
        "collectives": [collectives_table(rt)],
        "kernel_summaries": [kernel_summaries_table(rt, grid)],
        "ranks": [ranks_table(rt)],
    }


def _tables(name: str, rt: RankTrace, built: dict[str, list[pa.Table]]) -> Iterator[pa.Table]:
    """One rank's tables for ``name``; the raw kernel events in slices built as they are inserted."""
    if name != "kernel_events":
        yield from built[name]
        return
    for start in range(0, rt.trace.start_ns.size, _INSERT_ROWS):
        yield kernel_events_table(rt, slice(start, start + _INSERT_ROWS))


def _release_memory(store: Store) -> None:
    """Have an embedded store hand the memory its allocator keeps after an insert back to the OS.

    chDB's jemalloc holds freed pages for seconds; over the many inserts of a big
    trace that roughly doubles what the inserts add to the process's peak RSS.
    """
    if store.embedded:
        try:
            store.command("SYSTEM JEMALLOC PURGE")
        except StoreError as exc:  # a chDB built without jemalloc: nothing to release
            log.debug("SYSTEM JEMALLOC PURGE: %s", exc)


def _rollback(store: Store, job_id: str, ranks: list[int]) -> None:
    for table in _RANK_TABLES:
        try:
            store.command(
                f"ALTER TABLE {table} DELETE WHERE job_id = {{job_id:String}} "
                "AND rank IN {ranks:Array(UInt32)} SETTINGS mutations_sync = 1",
                {"job_id": job_id, "ranks": ranks},
            )
        except StoreError as exc:  # pragma: no cover - the store failed twice
            log.error("rollback of %s for job %s ranks %s failed: %s", table, job_id, ranks, exc)


def import_traces(
    store: Store,
    sources: Sequence[Path | BinaryIO],
    *,
    job_id: str | None = None,
    rank: int | None = None,
    window: WindowGrid = DEFAULT_WINDOW,
    names: Sequence[str] | None = None,
    max_text_bytes: int | None = None,
    budget: ByteBudget | None = None,
) -> ImportResult:
    """Import Kineto traces (one per rank, plain or gzipped JSON) into ``store``.

    Args:
        store: Where the rows go (its schema must exist: :func:`open_store` creates it).
        sources: Paths or binary file objects, one per rank; each is read once, streaming.
        job_id: The job the ranks belong to; default :func:`default_job_id` of the files.
        rank: The rank of a file without ``distributedInfo.rank``.
        window: Kernel summary window (the analyzer's: :class:`~argus.window_grid.WindowGrid`).
        names: Names of ``sources`` in messages (default: the path or the object's ``name``).
        max_text_bytes: Cap on the JSON text of all ``sources`` together, bytes after
            gunzip; None: no cap.
        budget: What parsing ``sources`` may use (an upload's: text shared with the uploads
            parsed at once, CPU seconds; :class:`argus.limits.ByteBudget`); replaces ``max_text_bytes``.

    Returns:
        The job id, the ranks imported in the order of ``sources``, rows written per table.

    Raises:
        TraceError: a file cannot be imported (the message names the file and
            position), names no rank, or claims a rank another file of the import
            or the stored job already has, a declared size past :data:`argus.limits.LIMITS`,
            or a ``job_id`` against :mod:`argus.jobid`'s rule; nothing is written.
        TooLarge: the text is past ``max_text_bytes`` or ``budget``; nothing is written.
        StoreError: an insert failed; what the import had written is deleted again.
        ValueError: ``names`` does not match ``sources``.
    """
    if names is not None and len(names) != len(sources):
        raise ValueError("names must name every source")
    if not sources:
        raise TraceError("no trace files to import")
    _check_job_id(job_id)
    if budget is None and max_text_bytes is not None:
        budget = ByteBudget(max_text_bytes, "the upload")
    traces = [
        parse_trace(src, name=names[i] if names is not None else trace_name(src), budget=budget)
        for i, src in enumerate(sources)
    ]
    return import_parsed(store, traces, job_id=job_id, rank=rank, window=window)


def import_parsed(
    store: Store,
    traces: Sequence[ParsedTrace],
    *,
    job_id: str | None = None,
    rank: int | None = None,
    window: WindowGrid = DEFAULT_WINDOW,
) -> ImportResult:
    """The second half of :func:`import_traces`: store traces already parsed (or generated).

    Same arguments, results and errors as :func:`import_traces`, with
    :class:`~argus.collector.importer.kineto.ParsedTrace` columns instead of files.
    """
    if not traces:
        raise TraceError("no trace files to import")
    _check_job_id(job_id)
    ranks = _assign_ranks(list(traces), rank)
    job = job_id or default_job_id([t.digest for t in traces])
    world = max([r + 1 for r in ranks] + [t.world_size or 0 for t in traces])
    rank_traces = [RankTrace(t, job, r, world) for t, r in zip(traces, ranks, strict=True)]
    tables = [_build(rt, window) for rt in rank_traces]
    rows = {name: sum(t.num_rows for built in tables for t in built[name]) for name in tables[0]}
    rows["kernel_events"] = sum(rt.trace.start_ns.size for rt in rank_traces)
    jobs = jobs_table(job, rank_traces)
    with _IMPORT_LOCK:
        taken = sorted(set(ranks) & _stored_ranks(store, job))
        if taken:
            raise TraceError(
                f"job {job} already has rank(s) {taken}: two traces cannot claim one rank "
                "(import into another --job-id, or this trace was imported before)"
            )
        try:
            for name in _RANK_TABLES:
                for rt, built in zip(rank_traces, tables, strict=True):
                    for part in _tables(name, rt, built):
                        if part.num_rows:
                            store.insert(name, part)
                            if name == "kernel_events":
                                _release_memory(store)
            store.insert("jobs", jobs)
        except StoreError:
            _rollback(store, job, ranks)
            raise
    rows["jobs"] = 1
    log.info("imported job %s ranks %s: %s", job, ranks, rows)
    return ImportResult(job_id=job, ranks=ranks, rows=rows)


def _upload(args: argparse.Namespace, paths: list[Path]) -> dict[str, Any]:
    from argus.client import ArgusClient

    job = args.job_id or default_job_id([file_digest(p) for p in paths])
    # Big traces take a while to import server-side: a long read timeout.
    with ArgusClient(args.server, token=args.token, tls_cert=args.tls_cert, timeout_s=600.0) as client:
        return client.upload_traces(job, paths, rank=args.rank)


def main(args: argparse.Namespace) -> int:
    """`argus import`: to ``--store`` directly, else uploaded to ``--server`` (default server URL)."""
    paths = [Path(p) for p in args.paths]
    if args.store:
        window = WindowGrid.from_seconds(args.window_s)
        store = open_store(args.store)
        try:
            result = import_traces(store, paths, job_id=args.job_id, rank=args.rank, window=window)
        finally:
            store.close()
        body: dict[str, Any] = {"job_id": result.job_id, "ranks": result.ranks, "rows": result.rows}
    else:
        body = _upload(args, paths)
    rows = ", ".join(f"{k}={v}" for k, v in sorted(body.get("rows", {}).items()))
    print(f"imported job {body.get('job_id')} ranks {body.get('ranks')}: {rows}", file=sys.stdout)
    return 0
