"""Kernel windows on the node: events held until their window is due, and a bounded raw ring.

Kernel events from the probes (times already on the collector's clock) wait here with the
steps the same probes reported, and leave as ``kernel_summaries`` rows made by
:func:`argus.kernels.summarize`: the one summary, with the one window rule (a kernel belongs
to the window in which its step ends; see :mod:`argus.kernels`), that trace import uses too.
Kernels a CUDA graph launched are summarised apart from the same kernels launched eagerly
(groups by ``graph_id``), and a group's ``graph_node_id`` names its graph node when all of
them ran at one.

When a window is due. A window closes ``grace_s`` after its end (CUPTI hands records over
in buffers, late; a probe ships its steps every half second): every step that ended in it
has arrived by then. A kernel whose rank has not yet reported the end of its step waits for
it, and holds back the window of its start while it waits; after ``step_wait_s`` more (a
step longer than that, or a rank that marks no steps) it is taken as outside every step and
summarised in the window of its start. Events for a window already summarised are counted
in :attr:`KernelWindows.late_events` and dropped, never summarised twice.

Probes with duty-cycled CUPTI capture report the spans they captured
(:meth:`KernelWindows.cover`); each summary row carries ``covered_ns``, the part of its
window its rank captured (``window_ns`` when the rank reported no spans: capture ran
throughout).

Raw events also go to a ring bounded by rows; they leave the node only when asked for
(:meth:`KernelWindows.raw`), as ``kernel_events`` rows.

Bounds. The held events are bounded in rows (``max_held_rows``: past it, new events are dropped)
and in time: an event that starts more than ``ahead_s`` after the ``now_ns`` it is added at (a
clock far off, a corrupt timestamp) would hold its window, and memory, open until then; it is
dropped instead, and so are capture spans that far ahead (steps that far ahead are stored,
but not kept here). Every drop is counted (:attr:`KernelWindows.dropped_events`; the node agent
reports it as lost rows).

Tickets (the node agent's acknowledgements). :meth:`add` and :meth:`cover` take a ticket naming
the probe's frame; :meth:`released` returns the tickets whose every event has left the windows
(summarised by a :meth:`ready` whose summaries the caller then spools, or dropped and counted),
and the capture frames whose windows are summarised (or, for a job holding no kernel event,
due). The node agent acknowledges a frame only then: what it acknowledged is in the spool.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.kernels import KernelEvents, StepSpans, summarize, summary_window
from argus.schema import wire_schema
from argus.window_grid import WindowGrid

__all__ = ["KernelWindows"]

#: CUPTI timestamps are integer ns.
RESOLUTION_NS = 1
#: Open at the start of time: no window of a job was summarised yet.
_NONE_CLOSED = -(1 << 62)
#: Column holding each held event's ticket (-1: none); never leaves this module.
_TICKET = "_ticket"


class KernelWindows:
    """Per-job kernel events and steps awaiting their windows, and the raw-event ring.

    Args:
        window: The summary windows (:class:`~argus.window_grid.WindowGrid`).
        grace_s: How long after its end a window waits for late events and steps.
        ring_rows: Bound on raw events kept for on-demand upload.
        step_wait_s: How much longer a kernel waits for the end of its step (default: one window).
        max_held_rows: Bound on events awaiting their windows; new ones past it are dropped.
        ahead_s: Events and spans starting more than this after ``now_ns`` are dropped.
    """

    def __init__(
        self,
        window: WindowGrid,
        grace_s: float = 5.0,
        ring_rows: int = 1_000_000,
        step_wait_s: float | None = None,
        max_held_rows: int = 4_000_000,
        ahead_s: float = 120.0,
    ) -> None:
        self.window = window
        self.window_ns = window.length_ns
        self.grace_ns = int(grace_s * 1e9)
        self.step_wait_ns = self.window_ns if step_wait_s is None else int(step_wait_s * 1e9)
        self.ring_rows = ring_rows
        self.max_held_rows = max_held_rows
        self.ahead_ns = int(ahead_s * 1e9)
        self._lock = threading.Lock()
        self._held_rows = 0
        #: Kernel tickets with events held; capture tickets: (job, end of their last span).
        self._tickets: set[int] = set()
        self._cover_tickets: dict[int, tuple[str, int]] = {}
        self._released: list[int] = []
        self._held: dict[str, list[pa.Table]] = {}
        self._steps: dict[str, list[tuple[int, int, int]]] = {}
        self._closed_upto: dict[str, int] = {}
        self._spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._ring: deque[tuple[str, pa.Table]] = deque()
        self._ring_size = 0
        self._first_window: dict[str, int] = {}
        self._now_ns = _NONE_CLOSED
        self._next_prune_ns = _NONE_CLOSED
        #: Events that arrived after their window was summarised (monotonic).
        self.late_events = 0
        #: Events and capture spans dropped for starting more than ``ahead_s`` ahead (monotonic).
        self.future_events = 0
        #: Events dropped because ``max_held_rows`` were held (monotonic).
        self.overflow_events = 0

    @property
    def dropped_events(self) -> int:
        """Every event lost here so far: late, too far ahead, over the bound (monotonic)."""
        return self.late_events + self.future_events + self.overflow_events

    def add(self, job_id: str, events: pa.Table, *, ticket: int = -1, now_ns: int | None = None) -> None:
        """Take ``kernel_events`` wire rows of ``job_id``.

        Args:
            ticket: Names the frame that carried them (>= 0), for :meth:`released`; -1: none.
            now_ns: The time now (the events' clock); events past it by ``ahead_s`` are dropped.
        """
        with self._lock:
            held = self._take(job_id, events, ticket, now_ns)
            if ticket >= 0:
                if held:
                    self._tickets.add(ticket)
                else:
                    self._released.append(ticket)

    def steps(self, job_id: str, steps: pa.Table, now_ns: int | None = None) -> None:
        """Take ``steps`` wire rows of ``job_id``: they place its kernels in windows (those
        starting more than ``ahead_s`` after ``now_ns``, when given, are not kept for that)."""
        if steps.num_rows and now_ns is not None:
            steps = steps.filter(pa.array(steps["start_ns"].to_numpy() <= now_ns + self.ahead_ns))
        if steps.num_rows == 0:
            return
        rank = steps["rank"].to_numpy().tolist()
        start = steps["start_ns"].to_numpy().tolist()
        dur = steps["dur_ns"].to_numpy().tolist()
        with self._lock:
            self._steps.setdefault(job_id, []).extend(
                (int(r), int(s), int(s) + int(d)) for r, s, d in zip(rank, start, dur, strict=True)
            )

    def cover(
        self,
        job_id: str,
        rank: int,
        spans: list[tuple[int, int]],
        *,
        ticket: int = -1,
        now_ns: int | None = None,
    ) -> None:
        """Note that ``rank`` of ``job_id`` captured kernels during ``spans`` (``(start_ns, end_ns)``).

        Args:
            ticket: Names the frame that carried them (>= 0), for :meth:`released`; -1: none.
            now_ns: The time now; spans starting more than ``ahead_s`` after it are dropped.
        """
        with self._lock:
            if now_ns is not None:
                kept = [(a, b) for a, b in spans if a <= now_ns + self.ahead_ns]
                self.future_events += len(spans) - len(kept)
                spans = kept
            if spans:
                self._spans.setdefault((job_id, rank), []).extend(spans)
            if ticket >= 0:
                if spans:
                    self._cover_tickets[ticket] = (job_id, max(b for _, b in spans))
                else:
                    self._released.append(ticket)

    def released(self) -> list[int]:
        """Tickets released since the last call (module doc), in no particular order."""
        with self._lock:
            out, self._released = self._released, []
        return out

    def ready(self, now_ns: int) -> list[tuple[str, pa.Table]]:
        """Summarise every window that is due at ``now_ns`` (module doc): ``(job_id, summaries)``."""
        out: list[tuple[str, pa.Table]] = []
        with self._lock:
            self._now_ns = max(self._now_ns, now_ns)
            closing = self.window.start_ns(now_ns - self.grace_ns)
            for job_id in list(self._held):
                if closing <= self._first_window[job_id]:
                    continue  # no held event can be in a window that is due
                summaries = self._due(job_id, now_ns)
                if summaries is not None and summaries.num_rows:
                    out.append((job_id, summaries))
            if now_ns >= self._next_prune_ns:
                self._next_prune_ns = now_ns + self.window_ns
                self._prune(now_ns)
            self._release(closing)
        return out

    def flush_all(self) -> list[tuple[str, pa.Table]]:
        """Summarise every held event now (at shutdown)."""
        return self.ready(1 << 62)

    def raw(self, job_id: str, start_ns: int, end_ns: int) -> pa.Table:
        """Raw events of ``job_id`` with ``start_ns`` in ``[start_ns, end_ns)`` still in the ring."""
        with self._lock:
            tables = [t for j, t in self._ring if j == job_id]
        if not tables:
            return wire_schema("kernel_events").empty_table()
        data = pa.concat_tables(tables)
        starts = data["start_ns"].to_numpy()
        return data.filter(pa.array((starts >= start_ns) & (starts < end_ns)))

    # --- internals (under the lock) --------------------------------------------------------------

    def _take(self, job_id: str, events: pa.Table, ticket: int, now_ns: int | None) -> bool:
        """Ring and hold ``events`` but those dropped (module doc); True when some are held."""
        if events.num_rows and now_ns is not None:
            ahead = events["start_ns"].to_numpy() > now_ns + self.ahead_ns
            if ahead.any():
                self.future_events += int(ahead.sum())
                events = events.filter(pa.array(~ahead))
        if events.num_rows == 0:
            return False
        if self._held_rows + events.num_rows > self.max_held_rows:
            self.overflow_events += events.num_rows
            return False
        self._ring.append((job_id, events))
        self._ring_size += events.num_rows
        while self._ring_size > self.ring_rows and len(self._ring) > 1:
            _, old = self._ring.popleft()
            self._ring_size -= old.num_rows
        closed = self._closed_upto.get(job_id, _NONE_CLOSED)
        if pc.min(events["start_ns"]).as_py() < closed:
            events = self._drop_late(job_id, events, closed)
        if events.num_rows == 0:
            return False
        tickets = pa.array(np.full(events.num_rows, ticket, np.int64))
        self._hold(job_id, [events.append_column(_TICKET, tickets)])
        return True

    def _release(self, closing: int) -> None:
        """Move the tickets whose events and windows are done to ``_released`` (module doc)."""
        held: set[int] = set()
        for tables in self._held.values():
            for t in tables:
                held.update(np.unique(t[_TICKET].to_numpy()).tolist())
        done = self._tickets - held
        self._tickets -= done
        self._released.extend(done)
        for ticket, (job_id, end_ns) in list(self._cover_tickets.items()):
            window = self.window.start_ns(end_ns)
            summarised = window < self._closed_upto.get(job_id, _NONE_CLOSED)
            if summarised or (job_id not in self._held and window < closing):
                del self._cover_tickets[ticket]
                self._released.append(ticket)

    def _hold(self, job_id: str, tables: list[pa.Table]) -> None:
        """Keep ``tables`` of ``job_id`` for later; note the earliest window they start in."""
        first = self.window.start_ns(min(pc.min(t["start_ns"]).as_py() for t in tables))
        self._held_rows += sum(t.num_rows for t in tables)
        self._held.setdefault(job_id, []).extend(tables)
        self._first_window[job_id] = min(self._first_window.get(job_id, first), first)

    def _step_spans(self, job_id: str) -> StepSpans:
        rows = self._steps.get(job_id, [])
        if not rows:
            return StepSpans.none()
        r, s, e = (np.fromiter((row[i] for row in rows), np.int64, len(rows)) for i in range(3))
        return StepSpans.of(r, s, e - s)

    def _place(
        self, job_id: str, events: KernelEvents, now_ns: int
    ) -> tuple[StepSpans, np.ndarray, np.ndarray]:
        """Each event's window, and whether it still waits for the end of its step."""
        steps = self._step_spans(job_id)
        window = summary_window(events, steps, self.window)
        waiting = np.zeros(len(events), bool)
        for rank in np.unique(events.rank).tolist():
            mine = events.rank == rank
            last = steps.last_end(rank)
            waiting[mine] = True if last is None else events.when_ns[mine] >= last
        own = self.window.starts_ns(events.start_ns)
        waiting &= own + self.window_ns + self.grace_ns + self.step_wait_ns > now_ns
        return steps, window, waiting

    def _drop_late(self, job_id: str, events: pa.Table, closed: int) -> pa.Table:
        placed = KernelEvents.from_wire(events)
        _, window, waiting = self._place(job_id, placed, self._now_ns)
        late = ~waiting & (window < closed)
        self.late_events += int(late.sum())
        return events.filter(pa.array(~late))

    def _due(self, job_id: str, now_ns: int) -> pa.Table | None:
        tables = self._held.pop(job_id)
        del self._first_window[job_id]
        self._held_rows -= sum(t.num_rows for t in tables)
        data = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        events = KernelEvents.from_wire(data)
        steps, window, waiting = self._place(job_id, events, now_ns)
        own = self.window.starts_ns(events.start_ns)
        # Windows end when their grace has passed, but not past one a waiting kernel may still join.
        closing = self.window.start_ns(now_ns - self.grace_ns)
        closed = self._closed_upto.get(job_id, _NONE_CLOSED)
        # A waiting kernel may be outside every step: its own window stays open until it is
        # placed (one whose own window is summarised already would be late there anyway).
        hold = waiting & (own >= closed)
        if hold.any():
            closing = min(closing, int(own[hold].min()))
        done = ~waiting & (window < closing)
        late = done & (window < closed)
        self.late_events += int(late.sum())
        self._closed_upto[job_id] = max(closed, closing)
        keep = ~done
        if keep.any():
            self._hold(job_id, [data.filter(pa.array(keep))])
        take = done & ~late
        if not take.any():
            return None
        chosen = events.take(take)
        windows = np.unique(window[take]).tolist()
        return summarize(
            chosen,
            self.window,
            steps=steps,
            resolution_ns=RESOLUTION_NS,
            covered_ns=self._covered(job_id, windows),
        )

    def _covered(self, job_id: str, windows: list[int]) -> dict[tuple[int, int], int]:
        """(rank, window) → ns of the window its capture spans cover (ranks that reported spans only)."""
        out: dict[tuple[int, int], int] = {}
        for (job, rank), spans in self._spans.items():
            if job != job_id:
                continue
            for win in windows:
                end = win + self.window_ns
                out[(rank, win)] = sum(max(0, min(b, end) - max(a, win)) for a, b in spans)
        return out

    def _prune(self, now_ns: int) -> None:
        """Forget spans and steps that only concern windows already summarised (or long past)."""
        horizon = now_ns - 2 * (self.window_ns + self.grace_ns + self.step_wait_ns)
        for key, spans in list(self._spans.items()):
            floor = self._closed_upto.get(key[0], horizon)
            keep = [(a, b) for a, b in spans if b > floor]
            if keep:
                self._spans[key] = keep
            else:
                del self._spans[key]
        for job_id, rows in list(self._steps.items()):
            floor = self._closed_upto.get(job_id, horizon) - self.window_ns
            last: dict[int, tuple[int, int, int]] = {}
            for row in rows:
                if row[0] not in last or row[2] > last[row[0]][2]:
                    last[row[0]] = row
            kept = [row for row in rows if row[2] > floor or last[row[0]] is row]
            if kept:
                self._steps[job_id] = kept
            else:
                del self._steps[job_id]
