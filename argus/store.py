"""The ClickHouse store: one class over a clickhouse-connect client, embedded (chDB) or a server.

Every part reaches ClickHouse through :class:`Store`; :func:`open_store` is the one way to
get one. Statements name tables without a database (the client makes ``argus`` the current
database) and bind parameters with ClickHouse's server-side ``{name:Type}`` syntax, so the
same SQL runs embedded and on a server.

URLs:
    ``chdb:///abs/path``, ``chdb://./rel/path`` or ``chdb://rel/path`` — embedded ClickHouse
    in this process (clickhouse-connect's chDB backend); everything after ``chdb://`` is the
    data dir. One process owns a data dir, and a process has one embedded engine at a time.
    ``clickhouse://user:pass@host:port/db`` (``clickhouses://`` for HTTPS) — a ClickHouse
    server over its HTTP interface; ``db`` defaults to ``argus``.

Both URLs give a :class:`ClickHouseStore` over ``clickhouse_connect.get_client``: every test
on chDB runs the code a server deployment runs. Inserts go as Arrow (``insert_arrow``; the
chDB backend writes the Arrow stream to a temporary file and runs ``INSERT … FROM INFILE``),
queries come back as Arrow (``query_arrow``).

Why one class, measured (chDB 4.4.0, clickhouse-connect 1.12.0, the 2-core development machine
while other work loaded it, load average 4-25; figures of 2026-12-01):

- Concurrency: ``python bench/store_threads.py`` (eight threads, each inserting 8,192 raw kernel
  events with a dedup token, recording the batch in ``ingest_batches`` and querying, without
  pause, for 300 s): no deadlock and no error, 61,700 rows/s, p99 call 2.4 s. The chDB backend
  serialises the calls of one client under a lock and runs no Python inside the engine (inserts
  go through a file), so the deadlock of chDB's ``Python()`` table function under concurrent
  calls (its native mutex taken with the GIL held, then the GIL taken with the mutex held)
  cannot happen.
- Cost: the collector's write path (decode, deduplicate, insert, record) of 65,536-event batches
  takes 1.46 CPU-s per million events, median of three, against 1.46 for the former chDB-only
  class (``Python()`` inserts) in the same interleaved runs; ``bench/ingest.py`` through
  `argus server` stayed within the load's noise (README).
- The temporary file is not what an insert costs (chDB 4.4, clickhouse-connect 1.13, 2026-12-06,
  load 9-12): inserting the same Arrow table in-process instead (chDB's ``send_insert`` of an
  ``ArrowStream``, no file) took 23.8 against 22.6 ms of CPU for 2,000 rows and 49.3 against 49.6
  for 20,000 (medians of three interleaved rounds of 50 inserts). What an insert costs is the
  MergeTree part it writes: about 15-20 ms of CPU whatever its size (a ``Memory`` table: 3 ms), so
  the collector's writer makes few, large inserts (:mod:`argus.collector.writer`).

Bounded work: every call (query, command, insert) carries ClickHouse's ``max_execution_time``
and ``max_memory_usage`` (defaults :data:`~argus.config.DEFAULT_STORE_TIMEOUT_S`,
:data:`~argus.config.DEFAULT_STORE_MEMORY_BYTES`; README "Limits"; sent with each call to a
server, set once on the session in chDB, whose backend would wrap each call in five more engine
calls to apply and restore them): a call past either fails
with :class:`~argus.errors.StoreError` (``TIMEOUT_EXCEEDED``, ``MEMORY_LIMIT_EXCEEDED``) and
the server goes on. The REST API reads through :meth:`ClickHouseStore.reading_at_most`, which
adds ``max_rows_to_read`` (default :data:`~argus.config.DEFAULT_MAX_READ_ROWS`, ``argus server
--max-read-rows``): a read that would scan more is refused (422), not run for a minute.

Deduplication: with a token, ClickHouse drops a block inserted before under the same token;
without one nothing is dropped. Newer ClickHouse (the 26.9 engine of chDB 4.4) switches that
with ``deduplicate_insert``, older servers with ``insert_deduplicate``: the store uses what the
server knows.
"""

from __future__ import annotations

import copy
import fcntl
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from argus.config import (
    DATABASE,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_STORE_MEMORY_BYTES,
    DEFAULT_STORE_TIMEOUT_S,
)
from argus.errors import ConfigError, StoreError, StoreLocked, TooManyRows
from argus.memory import set_engine_allocator
from argus.private import private_dir
from argus.schema import TABLES, create_statements, migration_statements

