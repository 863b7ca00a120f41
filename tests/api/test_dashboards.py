"""dashboards/: the JSON parses, is what build.py makes, and every metric, table and column exists.

Metric names are checked against a real server's registry and every PromQL expression is
parsed by promtool; every ClickHouse query runs (Grafana macros substituted) against a
real chDB store holding a job, and returns rows.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from argus.metrics import Metrics
from argus.schema import TABLES
from argus.store import Store
from synthetic.wire import insert_direct, synthetic_job

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
FILES = ("argus-prometheus.json", "argus-clickhouse.json")


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((DASHBOARDS / name).read_text()))


def _targets(dashboard: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    targets = [t for p in dashboard["panels"] for t in p["targets"] if t["datasource"]["type"] == kind]
    for var in dashboard["templating"]["list"]:
        if var.get("datasource", {}).get("type") == kind:
            query = var["query"]
            targets.append({"expr": query["query"]} if isinstance(query, dict) else {"rawSql": query})
    return targets


def test_dashboards_are_built_by_build_py() -> None:
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / "build.py"), "--check"], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", FILES)
def test_dashboard_parses(name: str) -> None:
    dashboard = _load(name)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 5
    assert dashboard["__inputs"][0]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}


def _metric_names() -> set[str]:
    names = set()
    for metric in Metrics().registry.collect():
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
    return names


def test_prometheus_dashboard_uses_only_metrics_the_server_exports() -> None:
    exported = _metric_names()
    used = set()
    for target in _targets(_load("argus-prometheus.json"), "prometheus"):
        used |= set(re.findall(r"\bargus_[a-z_]+\b", target["expr"]))
    assert used, "no metric found"
    assert used <= exported, used - exported
    for needed in ("argus_straggler_score", "argus_diagnosis_active", "argus_ingest_rejected_total"):
        assert needed in used


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)"
)
def test_prometheus_dashboard_expressions_parse(tmp_path: Path) -> None:
    rules = []
    for i, target in enumerate(_targets(_load("argus-prometheus.json"), "prometheus")):
        expr = target["expr"]
        if expr.startswith("label_values("):
            expr = expr[len("label_values(") :].split(",")[0]
        expr = expr.replace("$__rate_interval", "1m").replace("$job_id", ".*")
        rules.append({"record": f"argus:dashboard_{i}", "expr": expr})
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", "r.yml"], check=False, cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _grafana_sql(sql: str, job_id: str, from_s: int, to_s: int) -> str:
    """Substitute the grafana-clickhouse-datasource macros and variables as Grafana would."""
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)", rf"(\1 >= toDateTime({from_s}) AND \1 <= toDateTime({to_s}))", sql
    )
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)", r"toStartOfInterval(toDateTime(\1), INTERVAL 1 second)", sql)
    sql = sql.replace("${job_id}", job_id).replace("${phase}", "forward")
    assert "$" not in sql, sql
    return sql


def test_clickhouse_dashboard_queries_run_on_the_real_schema(store: Store) -> None:
    tables = synthetic_job(world_size=6, steps=12, slow_rank=4)
    insert_direct(store, "job-d", tables)
    now = time.time_ns()
    evidence = json.dumps({"forward_ms": {"rank": 30.0, "peers_median": 10.0}})
    store.insert(
        "diagnoses",
        pa.table(
            {
                "job_id": ["job-d"],
                "id": ["diag-1"],
                "rank": pa.array([4], pa.int32()),
                "ranks": pa.array([[4]], pa.list_(pa.uint32())),
                "process_group": [None],
                "cause": ["compute"],
                "phase": ["forward"],
                "kernel": [None],
                "score": [2.5],
                "slowdown_pct": [30.0],
                "first_window_ns": [now - 10**10],
                "last_window_ns": [now],
                "state": ["open"],
                "evidence": [evidence],
                "updated_ns": [now],
            }
        ),
    )
    dashboard = _load("argus-clickhouse.json")
    targets = _targets(dashboard, "grafana-clickhouse-datasource")
    assert len(targets) >= 7
    used_tables = set()
    for target in targets:
        used_tables |= set(re.findall(r"\bargus\.(\w+)", target["rawSql"]))
        sql = _grafana_sql(target["rawSql"], "job-d", now // 10**9 - 3600, now // 10**9 + 60)
        result = store.query(sql)
        assert result.num_rows > 0, target["rawSql"]
    assert used_tables <= set(TABLES), used_tables - set(TABLES)
    assert {"ranks", "steps", "phases", "collectives", "diagnoses"} <= used_tables
    # The busy-time heatmap puts the slow rank's row above its peers.
    busy = next(t for p in dashboard["panels"] if p["title"].startswith("Busy") for t in p["targets"])
    rows = store.query(
        _grafana_sql(busy["rawSql"], "job-d", now // 10**9 - 3600, now // 10**9 + 60)
    ).to_pylist()
    slowest = max(rows, key=lambda r: r["value"])
    assert slowest["ranks"] == "rank 00004"
