"""A real Prometheus scrapes Argus's /metrics, evaluates deploy/'s alert rules and fires on a straggler.

The rules are deploy/prometheus/argus-rules.yml with only ``for:`` shortened to 2 s, and the
scrape and evaluation intervals are 1 s, so the test takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collector.api.conftest import LiveApp
from tests.collector.api.prom import PROMETHEUS, Prometheus, fast_rules

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (Debian package; .ci/run installs it)"
    ),
]


@pytest.fixture
def prometheus(live_app: LiveApp, tmp_path: Path) -> Iterator[Prometheus]:
    target = live_app.url.removeprefix("http://")
    prom = Prometheus(tmp_path, target, fast_rules())
    yield prom
    prom.stop()


def test_straggler_alert_fires(live_app: LiveApp, prometheus: Prometheus) -> None:
    prometheus.wait(
        "a successful scrape",
        lambda: [r for r in prometheus.get("/api/v1/query", query="up")["result"] if r["value"][1] == "1"],
    )
    assert prometheus.firing("ArgusStragglerDetected") == []
    # What the analyzer exports for a 1,000-rank job with one straggler: only the top suspects.
    scores = {rank: 0.1 for rank in range(1000)}
    scores[613] = 3.2
    live_app.metrics.set_straggler_scores("job-alert", scores)
    live_app.metrics.set_active_diagnoses("job-alert", {"compute": 1})
    alerts = prometheus.wait(
        "ArgusStragglerDetected firing", lambda: prometheus.firing("ArgusStragglerDetected")
    )
    assert len(alerts) == 1
    assert alerts[0]["labels"]["job_id"] == "job-alert" and alerts[0]["labels"]["rank"] == "613"
    assert alerts[0]["annotations"]["summary"] == "Rank 613 of job job-alert is a straggler"
    diagnosis = prometheus.wait(
        "ArgusFailSlowDiagnosis firing", lambda: prometheus.firing("ArgusFailSlowDiagnosis")
    )
    assert diagnosis[0]["labels"]["cause"] == "compute"
    series = prometheus.get("/api/v1/series", **{"match[]": "argus_straggler_score"})
    assert 1 <= len(series) <= 5