__all__ = [
    "ONE_BLOCK",
    "ClickHouseStore",
    "Store",
    "apply_retention",
    "given_conditions",
    "open_store",
    "retention_statements",
]


#: Insert settings that squash every Arrow record batch of one insert into one ClickHouse block, so
#: the insert is one part: written whole or not at all. Otherwise ClickHouse commits a block each
#: ``min_insert_block_size_rows`` rows (about a million by default, less where a server's profile
#: says so) and an error in a later block leaves the earlier ones stored. The caller bounds the
#: insert's size (:data:`argus.collector.ingest.MAX_INSERT_BYTES`).
ONE_BLOCK: dict[str, int] = {
    "min_insert_block_size_rows": 1 << 62,
    "min_insert_block_size_bytes": 1 << 62,
}


class Store(Protocol):
    """What every part needs of ClickHouse. Implementations are thread-safe."""

    url: str
    #: True when the engine runs in this process (chDB): its memory is this process's memory.
    embedded: bool

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        """Insert ``data`` (columns named as the table's, ``stored_at`` excluded) into ``table``.

        With ``dedup_token``, ClickHouse drops the insert if a block with the same
        token was inserted into ``table`` before (``insert_deduplication_token``), and the
        insert is one block (:data:`ONE_BLOCK`): all its rows are written or none, so a retry
        under another token cannot store again rows a failed insert had written.
        Without one, nothing is deduplicated: the tables keep a deduplication window,
        so a plain insert would otherwise drop a block identical to a recent one.

        Raises:
            StoreError: the insert failed; nothing was written.
        """
        ...

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a SELECT and return its result as an Arrow table.

        Raises:
            StoreError: the query failed.
        """
        ...

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER, OPTIMIZE).

        Raises:
            StoreError: the statement failed.
        """
        ...

    def close(self) -> None:
        """Release the connection; the store is unusable afterwards."""
        ...

    def beside(self) -> Store:
        """The same store over a connection of its own, whose calls run beside this one's.

        An embedded engine's client serialises its calls under one lock, so a slow read
        would hold back every insert behind it; a second client (a second chDB handle on
        the same engine, or a second HTTP client) runs its calls concurrently in the
        engine. Closing it leaves this store open; close it before this one.

        Raises:
            StoreError: the connection cannot be opened.
        """
        ...

    def reading_at_most(self, rows: int) -> Store:
        """This store, over the same connection, with every query scanning at most ``rows`` rows.

        A query past it raises :class:`~argus.errors.TooManyRows` (ClickHouse's
        ``max_rows_to_read``, counted over the parts a query reads, after the primary
        key prunes them). Closing the view closes this store.

        Raises:
            ConfigError: ``rows`` < 1.
        """
        ...


