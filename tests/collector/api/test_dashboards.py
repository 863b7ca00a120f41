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
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from argus.jobid import check_job_id
from argus.metrics import Metrics
from argus.schema import TABLES
from argus.store import Store
from synthetic.wire import insert_direct, synthetic_job

ROOT = Path(__file__).resolve().parents[3]
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


def _macros(sql: str, from_s: int, to_s: int) -> str:
    """Substitute the grafana-clickhouse-datasource macros as Grafana would."""
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)", rf"(\1 >= toDateTime({from_s}) AND \1 <= toDateTime({to_s}))", sql
    )
    return re.sub(
        r"\$__timeInterval\(([^)]+)\)", r"toStartOfInterval(toDateTime(\1), INTERVAL 1 second)", sql
    )


def _grafana_sql(sql: str, job_id: str, from_s: int, to_s: int) -> str:
    """Substitute the macros and variables as Grafana would, in each format Grafana documents:
    ``${var:sqlstring}`` quotes the value and doubles its ``'`` (nothing else), ``${var:percentencode}``
    percent-encodes all but ``A-Za-z0-9-_.~`` (JavaScript's strict ``encodeURIComponent``),
    ``${var:text}`` and ``$var`` give the value as is."""
    sql = _macros(sql, from_s, to_s)
    for name, value in (("job_id", job_id), ("phase", "forward")):
        sql = sql.replace(f"${{{name}:sqlstring}}", "'" + value.replace("'", "''") + "'")
        sql = sql.replace(f"${{{name}:percentencode}}", urllib.parse.quote(value, safe=""))
    assert "$" not in sql, sql
    return sql


#: A job id valid under the job-id rule that ends a ``sqlstring``-quoted string in ClickHouse
#: (``\\'`` is an escaped quote there) and injects a query.
HOSTILE_JOB_ID = "x\\' OR 1=1 UNION ALL SELECT name FROM system.tables -- "
#: Where a dashboard query names a variable, in either format.
_VARIABLE = re.compile(r"decodeURLComponent\('\$\{(\w+):percentencode\}'\)|\$\{(\w+):sqlstring\}")


def test_a_hostile_job_id_changes_no_dashboard_query(store: Store) -> None:
    """The newest job's id, put in each query as Grafana interpolates it, returns exactly what the
    query returns with the id bound as a real parameter: that job's rows, nothing injected."""
    check_job_id(HOSTILE_JOB_ID)
    insert_direct(store, "job-d", synthetic_job(world_size=6, steps=12, slow_rank=4))
    insert_direct(store, HOSTILE_JOB_ID, synthetic_job(world_size=3, steps=5, slow_rank=1))
    now_s = time.time_ns() // 10**9
    targets = _targets(_load("argus-clickhouse.json"), "grafana-clickhouse-datasource")
    picker = next(t["rawSql"] for t in targets if "$" not in t["rawSql"] and "__value" not in t["rawSql"])
    assert store.query(picker).column(0).to_pylist()[0] == HOSTILE_JOB_ID  # the newest job comes first
    own_rows = 0
    for target in targets:
        raw = _macros(target["rawSql"], now_s - 3600, now_s + 60)
        bound = _VARIABLE.sub(lambda m: "{" + (m.group(1) or m.group(2)) + ":String}", raw)
        expected = store.query(bound, {"job_id": HOSTILE_JOB_ID, "phase": "forward"}).to_pylist()
        got = store.query(_grafana_sql(target["rawSql"], HOSTILE_JOB_ID, now_s - 3600, now_s + 60))
        assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, expected)), target["rawSql"]
        own_rows += len(expected) if "job_id" in target["rawSql"] else 0
    assert own_rows > 0


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
