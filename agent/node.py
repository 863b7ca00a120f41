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

Parts: :class:`~argus.agent.connections.ProbeConnections` serves the probes' connections
(frames in, ``ACK``/``REFUSED`` out), :class:`~argus.agent.intake.Intake` takes their rows into
the kernel windows or the uploader, :class:`~argus.agent.window_closer.WindowCloser` closes
kernel windows into summaries, :class:`~argus.agent.captures.StackCaptures` runs stack
captures, :class:`~argus.agent.uploader.Uploader` spools and uploads; :class:`NodeAgent`
composes them.

Threads: one accepting connections, one per probe connection, one for the
clock offset, one closing kernel windows, one sampling links; the uploader has its own.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import grp
import logging
import os
import select
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

from argus.agent.acks import Acks
from argus.agent.captures import StackCaptures
from argus.agent.clock import CollectorClock
from argus.agent.connections import ProbeConnections, rank_row
from argus.agent.intake import Intake
from argus.agent.kernels import KernelWindows
from argus.agent.links import LinkSampler, link_rows
from argus.agent.spool import Spool
from argus.agent.uploader import Uploader
from argus.agent.window_closer import WindowCloser
from argus.config import AgentConfig
from argus.errors import ConfigError
from argus.window_grid import WindowGrid

__all__ = ["STOP_GRACE_S", "STOP_SIGNALS", "NodeAgent", "main", "new_agent_id", "stop_signal_fd"]

log = logging.getLogger(__name__)

#: Seconds between two samples of the node's network interfaces.
LINK_EVERY_S = 1.0
#: Seconds between two lines of upload statistics in the log.
STATS_EVERY_S = 60.0


#: The signals that stop `argus agent` as at a job's end: drain, then exit (:func:`main`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds past its drain a stopping agent may take before it exits anyway (:func:`main`).
STOP_GRACE_S = 20.0


def new_agent_id() -> str:
    """``<host>-<pid>-<start ns>``: unique per agent process, never reused with a reset sequence."""
    return f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"


