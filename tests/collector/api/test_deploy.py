"""deploy/: alert rules (promtool), Prometheus config, Kubernetes manifests, ClickHouse schema, systemd."""

from __future__ import annotations

import copy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from argus.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
KUBERNETES_VERSION = "1.30.0"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)


def _promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", "argus-rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    result = _promtool("test", "rules", "argus-rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation makes `promtool test rules` fail: the unit tests are not vacuous."""
    shutil.copy(PROMETHEUS / "argus-rules.yml", tmp_path)
    tests = yaml.safe_load((PROMETHEUS / "argus-rules.test.yml").read_text())
    tests["tests"][0]["alert_rule_test"][0]["exp_alerts"] = [{"exp_labels": {"job_id": "llama", "rank": "7"}}]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests))
    assert _promtool("test", "rules", "t.yml", cwd=tmp_path).returncode != 0


@needs_promtool
def test_prometheus_config() -> None:
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def test_manifests_validate_against_kubernetes_schemas() -> None:
    docs = _documents()
    kinds = {(name, doc["kind"]) for name, doc in docs}
    assert ("agent-daemonset.yaml", "DaemonSet") in kinds
    for role in ("collector", "analyzer", "api"):
        assert (f"{role}.yaml", "Deployment") in kinds and (f"{role}.yaml", "Service") in kinds
    assert ("clickhouse-schema.yaml", "ConfigMap") in kinds
    for _, doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_a_broken_manifest() -> None:
    """The offline validator is strict: an unknown field or a wrong type fails."""
    _, daemonset = next(d for d in _documents() if d[1]["kind"] == "DaemonSet")
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_agent_shares_its_socket_with_training_pods_through_a_host_path() -> None:
    docs = dict(((name, doc["kind"]), doc) for name, doc in _documents())
    agent = docs[("agent-daemonset.yaml", "DaemonSet")]["spec"]["template"]["spec"]
    trainer = docs[("training-pod-example.yaml", "Job")]["spec"]["template"]["spec"]

    def socket_dir(pod: dict[str, Any]) -> tuple[str, str]:
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container["volumeMounts"]:
            host = volumes[mount["name"]].get("hostPath")
            if host and mount["mountPath"] == "/run/argus":
                return host["path"], mount["mountPath"]
        raise AssertionError("no hostPath mounted at /run/argus")

    assert socket_dir(agent) == socket_dir(trainer) == ("/run/argus", "/run/argus")
    assert "--socket=/run/argus/agent.sock" in agent["containers"][0]["args"]
    env = {e["name"]: e.get("value") for e in trainer["containers"][0]["env"]}
    assert env["ARGUS_SOCKET"] == "/run/argus/agent.sock"


def _argus_commands() -> list[list[str]]:
    commands = []
    for _, doc in _documents():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            command = container.get("command", []) + container.get("args", [])
            if command and command[0] == "argus":
                commands.append(command[1:])
    for unit in (DEPLOY / "systemd").glob("*.service"):
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart="):
                commands.append(shlex.split(line.split("=", 1)[1])[1:])
    return commands


def test_every_argus_command_line_parses_with_the_real_cli() -> None:
    commands = _argus_commands()
    assert len(commands) >= 6
    parser = build_parser()
    for command in commands:
        # `argus run ... -- torchrun ...`: only the options before "--" are argus's.
        argv = [*command[: command.index("--")], "--", "true"] if command[0] == "run" else command
        args = parser.parse_args(argv)
        assert args.command in {"server", "agent", "run"}


def test_clickhouse_schema_is_generated_from_argus_schema() -> None:
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    from argus.schema import TABLES, create_statements

    sql = (DEPLOY / "clickhouse" / "schema.sql").read_text()
    for statement in create_statements(cluster="argus"):
        assert statement in sql
    for table in TABLES:
        assert f"ENGINE = Distributed(argus, argus, {table}_local, cityHash64(job_id))" in sql


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_verify(tmp_path: Path) -> None:
    argus = Path(sys.executable).with_name("argus")
    assert argus.exists()
    for unit in (DEPLOY / "systemd").glob("*.service"):
        text = unit.read_text().replace("/opt/argus/venv/bin/argus", str(argus))
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify only logs some problems (a bad value is "ignoring"): any output is a failure.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def _listens_beyond_loopback(command: list[str]) -> bool:
    addresses = [a.split("=", 1)[1] for a in command if a.startswith(("--grpc-listen=", "--http-listen="))]
    return any(not a.startswith(("127.0.0.1:", "localhost:", "[::1]:")) for a in addresses)


def test_manifests_serve_tls_and_ship_no_secret_value() -> None:
    """Every server listening beyond loopback serves TLS (and probes it over HTTPS), every agent
    trusts a certificate, no Secret with a value ships, and no store URL, password or token
    placeholder is in the deployment files."""
    docs = _documents()
    servers = 0
    for name, doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            command = container.get("command", []) + container.get("args", [])
            if command[:2] == ["argus", "server"] and _listens_beyond_loopback(command):
                servers += 1
                assert {"--tls-cert=/etc/argus/tls/tls.crt", "--tls-key=/etc/argus/tls/tls.key"} <= set(
                    command
                ), name
                for probe in ("readinessProbe", "livenessProbe"):
                    if probe in container:
                        assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
            if command[:2] == ["argus", "agent"]:
                assert any(a.startswith("--tls-cert=") for a in command), name
    assert servers == 3
    assert not [
        name for name, doc in docs if doc["kind"] == "Secret" and (doc.get("data") or doc.get("stringData"))
    ]
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "change-me" not in text, path
            assert "clickhouse://" not in text, path  # the store over HTTPS only: clickhouses://
