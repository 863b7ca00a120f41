"""The probe's rows, typed: one NamedTuple per table, fields named as the table's wire columns.

Training threads build these (a NamedTuple is a tuple: :class:`~argus.agent.buffers.RowBuffer`
stores it as cheaply), the shipper turns a list of them into an Arrow batch by field name
(:func:`record_batch`), so a column added to a table is added here once, by name, and never
found by its position. What every row of a batch shares (the rank, its host...) is given once
per batch as constants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from argus.schema import PHASES, TABLES, wire_schema

__all__ = ["CollectiveRow", "HostRow", "PhaseRow", "RankEvent", "StepRow", "record_batch"]


class StepRow(NamedTuple):
    """One step of ``steps``."""

    step: int
    start_ns: int
    dur_ns: int


class PhaseRow(NamedTuple):
    """One phase of ``phases``; ``phase_code`` indexes :data:`argus.schema.PHASES`."""

    step: int
    phase_code: int
    start_ns: int
    dur_ns: int


class CollectiveRow(NamedTuple):
    """One completed collective of ``collectives`` (see its column docs)."""

    step: int
    process_group: str
    seq: int
    op: str
    bytes: int
    issue_ns: int
    start_ns: int
    dur_ns: int
    peer: int
    overlapped: int
    #: When the rank began waiting for it, if in a later ``wait()`` (isend/irecv); 0: unknown.
    wait_ns: int = 0


class RankEvent(NamedTuple):
    """One lifecycle event of ``ranks``: ``attach``, ``group`` (with the group) or ``exit``."""

    event: str
    time_ns: int
    exit_code: int
    group_name: str
    group_ranks: list[int]
    group_backend: str


class HostRow(NamedTuple):
    """One host sample of ``host_samples`` (:class:`~argus.agent.host.HostSampler`), with the
    probe's dropped count and its oldest pending collective."""

    time_ns: int
    interval_ns: int
    proc_cpu_ns: int
    host_cpu_pct: float
    gc_pause_ns: int
    gc_count: int
    rss_bytes: int
    gpu_sm_clock_mhz: int
    gpu_temp_c: float
    gpu_power_w: float
    gpu_util_pct: float
    gpu_throttle_reasons: int
    run_delay_ns: int
    dropped_events: int
    pending_group: str
    pending_seq: int
    pending_op: str
    pending_issue_ns: int


#: Wire columns made from a row's other fields: table → column → maker.
_DERIVED: dict[str, dict[str, Callable[[dict[str, Sequence[Any]]], list[Any]]]] = {
    "phases": {"phase": lambda cols: [PHASES[c] for c in cols["phase_code"]]},
}


def record_batch(table: str, rows: Sequence[tuple[Any, ...]], constants: Mapping[str, Any]) -> pa.RecordBatch:
    """The Arrow batch of ``table``'s wire schema holding ``rows`` (records of one type of this module).

    Each wire column comes from the rows' field of that name, else from a field it is made
    from (``phases.phase`` from ``phase_code``), else from ``constants`` (one value for the
    batch), else from the column's schema default (a column added to the table later, which
    the probe does not fill: the node agent's link columns of ``host_samples``).

    Raises:
        TypeError: the rows are not records (NamedTuples) of this module.
        KeyError: a wire column without a default is in neither the rows nor ``constants``.
    """
    schema = wire_schema(table)
    n = len(rows)
    fields = getattr(rows[0], "_fields", None)
    if fields is None:
        raise TypeError(f"{table}: rows must be records of argus.agent.rows, got {type(rows[0]).__name__}")
    columns: dict[str, Sequence[Any]] = dict(zip(fields, zip(*rows, strict=True), strict=True))
    for name, make in _DERIVED.get(table, {}).items():
        columns[name] = make(columns)
    defaults = {c.name: c.default for c in TABLES[table].columns if c.default is not None}
    arrays = []
    for field in schema:
        values = columns.get(field.name)
        if values is None:
            value = constants[field.name] if field.name in constants else defaults[field.name]
            values = [value] * n
        arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
