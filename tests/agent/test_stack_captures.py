"""Stack captures through the node agent: a collector's StackCapture in, ``stacks`` rows out.

Real node agent, real gRPC (the test sink), real processes: py-spy samples a registered child
that spins in a distinctive function; a process py-spy cannot read makes the agent ask the
rank's probe to sample itself (a SAMPLE frame on its connection).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

import pyarrow.compute as pc

from argus.agent.identity import Identity
from argus.agent.messages import Sample
from argus.agent.node import NodeAgent
from argus.agent.shipper import Shipper
from argus.agent.sink import AgentLink
from argus.proto import collector_pb2
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_stacks import CHILD


def _hello(pid: int) -> dict[str, Any]:
    return {**HELLO, "pid": pid, "job_id": "job-s"}


#: A rank that is its own probe: it connects to the agent's socket (argv[1]) and spins. The agent
#: samples the process on the other end of a socket (SO_PEERCRED), never a pid a HELLO names.
PROBED_CHILD = (
    "import os, sys\n"
    "from argus.agent.sink import AgentLink\n"
    "from tests.agent.test_stack_captures import _hello\n"
    "link = AgentLink(sys.argv[1], _hello(os.getpid()))\n"
    "link.pump()\n"
    "assert link.connected\n" + CHILD
)


def connected_then_exec(
    path: str, hello: dict[str, Any], argv: list[str]
) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """A connection to the agent at ``path`` made (and HELLO sent) by a child process that then
    becomes ``argv`` (same pid: the socket's peer), handed to this process to read the agent's frames."""
    ours, theirs = socket.socketpair()
    code = (
        "import os, socket, sys, json\n"
        "from argus.agent.protocol import FrameType, encode_json\n"
        "conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "conn.connect(sys.argv[1])\n"
        "conn.sendall(encode_json(FrameType.HELLO, 0, {**json.loads(sys.argv[2]), 'pid': os.getpid()}))\n"
        "socket.send_fds(socket.socket(fileno=int(sys.argv[3])), [b'x'], [conn.fileno()])\n"
        "os.execvp(sys.argv[4], sys.argv[4:])\n"
    )
    cmd = [sys.executable, "-c", code, path, json.dumps(hello), str(theirs.fileno()), *argv]
    proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
    theirs.close()
    _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    ours.close()
    return socket.socket(fileno=fds[0]), proc


def test_agent_samples_a_registered_rank_with_pyspy_and_ships_rows() -> None:
    sink = Sink()
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"), sink.address, str(work / "spool"), 1 << 30, WindowGrid.from_seconds(1.0)
        )
        agent.start()
        child = subprocess.Popen(
            [sys.executable, "-c", PROBED_CHILD, str(work / "a.sock")], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            try:
                wait_for(lambda: agent.probes.rank_process("job-s", 3) is not None)
                capture = collector_pb2.StackCapture(
                    capture_id="cap-1", job_id="job-s", ranks=[3, 5], duration_ms=800
                )
                sink.servicer.stack_captures = [capture]  # on every ack from now on: run once
                wait_for(lambda: sink.table("stacks").num_rows > 0)
                time.sleep(1.5)
                stacks = sink.table("stacks")
            finally:
                agent.stop(drain_s=2)
        finally:
            child.kill()
            child.wait()
    assert set(stacks["capture_id"].to_pylist()) == {"cap-1"}
    assert set(stacks["rank"].to_pylist()) == {3}  # rank 5 has no probe here: not sampled
    assert set(stacks["sampler"].to_pylist()) == {"py-spy"}
    assert set(stacks["pid"].to_pylist()) == {child.pid}
    assert set(stacks["job_id"].to_pylist()) == {"job-s"}
    spin = stacks.filter(pc.match_substring(stacks["frames"], "very_distinctive_spin_for_stacks"))
    assert spin.num_rows and pc.sum(spin["count"]).as_py() >= 4
    assert agent.captures.counts == {"py-spy": 1}  # passed on many acks, run once


def test_agent_asks_the_probe_when_pyspy_cannot_attach() -> None:
    sink = Sink()
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"), sink.address, str(work / "spool"), 1 << 30, WindowGrid.from_seconds(1.0)
        )
        agent.start()
        # The rank's process is `sleep` (py-spy cannot read it); this test reads its connection.
        conn, sleeper = connected_then_exec(str(work / "a.sock"), _hello(0), ["sleep", "30"])
        try:
            try:
                link = AgentLink(str(work / "a.sock"), _hello(0))
                link._sock = conn
                asked: list[Sample] = []
                link.on_sample = asked.append
                wait_for(lambda: agent.probes.rank_process("job-s", 3) is not None)
                sink.servicer.stack_captures = [
                    collector_pb2.StackCapture(capture_id="cap-2", job_id="job-s", ranks=[3], duration_ms=300)
                ]

                def got() -> bool:
                    link.pump()
                    return bool(asked)

                wait_for(got)
            finally:
                agent.stop(drain_s=2)
        finally:
            conn.close()
            sleeper.kill()
            sleeper.wait()
    assert asked == [Sample("cap-2", 300)]
    assert agent.captures.counts == {"in-process": 1}


def test_probe_samples_itself_on_request() -> None:
    shipper = Shipper(None, None, None, "/nonexistent", lambda final: None)  # type: ignore[arg-type]
    shipper.identity = Identity("job-s", 2, 0, 4, "h", 42, "cpu", "x", 1)
    shipper._sample_stacks(Sample("cap-3", 300))
    wait_for(lambda: bool(shipper._stacks), timeout=5)
    table = shipper._stacks.popleft()
    assert set(table["sampler"].to_pylist()) == {"in-process"}
    assert set(table["capture_id"].to_pylist()) == {"cap-3"}
    assert set(table["rank"].to_pylist()) == {2}
    assert any("wait_for" in f for f in table["frames"].to_pylist())  # this test's own thread
