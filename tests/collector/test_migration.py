"""Schema changes migrate: a store made before a column existed opens and takes new batches,
and a batch from an agent that predates the column stores with the column's default."""

from __future__ import annotations

import pyarrow as pa

from argus.collector import ingest
from argus.config import DATABASE
from argus.schema import TABLES, create_statements, migration_statements, wire_schema
from argus.store import open_store
from tests.collector.wire import batch, sample

#: Columns added after their table first shipped (they carry a default).
ADDED = {t.name: [c.name for c in t.columns if c.default is not None] for t in TABLES.values()}


def _old_schema_statements() -> list[str]:
    """The CREATE statements with every later-added column left out, as an older Argus made them."""
    out = []
    for statement in create_statements():
        old = statement
        for table, columns in ADDED.items():
            if f".{table} (" not in old:
                continue
            for column in columns:
                ddl = next(c.ddl for c in TABLES[table].columns if c.name == column)
                old = old.replace(f"    {ddl},\n", "")
        out.append(old)
    return out


def _columns(store, table: str) -> list[str]:  # type: ignore[no-untyped-def]
    found = store.query(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "ORDER BY position",
        {"t": table},
    )
    return [str(n) for n in found.column("name").to_pylist()]


def test_a_store_created_before_a_column_gets_it_on_open_and_old_rows_read_its_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert ADDED["collectives"] == ["peer", "overlapped", "wait_ns"]
    url = f"chdb://{tmp_path / 'store'}"
    old = open_store(url, create=False)
    try:
        for statement in _old_schema_statements():
            old.command(statement)
        assert "peer" not in _columns(old, "collectives")
        rows = sample("collectives", n=3).drop_columns(ADDED["collectives"])
        old.insert("collectives", rows.append_column("job_id", pa.array(["old"] * 3)))
    finally:
        old.close()

    store = open_store(url)
    try:
        assert _columns(store, "collectives") == ["job_id", *TABLES["collectives"].column_names, "stored_at"]
        got = store.query("SELECT peer FROM collectives WHERE job_id = 'old'").column("peer").to_pylist()
        assert got == [-1, -1, -1]
        # A new batch with the column, and one from an older agent without it, both store.
        new = ingest.decode(batch("collectives", sample("collectives", n=2, salt=9), seq=1, job_id="new"))
        older = ingest.decode(
            batch(
                "collectives", sample("collectives", n=2, salt=5).drop_columns(["peer"]), seq=2, job_id="new"
            )
        )
        assert older.data.schema == wire_schema("collectives")
        outcomes = ingest.write_group(store, [new, older])
        assert [o.rows for o in outcomes] == [2, 2]  # type: ignore[union-attr]
        peers = store.query("SELECT peer FROM collectives WHERE job_id = 'new' ORDER BY peer").column("peer")
        assert sorted(peers.to_pylist()) == [
            -1,
            -1,
            *sorted(sample("collectives", n=2, salt=9)["peer"].to_pylist()),
        ]
        # Opening again changes nothing (the statements are idempotent).
        store.close()
        store = open_store(url)
        assert _columns(store, "collectives")[-4:] == ["peer", "overlapped", "wait_ns", "stored_at"]
    finally:
        store.close()


def test_migration_statements_add_each_defaulted_column_after_its_predecessor() -> None:
    plain = migration_statements()
    assert (
        f"ALTER TABLE {DATABASE}.collectives ADD COLUMN IF NOT EXISTS `peer` Int32 DEFAULT -1 AFTER `dur_ns`"
        in plain
    )
    cluster = migration_statements(cluster="c1")
    assert any(
        s.startswith(f"ALTER TABLE {DATABASE}.collectives_local ON CLUSTER c1 ADD COLUMN") for s in cluster
    )
    assert any(s.startswith(f"ALTER TABLE {DATABASE}.collectives ON CLUSTER c1 ADD COLUMN") for s in cluster)


def test_a_store_made_before_graph_columns_gets_them_and_old_kernel_batches_store_with_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert ADDED["kernel_events"] == ["graph_id", "graph_node_id"]
    assert ADDED["kernel_summaries"] == ["graph_id", "graph_node_id"]
    url = f"chdb://{tmp_path / 'store'}"
    old = open_store(url, create=False)
    try:
        for statement in _old_schema_statements():
            old.command(statement)
        assert "graph_id" not in _columns(old, "kernel_events")
        rows = sample("kernel_events", n=2).drop_columns(["graph_id", "graph_node_id"])
        old.insert("kernel_events", rows.append_column("job_id", pa.array(["old"] * 2)))
    finally:
        old.close()
    store = open_store(url)
    try:
        for table in ("kernel_events", "kernel_summaries"):
            assert _columns(store, table) == ["job_id", *TABLES[table].column_names, "stored_at"]
        got = store.query("SELECT graph_id, graph_node_id FROM kernel_events WHERE job_id = 'old'")
        assert got.column("graph_id").to_pylist() == [0, 0] and got.column("graph_node_id").to_pylist() == [
            0,
            0,
        ]
        older = sample("kernel_summaries", n=3, salt=4).drop_columns(["graph_id", "graph_node_id"])
        newer = sample("kernel_summaries", n=2, salt=8)
        outcomes = ingest.write_group(
            store,
            [
                ingest.decode(batch("kernel_summaries", older, seq=1, job_id="k")),
                ingest.decode(batch("kernel_summaries", newer, seq=2, job_id="k")),
            ],
        )
        assert [o.rows for o in outcomes] == [3, 2]  # type: ignore[union-attr]
        graphs = store.query("SELECT graph_id FROM kernel_summaries WHERE job_id = 'k'").column("graph_id")
        assert sorted(graphs.to_pylist()) == sorted([0, 0, 0, *newer["graph_id"].to_pylist()])
    finally:
        store.close()
