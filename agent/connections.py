"""The node agent's probe connections: frames in, ``ACK`` / ``REFUSED`` out.

:class:`ProbeConnections` accepts the probes of this node on the agent's unix socket
(:mod:`argus.agent.protocol`) and serves each connection in a thread of its own: ``HELLO``
names the rank (its pid is the socket's, ``SO_PEERCRED``, :mod:`argus.agent.peers`, never
the HELLO's), ``BATCH`` and ``CAPTURE`` frames go to the :class:`~argus.agent.intake.Intake`
and are acknowledged once durable (:class:`argus.agent.acks.Acks`), a frame that cannot be
decoded or validated is refused (``REFUSED``: the probe drops it, the connection goes on),
``DUMP`` queues raw kernel events, ``BYE`` ends a rank cleanly. A connection that ends
without ``BYE`` whose process is gone gets a crash ``exit`` row. The connected ranks are
what the agent's stack captures sample (:meth:`ProbeConnections.rank_process`) and its
clock and link rows are sent for (:meth:`ProbeConnections.hellos`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pyarrow as pa

from argus.agent.acks import Acks
from argus.agent.captures import RankProcess
from argus.agent.clock import shift_spans
from argus.agent.intake import Intake, Tally
from argus.agent.messages import Capture, Dump, Hello, Sample
from argus.agent.peers import claims_its_own_pid, peer_pid
from argus.agent.protocol import FrameType, ProtocolError, decode_batch, encode_frame, read_frame
from argus.schema import wire_schema

__all__ = ["ProbeConnections", "rank_row"]

log = logging.getLogger(__name__)


class ProbeConnections:
    """The probes connected to this agent, one thread each.

    Args:
        intake: Takes the probes' rows and frames.
        acks: What the probes are owed; answers on their connections.
        dump: ``(job_id, start_ns, end_ns)`` → raw kernel events queued (rows), for ``DUMP``.
        stop: Set when the agent stops (connections then end quietly).
    """

    def __init__(
        self, intake: Intake, acks: Acks, dump: Callable[[str, int, int], int], stop: threading.Event
    ) -> None:
        self.intake, self.acks, self._dump, self._stop = intake, acks, dump, stop
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        #: HELLO of every connected probe, for the rank rows the agent writes itself.
        self._hellos: dict[socket.socket, Hello] = {}
        #: The pid of every connected probe's process from its socket (None: not visible here).
        self._pids: dict[socket.socket, int | None] = {}
        self._jobs_seen: set[str] = set()
        #: Probe connections served so far.
        self.connections = 0
        self._refused_count = Tally()

    def accept(self, listener: socket.socket) -> None:
        """Serve every connection ``listener`` accepts until the agent stops (a thread's target)."""
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            with self._lock:
                self._conns.add(conn)
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), name="argus-probe-conn", daemon=True).start()

    @property
    def refused_frames(self) -> int:
        """Probe frames refused because they could not be decoded or validated (:meth:`_refuse`)."""
        return self._refused_count.total

    def shutdown(self) -> None:
        """Shut every connection down (its thread then ends)."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def hellos(self) -> list[Hello]:
        """HELLO of every connected probe."""
        with self._lock:
            return list(self._hellos.values())

    def rank_process(self, job_id: str, rank: int) -> RankProcess | None:
        """The process of ``rank`` of ``job_id`` if its probe is connected here: the pid is the
        socket's (``SO_PEERCRED``), never the HELLO's; None when this namespace cannot see it."""
        with self._lock:
            for conn, hello in self._hellos.items():
                if hello.job_id == job_id and hello.rank == rank:
                    return RankProcess(self._pids.get(conn), conn)
        return None

    def ask_probe(self, conn: socket.socket, sample: Sample) -> None:
        """Ask the probe on ``conn`` to sample its own threads (a ``SAMPLE`` frame)."""
        self.acks.answer(conn, encode_frame(FrameType.SAMPLE, 0, sample.encode()))

    def _serve(self, conn: socket.socket) -> None:
        hello: Hello | None = None
        pid = peer_pid(conn)  # the kernel's word, in this pid namespace (argus.agent.peers)
        clean = False
        try:
            while (frame := read_frame(conn)) is not None:
                kind, seq, payload = frame
                if kind == FrameType.HELLO:
                    hello = Hello.decode(payload)
                    with self._lock:
                        self._hellos[conn] = hello
                        self._pids[conn] = pid
                    self._on_hello(hello, pid)
                elif kind == FrameType.BYE:
                    clean = True
                    if hello is not None:
                        self.intake.forget(hello)
                elif kind == FrameType.DUMP:
                    dump = Dump.decode(payload)
                    rows = self._dump(dump.job_id, dump.start_ns, dump.end_ns)
                    self.acks.answer(conn, encode_frame(FrameType.ACK, rows))  # the ACK carries how many
                elif not self._take(conn, kind, seq, payload, hello):
                    break  # closing: not acknowledged, the probe sends it to the next agent
        except (ProtocolError, OSError, KeyError, ValueError, TypeError) as exc:
            if not self._stop.is_set():
                log.warning("argus agent: dropping a probe connection: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._hellos.pop(conn, None)
                self._pids.pop(conn, None)
            self.acks.close(conn)
        if hello is not None and not clean and not self._stop.is_set():
            self._maybe_lost(hello, pid)

    def _take(
        self, conn: socket.socket, kind: FrameType, seq: int, payload: bytes, hello: Hello | None
    ) -> bool:
        """Take a BATCH or CAPTURE frame and acknowledge it once spooled; False when closing.

        Raises:
            ProtocolError: another kind of frame, or one before HELLO.
        """
        if kind not in (FrameType.BATCH, FrameType.CAPTURE):
            raise ProtocolError(f"unexpected frame {kind.name} from a probe")
        if hello is None:
            raise ProtocolError(f"{kind.name} before HELLO")
        if kind == FrameType.BATCH:
            try:
                table, data = decode_batch(payload)
            except ProtocolError as exc:
                return self._refuse(conn, hello, seq, str(exc))
            return self.intake.batch(conn, seq, hello, table, data)
        try:
            spans = Capture.decode(payload).spans
        except ProtocolError as exc:
            return self._refuse(conn, hello, seq, f"bad CAPTURE payload: {exc}")
        return self.intake.capture(conn, seq, hello, shift_spans(spans, self.intake.clock.current_ns))

    def _refuse(self, conn: socket.socket, hello: Hello, seq: int, why: str) -> bool:
        """Refuse frame ``seq``, which cannot be decoded or validated: counted, logged (the first of a
        minute), answered ``REFUSED`` (a probe of HELLO version < 3: acknowledged, as if delivered), so
        the probe drops it and never sends it again; the connection goes on. Returns True."""
        if self._refused_count.add(1):
            log.warning(
                "argus agent: refused frame %d of rank %s of job %s (%d refused so far): %s",
                seq,
                hello.rank,
                hello.job_id,
                self.refused_frames,
                why,
            )
        self.acks.refused(conn, hello, seq)
        return True

    def _on_hello(self, hello: Hello, pid: int | None) -> None:
        job_id = hello.job_id
        log.info(
            "argus agent: rank %s of job %s (pid %s, here %s) connected",
            hello.rank,
            job_id,
            hello.pid,
            pid,
        )
        if pid is None:
            log.warning(
                "argus agent: rank %s of job %s is in a pid namespace this agent cannot see; "
                "py-spy will not sample it (it samples itself)",
                hello.rank,
                job_id,
            )
        elif not claims_its_own_pid(pid, hello.pid):
            log.warning(
                "argus agent: rank %s of job %s names pid %s, but its socket is pid %d's; "
                "only pid %d is ever sampled",
                hello.rank,
                job_id,
                hello.pid,
                pid,
                pid,
            )
        with self._lock:
            first = job_id not in self._jobs_seen
            self._jobs_seen.add(job_id)
        if first:
            row: dict[str, list[Any]] = {
                "world_size": [hello.world_size],
                "start_ns": [hello.attach_ns],
                "command": [hello.command],
                "source": ["live"],
            }
            self.intake.rows(job_id, "jobs", pa.Table.from_pydict(row, schema=wire_schema("jobs")))

    def _maybe_lost(self, hello: Hello, pid: int | None) -> None:
        """A probe's connection ended without BYE: if its process (``pid``: the socket's, this
        namespace; None: not visible here, nothing recorded) is gone, record a crash exit."""
        time.sleep(0.5)
        if pid is None or not _pid_gone(pid):
            return
        log.warning("argus agent: rank %s (pid %d) ended without saying goodbye", hello.rank, pid)
        self.intake.forget(hello)
        self.intake.rows(hello.job_id, "ranks", rank_row(hello, "exit", time.time_ns(), -1))


def _pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def rank_row(hello: Hello, event: str, time_ns: int, exit_code: int) -> pa.Table:
    """A ``ranks`` row the agent writes for a connected probe (``exit`` for a crash, ``clock``)."""
    row: dict[str, list[Any]] = {
        "rank": [hello.rank],
        "event": [event],
        "time_ns": [time_ns],
        "local_rank": [hello.local_rank],
        "world_size": [hello.world_size],
        "host": [hello.host],
        "pid": [hello.pid],
        "agent_id": [""],
        "device": [hello.device],
        "clock_offset_ns": [0],
        "exit_code": [exit_code],
        "group_name": [""],
        "group_ranks": [[]],
        "group_backend": [""],
    }
    return pa.Table.from_pydict(row, schema=wire_schema("ranks"))
