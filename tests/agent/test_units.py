"""Unit tests of single functions: step/phase state machine, socket protocol, buffers, clock, autoattach."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from argus.agent.buffers import RowBuffer
from argus.agent.clock import estimate_offset, shift_times
from argus.agent.protocol import (
    FrameType,
    ProtocolError,
    decode_batch,
    encode_batch,
    encode_frame,
    read_frame,
)
from argus.agent.steps import BACKWARD, DATA, FORWARD, OPTIMIZER, StepTracker
from argus.schema import wire_schema, wire_table


def tracker() -> tuple[StepTracker, RowBuffer, RowBuffer]:
    steps, phases = RowBuffer(100), RowBuffer(100)
    return StepTracker(steps, phases, attach_ns=0), steps, phases


def test_a_step_ends_when_the_optimizer_returns_and_phases_nest() -> None:
    t, steps, phases = tracker()
    for code, a, b in [(DATA, 10, 20), (FORWARD, 20, 50), (BACKWARD, 50, 90), (OPTIMIZER, 90, 100)]:
        assert t.begin(code, a)
        t.end(code, b)
    t.begin(DATA, 105)  # the next step's first phase closes step 0 at the optimizer's return
    assert steps.take() == [(0, 10, 90)]
    assert phases.take() == [
        (0, DATA, 10, 10),
        (0, FORWARD, 20, 30),
        (0, BACKWARD, 50, 40),
        (0, OPTIMIZER, 90, 10),
    ]
    assert t.step == 1


def test_nested_phases_are_not_rows_and_same_phases_merge() -> None:
    t, steps, phases = tracker()
    t.begin(FORWARD, 0)
    t.end(FORWARD, 10)
    t.begin(FORWARD, 12)  # loss module right after the model: merged
    t.end(FORWARD, 15)
    t.begin(BACKWARD, 20)
    assert not t.begin(FORWARD, 25)  # activation checkpointing recompute inside backward
    t.end(-1, 0)
    t.end(BACKWARD, 40)
    t.mark_step(41)
    assert phases.take() == [(0, FORWARD, 0, 15), (0, BACKWARD, 20, 20)]
    assert steps.take() == [(0, 0, 41)]


def test_the_forward_and_backward_of_an_optimizer_closure_are_rows_of_their_own() -> None:
    """``optimizer.step(closure)`` (Lightning, LBFGS): forward and backward run inside the
    optimizer phase; they are rows, the optimizer's rows keep the rest, and a forward that begins
    inside the next step's optimizer closes the held step (its end is the last optimizer's)."""
    t, steps, phases = tracker()
    for base in (0, 100):
        assert t.begin(OPTIMIZER, base)
        assert t.begin(FORWARD, base + 5)
        assert not t.begin(FORWARD, base + 6)  # a submodule: nested
        t.end(-1, 0)
        t.end(FORWARD, base + 30)
        assert t.begin(BACKWARD, base + 32)
        t.end(BACKWARD, base + 80)
        t.end(OPTIMIZER, base + 90)
    t.finish()
    assert steps.take() == [(0, 0, 90), (1, 90, 100)]
    assert phases.take() == [
        (0, OPTIMIZER, 0, 5),
        (0, FORWARD, 5, 25),
        (0, OPTIMIZER, 30, 2),
        (0, BACKWARD, 32, 48),
        (0, OPTIMIZER, 80, 10),
        (1, OPTIMIZER, 100, 5),
        (1, FORWARD, 105, 25),
        (1, OPTIMIZER, 130, 2),
        (1, BACKWARD, 132, 48),
        (1, OPTIMIZER, 180, 10),
    ]


def test_two_optimizers_make_one_step_and_idle_flush_closes_it() -> None:
    t, steps, phases = tracker()
    t.begin(BACKWARD, 0)
    t.end(BACKWARD, 10)
    for a in (10, 20):
        t.begin(OPTIMIZER, a)
        t.end(OPTIMIZER, a + 5)
    assert t.event_step() == 1 and steps.take() == []
    t.flush_idle(now_ns=1_000, idle_ns=100)
    assert steps.take() == [(0, 0, 25)]
    assert phases.take() == [(0, BACKWARD, 0, 10), (0, OPTIMIZER, 10, 15)]


def test_row_buffer_drops_and_counts_when_full() -> None:
    b = RowBuffer(3)
    for i in range(5):
        b.append((i,))
    assert b.take() == [(0,), (1,), (2,)] and b.dropped == 2
    b.append((9,))
    assert b.take() == [(9,)]


def test_frames_round_trip_over_a_socket() -> None:
    data = pa.Table.from_pydict(
        {"rank": [1], "step": [2], "start_ns": [3], "dur_ns": [4]}, schema=wire_schema("steps")
    )
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_batch(7, "steps", data) + encode_frame(FrameType.ACK, 7))
        kind, seq, payload = read_frame(b)  # type: ignore[misc]
        assert (kind, seq) == (FrameType.BATCH, 7)
        name, got = decode_batch(payload)
        assert name == "steps" and got.equals(data)
        assert read_frame(b)[:2] == (FrameType.ACK, 7)  # type: ignore[index]
        a.close()
        assert read_frame(b) is None


def test_bad_frames_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        decode_batch(bytes([99]) + b"xx")
    wrong = pa.table({"x": [1]})
    with pytest.raises(ProtocolError, match="schema"):
        decode_batch(encode_batch(1, "steps", wrong)[13:])
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"\x05\x00\x00\x00\x63" + b"\x00" * 8)
        with pytest.raises(ProtocolError, match="frame type"):
            read_frame(b)


def test_clock_estimate_picks_the_shortest_round_trip() -> None:
    clock = iter([0, 100, 1000, 1010, 2000, 2400])
    replies = iter([10_050, 11_005, 12_300])
    est = estimate_offset(lambda _t: next(replies), samples=3, now=lambda: next(clock))
    assert (est.offset_ns, est.rtt_ns) == (11_005 - 1005, 10)


def test_offset_shifts_only_time_columns() -> None:
    data = pa.Table.from_pydict(
        {"rank": [1], "step": [2], "start_ns": [3], "dur_ns": [4]}, schema=wire_schema("steps")
    )
    got = shift_times("steps", data, 100).to_pylist()[0]
    assert got == {"rank": 1, "step": 2, "start_ns": 103, "dur_ns": 4}


def test_cupti_steps_aside_while_a_user_profiler_runs() -> None:
    import torch
    import torch.autograd.profiler as ap

    from argus.agent import profiler_yield

    saved = ap.profile._prepare_trace, ap.profile.__exit__
    calls: list[str] = []
    try:
        profiler_yield.install(
            lambda: calls.append("release"), lambda: calls.append("resume"), lambda p: True
        )
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            calls.append("user")
            torch.ones(4).sum()
    finally:
        ap.profile._prepare_trace, ap.profile.__exit__ = saved
    assert calls == ["release", "user", "resume"]


def test_a_zero_pending_issue_time_stays_zero_when_shifted() -> None:
    cols = {f.name: [0, 0] for f in wire_schema("host_samples")}
    cols.update(host=["h", "h"], pending_group=["", "0"], pending_op=["", "allreduce"], net_if=["", ""])
    cols.update(time_ns=[10, 20], pending_seq=[-1, 4], pending_issue_ns=[0, 15])
    data = pa.Table.from_pydict(cols, schema=wire_schema("host_samples"))
    got = shift_times("host_samples", data, 1000).to_pydict()
    assert got["time_ns"] == [1010, 1020] and got["pending_issue_ns"] == [0, 1015]


class _Group:
    """A stand-in process group for the probe's numbering (hashable, named)."""

    def __init__(self, name: str) -> None:
        self.group_name = name


