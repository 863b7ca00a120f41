"""``argus_analysis_lag_seconds`` counts only jobs with data waiting, and deploy/'s ArgusAnalysisLagging
alert (promtool) stays silent on an idle server and on one whose job finished, and fires on a stuck
analyzer.

The lag series promtool evaluates are what a real :class:`Analyzer` over a real store reports,
read at scrape times a minute apart over eleven minutes (the rule's 2-minute threshold plus its
5-minute ``for``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from argus.analyzer.service import Analyzer
from argus.metrics import Metrics
from argus.store import Store
from argus.window_grid import WindowGrid
from synthetic.wire import insert_direct, synthetic_job

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "argus-rules.yml"
MIN = 60 * 10**9
pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`)"
)


def _rule() -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return dict(next(r for r in rules if r.get("alert") == "ArgusAnalysisLagging"))


def _scrapes(a: Analyzer, from_ns: int) -> list[float]:
    return [round(a.lag_s(from_ns + k * MIN), 3) for k in range(12)]


def _promtool(
    tmp_path: Path, cases: dict[str, list[float]], firing: set[str]
) -> subprocess.CompletedProcess[str]:
    tests = []
    for name, values in cases.items():
        alert: dict[str, object] = {
            "exp_labels": {"severity": "warning"},
            "exp_annotations": {
                "summary": f"Argus analysis is {int(values[11] // 60)}m {int(values[11] % 60)}s behind",
                "description": _rule()["annotations"]["description"],
            },
        }
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": [
                    {"series": "argus_analysis_lag_seconds", "values": " ".join(str(v) for v in values)}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "11m",
                        "alertname": "ArgusAnalysisLagging",
                        "exp_alerts": [alert] if name in firing else [],
                    }
                ],
            }
        )
    spec = tmp_path / "lag.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run(
        ["promtool", "test", "rules", str(spec)], check=False, capture_output=True, text=True, timeout=60
    )


def test_lag_counts_only_jobs_with_data_waiting(store: Store, tmp_path: Path) -> None:
    now = time.time_ns()
    metrics = Metrics()
    server = Analyzer(store, window=WindowGrid.from_seconds(1.0), metrics=metrics, backlog_s=None)
    server.run_once(now_ns=now)
    idle = _scrapes(server, now)
    text = generate_latest(metrics.registry).decode()
    assert "argus_analysis_lag_seconds 0.0" in text and "_created" not in text

    # A job that ran and finished: analysed to its end, it waits for nothing.
    insert_direct(store, "job-done", synthetic_job(world_size=4, steps=16, exited=True))
    after = time.time_ns() + 10 * 10**9  # past its rows' trailing windows and their grace
    server.run_once(now_ns=after)
    finished = _scrapes(server, after)

    # A live job whose analyzer stops after one pass: its next window waits, longer at each scrape.
    insert_direct(store, "job-live", synthetic_job(world_size=4, steps=16))
    stuck = Analyzer(store, window=WindowGrid.from_seconds(1.0), job="job-live", backlog_s=None)
    stuck.run_once(now_ns=now)
    due = min(stuck._due.values())
    stalled = _scrapes(stuck, due)
    assert idle == [0.0] * 12 and finished == [0.0] * 12, (idle, finished)
    assert stalled == [60.0 * k for k in range(12)]
    # The same job with an analyzer that keeps going: caught up, nothing waits.
    after = time.time_ns() + 10 * 10**9
    stuck.run_once(now_ns=after)
    assert stuck.lag_s(after + 10 * 10**9) == 0.0

    result = _promtool(tmp_path, {"idle": idle, "finished": finished, "stuck": stalled}, firing={"stuck"})
    assert result.returncode == 0, result.stdout + result.stderr
