"""`argus agent`: the node agent (docs/design.md §1, §5).

Listens on a unix socket for the probes of this node (see
:mod:`argus.agent.protocol`), shifts their timestamps onto the collector's
clock, compresses kernel durations per window, and hands everything to the
:class:`~argus.agent.uploader.Uploader` (spool, then gRPC). One agent serves
any number of jobs and ranks. A probe's frame is acknowledged once what it
carried is in the spool (within the uploader's flush period, in frame order),
so an agent killed at any moment loses nothing it acknowledged: the probe
sends the rest again to the next agent. A probe whose connection drops sends
its unacknowledged frames again on the next one; the agent remembers the last
frame it took from each probe and acknowledges those without taking them
twice. Kernel events and capture spans wait in memory for their windows
(:mod:`argus.agent.kernels`): their frame is acknowledged once every event it
carried is summarised and the summaries are spooled (or the events were dropped,
counted), and since acknowledgements are cumulative, the frames a probe sent after
it wait for it too (up to a window and its grace: a probe keeps that much
unacknowledged, within its bound). An agent killed while holding them loses
nothing: the probe sends them again. (A frame whose events straddle two windows,
one already spooled when the agent died, has that window summarised twice.)

Clocks: the agent estimates its clock's offset to the collector's (NTP-style,
:class:`argus.agent.clock.CollectorClock`) at start and every ``CLOCK_EVERY_S``, and
checks every ``CLOCK_CHECK_S`` (and before taking any rows) whether the wall clock
stepped. A step is logged, applied at once (the offset moves by minus the step:
the collector's clock did not move), and a fresh estimate follows. Each row is
shifted by the offset of its own timestamp's epoch, so rows from before and
after a step both land right, and a duration that spans the step (wall clock
end minus start) loses the step. Whenever the offset changes, every connected
rank gets a ``ranks`` row with event ``clock`` carrying the new offset.

Links: every :data:`LINK_EVERY_S` the agent samples the node's network
interfaces (:mod:`argus.agent.links`) into ``host_samples`` rows with rank -1,
sent under every job with a probe connected to it.

Threads: one accepting connections, one per probe connection, one for the
clock offset, one closing kernel windows, one sampling links; the uploader has its own.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import logging
import os
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc

from argus.agent.acks import Acks
from argus.agent.captures import RankProcess, StackCaptures
from argus.agent.clock import CollectorClock, shift_spans, shift_times
from argus.agent.kernels import KernelWindows
from argus.agent.links import LinkSampler, link_rows
from argus.agent.messages import Capture, Dump, Hello, Sample
from argus.agent.peers import claims_its_own_pid, peer_pid
from argus.agent.protocol import (
    FrameType,
    ProtocolError,
    decode_batch,
    encode_frame,
    read_frame,
)
from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.config import AgentConfig
from argus.errors import ConfigError
from argus.rowrules import drop_bad_rows
from argus.schema import wire_schema
from argus.window_grid import WindowGrid

__all__ = ["NodeAgent", "main", "new_agent_id"]

log = logging.getLogger(__name__)

#: Seconds between two samples of the node's network interfaces.
LINK_EVERY_S = 1.0
#: Seconds between two lines of upload statistics in the log.
STATS_EVERY_S = 60.0


def new_agent_id() -> str:
    """``<host>-<pid>-<start ns>``: unique per agent process, never reused with a reset sequence."""
    return f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"


def _pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


class NodeAgent:
    """The node agent.

    Args:
        socket_path: Unix socket for probes.
        collector: Collector address ``host:port``.
        spool_dir: Spool folder.
        spool_max_bytes: Spool bound.
        window: Kernel compression window (:class:`~argus.window_grid.WindowGrid`).
        token: Bearer token for the collector.
        tls_cert: PEM certificate of the collector (TLS).
        flush_s: Seconds between batches to the collector.
        grace_s: Seconds a kernel window waits for late events.
        socket_group: Group (name or gid) of the socket and its folder; None: the agent's own
            (see :func:`_bind`).
    """

    def __init__(
        self,
        socket_path: str,
        collector: str,
        spool_dir: str,
        spool_max_bytes: int,
        window: WindowGrid,
        *,
        token: str | None = None,
        tls_cert: str | None = None,
        flush_s: float = 1.0,
        grace_s: float = 5.0,
        socket_group: str | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.socket_group = socket_group
        self.agent_id = new_agent_id()
        self.spool = Spool(spool_dir, spool_max_bytes)
        self.uploader = Uploader(
            collector, self.spool, self.agent_id, token=token, tls_cert=tls_cert, flush_s=flush_s
        )
        self.windows = KernelWindows(window, grace_s=grace_s)
        #: What the probes are owed (argus.agent.acks), sent as their frames become durable.
        self.acks = Acks()
        self.uploader.on_spooled = self.acks.spooled
        #: Stack captures collectors ask for (argus.agent.captures), run in threads of their own.
        self.captures = StackCaptures(self._rank_process, self._ship_stacks, self._ask_probe)
        self.uploader.on_control = self.captures.take
        # Held while a probe's frame is taken; at stop, no frame is taken after the last acknowledgements.
        self._intake = threading.Lock()
        self._closing = False
        #: The offset to the collector's clock, per clock epoch (its thread: clock.run).
        self.clock = CollectorClock(self.uploader.clock, self._offset_changed)
        #: HELLO of every connected probe, for the rank rows the agent writes itself.
        self._hellos: dict[socket.socket, Hello] = {}
        #: The pid of every connected probe's process from its socket (None: not visible here).
        self._pids: dict[socket.socket, int | None] = {}
        self._links = LinkSampler()
        self._jobs_seen: set[str] = set()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._window_drops_reported = 0
        #: Probe connections served so far.
        self.connections = 0
        #: Rows dropped on arrival because they break a row rule (a null, a value past its limit, a
        #: negative ``dur_ns``: :mod:`argus.rowrules`); the rest of their frame goes on.
        self.bad_rows = 0
        self._bad_warn_after = 0.0
        #: Probe frames refused because they could not be decoded or validated (:meth:`_refuse`).
        self.refused_frames = 0
        self._refused_warn_after = 0.0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket and start every thread.

        Raises:
            ConfigError: another agent listens on the socket, or it cannot be bound.
        """
        self._listener = _bind(self.socket_path, self.socket_group)
        self.uploader.start()
        for target, name in (
            (self._accept_loop, "argus-accept"),
            (lambda: self.clock.run(self._stop), "argus-clock"),
            (self._window_loop, "argus-windows"),
            (self._link_loop, "argus-links"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "argus agent %s: listening on %s, collector %s, spool %s",
            self.agent_id,
            self.socket_path,
            self.uploader.target,
            self.spool.root,
        )

    def stop(self, drain_s: float = 10.0) -> None:
        """Stop taking probes, compress open windows, drain the uploader for at most ``drain_s``.

        Every frame taken is spooled and acknowledged before the probes' connections
        close; frames after that are left unacknowledged for the next agent.
        """
        self._stop.set()
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                Path(self.socket_path).unlink(missing_ok=True)
        with self._intake:
            self._closing = True
        with contextlib.suppress(Exception):
            self._close_windows(self.windows.flush_all())
        with contextlib.suppress(Exception):
            self.uploader.flush()  # spools what was taken and acknowledges it
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(timeout=2)
        self.captures.join(timeout_s=2)
        self._close_windows(self.windows.flush_all())
        self.uploader.close(drain_s)
        self._log_stats()

    @property
    def offset_ns(self) -> int:
        """The offset added to timestamps taken now, ns."""
        return self.clock.current_ns

    def wait(self) -> None:
        """Block until :meth:`stop` is called (from a signal handler or another thread)."""
        next_stats = time.monotonic() + STATS_EVERY_S
        while not self._stop.wait(1.0):
            if time.monotonic() >= next_stats:
                self._log_stats()
                next_stats += STATS_EVERY_S

    # --- probes ----------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            with self._lock:
                self._conns.add(conn)
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), name="argus-probe-conn", daemon=True).start()

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
                        with self._intake:
                            self.acks.forget(hello)
                elif kind == FrameType.DUMP:
                    self._on_dump(conn, Dump.decode(payload))
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
            return self._take_batch(conn, seq, payload, hello)
        try:
            spans = shift_spans(Capture.decode(payload).spans, self.offset_ns)
        except ProtocolError as exc:
            return self._refuse(conn, hello, seq, f"bad CAPTURE payload: {exc}")
        with self._intake:
            if self._closing:
                return False
            if not self.acks.taken_before(hello, conn, seq):
                ticket = self.acks.ticket()
                now = time.time_ns() + self.offset_ns
                self.windows.cover(hello.job_id, hello.rank, spans, ticket=ticket, now_ns=now)
                self.acks.took(hello, conn, seq, None, ticket)
        return True

    def _take_batch(self, conn: socket.socket, seq: int, payload: bytes, hello: Hello) -> bool:
        """Take a BATCH frame (:meth:`_take`), or refuse one that cannot be decoded or validated."""
        try:
            table, data = decode_batch(payload)
        except ProtocolError as exc:
            return self._refuse(conn, hello, seq, str(exc))
        job_id = hello.job_id
        with self._intake:
            if self._closing:
                return False
            if not self.acks.taken_before(hello, conn, seq):
                if table == "kernel_events":
                    ticket = self.acks.ticket()
                    self._ingest(job_id, table, data, ticket)
                    self.acks.took(hello, conn, seq, None, ticket)
                else:
                    self.acks.took(hello, conn, seq, self._ingest(job_id, table, data))
        return True

    def _refuse(self, conn: socket.socket, hello: Hello, seq: int, why: str) -> bool:
        """Refuse frame ``seq``, which cannot be decoded or validated: counted, logged (the first of a
        minute), answered ``REFUSED`` (a probe of HELLO version < 3: acknowledged, as if delivered), so
        the probe drops it and never sends it again; the connection goes on. Returns True."""
        with self._lock:
            self.refused_frames += 1
            now = time.monotonic()
            loud = now >= self._refused_warn_after
            if loud:
                self._refused_warn_after = now + STATS_EVERY_S
        if loud:
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

    def _on_dump(self, conn: socket.socket, dump: Dump) -> None:
        """A DUMP request: queue the raw events asked for; the ACK carries how many."""
        rows = self.upload_raw(dump.job_id, dump.start_ns, dump.end_ns)
        self.acks.answer(conn, encode_frame(FrameType.ACK, rows))

    def _rank_process(self, job_id: str, rank: int) -> RankProcess | None:
        """The process of ``rank`` of ``job_id`` if its probe is connected here: the pid is the
        socket's (``SO_PEERCRED``), never the HELLO's; None when this namespace cannot see it."""
        with self._lock:
            for conn, hello in self._hellos.items():
                if hello.job_id == job_id and hello.rank == rank:
                    return RankProcess(self._pids.get(conn), conn)
        return None

    def _ship_stacks(self, job_id: str, table: pa.Table) -> None:
        with self._intake:
            if not self._closing:
                self._ingest(job_id, "stacks", table)

    def _ask_probe(self, conn: socket.socket, sample: Sample) -> None:
        self.acks.answer(conn, encode_frame(FrameType.SAMPLE, 0, sample.encode()))

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
            self._ingest(job_id, "jobs", pa.Table.from_pydict(row, schema=wire_schema("jobs")))

    def _maybe_lost(self, hello: Hello, pid: int | None) -> None:
        """A probe's connection ended without BYE: if its process (``pid``: the socket's, this
        namespace; None: not visible here, nothing recorded) is gone, record a crash exit."""
        time.sleep(0.5)
        if pid is None or not _pid_gone(pid):
            return
        log.warning("argus agent: rank %s (pid %d) ended without saying goodbye", hello.rank, pid)
        with self._intake:
            self.acks.forget(hello)
        self._ingest(hello.job_id, "ranks", _rank_row(hello, "exit", time.time_ns(), -1))

    def _ingest(self, job_id: str, table: str, data: pa.Table, ticket: int = -1) -> int:
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
        with self._lock:
            self.bad_rows += rows
            now = time.monotonic()
            loud = now >= self._bad_warn_after
            if loud:
                self._bad_warn_after = now + STATS_EVERY_S
        if loud:
            log.warning(
                "argus agent: dropped %d %s row(s) of job %s that the collector would refuse (%s; "
                "%d so far); the rest of the batch goes on",
                rows,
                table,
                job_id,
                "; ".join(why),
                self.bad_rows,
            )

    def upload_raw(self, job_id: str, start_ns: int, end_ns: int) -> int:
        """Queue the raw kernel events of ``job_id`` in ``[start_ns, end_ns)`` still held; returns rows."""
        data = self.windows.raw(job_id, start_ns, end_ns)
        self.uploader.add(job_id, "kernel_events", data, self.offset_ns)
        return data.num_rows

    # --- clock and windows -----------------------------------------------------------------------

    def _offset_changed(self) -> None:
        """Record the current offset with every connected rank (a ``clock`` row in ``ranks``)."""
        with self._lock:
            hellos = list(self._hellos.values())
        now = time.time_ns()
        for hello in hellos:
            self._ingest(hello.job_id, "ranks", _rank_row(hello, "clock", now, 0))

    def _link_loop(self) -> None:
        host = socket.gethostname()
        while not self._stop.wait(LINK_EVERY_S):
            try:
                samples = self._links.sample()
                with self._lock:
                    jobs = {h.job_id for h in self._hellos.values()}
                if samples and jobs:
                    rows = link_rows(samples, host)
                    for job_id in sorted(jobs):
                        self._ingest(job_id, "host_samples", rows)
            except Exception:
                log.warning("argus agent: sampling the network interfaces failed", exc_info=True)

    def _window_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._close_windows(self.windows.ready(time.time_ns() + self.offset_ns))
            except Exception:
                log.warning("argus agent: compressing kernel windows failed", exc_info=True)

    def _close_windows(self, summaries: list[tuple[str, pa.Table]]) -> None:
        """Queue the summaries of windows just closed, release the frames done with, count drops."""
        for job_id, rows in summaries:
            self.uploader.add(job_id, "kernel_summaries", rows, self.offset_ns)
        self.acks.release(self.windows.released(), self.uploader.generation)
        w = self.windows
        with self._lock:
            dropped, self._window_drops_reported = (
                w.dropped_events - self._window_drops_reported,
                w.dropped_events,
            )
        if dropped > 0:
            log.warning(
                "argus agent: %d kernel events dropped (so far: %d after their window closed, %d too far "
                "ahead of the clock, %d over the bound of held events)",
                dropped,
                w.late_events,
                w.future_events,
                w.overflow_events,
            )
            self.uploader.count_dropped(dropped)

    def _log_stats(self) -> None:
        s = self.uploader.stats
        log.info(
            "argus agent: batches stored %d, duplicate %d, rejected %d (%d rows); spooled %d (%d bytes); "
            "spool drops %d rows; bad rows dropped %d; probe frames refused %d",
            s.batches_stored,
            s.batches_duplicate,
            s.batches_rejected,
            s.rows_rejected,
            len(self.spool),
            self.spool.size_bytes,
            self.spool.dropped_rows,
            self.bad_rows,
            self.refused_frames,
        )


