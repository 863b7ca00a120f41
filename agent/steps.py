"""Step boundaries and phases of one rank: a small state machine fed by hooks.

Semantics (the analyzer relies on them; see ``argus.schema``):

- A step ends when ``optimizer.step()`` returns or :func:`argus.agent.step` is
  called. When several optimizers step back to back (GANs), the step ends at
  the last of them: the end is held until the next data fetch, forward or
  backward begins (or for ``idle`` seconds), then closed at the last
  optimizer's return. The next step starts where the previous one ended; the
  first step starts at the first recorded phase (or at attach).
- Phases ``data``, ``forward``, ``backward``, ``optimizer`` are recorded at the
  outermost level only: a phase that begins while another is open (a module
  forward during backward, activation checkpointing's recompute) is not a row of
  its own. One exception: ``optimizer.step(closure)`` (Lightning's automatic
  optimisation, LBFGS) runs the step's forward and backward in the closure, and
  those are rows of their own; the ``optimizer`` phase gives way to them and
  resumes when each ends (rows ``optimizer, forward, optimizer, backward,
  optimizer``), so the optimizer rows hold only what ``step()`` does besides
  its closure. Else a whole step would be one ``optimizer`` row: its forward and
  backward unseen, and the end of backward, where a rank waits for DDP's
  gradient all-reduce, unknown to the analyzer. Consecutive rows of the same
  phase with no other phase in between are merged (the model's forward and the
  loss module's forward are one ``forward`` row); gradient accumulation gives
  one row per micro-batch.
- Step numbers count from 0 per rank.

Rows go to two :class:`~argus.agent.buffers.RowBuffer`: steps as
:class:`~argus.agent.rows.StepRow` and phases as :class:`~argus.agent.rows.PhaseRow`
(``phase_code`` indexes :data:`argus.schema.PHASES`).
"""

from __future__ import annotations

import threading

from argus.agent.buffers import RowBuffer
from argus.agent.rows import PhaseRow, StepRow

__all__ = ["BACKWARD", "DATA", "FORWARD", "OPTIMIZER", "StepTracker"]

DATA, FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2, 3


class StepTracker:
    """Turns phase begin/end events into step and phase rows.

    Args:
        steps: Buffer of :class:`~argus.agent.rows.StepRow`.
        phases: Buffer of :class:`~argus.agent.rows.PhaseRow`.
        attach_ns: When the probe attached; the first step starts here if no
            phase was recorded before it ended.
    """

    def __init__(self, steps: RowBuffer, phases: RowBuffer, attach_ns: int) -> None:
        self._steps = steps
        self._phases = phases
        self._attach_ns = attach_ns
        self._lock = threading.Lock()
        #: The current step number.
        self.step = 0
        self._start_ns: int | None = None
        self._pending_end_ns: int | None = None
        self._open = -1
        self._open_ns = 0
        self._depth = 0
        #: The open optimizer phase gave way to the forward or backward of its closure.
        self._suspended = False
        self._last: list[int] | None = None
        #: Bit ``1 << code`` set for each phase recorded in the current step.
        self.seen = 0

    def event_step(self) -> int:
        """Step number an event happening now belongs to (after a pending step end: the next)."""
        return self.step + (self._pending_end_ns is not None)

    def begin(self, code: int, t_ns: int) -> bool:
        """A phase begins at ``t_ns``; True when it is outermost (recorded)."""
        with self._lock:
            if self._open >= 0:
                if self._open != OPTIMIZER or code not in (FORWARD, BACKWARD) or self._depth:
                    self._depth += 1
                    return False
                # optimizer.step(closure): the closure's forward or backward is a row of its own.
                if self._pending_end_ns is not None:  # it begins the next step (the module doc)
                    self._close_step(self._pending_end_ns)
                self._record(OPTIMIZER, t_ns)
                self._suspended = True
            elif self._pending_end_ns is not None and code != OPTIMIZER:
                self._close_step(self._pending_end_ns)
            if self._start_ns is None:
                self._start_ns = t_ns
            self._open = code
            self._open_ns = t_ns
            return True

    def end(self, code: int, t_ns: int) -> None:
        """The phase begun last ends at ``t_ns`` (nested ends are matched and ignored)."""
        with self._lock:
            if self._depth:
                self._depth -= 1
                return
            if self._open != code:
                return
            self._open = -1
            self._record(code, t_ns)
            if code == OPTIMIZER:
                self._pending_end_ns = t_ns
            elif self._suspended:  # the closure's phase ended: back inside optimizer.step()
                self._suspended = False
                self._open = OPTIMIZER
                self._open_ns = t_ns

    def _record(self, code: int, t_ns: int) -> None:
        """The open phase ``code`` ends at ``t_ns``: a row, or the previous row of that phase grows."""
        last = self._last
        if last is not None and last[0] == code:
            last[2] = t_ns
        else:
            if last is not None:
                self._emit_phase(last)
            self._last = [code, self._open_ns, t_ns]
        self.seen |= 1 << code

    def mark_step(self, t_ns: int) -> None:
        """An explicit step boundary (``argus.agent.step()``) at ``t_ns``."""
        with self._lock:
            self._close_step(t_ns)

    def flush_idle(self, now_ns: int, idle_ns: int) -> None:
        """Close a held step end older than ``idle_ns`` (training paused after the optimizer)."""
        with self._lock:
            end = self._pending_end_ns
            if end is not None and self._open < 0 and now_ns - end >= idle_ns:
                self._close_step(end)

    def finish(self) -> None:
        """At exit: close a held step end and emit the last phase row."""
        with self._lock:
            if self._pending_end_ns is not None:
                self._close_step(self._pending_end_ns)
            elif self._last is not None:
                self._emit_phase(self._last)
                self._last = None

    def _emit_phase(self, row: list[int]) -> None:
        code, start, end = row
        self._phases.append(PhaseRow(self.step, code, start, max(end - start, 0)))

    def _close_step(self, end_ns: int) -> None:
        if self._last is not None:
            self._emit_phase(self._last)
            self._last = None
        start = self._start_ns if self._start_ns is not None else self._attach_ns
        self._steps.append(StepRow(self.step, start, max(end_ns - start, 0)))
        self.step += 1
        self._start_ns = end_ns
        self._pending_end_ns = None
        self.seen = 0
