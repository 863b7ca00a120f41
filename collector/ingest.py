"""The ingest path: one gRPC ``Batch`` → validated Arrow columns → one insert, exactly once.

Everything here works on whole Arrow columns (pyarrow compute), never on single
events in Python: decode the IPC stream (zero-copy) and conform it to
:func:`argus.schema.wire_schema` per batch; check the values of a group's batches of
one table at once, add ``job_id`` as a dictionary column, insert with
``insert_deduplication_token = "{agent_id}:{seq}"``.

Deduplication (docs/design.md §3): every stored batch is recorded in ``ingest_batches``;
a batch whose ``(agent_id, seq, part)`` is found there is acknowledged as a duplicate
without touching its table. ``part`` is 0 for a whole batch; a part of a batch the
agent re-split after a too-large refusal carries its parent's identity
(``Batch.parent``) and a part index in heap order (the halves of part ``p`` are
``2p`` and ``2p + 1``, the whole batch is 1, stored as 0), so it is a duplicate
when it, an ancestor (the batch stored whole before the split) or a descendant
(its own parts, from a crash between the spool's writes) was stored.

The record is written *after* the data and before the ack. A batch stored alone
carries its own token, so a crash between the two makes the retry insert again
with the same token, and ClickHouse's token deduplication drops it: the table
holds the rows once either way. The same token also covers two collectors racing
on one retried batch.

:func:`write_group` stores several batches at once: one lookup and one record
insert for the group, and one data insert per *table* holding the rows of all the
group's new batches of it (more when they pass :data:`MAX_INSERT_BYTES`), under a token
derived from theirs (:func:`group_token`): what the collector's writer thread does with the
batches that arrived while it was busy. Each call to the store costs milliseconds whatever
its size, and a part per insert is what ClickHouse merges later: at 10,000 ranks (1,250 node
agents, about 5,000 batches a second, ``bench/scale.py``) one insert per batch could not keep up.

Retries are idempotent because no insert is ever half written: each data insert is one block
(:data:`argus.store.ONE_BLOCK`), so one that fails wrote none of its batches' rows, and its
batches may come back in any grouping. Without that, ClickHouse committed an insert of more
than ``min_insert_block_size_rows`` rows block by block: a failure in a later block left the
earlier ones stored, and the batches, resent into another group under another token, were
stored twice. A group whose rows are in but whose record insert fails (tried
:data:`RECORD_ATTEMPTS` times) is remembered in memory (:class:`Unrecorded`): when its batches
come back they are recorded, not inserted again. What is left: a collector that dies between
a group's data insert and its record; its batches' rows are then stored twice when resent.
Duplicates seen through ``ingest_batches`` (a lost ack, a resent spool, another collector)
are still dropped.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from argus.errors import InvalidBatch, StoreError
from argus.ipc_size import read_stream
from argus.jobid import check_job_id
from argus.limits import check_declared
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.rowrules import check_values
from argus.schema import WIRE_TABLES, wire_schema, with_defaults
from argus.store import Store

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "MAX_INSERT_BYTES",
    "RECORD_ATTEMPTS",
    "TABLE_BY_ENUM",
    "Decoded",
    "Outcome",
    "Unrecorded",
    "already_stored",
    "check_values",
    "conform",
    "decode",
    "detached",
    "encode_arrow_ipc",
    "group_token",
    "ingest",
    "stored_rows",
    "validate_columns",
    "with_job_id",
    "write_group",
]

#: Wire table name by ``argus.v1.Table`` enum value (TABLE_UNSPECIFIED is absent).
TABLE_BY_ENUM: dict[int, str] = {pb.Table.Value(name.upper()): name for name in WIRE_TABLES}

#: Tries of a group's ``ingest_batches`` insert before its batches go unacknowledged (module doc).
RECORD_ATTEMPTS = 3
#: Most Arrow bytes of one data insert: a group's batches of one table past it go in further inserts,
#: each one block (module doc), so ClickHouse never holds more than this of one insert at once.
MAX_INSERT_BYTES = 256 << 20
#: Most batches :class:`Unrecorded` remembers (about 100 bytes each).
MAX_UNRECORDED = 100_000


@dataclass(frozen=True)
class Decoded:
    """A batch read and conformed (:func:`decode`): ``data`` has the wire columns of ``table`` in
    schema order; its values are checked, and ``job_id`` added, by :func:`write_group`."""

    table: str
    data: pa.Table
    agent_id: str
    seq: int
    job_id: str
    #: Size of the Arrow payload as received, bytes.
    payload_bytes: int = 0
    dropped_events: int = 0
    #: ``Batch.parent`` of a part of a re-split batch: ``(agent_id, seq, part)``; None when whole.
    parent: tuple[str, int, int] | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        """The deduplication key ``(agent_id, seq, part)`` (the parent's, for a part; module doc)."""
        if self.parent is None:
            return (self.agent_id, self.seq, 0)
        agent_id, seq, part = self.parent
        return (agent_id, seq, 0 if part <= 1 else part)

    @property
    def dedup_token(self) -> str:
        """ClickHouse ``insert_deduplication_token`` of this batch: ``"{agent_id}:{seq}"``, and
        ``":{part}"`` after it for a part."""
        agent_id, seq, part = self.key
        return f"{agent_id}:{seq}:{part}" if part else f"{agent_id}:{seq}"


def encode_arrow_ipc(data: pa.Table | pa.RecordBatch) -> bytes:
    """Serialize ``data`` as an Arrow IPC *stream*: the form of ``Batch.arrow_ipc``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def _refuse_past_limit(decoded: int) -> None:
    """What compressed buffers declare is allocated before they are inflated: check it first."""
    try:
        check_declared("arrow_ipc: decoded size", decoded, "max_batch_decoded_bytes")
    except ValueError as exc:
        raise InvalidBatch(str(exc)) from exc


def _read_ipc(payload: bytes) -> pa.Table:
    try:
        data = read_stream(payload, _refuse_past_limit)
    except ValueError as exc:
        raise InvalidBatch(f"arrow_ipc: not a readable Arrow IPC stream ({exc})") from exc
    try:
        # Offsets, lengths and UTF-8 of every buffer: a crafted batch is refused here,
        # before any compute kernel or the store reads past a buffer's end.
        data.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidBatch(f"arrow_ipc: invalid Arrow data ({exc})") from exc
    return data


def validate_columns(table: str, data: pa.Table) -> pa.Table:
    """Check ``data`` against the wire schema of ``table``; return it in schema column order.

    :func:`conform` (the columns and their types), then :func:`argus.rowrules.check_values` (the
    row rules the node agent applies too).

    Raises:
        InvalidBatch: the first problem found.
    """
    data = conform(table, data)
    check_values(table, data)
    return data


def conform(table: str, data: pa.Table) -> pa.Table:
    """``data`` with exactly the wire schema of ``table``, in its column order.

    Checks, each naming the column: every wire column present and no other (a column
    added later with a default may be absent: it is filled, as from an older agent),
    the exact Arrow type (expected vs got), at least one row. Batches of one table that
    passed here concatenate.

    Raises:
        InvalidBatch: the first problem found.
    """
    schema = wire_schema(table)
    if not data.schema.equals(schema):  # a current agent sends names, order and types exactly
        data = with_defaults(table, data)
        got = set(data.column_names)
        missing = [name for name in schema.names if name not in got]
        if missing:
            raise InvalidBatch(f"{table}: missing column(s) {', '.join(missing)}")
        extra = sorted(got - set(schema.names))
        if extra:
            raise InvalidBatch(f"{table}: unknown column(s) {', '.join(extra)}")
        if len(data.column_names) != len(got):
            raise InvalidBatch(f"{table}: a column name appears twice")
        data = data.select(schema.names)
        for field, column in zip(schema, data.columns, strict=True):
            if column.type != field.type:
                raise InvalidBatch(
                    f"{table}.{field.name}: wrong Arrow type, expected {field.type}, got {column.type}"
                )
        data = pa.Table.from_arrays(data.columns, schema=schema)  # the schema's own field flags
    if data.num_rows == 0:
        raise InvalidBatch(f"{table}: the batch has no rows")
    return data


#: :func:`check_job_id` of the job ids seen lately, remembered (one check per job, not per batch;
#: a refused id raises, and is checked again next time).
_checked_job_id = functools.lru_cache(maxsize=4096)(check_job_id)


def decode(batch: pb.Batch) -> Decoded:
    """Check a batch's header and payload, and conform its columns to the wire schema.

    The values are checked later, with the other batches of its table in a group
    (:func:`write_group`, :func:`check_values`): per batch, those checks would cost more than
    the rest of a small batch's way into the store.

    Raises:
        InvalidBatch: empty ``agent_id`` or ``job_id``; unknown or unspecified
            ``table``; bytes that are not an Arrow IPC stream; any check of
            :func:`conform`.
    """
    if not batch.agent_id:
        raise InvalidBatch("agent_id: empty; every batch names the agent that sent it")
    if not batch.job_id:
        raise InvalidBatch("job_id: empty; every batch names its job")
    try:
        _checked_job_id(batch.job_id)
    except ValueError as exc:
        raise InvalidBatch(f"job_id: {exc}") from exc
    table = TABLE_BY_ENUM.get(batch.table)
    if table is None:
        known = ", ".join(TABLE_BY_ENUM.values()).upper()
        raise InvalidBatch(f"table: unknown or unspecified table {batch.table} (expected one of {known})")
    data = conform(table, _read_ipc(batch.arrow_ipc))
    parent = None
    if batch.HasField("parent"):
        if not batch.parent.agent_id:
            raise InvalidBatch("parent.agent_id: empty; a part names the batch it was split from")
        parent = (batch.parent.agent_id, batch.parent.seq, batch.parent.part)
    return Decoded(
        table,
        data,
        batch.agent_id,
        batch.seq,
        batch.job_id,
        payload_bytes=len(batch.arrow_ipc),
        dropped_events=batch.dropped_events,
        parent=parent,
    )


def _related(a: int, b: int) -> bool:
    """Whether parts ``a`` and ``b`` of one batch share rows: equal, or one an ancestor (module doc)."""
    a, b = max(a, 1), max(b, 1)
    if a > b:
        a, b = b, a
    while b > a:
        b >>= 1
    return a == b


def _found(parts: dict[int, int], part: int) -> int | None:
    """Rows stored under parts related to ``part`` (``parts``: part → rows of one batch), or None."""
    hits = [rows for p, rows in parts.items() if _related(p, part)]
    return sum(hits) if hits else None


def _written_before(written: dict[tuple[str, int], dict[int, int]], key: tuple[str, int, int]) -> int | None:
    """Rows of a part related to ``key`` stored earlier in the same group, or None.

    ``written``: (agent_id, seq) → part → rows of the group's batches so far.
    """
    return _found(written.get(key[:2], {}), key[2])


_Key = tuple[str, int] | tuple[str, int, int]


def stored_rows(store: Store, keys: Sequence[_Key]) -> dict[_Key, int]:
    """Rows stored before under each key of ``keys`` (one query): ``(agent_id, seq)`` for a whole
    batch or ``(agent_id, seq, part)``; a key with a related part stored counts (module doc).

    Raises:
        StoreError: the lookup failed.
    """
    if not keys:
        return {}
    found = store.query(
        "SELECT agent_id, seq, part, rows FROM ingest_batches "
        "WHERE agent_id IN {agents:Array(String)} AND seq IN {seqs:Array(UInt64)}",
        {"agents": sorted({k[0] for k in keys}), "seqs": sorted({k[1] for k in keys})},
    )
    parts: dict[tuple[str, int], dict[int, int]] = {}
    columns = (found.column(c).to_pylist() for c in ("agent_id", "seq", "part", "rows"))
    for a, s, p, n in zip(*columns, strict=True):
        parts.setdefault((a, s), {})[p] = n
    out: dict[_Key, int] = {}
    for key in keys:
        rows = _found(parts.get((key[0], key[1]), {}), key[2] if len(key) == 3 else 0)
        if rows is not None:
            out[key] = rows
    return out


def already_stored(store: Store, agent_id: str, seq: int, part: int = 0) -> int | None:
    """Rows of the stored batch ``(agent_id, seq, part)`` (or a related part), or None when never stored.

    Raises:
        StoreError: the lookup failed.
    """
    return stored_rows(store, [(agent_id, seq, part)]).get((agent_id, seq, part))


def _record(store: Store, stored: Sequence[Decoded], attempts: int = 1) -> None:
    """Insert the ``ingest_batches`` rows of ``stored``, trying ``attempts`` times.

    Raises:
        StoreError: the last attempt failed.
    """
    record = pa.table(
        {
            "agent_id": pa.array([d.key[0] for d in stored], pa.string()),
            "seq": pa.array([d.key[1] for d in stored], pa.uint64()),
            "part": pa.array([d.key[2] for d in stored], pa.uint64()),
            "table_name": pa.array([d.table for d in stored], pa.string()),
            "rows": pa.array([d.data.num_rows for d in stored], pa.uint64()),
            "job_id": pa.array([d.job_id for d in stored], pa.string()),
        }
    )
    for attempt in range(attempts):
        try:
            store.insert("ingest_batches", record)
            return
        except StoreError:
            if attempt == attempts - 1:
                raise


def _count(metrics: Metrics, decoded: Decoded, ack: Outcome) -> None:
    if not isinstance(ack, pb.Ack):  # refusals are counted where they are answered
        return
    if ack.status == pb.Ack.DUPLICATE:
        metrics.ingest_batches.labels(decoded.table, "duplicate").inc()
        return
    metrics.ingest_batches.labels(decoded.table, "stored").inc()
    metrics.ingest_rows.labels(decoded.table).inc(ack.rows)
    metrics.ingest_bytes.inc(decoded.payload_bytes)
    metrics.agent_dropped.inc(decoded.dropped_events)
    metrics.last_ingest.set_to_current_time()


#: What became of one batch of a group: stored (or a duplicate), refused, or not stored (retry).
Outcome = pb.Ack | InvalidBatch | StoreError


def detached(error: _E) -> _E:
    """``error`` and the exceptions it was raised from, without their tracebacks; returns it.

    A batch's outcome waits for its ack after the batch's decoded-bytes charge is given back; a
    traceback's frames hold the decoded rows in their locals (:func:`write_group`'s: every batch of
    its group), which so outlived the charge: each stream's refused batches stayed in memory past
    ``--max-decoded-bytes``. The message says all an outcome needs to say.
    """
    seen: BaseException | None = error
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return error


class Unrecorded:
    """Batches whose rows are stored but whose ``ingest_batches`` record failed: key → rows.

    Kept by the collector's writer (one thread) so that the batches, when their agents send them
    again, are recorded and acknowledged without a second data insert (module doc). At most
    :data:`MAX_UNRECORDED` are kept, the oldest forgotten first. Not thread-safe.
    """

    def __init__(self, most: int = MAX_UNRECORDED) -> None:
        self.most = most
        self._rows: dict[tuple[str, int, int], int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, batches: Sequence[Decoded]) -> None:
        """Remember ``batches`` as stored but not recorded."""
        for decoded in batches:
            self._rows.pop(decoded.key, None)
            self._rows[decoded.key] = decoded.data.num_rows
        while len(self._rows) > self.most:
            del self._rows[next(iter(self._rows))]

    def rows(self, key: tuple[str, int, int]) -> int | None:
        """Rows stored under ``key`` and not recorded, or None."""
        return self._rows.get(key)

    def forget(self, batches: Sequence[Decoded]) -> None:
        """``batches`` are recorded now."""
        for decoded in batches:
            self._rows.pop(decoded.key, None)


def write_group(
    store: Store,
    group: Sequence[Decoded],
    metrics: Metrics | None = None,
    unrecorded: Unrecorded | None = None,
) -> list[Outcome]:
    """Store each batch of ``group`` once; return its ``Ack`` or the error that kept it from storage.

    The values of every table's batches are checked together (:func:`check_values`; one batch
    at a time only when that finds a problem, to refuse just the batches that hold it), then
    one lookup for the whole group, one insert per table holding the rows of every new batch of
    that table (:func:`group_token`; more than one past :data:`MAX_INSERT_BYTES`), then one
    insert recording every batch stored. A batch whose key is already stored, or appears earlier
    in the group, is a DUPLICATE. A batch in ``unrecorded`` (rows stored, record failed) is only
    recorded. Outcomes are in ``group`` order: an ``InvalidBatch`` outcome is a refusal (never
    stored); a ``StoreError`` one means not acknowledged, safe to retry (no row of it is stored,
    or it is in ``unrecorded``).
    """
    outcomes: list[Outcome | None] = list(_checked(group))
    valid = [i for i, o in enumerate(outcomes) if o is None]
    try:
        known = stored_rows(store, [group[i].key for i in valid])
    except StoreError as exc:
        return [exc if o is None else o for o in outcomes]
    written = _insert_new(store, group, _new_by_table(group, valid, known, outcomes), outcomes, unrecorded)
    if written:
        try:
            _record(store, written, RECORD_ATTEMPTS)
        except StoreError as exc:
            # The rows are in, but a retry must not be acknowledged before it is recorded:
            # report failure, and remember them so that the retry only records them.
            if unrecorded is not None:
                unrecorded.add(written)
            outcomes = [exc if isinstance(o, pb.Ack) and o.status == pb.Ack.STORED else o for o in outcomes]
        else:
            if unrecorded is not None:
                unrecorded.forget(written)
    done = [o for o in outcomes if o is not None]
    if metrics is not None:
        for decoded, outcome in zip(group, done, strict=True):
            _count(metrics, decoded, outcome)
    return done


def _insert_new(
    store: Store,
    group: Sequence[Decoded],
    by_table: dict[str, list[int]],
    outcomes: list[Outcome | None],
    unrecorded: Unrecorded | None,
) -> list[Decoded]:
    """Insert the batches ``by_table`` (indices into ``group``; :func:`_inserts`), set each one's
    STORED ack or ``StoreError`` in ``outcomes``; return those whose rows are in."""
    written: list[Decoded] = []
    for table, members in by_table.items():
        for chunk in _inserts(group, members, unrecorded):
            batches = [group[i] for i in chunk]
            try:
                if unrecorded is None or unrecorded.rows(batches[0].key) is None:
                    _insert_together(store, table, batches)
            except StoreError as exc:
                for i in chunk:
                    outcomes[i] = exc
                continue
            written.extend(batches)
            for i in chunk:
                outcomes[i] = pb.Ack(seq=group[i].seq, status=pb.Ack.STORED, rows=group[i].data.num_rows)
    return written


def _inserts(
    group: Sequence[Decoded], members: Sequence[int], unrecorded: Unrecorded | None
) -> list[list[int]]:
    """``members`` (indices into ``group``, one table's) as the data inserts to make: runs of at most
    :data:`MAX_INSERT_BYTES` Arrow bytes (a larger batch alone); each batch of ``unrecorded`` alone,
    never inserted again (:func:`write_group`)."""
    runs: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i in members:
        if unrecorded is not None and unrecorded.rows(group[i].key) is not None:
            runs.append([i])
            continue
        nbytes = group[i].data.nbytes
        if run and size + nbytes > MAX_INSERT_BYTES:
            runs.append(run)
            run, size = [], 0
        run.append(i)
        size += nbytes
    return [*runs, run] if run else runs


def _checked(group: Sequence[Decoded]) -> list[InvalidBatch | None]:
    """The :func:`check_values` problem of each batch of ``group``, or None: one check per table."""
    problems: list[InvalidBatch | None] = [None] * len(group)
    by_table: dict[str, list[int]] = {}
    for i, decoded in enumerate(group):
        by_table.setdefault(decoded.table, []).append(i)
    for table, members in by_table.items():
        try:
            check_values(table, pa.concat_tables([group[i].data for i in members]))
            continue
        except (InvalidBatch, pa.ArrowInvalid):
            pass
        for i in members:  # someone's rows hold the problem: find whose
            try:
                check_values(table, group[i].data)
            except InvalidBatch as exc:
                problems[i] = exc
    return problems


def _new_by_table(
    group: Sequence[Decoded], valid: Sequence[int], known: dict[_Key, int], outcomes: list[Outcome | None]
) -> dict[str, list[int]]:
    """The indices of the ``valid`` batches of ``group`` to insert, by table; each of the others
    (stored before or earlier in the group) gets its DUPLICATE ack in ``outcomes``."""
    fresh: dict[tuple[str, int], dict[int, int]] = {}
    by_table: dict[str, list[int]] = {}
    for i in valid:
        decoded = group[i]
        rows = known.get(decoded.key, _written_before(fresh, decoded.key))
        if rows is not None:
            outcomes[i] = pb.Ack(seq=decoded.seq, status=pb.Ack.DUPLICATE, rows=rows)
            continue
        fresh.setdefault(decoded.key[:2], {})[decoded.key[2]] = decoded.data.num_rows
        by_table.setdefault(decoded.table, []).append(i)
    return by_table


def _insert_together(store: Store, table: str, batches: Sequence[Decoded]) -> None:
    """One insert of the rows of ``batches`` (all of ``table``) with their ``job_id`` column, under
    :func:`group_token`.

    Raises:
        StoreError: nothing was written.
    """
    store.insert(table, with_job_id(batches), dedup_token=group_token(batches))


def with_job_id(batches: Sequence[Decoded]) -> pa.Table:
    """The rows of ``batches`` (one table's) with each batch's ``job_id`` as a dictionary column:
    one entry per job, not a copy of the string per row (``job_id`` is LowCardinality)."""
    data = batches[0].data if len(batches) == 1 else pa.concat_tables([d.data for d in batches])
    jobs = sorted({d.job_id for d in batches})
    index = {job: k for k, job in enumerate(jobs)}
    codes = np.repeat(
        np.array([index[d.job_id] for d in batches], np.int32), [d.data.num_rows for d in batches]
    )
    return data.append_column("job_id", pa.DictionaryArray.from_arrays(codes, pa.array(jobs, pa.string())))


def group_token(batches: Sequence[Decoded]) -> str:
    """The ``insert_deduplication_token`` of one insert of ``batches`` (one table's, in order).

    A batch alone keeps its own token (:attr:`Decoded.dedup_token`); several get one derived
    from all of theirs, so the same batches in the same order get the same token.
    """
    if len(batches) == 1:
        return batches[0].dedup_token
    digest = hashlib.sha256("\n".join(d.dedup_token for d in batches).encode()).hexdigest()
    return f"group:{len(batches)}:{digest}"


def ingest(store: Store, batch: pb.Batch, metrics: Metrics | None = None) -> pb.Ack:
    """Store ``batch`` once and return its ``Ack`` (STORED or DUPLICATE).

    Rejections are raised, not returned, so the caller maps every error in one place.

    Raises:
        InvalidBatch: the batch cannot be stored (see :func:`decode`); nothing written.
        StoreError: the store failed; the batch may be retried safely.
    """
    (outcome,) = write_group(store, [decode(batch)], metrics)
    if not isinstance(outcome, pb.Ack):
        raise outcome
    return outcome