def _rank_row(hello: Hello, event: str, time_ns: int, exit_code: int) -> pa.Table:
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


def _group_id(group: str) -> int:
    """The gid of ``group`` (a name or a number).

    Raises:
        ConfigError: no such group.
    """
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-group: no group named {group!r} on this host") from None


def _socket_dir(folder: Path, gid: int | None) -> None:
    """Make ``folder`` (mode 0700, or 0750 of group ``gid``), or check the one there.

    Raises:
        ConfigError: it belongs to another user, or users other than its owner may write it:
            they could replace the socket and read every probe's data.
    """
    mode = 0o700 if gid is None else 0o750
    if not folder.exists():
        folder.mkdir(parents=True, mode=mode, exist_ok=True)
        os.chmod(folder, mode)  # the umask may have taken bits off
        if gid is not None:
            os.chown(folder, -1, gid)
    st, me = folder.stat(), os.geteuid()
    if st.st_uid != me:
        raise ConfigError(
            f"the socket directory {folder} belongs to uid {st.st_uid}, not to this user (uid {me}): "
            "its owner could replace the socket and read every probe's data; give --socket a path "
            "in a directory you own (e.g. $XDG_RUNTIME_DIR/argus)"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"the socket directory {folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            "they could replace the socket and read every probe's data; give --socket a path in a "
            "directory only you can write (e.g. $XDG_RUNTIME_DIR/argus), or chmod go-w it"
        )
    if gid is not None and (st.st_gid != gid or st.st_mode & 0o050 != 0o050):
        os.chown(folder, -1, gid)  # the group's members must reach the socket in it
        os.chmod(folder, stat.S_IMODE(st.st_mode) | 0o050)


