"""Build the Grafana dashboards of this folder (JSON, importable through Grafana's UI or provisioning).

    python dashboards/build.py           # rewrite the JSON files
    python dashboards/build.py --check   # exit 1 when a checked-in file is stale

- ``argus-prometheus.json`` — over Argus's Prometheus metrics (any store): jobs by status,
  straggler scores of the top suspects, open diagnoses, ingest, rejections, agent drops,
  analysis lag.
- ``argus-clickhouse.json`` — over the ClickHouse tables through the official Grafana
  ClickHouse datasource (``grafana-clickhouse-datasource``), for server deployments: job
  overview, rank × time heatmaps of step, busy and phase time, the diagnoses table.

Both declare their datasource as an ``__inputs`` entry, so Grafana asks for it on import.
Variables enter SQL only as ``decodeURLComponent('${var:percentencode}')``: Grafana percent-encodes
every character but ``A-Z a-z 0-9 - _ . ~``, so no value (a stored job id, a link's ``var-job_id``)
can end the string. ``${var:sqlstring}`` cannot do that: it doubles ``'`` but leaves ``\\``, which
ClickHouse reads as an escape (``x\\' OR 1=1 --`` is a valid job id).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["clickhouse_dashboard", "main", "outputs", "prometheus_dashboard"]

HERE = Path(__file__).resolve().parent
PROM = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
CH = {"type": "grafana-clickhouse-datasource", "uid": "${DS_CLICKHOUSE}"}
#: grafana-clickhouse-datasource query formats.
CH_TIME_SERIES, CH_TABLE = 0, 1


def _panel(
    pid: int,
    title: str,
    kind: str,
    pos: tuple[int, int, int, int],
    targets: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    x, y, w, h = pos
    return {
        "id": pid,
        "title": title,
        "type": kind,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "datasource": targets[0]["datasource"],
        "targets": targets,
        **extra,
    }


def _prom(expr: str, legend: str = "", ref: str = "A") -> dict[str, Any]:
    return {"refId": ref, "datasource": PROM, "expr": expr, "legendFormat": legend}


def _sql(sql: str, fmt: int = CH_TABLE, ref: str = "A") -> dict[str, Any]:
    return {
        "refId": ref,
        "datasource": CH,
        "editorType": "sql",
        "queryType": "sql",
        "format": fmt,
        "rawSql": sql,
    }


def _unit(unit: str, **defaults: Any) -> dict[str, Any]:
    return {"defaults": {"unit": unit, **defaults}, "overrides": []}


def _inputs(name: str, label: str, plugin: str, plugin_name: str) -> list[dict[str, str]]:
    return [
        {"name": name, "label": label, "type": "datasource", "pluginId": plugin, "pluginName": plugin_name}
    ]


def _dashboard(
    uid: str, title: str, inputs: list[dict[str, str]], panels: list[dict[str, Any]], variables: list[Any]
) -> dict[str, Any]:
    return {
        "__inputs": inputs,
        "uid": uid,
        "title": title,
        "tags": ["argus"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": variables},
        "panels": panels,
    }


def prometheus_dashboard() -> dict[str, Any]:
    """Job overview over the Prometheus metrics of docs/design.md §9.3."""
    rate = "[$__rate_interval]"
    job_var = {
        "name": "job_id",
        "label": "job",
        "type": "query",
        "datasource": PROM,
        "query": {"query": "label_values(argus_step_time_seconds, job_id)", "refId": "job_id"},
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "refresh": 2,
    }
    threshold = {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
    }
    panels = [
        _panel(1, "Running jobs", "stat", (0, 0, 4, 4), [_prom('max(argus_jobs{status="running"})')]),
        _panel(
            2,
            "Silent jobs (ranks stopped reporting without exiting)",
            "stat",
            (4, 0, 5, 4),
            [_prom('max(argus_jobs{status="unknown"})')],
        ),
        _panel(
            3,
            "Open diagnoses",
            "stat",
            (9, 0, 5, 4),
            [_prom('sum(max by (job_id, cause) (argus_diagnosis_active{job_id=~"$job_id"}))')],
        ),
        _panel(
            4,
            "Analysis lag",
            "stat",
            (14, 0, 5, 4),
            [_prom("max(argus_analysis_lag_seconds)")],
            fieldConfig=_unit("s"),
        ),
        _panel(
            5,
            "Since last stored batch",
            "stat",
            (19, 0, 5, 4),
            [_prom("time() - max(argus_last_ingest_timestamp_seconds)")],
            fieldConfig=_unit("s"),
        ),
        _panel(
            6,
            "Straggler score of flagged ranks and top suspects (>= 1: detected)",
            "timeseries",
            (0, 4, 12, 9),
            [
                _prom(
                    'max by (job_id, rank) (argus_straggler_score{job_id=~"$job_id"})',
                    "{{job_id}} rank {{rank}}",
                )
            ],
            fieldConfig=_unit("none", thresholds=threshold, custom={"thresholdsStyle": {"mode": "line"}}),
        ),
        _panel(
            7,
            "Open diagnoses by job and cause",
            "timeseries",
            (12, 4, 12, 9),
            [
                _prom(
                    'max by (job_id, cause) (argus_diagnosis_active{job_id=~"$job_id"})',
                    "{{job_id}} {{cause}}",
                )
            ],
            fieldConfig=_unit("none"),
        ),
        _panel(
            8,
            "Ingested rows by table",
            "timeseries",
            (0, 13, 8, 8),
            [_prom(f"sum by (table) (rate(argus_ingest_rows_total{rate}))", "{{table}}")],
            fieldConfig=_unit("rowsps"),
        ),
        _panel(
            9,
            "Batches by status",
            "timeseries",
            (8, 13, 8, 8),
            [
                _prom(f"sum by (status) (rate(argus_ingest_batches_total{rate}))", "{{status}}"),
                _prom(f"sum(rate(argus_ingest_bytes_total{rate}))", "payload bytes/s", ref="B"),
            ],
            fieldConfig=_unit("reqps"),
        ),
        _panel(
            10,
            "Rejected batches and dropped events",
            "timeseries",
            (16, 13, 8, 8),
            [
                _prom(f"sum by (code) (rate(argus_ingest_rejected_total{rate}))", "rejected {{code}}"),
                _prom(f"sum(rate(argus_agent_dropped_events_total{rate}))", "dropped events", ref="B"),
            ],
            fieldConfig=_unit("ops"),
        ),
        _panel(
            11,
            "Mean step time by job",
            "timeseries",
            (0, 21, 24, 8),
            [_prom('max by (job_id) (argus_step_time_seconds{job_id=~"$job_id"})', "{{job_id}}")],
            fieldConfig=_unit("s"),
        ),
    ]
    inputs = _inputs("DS_PROMETHEUS", "Prometheus", "prometheus", "Prometheus")
    return _dashboard("argus-prometheus", "Argus — jobs and service", inputs, panels, [job_var])


#: The selected job and phase in SQL: percent-encoded by Grafana, decoded by ClickHouse (module doc).
_JOB = "decodeURLComponent('${job_id:percentencode}')"
_PHASE_NAME = "decodeURLComponent('${phase:percentencode}')"
# Rows are rank ranges so a 10,000-rank job draws at most about 128 of them.
_GROUP = f"(intDiv((SELECT max(rank) FROM argus.steps WHERE job_id = {_JOB}), 128) + 1)"
_ROW = f"intDiv(rank, {_GROUP}) * {_GROUP}"


def _heatmap_sql(per_step: str) -> str:
    return (
        "SELECT $__timeInterval(t) AS time, concat('rank ', leftPad(toString(row), 5, '0')) AS ranks, "
        "max(ms) AS value\nFROM (\n"
        f"  SELECT fromUnixTimestamp64Nano(s) AS t, {_ROW} AS row, d / 1e6 AS ms\n"
        f"  FROM ({per_step})\n"
        ")\nWHERE $__timeFilter(t)\nGROUP BY time, ranks\nORDER BY time"
    )


_STEP = (
    "SELECT rank, step, min(start_ns) AS s, sum(dur_ns) AS d FROM argus.steps "
    f"WHERE job_id = {_JOB} GROUP BY rank, step"
)
_PHASE = (
    "SELECT rank, step, min(start_ns) AS s, sum(dur_ns) AS d FROM argus.phases "
    f"WHERE job_id = {_JOB} AND phase = {_PHASE_NAME} GROUP BY rank, step"
)
_BUSY = (
    "SELECT st.rank AS rank, st.step AS step, st.s AS s, st.d - w.wait AS d FROM ("
    + _STEP
    + ") AS st LEFT JOIN (SELECT c.rank AS rank, c.step AS step, "
    "sum(greatest(l.last_arrival - c.issue_ns, 0)) AS wait FROM argus.collectives AS c "
    "INNER JOIN (SELECT process_group, seq, max(issue_ns) AS last_arrival FROM argus.collectives "
    f"WHERE job_id = {_JOB} GROUP BY process_group, seq) AS l "
    "ON c.process_group = l.process_group AND c.seq = l.seq "
    f"WHERE c.job_id = {_JOB} GROUP BY c.rank, c.step) AS w "
    "ON st.rank = w.rank AND st.step = w.step"
)


def _heatmap_panel(pid: int, title: str, pos: tuple[int, int, int, int], per_step: str) -> dict[str, Any]:
    return _panel(
        pid,
        title,
        "heatmap",
        pos,
        [_sql(_heatmap_sql(per_step), CH_TIME_SERIES)],
        options={
            "calculate": False,
            "yAxis": {"axisPlacement": "left", "reverse": True},
            "rowsFrame": {"layout": "auto"},
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "cellGap": 1,
            "tooltip": {"show": True, "yHistogram": False},
        },
        fieldConfig=_unit("ms"),
    )


def clickhouse_dashboard() -> dict[str, Any]:
    """Job overview, rank × time heatmaps and diagnoses over the ClickHouse tables."""
    job_var = {
        "name": "job_id",
        "label": "job",
        "type": "query",
        "datasource": CH,
        "query": "SELECT job_id FROM argus.ranks GROUP BY job_id ORDER BY min(time_ns) DESC LIMIT 500",
        "refresh": 2,
    }
    phase_var = {
        "name": "phase",
        "type": "custom",
        "query": "data,forward,backward,optimizer",
        "current": {"text": "forward", "value": "forward"},
        "options": [
            {"text": p, "value": p, "selected": p == "forward"}
            for p in ("data", "forward", "backward", "optimizer")
        ],
    }
    jobs_sql = (
        "SELECT r.job_id AS job, r.world_size AS world_size, r.ranks_attached AS ranks_attached,\n"
        "  r.ranks_exited AS ranks_exited, r.ranks_failed AS ranks_failed, r.hosts AS hosts,\n"
        "  r.first_attach AS first_attach, r.last_event AS last_event, d.open AS open_diagnoses\n"
        "FROM (\n"
        "  SELECT job_id, max(world_size) AS world_size,\n"
        "    uniqExactIf(rank, event = 'attach') AS ranks_attached,\n"
        "    uniqExactIf(rank, event = 'exit') AS ranks_exited,\n"
        "    uniqExactIf(rank, event = 'exit' AND exit_code != 0) AS ranks_failed,\n"
        "    uniqExact(host) AS hosts,\n"
        "    fromUnixTimestamp64Nano(min(time_ns)) AS first_attach,"
        " fromUnixTimestamp64Nano(max(time_ns)) AS last_event\n"
        "  FROM argus.ranks GROUP BY job_id\n"
        ") AS r\nLEFT JOIN (\n"
        "  SELECT job_id, count() AS open FROM argus.diagnoses FINAL WHERE state = 'open' GROUP BY job_id\n"
        ") AS d ON r.job_id = d.job_id\n"
        "WHERE $__timeFilter(r.last_event)\nORDER BY first_attach DESC\nLIMIT 200"
    )
    step_sql = (
        "SELECT $__timeInterval(t) AS time, max(ms) AS slowest_rank_ms, quantile(0.5)(ms) AS median_rank_ms\n"
        "FROM (SELECT fromUnixTimestamp64Nano(start_ns) AS t, dur_ns / 1e6 AS ms FROM argus.steps"
        f" WHERE job_id = {_JOB})\nWHERE $__timeFilter(t)\nGROUP BY time\nORDER BY time"
    )
    diagnoses_sql = (
        "SELECT state, cause, rank, arrayStringConcat(arrayMap(r -> toString(r), ranks), ',') AS ranks,\n"
        "  process_group, phase, kernel, round(score, 2) AS score, round(slowdown_pct, 1) AS slowdown_pct,\n"
        "  fromUnixTimestamp64Nano(first_window_ns) AS first_seen, fromUnixTimestamp64Nano(last_window_ns)"
        " AS last_seen,\n  evidence, id\n"
        f"FROM argus.diagnoses FINAL\nWHERE job_id = {_JOB}\n"
        "ORDER BY state = 'open' DESC, last_window_ns DESC\nLIMIT 500"
    )
    panels = [
        _panel(1, "Jobs", "table", (0, 0, 24, 7), [_sql(jobs_sql)]),
        _panel(
            2,
            "Step time of job ${job_id:text}: slowest and median rank",
            "timeseries",
            (0, 7, 24, 7),
            [_sql(step_sql, CH_TIME_SERIES)],
            fieldConfig=_unit("ms"),
        ),
        _heatmap_panel(3, "Busy time per rank (step minus collective wait), ms", (0, 14, 12, 10), _BUSY),
        _heatmap_panel(4, "Step time per rank, ms", (12, 14, 12, 10), _STEP),
        _heatmap_panel(5, "Phase $phase time per rank, ms", (0, 24, 24, 10), _PHASE),
        _panel(6, "Diagnoses of job ${job_id:text}", "table", (0, 34, 24, 10), [_sql(diagnoses_sql)]),
    ]
    inputs = _inputs("DS_CLICKHOUSE", "ClickHouse", "grafana-clickhouse-datasource", "ClickHouse")
    return _dashboard(
        "argus-clickhouse", "Argus — ranks and diagnoses (ClickHouse)", inputs, panels, [job_var, phase_var]
    )


def outputs() -> dict[Path, str]:
    """Dashboard file → its JSON text."""
    return {
        HERE / "argus-prometheus.json": json.dumps(prometheus_dashboard(), indent=2) + "\n",
        HERE / "argus-clickhouse.json": json.dumps(clickhouse_dashboard(), indent=2) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = [p for p, text in outputs().items() if args.check and (not p.exists() or p.read_text() != text)]
    if not args.check:
        for path, text in outputs().items():
            path.write_text(text)
    for path in stale:
        print(f"{path} is stale: run python dashboards/build.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
