"""The collector's record of batches (``ingest_batches``) and the settling of its group inserts.

docs/design.md §3. A group's batches are recorded *before* their rows are inserted: each record
row names the ``insert_deduplication_token`` of the one data insert that will hold the batch's rows
(``token``) and says it is not yet known to be in (``landed`` 0). Whether that insert landed is
then known in one of three ways:

- this collector made it and it returned: remembered (:class:`Groups`), and written down in the
  next group's record insert (its first row's ``settled``: ``'1:token'``), so the normal path
  makes no insert of its own for it;
- such a settlement is found (:func:`settled`);
- neither (the collector died between the record and the next group's, or its insert failed): the
  token is *settled* (:func:`settle`) by inserting a marker row into the token's table under the
  same token. ClickHouse keeps only the first block inserted under a token (within the table's
  deduplication window, :data:`argus.schema.DEDUP_WINDOW` inserts): the marker is stored exactly
  when the group's insert never landed. A marker found means "never landed" (``'0:token'``),
  written with the record insert of the batches then stored again, and only after that is the
  marker deleted: a collector dying anywhere in between leaves a state the next settling reads
  the same way (the marker is still there, or the settlement is).

Records written by older collectors (after the rows: ``token`` '' and ``landed`` 1) are stored
batches, as they always were.

A group recorded by another collector may still be inserting: its token is settled only
:data:`SETTLE_AFTER_S` after its record (an insert runs at most the store's timeout), or at once on
an embedded store, which one process owns. Until then its batches are answered "retry later".

Every insert under a token is one Arrow record batch (:func:`argus.collector.ingest.with_job_id`):
ClickHouse derives a block's deduplication id from the token and the chunks it was read from, so a
one-row marker matches only an insert of one chunk (measured on chDB 4.4). Not covered: a
``--cluster`` store, whose ``Distributed`` tables send the marker to its own job's shard, not the
group's; there a marker says "never landed" and the batches may be stored twice, as before.
A token older than the table's deduplication window (100,000 inserts) reads as "never landed" too.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from argus.config import DEFAULT_STORE_TIMEOUT_S
from argus.errors import StoreError
from argus.schema import wire_schema
from argus.store import Store

__all__ = [
    "MAX_GROUPS",
    "RECORD_ATTEMPTS",
    "SETTLE_AFTER_S",
    "Entry",
    "Groups",
    "Record",
    "delete_markers",
    "lookup",
    "marker_job_id",
    "settle",
    "settled",
    "write",
    "write_settlements",
]

#: A token recorded by another collector is settled no sooner than this after its record, s (module
#: doc): twice the store's default timeout, past which none of that collector's inserts still runs.
SETTLE_AFTER_S = 2 * DEFAULT_STORE_TIMEOUT_S
#: Tries of a group's ``ingest_batches`` insert before its batches go unacknowledged.
RECORD_ATTEMPTS = 3
log = logging.getLogger(__name__)

#: Most tokens :class:`Groups` remembers (about 100 bytes each).
MAX_GROUPS = 100_000

Key = tuple[str, int, int]


@dataclass(frozen=True)
class Record:
    """One ``ingest_batches`` row of a batch: ``part`` of ``(agent_id, seq)``, its rows, the token of
    the insert holding them ('' for an older collector's record), ``landed`` (True: recorded after
    its rows were in), its table, when it was stored (s since the epoch) and its age (s, both by the
    store's clock)."""

    part: int
    rows: int
    token: str
    landed: bool
    table: str
    stored_s: int
    age_s: int


@dataclass(frozen=True)
class Entry:
    """A batch to record: its key ``(agent_id, seq, part)``, table, rows, job and insert token."""

    key: Key
    table: str
    rows: int
    job_id: str
    token: str


class Groups:
    """What this collector knows of the inserts it made or settled: token → landed (True), never landed
    (False) or failed (None: unknown, settled when its batches come back); the
    settlements not yet written (``'1:token'``/``'0:token'``, written with the next record insert;
    module doc) and the markers to delete once they are.

    At most :data:`MAX_GROUPS` tokens are kept, the oldest forgotten first. Not thread-safe: the
    collector's writer thread owns one.
    """

    def __init__(self, most: int = MAX_GROUPS) -> None:
        self.most = most
        self._mine: dict[str, bool | None] = {}
        #: Settlements to write with the next record insert.
        self.unwritten: list[str] = []
        #: ``(table, marker job id)`` of markers to delete once :attr:`unwritten` is written.
        self.markers: list[tuple[str, str]] = []

    def landed(self, token: str) -> bool | None:
        """Whether the insert under ``token`` landed, as far as this collector knows (None: not known)."""
        return self._mine.get(token)

    def mine(self, token: str) -> bool:
        """Whether this collector made the insert under ``token`` (it returned, landed or not)."""
        return token in self._mine

    def inserted(self, token: str) -> None:
        """The insert under ``token`` landed; its settlement is to be written."""
        self._remember(token, True)
        self.unwritten.append(f"1:{token}")

    def failed(self, token: str) -> None:
        """The insert under ``token`` failed: whether anything of it is in is settled when its
        batches come back (:func:`settle`), at once since nothing of this collector still runs it."""
        self._remember(token, None)

    def settled_by_marker(self, token: str, table: str, landed: bool) -> None:
        """:func:`settle` found out about ``token`` (of ``table``): write it down, then delete the marker."""
        self._remember(token, landed)
        self.unwritten.append(f"{int(landed)}:{token}")
        if not landed:
            self.markers.append((table, marker_job_id(token)))

    def _remember(self, token: str, state: bool | None) -> None:
        self._mine.pop(token, None)
        self._mine[token] = state
        while len(self._mine) > self.most:
            del self._mine[next(iter(self._mine))]


def lookup(store: Store, keys: Sequence[Key]) -> dict[tuple[str, int], list[Record]]:
    """Every ``ingest_batches`` record of the batches ``(agent_id, seq)`` of ``keys``, any part (one
    query), and no other. The query reads every asked agent's records under every asked seq (agents
    flush in step, so their seqs are alike); the others are dropped before they become Python
    objects. Picking the pairs in the query cost more: a 500-pair tuple set took 11.9 against 6.6 ms
    of CPU a lookup (12-07); dropping them here costs nothing measurable (3.7 against 3.8 ms).

    Raises:
        StoreError: the lookup failed.
    """
    if not keys:
        return {}
    found = store.query(
        "SELECT agent_id, seq, part, rows, token, landed, table_name, "
        "toInt64(toUnixTimestamp(stored_at)) AS stored_s, "
        "toInt64(dateDiff('second', stored_at, now())) AS age_s FROM ingest_batches "
        "WHERE agent_id IN {agents:Array(String)} AND seq IN {seqs:Array(UInt64)}",
        {"agents": sorted({k[0] for k in keys}), "seqs": sorted({k[1] for k in keys})},
    )
    asked = {k[:2] for k in keys}
    names = ("agent_id", "seq", "part", "rows", "token", "landed", "table_name", "stored_s", "age_s")
    out: dict[tuple[str, int], list[Record]] = {}
    for a, s, p, n, token, landed, table, stored, age in zip(
        *(found.column(c).to_pylist() for c in names), strict=True
    ):
        if (a, s) in asked:
            out.setdefault((a, s), []).append(Record(p, n, token, bool(landed), table, stored, age))
    return out


def settled(store: Store, tokens: Sequence[str], since_s: int) -> dict[str, bool]:
    """The settlements written for ``tokens``, recorded at ``since_s`` (s since the epoch) or later:
    token → landed (one query, reading only records stored since; absent: not settled).

    Raises:
        StoreError: the lookup failed.
    """
    if not tokens:
        return {}
    wanted = sorted({f"{landed}:{t}" for t in tokens for landed in (0, 1)})
    found = store.query(
        "SELECT DISTINCT s FROM ingest_batches ARRAY JOIN settled AS s "
        "WHERE stored_at >= toDateTime({since:Int64}) AND hasAny(settled, {wanted:Array(String)}) "
        "AND s IN {wanted:Array(String)}",
        {"since": since_s, "wanted": wanted},
    )
    out: dict[str, bool] = {}
    for entry in found.column("s").to_pylist():
        landed, token = str(entry).split(":", 1)
        out[token] = out.get(token, False) or landed == "1"
    return out


def marker_job_id(token: str) -> str:
    """The ``job_id`` of the marker row that settles ``token``: one no job can have (it holds '/',
    docs/design.md §8.2), one per token."""
    return f"argus/settle/{hashlib.sha256(token.encode()).hexdigest()[:32]}"


def _marker(table: str, job_id: str) -> pa.Table:
    """One row of ``table``'s wire schema, every value zero or empty, with ``job_id``."""
    schema = wire_schema(table)
    arrays = [pa.array([_zero(field.type)], field.type) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema).append_column(
        "job_id", pa.array([job_id], pa.string())
    )


def _zero(kind: pa.DataType) -> object:
    if pa.types.is_string(kind):
        return ""
    if pa.types.is_list(kind):
        return []
    if pa.types.is_floating(kind):
        return 0.0
    return 0


def settle(store: Store, token: str, table: str) -> bool:
    """Whether the insert under ``token`` into ``table`` landed, found out with a marker row (module
    doc): an insert and a query. The caller writes the answer down (:meth:`Groups.settled_by_marker`)
    and only then deletes the marker (:func:`delete_markers`).

    Raises:
        StoreError: a step failed; nothing is settled (the next try reads the same answer).
    """
    marker = marker_job_id(token)
    store.insert(table, _marker(table, marker), dedup_token=token)
    found = store.query(f"SELECT count() AS n FROM {table} WHERE job_id = {{job:String}}", {"job": marker})
    return int(found.column("n")[0].as_py()) == 0


def delete_markers(store: Store, groups: Groups) -> None:
    """Delete the markers of ``groups`` whose settlements are written. A marker whose delete fails
    stays (a row under a job id no job has): the settlement, not the marker, is what is read."""
    markers, groups.markers = groups.markers, []
    for table, job_id in markers:
        try:
            store.command(f"DELETE FROM {table} WHERE job_id = {{job:String}}", {"job": job_id})
        except StoreError:
            log.warning("the settling marker %s in %s stays: its delete failed", job_id, table)


def write(store: Store, entries: Sequence[Entry], settlements: Sequence[str], attempts: int = 1) -> None:
    """One ``ingest_batches`` insert of ``entries`` (recorded before their rows: ``landed`` 0), the
    first carrying ``settlements`` (``'1:token'``/``'0:token'``), tried ``attempts`` times.

    Raises:
        StoreError: the last attempt failed.
        ValueError: no entries.
    """
    if not entries:
        raise ValueError("a record insert needs at least one batch")
    record = pa.table(
        {
            "agent_id": pa.array([e.key[0] for e in entries], pa.string()),
            "seq": pa.array([e.key[1] for e in entries], pa.uint64()),
            "part": pa.array([e.key[2] for e in entries], pa.uint64()),
            "table_name": pa.array([e.table for e in entries], pa.string()),
            "rows": pa.array([e.rows for e in entries], pa.uint64()),
            "token": pa.array([e.token for e in entries], pa.string()),
            "landed": pa.array([0] * len(entries), pa.uint8()),
            "settled": pa.array([list(settlements)] + [[]] * (len(entries) - 1), pa.list_(pa.string())),
            "job_id": pa.array([e.job_id for e in entries], pa.string()),
        }
    )
    for attempt in range(attempts):
        try:
            store.insert("ingest_batches", record)
            return
        except StoreError:
            if attempt == attempts - 1:
                raise


def write_settlements(store: Store, groups: Groups, job_id: str) -> None:
    """Write the settlements of ``groups`` in an insert of their own (a row of ``agent_id`` '', which no
    batch has, under ``job_id``), then delete its markers: for a caller with no next group to carry
    them (the collector's writer always has one, or leaves them to be settled again).

    Raises:
        StoreError: the insert failed; the settlements stay unwritten.
    """
    if not groups.unwritten:
        return
    write(store, [Entry(("", 0, 0), "", 0, job_id, "")], groups.unwritten)
    groups.unwritten = []
    delete_markers(store, groups)
