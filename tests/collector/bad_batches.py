"""Malformed batches, each with a fragment its rejection message must contain."""

from __future__ import annotations

import pyarrow as pa

from argus.proto import collector_pb2 as pb
from synthetic.bad_inputs import past_what_the_analyzer_represents
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
    # Issue 39: values the analyzer cannot represent.
    cases += [
        (case, batch(t, data, seq=0), text) for case, t, data, text in past_what_the_analyzer_represents()
    ]
    for i, (_, b, _) in enumerate(cases):
        b.seq = seq0 + i
    return cases
