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
