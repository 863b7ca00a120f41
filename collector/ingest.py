"""The ingest path: one gRPC ``Batch`` → validated Arrow columns → one insert, exactly once.

Everything here works on whole Arrow columns (pyarrow compute), never on single
events in Python: decode the IPC stream (zero-copy) and conform it to
:func:`argus.schema.wire_schema` per batch; check the values of a group's batches of
one table at once, add ``job_id`` as a dictionary column, insert with
``insert_deduplication_token = "{agent_id}:{seq}"``.

A node agent's flush comes as one message whose members are batches (:func:`flush_members`): each
is decoded and stored as a batch of its own, so everything below holds per member.

Deduplication (docs/design.md §3): every stored batch is recorded in ``ingest_batches``;
a batch whose ``(agent_id, seq, part)`` is found there is acknowledged as a duplicate
without touching its table. ``part`` is 0 for a whole batch; a part of a batch the
agent re-split after a too-large refusal carries its parent's identity
(``Batch.parent``) and a part index in heap order (the halves of part ``p`` are
``2p`` and ``2p + 1``, the whole batch is 1, stored as 0), so it is a duplicate
when it, an ancestor (the batch stored whole before the split) or a descendant
(its own parts, from a crash between the spool's writes) was stored.

The record is written *before* the data and names the token of the insert that holds
the batch's rows; whether that insert landed is settled by what the collector remembers,
by a settlement row, or, after a crash, by a marker inserted under the same token
(:mod:`argus.collector.ingest_record`). So a batch resent after a collector died between
its group's record and its data insert (or between the data insert and the settlement)
is stored once, in whatever grouping it comes back: its rows are found in, or known not
to be. A batch stored alone, never recorded before, carries its own token, which also
covers two collectors racing on one retried batch.

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
stored twice. A record insert that fails (tried
:data:`argus.collector.ingest_record.RECORD_ATTEMPTS` times) comes before any row: nothing is
stored, and the batches are retried.
Duplicates seen through ``ingest_batches`` (a lost ack, a resent spool, another collector)
are still dropped.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from argus.collector import ingest_record as record
from argus.errors import InvalidBatch, StoreError
from argus.ipc_size import Scanned, read_stream
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
    "TABLE_BY_ENUM",
    "Decoded",
    "Outcome",
    "already_stored",
    "check_values",
    "conform",
    "decode",
    "detached",
    "encode_arrow_ipc",
    "flush_members",
    "group_token",
    "ingest",
    "stored_rows",
    "validate_columns",
    "with_job_id",
    "write_group",
]

#: Wire table name by ``argus.v1.Table`` enum value (TABLE_UNSPECIFIED is absent).
TABLE_BY_ENUM: dict[int, str] = {pb.Table.Value(name.upper()): name for name in WIRE_TABLES}

#: Most Arrow bytes of one data insert: a group's batches of one table past it go in further inserts,
#: each one block (module doc), so ClickHouse never holds more than this of one insert at once.
MAX_INSERT_BYTES = 256 << 20


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


def _read_ipc(payload: bytes | Scanned, pool: pa.MemoryPool | None = None) -> pa.Table:
    try:
        data = read_stream(payload, _refuse_past_limit, pool)
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


def decode(batch: pb.Batch, pool: pa.MemoryPool | None = None, stream: Scanned | None = None) -> Decoded:
    """Check a batch's header and payload, and conform its columns to the wire schema.

    ``pool``: where its decompressed buffers go (:func:`argus.ipc_size.read_stream`); Arrow's
    default pool when None. ``stream``: ``batch.arrow_ipc`` already walked
    (:func:`argus.ipc_size.scan`, as the collector does to charge it before decoding it,
    :func:`argus.collector.decoded_budget.batch_cost`), so its messages are not read twice.

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
    if batch.members:
        raise InvalidBatch("members: a batch of one table carries no members")
    payload = stream if stream is not None else batch.arrow_ipc
    data = conform(table, _read_ipc(payload, pool))
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
        payload_bytes=len(stream.payload) if stream is not None else len(batch.arrow_ipc),
        dropped_events=batch.dropped_events,
        parent=parent,
    )