class ClickHouseStore:
    """:class:`Store` over one clickhouse-connect client, for ``chdb://`` and ``clickhouse://`` URLs.

    Args:
        url: A store URL (module docstring).
        timeout_s: ``max_execution_time`` of every call, seconds (>= 1).
        memory_bytes: ``max_memory_usage`` of every call, bytes (>= 1).

    Raises:
        ConfigError: the URL names no data dir or has another scheme; a limit below 1.
        StoreLocked: another process holds the chDB data dir.
        StoreError: the server cannot be reached, or the database cannot be created.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: int = DEFAULT_STORE_TIMEOUT_S,
        memory_bytes: int = DEFAULT_STORE_MEMORY_BYTES,
    ) -> None:
        if timeout_s < 1 or memory_bytes < 1:
            raise ConfigError(f"store limits must be >= 1, got {timeout_s} s and {memory_bytes} bytes")
        #: Settings every call carries (module docstring, "Bounded work").
        self.limits: dict[str, Any] = {"max_execution_time": timeout_s, "max_memory_usage": memory_bytes}
        #: Rows one query may read (:meth:`reading_at_most`); None = unbounded.
        self.max_rows_read: int | None = None
        self.url = url
        scheme, sep, rest = url.partition("://")
        self.embedded = scheme == "chdb" and bool(sep)
        try:
            if self.embedded:
                if not rest:
                    raise ConfigError(f"store URL {url!r} names no data dir; e.g. chdb://./argus-data")
                path = Path(rest).resolve()
                private_dir(path)  # every job's commands and stacks: its owner only
                self.url = f"chdb://{path}"
                self.database = DATABASE
            elif scheme in {"clickhouse", "clickhouses"} and sep:
                self.database = urlsplit(url).path.lstrip("/") or DATABASE
            else:
                raise ConfigError(
                    f"unknown store URL {url!r}: use chdb:///path or clickhouse://user:pass@host:port/db"
                )
            self._client = self._connect()
        except ConfigError:
            raise
        except Exception as exc:
            raise _open_error(url, exc) from exc
        #: What each call sends along: the limits, unless the session holds them.
        self._per_call: dict[str, Any] = {} if self.embedded else dict(self.limits)
        # Newer ClickHouse switches deduplication with `deduplicate_insert` (`insert_deduplicate`
        # counts only under its `backward_compatible_choice`); older servers know only the latter.
        known = getattr(self._client, "server_settings", {}) or {}
        self._no_dedup: dict[str, Any] = (
            {"deduplicate_insert": "disable"} if "deduplicate_insert" in known else {"insert_deduplicate": 0}
        )

    def _connect(self) -> Any:
        """A new client on this store's database (its limits set on it when embedded)."""
        import clickhouse_connect

        if not self.embedded:
            return _server_client(self.url)
        set_engine_allocator()  # before the engine's library loads (argus.memory)
        client = clickhouse_connect.get_client(interface="chdb", path=self.url.removeprefix("chdb://"))
        client.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        client.database = self.database
        # The chDB backend applies per-call settings with a SET before and after each call
        # and a read of system.settings: five engine calls more per call. The session is
        # this client's alone, so its limits are set on it once.
        for name, value in self.limits.items():
            client.command(f"SET {name} = {int(value)}")
        return client

    def beside(self) -> ClickHouseStore:
        view = copy.copy(self)
        try:
            view._client = self._connect()
        except Exception as exc:
            raise _open_error(self.url, exc) from exc
        return view

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        settings: dict[str, Any] = (
            {"insert_deduplication_token": dedup_token, **ONE_BLOCK}
            if dedup_token is not None
            else self._no_dedup
        )
        try:
            self._client.insert_arrow(table, data, settings={**self._per_call, **settings})
        except Exception as exc:
            raise StoreError(f"{self._what}: {exc}") from exc

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        try:
            result: pa.Table = self._client.query_arrow(
                sql, parameters=dict(parameters or {}), settings=self._per_call
            )
        except Exception as exc:
            if self.max_rows_read is not None and "TOO_MANY_ROWS" in str(exc):
                raise TooManyRows(self.max_rows_read) from exc
            raise StoreError(f"{self._what}: {exc}") from exc
        return result

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        try:
            self._client.command(sql, parameters=dict(parameters or {}), settings=self._per_call)
        except Exception as exc:
            raise StoreError(f"{self._what}: {exc}") from exc

    def close(self) -> None:
        self._client.close()

    def reading_at_most(self, rows: int) -> ClickHouseStore:
        if rows < 1:
            raise ConfigError(f"a read limit must be >= 1 row, got {rows}")
        view = copy.copy(self)
        view.max_rows_read = rows
        view._per_call = {**self._per_call, "max_rows_to_read": rows, "read_overflow_mode": "throw"}
        return view

    @property
    def _what(self) -> str:
        return "chDB" if self.embedded else "ClickHouse"


def _server_client(url: str) -> Any:
    """A clickhouse-connect HTTP client on the URL's database, which it creates if absent."""
    import clickhouse_connect

    parts = urlsplit(url)
    secure = parts.scheme == "clickhouses"
    connection: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or (8443 if secure else 8123),
        "username": unquote(parts.username or "default"),
        "password": unquote(parts.password or ""),
        "secure": secure,
        "autogenerate_session_id": False,
    }
    database = parts.path.lstrip("/") or DATABASE
    admin = clickhouse_connect.get_client(**connection)
    try:
        admin.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    finally:
        admin.close()
    return clickhouse_connect.get_client(database=database, **connection)


