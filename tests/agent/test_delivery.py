"""The agent's delivery promise on the real agent and real gRPC: only durable rows are acknowledged,
a poison batch is set aside, the batches behind it are stored."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from argus.agent.node import NodeAgent
from argus.agent.sink import AgentLink
from argus.agent.spool import SET_ASIDE, Spool
from argus.agent.uploader import POISON_TRIES, Uploader
from argus.schema import wire_schema
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_uploader import steps


@contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """``folder`` refuses writes: a full tmpfs mounted on it as root, else read-only by mode."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
        filler = folder / "filler"
        try:
            with filler.open("wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass  # full
        try:
            yield
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def phases(n: int) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "rank": [3] * n,
            "step": list(range(n)),
            "phase": ["forward"] * n,
            "start_ns": [time.time_ns()] * n,
            "dur_ns": [5] * n,
        },
        schema=wire_schema("phases"),
    )


def test_no_frame_is_acknowledged_while_the_spool_cannot_be_written() -> None:
    sink = Sink()
    with short_dir() as work:
        spool = work / "spool"
        with unwritable(spool):
            agent = NodeAgent(
                str(work / "a.sock"),
                sink.address,
                str(spool),
                1 << 30,
                WindowGrid.from_seconds(1.0),
                flush_s=3600,
            )
            agent.start()
            link = AgentLink(str(work / "a.sock"), HELLO)
            try:
                link.enqueue("steps", steps(0, 5, rank=3))
                link.enqueue("phases", phases(7))
                link.pump()
                wait_for(lambda: {"steps", "phases"} <= {table for _, table, _ in agent.uploader._queued})
                agent.uploader.flush()  # the spool refuses the first group: nothing is acknowledged
                assert agent.uploader.stats.spool_failures == 1
                assert not link.flush(1.0) and link.pending_rows == 12 and link.acked_rows == 0
                agent.uploader.flush()
                assert not link.flush(0.5) and link.acked_rows == 0
            except BaseException:
                agent.stop(drain_s=0)
                raise
        # The spool takes writes again: both groups (the refused one and the one behind it) are spooled,
        # then acknowledged, then stored once.
        try:
            agent.uploader.flush()
            assert link.flush(10.0) and link.acked_rows == 12
            wait_for(lambda: sink.table("steps").num_rows == 5 and sink.table("phases").num_rows == 7)
            assert sorted(sink.table("steps")["step"].to_pylist()) == list(range(5))
            assert sorted(sink.table("phases")["step"].to_pylist()) == list(range(7))
            link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
            sink.stop()


def test_a_poison_batch_is_set_aside_and_the_batches_behind_it_are_stored(tmp_path: Path) -> None:
    sink = Sink()
    sink.servicer.fail = lambda b: "the store cannot take this batch" if b.seq == 1 else None
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-p", flush_s=3600)
    up.start()
    try:
        for first in (0, 4, 8):
            up.add("job", "steps", steps(first, 4))
            up.flush()
        wait_for(lambda: sink.table("steps").num_rows == 8)
        assert sorted(sink.table("steps")["step"].to_pylist()) == list(range(4, 12))
        assert sink.servicer.failed == [1] * POISON_TRIES  # bounded tries, then the rest went on
        assert (up.stats.batches_set_aside, up.stats.rows_set_aside) == (1, 4)
        assert "set aside after 5 tries" in up.stats.rejections[-1]
        assert [p.name for p in (tmp_path / SET_ASIDE / "agent-p").iterdir()] == ["0000000000000001-4.batch"]
        up.add("job", "steps", steps(12, 1))
        up.flush()
        wait_for(lambda: sink.table("steps").num_rows == 9)
        assert sink.servicer.batches[-1].dropped_events == 4  # the set-aside rows are reported as lost
        assert len(up.spool) == 0 and len(Spool(tmp_path, 1 << 30)) == 0  # and never replayed
    finally:
        up.close(1)
        sink.stop()


def test_a_batch_refused_as_too_large_is_split_and_each_row_stored_once(tmp_path: Path) -> None:
    sink = Sink()  # gRPC's default limit: 4 MiB a message, under the agent's 16 MiB
    up = Uploader(sink.address, Spool(tmp_path, 1 << 30), "agent-s", flush_s=3600)
    up.start()
    try:
        up.add("job", "steps", steps(0, 200_000))  # about 6 MiB of Arrow
        assert up.flush() == 1
        wait_for(lambda: sink.table("steps").num_rows >= 200_000)
        wait_for(lambda: len(up.spool) == 0)
        got = sink.table("steps")["step"].to_numpy()
        assert len(got) == 200_000 and len(set(got.tolist())) == 200_000
        assert up.max_message_bytes <= 4 << 20 and "RESOURCE_EXHAUSTED" in up.stats.last_error
    finally:
        up.close(1)
        sink.stop()


def test_a_probe_connection_dropped_before_its_ack_and_resumed_stores_each_step_once() -> None:
    sink = Sink()
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"),
            sink.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            flush_s=3600,
        )
        agent.start()
        try:
            link = AgentLink(str(work / "a.sock"), HELLO)
            link.enqueue("steps", steps(0, 5, rank=3))
            link.pump()
            wait_for(lambda: "steps" in {table for _, table, _ in agent.uploader._queued})
            agent.probes.shutdown()  # taken, not yet spooled nor acknowledged: the connection drops
            wait_for(lambda: (link.pump(), not link.connected)[1])
            link.enqueue("steps", steps(5, 5, rank=3))
            assert (
                not link.flush(0.5) and agent.probes.connections == 2
            )  # resent on the new connection, unacked
            agent.uploader.flush()
            assert link.flush(10.0) and link.acked_rows == 10
            wait_for(lambda: sink.table("steps").num_rows >= 10)
            agent.uploader.flush()
            time.sleep(0.5)
            assert sorted(sink.table("steps")["step"].to_pylist()) == list(range(10))  # each once
            link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
            sink.stop()
