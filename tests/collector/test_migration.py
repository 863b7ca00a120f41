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
    assert ADDED["collectives"] == ["peer", "overlapped"]
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
        assert older.data.schema.remove(older.data.schema.get_field_index("job_id")) == wire_schema(
            "collectives"
        )
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
        assert _columns(store, "collectives")[-3:] == ["peer", "overlapped", "stored_at"]
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