def flush_members(batch: pb.Batch) -> Sequence[pb.Batch]:
    """The member batches of a flush message (``Batch.members``, docs/design.md §3), each to be
    decoded (:func:`decode`) and stored as a batch of its own; empty when ``batch`` is one batch.

    Only the flush's frame is checked here: it names its agent and carries nothing but its members,
    and each member is one batch of the same agent. A member's own problems refuse that member alone.

    Raises:
        InvalidBatch: empty ``agent_id``; a flush with a table, payload, job, parent, dropped
            events or clock offset of its own; a member with members, or of another agent.
    """
    members = batch.members
    if not members:
        return members
    if not batch.agent_id:
        raise InvalidBatch("agent_id: empty; every batch names the agent that sent it")
    own = [
        name
        for name, present in (
            ("table", batch.table != pb.TABLE_UNSPECIFIED),
            ("arrow_ipc", bool(batch.arrow_ipc)),
            ("job_id", bool(batch.job_id)),
            ("parent", batch.HasField("parent")),
            ("dropped_events", batch.dropped_events != 0),
            ("clock_offset_ns", batch.clock_offset_ns != 0),
        )
        if present
    ]
    if own:
        raise InvalidBatch(
            f"members: a flush carries its rows in its members, not {', '.join(own)} of its own"
        )
    for i, member in enumerate(members):
        if member.members:
            raise InvalidBatch(f"members[{i}].members: a member of a flush is one batch")
        if member.agent_id != batch.agent_id:
            raise InvalidBatch(
                f"members[{i}].agent_id: {member.agent_id!r}, not the flush's {batch.agent_id!r}"
            )
    return members


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


def _stored_parts(
    records: Sequence[record.Record], landed: Mapping[str, bool]
) -> tuple[dict[int, int], dict[str, record.Record]]:
    """The parts of one batch whose rows are stored (part → rows), and the unsettled tokens among its
    ``records`` (token → a record naming it), given the tokens known to have landed or not."""
    parts: dict[int, int] = {}
    unsettled: dict[str, record.Record] = {}
    for r in records:
        state = True if not r.token or r.landed else landed.get(r.token)
        if state:
            parts[r.part] = r.rows
        elif state is None:
            unsettled[r.token] = r
    return parts, unsettled


def stored_rows(store: Store, keys: Sequence[_Key]) -> dict[_Key, int]:
    """Rows stored before under each key of ``keys``: ``(agent_id, seq)`` for a whole batch or
    ``(agent_id, seq, part)``; a key with a related part stored counts (module doc). A batch recorded
    under an insert not settled yet (:mod:`argus.collector.ingest_record`) is not counted.

    Raises:
        StoreError: the lookup failed.
    """
    full = [(k[0], k[1], k[2] if len(k) == 3 else 0) for k in keys]
    found = record.lookup(store, full)
    landed = _settled(store, found, record.Groups())
    out: dict[_Key, int] = {}
    for key, (agent_id, seq, part) in zip(keys, full, strict=True):
        rows = _found(_stored_parts(found.get((agent_id, seq), []), landed)[0], part)
        if rows is not None:
            out[key] = rows
    return out


def _settled(
    store: Store, found: Mapping[tuple[str, int], Sequence[record.Record]], groups: record.Groups
) -> dict[str, bool]:
    """Whether the inserts named by the unsettled records of ``found`` landed, as ``groups`` or the
    settlements written say (token → landed; absent: not settled).

    Raises:
        StoreError: the lookup failed.
    """
    pending = {r.token: r for rs in found.values() for r in rs if r.token and not r.landed}
    landed: dict[str, bool] = {}
    for token in pending:
        state = groups.landed(token)
        if state is not None:
            landed[token] = state
    rest = [t for t in pending if t not in landed]
    if rest:
        landed.update(record.settled(store, rest, min(pending[t].stored_s for t in rest)))
    return landed


def already_stored(store: Store, agent_id: str, seq: int, part: int = 0) -> int | None:
    """Rows of the stored batch ``(agent_id, seq, part)`` (or a related part), or None when never stored.

    Raises:
        StoreError: the lookup failed.
    """
    return stored_rows(store, [(agent_id, seq, part)]).get((agent_id, seq, part))


@dataclass
class _Known:
    """What the store says of a group's keys (:func:`_known`)."""

    #: Rows stored under each key stored before (or a related part).
    rows: dict[tuple[str, int, int], int]
    #: Keys not to store now, with why: their earlier insert is not settled, or settling failed.
    waiting: dict[tuple[str, int, int], StoreError]
    #: Records found under each key exactly: what makes its next insert's token new (:func:`group_token`).
    tries: dict[tuple[str, int, int], int]


