"""A bad row (its end before its start, a null, a value past its limit) costs that row, never its
node's batch: on the real probe shipper, the real node agent and the real collector on chDB."""

from __future__ import annotations

import time

import pyarrow as pa

from argus.agent.host import HostSampler
from argus.agent.identity import Identity
from argus.agent.node import NodeAgent
from argus.agent.recorder import Recorder
from argus.agent.rows import CollectiveRow, PhaseRow, StepRow
from argus.agent.shipper import Shipper
from argus.agent.sink import AgentLink
from argus.limits import MAX_RANK
from argus.schema import wire_schema
from argus.window_grid import WindowGrid
from tests.agent.chdb_collector import chdb_collector
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_uploader import steps


def test_the_probe_drops_and_counts_negative_durations_and_ships_the_rest() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=0.2,
        )
        agent.start()
        now = time.time_ns()
        identity = Identity("job-bad", 2, 0, 4, "h", 11, "cpu", "train.py", now)
        recorder = Recorder(now)
        shipper = Shipper(recorder, None, HostSampler(), str(work / "a.sock"), lambda final: identity)
        try:
            for step in range(6):  # step 3 ends before it starts (the wall clock stepped back)
                dur = -1_000 if step == 3 else 1_000_000
                recorder.buffers["steps"].append(StepRow(step, now + step * 2_000_000, dur))
                recorder.buffers["phases"].append(PhaseRow(step, 1, now + step * 2_000_000, dur // 2))
            recorder.buffers["collectives"].append(
                CollectiveRow(0, "0", 1, "allreduce", 64, now, now, -5, -1, 0)
            )
            recorder.buffers["collectives"].append(
                CollectiveRow(0, "0", 2, "allreduce", 64, now, now, 5, -1, 0)
            )
            shipper.ship(force_sample=True)
            assert shipper.link is not None and shipper.link.flush(20.0)
            assert shipper.negative_durations == 3
            wait_for(
                lambda: collector.rows("SELECT count() FROM host_samples WHERE job_id = 'job-bad'") == [(1,)]
            )
            assert collector.rows("SELECT step FROM steps WHERE job_id = 'job-bad' ORDER BY step") == [
                (0,), (1,), (2,), (4,), (5,)
            ]  # fmt: skip
            assert collector.rows("SELECT count() FROM phases WHERE job_id = 'job-bad'") == [(5,)]
            assert collector.rows("SELECT seq FROM collectives WHERE job_id = 'job-bad'") == [(2,)]
            # Counted with the probe's dropped events (in its next heartbeat), which the collector exports.
            shipper.ship(force_sample=True)
            assert shipper.link.flush(20.0)
            wait_for(
                lambda: collector.rows("SELECT count() FROM host_samples WHERE job_id = 'job-bad'") == [(2,)]
            )
            assert collector.rows(
                "SELECT sum(dropped_events) FROM host_samples WHERE job_id = 'job-bad'"
            ) == [(3,)]
            assert collector.dropped_events() >= 3
            shipper.link.close(0, 2)
        finally:
            agent.stop(drain_s=2)


def test_the_agent_drops_negative_durations_a_probe_sent_and_stores_the_rest_of_the_batch() -> None:
    with short_dir() as work, chdb_collector(work) as collector:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=3600,
        )
        agent.start()
        try:
            good = AgentLink(str(work / "a.sock"), {**HELLO, "rank": 1, "pid": 2})
            # A probe of another version sends a negative duration.
            bad = AgentLink(str(work / "a.sock"), {**HELLO, "rank": 3, "pid": 3})
            good.enqueue("steps", steps(0, 4, rank=1))
            rows = steps(0, 4, rank=3)
            durations = pa.array([7, -7, 7, 7], pa.int64())
            bad.enqueue("steps", rows.set_column(rows.schema.get_field_index("dur_ns"), "dur_ns", durations))
            for link in (good, bad):
                link.pump()
            wait_for(lambda: agent.intake.bad_rows == 1)
            agent.uploader.flush()  # one batch of steps for the node: both ranks
            assert good.flush(10.0) and bad.flush(10.0)
            wait_for(lambda: collector.rows("SELECT count() FROM steps") == [(7,)])
            assert collector.rows("SELECT rank, step FROM steps ORDER BY rank, step") == [
                (1, 0), (1, 1), (1, 2), (1, 3), (3, 0), (3, 2), (3, 3)
            ]  # fmt: skip
            # One batch for the node, stored whole, reporting the row it lost.
            assert collector.rows("SELECT count() FROM ingest_batches WHERE table_name = 'steps'") == [(1,)]
            assert collector.dropped_events() == 1
            for link in (good, bad):
                link.close(0, 2)
        finally:
            agent.stop(drain_s=2)


def test_rows_the_collector_would_refuse_cost_only_themselves_not_the_nodes_batch() -> None:
    """The agent applies the collector's row rules (argus.rowrules) to each frame before merging the
    ranks' rows: a null and a rank past max_rank from one probe are dropped and counted, and the
    node's one batch of steps (every rank's rows) is stored."""
    with short_dir() as work, chdb_collector(work) as collector:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=3600,
        )
        agent.start()
        try:
            good = AgentLink(str(work / "a.sock"), {**HELLO, "rank": 1, "pid": 2})
            bad = AgentLink(str(work / "a.sock"), {**HELLO, "rank": 3, "pid": 3})
            good.enqueue("steps", steps(0, 4, rank=1))
            crafted = pa.Table.from_arrays(  # a probe of another version, or a buggy one
                [
                    pa.array([3, 3, MAX_RANK + 1, 3], pa.uint32()),
                    pa.array([0, None, 2, 3], pa.uint64()),
                    pa.array([10, 20, 30, 40], pa.int64()),
                    pa.array([7, 7, 7, 7], pa.int64()),
                ],
                schema=wire_schema("steps"),
            )
            bad.enqueue("steps", crafted)
            for link in (good, bad):
                link.pump()
            wait_for(lambda: agent.intake.bad_rows == 2)
            agent.uploader.flush()  # one batch of steps for the node: both ranks
            assert good.flush(10.0) and bad.flush(10.0)
            wait_for(lambda: collector.rows("SELECT count() FROM steps") == [(6,)])
            assert collector.rows("SELECT rank, step FROM steps ORDER BY rank, step") == [
                (1, 0), (1, 1), (1, 2), (1, 3), (3, 0), (3, 3)
            ]  # fmt: skip
            assert collector.rows("SELECT count() FROM ingest_batches WHERE table_name = 'steps'") == [(1,)]
            assert agent.uploader.stats.batches_rejected == 0
            assert collector.dropped_events() == 2
            for link in (good, bad):
                link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
