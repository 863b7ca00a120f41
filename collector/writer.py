"""The collector's writer: one thread that stores decoded batches in groups.

Stream threads decode and validate their batches in parallel (pyarrow releases
the GIL), then hand them here and wait for the outcome. The writer takes every
batch that queued up while it was busy and stores them with
:func:`argus.collector.ingest.write_group`: one dedup lookup, one data insert per
table and one ``ingest_batches`` insert per group instead of per batch. Fixed costs of a
chDB call (tens of ms for a small insert on a loaded machine) would otherwise be paid three
times per batch. A group holds at most :data:`MAX_GROUP` batches: 1,250 node agents send
about 5,000 a second.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from argus.collector import ingest
from argus.errors import StoreError
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import Store

__all__ = ["BatchWriter"]

log = logging.getLogger(__name__)

#: Most batches stored as one group.
MAX_GROUP = 1024
SHUTTING_DOWN = "the collector is shutting down; send this batch again later"


class BatchWriter:
    """Stores :class:`~argus.collector.ingest.Decoded` batches from any thread, in groups.

    Args:
        store: Where batches go.
        metrics: Counters updated per stored or duplicate batch.
        max_group: Most batches per group.
    """

    def __init__(self, store: Store, metrics: Metrics | None = None, *, max_group: int = MAX_GROUP) -> None:
        self.store = store
        self.metrics = metrics
        self.max_group = max_group
        self._queue: queue.SimpleQueue[tuple[ingest.Decoded, Future[pb.Ack]] | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="argus-writer", daemon=True)
        self._thread.start()

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
                _settle(item[1], StoreError(SHUTTING_DOWN))

    def _take_group(self) -> tuple[list[tuple[ingest.Decoded, Future[pb.Ack]]], bool]:
        first = self._queue.get()
        if first is None:
            return [], True
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
        done = False
        while not done:
            group, done = self._take_group()
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
                    self.store, [d for d, _ in group], self.metrics
                )
            except Exception as exc:  # a bug, not a store failure: fail the group, keep serving
                log.exception("storing a group of %d batches failed", len(group))
                outcomes = [StoreError(f"internal error: {exc}")] * len(group)
            for (_, future), outcome in zip(group, outcomes, strict=True):
                _settle(future, outcome)


def _settle(future: Future[pb.Ack], outcome: ingest.Outcome) -> None:
    """Give ``future`` its outcome, unless its waiter cancelled it meanwhile."""
    if not future.set_running_or_notify_cancel():
        return
    if isinstance(outcome, pb.Ack):
        future.set_result(outcome)
    else:
        future.set_exception(outcome)
