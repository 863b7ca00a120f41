"""The collector's writer: one thread that stores decoded batches in groups.

The collector's event loop (or any thread) decodes and validates batches, then hands them
here and waits for the outcome. The writer takes every
batch that queued up while it was busy and stores them with
:func:`argus.collector.ingest.write_group`: one dedup lookup, one ``ingest_batches`` insert
(the group's records, with the settlements of the group before: no insert of their own) and one
data insert per table per group instead of per batch. Fixed costs of a
chDB call (tens of ms for a small insert on a loaded machine) would otherwise be paid three
times per batch. The outcomes of a group's batches submitted from an event loop are
handed back to it in one callback (:meth:`BatchWriter.submit_async`), not one wake-up each.

What a group costs is mostly per insert, not per row: a chDB insert into a MergeTree table
writes a part, about 15-20 ms of CPU whether it holds 100 rows or 20,000 (0.45 µs a row beyond;
chDB 4.4, 2026-12-06), and every part is merged again later. So the writer makes few, large
groups: after a group of more than one batch (batches arrive together: many agents) it starts
the next one no sooner than :data:`GROUP_INTERVAL_S` after that group's start, and a group is
bounded by :data:`MAX_GROUP` batches, well above what arrives in that time (1,250 node agents send
about 5,000 a second; the bytes they hold are bounded by the decoded budget,
:mod:`argus.collector.decoded_budget`). A lone batch (one client sending and waiting) is stored at
once. Before, a group held at most 1,024 batches and followed the last at once: at 1,250 agents at
least five groups a second of six to eight inserts each.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from argus.collector import ingest, ingest_record
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import Store
from argus.threads import start_daemon

__all__ = ["BatchWriter"]

log = logging.getLogger(__name__)

#: Most batches stored as one group (module doc).
MAX_GROUP = 16_384
#: After a group of more than one batch, the next starts no sooner than this after its start, s
#: (module doc): at most two groups a second while many agents send, half the node agent's flush
#: period, so a batch waits at most half a second more for its ack.
GROUP_INTERVAL_S = 0.5
SHUTTING_DOWN = "the collector is shutting down; send this batch again later"

#: Where a batch's outcome goes: a thread's future, or a future of the event loop that submitted it.
_Waiter = Future[pb.Ack] | tuple[asyncio.AbstractEventLoop, "asyncio.Future[pb.Ack]"]


class BatchWriter:
    """Stores :class:`~argus.collector.ingest.Decoded` batches from any thread, in groups.

    Args:
        store: Where batches go.
        metrics: Counters updated per stored or duplicate batch.
        max_group: Most batches per group.
        interval_s: After a group of more than one batch, the next starts no sooner than this
            after its start, seconds (>= 0; module doc).
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics | None = None,
        *,
        max_group: int = MAX_GROUP,
        interval_s: float = GROUP_INTERVAL_S,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.max_group = max_group
        self.interval_s = interval_s
        #: This writer's inserts and the settlements to write with the next group's record; writer
        #: thread only (:mod:`argus.collector.ingest_record`).
        self.groups = ingest_record.Groups()
        self._queue: queue.SimpleQueue[tuple[ingest.Decoded, _Waiter] | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = start_daemon(self._run, "argus-writer")

    def submit(self, decoded: ingest.Decoded) -> Future[pb.Ack]:
        """Queue ``decoded``; the future resolves to its Ack or fails with ``StoreError``.

        Raises:
            StoreError: the writer is closed.
        """
        if self._closing.is_set():
            raise StoreError(SHUTTING_DOWN)
        future: Future[pb.Ack] = Future()
        self._queue.put((decoded, future))
        return future

    def submit_async(self, decoded: ingest.Decoded) -> asyncio.Future[pb.Ack]:
        """:meth:`submit` from a running event loop: the future is the loop's, and a group's
        outcomes reach the loop in one ``call_soon_threadsafe`` (a wake-up per batch, as
        ``asyncio.wrap_future`` makes, cost the collector's loop a fifth of its time at 1,250
        agents).

        Raises:
            StoreError: the writer is closed.
            RuntimeError: no event loop runs in this thread.
        """
        if self._closing.is_set():
            raise StoreError(SHUTTING_DOWN)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.Ack] = loop.create_future()
        self._queue.put((decoded, (loop, future)))
        return future

    def write(self, decoded: ingest.Decoded) -> pb.Ack:
        """Submit ``decoded`` and wait for its Ack.

        Raises:
            StoreError: it was not stored (store failure or shutdown); safe to retry.
        """
        return self.submit(decoded).result()

    def close(self, timeout: float | None = None) -> bool:
        """Store what is queued, then stop. True when the thread ended within ``timeout`` s."""
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        while True:  # submitted after the thread ended: not stored, say so
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is not None:
                _settle_group([item[1]], [StoreError(SHUTTING_DOWN)])

    def _take_group(self, not_before: float) -> tuple[list[tuple[ingest.Decoded, _Waiter]], bool]:
        """The next group: its first batch, then, from ``not_before`` (``time.monotonic()``) on, every
        batch queued meanwhile (closing ends the wait); and whether the writer is closing."""
        first = self._queue.get()
        if first is None:
            return [], True
        self._closing.wait(max(not_before - time.monotonic(), 0.0))
        group, done = [first], False
        while len(group) < self.max_group:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                done = True
                break
            group.append(item)
        return group, done

    def _run(self) -> None:
        done, not_before = False, 0.0
        while not done:
            group, done = self._take_group(not_before)
            started = time.monotonic()
            not_before = started + self.interval_s if len(group) > 1 else started
            if done:
                # Batches submitted just before close are still stored.
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        group.append(item)
            if not group:
                continue
            try:
                outcomes: list[ingest.Outcome] = ingest.write_group(
                    self.store, [d for d, _ in group], self.metrics, self.groups
                )
            except Exception as exc:  # a bug, not a store failure: fail the group, keep serving
                log.exception("storing a group of %d batches failed", len(group))
                outcomes = [StoreError(f"internal error: {exc}")] * len(group)
            waiters = [w for _, w in group]
            # The decoded rows go before their charge is given back (the waiters' callbacks,
            # argus.collector.decoded_budget), and no outcome keeps frames that held them.
            del group
            _settle_group(waiters, [o if isinstance(o, pb.Ack) else ingest.detached(o) for o in outcomes])


