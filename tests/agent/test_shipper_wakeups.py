"""When the probe's shipper thread ships (:mod:`argus.agent.shipper`): on its timer, and earlier when a
row buffer reaches half its capacity, so a long period costs neither rows nor their delivery. The real
recorder, shipper thread and node agent, a collector over real gRPC."""

from __future__ import annotations

import itertools
import time

from argus.agent.host import HostSampler
from argus.agent.identity import Identity
from argus.agent.node import NodeAgent
from argus.agent.recorder import CAPACITY, Recorder
from argus.agent.rows import StepRow
from argus.agent.shipper import Shipper
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import wait_for


def _shipping(work: object, flush_s: float, job_id: str) -> tuple[NodeAgent, Sink, Recorder, Shipper]:
    sink = Sink()
    sock = f"{work}/a.sock"
    grid = WindowGrid.from_seconds(10.0)
    agent = NodeAgent(sock, sink.address, f"{work}/spool", 1 << 30, grid, flush_s=0.2)
    agent.start()
    now = time.time_ns()
    identity = Identity(job_id, 0, 0, 1, "h", 11, "cpu", "train.py", now)
    recorder = Recorder(now)
    shipper = Shipper(recorder, None, HostSampler(), sock, lambda final: identity, flush_s=flush_s)
    shipper.start()
    return agent, sink, recorder, shipper


def _steps_stored(sink: Sink) -> int:
    return int(sink.table("steps").num_rows)


def test_a_buffer_half_full_is_shipped_before_the_timer_and_every_row_arrives() -> None:
    half = CAPACITY["steps"] // 2
    with short_dir() as work:
        agent, sink, recorder, shipper = _shipping(work, 3600.0, "job-half")  # the timer never fires here
        try:
            now = time.time_ns()
            for step in range(half - 1):
                recorder.buffers["steps"].append(StepRow(step, now + step * 1000, 500))
            time.sleep(1.0)
            assert _steps_stored(sink) == 0  # below half: the rows wait for the timer
            for step in range(half - 1, half + 10):  # the row that brings it to half wakes the shipper
                recorder.buffers["steps"].append(StepRow(step, now + step * 1000, 500))
            wait_for(lambda: _steps_stored(sink) >= half)
            assert recorder.buffers["steps"].dropped == 0
            # A second fill wakes it again: the event was re-armed for the next half.
            for step in range(half + 10, 2 * half + 20):
                recorder.buffers["steps"].append(StepRow(step, now + step * 1000, 500))
            wait_for(lambda: _steps_stored(sink) >= 2 * half + 10)
            shipper.stop()
            shipper.close(0, 5.0)
            wait_for(lambda: _steps_stored(sink) == 2 * half + 20)
            assert sorted(sink.table("steps")["step"].to_pylist()) == list(range(2 * half + 20))
        finally:
            shipper.stop()
            agent.stop(drain_s=2)
            sink.stop()


def test_a_few_rows_are_shipped_by_the_timer_with_a_heartbeat_each_time() -> None:
    with short_dir() as work:
        agent, sink, recorder, shipper = _shipping(work, 1.0, "job-timer")  # the default period
        try:
            now = time.time_ns()
            recorder.buffers["steps"].append(StepRow(0, now, 500))
            wait_for(lambda: _steps_stored(sink) == 1)  # far below half a buffer: the timer shipped it
            recorder.buffers["steps"].append(StepRow(1, now + 1000, 500))
            wait_for(lambda: _steps_stored(sink) == 2)
            # Every timed shipment carries a heartbeat (one per SAMPLE_S, none skipped by the timer's jitter).
            wait_for(lambda: sink.table("host_samples").num_rows >= 4)
            times = sorted(sink.table("host_samples")["time_ns"].to_pylist())
            gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
            assert max(gaps_s) < 1.9, gaps_s  # SAMPLE_S is 1 s: no heartbeat left out
        finally:
            shipper.stop()
            agent.stop(drain_s=2)
            sink.stop()
