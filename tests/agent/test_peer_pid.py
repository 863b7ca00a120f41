"""The node agent samples the process on the other end of a probe's socket, never a pid the probe
names: a real node agent, real gRPC (the test sink), py-spy on real processes, a real pid namespace.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from argus.agent.node import NodeAgent
from argus.agent.sink import AgentLink
from argus.proto import collector_pb2
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
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
