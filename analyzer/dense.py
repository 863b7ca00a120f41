"""``np.unique`` of integer keys by counting instead of sorting, where the keys span little.

A window's keys are mostly small dense integers: ranks (below the world size), process-group
codes, step numbers, a rank × group product. ``np.unique`` sorts them, O(n log n): on the
800,000 collective rows of a 10,000-rank window each call costs 60-100 ms, and one window's
analysis made a dozen. When the keys' span (``max - min + 1``) is at most a few times their
number, a ``bincount`` over the span gives the same sorted values, inverse and counts in
O(n + span). Keys that span widely (ns timestamps, keys packed by bit shifts) and keys that
are no integers go to ``np.unique``. :func:`unique` and :func:`unique_all` (with numpy's names for
its parts, ``unique_inverse`` and ``unique_counts``) are ``np.unique`` with its flags, and
:func:`unique_pairs` is its ``axis=0`` form for two integer columns; their results are exactly
numpy's: the same values, ascending, in the keys' dtype.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

__all__ = ["unique", "unique_all", "unique_counts", "unique_inverse", "unique_pairs"]

#: The counting path is taken when the span is at most this many times the number of keys
#: (plus :data:`_MIN_SPAN`): its bincount then costs no more than a few passes over the keys.
_SPAN_PER_KEY = 4
_MIN_SPAN = 1 << 16

_K = TypeVar("_K", bound=np.generic)
Index = NDArray[np.intp]


def unique(x: NDArray[_K]) -> NDArray[_K]:
    """``np.unique(x)``: the distinct values of keys ``(n,)``, ascending, in ``x``'s dtype."""
    counted = _count(x)
    return counted[0] if counted is not None else np.unique(x)


def unique_inverse(x: NDArray[_K]) -> tuple[NDArray[_K], Index]:
    """``np.unique(x, return_inverse=True)``: the values and, per key, its value's index ``(n,)``."""
    values, inverse, _ = unique_all(x)
    return values, inverse


def unique_counts(x: NDArray[_K]) -> tuple[NDArray[_K], Index]:
    """``np.unique(x, return_counts=True)``: the values and how many keys hold each."""
    values, _, counts = unique_all(x)
    return values, counts


def unique_all(x: NDArray[_K]) -> tuple[NDArray[_K], Index, Index]:
    """``np.unique(x, return_inverse=True, return_counts=True)``: values, inverse ``(n,)``, counts."""
    counted = _count(x)
    if counted is None:
        values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
        return values, inverse.reshape(-1), counts
    values, offset, present, all_counts = counted
    return values, (np.cumsum(present, dtype=np.intp) - 1)[offset], all_counts[present]


def unique_pairs(
    a: NDArray[np.int64], b: NDArray[np.int64], n_b: int
) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """``np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)`` of integer pairs.

    Each pair is one int64, ``a · n_b + b`` (the same order: ``a`` major), so the unique is of
    one column, not of rows (numpy sorts rows as opaque records, several times slower).

    Args:
        a, b: The pairs' columns, shape ``(n,)``; ``b`` in ``[0, n_b)``.
        n_b: A bound of ``b``.

    Returns:
        ``(pairs, inverse)``: the distinct pairs ``(m, 2)`` in lexicographic order, and per
        pair its index ``(n,)``.
    """
    if a.size == 0 or b.min() < 0 or b.max() >= n_b or int(np.abs(a).max()) >= 2**62 // max(n_b, 1):
        pairs, inverse = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
        return pairs, inverse.reshape(-1)
    values, inverse = unique_inverse(a.astype(np.int64) * n_b + b)
    return np.stack([values // n_b, values % n_b], axis=1), inverse


def _count(a: NDArray[_K]) -> tuple[NDArray[_K], Index, NDArray[np.bool_], Index] | None:
    """Keys counted over their span: ``(values, offset of each key, present, counts per offset)``;
    None where they are no 1-D integers, are empty or span too widely (``np.unique``'s case)."""
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
        return None
    lo, hi = int(a.min()), int(a.max())
    span = hi - lo + 1
    if span > _SPAN_PER_KEY * a.size + _MIN_SPAN or hi > np.iinfo(np.intp).max:
        return None
    offset = a.astype(np.intp, copy=False)  # before the subtraction: a narrow dtype would wrap
    if lo:
        offset = offset - lo
    counts = np.bincount(offset, minlength=span)
    present = counts > 0
    return (np.flatnonzero(present) + lo).astype(a.dtype, copy=False), offset, present, counts
