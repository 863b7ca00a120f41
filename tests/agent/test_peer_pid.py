"""The node agent samples the process on the other end of a probe's socket, never a pid the probe
names: a real node agent, real gRPC (the test sink), py-spy on real processes, a real pid namespace.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from argus.agent.node import NodeAgent
from argus.agent.protocol import FrameType, encode_json, read_frame
from argus.agent.sink import AgentLink
from argus.proto import collector_pb2
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import job_env, short_dir
from tests.agent.test_node_agent import wait_for
from tests.agent.test_stack_captures import PROBED_CHILD, _hello
from tests.agent.test_stacks import CHILD

SPIN = "very_distinctive_spin_for_stacks"


def _capture(agent: NodeAgent, sink: Sink, capture_id: str) -> pa.Table:
    """Ask for a 600 ms capture of rank 3 of job-s; the stacks rows it ships."""
    wait_for(lambda: agent.probes.rank_process("job-s", 3) is not None)
    sink.servicer.stack_captures = [
        collector_pb2.StackCapture(capture_id=capture_id, job_id="job-s", ranks=[3], duration_ms=600)
    ]
    wait_for(lambda: sink.table("stacks").num_rows > 0)
    wait_for(lambda: sum(agent.captures.counts.values()) == 1)
    return sink.table("stacks")


def test_a_probe_naming_another_process_gets_its_own_process_sampled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink()
    victim = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
        with short_dir() as work, caplog.at_level(logging.WARNING, logger="argus.agent.connections"):
            agent = NodeAgent(
                str(work / "a.sock"), sink.address, str(work / "spool"), 1 << 30, WindowGrid.from_seconds(1.0)
            )
            agent.start()
            try:
                link = AgentLink(str(work / "a.sock"), _hello(victim.pid))  # names the victim
                link.pump()
                stacks = _capture(agent, sink, "cap-claim")
            finally:
                agent.stop(drain_s=2)
    finally:
        victim.kill()
        victim.wait()
    assert set(stacks["pid"].to_pylist()) == {os.getpid()}  # this process: the socket's peer
    assert not pc.any(pc.match_substring(stacks["frames"], SPIN)).as_py()  # nothing of the victim's
    assert f"names pid {victim.pid}, but its socket is pid {os.getpid()}'s" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_probe_in_a_pid_namespace_is_sampled_by_its_pid_here(caplog: pytest.LogCaptureFixture) -> None:
    """A rank in a container numbers itself 1; the kernel names its socket's peer in the agent's
    namespace, and that process is sampled (not this namespace's pid 1)."""
    sink = Sink()
    with short_dir() as work, caplog.at_level(logging.WARNING, logger="argus.agent.connections"):
        agent = NodeAgent(
            str(work / "a.sock"), sink.address, str(work / "spool"), 1 << 30, WindowGrid.from_seconds(1.0)
        )
        agent.start()
        cmd = [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            "-c",
            PROBED_CHILD,
        ]
        box = subprocess.Popen([*cmd, str(work / "a.sock")], stdout=subprocess.PIPE, text=True)
        try:
            assert box.stdout is not None and box.stdout.readline().strip() == "ready"
            (rank,) = psutil.Process(box.pid).children()  # the rank: pid 1 in its namespace
            assert rank.pid != 1
            stacks = _capture(agent, sink, "cap-ns")
            assert [h.pid for h in agent.probes.hellos()] == [1]
        finally:
            agent.stop(drain_s=2)
            box.kill()  # --kill-child: the rank goes with it
            box.wait()
    assert set(stacks["pid"].to_pylist()) == {rank.pid}
    assert set(stacks["sampler"].to_pylist()) == {"py-spy"}
    assert pc.any(pc.match_substring(stacks["frames"], SPIN)).as_py()
    assert "names pid" not in caplog.text  # pid 1 in its own namespace is its own pid: no warning


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_probe_outside_the_agent_s_pid_namespace_is_asked_to_sample_itself() -> None:
    """The other way round: the node agent runs in a pid namespace (a container) and a rank of the
    host connects. The kernel cannot name that peer in the agent's namespace (pid 0): whatever pid
    its HELLO names, py-spy samples nothing; the rank is asked to sample itself (``SAMPLE``)."""
    sink = Sink()
    with short_dir() as work:
        sock = str(work / "a.sock")
        agent_cmd = [
            sys.executable,
            "-m",
            "argus.cli",
            "agent",
            "--socket",
            sock,
            "--collector",
            sink.address,
        ]
        agent_cmd += ["--spool", str(work / "spool"), "--window-s", "1"]
        boxed = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *agent_cmd]
        log = open(work / "agent.err", "wb")  # noqa: SIM115  # closed below, after the process
        box = subprocess.Popen(boxed, env=job_env(work), stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_for(lambda: os.path.exists(sock), timeout=60)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                raw.settimeout(60)
                raw.connect(sock)
                # Its HELLO names a pid the agent's namespace does hold (its pid 1: the agent itself).
                raw.sendall(encode_json(FrameType.HELLO, 0, {**_hello(1), "version": 3, "rank": 3}))
                wait_for(lambda: b"pid namespace this agent cannot see" in (work / "agent.err").read_bytes())
                sink.servicer.stack_captures = [
                    collector_pb2.StackCapture(
                        capture_id="cap-out", job_id="job-s", ranks=[3], duration_ms=300
                    )
                ]
                while (frame := read_frame(raw)) is not None and frame[0] != FrameType.SAMPLE:
                    pass
                assert frame is not None, "the agent asked the rank to sample itself"
                assert json.loads(frame[2])["capture_id"] == "cap-out"
            assert box.poll() is None
        finally:
            box.kill()  # --kill-child: the agent goes with it
            box.wait()
            log.close()
        assert b"samples itself in-process" in (work / "agent.err").read_bytes()
    assert sink.table("stacks").num_rows == 0  # nothing sampled by py-spy, of any pid