def test_oldest_pending_collective_is_the_earliest_issued_not_completed() -> None:
    from argus.agent.recorder import Recorder

    probe = Recorder(attach_ns=0)
    world, pair = _Group("0"), _Group("1")
    assert probe.oldest_pending() == ("", -1, "", 0)
    a = probe.open_collective(world, "allreduce", 64, 100)
    b = probe.open_collective(pair, "broadcast", 8, 200)
    c = probe.open_collective(world, "allreduce", 64, 300)
    assert probe.oldest_pending() == ("0", 0, "allreduce", 100)
    probe.close_collective(a, 150)
    assert probe.oldest_pending() == ("1", 0, "broadcast", 200)
    probe.close_collective(b, 250)
    assert probe.oldest_pending() == ("0", 1, "allreduce", 300)
    probe.close_collective(c, 350)
    assert probe.oldest_pending() == ("", -1, "", 0)
    rows = probe.buffers["collectives"].take()
    assert [(r[1], r[2], r[3], r[5], r[7]) for r in rows] == [
        ("0", 0, "allreduce", 100, 50),
        ("1", 0, "broadcast", 200, 50),
        ("0", 1, "allreduce", 300, 50),
    ]
    probe.close_collective(c, 400)  # completing twice records nothing more
    assert len(probe.buffers["collectives"]) == 0


def test_pending_collectives_are_bounded_and_the_excess_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from argus.agent import recorder as recorder_module

    monkeypatch.setattr(recorder_module, "MAX_PENDING", 3)
    probe = recorder_module.Recorder(attach_ns=0)
    world = _Group("0")
    keys = [probe.open_collective(world, "allreduce", 4, t) for t in range(5)]
    assert keys[3:] == [0, 0] and all(keys[:3])
    assert probe.dropped() == 2
    probe.active = False
    assert probe.open_collective(world, "allreduce", 4, 9) == 0


def test_a_probe_batch_without_later_columns_is_filled_with_their_defaults() -> None:
    """A probe that predates the graph columns still talks to this node agent."""

    events = wire_table(
        "kernel_events",
        {
            "rank": [1],
            "kind": ["kernel"],
            "kernel": ["gemm"],
            "stream": [7],
            "device": [0],
            "correlation": [3],
            "start_ns": [10],
            "dur_ns": [5],
        },
    ).drop_columns(["graph_id", "graph_node_id"])
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_batch(4, "kernel_events", events))
        frame = read_frame(b)
    assert frame is not None
    name, data = decode_batch(frame[2])
    assert name == "kernel_events" and data.schema == wire_schema("kernel_events")
    assert data["graph_id"].to_pylist() == [0] and data["graph_node_id"].to_pylist() == [0]
