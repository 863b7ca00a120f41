"""Bad inputs as a buggy process or an attacker on a node sends them (issue 39), made in one place
for the tests that show each is refused and for ``bench/soak.py``, which sends them all while
real traffic flows.

Into a node agent (probe frames, wire tables of one rank):

- :func:`corrupt_kernel_events`: string offsets 1 GiB past the data and a negative ``dur_ns``
  (read without a full validation, filtering it crashed the agent): refused, ``REFUSED``;
- :func:`bad_steps`: one good step beside a null, a rank past ``max_rank`` and an end before its
  start: the agent drops the three and counts them.

Into the collector (Arrow IPC payloads of gRPC batches):

- :func:`past_what_the_analyzer_represents`: steps, sequence numbers, line numbers and frame
  labels the analyzer cannot represent or parse cheaply: ``REJECTED`` at ingest;
- :func:`inflating_steps`: a few kB of ZSTD that decode to ``decoded_bytes`` and are then
  ``REJECTED`` (the last row ends before it starts, or an unknown column): held decoded meanwhile,
  charged against the server's decoded-bytes budget (``--max-decoded-bytes``);
- :func:`zstd_bomb`: ZSTD buffers that declare 1 TiB decoded: ``REJECTED`` from the metadata.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pyarrow as pa

from argus.limits import MAX_RANK
from argus.schema import wire_schema
from synthetic.wire import T0_NS, sample

__all__ = [
    "bad_steps",
    "corrupt_kernel_events",
    "inflating_steps",
    "past_what_the_analyzer_represents",
    "zstd_bomb",
    "zstd_ipc",
]


def corrupt_kernel_events(rank: int) -> pa.Table:
    """Four kernel events of ``rank`` whose ``kernel`` string offsets point 1 GiB past the data,
    one with a negative ``dur_ns`` (filtering them reads past the buffer: SIGSEGV without a full
    validation)."""
    n = 4
    schema = wire_schema("kernel_events")
    good = pa.Table.from_pydict(
        {
            "rank": [rank] * n,
            "kind": ["kernel"] * n,
            "kernel": ["gemm"] * n,
            "stream": [7] * n,
            "device": [0] * n,
            "correlation": list(range(n)),
            "start_ns": [time.time_ns() + i for i in range(n)],
            "dur_ns": [5, -1, 5, 5],
            "graph_id": [0] * n,
            "graph_node_id": [0] * n,
        },
        schema=schema,
    )
    offsets = pa.py_buffer(np.array([0, 4, 1 << 30, 8, 16], np.int32).tobytes())
    kernel = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(b"gemm" * 4))
    return good.set_column(schema.get_field_index("kernel"), schema.field("kernel"), kernel)


def bad_steps(rank: int) -> pa.Table:
    """Four steps of ``rank``: one good, a null step, a rank past ``max_rank`` and an end before its
    start (three rows the row rules of :mod:`argus.rowrules` drop)."""
    return pa.Table.from_arrays(
        [
            pa.array([rank, rank, MAX_RANK + 1, rank], pa.uint32()),
            pa.array([0, None, 2, 3], pa.uint64()),
            pa.array([time.time_ns() + i for i in range(4)], pa.int64()),
            pa.array([7, 7, 7, -7], pa.int64()),
        ],
        schema=wire_schema("steps"),
    )


def _with(data: pa.Table, name: str, values: pa.Array) -> pa.Table:  # type: ignore[type-arg]
    return data.set_column(data.schema.get_field_index(name), name, values)


def past_what_the_analyzer_represents() -> list[tuple[str, str, pa.Table, str]]:
    """``(case, table, rows, fragment of the refusal)``: values the analyzer cannot represent (a
    step of 2**64-1 reads -1 after ``toInt64``; ``rank << 40 | step`` aliases a step past 2**40;
    a 5,000-digit line number raises in ``int()``; a 40 kB frame label took the old regular
    expression seconds). Each is refused at ingest naming the field and the limit."""
    coll = sample("collectives", n=3)
    stacks = sample("stacks", n=2)
    host = sample("host_samples", n=2)
    frames = lambda last: pa.array(["main (t.py:1);f (t.py:2)", f"main (t.py:1);{last}"])  # noqa: E731
    return [
        (
            "step past 2**40",
            "collectives",
            _with(coll, "step", pa.array([1, 2**64 - 1, 3], pa.uint64())),
            "collectives.step: 18446744073709551615 is larger than the limit max_step",
        ),
        (
            "seq past 2**40",
            "collectives",
            _with(coll, "seq", pa.array([1, 2, 2**40], pa.uint64())),
            "collectives.seq: 1099511627776 is larger than the limit max_seq",
        ),
        (
            "pending seq past 2**40",
            "host_samples",
            _with(host, "pending_seq", pa.array([-1, 2**62], pa.int64())),
            "host_samples.pending_seq: 4611686018427387904 is larger than the limit max_seq",
        ),
        (
            "a 5,000-digit line number",
            "stacks",
            _with(stacks, "frames", frames("g (t.py:" + "9" * 5000 + ")")),
            "stacks.frames (line): a 5000-digit line number is larger than the limit max_frame_line",
        ),
        (
            "a line number past 2**31-1",
            "stacks",
            _with(stacks, "frames", frames("g (t.py:2147483648)")),
            "stacks.frames (line): 2147483648 is larger than the limit max_frame_line",
        ),
        (
            "a 40 kB frame label",
            "stacks",
            _with(stacks, "frames", frames("g (" + "a (" * 13_400 + "t.py:1)")),
            "stacks.frames (label bytes): 40210 is larger than the limit max_frame_label_bytes",
        ),
    ]


def zstd_ipc(data: pa.Table) -> bytes:
    """``data`` as an Arrow IPC stream whose record batch bodies are ZSTD-compressed."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(data)
    return bytes(sink.getvalue().to_pybytes())


def inflating_steps(decoded_bytes: int, *, extra_column: bool = False) -> bytes:
    """One ZSTD batch of ``steps`` of a few kB that decodes to about ``decoded_bytes`` (every row
    alike) and is refused once decoded: its last row ends before it starts (refused where the
    writer checks its values), or with ``extra_column`` it carries a column the wire table does
    not have (refused where it is decoded)."""
    columns = {"rank": pa.uint32(), "step": pa.uint64(), "start_ns": pa.int64(), "dur_ns": pa.int64()}
    if extra_column:
        columns["bogus"] = pa.int64()
    n = max(decoded_bytes // sum(t.bit_width // 8 for t in columns.values()), 2)
    dur_ns = np.full(n, 1_000, np.int64)
    dur_ns[-1] = -1
    values = {"start_ns": np.full(n, T0_NS, np.int64), "dur_ns": dur_ns}
    return zstd_ipc(
        pa.table({name: values.get(name, np.zeros(n, t.to_pandas_dtype())) for name, t in columns.items()})
    )


def zstd_bomb() -> bytes:
    """A ZSTD batch of 1,000 kernel events whose int64 buffers each declare 1 TiB decoded."""
    payload = zstd_ipc(sample("kernel_events", n=1000))
    assert payload.count(struct.pack("<q", 8000)) >= 1
    return payload.replace(struct.pack("<q", 8000), struct.pack("<q", 2**40))
