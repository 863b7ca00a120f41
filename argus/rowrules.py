"""The rules every stored wire row obeys, one owner for the collector and the node agent.

A row breaks a rule when it holds a null (also a null member of a list column), a
declared size past its limit in :mod:`argus.limits` (:data:`~argus.limits.WIRE_COLUMN_LIMITS`,
:data:`~argus.limits.WIRE_LENGTH_LIMITS`: ranks, and steps and sequence numbers the analyzer
can pack), a stack frame past the frame limits (label bytes, line number), or a negative
duration (``dur_ns``).

The collector refuses a batch holding any such row (:func:`check_values`, called by
:func:`argus.collector.ingest.validate_columns` and on every group of batches it stores).
The node agent merges the rows of every rank of its node into one batch per table: one
rank's bad row would cost the whole node's batch, other ranks' acknowledged rows with it.
So the agent applies the same rules to each probe's frame before merging and drops only
the rows that break one (:func:`drop_bad_rows`), counted.

Each rule is checked on whole columns at once (pyarrow compute: one null count, one
``max`` or ``min`` per column); which rows break it is worked out only for a rule that is
broken (:attr:`Fault.rows`), so a clean batch costs the same as the check alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from argus.errors import InvalidBatch
from argus.limits import LIMITS, WIRE_COLUMN_LIMITS, WIRE_LENGTH_LIMITS, check_declared

__all__ = ["NON_NEGATIVE", "Fault", "check_values", "drop_bad_rows", "faults"]

#: Columns that must hold no negative value (durations, ns).
NON_NEGATIVE = ("dur_ns",)

_Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Fault:
    """One rule that some rows of a table break."""

    #: ``"{table}.{column}: ..."``: the rule and the first offending value (the collector's error).
    message: str
    #: The rows that break it: a boolean mask of the table's length, computed when called.
    rows: Callable[[], _Mask]


def _array(column: pa.ChunkedArray[Any] | pa.Array[Any]) -> pa.Array[Any]:
    """One contiguous array of ``column`` (list offsets and row positions of one chunk)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    if column.num_chunks == 1:
        return cast("pa.Array[Any]", column.chunk(0))
    return column.combine_chunks()


def _mask(values: pa.Array[Any]) -> _Mask:
    """A boolean array as numpy, nulls as False."""
    filled = cast("pa.Array[Any]", pc.fill_null(values, pa.scalar(False)))
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _member_rows(column: pa.Array[Any], members: _Mask) -> _Mask:
    """Rows of list ``column`` that hold a member flagged in ``members`` (over its flattened values)."""
    rows = np.zeros(len(column), dtype=bool)
    parents = np.asarray(pc.list_parent_indices(column).to_numpy(), dtype=np.int64)
    rows[parents[members]] = True
    return rows


def _null_rows(column: pa.ChunkedArray[Any] | pa.Array[Any]) -> _Mask:
    column = _array(column)
    rows = _mask(column.is_null())
    if pa.types.is_list(column.type):
        rows |= _member_rows(column, _mask(pc.list_flatten(column).is_null()))
    return rows


def _above_rows(column: pa.ChunkedArray[Any] | pa.Array[Any], top: int) -> _Mask:
    column = _array(column)
    if pa.types.is_list(column.type):
        return _member_rows(column, _mask(pc.greater(pc.list_flatten(column), pa.scalar(top))))
    return _mask(pc.greater(column, pa.scalar(top)))


def _below_zero_rows(column: pa.ChunkedArray[Any] | pa.Array[Any]) -> _Mask:
    return _mask(pc.less(_array(column), pa.scalar(0)))


def faults(table: str, data: pa.Table) -> Iterator[Fault]:
    """The rules some rows of ``data`` (the wire columns of ``table``) break, in checking order:
    nulls per column, declared sizes (members per list, then values), negative durations."""
    yield from _null_faults(table, data)
    yield from _limit_faults(table, data)
    yield from _frame_faults(table, data)
    yield from _negative_faults(table, data)


def _null_faults(table: str, data: pa.Table) -> Iterator[Fault]:
    for field, column in zip(data.schema, data.columns, strict=True):
        nulls = column.null_count
        if pa.types.is_list(column.type) and not nulls:
            nulls = pc.list_flatten(column).null_count
        if nulls:
            message = f"{table}.{field.name}: {nulls} null value(s); nulls are not allowed"
            yield Fault(message, partial(_null_rows, column))


def _limit_faults(table: str, data: pa.Table) -> Iterator[Fault]:
    names = data.schema.names
    for name, limit in WIRE_LENGTH_LIMITS.items():
        if name in names:
            lengths = pc.list_value_length(data.column(name))
            message = _past(table, f"{name} (members)", lengths, limit)
            if message is not None:
                yield Fault(message, partial(_above_rows, lengths, LIMITS[limit]))
    for name, limit in WIRE_COLUMN_LIMITS.items():
        if name in names:
            column = data.column(name)
            values = pc.list_flatten(column) if pa.types.is_list(column.type) else column
            message = _past(table, name, values, limit)
            if message is not None:
                yield Fault(message, partial(_above_rows, column, LIMITS[limit]))


