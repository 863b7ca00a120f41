"""Rows whose end precedes their start: dropped where they are made, and counted.

A ``dur_ns`` below zero is not a measurement (a wall clock stepped back between a span's two
ends, a CUPTI record with a torn timestamp, a bug in a hook). The collector refuses a whole
batch holding one (:mod:`argus.rowrules`), and the node agent coalesces the rows of every rank
of a node into one batch per table: a single bad row would cost the node's batch. So the probe
drops such rows before it ships them (counted with its dropped events, which reach the node
agent in ``host_samples.dropped_events``), and the node agent drops any row that still breaks
one of the collector's row rules (:func:`argus.rowrules.drop_bad_rows`) before it batches them,
counted as dropped rows of the next batch (``Batch.dropped_events``) and logged.

Dropped rather than clamped to 0: a zero-length step, phase or kernel is a value the analyzer
would take as real.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pyarrow as pa

__all__ = ["drop_negative_durations"]

_Rows = TypeVar("_Rows", pa.Table, pa.RecordBatch)


def drop_negative_durations(data: _Rows) -> tuple[_Rows, int]:
    """``data`` without the rows whose ``dur_ns`` is below zero, and how many were dropped.

    Args:
        data: Rows of any wire table (a table without ``dur_ns`` is returned as it is).

    Returns:
        ``(rows kept, rows dropped)``; ``data`` itself when none is dropped.
    """
    if "dur_ns" not in data.schema.names or data.num_rows == 0:
        return data, 0
    negative = np.asarray(data.column("dur_ns").to_numpy()) < 0
    dropped = int(negative.sum())
    if not dropped:
        return data, 0
    return data.filter(pa.array(~negative)), dropped