def _held_by_another_process(data_dir: str) -> bool:
    """True when another process holds ``data_dir`` (ClickHouse flocks its ``status`` file)."""
    status = Path(data_dir) / "status"
    try:
        with status.open("rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _open_error(url: str, exc: Exception) -> StoreError:
    """The Argus error for a store that could not be opened (the ClickHouse error at the edge)."""
    if url.startswith("chdb:") and _held_by_another_process(url.partition("://")[2]):
        return StoreLocked(
            f"cannot open the embedded store at {url.partition('://')[2]}: another process holds it "
            "(chDB allows one process per data dir); while `argus server` runs on it, "
            "reach the data through its API with --server"
        )
    if url.startswith("chdb:"):
        return StoreError(f"cannot open the embedded store {url}: {exc}")
    parts = urlsplit(url)
    return StoreError(f"cannot reach ClickHouse at {parts.hostname}:{parts.port}: {exc}")


#: ClickHouse's normal form of our TTL clause in ``system.tables.engine_full``.
_TTL_DAYS = re.compile(r"TTL stored_at \+ toIntervalDay\((\d+)\)")


def retention_statements(
    engine_full: Mapping[str, str],
    *,
    database: str = DATABASE,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    cluster: str | None = None,
) -> list[str]:
    """``ALTER TABLE … MODIFY TTL`` for each table whose TTL is not ``retention_days``.

    Args:
        engine_full: ``system.tables.engine_full`` by table name, for the tables that
            hold rows (``<name>_local`` with a cluster); absent tables and tables of
            other engines (Distributed) are skipped.
    """
    on_cluster = f" ON CLUSTER {cluster}" if cluster else ""
    statements = []
    for name in TABLES:
        local = f"{name}_local" if cluster else name
        engine = engine_full.get(local)
        if engine is None or "MergeTree" not in engine:
            continue
        found = _TTL_DAYS.search(engine)
        if found is None or int(found.group(1)) != retention_days:
            statements.append(
                f"ALTER TABLE {database}.{local}{on_cluster} "
                f"MODIFY TTL stored_at + INTERVAL {retention_days} DAY"
            )
    return statements


def apply_retention(
    store: Store, *, database: str = DATABASE, retention_days: int, cluster: str | None = None
) -> list[str]:
    """Make every table's TTL ``stored_at + retention_days``; return the ALTERs it ran.

    Tables created earlier with another ``--retention-days`` keep their data; ClickHouse
    applies the new TTL to existing parts as a mutation.

    Raises:
        StoreError: reading ``system.tables`` or an ALTER failed.
    """
    found = store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}", {"db": database}
    )
    names, engine_full = found.column("name").to_pylist(), found.column("engine_full").to_pylist()
    engines = {str(name): str(engine) for name, engine in zip(names, engine_full, strict=True)}
    statements = retention_statements(
        engines, database=database, retention_days=retention_days, cluster=cluster
    )
    for statement in statements:
        store.command(statement)
    return statements


def open_store(
    url: str,
    *,
    create: bool = True,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    cluster: str | None = None,
    timeout_s: int = DEFAULT_STORE_TIMEOUT_S,
    memory_bytes: int = DEFAULT_STORE_MEMORY_BYTES,
) -> ClickHouseStore:
    """Open the store at ``url`` and, with ``create``, create the schema if absent.

    Every call of the store carries ``timeout_s`` and ``memory_bytes`` (:class:`ClickHouseStore`).

    With ``create``, tables that exist already get the columns added since they were
    created (:func:`argus.schema.migration_statements`) and their retention TTL set to
    ``retention_days`` (see :func:`apply_retention`).

    Raises:
        ConfigError: the URL's scheme is not chdb, clickhouse or clickhouses;
            ``retention_days``, ``timeout_s`` or ``memory_bytes`` < 1.
        StoreLocked: a chDB data dir is held by another process.
        StoreError: the server cannot be reached or the DDL fails.
    """
    if retention_days < 1:
        raise ConfigError(f"retention must be at least 1 day, got {retention_days}")
    store = ClickHouseStore(url, timeout_s=timeout_s, memory_bytes=memory_bytes)
    if create:
        try:
            database = store.database
            for statement in create_statements(
                database=database, retention_days=retention_days, cluster=cluster
            ):
                store.command(statement)
            for statement in migration_statements(database=database, cluster=cluster):
                store.command(statement)
            apply_retention(store, database=database, retention_days=retention_days, cluster=cluster)
        except BaseException:
            store.close()
            raise
    return store


def given_conditions(terms: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The conditions of ``terms`` whose value is given (not None), and their query parameters.

    Each key is one condition with one parameter in ClickHouse's ``{name:Type}`` syntax
    (``"rank = {rank:UInt32}"``), each value what that parameter binds to; None leaves the
    condition out. For the filters of a read (:func:`argus.diagnosis.read_diagnoses`, the REST
    API's stack rows).

    Raises:
        ValueError: a key holds no ``{name:Type}`` parameter.
    """
    where: list[str] = []
    params: dict[str, Any] = {}
    for condition, value in terms.items():
        if value is None:
            continue
        named = re.search(r"\{(\w+):", condition)
        if named is None:
            raise ValueError(f"no {{name:Type}} parameter in the condition {condition!r}")
        where.append(condition)
        params[named.group(1)] = value
    return where, params
