"""The node agent in-process over its unix socket and real gRPC: kernel windows, raw dumps, identity."""

from __future__ import annotations

import socket
import time

import numpy as np
import pyarrow as pa
import pytest

from argus.agent.node import NodeAgent
from argus.agent.protocol import FrameType, decode_json, encode_json, read_frame
from argus.agent.sink import AgentLink
from argus.errors import ConfigError
from argus.schema import wire_schema, wire_table
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def kernel_events(rank: int, start_ns: int, n: int) -> pa.Table:
    rng = np.random.default_rng(rank)
    return wire_table(
        "kernel_events",
        {
            "rank": [rank] * n,
            "kind": ["kernel"] * n,
            "kernel": ["gemm"] * (n // 2) + ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] * (n - n // 2),
            "stream": [7] * (n // 2) + [13] * (n - n // 2),
            "device": [0] * n,
            "correlation": list(range(n)),
            "start_ns": [start_ns + 1000 * i for i in range(n)],
            "dur_ns": rng.lognormal(np.log(50_000), 0.1, n).astype(np.int64).tolist(),
        },
    )


HELLO = {
    "version": 1,
    "job_id": "job-n",
    "rank": 3,
    "local_rank": 1,
    "world_size": 8,
    "host": "h",
    "pid": 1,
    "device": "cuda:1",
    "command": "train.py",
    "attach_ns": 5,
}


def test_kernels_become_summaries_raw_events_come_on_request() -> None:
    sink = Sink()
    sink.servicer.clock_skew_ns = 10_000_000_000  # the collector's clock runs 10 s ahead
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"),
            sink.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
            grace_s=0.2,
        )
        agent.start()
        try:
            wait_for(lambda: agent.offset_ns > 9_000_000_000)
            link = AgentLink(str(work / "a.sock"), HELLO)
            now = time.time_ns()
            link.enqueue("kernel_events", kernel_events(3, now - 3_000_000_000, 400))
            ranks = pa.Table.from_pydict(
                {
                    "rank": [3], "event": ["attach"], "time_ns": [now], "local_rank": [1], "world_size": [8],
                    "host": ["h"], "pid": [1], "agent_id": [""], "device": ["cuda:1"], "clock_offset_ns": [0],
                    "exit_code": [0], "group_name": [""], "group_ranks": [[]], "group_backend": [""],
                },
                schema=wire_schema("ranks"),
            )  # fmt: skip
            link.enqueue("ranks", ranks)
            span = (now - 3_100_000_000, now - 2_850_000_000)  # the duty-cycled capture ran 0.25 s
            link.enqueue_capture([span])
            assert link.flush(10)
            wait_for(lambda: sink.table("kernel_summaries").num_rows >= 2)
            s = sink.table("kernel_summaries").to_pandas()
            assert set(s.kernel) == {"gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}
            assert s.groupby("kernel")["count"].sum().tolist() == [200, 200]
            assert (s.window_start_ns % 1_000_000_000 == 0).all()
            assert s.window_start_ns.min() > now  # shifted onto the collector's clock
            # Each summary says how much of its window the rank's capture covered.
            for w, covered in zip(s.window_start_ns, s.covered_ns, strict=True):
                a, b = span[0] + agent.offset_ns, span[1] + agent.offset_ns
                assert covered == max(0, min(b, w + 1_000_000_000) - max(a, w)) > 0
            r = sink.table("ranks").to_pandas()
            assert r.agent_id[0] == agent.agent_id and r.clock_offset_ns[0] == agent.offset_ns
            assert r.time_ns[0] == now + agent.offset_ns
            jobs = sink.table("jobs").to_pandas()
            assert jobs.world_size.tolist() == [8] and jobs.command.tolist() == ["train.py"]

            # Raw events leave the node only when asked for.
            assert sink.table("kernel_events").num_rows == 0
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(work / "a.sock"))
                lo = now + agent.offset_ns - 4_000_000_000
                client.sendall(
                    encode_json(FrameType.DUMP, 0, {"job_id": "job-n", "start_ns": lo, "end_ns": lo + 10**10})
                )
                kind, rows, _ = read_frame(client)  # type: ignore[misc]
            assert (kind, rows) == (FrameType.ACK, 400)
            wait_for(lambda: sink.table("kernel_events").num_rows == 400)
            link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
            sink.stop()


def test_a_second_agent_on_the_same_socket_is_refused() -> None:
    sink = Sink()
    with short_dir() as work:
        first = NodeAgent(
            str(work / "a.sock"), sink.address, str(work / "s1"), 1 << 20, WindowGrid.from_seconds(1.0)
        )
        first.start()
        try:
            second = NodeAgent(
                str(work / "a.sock"), sink.address, str(work / "s2"), 1 << 20, WindowGrid.from_seconds(1.0)
            )
            with pytest.raises(ConfigError, match="already listens"):
                second.start()
        finally:
            first.stop(drain_s=1)
            sink.stop()


def test_stop_ends_the_thread_accepting_probes() -> None:
    """Closing a listening socket does not wake an ``accept()`` blocked in another thread (Linux):
    stop() shuts the socket down first, so the accepting thread has ended when stop() returns
    (before, stop() waited out its 2 s join of it, and so did every `argus run` at its end)."""
    sink = Sink()
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"), sink.address, str(work / "s"), 1 << 20, WindowGrid.from_seconds(1.0)
        )
        agent.start()
        try:
            accept = [t for t in agent._threads if t.name == "argus-accept"]
            assert len(accept) == 1 and accept[0].is_alive()
        finally:
            agent.stop(drain_s=0)
            sink.stop()
        assert not accept[0].is_alive()


def test_hello_json_round_trips() -> None:
    assert decode_json(encode_json(FrameType.HELLO, 0, HELLO)[13:]) == HELLO


def test_a_frame_is_acknowledged_only_once_its_rows_are_spooled() -> None:
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
            steps = pa.Table.from_pydict(
                {"rank": [3], "step": [0], "start_ns": [time.time_ns()], "dur_ns": [5]},
                schema=wire_schema("steps"),
            )
            link.enqueue("steps", steps)
            link.enqueue_capture([(1, 2)])
            assert not link.flush(1.0)  # taken by the agent, but only in memory: not acknowledged
            assert link.pending_rows == 1 and len(agent.spool) == 0
            agent.uploader.flush()
            assert link.flush(10.0) and link.pending_rows == 0
            wait_for(lambda: sink.table("steps").num_rows == 1)
            link.close(0, 2)
        finally:
            agent.stop(drain_s=2)
            sink.stop()