def _known(store: Store, keys: Sequence[tuple[str, int, int]], groups: record.Groups) -> _Known:
    """Look ``keys`` up; settle every insert they were recorded under that is not settled yet and may
    be (:mod:`argus.collector.ingest_record`; ``groups`` learns the answers).

    Raises:
        StoreError: the lookup failed.
    """
    found = record.lookup(store, keys)
    landed = _settled(store, found, groups)
    known = _Known({}, {}, {})
    for key in keys:
        records = [r for r in found.get(key[:2], []) if _related(r.part, key[2])]
        known.tries[key] = sum(1 for r in records if r.part == key[2])
        for token, r in _stored_parts(records, landed)[1].items():
            if not (store.embedded or groups.mine(token) or r.age_s >= record.SETTLE_AFTER_S):
                known.waiting[key] = StoreError(
                    "an earlier insert of this batch by another collector is not settled yet; retry later"
                )
                continue
            try:
                landed[token] = record.settle(store, token, r.table)
            except StoreError as exc:
                known.waiting[key] = exc
                continue
            groups.settled_by_marker(token, r.table, landed[token])
        if key in known.waiting:
            continue
        rows = _found(_stored_parts(records, landed)[0], key[2])
        if rows is not None:
            known.rows[key] = rows
    return known


def _count(metrics: Metrics, group: Sequence[Decoded], outcomes: Sequence[Outcome]) -> None:
    """Count a group's stored batches and duplicates, one increment per table and outcome: the
    metrics' label lookups and locks cost more than the rest of a small batch's way once per batch
    (6 % of the writer's samples, ``bench/scale.py --agents 125``, 12-07). Refusals are counted
    where they are answered."""
    batches: dict[tuple[str, str], int] = {}
    rows: dict[str, int] = {}
    payload_bytes = dropped = 0
    for decoded, ack in zip(group, outcomes, strict=True):
        if not isinstance(ack, pb.Ack):
            continue
        status = "duplicate" if ack.status == pb.Ack.DUPLICATE else "stored"
        batches[decoded.table, status] = batches.get((decoded.table, status), 0) + 1
        if status == "stored":
            rows[decoded.table] = rows.get(decoded.table, 0) + ack.rows
            payload_bytes += decoded.payload_bytes
            dropped += decoded.dropped_events
    for (table, status), n in batches.items():
        metrics.ingest_batches.labels(table, status).inc(n)
    for table, n in rows.items():
        metrics.ingest_rows.labels(table).inc(n)
    if rows:
        metrics.ingest_bytes.inc(payload_bytes)
        metrics.agent_dropped.inc(dropped)
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


def write_group(
    store: Store,
    group: Sequence[Decoded],
    metrics: Metrics | None = None,
    groups: record.Groups | None = None,
) -> list[Outcome]:
    """Store each batch of ``group`` once; return its ``Ack`` or the error that kept it from storage.

    The values of every table's batches are checked together (:func:`check_values`; one batch
    at a time only when that finds a problem, to refuse just the batches that hold it), then
    one lookup for the whole group (settling any earlier insert of its batches not settled yet,
    :mod:`argus.collector.ingest_record`), one ``ingest_batches`` insert recording every new batch
    under the token of the insert that will hold its rows (with the settlements of ``groups``'s
    earlier inserts), then one insert per table holding the rows of every new batch of that table
    (:func:`group_token`; more than one past :data:`MAX_INSERT_BYTES`). A batch whose key is
    already stored, or appears earlier in the group, is a DUPLICATE. Outcomes are in ``group``
    order: an ``InvalidBatch`` outcome is a refusal (never stored); a ``StoreError`` one means not
    acknowledged, safe to retry in any grouping.

    ``groups``: what the caller's earlier calls inserted and settled (the writer keeps one, and its
    next group's record carries them); without it, this call's settlements are written at its end
    in an insert of their own (:func:`argus.collector.ingest_record.write_settlements`).
    """
    own = groups if groups is not None else record.Groups()
    outcomes: list[Outcome | None] = list(_checked(group))
    valid = [i for i, o in enumerate(outcomes) if o is None]
    try:
        known = _known(store, [group[i].key for i in valid], own)
    except StoreError as exc:
        return [exc if o is None else o for o in outcomes]
    for i in valid:
        outcomes[i] = known.waiting.get(group[i].key)
    fresh = [i for i in valid if outcomes[i] is None]
    _insert_new(store, group, _new_by_table(group, fresh, known.rows, outcomes), outcomes, known.tries, own)
    if groups is None and group:
        # Failing, its inserts are settled by their markers when their batches come back (module doc).
        with contextlib.suppress(StoreError):
            record.write_settlements(store, own, group[0].job_id)
    done = [o for o in outcomes if o is not None]
    if metrics is not None:
        _count(metrics, group, done)
    return done


