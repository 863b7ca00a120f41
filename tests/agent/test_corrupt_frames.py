"""A probe's frame the node agent cannot decode costs that frame, never the agent, the connection or
another probe: the real `argus agent` process, real probe links on its socket, the real collector
on chDB. The frame is refused (``REFUSED``; a probe of protocol version < 3 gets it acknowledged),
so the probe drops it and never sends it again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from argus.agent.protocol import FrameType, encode_json, read_frame
from argus.agent.sink import AgentLink
from synthetic.bad_inputs import corrupt_kernel_events
from tests.agent.chdb_collector import chdb_collector
from tests.agent.jobs import job_env, short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_uploader import steps


def test_a_corrupt_frame_is_refused_and_the_agent_and_every_probe_go_on() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        sock = str(work / "a.sock")
        cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", collector.address]
        cmd += ["--spool", str(work / "spool"), "--window-s", "1"]
        log = open(work / "agent.err", "wb")  # noqa: SIM115  # closed below, after the process
        agent = subprocess.Popen(cmd, env=job_env(work), stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_for(lambda: os.path.exists(sock))
            good = AgentLink(sock, {**HELLO, "version": 3, "rank": 1, "pid": os.getpid()})
            bad = AgentLink(sock, {**HELLO, "version": 3, "rank": 3, "pid": os.getpid()})
            old = AgentLink(sock, {**HELLO, "version": 2, "rank": 5, "pid": os.getpid()})
            good.enqueue("steps", steps(0, 4, rank=1))
            for link, rank in ((bad, 3), (old, 5)):
                link.enqueue("kernel_events", corrupt_kernel_events(rank))
                link.enqueue("steps", steps(0, 4, rank=rank))
            for link in (good, bad, old):
                assert link.flush(20.0), "every frame answered"
            assert agent.poll() is None, "the agent survived the corrupt frames"
            # The current probe drops the refused frame and counts its rows; the frame after it is stored.
            assert (bad.refused_rows, bad.dropped_rows, bad.acked_rows) == (4, 4, 4)
            # A probe of protocol version 2 knows no REFUSED: the frame is acknowledged, and it goes on.
            assert (old.refused_rows, old.acked_rows) == (0, 8)
            assert all(link.connected for link in (good, bad, old)), "no connection was dropped"
            wait_for(lambda: collector.rows("SELECT count() FROM steps") == [(12,)])
            assert collector.rows("SELECT DISTINCT rank FROM steps ORDER BY rank") == [(1,), (3,), (5,)]
            assert collector.rows("SELECT count() FROM kernel_events") == [(0,)]
            # A frame refused is not sent again: a fresh connection of the same probe resends nothing.
            bad._disconnect(None)
            bad.pump()
            assert bad.pending_rows == 0 and bad.connected
            # A CAPTURE frame whose spans are not spans is refused the same way, on a connection that
            # goes on (the DUMP after it is answered).
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                raw.settimeout(20)
                raw.connect(sock)
                raw.sendall(encode_json(FrameType.HELLO, 0, {**HELLO, "version": 3, "rank": 7}))
                raw.sendall(encode_json(FrameType.CAPTURE, 1, {"spans": "not spans"}))
                assert read_frame(raw) == (FrameType.REFUSED, 1, b"")
                raw.sendall(encode_json(FrameType.DUMP, 0, {"job_id": "job-n", "start_ns": 0, "end_ns": 1}))
                assert read_frame(raw) == (FrameType.ACK, 0, b"")
            assert agent.poll() is None
            for link in (good, bad, old):
                link.close(0, 2)
        finally:
            agent.terminate()
            agent.wait(timeout=20)
            log.close()
        assert b"refused frame" in (work / "agent.err").read_bytes()
