"""Real external programs the API tests drive: a Prometheus server and headless Chromium."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["CHROMIUM", "PROMETHEUS", "Prometheus", "chromium", "fast_rules"]

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = shutil.which("prometheus")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


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
            except (httpx.HTTPError, ValueError, KeyError):  # not up yet: no answer, or not JSON yet
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


def fast_rules() -> dict[str, Any]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "argus-rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "2s"
    return dict(rules)


def chromium(profile: Path, url: str, *mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--window-size=1400,900",
            "--virtual-time-budget=10000",
            *mode,
            url,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
