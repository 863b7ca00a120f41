"""The node agent's stack captures: what a collector's ``StackCapture`` asks, run off the hot path.

A collector passes the analyzer's pending capture requests on its ``Ack`` stream
(``Ack.stack_captures``, :mod:`argus.collector.captures`). For each rank of a request that
has a probe connected to this agent (only the processes on the agent's socket are ever
sampled, by the pid the kernel gives for the socket, :mod:`argus.agent.peers`),
:class:`StackCaptures` starts a thread that samples the rank's process with py-spy
(:func:`argus.agent.stacks.sample_pyspy`; a blocking native dump when the request says
``blocking``) and hands the ``stacks`` rows to the agent's batch path. Where py-spy cannot
attach (or the agent cannot see the process), the thread asks the rank's probe to sample its
own threads instead (a ``SAMPLE`` frame, :mod:`argus.agent.protocol`); the probe ships those
rows itself. A request is run once per capture id, however often collectors pass it; one
capture per rank runs at a time.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from argus.agent import stacks
from argus.agent.messages import Sample
from argus.proto import collector_pb2

__all__ = ["RankProcess", "StackCaptures"]

log = logging.getLogger(__name__)

#: Capture ids remembered (requests already run are not run again).
REMEMBERED = 4096
#: Longest capture an agent runs, ms (a request asking more is cut to this).
MAX_DURATION_MS = 30_000


class RankProcess(NamedTuple):
    """A rank's process on this node: its pid and its probe's connection to the agent."""

    #: From the socket (``SO_PEERCRED``, :mod:`argus.agent.peers`), this agent's pid namespace;
    #: None when the agent cannot see the process: it is asked to sample itself.
    pid: int | None
    conn: socket.socket


class StackCaptures:
    """Runs capture requests for the ranks this agent serves.

    Args:
        find: ``(job_id, rank)`` → the rank's process, or None when no probe of it is connected.
        ship: Takes ``(job_id, stacks table)`` into the agent's batch path.
        ask_probe: Sends a ``SAMPLE`` request (JSON document) on a probe's connection.
    """

    def __init__(
        self,
        find: Callable[[str, int], RankProcess | None],
        ship: Callable[[str, pa.Table], Any],
        ask_probe: Callable[[socket.socket, Sample], None],
    ) -> None:
        self._find, self._ship, self._ask_probe = find, ship, ask_probe
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._busy: set[tuple[str, int]] = set()
        self._threads: list[threading.Thread] = []
        #: Captures run, by sampler (py-spy, py-spy-native, in-process), and failed ones.
        self.counts: dict[str, int] = {}

    def take(self, ack: collector_pb2.Ack) -> None:
        """Start every capture of ``ack`` not run before, for the ranks served here; never raises."""
        for capture in ack.stack_captures:
            for rank in capture.ranks:
                try:
                    self._start(capture, int(rank))
                except Exception:
                    log.warning(
                        "argus agent: stack capture %s failed to start", capture.capture_id, exc_info=True
                    )

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the captures running now."""
        deadline = time.monotonic() + timeout_s
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def _start(self, capture: collector_pb2.StackCapture, rank: int) -> None:
        key = (capture.capture_id, rank)
        proc = self._find(capture.job_id, rank)
        with self._lock:
            if proc is None or key in self._seen or (capture.job_id, rank) in self._busy:
                return
            self._seen[key] = None
            while len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
            self._busy.add((capture.job_id, rank))
            self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(
            target=self._run, args=(capture, rank, proc), name="argus-stacks", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _run(self, capture: collector_pb2.StackCapture, rank: int, proc: RankProcess) -> None:
        duration_ms = min(int(capture.duration_ms), MAX_DURATION_MS)
        sampler = stacks.PYSPY_NATIVE if capture.blocking else stacks.PYSPY
        try:
            if proc.pid is None:
                raise stacks.SamplerError(
                    f"rank {rank}'s process is in a pid namespace this agent cannot see"
                )
            start_ns, t0 = time.time_ns(), time.monotonic()
            rows = stacks.sample_pyspy(proc.pid, duration_ms / 1000, blocking=capture.blocking)
            duration_ns = 0 if capture.blocking else int((time.monotonic() - t0) * 1e9)
            table = stacks.stack_table(
                rows,
                rank=rank,
                pid=proc.pid,
                capture_id=capture.capture_id,
                time_ns=start_ns,
                duration_ns=duration_ns,
                sampler=sampler,
            )
            self._ship(capture.job_id, table)
        except stacks.SamplerError as exc:
            log.info("argus agent: %s; rank %d samples itself in-process", exc, rank)
            sampler = stacks.IN_PROCESS
            try:
                self._ask_probe(proc.conn, Sample(capture.capture_id, duration_ms))
            except OSError as err:
                log.warning("argus agent: cannot ask rank %d to sample itself: %s", rank, err)
                sampler = "failed"
        except Exception:
            log.warning("argus agent: stack capture of rank %d failed", rank, exc_info=True)
            sampler = "failed"
        finally:
            with self._lock:
                self._busy.discard((capture.job_id, rank))
                self.counts[sampler] = self.counts.get(sampler, 0) + 1
