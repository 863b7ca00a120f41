"""The node agent's row intake: a probe's rows (or the agent's own) into kernel windows or the uploader.

Every row a node agent takes goes through :class:`Intake`: rows that break a row rule are
dropped and counted (:mod:`argus.rowrules`; the rest of their frame goes on), timestamps
are shifted onto the collector's clock (:class:`argus.agent.clock.CollectorClock`), ``ranks``
rows get the agent's id and their clock offset, kernel events wait in
:class:`argus.agent.kernels.KernelWindows` for their window, and everything else is queued
on the :class:`~argus.agent.uploader.Uploader`. A probe's frame is recorded with
:class:`argus.agent.acks.Acks` under the intake lock, so that at stop no frame is taken
after the last acknowledgements (:meth:`Intake.close`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc

from argus.agent.acks import Acks
from argus.agent.clock import CollectorClock, shift_times
from argus.agent.kernels import KernelWindows
from argus.agent.messages import Hello
from argus.agent.uploader import Uploader
from argus.rowrules import drop_bad_rows

__all__ = ["Intake", "Tally"]

log = logging.getLogger(__name__)

#: Seconds between two warnings of the same kind (bad rows, refused frames): the first of a minute.
WARN_EVERY_S = 60.0


class Tally:
    """A count of things lost (bad rows, refused frames) whose warning is logged the first of a minute."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warn_after = 0.0
        #: Counted so far.
        self.total = 0

    def add(self, n: int) -> bool:
        """Count ``n`` more; True when this is the first of a minute: log it."""
        with self._lock:
            self.total += n
            now = time.monotonic()
            if now < self._warn_after:
                return False
            self._warn_after = now + WARN_EVERY_S
            return True


class Intake:
    """Takes rows into the windows or the uploader, and a probe's frames with their acknowledgement.

    Args:
        agent_id: Written into every ``ranks`` row.
        uploader: Queue of rows for the collector.
        windows: Kernel events held for their window.
        acks: What the probes are owed.
        clock: Offset to the collector's clock.
    """

    def __init__(
        self, agent_id: str, uploader: Uploader, windows: KernelWindows, acks: Acks, clock: CollectorClock
    ) -> None:
        self.agent_id = agent_id
        self.uploader, self.windows, self.acks, self.clock = uploader, windows, acks, clock
        # Held while a probe's frame is taken; at stop, no frame is taken after the last acknowledgements.
        self._lock = threading.Lock()
        self._closing = False
        self._bad_count = Tally()

    @property
    def bad_rows(self) -> int:
        """Rows dropped on arrival because they break a row rule (a null, a value past its limit, a
        negative ``dur_ns``: :mod:`argus.rowrules`); the rest of their frame goes on."""
        return self._bad_count.total

    def close(self) -> None:
        """Take no frame after this (waits for one being taken)."""
        with self._lock:
            self._closing = True

    def forget(self, hello: Hello) -> None:
        """The probe of ``hello`` is gone (BYE, or its process ended): drop what it is owed."""
        with self._lock:
            self.acks.forget(hello)

    def batch(self, conn: socket.socket, seq: int, hello: Hello, table: str, data: pa.Table) -> bool:
        """Take frame ``seq`` of a probe, rows of ``table``; acknowledged once spooled (kernel events:
        once summarised). A frame taken before is acknowledged, not taken twice. False when closing."""
        with self._lock:
            if self._closing:
                return False
            if not self.acks.taken_before(hello, conn, seq):
                if table == "kernel_events":
                    ticket = self.acks.ticket()
                    self.rows(hello.job_id, table, data, ticket)
                    self.acks.took(hello, conn, seq, None, ticket)
                else:
                    self.acks.took(hello, conn, seq, self.rows(hello.job_id, table, data))
        return True

    def capture(self, conn: socket.socket, seq: int, hello: Hello, spans: list[tuple[int, int]]) -> bool:
        """Take CAPTURE frame ``seq``: the ``(start_ns, end_ns)`` spans (collector's clock) a probe
        recorded kernels in, acknowledged once their windows are summarised. False when closing."""
        with self._lock:
            if self._closing:
                return False
            if not self.acks.taken_before(hello, conn, seq):
                ticket = self.acks.ticket()
                now = time.time_ns() + self.clock.current_ns
                self.windows.cover(hello.job_id, hello.rank, spans, ticket=ticket, now_ns=now)
                self.acks.took(hello, conn, seq, None, ticket)
        return True

    def ship(self, job_id: str, table: str, data: pa.Table) -> None:
        """Take rows the agent made itself (stack captures) unless closing."""
        with self._lock:
            if not self._closing:
                self.rows(job_id, table, data)

    def rows(self, job_id: str, table: str, data: pa.Table, ticket: int = -1) -> int:
        """Take rows of a probe (or of the agent itself); returns the uploader generation holding them
        (kernel events: held in the windows under ``ticket``, see :meth:`argus.agent.acks.Acks.release`)."""
        data, bad, why = drop_bad_rows(table, data)  # the collector's row rules, per frame
        if bad:
            self._bad(job_id, table, bad, why)
        self.clock.check_step()  # rows stamped after a step are never shifted by the old offset
        local_time = data["time_ns"].to_numpy() if table == "ranks" else None
        data = shift_times(table, data, self.clock.offsets)
        offset = self.clock.current_ns
        if table == "ranks":
            assert local_time is not None
            n = data.num_rows
            data = data.set_column(
                data.schema.get_field_index("agent_id"),
                "agent_id",
                pa.array([self.agent_id] * n, pa.string()),
            )
            data = data.set_column(
                data.schema.get_field_index("clock_offset_ns"),
                "clock_offset_ns",
                pa.array(self.clock.offsets.at(local_time), pa.int64()),
            )
        elif table == "host_samples":
            dropped = pc.sum(data["dropped_events"]).as_py() or 0
            if dropped:
                log.warning("argus agent: probes of job %s report %d dropped events", job_id, dropped)
                self.uploader.count_dropped(int(dropped))
        elif table == "kernel_events":
            self.windows.add(job_id, data, ticket=ticket, now_ns=time.time_ns() + offset)
            return self.uploader.generation
        elif table == "steps":
            self.windows.steps(job_id, data, time.time_ns() + offset)  # they place the job's kernels
        return self.uploader.add(job_id, table, data, offset)

    def _bad(self, job_id: str, table: str, rows: int, why: list[str]) -> None:
        """Count ``rows`` of ``table`` dropped because they break a row rule (:mod:`argus.rowrules`):
        lost rows, reported with the next batch; logged, the first of a minute."""
        self.uploader.count_dropped(rows)
        if self._bad_count.add(rows):
            log.warning(
                "argus agent: dropped %d %s row(s) of job %s that the collector would refuse (%s; "
                "%d so far); the rest of the batch goes on",
                rows,
                table,
                job_id,
                "; ".join(why),
                self.bad_rows,
            )