#: A frame label's line number: the digits between its last ``:`` and its closing parenthesis.
_FRAME_LINE = r":(?P<line>[0-9]+)\)$"
#: Digits of the largest line number allowed.
_LINE_DIGITS = len(str(LIMITS["max_frame_line"]))


def _line_rows(stacks: pa.Array[Any], digits: pa.StringArray) -> _Mask:
    width = pc.binary_length(digits)
    wide = cast("pa.Array[Any]", pc.greater(width, pa.scalar(_LINE_DIGITS)))
    short = pc.if_else(wide, pa.scalar("0"), digits)
    big = _mask(
        cast("pa.Array[Any]", pc.greater(pc.cast(short, pa.int64()), pa.scalar(LIMITS["max_frame_line"])))
    )
    return _member_rows(stacks, _mask(wide) | big)


def _frame_faults(table: str, data: pa.Table) -> Iterator[Fault]:
    """Every frame of a ``frames`` column (``;``-joined ``function (file:line)``) at most
    ``max_frame_label_bytes`` long, with a line number at most ``max_frame_line``: the analyzer
    parses each label of a capture (:mod:`argus.analyzer.stacks`). Linear in the bytes checked
    (Arrow's RE2 regular expressions)."""
    if "frames" not in data.schema.names or data.num_rows == 0:
        return
    stacks = cast("pa.Array[Any]", pc.split_pattern(_array(data.column("frames")), ";"))
    # One label per element (the stubs type list_flatten's result as a list array).
    labels = cast("pa.StringArray", pc.list_flatten(stacks))
    lengths = pc.binary_length(labels)
    message = _past(table, "frames (label bytes)", lengths, "max_frame_label_bytes")
    if message is not None:
        top = LIMITS["max_frame_label_bytes"]
        yield Fault(message, lambda: _member_rows(stacks, _mask(pc.greater(lengths, pa.scalar(top)))))
    digits = cast("pa.StringArray", pc.struct_field(pc.extract_regex(labels, _FRAME_LINE), [0]))
    widest = pc.max(pc.binary_length(digits)).as_py()
    if widest is None:
        return
    if widest > _LINE_DIGITS:
        message = (
            f"{table}.frames (line): a {widest}-digit line number is larger than the limit "
            f"max_frame_line = {LIMITS['max_frame_line']}"
        )
    else:
        message = _past(table, "frames (line)", pc.cast(digits, pa.int64()), "max_frame_line")
    if message is not None:
        yield Fault(message, partial(_line_rows, stacks, digits))


def _negative_faults(table: str, data: pa.Table) -> Iterator[Fault]:
    for name in NON_NEGATIVE:
        if name in data.schema.names:
            column = data.column(name)
            smallest = pc.min(column).as_py()
            if smallest is not None and smallest < 0:
                message = f"{table}.{name}: negative value {smallest}; durations are >= 0 ns"
                yield Fault(message, partial(_below_zero_rows, column))


def _past(table: str, name: str, values: pa.Array[Any] | pa.ChunkedArray[Any], limit: str) -> str | None:
    """The message of the largest of ``values`` when it is past ``limit``, else None."""
    largest = pc.max(values).as_py()
    if largest is None:
        return None
    try:
        check_declared(name, largest, limit, lowest=-(2**63))
    except ValueError as exc:
        return f"{table}.{exc}"
    return None


def check_values(table: str, data: pa.Table) -> None:
    """Check the values of ``data`` (the wire columns of ``table``, conformed): no row breaks a rule.
    One call checks the rows of many batches of a table at once (the collector's group write).

    Raises:
        InvalidBatch: the first rule broken (:attr:`Fault.message`).
    """
    for fault in faults(table, data):
        raise InvalidBatch(fault.message)


def drop_bad_rows(table: str, data: pa.Table) -> tuple[pa.Table, int, list[str]]:
    """``data`` without the rows that break a rule (what :func:`check_values` would refuse).

    Args:
        data: Rows with the wire columns of ``table``.

    Returns:
        ``(rows kept, rows dropped, the message of every rule broken)``; ``data`` itself when
        no row breaks one. The rows kept pass :func:`check_values`.
    """
    found = list(faults(table, data))
    if not found:
        return data, 0, []
    bad = np.zeros(data.num_rows, dtype=bool)
    for fault in found:
        bad |= fault.rows()
    return data.filter(pa.array(~bad)), int(bad.sum()), [f.message for f in found]
