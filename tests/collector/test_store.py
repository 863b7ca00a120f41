"""The store backends on a real engine: schema, inserts, parameters, deduplication, retention."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from argus.errors import ConfigError, StoreError, StoreLocked
from argus.schema import TABLES, WIRE_TABLES, wire_schema
from argus.store import Store, apply_retention, given_conditions, open_store, retention_statements
from tests.collector.wire import sample


def _with_job(data: pa.Table, job_id: str) -> pa.Table:
    return data.append_column("job_id", pa.array([job_id] * data.num_rows))


def _database(store: Store) -> str:
    return str(store.query("SELECT currentDatabase() AS db").column("db")[0].as_py())


def test_schema_has_every_table_and_column(store: Store) -> None:
    found = store.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() ORDER BY table, position"
    )
    columns: dict[str, list[str]] = {}
    for table, name in zip(found.column("table").to_pylist(), found.column("name").to_pylist(), strict=True):
        columns.setdefault(table, []).append(name)
    for name, table in TABLES.items():
        assert columns[name] == ["job_id", *table.column_names, "stored_at"]


@pytest.mark.parametrize("table", sorted(WIRE_TABLES))
def test_insert_and_query_every_wire_table(store: Store, table: str) -> None:
    sent = sample(table, n=4, salt=3)
    store.insert(table, _with_job(sent, "job-s"))
    names = ", ".join(f"`{n}`" for n in sent.column_names)
    got = store.query(
        f"SELECT {names} FROM {table} WHERE job_id = {{job:String}} ORDER BY {names}", {"job": "job-s"}
    )
    assert got.cast(wire_schema(table)).equals(sent)
    assert (
        store.query(f"SELECT count() AS n FROM {table} WHERE stored_at > now() - 60").column("n")[0].as_py()
        == 4
    )


def test_dedup_token_drops_a_repeated_insert(store: Store) -> None:
    data = _with_job(sample("steps", n=3), "job-d")
    store.insert("steps", data, dedup_token="agent-1:5")
    store.insert("steps", data, dedup_token="agent-1:5")
    assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 3
    # Same rows under another token (another agent or seq) are new rows.
    store.insert("steps", data, dedup_token="agent-1:6")
    assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 6


def test_bad_sql_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError):
        store.query("SELECT no_such_column FROM steps")
    with pytest.raises(StoreError):
        store.insert("no_such_table", _with_job(sample("steps"), "j"))


def test_retention_is_a_ttl_on_stored_at_and_follows_the_option(store_url: str) -> None:
    store = open_store(store_url, retention_days=30)
    db = _database(store)

    def ttl_days() -> set[str]:
        engines = store.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String}", {"db": db}
        ).column("engine_full")
        return {e.split(" TTL ", 1)[1].split(" SETTINGS", 1)[0] for e in engines.to_pylist()}

    try:
        store.insert("steps", _with_job(sample("steps", n=2), "job-r"))
        assert ttl_days() == {"stored_at + toIntervalDay(30)"}
        assert apply_retention(store, database=db, retention_days=30) == []
        changed = apply_retention(store, database=db, retention_days=7)
        assert len(changed) == len(TABLES)
        assert ttl_days() == {"stored_at + toIntervalDay(7)"}
        # The rows stored a moment ago are well inside 7 days: nothing dropped.
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 2
    finally:
        store.close()


def test_reopening_with_another_retention_alters_the_ttl(store_url: str) -> None:
    open_store(store_url, retention_days=30).close()
    store = open_store(store_url, retention_days=3)
    try:
        sql = "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = {t:String}"
        engine = store.query(sql, {"t": "kernel_events"}).column("engine_full")[0].as_py()
        assert "TTL stored_at + toIntervalDay(3)" in engine
    finally:
        store.close()


def test_retention_statements_for_a_cluster_alter_the_local_tables() -> None:
    replicated = "ReplicatedMergeTree(...) ORDER BY (job_id) TTL stored_at + toIntervalDay({}) SETTINGS x"
    engines = {
        "steps_local": replicated.format(30),
        "steps": "Distributed(prod, argus, steps_local, cityHash64(job_id))",
        "jobs_local": replicated.format(9),
    }
    assert retention_statements(engines, retention_days=9, cluster="prod") == [
        "ALTER TABLE argus.steps_local ON CLUSTER prod MODIFY TTL stored_at + INTERVAL 9 DAY"
    ]
    assert retention_statements(engines, retention_days=9) == []  # a Distributed table has no TTL


def test_bad_store_urls() -> None:
    with pytest.raises(ConfigError, match="unknown store URL"):
        open_store("postgres://x/y")
    with pytest.raises(ConfigError, match="names no data dir"):
        open_store("chdb://")
    with pytest.raises(ConfigError, match="retention"):
        open_store("chdb:///tmp/never-created", retention_days=0)


@pytest.mark.slow
def test_a_data_dir_held_by_a_running_server_is_locked(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    with pytest.raises(StoreLocked, match="another process holds it"):
        open_store(server.store_url)


@pytest.mark.timeout(120)
def test_threads_insert_and_query_at_once(store: Store) -> None:
    """chDB deadlocked two threads (one inserting from Arrow, one querying) without the store's lock."""
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(8):
                store.insert("kernel_events", _with_job(sample("kernel_events", n=2000, salt=i), f"job-{n}"))
                store.query(
                    "SELECT count() AS n FROM kernel_events WHERE job_id = {j:String}", {"j": f"job-{n}"}
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not any(t.is_alive() for t in threads), "threads stuck in the store"
    assert not errors
    assert store.query("SELECT count() AS n FROM kernel_events").column("n")[0].as_py() == 4 * 8 * 2000


def test_identical_plain_inserts_are_both_kept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without a token nothing is deduplicated, although every table keeps a dedup window."""
    import pyarrow as pa

    from argus.store import open_store

    store = open_store(f"chdb://{tmp_path / 'store'}")
    row = pa.table(
        {
            "job_id": ["j"],
            "rank": pa.array([0], pa.uint32()),
            "step": pa.array([1], pa.uint64()),
            "start_ns": pa.array([10], pa.int64()),
            "dur_ns": pa.array([5], pa.int64()),
        }
    )
    store.insert("steps", row)
    store.insert("steps", row)
    assert store.query("SELECT count() FROM steps").column(0)[0].as_py() == 2
    store.close()


def test_a_slow_read_beside_the_store_holds_back_none_of_its_calls(store: Store) -> None:
    """Issue 12 (ingest never starved by reads): the REST API and the analyzer read through
    ``store.beside()``; a 4 s read there leaves the store's own inserts and queries free."""
    reads = store.beside()
    try:
        done = threading.Event()

        def slow_read() -> None:
            reads.query("SELECT sleepEachRow(1) FROM numbers(4) SETTINGS max_block_size = 1")
            done.set()

        thread = threading.Thread(target=slow_read, daemon=True)
        thread.start()
        running = "SELECT count() AS n FROM system.processes WHERE query LIKE 'SELECT sleepEachRow%'"
        while not store.query(running).column("n")[0].as_py() and thread.is_alive():
            pass
        data = _with_job(sample("steps", n=3), "job-beside")
        store.insert("steps", data)
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 3
        assert not done.is_set(), "the store's calls waited for the slow read"
        thread.join(30)
        assert done.is_set()
        assert reads.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 3
    finally:
        reads.close()
    assert store.query("SELECT 1 AS one").column("one")[0].as_py() == 1, "closing the other closed the store"


def test_given_conditions_keep_only_the_filters_given() -> None:
    where, params = given_conditions({"rank = {rank:UInt32}": 0, "capture_id = {capture:String}": None})
    assert (where, params) == (["rank = {rank:UInt32}"], {"rank": 0})
    with pytest.raises(ValueError, match="no \\{name:Type\\} parameter"):
        given_conditions({"rank = 1": 1})
