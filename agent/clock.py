"""Clock offset between a node and its collector, NTP-style (RFC 5905's offset estimate), and its use.

For one round trip with the agent's send time ``t0``, the collector's time ``ts``
and the agent's receive time ``t1``, the offset is ``ts - (t0 + t1) / 2`` with
error at most half the round trip. Of a few round trips the one with the
shortest round trip wins. The agent *adds* the offset to every timestamp it
forwards (:func:`shift_times` for table rows, :func:`shift_spans` for capture spans), so all
nodes share the collector's clock. Which columns are instants is said once, in the schema
(:attr:`argus.schema.Column.epoch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from argus.schema import TABLES

__all__ = ["ClockEstimate", "estimate_offset", "shift_spans", "shift_times"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClockEstimate:
    """One estimate: offset to add (ns), its round trip (ns) and when it was made."""

    offset_ns: int
    rtt_ns: int
    at_ns: int


def estimate_offset(
    ask: Callable[[int], int], samples: int = 8, now: Callable[[], int] = time.time_ns
) -> ClockEstimate:
    """Estimate the offset from ``samples`` round trips of ``ask``.

    Args:
        ask: Sends the agent's time and returns the collector's time, ns since the epoch.
        samples: Round trips to make; the shortest wins.
        now: The agent's clock.

    Raises:
        Exception: whatever ``ask`` raises (the caller keeps its previous estimate).
    """
    best: ClockEstimate | None = None
    for _ in range(samples):
        t0 = now()
        server = ask(t0)
        t1 = now()
        est = ClockEstimate(server - (t0 + t1) // 2, t1 - t0, t1)
        if best is None or est.rtt_ns < best.rtt_ns:
            best = est
    assert best is not None
    return best


def shift_times(table: str, data: pa.Table, offset_ns: int) -> pa.Table:
    """``data`` (rows of ``table``) with ``offset_ns`` added to every instant column.

    Instant columns are those the schema marks ``epoch``; one marked ``zero_is_none`` keeps its
    zeros. Other columns (durations, counts) are left alone.

    Raises:
        KeyError: ``table`` is not a table of :mod:`argus.schema`.
    """
    if offset_ns == 0:
        return data
    offset = pa.scalar(offset_ns, pa.int64())
    for column in TABLES[table].columns:
        if not column.epoch or column.name not in data.column_names:
            continue
        i = data.schema.get_field_index(column.name)
        values = data[column.name]
        shifted = pc.add(values, offset)
        if column.zero_is_none:
            shifted = pc.if_else(pc.equal(values, pa.scalar(0, pa.int64())), values, shifted)
        data = data.set_column(i, column.name, shifted)
    return data


def shift_spans(spans: Sequence[tuple[int, int]], offset_ns: int) -> list[tuple[int, int]]:
    """``(start_ns, end_ns)`` spans moved by ``offset_ns`` (a probe's CUPTI capture spans)."""
    return [(int(a) + offset_ns, int(b) + offset_ns) for a, b in spans]
