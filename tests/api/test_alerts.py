"""A real Prometheus scrapes Argus's /metrics, evaluates deploy/'s alert rules and fires on a straggler.

The rules are deploy/prometheus/argus-rules.yml with only ``for:`` shortened to 2 s, and the
scrape and evaluation intervals are 1 s, so the test takes seconds.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.api.conftest import LiveApp

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (Debian package; .ci/run installs it)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A `prometheus` process on a free port with a tmp config, rules and TSDB."""

    def __init__(self, workdir: Path, target: str, rules: dict[str, Any]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "rules.yml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": "argus", "static_configs": [{"targets": [target]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("wb")
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def get(self, path: str, **params: str) -> Any:
        return httpx.get(f"{self.url}{path}", params=params, timeout=5).json()["data"]

    def wait(self, what: str, predicate: Any, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                value = predicate()
                if value:
                    return value
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    def firing(self, name: str) -> list[dict[str, Any]]:
        alerts = self.get("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _fast_rules() -> dict[str, Any]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "argus-rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "2s"
    return dict(rules)


@pytest.fixture
def prometheus(live_app: LiveApp, tmp_path: Path) -> Iterator[Prometheus]:
    target = live_app.url.removeprefix("http://")
    prom = Prometheus(tmp_path, target, _fast_rules())
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
