"""Who may reach the node agent and see the token: socket directory ownership, token hand-over."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from argus import cli, config
from argus.agent.node import NodeAgent
from argus.errors import ConfigError
from argus.window_grid import WindowGrid
from tests.agent.chdb_collector import chdb_collector
from tests.agent.collector_sink import Sink
from tests.agent.jobs import job_env, run, short_dir
from tests.agent.test_node_agent import wait_for

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
        agent = NodeAgent(
            str(theirs / "a.sock"), sink.address, str(work / "spool"), 1 << 20, WindowGrid.from_seconds(1.0)
        )
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


# --- where the socket lives and who may connect --------------------------------------------------

CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
    print("connected")
except PermissionError:
    print("refused")
"""


def test_the_default_socket_leaves_tmp_and_every_part_finds_it_the_same_way(monkeypatch, tmp_path) -> None:
    assert config.default_socket({}, euid=0) == config.SYSTEM_SOCKET == "/run/argus/agent.sock"
    assert config.default_socket({"XDG_RUNTIME_DIR": "/run/user/7"}, euid=7) == "/run/user/7/argus/agent.sock"
    assert config.default_socket({"XDG_STATE_HOME": "/h/s"}, euid=7) == "/h/s/argus/agent.sock"
    assert config.find_socket({"ARGUS_SOCKET": "/x/a.sock"}) == "/x/a.sock"
    monkeypatch.delenv(config.ENV_SOCKET, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    own = config.default_socket()
    assert not own.startswith("/tmp/") or os.geteuid() == 0
    parser = cli.build_parser()
    assert parser.parse_args(["agent"]).socket == own  # where the agent listens...
    assert parser.parse_args(["run", "--", "true"]).socket == config.find_socket()  # ...argus run looks
    from argus.agent.probe import Probe

    assert Probe(job_id="j").socket_path == config.find_socket()  # ...and the probe connects


#: An agent on its default socket, then a probe given none; exits with the probe's status.
DEFAULT_PATH_JOB = """
"$PY" -m argus.cli agent --collector "$COLLECTOR" --window-s 1 & agent=$!
"$PY" -c "import time, argus.config as c, argus.agent as a
print(c.find_socket())
a.attach(job_id='dflt')
for _ in range(30):
    time.sleep(0.1); a.step()"
status=$?
kill -TERM $agent; wait $agent
exit $status
"""


def test_a_probe_with_no_socket_given_finds_an_agent_on_its_default_path() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        env = job_env(work, PY=sys.executable, COLLECTOR=collector.address, XDG_RUNTIME_DIR=str(work / "rt"))
        (work / "rt").mkdir(mode=0o700)
        cmd = ["sh", "-c", DEFAULT_PATH_JOB]
        if os.geteuid() == 0:  # root's default is /run/argus: a /run of its own, in a mount namespace
            cmd = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount -t tmpfs tmpfs /run && " + DEFAULT_PATH_JOB,
            ]
        out = run(cmd, env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        want = config.SYSTEM_SOCKET if os.geteuid() == 0 else str(work / "rt" / "argus" / "agent.sock")
        assert out.stdout.splitlines()[0] == want
        wait_for(lambda: collector.rows("SELECT count() FROM steps WHERE job_id = 'dflt'") >= [(20,)])


def test_the_socket_is_0660_in_a_folder_only_its_owner_or_its_group_may_enter() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        work.chmod(0o755)
        private = NodeAgent(
            str(work / "own" / "a.sock"),
            collector.address,
            str(work / "s1"),
            1 << 20,
            WindowGrid.from_seconds(1.0),
        )
        private.start()
        try:
            assert stat.S_IMODE((work / "own").stat().st_mode) == 0o700
            assert stat.S_IMODE((work / "own" / "a.sock").stat().st_mode) == 0o660
            if os.geteuid() != 0:
                return  # the rest changes groups and users
            shared = NodeAgent(
                str(work / "grp" / "a.sock"),
                collector.address,
                str(work / "s2"),
                1 << 20,
                WindowGrid.from_seconds(1.0),
                socket_group="nogroup",
            )
            shared.start()
            try:
                folder, sock = (work / "grp").stat(), (work / "grp" / "a.sock").stat()
                assert (stat.S_IMODE(folder.st_mode), folder.st_gid) == (0o750, 65534)
                assert (stat.S_IMODE(sock.st_mode), sock.st_gid) == (0o660, 65534)

                def connect_as(uid: int, gid: int, path: Path) -> str:
                    done = subprocess.run(
                        ["/usr/bin/python3", "-c", CONNECT, str(path)],
                        user=uid, group=gid, extra_groups=[], capture_output=True, text=True, timeout=30,
                        check=False,
                    )  # fmt: skip
                    return done.stdout.strip()

                assert (
                    connect_as(65534, 65534, work / "grp" / "a.sock") == "connected"
                )  # a member of the group
                assert connect_as(65534, 65534, work / "own" / "a.sock") == "refused"  # anybody else
            finally:
                shared.stop(drain_s=0)
        finally:
            private.stop(drain_s=0)


def test_a_socket_directory_others_may_write_is_refused() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        (work / "open").mkdir()
        (work / "open").chmod(0o777)
        agent = NodeAgent(
            str(work / "open" / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 20,
            WindowGrid.from_seconds(1.0),
        )
        with pytest.raises(ConfigError, match=r"is writable by others \(mode 777\).*only you can write"):
            agent.start()
        assert not (work / "open" / "a.sock").exists()
        with pytest.raises(ConfigError, match="no group named 'no-such-group-x'"):
            NodeAgent(
                str(work / "g" / "a.sock"),
                collector.address,
                str(work / "s"),
                1 << 20,
                WindowGrid.from_seconds(1.0),
                socket_group="no-such-group-x",
            ).start()
