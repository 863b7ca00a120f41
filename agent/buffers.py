"""Bounded, preallocated row buffers: the only thing the probe's hot path touches.

A recording site appends one typed row (a NamedTuple of :mod:`argus.agent.rows`)
to a :class:`RowBuffer` (a slot store into a preallocated list under an
uncontended lock, ~0.1 µs). The shipper thread swaps the full list for its
spare and turns the rows into Arrow columns off the hot path. The shipper ships on a timer, and
earlier when a buffer reaches half its capacity (:meth:`RowBuffer.wake_at_half`: the row that
fills it to half sets the shipper's event, once per fill), so a burst of rows is taken before the
buffer is full whatever the timer's period. When the shipper falls behind and the buffer
is full, the row is dropped and counted, never blocking the caller.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["RowBuffer"]


class RowBuffer:
    """A fixed-capacity buffer of row tuples, double-buffered.

    Args:
        capacity: Rows held between two :meth:`take` calls; further rows are
            dropped and counted in :attr:`dropped`.
    """

    __slots__ = ("_capacity", "_half", "_lock", "_n", "_rows", "_spare", "_wake", "dropped")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._rows: list[Any] = [None] * capacity
        self._spare: list[Any] = [None] * capacity
        self._n = 0
        self._lock = threading.Lock()
        #: Rows refused because the buffer was full (monotonic).
        self.dropped = 0
        #: Set when the buffer reaches ``_half`` rows (:meth:`wake_at_half`); None: nobody to wake.
        self._wake: threading.Event | None = None
        self._half = max(capacity // 2, 1)

    def wake_at_half(self, event: threading.Event) -> None:
        """Set ``event`` whenever an append brings the buffer to half its capacity (the shipper's
        wake-up: it takes the rows before the buffer fills)."""
        self._wake = event

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return self._n

    def append(self, row: tuple[Any, ...]) -> None:
        """Store one row; drop and count it when the buffer is full. The row that brings the buffer
        to half its capacity sets the event of :meth:`wake_at_half`."""
        with self._lock:
            n = self._n
            if n < self._capacity:
                self._rows[n] = row
                self._n = n + 1
            else:
                self.dropped += 1
            if n + 1 == self._half and self._wake is not None:
                self._wake.set()

    def take(self) -> list[tuple[Any, ...]]:
        """All rows appended since the last call, oldest first; empties the buffer."""
        with self._lock:
            rows, n = self._rows, self._n
            if n == 0:
                return []
            self._rows, self._spare = self._spare, rows
            self._n = 0
        out = rows[:n]
        rows[:n] = [None] * n
        return out
