"""Kernel events and capture spans are acknowledged to the probe only once their summaries are
spooled, and the agent's kernel windows are bounded: on the real agent (in-process and as an
`argus agent` process killed with SIGKILL) and the real collector on chDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from argus.agent.node import NodeAgent
from argus.agent.sink import AgentLink
from argus.window_grid import WindowGrid
from tests.agent.chdb_collector import Collector, chdb_collector
from tests.agent.jobs import job_env, short_dir
from tests.agent.test_node_agent import HELLO as HELLO_V1
from tests.agent.test_node_agent import kernel_events, wait_for
from tests.agent.test_uploader import steps

#: A probe of this version: it takes ACK_ONE.
HELLO = {**HELLO_V1, "version": 2}
SUMMARISED = "SELECT sum(count) FROM kernel_summaries WHERE job_id = 'job-n'"


def summarised(collector: Collector) -> int:
    (total,) = collector.rows(SUMMARISED)[0]
    return int(total or 0)


def test_kernel_and_capture_frames_are_acknowledged_once_their_summaries_are_spooled() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=0.2,
            grace_s=1.5,
        )
        agent.start()
        try:
            link = AgentLink(str(work / "a.sock"), HELLO)
            old = AgentLink(str(work / "a.sock"), {**HELLO_V1, "rank": 4, "pid": 9})  # takes no ACK_ONE
            now = time.time_ns()
            for probe, rank in ((link, 3), (old, 4)):
                probe.enqueue("kernel_events", kernel_events(rank, now, 200))
                probe.enqueue_capture([(now - 100, now + 1_000_000)])
                probe.enqueue("steps", steps(0, 3, rank=rank))
            old.pump()
            # Several flushes pass while the window waits: the steps behind the kernel events are
            # spooled and acknowledged alone (ACK_ONE); the kernel events, in memory only, are not.
            assert not link.flush(1.0)
            wait_for(lambda: (link.pump(), link.acked_rows == 3)[1])
            wait_for(lambda: collector.rows("SELECT count() FROM steps WHERE job_id = 'job-n'") == [(6,)])
            assert not link.flush(0.2) and summarised(collector) == 0 and link.acked_rows == 3
            assert not old.flush(0.2) and old.acked_rows == 0  # an older probe waits for the held frame
            # The window closes: summarised, spooled, then every frame is acknowledged.
            assert link.flush(15.0) and link.acked_rows == 203
            assert old.flush(5.0) and old.acked_rows == 203
            wait_for(lambda: summarised(collector) == 400)
            assert (
                agent.acks.pending == 0
                and agent.acks.waiting_for_windows == 0
                and agent.windows._tickets == set()
            )
            for probe in (link, old):
                probe.close(0, 2)
        finally:
            agent.stop(drain_s=2)
        assert summarised(collector) == 400  # each event summarised once


def test_kernel_events_an_agent_held_when_killed_are_summarised_once_by_the_next_one() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        sock = str(work / "a.sock")
        cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", collector.address]
        cmd += ["--spool", str(work / "spool"), "--window-s", "1"]
        env = job_env(work)
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        second = None
        try:
            wait_for(lambda: os.path.exists(sock))
            link = AgentLink(sock, HELLO)
            link.enqueue("kernel_events", kernel_events(3, time.time_ns(), 300))
            link.enqueue("steps", steps(0, 4, rank=3))
            # The steps are spooled and acknowledged; the kernel events, held in their window (5 s of
            # grace), are not.
            wait_for(lambda: (link.pump(), link.acked_rows == 4)[1])
            assert not link.flush(0.5)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # The probe resends both frames to the next agent, which acknowledges them once durable.
            wait_for(lambda: link.flush(1.0), timeout=30)
            assert link.acked_rows == 304
            wait_for(lambda: summarised(collector) >= 300, timeout=30)
            wait_for(lambda: collector.rows("SELECT count() FROM steps WHERE job_id = 'job-n'") >= [(4,)])
            link.close(0, 2)
            second.send_signal(signal.SIGTERM)
            second.wait(30)
            assert summarised(collector) == 300
            # The steps the first agent acknowledged were sent by it or replayed from its spool by the
            # second, and never resent by the probe: each stored once (rows, not sets, compared).
            per_step = "SELECT step, count() FROM steps WHERE job_id = 'job-n' GROUP BY step ORDER BY step"
            assert collector.rows(per_step) == [
                (0, 1), (1, 1), (2, 1), (3, 1)
            ]  # fmt: skip
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(10)


def test_a_window_stamped_far_ahead_or_over_the_bound_is_dropped_counted_and_never_holds_a_probe() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=0.2,
            grace_s=0.5,
        )
        agent.windows.max_held_rows = 100
        agent.start()
        try:
            link = AgentLink(str(work / "a.sock"), HELLO)
            now = time.time_ns()
            link.enqueue("kernel_events", kernel_events(3, now + 86_400 * 10**9, 50))  # a day ahead
            link.enqueue_capture([(now + 86_400 * 10**9, now + 86_401 * 10**9)])
            link.enqueue("kernel_events", kernel_events(3, now, 80))
            link.enqueue("kernel_events", kernel_events(3, now, 40))  # 120 > 100 held: dropped
            assert link.flush(10.0) and link.acked_rows == 170
            w = agent.windows
            assert (w.future_events, w.overflow_events) == (51, 40)
            assert w._held_rows == 0 and w._spans == {}  # nothing far ahead is held
            wait_for(lambda: summarised(collector) == 80)
            wait_for(lambda: collector.dropped_events() == 91)  # reported to the collector as lost
            link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
