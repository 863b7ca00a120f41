"""`--cluster NAME` DDL as SQL text (no cluster at hand), checked by ClickHouse's own parser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from argus.schema import TABLES, create_statements
from argus.store import open_store, retention_statements


def _sql_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.fixture(scope="module")
def cluster_ddl() -> list[str]:
    return create_statements(cluster="prod", retention_days=14)


def test_every_table_has_a_replicated_local_table_and_a_distributed_one(cluster_ddl: list[str]) -> None:
    assert cluster_ddl[0] == "CREATE DATABASE IF NOT EXISTS argus ON CLUSTER prod"
    assert len(cluster_ddl) == 1 + 2 * len(TABLES)
    for name, table in TABLES.items():
        local = next(
            s for s in cluster_ddl if s.startswith(f"CREATE TABLE IF NOT EXISTS argus.{name}_local ")
        )
        dist = next(s for s in cluster_ddl if s.startswith(f"CREATE TABLE IF NOT EXISTS argus.{name} ON"))
        # The local table comes first: the Distributed one is created AS it.
        assert cluster_ddl.index(local) < cluster_ddl.index(dist)
        assert " ON CLUSTER prod (" in local
        engine = re.search(r"ENGINE = (\w+)\(", local)
        assert engine is not None and engine.group(1) == f"Replicated{table.engine.split('(')[0]}"
        assert "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'" in local
        assert "TTL stored_at + INTERVAL 14 DAY" in local
        assert "replicated_deduplication_window = " in local
        assert "non_replicated" not in local
        assert f"ORDER BY ({', '.join(table.order_by)})" in local
        assert dist == (
            f"CREATE TABLE IF NOT EXISTS argus.{name} ON CLUSTER prod AS argus.{name}_local\n"
            f"ENGINE = Distributed(prod, argus, {name}_local, cityHash64(job_id))"
        )


def test_cluster_ddl_parses(cluster_ddl: list[str], tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'parser'}", create=False)
    alters = retention_statements(
        {f"{n}_local": "ReplicatedMergeTree TTL stored_at + toIntervalDay(30)" for n in TABLES},
        retention_days=14,
        cluster="prod",
    )
    assert len(alters) == len(TABLES)
    try:
        for statement in [*cluster_ddl, *alters]:
            formatted = store.query(f"SELECT formatQuery({_sql_literal(statement)}) AS q").column("q")[0]
            assert "ON CLUSTER prod" in formatted.as_py()
    finally:
        store.close()


def test_single_node_ddl_has_no_cluster_parts() -> None:
    for statement in create_statements():
        assert "ON CLUSTER" not in statement
        assert "Replicated" not in statement
        assert "Distributed" not in statement
