from pathlib import Path

import pytest

from argus import config


def test_each_collector_has_its_own_spool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = config.spool_dir_for("127.0.0.1:7470")
    b = config.spool_dir_for("collector.example:443")
    assert a.parent == b.parent == tmp_path / "argus" / "spool"
    assert a != b and a.name == "127.0.0.1_7470" and b.name == "collector.example_443"
    assert config.spool_dir_for("unix:///run/x.sock").name == "unix_run_x.sock"


def test_every_argus_variable_read_anywhere_is_declared_in_config() -> None:
    import re

    root = Path(__file__).resolve().parents[1]
    named: set[str] = set()
    for part in ("argus", "agent", "collector", "analyzer"):
        for path in (root / part).rglob("*.py"):
            named |= set(re.findall(r"\bARGUS_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    assert named <= set(config.ENVIRONMENT), sorted(named - set(config.ENVIRONMENT))
    assert all(getattr(config, n) in config.ENVIRONMENT for n in config.__all__ if n.startswith("ENV_"))


def test_server_settings_are_checked_once_when_built() -> None:
    from argus.cli import build_parser
    from argus.errors import ConfigError

    assert config.ServerConfig().retention_days == config.DEFAULT_RETENTION_DAYS
    for bad, message in [
        ({"grpc_listen": "nowhere"}, "--grpc-listen 'nowhere': expected HOST:PORT"),
        ({"retention_days": 0}, "--retention-days must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            config.ServerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--window-s must be > 0"):
        config.ServerConfig.from_args(build_parser().parse_args(["server", "--window-s", "0"]))
    with pytest.raises(ConfigError, match="go together"):
        config.TlsFiles.of("cert.pem", None)
    assert config.TlsFiles.of(None, None) is None


def test_agent_settings_take_the_drain_time_from_the_environment(tmp_path: Path) -> None:
    import argparse

    from argus.cli import build_parser
    from argus.errors import ConfigError

    args: argparse.Namespace = build_parser().parse_args(["agent", "--spool", str(tmp_path)])
    settings = config.AgentConfig.from_args(args, {config.ENV_AGENT_DRAIN_S: "2.5"})
    assert (settings.drain_s, settings.spool_dir) == (2.5, str(tmp_path))
    with pytest.raises(ConfigError, match=config.ENV_AGENT_DRAIN_S):
        config.AgentConfig.from_args(args, {config.ENV_AGENT_DRAIN_S: "soon"})


def test_the_rest_api_settings_are_built_once_and_follow_the_window() -> None:
    from argus.cli import build_parser
    from argus.errors import ConfigError
    from argus.window_grid import WindowGrid

    built = config.ServerConfig.from_args(
        build_parser().parse_args(["server", "--window-s", "20", "--token", "t"])
    )
    assert (built.api.token, built.api.window, built.api.max_read_rows) == (
        "t",
        built.window,
        built.max_read_rows,
    )
    # A rank is `running` for three windows of heartbeats, and never less than 30 s.
    assert built.api.heartbeat_timeout_ns == 60 * 10**9
    assert config.ApiSettings(window=WindowGrid.from_seconds(2)).heartbeat_timeout_ns == 30 * 10**9
    with pytest.raises(ConfigError, match="--max-upload-parse-s must be > 0"):
        config.ServerConfig(max_upload_parse_s=0)


@pytest.mark.parametrize("value", [0.0, 100.0, 150.0, -1.0])
def test_a_server_config_refuses_a_loss_threshold_its_analyzer_would_refuse(value: float) -> None:
    from argus.errors import ConfigError

    with pytest.raises(ConfigError, match="--min-loss-pct must be in"):
        config.ServerConfig(min_loss_pct=value)
