"""The probe's sink: its connection to the node agent's unix socket.

Used by the shipper thread only, never by training threads. Batches wait in a
bounded queue until the agent acknowledges them; while the agent is absent,
restarting or not acknowledging they are kept (up to ``max_pending_bytes``, sent
or not) and resent on reconnect, and past the bound the oldest are dropped and counted. Nothing here
ever blocks for longer than the socket timeout.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from argus.agent.messages import Bye, Capture, Sample
from argus.agent.protocol import (
    HEADER,
    FrameType,
    ProtocolError,
    encode_batch,
    encode_frame,
    encode_json,
)

__all__ = ["AgentLink"]

log = logging.getLogger(__name__)

#: Seconds between connection attempts while the agent is unreachable.
RETRY_S = 2.0
#: Socket send timeout, seconds.
SEND_TIMEOUT_S = 2.0
#: Default bound on batches kept for the agent.
MAX_PENDING_BYTES = 32 * 1024 * 1024
#: At most one loss warning per this many seconds.
WARN_EVERY_S = 30.0


@dataclass
class _Msg:
    seq: int
    frame: bytes
    rows: int


class AgentLink:
    """Sends batches to the node agent and tracks its acknowledgements.

    Args:
        path: The agent's unix socket.
        hello: Identity of this rank, sent first on every connection.
        max_pending_bytes: Bound on the bytes of every frame held: waiting to be sent or to be
            acknowledged (:attr:`held_bytes`).
    """

    def __init__(self, path: str, hello: dict[str, Any], max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.path = path
        self.hello = hello
        self.max_pending_bytes = max_pending_bytes
        self._sock: socket.socket | None = None
        self._unsent: deque[_Msg] = deque()
        self._unacked: deque[_Msg] = deque()
        self._bytes = 0
        self._seq = 0
        self._next_try = 0.0
        self._rx = bytearray()
        self._warned_down = False
        self._last_warn = 0.0
        self._dropped_unlogged = 0
        #: Rows dropped because the queue was full (monotonic).
        self.dropped_rows = 0
        #: Rows of frames the agent refused (``REFUSED``: it could not decode them), also in ``dropped_rows``.
        self.refused_rows = 0
        #: Rows acknowledged by an agent (monotonic).
        self.acked_rows = 0
        #: Called with a ``SAMPLE`` request from the agent (the shipper's thread).
        self.on_sample: Callable[[Sample], None] | None = None

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def pending_rows(self) -> int:
        return sum(m.rows for m in self._unsent) + sum(m.rows for m in self._unacked)

    def enqueue(self, table: str, batch: pa.RecordBatch | pa.Table) -> None:
        """Queue one batch of ``table`` (wire schema); drops the oldest batches past the bound."""
        self._seq += 1
        self._queue(_Msg(self._seq, encode_batch(self._seq, table, batch), batch.num_rows))

    def enqueue_capture(self, spans: list[tuple[int, int]]) -> None:
        """Queue the spans ``(start_ns, end_ns)`` during which CUPTI capture ran (a ``CAPTURE`` frame)."""
        self._seq += 1
        capture = Capture([(int(a), int(b)) for a, b in spans])
        self._queue(_Msg(self._seq, encode_frame(FrameType.CAPTURE, self._seq, capture.encode()), 0))

    def _queue(self, msg: _Msg) -> None:
        """Queue ``msg``; past the bound, drop the oldest frames held, sent or not (the newest stays).

        Frames sent but not acknowledged count too: an agent that never acknowledges (its disk
        full, its spool unwritable) must not grow the training process. A dropped frame that
        was sent may still reach the collector; its acknowledgement, if one comes, is ignored.
        """
        self._unsent.append(msg)
        self._bytes += len(msg.frame)
        while self._bytes > self.max_pending_bytes and len(self._unacked) + len(self._unsent) > 1:
            old = (self._unacked or self._unsent).popleft()  # sent frames are the older ones
            self._bytes -= len(old.frame)
            self.dropped_rows += old.rows
            self._dropped_unlogged += old.rows
        self._warn_losses()

    @property
    def held_bytes(self) -> int:
        """Bytes of frames held for the agent, sent-but-unacknowledged and unsent: at most
        ``max_pending_bytes`` (or the one newest frame, when it alone is bigger)."""
        return self._bytes

    def pump(self) -> None:
        """Connect if due, send what is queued, read acknowledgements; never raises."""
        try:
            if self._sock is None and not self._connect():
                return
            self._read_acks()
            while self._unsent and self._sock is not None:
                msg = self._unsent[0]
                self._sock.sendall(msg.frame)
                self._unsent.popleft()
                self._unacked.append(msg)
            self._read_acks()
        except (OSError, ProtocolError) as exc:
            self._disconnect(f"{type(exc).__name__}: {exc}")

    def flush(self, timeout_s: float) -> bool:
        """Pump until every batch is acknowledged or ``timeout_s`` passes; True when all are."""
        deadline = time.monotonic() + timeout_s
        self._next_try = 0.0
        while True:
            self.pump()
            if not self._unsent and not self._unacked:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self._sock is None:
                return False
            _wait_readable(self._sock, min(left, 0.05))

    def close(self, exit_code: int, timeout_s: float) -> None:
        """Flush, say BYE with the exit status, close; counts unsent rows as dropped."""
        self.flush(timeout_s)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(encode_frame(FrameType.BYE, 0, Bye(exit_code).encode()))
        lost = self.pending_rows
        if lost:
            self.dropped_rows += lost
            log.warning("argus: %d rows not delivered to the node agent at %s at exit", lost, self.path)
        self._disconnect(None)
        self._unsent.clear()
        self._unacked.clear()

    # --- internals -------------------------------------------------------------------------------

    def _connect(self) -> bool:
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + RETRY_S
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.connect(self.path)
            sock.sendall(encode_json(FrameType.HELLO, 0, self.hello))
        except OSError as exc:
            sock.close()
            if not self._warned_down:
                log.warning(
                    "argus: no node agent at %s (%s); keeping up to %d MiB of data, then dropping",
                    self.path,
                    exc.strerror or exc,
                    self.max_pending_bytes >> 20,
                )
                self._warned_down = True
            return False
        self._sock = sock
        self._rx.clear()
        if self._warned_down:
            log.info("argus: connected to the node agent at %s", self.path)
        self._warned_down = False
        # Batches sent to a previous connection but never acknowledged go again, in order.
        self._unsent.extendleft(reversed(self._unacked))
        self._unacked.clear()
        return True

    def _disconnect(self, why: str | None) -> None:
        if self._sock is not None:
            if why:
                log.warning("argus: lost the node agent at %s (%s); will reconnect", self.path, why)
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._next_try = time.monotonic() + (RETRY_S if why else 0.0)

    def _read_acks(self) -> None:
        sock = self._sock
        if sock is None:
            return
        closed = False
        while _wait_readable(sock, 0):
            chunk = sock.recv(65536)
            if not chunk:
                closed = True  # the acknowledgements read before the end still count
                break
            self._rx += chunk
        self._take_acks()
        if closed:
            raise ProtocolError("the node agent closed the connection")

    def _take_acks(self) -> None:
        while len(self._rx) >= HEADER.size:
            length, kind, seq = HEADER.unpack_from(self._rx)
            if len(self._rx) < HEADER.size + length:
                break
            payload = bytes(self._rx[HEADER.size : HEADER.size + length])
            del self._rx[: HEADER.size + length]
            if kind in (FrameType.ACK_ONE, FrameType.REFUSED):
                self._answered_one(seq, refused=kind == FrameType.REFUSED)
                continue
            if kind == FrameType.SAMPLE:
                if self.on_sample is not None:
                    self.on_sample(Sample.decode(payload))
                continue
            if kind != FrameType.ACK:
                raise ProtocolError(f"unexpected frame type {kind} from the agent")
            while self._unacked and self._unacked[0].seq <= seq:
                self._acked(self._unacked.popleft())

    def _answered_one(self, seq: int, *, refused: bool) -> None:
        """Frame ``seq`` alone is acknowledged (``ACK_ONE``) or refused (``REFUSED``: the agent could
        not decode it; dropped, its rows counted); either way it is never sent again."""
        for msg in self._unacked:
            if msg.seq == seq:
                self._unacked.remove(msg)
                if not refused:
                    self._acked(msg)
                    return
                self._bytes -= len(msg.frame)
                self.refused_rows += msg.rows
                self.dropped_rows += msg.rows
                log.warning(
                    "argus: the node agent refused a frame of %d rows (it could not decode it)", msg.rows
                )
                return

    def _acked(self, msg: _Msg) -> None:
        self._bytes -= len(msg.frame)
        self.acked_rows += msg.rows

    def _warn_losses(self) -> None:
        now = time.monotonic()
        if self._dropped_unlogged and now - self._last_warn >= WARN_EVERY_S:
            log.warning(
                "argus: dropped %d rows (node agent unreachable or not acknowledging, %d MiB held)",
                self._dropped_unlogged,
                self._bytes >> 20,
            )
            self._dropped_unlogged = 0
            self._last_warn = now


def _wait_readable(sock: socket.socket, timeout_s: float) -> bool:
    """True once ``sock`` can be read without blocking (``poll``: any descriptor, unlike ``select``)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))
