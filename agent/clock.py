"""Clock offset between a node and its collector (NTP-style, RFC 5905's estimate), clock steps, and their use.

For one round trip with the agent's send time ``t0``, the collector's time ``ts``
and the agent's receive time ``t1``, the offset is ``ts - (t0 + t1) / 2`` with
error at most half the round trip. Of a few round trips the one with the
shortest round trip wins. The agent *adds* the offset to every timestamp it
forwards (:func:`shift_times` for table rows, :func:`shift_spans` for capture spans), so all
nodes share the collector's clock. Which columns are instants is said once, in the schema
(:attr:`argus.schema.Column.epoch`).

A node's wall clock can *step* (an NTP daemon or an operator setting it): every
timestamp taken after the step is off by the step, while durations measured on
the monotonic clock are not. :class:`StepDetector` notices a step as a jump of
``wall − monotonic`` between two checks (NTP slews the clock by at most 500 ppm,
far below :data:`STEP_NS`); :class:`OffsetMap` then gives timestamps from before
and after the step the offsets of their own epoch, by the timestamp's value. A
forward step leaves a gap of stamps no process can take, so every stamp is
placed; after a backward step the stamps of its overlap are taken as
post-step ones (rows from just before the step that the agent forwards after
noticing it, at most a probe's flush period, are then off by the step).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from argus.schema import TABLES

__all__ = [
    "CLOCK_CHECK_S",
    "CLOCK_EVERY_S",
    "CLOCK_MIN_CHANGE_NS",
    "DURATIONS",
    "STEP_NS",
    "ClockEstimate",
    "ClockStep",
    "CollectorClock",
    "OffsetMap",
    "StepDetector",
    "estimate_offset",
    "shift_spans",
    "shift_times",
]

#: Seconds between clock offset estimates once one succeeded.
CLOCK_EVERY_S = 300.0
#: Seconds between two checks for a step of the wall clock.
CLOCK_CHECK_S = 0.1
#: A new estimate replaces the old one only when they differ by more than this (ns).
CLOCK_MIN_CHANGE_NS = 1_000_000
#: A change of ``wall − monotonic`` larger than this between two checks is a step of the wall clock, ns.
STEP_NS = 10_000_000
#: A wall-clock read bracketed by monotonic reads further apart than this is retried, ns.
READ_SPAN_NS = 1_000_000
READ_TRIES = 5
#: (start, duration) column pairs: a duration spanning a clock step loses the step.
DURATIONS: dict[str, tuple[str, str]] = {
    "steps": ("start_ns", "dur_ns"),
    "phases": ("start_ns", "dur_ns"),
    "collectives": ("start_ns", "dur_ns"),
    "kernel_events": ("start_ns", "dur_ns"),
}

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


@dataclass(frozen=True)
class ClockStep:
    """A step of the local wall clock.

    Attributes:
        step_ns: How far it jumped (> 0: forward).
        boundary_ns: Local wall timestamps at or after this are from after the step.
    """

    step_ns: int
    boundary_ns: int


class StepDetector:
    """Notices steps of the wall clock by watching ``wall − monotonic`` (thread-safe).

    Args:
        wall: The wall clock, ns since the epoch.
        mono: The monotonic clock, ns.
        threshold_ns: Smallest change of ``wall − monotonic`` taken for a step.
    """

    def __init__(
        self,
        wall: Callable[[], int] = time.time_ns,
        mono: Callable[[], int] = time.monotonic_ns,
        threshold_ns: int = STEP_NS,
    ) -> None:
        self._wall, self._mono, self._threshold = wall, mono, threshold_ns
        self._lock = threading.Lock()
        first = None
        while first is None:
            first = self._read()
        self._last = first

    def _read(self) -> tuple[int, int] | None:
        """``(monotonic, wall − monotonic)`` read together; None when every try was preempted.

        The wall clock is read between two monotonic reads; a try whose reads lie more than
        :data:`READ_SPAN_NS` apart (the thread was descheduled in between) is not used, or a
        busy machine's scheduling delay would read as a step.
        """
        for _ in range(READ_TRIES):
            a = self._mono()
            w = self._wall()
            b = self._mono()
            if b - a <= READ_SPAN_NS:
                m = (a + b) // 2
                return m, w - m
        return None

    def check(self) -> ClockStep | None:
        """The step since the previous check, or None."""
        with self._lock:
            now = self._read()
            if now is None:
                return None
            m2, d2 = now
            m1, d1 = self._last
            self._last = now
        step = d2 - d1
        if abs(step) <= self._threshold:
            return None
        # Forward: pre-step stamps are below m2 + d1, post-step ones at or above m1 + d2: take the
        # middle. Backward: the earliest post-step stamp; the overlap goes to the new epoch.
        boundary = (m1 + d2 + m2 + d1) // 2 if step > 0 else m1 + d2
        return ClockStep(step, boundary)


class OffsetMap:
    """The offset to add to each local timestamp, by the timestamp's value (thread-safe).

    One segment per epoch of the local clock: a new estimate replaces the current
    segment's offset (:meth:`set_current`), a step starts a new segment whose offset
    is the old one less the step (:meth:`step`: the collector's clock did not move).
    The oldest of more than ``max_segments`` segments merge into the next one.
    """

    def __init__(self, offset_ns: int = 0, max_segments: int = 16) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = [np.iinfo(np.int64).min]
        self._offsets: list[int] = [offset_ns]
        self._max = max_segments

    @property
    def current(self) -> int:
        """The offset of stamps taken now, ns."""
        with self._lock:
            return self._offsets[-1]

    def set_current(self, offset_ns: int) -> None:
        """A new estimate for the current epoch."""
        with self._lock:
            self._offsets[-1] = offset_ns

    def step(self, step: ClockStep) -> int:
        """Start a new epoch at ``step.boundary_ns``; returns its offset."""
        with self._lock:
            new = self._offsets[-1] - step.step_ns
            while len(self._starts) > 1 and self._starts[-1] >= step.boundary_ns:
                self._starts.pop()  # a backward step over an epoch that began later
                self._offsets.pop()
            self._starts.append(step.boundary_ns)
            self._offsets.append(new)
            if len(self._starts) > self._max:
                del self._starts[1], self._offsets[0]
            return new

    def at(self, stamps_ns: NDArray[np.int64]) -> NDArray[np.int64]:
        """The offset of each local timestamp, ns, shape of ``stamps_ns``."""
        with self._lock:
            starts = np.array(self._starts, np.int64)
            offsets = np.array(self._offsets, np.int64)
        if offsets.size == 1:
            return np.full(np.shape(stamps_ns), offsets[0], np.int64)
        return offsets[np.searchsorted(starts, stamps_ns, side="right") - 1]

    @property
    def segments(self) -> int:
        with self._lock:
            return len(self._starts)


class CollectorClock:
    """A node agent's offset to the collector's clock, kept current by its clock thread (:meth:`run`).

    Estimated (``estimate``: NTP-style round trips, :func:`estimate_offset`) at start and every
    :data:`CLOCK_EVERY_S` once one succeeded; a step of the wall clock, checked every
    :data:`CLOCK_CHECK_S` and before rows are taken (:meth:`check_step`), is logged and applied at
    once (the offset moves by minus the step) and a fresh estimate follows. ``on_change`` is called
    whenever the offset changes.

    Args:
        estimate: One estimate of the offset; raises when the collector does not answer.
        on_change: Called (no arguments) after the offset changed.
    """

    def __init__(self, estimate: Callable[[], ClockEstimate], on_change: Callable[[], None]) -> None:
        #: Offset to add to this node's timestamps, per clock epoch.
        self.offsets = OffsetMap()
        self._estimate, self._on_change = estimate, on_change
        self._steps = StepDetector()
        self._lock = threading.Lock()
        self._known = False
        self._estimate_due = True
        self._after_step = False

    @property
    def current_ns(self) -> int:
        """The offset added to timestamps taken now, ns."""
        return self.offsets.current

    def check_step(self) -> bool:
        """Apply a step of the wall clock since the last check, if any (logged); True if there was one."""
        with self._lock:
            step = self._steps.check()
            if step is None:
                return False
            offset = self.offsets.step(step)
            self._estimate_due = self._after_step = True
        log.warning(
            "argus agent: the wall clock stepped by %+.3f s; offset to the collector now %+d ns "
            "(a fresh estimate follows)",
            step.step_ns / 1e9,
            offset,
        )
        self._on_change()
        return True

    def run(self, stop: threading.Event) -> None:
        """Check for steps and estimate when due, until ``stop`` is set."""
        next_estimate = 0.0
        while not stop.wait(CLOCK_CHECK_S):
            self.check_step()
            if not self._estimate_due and time.monotonic() < next_estimate:
                continue
            self._estimate_due = False
            try:
                est = self._estimate()
            except Exception as exc:
                if not self._known:
                    log.info("argus agent: no clock offset yet (%s); using 0", type(exc).__name__)
                next_estimate = time.monotonic() + 5.0
                continue
            if self.check_step():
                continue  # the clock stepped during the round trips: the estimate mixes two epochs
            next_estimate = time.monotonic() + CLOCK_EVERY_S
            self._take(est)

    def _take(self, est: ClockEstimate) -> None:
        after_step, self._after_step = self._after_step, False
        changed = abs(est.offset_ns - self.current_ns) > CLOCK_MIN_CHANGE_NS
        if not self._known or changed or after_step:
            log.info(
                "argus agent: clock offset to the collector %+d ns (round trip %d ns)%s",
                est.offset_ns,
                est.rtt_ns,
                ", estimated again after the step" if after_step else "",
            )
            self.offsets.set_current(est.offset_ns)
            self._known = True
            self._on_change()
        self._known = True


def shift_times(table: str, data: pa.Table, offset: int | OffsetMap) -> pa.Table:
    """``data`` (rows of ``table``) with the clock offset added to every instant column.

    Instant columns are those the schema marks ``epoch``; one marked ``zero_is_none`` keeps its
    zeros. Other columns (durations, counts) are left alone, except that a (start, duration)
    pair of :data:`DURATIONS` whose end falls in another epoch than its start loses the step.

    Args:
        table: A wire table.
        data: Its rows, times on the node's clock.
        offset: One offset for every row (ns), or an :class:`OffsetMap` giving each
            timestamp its epoch's offset.

    Raises:
        KeyError: ``table`` is not a table of :mod:`argus.schema`.
    """
    instants = [c for c in TABLES[table].columns if c.epoch and c.name in data.column_names]
    if isinstance(offset, int) or offset.segments == 1:
        offset_ns = offset if isinstance(offset, int) else offset.current
        if offset_ns == 0:
            return data
        shift = pa.scalar(offset_ns, pa.int64())
        for column in instants:
            values = data[column.name]
            shifted = pc.add(values, shift)
            if column.zero_is_none:
                shifted = pc.if_else(pc.equal(values, pa.scalar(0, pa.int64())), values, shifted)
            data = data.set_column(data.schema.get_field_index(column.name), column.name, shifted)
        return data
    stamps = {c.name: data[c.name].to_numpy() for c in instants}
    pair = DURATIONS.get(table)
    if pair is not None:
        start, dur = data[pair[0]].to_numpy(), data[pair[1]].to_numpy()
        lost = offset.at(start + dur) - offset.at(start)
        if lost.any():
            fixed = pa.array(np.maximum(dur + lost, 0), pa.int64())
            data = data.set_column(data.schema.get_field_index(pair[1]), pair[1], fixed)
    for column in instants:
        local = stamps[column.name]
        moved = local + offset.at(local)
        if column.zero_is_none:
            moved = np.where(local == 0, 0, moved)
        i = data.schema.get_field_index(column.name)
        data = data.set_column(i, column.name, pa.array(moved, pa.int64()))
    return data


def shift_spans(spans: Sequence[tuple[int, int]], offset_ns: int) -> list[tuple[int, int]]:
    """``(start_ns, end_ns)`` spans moved by ``offset_ns`` (a probe's CUPTI capture spans)."""
    return [(int(a) + offset_ns, int(b) + offset_ns) for a, b in spans]