def _insert_new(
    store: Store,
    group: Sequence[Decoded],
    by_table: dict[str, list[int]],
    outcomes: list[Outcome | None],
    tries: Mapping[tuple[str, int, int], int],
    groups: record.Groups,
) -> None:
    """Record, then insert, the batches ``by_table`` (indices into ``group``; :func:`_inserts`); set
    each one's STORED ack or ``StoreError`` in ``outcomes``; ``groups`` learns each insert's fate."""
    chunks = [
        (table, chunk, group_token([group[i] for i in chunk], [tries.get(group[i].key, 0) for i in chunk]))
        for table, members in by_table.items()
        for chunk in _inserts(group, members)
    ]
    if not chunks:
        return
    entries = [
        record.Entry(group[i].key, table, group[i].data.num_rows, group[i].job_id, token)
        for table, chunk, token in chunks
        for i in chunk
    ]
    try:
        record.write(store, entries, groups.unwritten, record.RECORD_ATTEMPTS)
    except StoreError as exc:
        for _, chunk, _ in chunks:
            for i in chunk:
                outcomes[i] = exc
        return
    groups.unwritten = []
    record.delete_markers(store, groups)
    for table, chunk, token in chunks:
        batches = [group[i] for i in chunk]
        try:
            store.insert(table, with_job_id(batches), dedup_token=token)
        except StoreError as exc:
            groups.failed(token)
            for i in chunk:
                outcomes[i] = exc
            continue
        groups.inserted(token)
        for i in chunk:
            outcomes[i] = pb.Ack(seq=group[i].seq, status=pb.Ack.STORED, rows=group[i].data.num_rows)


def _inserts(group: Sequence[Decoded], members: Sequence[int]) -> list[list[int]]:
    """``members`` (indices into ``group``, one table's) as the data inserts to make: runs of at most
    :data:`MAX_INSERT_BYTES` Arrow bytes (a larger batch alone).

    A batch's size is the bytes of its buffers (``get_total_buffer_size``: a sum over them), not
    ``Table.nbytes``, which walks every column to count only the bytes its rows reference: 18-160 µs
    a batch (`bench/scale.py`'s, pyarrow 26), a tenth of the writer thread's time."""
    runs: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i in members:
        nbytes = group[i].data.get_total_buffer_size()
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
    group: Sequence[Decoded],
    valid: Sequence[int],
    known: Mapping[tuple[str, int, int], int],
    outcomes: list[Outcome | None],
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


def with_job_id(batches: Sequence[Decoded]) -> pa.Table:
    """The rows of ``batches`` (one table's) with each batch's ``job_id`` as a dictionary column:
    one entry per job, not a copy of the string per row (``job_id`` is LowCardinality).

    One chunk per column: ClickHouse derives a block's deduplication id from the token *and* the
    record batches it was read from (chDB 4.4: a 200-row insert of four record batches and a one-row
    marker under the same token were both kept), so every insert under a token is one record batch,
    and a marker under it (:func:`argus.collector.ingest_record.settle`) finds it. The copy costs
    about what reading the rows once does.
    """
    data = batches[0].data if len(batches) == 1 else pa.concat_tables([d.data for d in batches])
    jobs = sorted({d.job_id for d in batches})
    index = {job: k for k, job in enumerate(jobs)}
    codes = np.repeat(
        np.array([index[d.job_id] for d in batches], np.int32), [d.data.num_rows for d in batches]
    )
    job_ids = pa.DictionaryArray.from_arrays(codes, pa.array(jobs, pa.string()))
    return data.append_column("job_id", job_ids).combine_chunks()


def group_token(batches: Sequence[Decoded], tries: Sequence[int] | None = None) -> str:
    """The ``insert_deduplication_token`` of one insert of ``batches`` (one table's, in order).

    ``tries``: per batch, how many records of its key the store holds already (0 when absent): an
    insert of a batch whose earlier insert never landed gets a token that insert's marker does not
    hold (:mod:`argus.collector.ingest_record`). A batch alone, never recorded, keeps its own token
    (:attr:`Decoded.dedup_token`); several get one derived from all of theirs, so the same batches
    in the same order get the same token.
    """
    names = [
        d.dedup_token if not n else f"{d.dedup_token}#{n}"
        for d, n in zip(batches, tries if tries is not None else [0] * len(batches), strict=True)
    ]
    if len(names) == 1:
        return names[0]
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return f"group:{len(names)}:{digest}"


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
