"""Acknowledging a probe's frames: each once what it carried is durable, in frame order.

A frame's rows are durable once the uploader's flush generation holding them is spooled
(:attr:`argus.agent.uploader.Uploader.on_spooled`); kernel events and capture spans wait in
the kernel windows first, under a ticket, until the windows release it (:meth:`Acks.release`).
Per connection, the frames before the first that is not durable get one cumulative ``ACK``;
those after it get an ``ACK_ONE`` each where the probe takes it (HELLO version >= 2). A frame a
probe sends again on a new connection (it never saw the acknowledgement) is not taken twice:
it is acknowledged with the last frame taken from that probe (:meth:`Acks.taken_before`). A
refused frame (:mod:`argus.agent.protocol`) gets ``REFUSED``, or, for a probe before version 3,
the acknowledgement of a frame with nothing to wait for.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from dataclasses import dataclass

from argus.agent.messages import Hello
from argus.agent.protocol import FrameType, encode_frame

__all__ = ["Ack", "Acks"]


@dataclass
class Ack:
    """A frame's acknowledgement, sent once flush ``generation`` is spooled."""

    conn: socket.socket
    seq: int
    #: None while its kernel events or spans wait in the windows under ``ticket``.
    generation: int | None
    ticket: int = -1
    #: The probe takes ``ACK_ONE`` (HELLO version >= 2): it may be acknowledged past a held frame.
    one: bool = False


class Acks:
    """The acknowledgements owed to the probes connected to one node agent (module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Acknowledgements waiting for their rows to be spooled, in frame order per connection.
        self._acks: list[Ack] = []
        # Those waiting for the windows, by ticket; tickets released before their frame was noted.
        self._waiting: dict[int, list[Ack]] = {}
        self._released_early: dict[int, int] = {}
        self._tickets = itertools.count()
        # Per probe (Hello.key): the last frame seq taken and its acknowledgement.
        self._taken: dict[tuple[str, ...], tuple[int, Ack]] = {}

    def ticket(self) -> int:
        """A fresh ticket naming a frame whose rows wait in the kernel windows."""
        return next(self._tickets)

    @property
    def pending(self) -> int:
        """Acknowledgements not sent yet (frames taken, not durable)."""
        with self._lock:
            return len(self._acks)

    @property
    def waiting_for_windows(self) -> int:
        """Tickets whose frames still wait for the kernel windows."""
        with self._lock:
            return len(self._waiting)

    def forget(self, hello: Hello) -> None:
        """The probe said BYE or its process is gone: a new connection of it starts afresh."""
        with self._lock:
            self._taken.pop(hello.key, None)

    def refused(self, conn: socket.socket, hello: Hello, seq: int) -> None:
        """Frame ``seq`` was refused: ``REFUSED`` now, or (a probe before version 3) acknowledged
        with, or after, the frames before it."""
        with self._lock:
            if hello.takes_refused:
                self._send(conn, encode_frame(FrameType.REFUSED, seq))
            else:
                self._ack_later(Ack(conn, seq, -1, one=hello.takes_one))

    def answer(self, conn: socket.socket, frame: bytes) -> None:
        """Send ``frame`` (an answer to a DUMP, a SAMPLE request) between acknowledgements.

        Raises:
            OSError: the connection broke.
        """
        with self._lock:
            conn.sendall(frame)

    def close(self, conn: socket.socket) -> None:
        """The connection ended: forget what it was owed and close it."""
        with self._lock:
            self._acks = [a for a in self._acks if a.conn is not conn]
            conn.close()

    def taken_before(self, hello: Hello, conn: socket.socket, seq: int) -> bool:
        """True for a frame this probe sent before, on a connection that dropped (the caller takes
        one frame at a time: the node agent's intake lock).

        Its rows were taken then: it is acknowledged once the generation of the last frame taken
        from the probe is spooled, and not taken again (a resend stores nothing twice).
        """
        last = self._taken.get(hello.key)
        if last is None or seq > last[0]:
            return False
        with self._lock:
            self._ack_later(Ack(conn, seq, last[1].generation, last[1].ticket, hello.takes_one))
        return True

    def took(
        self, hello: Hello, conn: socket.socket, seq: int, generation: int | None, ticket: int = -1
    ) -> None:
        """Frame ``seq`` of the probe is taken into ``generation`` (None: into the windows under
        ``ticket``): acknowledge it once that is spooled."""
        with self._lock:
            if generation is None:
                generation = self._released_early.pop(ticket, None)
            ack = Ack(conn, seq, generation, ticket, hello.takes_one)
            self._taken[hello.key] = (seq, ack)
            self._ack_later(ack)

    def _ack_later(self, ack: Ack) -> None:
        """Note ``ack`` (held: ``_lock``); one still waiting for the windows waits by ticket."""
        self._acks.append(ack)
        if ack.generation is None:
            self._waiting.setdefault(ack.ticket, []).append(ack)

    def release(self, tickets: list[int], generation: int) -> None:
        """The windows are done with ``tickets``: their frames wait for flush ``generation`` now."""
        with self._lock:
            for ticket in tickets:
                waiting = self._waiting.pop(ticket, None)
                if waiting is None:
                    self._released_early[ticket] = generation
                for ack in waiting or ():
                    ack.generation = generation

    def spooled(self, generation: int) -> None:
        """Uploader callback: acknowledge the frames whose rows are spooled by ``generation``.

        Per connection, those before the first that is not are acknowledged by one ``ACK`` (it
        covers every frame up to its sequence); those after it, one ``ACK_ONE`` each where the
        probe takes it (else they wait for the held frame).
        """
        with self._lock:
            blocked: set[socket.socket] = set()
            last: dict[socket.socket, int] = {}
            keep: list[Ack] = []
            for ack in self._acks:
                durable = ack.generation is not None and ack.generation <= generation
                if durable and ack.conn not in blocked:
                    last[ack.conn] = ack.seq
                elif durable and ack.one:
                    self._send(ack.conn, encode_frame(FrameType.ACK_ONE, ack.seq))
                else:
                    blocked.add(ack.conn)
                    keep.append(ack)
            self._acks = keep
            for conn, seq in last.items():
                self._send(conn, encode_frame(FrameType.ACK, seq))

    @staticmethod
    def _send(conn: socket.socket, frame: bytes) -> None:
        """Send ``frame`` to a probe; a connection that broke is dropped by its own thread."""
        with contextlib.suppress(OSError):
            conn.sendall(frame)
