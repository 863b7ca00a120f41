"""The probe holds at most its bound of bytes, sent-but-unacknowledged frames included: a real node
agent whose disk is full (its spool on a full tmpfs) takes frames and never acknowledges them; the
probe's link drops the oldest past the bound and counts their rows."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from argus.agent.node import NodeAgent
from argus.agent.sink import AgentLink
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_uploader import steps


@contextmanager
def full_disk(folder: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``folder``, filled but for a few bytes (root only)."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=False
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (folder / "spool").mkdir()
        fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(fd)
        yield folder / "spool"
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_frames_an_agent_never_acknowledges_stay_within_the_probes_bound() -> None:
    bound = 1 << 20
    sink = Sink()
    sink.start()
    with short_dir() as work, full_disk(work / "disk") as spool:
        agent = NodeAgent(
            str(work / "a.sock"), sink.address, str(spool), 1 << 30, WindowGrid.from_seconds(1.0), flush_s=0.2
        )
        agent.start()
        try:
            link = AgentLink(str(work / "a.sock"), {**HELLO, "version": 3}, max_pending_bytes=bound)
            frames, rows = 40, 4_000  # ~120 kB a frame: 4.8 MB sent in all
            for i in range(frames):
                link.enqueue("steps", steps(i * rows, rows, rank=3))
                link.pump()
                held = sum(len(m.frame) for m in (*link._unsent, *link._unacked))  # every frame held
                assert held <= bound and link.held_bytes == held, f"frame {i}: {held} bytes held"
            assert link.connected and link.acked_rows == 0
            wait_for(lambda: agent.uploader.stats.spool_failures > 0)  # the agent took them: disk full
            # The oldest were dropped, sent ones first, and counted; the rest are held.
            assert link.dropped_rows + link.pending_rows == frames * rows
            assert link.dropped_rows >= frames * rows - (bound // 100_000) * rows
        finally:
            agent.stop(drain_s=1)
            sink.stop()