def _settle_group(waiters: Sequence[_Waiter], outcomes: Sequence[ingest.Outcome]) -> None:
    """Give each waiter its outcome: threads' futures at once, each event loop's in one callback."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[pb.Ack], ingest.Outcome]]] = {}
    for waiter, outcome in zip(waiters, outcomes, strict=True):
        if isinstance(waiter, Future):
            _settle(waiter, outcome)
        else:
            by_loop.setdefault(waiter[0], []).append((waiter[1], outcome))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_on_loop, settled)
        except RuntimeError:  # the loop is closed: nobody waits for these any more
            log.debug("%d outcomes for a closed event loop dropped", len(settled))


def _settle(future: Future[pb.Ack], outcome: ingest.Outcome) -> None:
    """Give ``future`` its outcome, unless its waiter cancelled it meanwhile."""
    if not future.set_running_or_notify_cancel():
        return
    if isinstance(outcome, pb.Ack):
        future.set_result(outcome)
    else:
        future.set_exception(outcome)


def _settle_on_loop(settled: Sequence[tuple[asyncio.Future[pb.Ack], ingest.Outcome]]) -> None:
    """On the waiters' loop: give each future its outcome, unless it was cancelled meanwhile."""
    for future, outcome in settled:
        if future.cancelled():
            continue
        if isinstance(outcome, pb.Ack):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)
