"""Table definitions: wire schemas and the DDL for a single node and a cluster."""

from __future__ import annotations

import pyarrow as pa
import pytest

from argus.proto import collector_pb2
from argus.schema import TABLES, WIRE_TABLES, create_statements, wire_schema


def test_every_wire_table_has_a_proto_enum() -> None:
    names = {n.lower() for n in collector_pb2.Table.keys() if n != "TABLE_UNSPECIFIED"}  # noqa: SIM118
    assert names == set(WIRE_TABLES)


def test_design_tables_exist() -> None:
    design = {
        "jobs",
        "ranks",
        "steps",
        "phases",
        "collectives",
        "kernel_summaries",
        "kernel_events",
        "host_samples",
        "diagnoses",
    }
    assert design <= set(TABLES)


def test_wire_schema_has_no_job_id() -> None:
    schema = wire_schema("steps")
    assert schema.names == ["rank", "step", "start_ns", "dur_ns"]
    assert schema.field("dur_ns").type == pa.int64()


def test_single_node_ddl() -> None:
    ddl = create_statements(retention_days=7)
    steps = next(s for s in ddl if ".steps " in s)
    assert "ENGINE = MergeTree" in steps
    assert "TTL stored_at + INTERVAL 7 DAY" in steps
    assert "non_replicated_deduplication_window" in steps
    diagnoses = next(s for s in ddl if ".diagnoses " in s)
    assert "ReplacingMergeTree(updated_ns)" in diagnoses


def test_cluster_ddl() -> None:
    ddl = create_statements(cluster="prod", retention_days=30)
    assert ddl[0] == "CREATE DATABASE IF NOT EXISTS argus ON CLUSTER prod"
    local = next(s for s in ddl if ".steps_local " in s)
    assert "ON CLUSTER prod" in local
    assert "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')" in local
    assert "replicated_deduplication_window" in local
    dist = next(s for s in ddl if ".steps ON CLUSTER" in s)
    assert "ENGINE = Distributed(prod, argus, steps_local, cityHash64(job_id))" in dist
    diag = next(s for s in ddl if ".diagnoses_local " in s)
    assert "ReplicatedReplacingMergeTree(" in diag and diag.count("updated_ns") >= 2


def test_bad_retention() -> None:
    with pytest.raises(ValueError, match="retention_days"):
        create_statements(retention_days=0)
