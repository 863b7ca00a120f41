"""The ClickHouse store behind one interface: embedded (chDB) or a server (clickhouse-connect).

Both backends run the same SQL: statements name tables without a database
(each backend makes ``argus`` the current database) and bind parameters with
ClickHouse's server-side ``{name:Type}`` syntax.

URLs:
    ``chdb:///abs/path``, ``chdb://./rel/path`` or ``chdb://rel/path`` — embedded;
    everything after ``chdb://`` is the data dir. One process owns a data dir.
    ``clickhouse://user:pass@host:port/db`` (``clickhouses://`` for HTTPS) — a
    ClickHouse server over its HTTP interface; ``db`` defaults to ``argus``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from argus.config import DATABASE, DEFAULT_RETENTION_DAYS
from argus.errors import ConfigError, StoreError, StoreLocked
from argus.schema import TABLES, create_statements, migration_statements

__all__ = [
    "ChdbStore",
    "ClickHouseServerStore",
    "Store",
    "apply_retention",
    "open_store",
    "retention_statements",
]


class Store(Protocol):
    """What every part needs of ClickHouse. Implementations are thread-safe."""

    url: str

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        """Insert ``data`` (columns named as the table's, ``stored_at`` excluded) into ``table``.

        With ``dedup_token``, ClickHouse drops the insert if a block with the same
        token was inserted into ``table`` before (``insert_deduplication_token``).
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


def _columns(data: pa.Table) -> str:
    return ", ".join(f"`{name}`" for name in data.column_names)


class ChdbStore:
    """Embedded ClickHouse through chDB; one instance per data dir per process.

    Calls are serialized by a Python lock. chDB's connection takes a native mutex
    while holding the GIL, and a query reading Python objects (``Python(data)``)
    takes the GIL while holding that mutex: two threads calling at once deadlock
    (seen with chDB 4.4 under concurrent gRPC streams). Waiting on a Python lock
    releases the GIL, so serializing here is safe; chDB serializes per connection anyway.
    """

    _open: ClassVar[dict[Path, ChdbStore]] = {}
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path) -> None:
        import chdb

        self.path = path
        self.url = f"chdb://{path}"
        self._lock = threading.Lock()
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = chdb.connect(str(path))
        except Exception as exc:
            raise StoreLocked(
                f"cannot open the embedded store at {path}: another process holds it "
                "(chDB allows one process per data dir); while `argus server` runs on it, "
                "reach the data through its API with --server"
            ) from exc
        self._run(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        self._run(f"USE {DATABASE}")

    @classmethod
    def open(cls, path: Path) -> ChdbStore:
        """The process's store for ``path``, opened on first use."""
        key = path.resolve()
        with cls._open_lock:
            store = cls._open.get(key)
            if store is None:
                store = cls._open[key] = cls(key)
            return store

    def _run(self, sql: str, fmt: str = "CSV", parameters: Mapping[str, Any] | None = None) -> Any:
        # chDB reads each value as ClickHouse's escaped text (tab, newline, backslash escaped;
        # arrays as literals), as the HTTP interface does: format them as clickhouse-connect does.
        from clickhouse_connect.driver.binding import format_bind_value

        params = {k: format_bind_value(v) for k, v in (parameters or {}).items()}
        try:
            # One call at a time (see the class docstring). This also keeps two threads'
            # parameters apart: chDB holds them in the connection's shared context.
            with self._lock:
                if not params:
                    return self._conn.query(sql, fmt)
                return self._conn.query(sql, fmt, params=params)
        except Exception as exc:
            raise StoreError(f"chDB: {exc}") from exc

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        settings = " SETTINGS insert_deduplicate = 0"
        if dedup_token is not None:
            settings = " SETTINGS insert_deduplication_token = {_argus_token:String}"
        # chDB's Python() table function reads the local variable `data` by name.
        self._run(
            f"INSERT INTO {table} ({_columns(data)}) SELECT * FROM Python(data){settings}",
            parameters={"_argus_token": dedup_token} if dedup_token is not None else None,
        )

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        result = self._run(sql, "ArrowTable", parameters)
        if not isinstance(result, pa.Table):
            raise StoreError(f"chDB returned {type(result).__name__}, expected an Arrow table")
        return result

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        self._run(sql, "CSV", parameters)

    def close(self) -> None:
        with self._open_lock:
            self._open.pop(self.path, None)
        self._conn.close()


class ClickHouseServerStore:
    """A ClickHouse server through clickhouse-connect (HTTP interface)."""

    def __init__(self, url: str) -> None:
        import clickhouse_connect

        parts = urlsplit(url)
        self.url = url
        self.database = parts.path.lstrip("/") or DATABASE
        try:
            admin = clickhouse_connect.get_client(
                host=parts.hostname or "localhost",
                port=parts.port or (8443 if parts.scheme == "clickhouses" else 8123),
                username=unquote(parts.username or "default"),
                password=unquote(parts.password or ""),
                secure=parts.scheme == "clickhouses",
                autogenerate_session_id=False,
            )
            admin.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            admin.close()
            self._client = clickhouse_connect.get_client(
                host=parts.hostname or "localhost",
                port=parts.port or (8443 if parts.scheme == "clickhouses" else 8123),
                username=unquote(parts.username or "default"),
                password=unquote(parts.password or ""),
                database=self.database,
                secure=parts.scheme == "clickhouses",
                autogenerate_session_id=False,
            )
        except Exception as exc:
            raise StoreError(f"cannot reach ClickHouse at {parts.hostname}:{parts.port}: {exc}") from exc

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        settings: dict[str, Any] = (
            {"insert_deduplication_token": dedup_token}
            if dedup_token is not None
            else {"insert_deduplicate": 0}
        )
        try:
            self._client.insert_arrow(table, data, settings=settings)
        except Exception as exc:
            raise StoreError(f"ClickHouse: {exc}") from exc

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        try:
            return self._client.query_arrow(sql, parameters=dict(parameters or {}))
        except Exception as exc:
            raise StoreError(f"ClickHouse: {exc}") from exc

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        try:
            self._client.command(sql, parameters=dict(parameters or {}))
        except Exception as exc:
            raise StoreError(f"ClickHouse: {exc}") from exc

    def close(self) -> None:
        self._client.close()


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
) -> Store:
    """Open the store at ``url`` and, with ``create``, create the schema if absent.

    With ``create``, tables that exist already get the columns added since they were
    created (:func:`argus.schema.migration_statements`) and their retention TTL set to
    ``retention_days`` (see :func:`apply_retention`).

    Raises:
        ConfigError: the URL's scheme is not chdb, clickhouse or clickhouses;
            ``retention_days`` < 1.
        StoreLocked: a chDB data dir is held by another process.
        StoreError: the server cannot be reached or the DDL fails.
    """
    if retention_days < 1:
        raise ConfigError(f"retention must be at least 1 day, got {retention_days}")
    scheme, sep, rest = url.partition("://")
    store: Store
    database = DATABASE
    if scheme == "chdb" and sep:
        if not rest:
            raise ConfigError(f"store URL {url!r} names no data dir; e.g. chdb://./argus-data")
        store = ChdbStore.open(Path(rest))
    elif scheme in {"clickhouse", "clickhouses"} and sep:
        server = ClickHouseServerStore(url)
        store, database = server, server.database
    else:
        raise ConfigError(
            f"unknown store URL {url!r}: use chdb:///path or clickhouse://user:pass@host:port/db"
        )
    if create:
        try:
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