def _bind(path: str, group: str | None = None) -> socket.socket:
    """Listen on unix socket ``path``, replacing a stale socket file but never a live agent.

    The socket is mode 0660, of ``group`` when given (its folder then 0750 of that group: the
    group's members may connect), else of the agent's own group in a folder of mode 0700
    (:func:`_socket_dir`).

    Raises:
        ConfigError: another agent listens there, the socket's directory belongs to another
            user or others may write it, ``group`` does not exist, or the socket cannot be bound.
    """
    p = Path(path)
    gid = _group_id(group) if group is not None else None
    _socket_dir(p.parent, gid)
    if p.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            p.unlink(missing_ok=True)
        else:
            raise ConfigError(f"another node agent already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o660)
        if gid is not None:
            os.chown(path, -1, gid)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {path}: {exc}") from exc
    sock.listen(256)
    return sock


def main(args: argparse.Namespace) -> int:
    """`argus agent`: run until SIGINT/SIGTERM, then drain to the collector for a few seconds.

    Raises:
        ConfigError: a bad option, or another agent listens on the socket.
    """
    settings = AgentConfig.from_args(args)
    agent = NodeAgent(
        settings.socket,
        settings.collector,
        settings.spool_dir,
        settings.spool_max_bytes,
        settings.window,
        token=settings.token,
        tls_cert=settings.tls_cert,
        socket_group=settings.socket_group,
    )
    agent.start()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("argus agent: signal %d, stopping", signum)
        agent._stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.wait()
    agent.stop(drain_s=settings.drain_s)
    return 0
