"""Pending stack captures, passed from the store to node agents on their streams (docs/design.md §3, §6.12).

The analyzer writes capture requests into ``stack_requests`` (:mod:`argus.analyzer.stacks`);
collectors hold no state of their own about them, so any number of collectors behind one
address, apart from the analyzer, pass them on. A request is *pending* for the ranks of it
that have no ``stacks`` rows of its capture id yet, for :data:`HORIZON_S` after it was made.
:class:`PendingCaptures` reads them (one query per :data:`REFRESH_S` for every stream of this
collector, which never waits for it: :meth:`PendingCaptures.cached`), and each stream adds to
the ``Ack`` of a batch of a job the captures of that job it has not passed on that stream yet
(``Ack.stack_captures``). A node agent runs those of the ranks it serves, once per capture id
(:mod:`argus.agent.captures`). A store error keeps the previous list: ingest never fails for it.
Each read touches the ``stacks`` rows of the jobs with pending requests only, not the whole table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

from argus.errors import StoreError
from argus.proto import collector_pb2 as pb
from argus.store import Store
from argus.threads import start_daemon

__all__ = ["HORIZON_S", "REFRESH_S", "PendingCaptures"]

log = logging.getLogger(__name__)

#: Seconds between two reads of the pending requests.
REFRESH_S = 1.0
#: A request is pending for this long after it was made, seconds (then its ranks are gone or
#: their agents cannot sample them).
HORIZON_S = 120.0


class PendingCaptures:
    """The pending capture requests, per job, re-read at most every ``refresh_s``; thread-safe."""

    def __init__(self, store: Store, refresh_s: float = REFRESH_S, horizon_s: float = HORIZON_S) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.horizon_ns = int(horizon_s * 1e9)
        self._lock = threading.Lock()
        self._by_job: dict[str, list[pb.StackCapture]] = {}
        self._read_at = float("-inf")
        self._reading = False

    def for_job(self, job_id: str) -> list[pb.StackCapture]:
        """The pending captures of ``job_id`` (a read of the store, here, when the last is stale).

        One caller reads the store; the others meanwhile get the list read before, at once (a
        busy store must not hold up every stream's acks).
        """
        if self._claim():
            self._refresh()
        return self._by_job.get(job_id, [])

    def cached(self, job_id: str) -> list[pb.StackCapture]:
        """The pending captures of ``job_id`` as last read, never waiting: when that read is
        stale, a new one starts in a thread of its own (for callers on an event loop)."""
        if self._claim():
            start_daemon(self._refresh, "argus-captures")
        return self._by_job.get(job_id, [])

    def _claim(self) -> bool:
        """True when the last read is stale and no read is under way: the caller reads."""
        with self._lock:
            stale = not self._reading and time.monotonic() - self._read_at >= self.refresh_s
            if stale:
                self._reading, self._read_at = True, time.monotonic()
            return stale

    def _refresh(self) -> None:
        by_job = self._by_job
        try:
            by_job = self._read()
        except StoreError as exc:
            log.warning("cannot read pending stack captures: %s", exc)
        finally:
            with self._lock:
                self._by_job, self._reading = by_job, False

    def _read(self) -> dict[str, list[pb.StackCapture]]:
        since = time.time_ns() - self.horizon_ns
        requests = self.store.query(
            "SELECT job_id, request_id, ranks, duration_ms, blocking FROM stack_requests "
            "WHERE requested_ns > {since:Int64}",
            {"since": since},
        ).to_pylist()
        if not requests:
            return {}
        # Only the pending requests' jobs' rows of the stacks table (its key starts with job_id),
        # from a horizon before the first request on (agents' clocks may lag): not the whole table.
        answered = self.store.query(
            "SELECT DISTINCT capture_id, rank FROM stacks WHERE job_id IN {jobs:Array(String)} "
            "AND time_ns >= {since:Int64} AND capture_id IN {ids:Array(String)}",
            {
                "jobs": sorted({str(r["job_id"]) for r in requests}),
                "ids": sorted({str(r["request_id"]) for r in requests}),
                "since": since - self.horizon_ns,
            },
        ).to_pylist()
        done = {(str(r["capture_id"]), int(r["rank"])) for r in answered}
        out: dict[str, list[pb.StackCapture]] = defaultdict(list)
        for r in requests:
            cid = str(r["request_id"])
            ranks = [int(x) for x in r["ranks"] if (cid, int(x)) not in done]
            if ranks:
                out[str(r["job_id"])].append(
                    pb.StackCapture(
                        capture_id=cid,
                        job_id=str(r["job_id"]),
                        ranks=ranks,
                        duration_ms=int(r["duration_ms"]),
                        blocking=bool(r["blocking"]),
                    )
                )
        return dict(out)
