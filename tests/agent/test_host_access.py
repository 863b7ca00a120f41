"""Who may reach the node agent and see the token: socket directory ownership, token hand-over."""

from __future__ import annotations

import os
import secrets
import sys

import pytest

from argus import cli, config
from argus.agent.node import NodeAgent
from argus.errors import ConfigError
from tests.agent.collector_sink import Sink
from tests.agent.jobs import job_env, run, short_dir

#: Run under `argus run`: every process's command line, and whether the node agent holds the token.
SCAN = """
import pathlib, sys
token = pathlib.Path(sys.argv[1]).read_text().strip()
agent_has_it = False
for proc in pathlib.Path("/proc").iterdir():
    try:
        argv = (proc / "cmdline").read_bytes().decode().split("\\0")
        if any(token in arg for arg in argv):
            print("LEAK", proc.name, argv)
        if argv[1:4] == ["-m", "argus.cli", "agent"] and sys.argv[2] in argv:
            agent_has_it = f"ARGUS_TOKEN={token}".encode() in (proc / "environ").read_bytes().split(b"\\0")
    except OSError:
        pass
print("agent holds the token:", agent_has_it)
"""


def test_no_command_line_started_by_argus_run_holds_the_token() -> None:
    sink = Sink()
    token = secrets.token_hex(16)
    with short_dir() as work:
        (work / "token").write_text(token + "\n")
        sock = str(work / "agent.sock")
        cmd = [sys.executable, "-m", "argus.cli", "run", "--collector", sink.address, "--socket", sock]
        cmd += ["--token-file", str(work / "token"), "--job-id", "t", "--"]
        out = run([*cmd, sys.executable, "-c", SCAN, str(work / "token"), sock], job_env(work), timeout=120)
        sink.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LEAK" not in out.stdout, out.stdout
    assert "agent holds the token: True" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_socket_directory_owned_by_another_user_is_refused() -> None:
    sink = Sink()
    with short_dir() as work:
        theirs = work / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        agent = NodeAgent(str(theirs / "a.sock"), sink.address, str(work / "spool"), 1 << 20, 1.0)
        with pytest.raises(ConfigError, match=r"belongs to uid 65534, not to this user .*directory you own"):
            agent.start()
        assert not (theirs / "a.sock").exists()
        sink.stop()


def test_the_token_comes_from_the_option_the_file_or_the_environment(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def token(*argv: str) -> str | None:
        args = cli.build_parser().parse_args(["agent", *argv])
        cli._resolve_token(args)
        return args.token

    (tmp_path / "t").write_text("from-file\nignored\n")
    monkeypatch.setenv(config.ENV_TOKEN, "from-env")
    assert token("--token", "given") == "given"
    assert token("--token-file", str(tmp_path / "t")) == "from-file"
    assert token() == "from-env"
    monkeypatch.delenv(config.ENV_TOKEN)
    assert token() is None
    with pytest.raises(ConfigError, match="cannot read the token file"):
        token("--token-file", str(tmp_path / "missing"))