class NodeAgent:
    """The node agent: its parts composed, their threads started and stopped.

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
        self.socket_path, self.socket_group = socket_path, socket_group
        self.agent_id = new_agent_id()
        self.spool = Spool(spool_dir, spool_max_bytes)
        self.uploader = Uploader(
            collector, self.spool, self.agent_id, token=token, tls_cert=tls_cert, flush_s=flush_s
        )
        self.windows = KernelWindows(window, grace_s=grace_s)
        #: What the probes are owed (argus.agent.acks), sent as their frames become durable.
        self.acks = Acks()
        self.uploader.on_spooled = self.acks.spooled
        #: The offset to the collector's clock, per clock epoch (its thread: clock.run).
        self.clock = CollectorClock(self.uploader.clock, self._offset_changed)
        self.intake = Intake(self.agent_id, self.uploader, self.windows, self.acks, self.clock)
        self.closer = WindowCloser(self.windows, self.uploader, self.acks, self.clock)
        self._stop = threading.Event()
        self.probes = ProbeConnections(self.intake, self.acks, self.closer.raw, self._stop)
        #: Stack captures collectors ask for (argus.agent.captures), run in threads of their own.
        self.captures = StackCaptures(
            self.probes.rank_process,
            lambda job_id, t: self.intake.ship(job_id, "stacks", t),
            self.probes.ask_probe,
        )
        self.uploader.on_control = self.captures.take
        self._links = LinkSampler()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Bind the socket and start every thread.

        Raises:
            ConfigError: another agent listens on the socket, or it cannot be bound.
        """
        listener = self._listener = _bind(self.socket_path, self.socket_group)
        self.uploader.start()
        for target, name in (
            (lambda: self.probes.accept(listener), "argus-accept"),
            (lambda: self.clock.run(self._stop), "argus-clock"),
            (lambda: self.closer.run(self._stop), "argus-windows"),
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
                with contextlib.suppress(OSError):  # wakes the accept thread: close() alone does not
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
            finally:
                Path(self.socket_path).unlink(missing_ok=True)
        self.intake.close()
        with contextlib.suppress(Exception):
            self.closer.flush_all()
        with contextlib.suppress(Exception):
            self.uploader.flush()  # spools what was taken and acknowledges it
        self.probes.shutdown()
        for t in self._threads:
            t.join(timeout=2)
        self.captures.join(timeout_s=2)
        self.closer.flush_all()
        self.uploader.close(drain_s)
        self._log_stats()

    @property
    def offset_ns(self) -> int:
        """The offset added to timestamps taken now, ns."""
        return self.clock.current_ns

    def wait(self, wakeup_fd: int | None = None) -> None:
        """Block until :meth:`stop` is called from another thread or, given ``wakeup_fd``, until that
        descriptor is readable (a stop signal: :func:`stop_signal_fd`). Wakes once a second for the
        stats line."""
        next_stats = time.monotonic() + STATS_EVERY_S
        while not self._stop.is_set():
            if wakeup_fd is None:
                self._stop.wait(1.0)
            elif select.select([wakeup_fd], [], [], 1.0)[0]:
                return
            if time.monotonic() >= next_stats:
                self._log_stats()
                next_stats += STATS_EVERY_S

    def _offset_changed(self) -> None:
        """Record the current offset with every connected rank (a ``clock`` row in ``ranks``)."""
        now = time.time_ns()
        for hello in self.probes.hellos():
            self.intake.rows(hello.job_id, "ranks", rank_row(hello, "clock", now, 0))

    def _link_loop(self) -> None:
        host = socket.gethostname()
        try:  # the counters' baseline now, so the first rows come one period after start, not two
            self._links.sample()
        except Exception:
            log.warning("argus agent: sampling the network interfaces failed", exc_info=True)
        while not self._stop.wait(LINK_EVERY_S):
            try:
                samples = self._links.sample()
                jobs = {h.job_id for h in self.probes.hellos()}
                if samples and jobs:
                    rows = link_rows(samples, host)
                    for job_id in sorted(jobs):
                        self.intake.rows(job_id, "host_samples", rows)
            except Exception:
                log.warning("argus agent: sampling the network interfaces failed", exc_info=True)

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
            self.intake.bad_rows,
            self.probes.refused_frames,
        )


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


def _no_op(_signum: int, _frame: Any) -> None:
    """The Python-level handler of the stop signals: the work is the wakeup descriptor's."""


def stop_signal_fd(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> int:
    """A descriptor that becomes readable (one byte per delivery: the signal's number) when one of
    ``signals`` arrives, from whichever thread the kernel delivers it to. Call from the main thread.

    The Python-level handlers do nothing and take no lock; the interpreter's C handler writes the
    byte (``signal.set_wakeup_fd``). A handler that set a ``threading.Event`` deadlocked the agent
    when a signal ran it while the main thread held that Event's lock (inside ``Event.wait`` or
    ``set``, or a first handler's ``set``): `argus run`'s death sends SIGTERM once per thread it
    had (``PR_SET_PDEATHSIG`` follows each reparenting), close together, and a burst of SIGTERM
    did it too. The handlers stay installed, so a second signal never kills a draining agent.
    """
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    for sig in signals:
        signal.signal(sig, _no_op)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    return read_fd


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
    wakeup = stop_signal_fd()
    agent.start()
    agent.wait(wakeup)
    with contextlib.suppress(OSError):
        log.info("argus agent: signal %s, stopping", ", ".join(str(b) for b in set(os.read(wakeup, 64))))
    # Past its drain and this grace the agent exits anyway, its threads' tracebacks in its log first:
    # whatever it acknowledged is spooled, so a stop that hangs (a lock, gRPC at exit) loses nothing.
    faulthandler.dump_traceback_later(settings.drain_s + STOP_GRACE_S, exit=True)
    agent.stop(drain_s=settings.drain_s)
    return 0
