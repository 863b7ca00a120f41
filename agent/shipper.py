"""The probe's shipper thread: recorded rows become Arrow batches for the node agent.

Every :data:`FLUSH_S` seconds it closes a step end held too long, decodes the CUPTI buffers,
notes new process groups, samples the host signals (the rank's heartbeat, every
:data:`SAMPLE_S`), turns every buffer's rows into a batch of its table's wire schema
(:func:`argus.agent.rows.record_batch`) and hands them to the
:class:`~argus.agent.sink.AgentLink`. It ships earlier when a row buffer reaches half its
capacity (:meth:`argus.agent.buffers.RowBuffer.wake_at_half`), so a burst is taken before a buffer
fills; between shipments it wakes at the edges of the CUPTI duty cycle, and nothing else.

Why once a second: each shipment costs about the same whatever its rows (a frame per table: its
Arrow batch and IPC stream here, its decoding and row checks in the node agent), and with more
ranks than cores every cycle Argus spends on the host is one training does not get
(``bench/host_cpu.py``). Half a second cost the 4 probes of the demo job 0.96 % of a core and the
node agent's frame intake 0.99 %. A second is the heartbeat's period, so every shipment carries
one: the heartbeat past a window's end, which the analyzer waits for (docs/design.md §6.1), and
every row recorded before it leave together, as soon as before.

When the node agent asks (a ``SAMPLE`` frame: it could not attach py-spy), a thread of its own
samples this process's threads (:func:`argus.agent.stacks.sample_threads`) and the next shipment
carries the ``stacks`` rows. It never raises into training: a failed shipment is logged (the first
three) and counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa

from argus.agent import stacks
from argus.agent.durations import drop_negative_durations
from argus.agent.gpu import GpuCapture
from argus.agent.host import HostSampler
from argus.agent.identity import Identity
from argus.agent.messages import Sample
from argus.agent.recorder import Recorder
from argus.agent.rows import HostRow, record_batch
from argus.agent.sink import AgentLink

__all__ = ["FLUSH_S", "IDLE_STEP_NS", "SAMPLE_S", "Shipper"]

log = logging.getLogger(__name__)

_Rows = TypeVar("_Rows", pa.Table, pa.RecordBatch)

#: Seconds between two shipments to the node agent (earlier when a row buffer is half full).
FLUSH_S = 1.0
#: Seconds between two host samples (the heartbeat).
SAMPLE_S = 1.0
#: A step end held for another optimizer is closed after this long without activity.
IDLE_STEP_NS = 1_000_000_000


def _start_thread(run: Callable[[], None], stop: Callable[[], None]) -> threading.Thread:
    """Start the shipper thread so that it has ended before the interpreter finalizes.

    A daemon thread still inside native code (pyarrow) when Python finalizes is
    killed on its way back to the GIL, which aborts the process ("terminate
    called without an active exception"). So the shipper is a regular thread
    and ``threading._register_atexit`` (run by ``threading._shutdown`` before it
    joins regular threads, as ``concurrent.futures`` does) tells it to stop; the
    final flush then runs from ``atexit`` in the main thread. Where that hook is
    missing the thread is a daemon and shutdown joins it.
    """
    register = getattr(threading, "_register_atexit", None)
    thread = threading.Thread(target=run, name="argus-probe", daemon=register is None)
    if register is not None:
        register(stop)
    thread.start()
    return thread


class Shipper:
    """Ships one rank's recorded rows to the node agent at ``socket_path``.

    Args:
        recorder: Where the rows are.
        gpu: The rank's CUPTI capture, or None.
        sampler: The host signals.
        socket_path: The node agent's socket.
        identify: This rank's identity (``final``: at exit, a guess is better than none), or None
            while it cannot be known yet; asked until it answers.
        flush_s: Seconds between shipments.
    """

    def __init__(
        self,
        recorder: Recorder,
        gpu: GpuCapture | None,
        sampler: HostSampler,
        socket_path: str,
        identify: Callable[[bool], Identity | None],
        flush_s: float = FLUSH_S,
    ) -> None:
        self.recorder, self.gpu, self.sampler = recorder, gpu, sampler
        self.socket_path = socket_path
        self.flush_s = flush_s
        self._identify = identify
        self.identity: Identity | None = None
        self.link: AgentLink | None = None
        self._stop = threading.Event()
        #: Wakes the thread: a row buffer is half full, or it is told to stop.
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_sample = 0.0
        self._dropped_reported = 0
        self._errors = 0
        #: Rows dropped because their ``dur_ns`` was negative (:mod:`argus.agent.durations`).
        self.negative_durations = 0
        #: ``stacks`` tables sampled in-process, waiting for the next shipment.
        self._stacks: deque[pa.Table] = deque()

    def connect(self, final: bool = False) -> bool:
        """Learn this rank's identity and open the link to the node agent, once; True when done."""
        if self.identity is None:
            self.identity = self._identify(final)
            if self.identity is not None:
                self.link = AgentLink(self.socket_path, self.identity.hello())
                self.link.on_sample = self._sample_stacks
        return self.identity is not None

    def start(self) -> None:
        """Start the thread; a row buffer half full wakes it."""
        for buf in self.recorder.buffers.values():
            buf.wake_at_half(self._wake)
        self._thread = _start_thread(self._run, self._halt)

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (from another one) and wait for it for at most ``timeout_s``."""
        self._halt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    def close(self, exit_code: int, timeout_s: float) -> None:
        """The final shipment, then BYE with ``exit_code`` (at most ``timeout_s`` of flushing)."""
        self.connect(final=True)
        self.ship(force_sample=True, final=True)
        if self.link is not None:
            self.link.close(exit_code, timeout_s)

    def _run(self) -> None:
        next_ship = time.monotonic() + self.flush_s
        while True:
            wait = next_ship - time.monotonic()
            if self.gpu is not None and self.gpu.active:
                wait = min(wait, (self.gpu.next_edge_ns - time.time_ns()) / 1e9)
            woken = self._wake.wait(max(wait, 0.0))
            if self._stop.is_set():
                return
            self._wake.clear()  # before the rows are taken: a buffer half full after this wakes again
            try:
                if self.gpu is not None:
                    self.gpu.edge(time.time_ns())
                if time.monotonic() >= next_ship:
                    next_ship = time.monotonic() + self.flush_s
                    self.ship()
                elif woken:
                    self.ship()
            except Exception:
                self._errors += 1
                if self._errors <= 3:
                    log.warning("argus: probe shipment failed", exc_info=True)

    def ship(self, force_sample: bool = False, final: bool = False) -> None:
        """One shipment (see the module doc); nothing before the rank's identity is known."""
        if not self.connect():
            return
        identity, link = self.identity, self.link
        assert identity is not None and link is not None
        recorder = self.recorder
        now = time.time_ns()
        recorder.tracker.flush_idle(now, IDLE_STEP_NS)
        if self.gpu is not None:
            kernels = self.gpu.rows(identity.rank, now, final)
            if kernels is not None:
                kernels = self._checked("kernel_events", kernels)
                if kernels.num_rows:
                    link.enqueue("kernel_events", kernels)
        recorder.scan_groups()
        mono = time.monotonic()
        if force_sample or mono >= self._next_sample:
            # Due a period after the last one was due, but half a period ahead of this one at least:
            # every timed shipment (SAMPLE_S apart, give or take the wake-up's latency) samples, an
            # early one (a buffer half full) half a period after a sample does not.
            self._next_sample = max(self._next_sample + SAMPLE_S, mono + SAMPLE_S / 2)
            sample = HostRow._make((*self.sampler.sample(), self._take_dropped(), *recorder.oldest_pending()))
            recorder.buffers["host_samples"].append(sample)
        self._enqueue_buffers(link, identity)
        if self.gpu is not None:
            self._ship_spans(link, self.gpu.take_spans(now))
        link.pump()

    def _enqueue_buffers(self, link: AgentLink, identity: Identity) -> None:
        """Queue every buffer's rows as a batch of its table (bad rows dropped), then sampled stacks."""
        constants = _constants(identity)
        for table, buf in self.recorder.buffers.items():
            rows = buf.take()
            if rows:
                batch = self._checked(table, record_batch(table, rows, constants))
                if batch.num_rows:
                    link.enqueue(table, batch)
        while self._stacks:
            link.enqueue("stacks", self._stacks.popleft())

    def _ship_spans(self, link: AgentLink, spans: list[tuple[int, int]]) -> None:
        """Queue the capture spans that end after they start (the others are counted)."""
        kept = [(a, b) for a, b in spans if b >= a]
        self.negative_durations += len(spans) - len(kept)
        if kept:
            link.enqueue_capture(kept)

    def _checked(self, table: str, rows: _Rows) -> _Rows:
        """``rows`` without those whose end precedes their start (counted; the first logged)."""
        rows, dropped = drop_negative_durations(rows)
        if dropped:
            if not self.negative_durations:
                log.warning("argus: dropped %d %s row(s) whose end precedes their start", dropped, table)
            self.negative_durations += dropped
        return rows

    def _sample_stacks(self, sample: Sample) -> None:
        """A ``SAMPLE`` request: sample this process's threads in a thread of its own."""
        identity = self.identity
        if identity is None:
            return
        capture_id = sample.capture_id
        seconds = min(max(sample.duration_ms / 1000, 0.0), 30.0)

        def run() -> None:
            try:
                start_ns, t0 = time.time_ns(), time.monotonic()
                rows = stacks.sample_threads(seconds)
                self._stacks.append(
                    stacks.stack_table(
                        rows,
                        rank=identity.rank,
                        pid=os.getpid(),
                        capture_id=capture_id,
                        time_ns=start_ns,
                        duration_ns=int((time.monotonic() - t0) * 1e9),
                        sampler=stacks.IN_PROCESS,
                    )
                )
            except Exception:
                log.warning("argus: sampling this rank's stacks failed", exc_info=True)

        threading.Thread(target=run, name="argus-stacks", daemon=True).start()

    def _take_dropped(self) -> int:
        """Rows lost since the last host sample: buffers, pending bound, CUPTI, the link's queue,
        negative durations."""
        total = self.recorder.dropped() + (self.gpu.dropped() if self.gpu is not None else 0)
        total += self.negative_durations
        if self.link is not None:
            total += self.link.dropped_rows
        new = total - self._dropped_reported
        self._dropped_reported = total
        return new


def _constants(identity: Identity) -> dict[str, Any]:
    """The columns every row of this rank's batches shares (the node agent sets its own two)."""
    return {
        "rank": identity.rank,
        "host": identity.host,
        "local_rank": identity.local_rank,
        "world_size": identity.world_size,
        "pid": identity.pid,
        "device": identity.device,
        "agent_id": "",
        "clock_offset_ns": 0,
    }
