"""Malformed batches, each with a fragment its rejection message must contain."""

from __future__ import annotations

import pyarrow as pa

from argus.proto import collector_pb2 as pb
from tests.collector.wire import batch, sample


def bad_batches(seq0: int) -> list[tuple[str, pb.Batch, str]]:
    """``(case, batch, expected message fragment)`` with seqs ``seq0, seq0 + 1, ...``."""
    steps = sample("steps", n=4)
    kernels = sample("kernel_events", n=4)
    negative = steps.set_column(3, "dur_ns", pa.array([5, -1, 7, 9], pa.int64()))
    wrong_type = steps.set_column(3, "dur_ns", pa.array([5.0, 1.0, 7.0, 9.0], pa.float64()))
    with_null = kernels.set_column(2, "kernel", pa.array(["a", None, "c", "d"], pa.string()))
    extra = steps.append_column("bogus", pa.array([1, 2, 3, 4]))
    unknown_table = batch("steps", steps, seq=0)
    unknown_table.table = 99  # type: ignore[assignment]
    cases = [
        (
            "garbage bytes",
            batch("steps", b"\x00\x01not arrow at all\xff" * 10, seq=0),
            "arrow_ipc: not a readable Arrow IPC stream",
        ),
        ("missing column", batch("steps", steps.drop_columns(["dur_ns"]), seq=0), "missing column(s) dur_ns"),
        (
            "wrong type",
            batch("steps", wrong_type, seq=0),
            "steps.dur_ns: wrong Arrow type, expected int64, got double",
        ),
        ("unspecified table", batch("", steps, seq=0), "table: unknown or unspecified table 0"),
        ("unknown table", unknown_table, "table: unknown or unspecified table 99"),
        ("negative duration", batch("steps", negative, seq=0), "steps.dur_ns: negative value -1"),
        ("empty batch", batch("steps", steps.slice(0, 0), seq=0), "steps: the batch has no rows"),
        ("null value", batch("kernel_events", with_null, seq=0), "kernel_events.kernel: 1 null value(s)"),
        ("extra column", batch("steps", extra, seq=0), "steps: unknown column(s) bogus"),
        ("empty job_id", batch("steps", steps, seq=0, job_id=""), "job_id: empty"),
        ("empty agent_id", batch("steps", steps, seq=0, agent_id=""), "agent_id: empty"),
    ]
    cases += _past_what_the_analyzer_represents()
    for i, (_, b, _) in enumerate(cases):
        b.seq = seq0 + i
    return cases


def _with(data: pa.Table, name: str, values: pa.Array) -> pa.Table:  # type: ignore[type-arg]
    return data.set_column(data.schema.get_field_index(name), name, values)


def _past_what_the_analyzer_represents() -> list[tuple[str, pb.Batch, str]]:
    """Issue 39: values the analyzer cannot represent (a step of 2**64-1 reads -1 after
    ``toInt64``; ``rank << 40 | step`` aliases a step past 2**40; a 5,000-digit line number
    raises in ``int()``; a 40 kB frame label took the old regular expression seconds)."""
    coll = sample("collectives", n=3)
    stacks = sample("stacks", n=2)
    host = sample("host_samples", n=2)
    frames = lambda last: pa.array(["main (t.py:1);f (t.py:2)", f"main (t.py:1);{last}"])  # noqa: E731
    return [
        (
            "step past 2**40",
            batch("collectives", _with(coll, "step", pa.array([1, 2**64 - 1, 3], pa.uint64())), seq=0),
            "collectives.step: 18446744073709551615 is larger than the limit max_step",
        ),
        (
            "seq past 2**40",
            batch("collectives", _with(coll, "seq", pa.array([1, 2, 2**40], pa.uint64())), seq=0),
            "collectives.seq: 1099511627776 is larger than the limit max_seq",
        ),
        (
            "pending seq past 2**40",
            batch("host_samples", _with(host, "pending_seq", pa.array([-1, 2**62], pa.int64())), seq=0),
            "host_samples.pending_seq: 4611686018427387904 is larger than the limit max_seq",
        ),
        (
            "a 5,000-digit line number",
            batch("stacks", _with(stacks, "frames", frames("g (t.py:" + "9" * 5000 + ")")), seq=0),
            "stacks.frames (line): a 5000-digit line number is larger than the limit max_frame_line",
        ),
        (
            "a line number past 2**31-1",
            batch("stacks", _with(stacks, "frames", frames("g (t.py:2147483648)")), seq=0),
            "stacks.frames (line): 2147483648 is larger than the limit max_frame_line",
        ),
        (
            "a 40 kB frame label",
            batch("stacks", _with(stacks, "frames", frames("g (" + "a (" * 13_400 + "t.py:1)")), seq=0),
            "stacks.frames (label bytes): 40210 is larger than the limit max_frame_label_bytes",
        ),
    ]
