"""What the probe records from training threads: steps, phases, collectives, process groups.

The hooks (:mod:`argus.agent.torch_hooks`, :mod:`argus.agent.collectives`) call a
:class:`Recorder`; it only appends typed rows (:mod:`argus.agent.rows`) to bounded
:class:`~argus.agent.buffers.RowBuffer`\\ s, which the shipper empties. Nothing here may raise
into training or block it: a full buffer drops and counts.

Collectives are pending from their issue until their work's future completes (gloo: the
transfer ended; NCCL: the kernels were enqueued, so a GPU rank shows a pending collective only
while it blocks inside the issuing call); the oldest pending one goes out with every host
sample, so the peers of a hung rank name the collective it never issued. A point-to-point
work without a future (gloo's ``isend``/``irecv``) stays pending until the caller's ``wait()``
returns, and its row keeps when that wait began (``collectives.wait_ns``).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from functools import partial
from typing import Any

import torch.distributed as dist

from argus.agent.buffers import RowBuffer
from argus.agent.collectives import Correlator
from argus.agent.cupti import CollectiveJoin
from argus.agent.foreign_threads import adopt
from argus.agent.rows import CollectiveRow, RankEvent
from argus.agent.steps import StepTracker

__all__ = ["CAPACITY", "MAX_PENDING", "P2P_OPS", "Recorder"]

#: Rows each buffer holds between two shipments.
CAPACITY = {"steps": 4096, "phases": 16384, "collectives": 65536, "ranks": 1024, "host_samples": 256}
#: Collectives held as pending (issued, not complete) at most; more are dropped and counted.
MAX_PENDING = 65536
#: Point-to-point ops: their rows name the partner (``peer``) and count seq per partner.
P2P_OPS = frozenset({"send", "recv"})


class _Group:
    """What the recorder keeps per process group: its name, global ranks and sequence counters."""

    __slots__ = ("name", "p2p", "ranks", "seq")

    def __init__(self, name: str, ranks: tuple[int, ...]) -> None:
        self.name = name
        #: Global rank of each group rank.
        self.ranks = ranks
        self.seq = itertools.count()
        #: (op, peer global rank) -> seq counter of point-to-point transfers.
        self.p2p: dict[tuple[str, int], Any] = {}


class _Pending:
    """A collective issued and not yet complete (``__slots__``: one is made per collective)."""

    __slots__ = ("bytes", "issue_ns", "op", "overlapped", "peer", "process_group", "seq", "step")

    def __init__(
        self,
        step: int,
        process_group: str,
        seq: int,
        op: str,
        nbytes: int,
        issue_ns: int,
        peer: int,
        overlapped: bool,
    ) -> None:
        self.step, self.process_group, self.seq, self.op = step, process_group, seq, op
        self.bytes, self.issue_ns, self.peer, self.overlapped = nbytes, issue_ns, peer, overlapped

    def done(self, end_ns: int, wait_ns: int = 0) -> CollectiveRow:
        """The row of this collective completed at ``end_ns``, waited on from ``wait_ns`` (host times)."""
        return CollectiveRow(
            self.step,
            self.process_group,
            self.seq,
            self.op,
            self.bytes,
            self.issue_ns,
            self.issue_ns,
            end_ns - self.issue_ns,
            self.peer,
            int(self.overlapped),
            wait_ns if wait_ns > self.issue_ns else 0,
        )


def _global_ranks(pg: Any) -> tuple[int, ...]:
    """Global rank of each rank of ``pg`` (empty when torch cannot say)."""
    try:
        return tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:
        return ()


class Recorder:
    """One rank's recording state; implements :class:`argus.agent.collectives.CollectiveRecorder`.

    Args:
        attach_ns: When the probe attached (the first step starts here if nothing came before).

    Attributes:
        active: False stops recording (after fork, at shutdown, or switched off by a benchmark).
        buffers: Rows per table, emptied by the shipper.
        tracker: Steps and phases, fed by the torch hooks.
        correlate: Tags the GPU work of a c10d call during a CUPTI slice; None otherwise.
        join: Holds GPU collectives until their kernels give them device times; None on CPU.
    """

    def __init__(self, attach_ns: int) -> None:
        self.active = True
        self.buffers = {name: RowBuffer(cap) for name, cap in CAPACITY.items()}
        self.tracker = StepTracker(self.buffers["steps"], self.buffers["phases"], attach_ns)
        self.correlate: Correlator | None = None
        self.join: CollectiveJoin | None = None
        #: Weak keys: holding a process group would keep it (and gloo's threads) alive past the job's
        #: destroy_process_group, into interpreter finalization.
        self._pg_info: weakref.WeakKeyDictionary[Any, _Group] = weakref.WeakKeyDictionary()
        self._groups_seen: set[str] = set()
        self._ncollectives = 0
        #: Issued and not yet completed collectives, oldest first.
        self._pending: dict[int, _Pending] = {}
        self._keys = itertools.count(1)
        self._pending_dropped = 0
        #: id(work) -> (key, uid, finalizer) of point-to-point works without a future, closed when
        #: the caller's wait returns (see :meth:`work_waited`).
        self._awaiting: dict[int, tuple[int, int, weakref.finalize[Any, Any]]] = {}
        self._lock = threading.Lock()

    # --- collectives (training threads) ----------------------------------------------------------

    def collective(
        self,
        pg: Any,
        op: str,
        nbytes: int,
        issue_ns: int,
        work: Any,
        uid: int = 0,
        peer: int = -1,
        overlapped: bool = False,
    ) -> None:
        """See :class:`argus.agent.collectives.CollectiveRecorder`."""
        key = self.open_collective(pg, op, nbytes, issue_ns, peer, overlapped)
        if not key:
            return
        fut = None
        if work is not None:
            try:
                fut = work.get_future()
            except Exception:
                fut = None
        if fut is None:
            if op in P2P_OPS and work is not None and self._await_wait(work, key, uid):
                return
            self.close_collective(key, time.time_ns(), uid)
            return
        fut.add_done_callback(partial(self._work_done, key, uid))

    def _await_wait(self, work: Any, key: int, uid: int) -> bool:
        """Hold ``key`` until ``work`` is waited on (gloo's send/recv have no future); False: cannot."""
        wid = id(work)
        try:
            lost = weakref.finalize(work, self._work_lost, wid)
        except TypeError:
            return False
        lost.atexit = False
        self._awaiting[wid] = (key, uid, lost)
        return True

    def work_waited(self, work: Any, wait_ns: int = 0) -> None:
        """See :class:`argus.agent.collectives.CollectiveRecorder`."""
        entry = self._awaiting.pop(id(work), None)
        if entry is None:
            return
        key, uid, lost = entry
        lost.detach()
        self.close_collective(key, time.time_ns(), uid, wait_ns)

    def _work_lost(self, wid: int) -> None:
        """A held point-to-point work was freed without a wait: its end is unknown, drop its row."""
        entry = self._awaiting.pop(wid, None)
        if entry is not None and self._pending.pop(entry[0], None) is not None:
            self._pending_dropped += 1

    def _work_done(self, key: int, uid: int, _fut: Any) -> None:
        # On the thread that completed the work (gloo's worker): keep its Python state for the next.
        adopt()
        self.close_collective(key, time.time_ns(), uid)

    def open_collective(
        self, pg: Any, op: str, nbytes: int, issue_ns: int, peer: int = -1, overlapped: bool = False
    ) -> int:
        """Number a collective and hold it as pending until it completes; its key, 0 when not recorded.

        ``overlapped`` says the call returns at once while the rank goes on (a DDP bucket). A
        point-to-point ``send``/``recv`` names its partner by group rank in ``peer``; the row
        holds the partner's global rank and a seq counted per (direction, partner), apart from
        the group's collectives (``argus.schema`` ``collectives``), so the k-th send from A to
        B pairs with B's k-th receive from A. At most :data:`MAX_PENDING` collectives are
        pending; past that a new one is counted as dropped and not recorded.
        """
        if not self.active:
            return 0
        info = self._pg_info.get(pg)
        if info is None:
            info = self._pg_info.setdefault(pg, _Group(str(pg.group_name), _global_ranks(pg)))
            self.note_group(pg, info.name)
        self._ncollectives += 1
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            self._pending_dropped += 1
            return 0
        key = next(self._keys)
        if op in P2P_OPS:
            peer = info.ranks[peer] if 0 <= peer < len(info.ranks) else -1
            counter = info.p2p.get((op, peer))
            if counter is None:
                counter = info.p2p[(op, peer)] = itertools.count()
            seq = next(counter)
        else:
            peer, seq = -1, next(info.seq)
        pending[key] = _Pending(
            self.tracker.event_step(), info.name, seq, op, nbytes, issue_ns, peer, overlapped
        )
        return key

    def close_collective(self, key: int, end_ns: int, uid: int = 0, wait_ns: int = 0) -> None:
        """Store pending collective ``key`` as completed at ``end_ns`` (GPU ones wait for their kernels).

        ``wait_ns``: when the rank began waiting for it, if that was a later ``wait()`` (0: unknown).
        """
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        row = pending.done(end_ns, wait_ns)
        join = self.join
        if uid and join is not None:
            join.expect(uid, row)
        else:
            self.buffers["collectives"].append(row)

    def bucket_done(self, key: int, uid: int, fut: Any) -> Any:
        """``then`` callback of a recorded DDP bucket (:func:`argus.agent.collectives.recorded_allreduce`)."""
        self.close_collective(key, time.time_ns(), uid)
        return fut.value()[0]

    def oldest_pending(self) -> tuple[str, int, str, int]:
        """``(process_group, seq, op, issue_ns)`` of the oldest collective issued and not yet complete.

        ``("", -1, "", 0)`` when none is pending (see the module doc).
        """
        pending = self._pending.copy()  # one C call: safe against concurrent inserts and pops
        for p in pending.values():
            return p.process_group, p.seq, p.op, p.issue_ns
        return "", -1, "", 0

    def collective_count(self) -> int:
        return self._ncollectives

    # --- process groups and drops (shipper thread) -----------------------------------------------

    def scan_groups(self) -> None:
        """Note every process group torch knows that has no ``group`` row yet."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        names = dist.distributed_c10d._world.pg_names
        if len(names) == len(self._groups_seen):
            return
        for pg, name in list(names.items()):
            self.note_group(pg, str(name))

    def note_group(self, pg: Any, name: str) -> None:
        """Record a ``group`` row for process group ``pg`` the first time it is seen."""
        with self._lock:
            if name in self._groups_seen:
                return
            self._groups_seen.add(name)
        try:
            ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
            backend = str(dist.get_backend(pg))
        except Exception:
            return
        self.buffers["ranks"].append(RankEvent("group", time.time_ns(), 0, name, ranks, backend))

    def dropped(self) -> int:
        """Rows refused so far by full buffers and the pending bound (monotonic)."""
        return sum(b.dropped for b in self.buffers.values()) + self._pending_dropped
