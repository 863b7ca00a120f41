"""The node agent's upload path: coalesce rows, spool, stream batches over gRPC, handle acks.

- :meth:`Uploader.add` queues Arrow rows per (job, table, clock offset);
  every ``flush_s`` (held while the collector is behind: :func:`flush_due`) they
  become ``argus.v1.Batch``\\ es of at most
  ``max_message_bytes`` (split by rows), each with the next sequence number of
  this agent; those of one flush travel as one message (``Batch.members``, up to
  ``max_message_bytes``, under its first member's seq), answered by one ack: the
  collector's cost is mostly per message (docs/design.md §3). Each message goes to
  the :class:`~argus.agent.spool.Spool` *before* being sent.
  :meth:`Uploader.add` returns the flush generation of the rows; once they are
  spooled, ``on_spooled(generation)`` is called (the node agent acknowledges
  the probes' frames then, so a killed agent loses nothing it acknowledged).
- One :class:`_Sender` per agent id streams its spooled batches in sequence
  order over ``argus.v1.Collector/Stream`` with a bounded number in flight.
  STORED and DUPLICATE acks delete the batch; REJECTED deletes it too (it
  would be rejected again), logs the reason and counts the rows as dropped.
- When the stream breaks (collector down, restarted, network), the sender
  reconnects with exponential back-off and resends every batch still spooled;
  the collector deduplicates by (agent id, seq). ``RESOURCE_EXHAUSTED`` halves
  the size limit and re-splits the spooled messages above it, a flush into its
  batches, a batch into parts: each part is a new
  batch (next seq) carrying ``Batch.parent``, the identity its rows had when first
  spooled and its part index (:func:`split_parts`), so the collector stores each
  row once even when the batch was stored whole before its ack was lost. A collector at its
  stream limit refuses the stream with ``UNAVAILABLE`` (or gRPC's ``RESOURCE_EXHAUSTED``
  "Concurrent RPC limit exceeded!"): that is no size problem, so nothing is re-split; the
  sender backs off and reconnects like after any other broken stream.
- A poison batch (the collector ends the stream on it the same way
  :data:`POISON_TRIES` times in a row) is set aside, logged and counted as lost
  rows, so the batches behind it are stored.
- A flush the collector refuses whole, with no verdict per member (an older collector
  reads it as a batch of no job and no table), is spooled again as its batches, one
  message each, and so is every later flush.
- Batches left in the spool by an earlier agent process are replayed on their
  own stream, under their original agent id.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pyarrow as pa

from argus.agent.clock import ClockEstimate, estimate_offset
from argus.agent.protocol import ipc_bytes, table_code
from argus.agent.spool import Spool
from argus.config import MAX_MESSAGE_BYTES
from argus.proto import collector_pb2, collector_pb2_grpc

__all__ = [
    "HOLD_FLUSHES",
    "POISON_TRIES",
    "UploadStats",
    "Uploader",
    "flush_due",
    "split_parts",
    "split_rows",
]

log = logging.getLogger(__name__)

#: Bytes kept free in a message for the Batch fields around the Arrow payload.
_HEADROOM = 64 * 1024
_STREAM_METHOD = "/argus.v1.Collector/Stream"
#: Failures in a row, the same way, after which the oldest batch in flight is set aside (poison).
POISON_TRIES = 5
#: Stream endings that blame the batch being stored (not the network, size, or credentials).
_POISON_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
    }
)
#: The details of gRPC's RESOURCE_EXHAUSTED for a server's concurrent-call limit (no size problem).
_CALL_LIMIT = "Concurrent RPC limit exceeded"
#: At most one warning about an unwritable spool per this many seconds.
_WARN_EVERY_S = 30.0
#: Longest a flush is held for the collector's acknowledgements, in flush periods (:func:`flush_due`).
HOLD_FLUSHES = 5


@dataclass
class UploadStats:
    """Counters of one uploader (monotonic)."""

    batches_spooled: int = 0
    batches_stored: int = 0
    batches_duplicate: int = 0
    batches_rejected: int = 0
    rows_stored: int = 0
    rows_rejected: int = 0
    #: Batches that failed :data:`POISON_TRIES` times the same way, moved out of the spool.
    batches_set_aside: int = 0
    rows_set_aside: int = 0
    reconnects: int = 0
    #: Flushes that stopped because the spool could not be written (their rows were kept).
    spool_failures: int = 0
    last_error: str = ""
    rejections: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    #: The latest batches' ack latencies, ms: from a batch's send on its stream to its ack.
    ack_ms: deque[float] = field(default_factory=lambda: deque(maxlen=65536))
    #: Flushes held past ``flush_s`` for the collector's acknowledgements (:func:`flush_due`).
    flushes_held: int = 0


def flush_due(waited_s: float, unacked: int, flush_s: float, hold_flushes: int = HOLD_FLUSHES) -> bool:
    """Whether an agent's queued rows become batches now, ``waited_s`` after its last flush.

    ``flush_s`` after the last flush once the collector has acknowledged every batch sent
    before (``unacked == 0``), and ``hold_flushes * flush_s`` after it at the latest. This is
    Nagle's rule (RFC 896: no new small segment while earlier data is unacknowledged) applied
    to flushes: a collector that answers within ``flush_s`` sees a flush every ``flush_s``; one
    that falls behind gets fewer, larger batches from every agent, each as soon as it caught
    up. Its cost is mostly per batch (the gRPC message, the Arrow IPC read, the ack, the
    dedup key), not per row, so larger batches let it catch up instead of queueing more:
    1,250 agents flushing four tables a second offer one server 5,000 batches a second
    (``bench/scale.py``). The rows held meanwhile stay unacknowledged to the probes, which keep
    their copy (32 MiB each), so a held flush loses nothing when the agent dies.

    Args:
        waited_s: Seconds since the last flush.
        unacked: Batches of this agent spooled or sent and not yet acknowledged.
        flush_s: The flush period, s.
        hold_flushes: Longest hold, in flush periods.
    """
    return waited_s >= hold_flushes * flush_s or (waited_s >= flush_s and unacked == 0)


def split_rows(data: pa.Table, max_bytes: int) -> list[pa.Table]:
    """Slices of ``data`` whose Arrow IPC stream is at most ``max_bytes`` each (halving by rows).

    A single row larger than ``max_bytes`` is returned alone (the collector will refuse it).
    """
    if data.num_rows <= 1 or data.nbytes <= max_bytes // 2:
        return [data]
    if len(ipc_bytes(data)) <= max_bytes:
        return [data]
    half = data.num_rows // 2
    return split_rows(data.slice(0, half), max_bytes) + split_rows(data.slice(half), max_bytes)


def split_parts(data: pa.Table, max_bytes: int, part: int = 1) -> list[tuple[int, pa.Table]]:
    """Like :func:`split_rows`, with each slice's part index in heap order under ``part``.

    The whole of ``data`` is ``part``; its halves are ``2 * part`` and ``2 * part + 1``, and so
    on down: two slices share rows only when one index is an ancestor of the other, which is
    how the collector deduplicates parts (:mod:`argus.collector.ingest`).

    Returns:
        ``(part index, rows)`` in row order.
    """
    if data.num_rows <= 1 or data.nbytes <= max_bytes // 2 or len(ipc_bytes(data)) <= max_bytes:
        return [(part, data)]
    half = data.num_rows // 2
    return split_parts(data.slice(0, half), max_bytes, 2 * part) + split_parts(
        data.slice(half), max_bytes, 2 * part + 1
    )


class Uploader:
    """Streams this agent's batches (and leftover spooled ones) to a collector.

    Args:
        target: Collector address ``host:port``.
        spool: The spool (shared with nothing else).
        agent_id: Unique per agent process (host, pid and start time).
        token: Bearer token sent as ``authorization`` metadata.
        tls_cert: PEM certificate of the collector to trust (TLS); None for plaintext.
        flush_s: Seconds between turning queued rows into batches.
        max_inflight: Batches sent but not yet acknowledged, per stream.
        max_message_bytes: Largest message sent; larger batches are split.
    """

    def __init__(
        self,
        target: str,
        spool: Spool,
        agent_id: str,
        *,
        token: str | None = None,
        tls_cert: str | None = None,
        flush_s: float = 1.0,
        max_inflight: int = 64,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self.spool = spool
        self.agent_id = agent_id
        self.flush_s = flush_s
        self.max_inflight = max_inflight
        self.max_message_bytes = max_message_bytes
        self.stats = UploadStats()
        self._metadata: tuple[tuple[str, str | bytes], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES + _HEADROOM),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES + _HEADROOM),
        ]
        if tls_cert:
            creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_cert).read_bytes())
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = collector_pb2_grpc.CollectorStub(self._channel)
        #: Set when the channel failed to reach the collector, cleared when it is connected again:
        #: a drain then has nothing to wait for.
        self._unreachable = threading.Event()
        self._channel.subscribe(self._on_connectivity, try_to_connect=False)
        self._stream = self._channel.stream_stream(
            _STREAM_METHOD,
            request_serializer=lambda b: b,
            response_deserializer=collector_pb2.Ack.FromString,
        )
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._queued: dict[tuple[str, str, int], list[pa.Table]] = {}
        self._generation = 0
        #: Called with a generation once every row added in it (and before) is spooled.
        self.on_spooled: Callable[[int], None] | None = None
        #: Called (in a sender's thread) with every ``Ack`` that carries control messages.
        self.on_control: Callable[[collector_pb2.Ack], None] | None = None
        self._seq = itertools.count(1)
        #: Whether a flush's batches travel as one message (``Batch.members``); cleared when the
        #: collector refuses one whole (an older collector: :meth:`_Sender._unknown_flush`).
        self.flushes = True
        self._dropped_unreported = 0
        self._spool_warn_after = 0.0
        self._stop = threading.Event()
        #: Wakes the flush thread: this agent's batches are all acknowledged, or it stops.
        self._flush_wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._senders: dict[str, _Sender] = {}

    # --- public ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the flush thread and one sender per agent id in the spool (this one included)."""
        self._flusher = threading.Thread(target=self._flush_loop, name="argus-flush", daemon=True)
        self._flusher.start()
        for agent_id in {self.agent_id, *self.spool.agent_ids()}:
            self._sender(agent_id)

    def add(self, job_id: str, table: str, data: pa.Table, clock_offset_ns: int = 0) -> int:
        """Queue rows of ``table`` (wire schema, times already shifted by ``clock_offset_ns``).

        Returns:
            The flush generation the rows belong to (see ``on_spooled``).
        """
        with self._lock:
            if data.num_rows:
                self._queued.setdefault((job_id, table, clock_offset_ns), []).append(data)
            return self._generation

    @property
    def generation(self) -> int:
        """The generation rows added now would belong to."""
        with self._lock:
            return self._generation

    def count_dropped(self, rows: int) -> None:
        """Add rows lost upstream (probes, windows) to the next batch's ``dropped_events``."""
        if rows > 0:
            with self._lock:
                self._dropped_unreported += rows

    def flush(self) -> int:
        """Turn queued rows into spooled batches now; returns how many batches were made.

        ``on_spooled`` is called only when every row queued so far is spooled. When the
        spool cannot be written (``OSError``: disk full, read-only), the rows not spooled
        go back to the front of the queue, nothing more is acknowledged, and a warning is
        logged (at most every 30 s); a later flush spools them first. The memory this
        holds is bounded by the probes: they send no more than their bound on
        unacknowledged bytes.
        """
        with self._flush_lock:
            with self._lock:
                queued, self._queued = self._queued, {}
                generation = self._generation
                self._generation += 1
            made: list[_Made] = []
            groups = list(queued.items())
            for i, (key, parts) in enumerate(groups):
                try:
                    data = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
                    chunks = split_rows(data, self.max_message_bytes - _HEADROOM)
                    made += [_Made(key, chunk, self._member(*key[:2], chunk, key[2])) for chunk in chunks]
                except BaseException as exc:  # nothing spooled yet: every row goes back
                    self._spool_failed(exc, [(m.key, [m.data]) for m in made] + groups[i:])
                    return 0
            spooled = 0
            for pack in _packs(made, self.max_message_bytes - _HEADROOM if self.flushes else 0):
                try:
                    self._spool_message([m.batch for m in pack], sum(m.data.num_rows for m in pack))
                except BaseException as exc:
                    self._spool_failed(exc, [(m.key, [m.data]) for m in made[spooled:]])
                    return spooled
                spooled += len(pack)
            callback = self.on_spooled
            if callback is not None:
                callback(generation)
        return spooled

    def _spool_failed(
        self, exc: BaseException, rest: list[tuple[tuple[str, str, int], list[pa.Table]]]
    ) -> None:
        """A flush could not spool ``rest`` (``exc``): nothing of its generation is acknowledged, and
        what is not spooled goes back to the front of the queue, to be spooled (then acknowledged) by
        a later flush. Raises ``exc`` again unless it is an ``OSError`` (the spool's)."""
        self._requeue(rest)
        self.stats.spool_failures += 1
        self.stats.last_error = f"spool: {exc}"
        if not isinstance(exc, OSError):
            raise exc
        now = time.monotonic()
        if now >= self._spool_warn_after:
            self._spool_warn_after = now + _WARN_EVERY_S
            log.warning(
                "argus agent: cannot write the spool %s (%s); %d rows kept in memory, "
                "their frames unacknowledged until the spool takes them",
                self.spool.root,
                exc,
                sum(t.num_rows for _, rest_parts in rest for t in rest_parts),
            )

    def _requeue(self, groups: list[tuple[tuple[str, str, int], list[pa.Table]]]) -> None:
        """Put rows that could not be spooled back in front of the queue (same groups, same order)."""
        with self._lock:
            newer, self._queued = self._queued, {}
            for key, parts in groups:
                if parts:
                    self._queued.setdefault(key, []).extend(parts)
            for key, parts in newer.items():
                self._queued.setdefault(key, []).extend(parts)

    def pending_batches(self) -> int:
        """Batches spooled and not yet acknowledged (all agent ids)."""
        return len(self.spool)

    def drain(self, timeout_s: float) -> bool:
        """Flush and wait until the spool is empty or ``timeout_s`` passes, or at once when the
        channel's last attempt to reach the collector failed (nothing would drain); True when empty."""
        self.flush()
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline and not self._unreachable.is_set():
            time.sleep(0.05)
        return len(self.spool) == 0

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        """The channel's state changed (a gRPC thread): note whether the collector is out of reach."""
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            self._unreachable.set()
        elif state is grpc.ChannelConnectivity.READY:
            self._unreachable.clear()

    def close(self, drain_s: float = 5.0) -> None:
        """Drain for at most ``drain_s``, stop the threads; unsent batches stay spooled."""
        with contextlib.suppress(Exception):
            self.drain(drain_s)
        self._stop.set()
        self._flush_wake.set()
        for sender in list(self._senders.values()):
            sender.stop()
        if self._flusher is not None:
            self._flusher.join(timeout=2)
        for sender in list(self._senders.values()):
            sender.join(2)
        self._channel.close()
        left = len(self.spool)
        if left:
            log.warning("argus agent: %d batches stay in the spool for the next agent", left)

    def clock(self, samples: int = 8, timeout_s: float = 2.0) -> ClockEstimate:
        """One NTP-style offset estimate through the ``Clock`` RPC.

        Raises:
            grpc.RpcError: the collector did not answer.
        """

        def ask(t0: int) -> int:
            reply = self._stub.Clock(
                collector_pb2.ClockRequest(agent_send_ns=t0), timeout=timeout_s, metadata=self._metadata
            )
            return int(reply.server_ns)

        return estimate_offset(ask, samples)

    # --- internals -------------------------------------------------------------------------------

    def _sender(self, agent_id: str) -> _Sender:
        sender = self._senders.get(agent_id)
        if sender is None:
            sender = _Sender(self, agent_id, own=agent_id == self.agent_id)
            self._senders[agent_id] = sender
            sender.start()
        return sender

    def _member(
        self,
        job_id: str,
        table: str,
        data: pa.Table,
        offset: int,
        parent: collector_pb2.Batch.Parent | None = None,
    ) -> collector_pb2.Batch:
        """One batch of ``data`` (one table's rows) under this agent's next sequence number."""
        return collector_pb2.Batch(
            agent_id=self.agent_id,
            seq=next(self._seq),
            job_id=job_id,
            table=table_code(table),
            arrow_ipc=ipc_bytes(data),
            clock_offset_ns=offset,
            parent=parent,
        )

    def _spool_message(self, members: list[collector_pb2.Batch], rows: int) -> int:
        """Spool ``members`` (this agent's batches, ``rows`` rows in all) as one message: the batch
        alone, or a flush of several (``Batch.members``) under its first member's seq. The events
        lost since the last message go with the first member. Returns the message's seq.

        Raises:
            OSError: the spool could not be written (the lost events are reported later).
        """
        agent_id, first = self.agent_id, members[0]
        with self._lock:
            dropped, self._dropped_unreported = self._dropped_unreported, 0
        first.dropped_events = dropped
        message = (
            first
            if len(members) == 1
            else collector_pb2.Batch(agent_id=agent_id, seq=first.seq, members=members)
        )
        try:
            evicted = self.spool.put(agent_id, first.seq, rows, message.SerializeToString())
        except BaseException:
            self.count_dropped(dropped)  # reported with the next batch that is spooled
            raise
        self.stats.batches_spooled += 1
        self.count_dropped(sum(e.rows for e in evicted))
        sender = self._senders.get(agent_id)
        if sender is not None:
            sender.notify(first.seq)
        return first.seq

    def _flush_loop(self) -> None:
        """Flush when :func:`flush_due` says so, asleep until it may: until a flush period has passed,
        then, while batches are unacknowledged, until the hold ends or the sender wakes it with every
        batch acknowledged. (It polled ten times a period: an idle agent woke 10 times a second.)"""
        last, held = time.monotonic(), False
        while True:
            self._flush_wake.clear()  # before reading the state: a wake-up after this is not lost
            if self._stop.is_set():
                return
            waited = time.monotonic() - last
            sender = self._senders.get(self.agent_id)
            if not flush_due(waited, sender.unacked() if sender is not None else 0, self.flush_s):
                held = held or waited >= self.flush_s
                until_s = self.flush_s if waited < self.flush_s else HOLD_FLUSHES * self.flush_s
                self._flush_wake.wait(max(until_s - waited, 0.0))
                continue
            self.stats.flushes_held += held
            last, held = time.monotonic(), False
            try:
                self.flush()
            except Exception:
                log.warning("argus agent: making batches failed", exc_info=True)

    def _resplit(self, agent_id: str, limit: int) -> None:
        """Re-split spooled messages of ``agent_id`` bigger than ``limit`` (after RESOURCE_EXHAUSTED):
        a flush into its members, each a batch of its own, and a batch into parts (:meth:`_split`)."""
        for seq in self.spool.seqs(agent_id):
            raw = self.spool.read(agent_id, seq)
            if raw is not None and len(raw) > limit:
                self._split(agent_id, seq, collector_pb2.Batch.FromString(raw), limit)

    def _split(self, agent_id: str, seq: int, message: collector_pb2.Batch, limit: int) -> bool:
        """Spool message ``seq`` of ``agent_id`` again as batches of at most ``limit`` bytes, then
        forget it; True when it was.

        Each batch (a flush's members one by one) goes as the parts :func:`split_parts` makes, each
        a new batch (next seq) whose ``parent`` is the identity its rows were first spooled with,
        and its part index (the whole batch is part 1): so rows stored before under that identity,
        whole or as another part, are duplicates (docs/design.md §3). A spool that cannot take the
        parts keeps the message whole."""
        parts: list[int] = []
        try:
            for batch in message.members or [message]:
                data = pa.ipc.open_stream(batch.arrow_ipc).read_all()
                name = collector_pb2.Table.Name(batch.table).lower()
                # Its rows keep the identity they were first spooled with: the part of the parent.
                if batch.HasField("parent"):
                    origin = (batch.parent.agent_id, batch.parent.seq, max(batch.parent.part, 1))
                else:
                    origin = (batch.agent_id, batch.seq, 1)
                for index, chunk in split_parts(data, limit - _HEADROOM, origin[2]):
                    parent = collector_pb2.Batch.Parent(agent_id=origin[0], seq=origin[1], part=index)
                    member = self._member(batch.job_id, name, chunk, batch.clock_offset_ns, parent)
                    parts.append(self._spool_message([member], chunk.num_rows))
        except OSError as exc:  # the spool is full or read-only: keep the message whole
            for part in parts:
                self.spool.remove(self.agent_id, part)
            log.warning("argus agent: cannot re-split batch %s:%d (%s); it stays whole", agent_id, seq, exc)
            return False
        self.spool.remove(agent_id, seq)
        # Reported again, with the next batch spooled.
        self.count_dropped(sum(b.dropped_events for b in message.members or [message]))
        return True


@dataclass
class _Made:
    """One batch a flush made: the queue it came from (job, table, clock offset), its rows and itself."""

    key: tuple[str, str, int]
    data: pa.Table
    batch: collector_pb2.Batch


def _packs(made: list[_Made], max_bytes: int) -> Iterator[list[_Made]]:
    """``made`` in order, as the messages to spool: runs of batches whose payloads add up to at most
    ``max_bytes`` (a larger batch alone; ``max_bytes`` 0: each alone)."""
    pack: list[_Made] = []
    size = 0
    for m in made:
        nbytes = len(m.batch.arrow_ipc)
        if pack and size + nbytes > max_bytes:
            yield pack
            pack, size = [], 0
        pack.append(m)
        size += nbytes
    if pack:
        yield pack


class _Sender:
    """Streams one agent id's spooled batches; a leftover id's sender ends when its spool is empty."""

    def __init__(self, up: Uploader, agent_id: str, own: bool) -> None:
        self.up = up
        self.agent_id = agent_id
        self.own = own
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._inflight: dict[int, float] = {}
        self._stopping = False
        self._generation = 0
        #: The oldest batch's run of identical failures: seq -> (code and message, tries).
        self._failures: dict[int, tuple[str, int]] = {}
        self._thread = threading.Thread(target=self._run, name=f"argus-send-{agent_id[:24]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def notify(self, seq: int) -> None:
        with self._cond:
            self._queue.append(seq)
            self._cond.notify_all()

    def unacked(self) -> int:
        """Batches waiting to be sent or for their acknowledgement."""
        with self._cond:
            return len(self._queue) + len(self._inflight)

    def _requests(self, generation: int) -> Iterator[bytes]:
        """The request stream of one call (consumed by a gRPC thread); ends when the call is replaced."""
        while True:
            with self._cond:
                while True:
                    if self._stopping or self._generation != generation:
                        return
                    if self._queue and len(self._inflight) < self.up.max_inflight:
                        seq = self._queue.popleft()
                        if seq in self._inflight:
                            continue
                        break
                    self._cond.wait(0.25)
                self._inflight[seq] = time.monotonic()
            data = self.up.spool.read(self.agent_id, seq)
            if data is None:
                with self._cond:
                    self._inflight.pop(seq, None)
                continue
            yield data

    def _run(self) -> None:
        backoff = 0.2
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._generation += 1
                generation = self._generation
                self._inflight.clear()
                self._queue = deque(self.up.spool.seqs(self.agent_id))
            if not self.own and not self._queue:
                self.up.spool.prune_empty()
                return
            got_ack = False
            try:
                call = self.up._stream(self._requests(generation), metadata=self.up._metadata)
                for ack in call:
                    got_ack = True
                    self._on_ack(ack)
                    if not self.own and not len(self._queue) and not self._inflight:
                        call.cancel()  # type: ignore[no-untyped-call]  # grpc's stubs leave it bare
                        break
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                self._on_error(code, exc)
                self._blame_oldest(code, exc)
            finally:
                with self._cond:
                    self._generation += 1
                    self._cond.notify_all()
            if got_ack:
                backoff = 0.2
            with self._cond:
                if self._stopping:
                    return
                self._cond.wait(backoff)
            backoff = min(backoff * 2, 5.0)
            self.up.stats.reconnects += 1

    def _on_error(self, code: grpc.StatusCode | None, exc: grpc.RpcError) -> None:
        details = exc.details() if hasattr(exc, "details") else str(exc)
        self.up.stats.last_error = f"{code}: {details}"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _CALL_LIMIT in str(details):
            # gRPC's own limit on concurrent calls (the server's backstop): busy, not too large.
            log.info("argus agent: collector %s refused the stream (%s); retrying", self.up.target, details)
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            self.up.max_message_bytes = max(self.up.max_message_bytes // 2, 64 * 1024)
            log.warning(
                "argus agent: collector refused a message size; splitting batches to %d bytes",
                self.up.max_message_bytes,
            )
            self.up._resplit(self.agent_id, self.up.max_message_bytes)
        elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            log.error(
                "argus agent: the collector refused our credentials (%s); batches stay spooled", details
            )
        elif code != grpc.StatusCode.CANCELLED:
            log.info("argus agent: collector stream to %s ended (%s: %s)", self.up.target, code, details)

    def _blame_oldest(self, code: grpc.StatusCode | None, exc: grpc.RpcError) -> None:
        """Count a failure of the collector against the oldest batch unacknowledged when it came.

        The collector answers batches in order, so a stream it ends while storing a batch
        (``INTERNAL``, ``UNKNOWN``, …: not a network, size or credentials problem) ended on the
        oldest one in flight. After :data:`POISON_TRIES` such failures in a row with the same
        code and message, that batch is set aside (:meth:`Spool.set_aside`), logged, counted in
        ``stats.batches_set_aside``/``rows_set_aside`` and as dropped rows, and the batches behind
        it go on.
        """
        with self._cond:
            seq = min(self._inflight) if self._inflight else None
        if seq is None or code not in _POISON_CODES:
            return
        how = f"{code.name}: {exc.details() if hasattr(exc, 'details') else exc}"
        last = self._failures.get(seq)
        tries = last[1] + 1 if last is not None and last[0] == how else 1
        self._failures = {seq: (how, tries)}  # only the oldest batch's run of failures counts
        if tries < POISON_TRIES:
            return
        del self._failures[seq]
        entry = self.up.spool.set_aside(self.agent_id, seq)
        rows = entry.rows if entry is not None else 0
        stats = self.up.stats
        stats.batches_set_aside += 1
        stats.rows_set_aside += rows
        stats.rejections.append(f"seq {seq}: set aside after {tries} tries: {how}")
        self.up.count_dropped(rows)
        log.error(
            "argus agent: batch %s:%d (%d rows) failed %d times the same way (%s); set aside in %s, "
            "its rows counted as lost",
            self.agent_id,
            seq,
            rows,
            tries,
            how,
            entry.path if entry is not None else "-",
        )

    def _unknown_flush(self, ack: collector_pb2.Ack) -> bool:
        """Whether ``ack`` refuses a flush as a whole, with no verdict per member: a collector that does
        not know flushes reads one as a batch of no job and no table. Then the flush goes again as its
        batches, one message each (:meth:`Uploader._split`), each refused or stored on its own, and
        so does every later flush of this agent."""
        if ack.members:
            return False
        raw = self.up.spool.read(self.agent_id, ack.seq)
        message = collector_pb2.Batch.FromString(raw) if raw is not None else None
        if message is None or not message.members or message.table != collector_pb2.TABLE_UNSPECIFIED:
            return False
        if self.up.flushes:
            log.info(
                "argus agent: collector %s takes no flushes; sending one batch a message", self.up.target
            )
        self.up.flushes = False
        return self.up._split(self.agent_id, ack.seq, message, self.up.max_message_bytes)

    def _on_ack(self, ack: collector_pb2.Ack) -> None:
        stats = self.up.stats
        with self._cond:
            sent = self._inflight.pop(ack.seq, None)
            self._cond.notify_all()
            drained = self.own and not self._queue and not self._inflight
        if sent is not None:
            stats.ack_ms.append((time.monotonic() - sent) * 1e3)
        self._failures.pop(ack.seq, None)
        control = self.up.on_control
        if control is not None and ack.stack_captures:
            try:
                control(ack)
            except Exception:
                log.warning("argus agent: a control message failed", exc_info=True)
        if ack.status == collector_pb2.Ack.STORED:
            stats.batches_stored += 1
            stats.rows_stored += ack.rows
            self.up.spool.remove(self.agent_id, ack.seq)
        elif ack.status == collector_pb2.Ack.DUPLICATE:
            stats.batches_duplicate += 1
            self.up.spool.remove(self.agent_id, ack.seq)
        elif not self._unknown_flush(ack):
            entry = self.up.spool.remove(self.agent_id, ack.seq)
            # A flush's members were answered one by one: the rows its ack does not count were refused.
            rows = (entry.rows if entry is not None else 0) - (ack.rows if ack.members else 0)
            stats.batches_rejected += 1
            stats.rows_rejected += rows
            refused = [a for a in ack.members if a.status == collector_pb2.Ack.REJECTED] or [ack]
            reason = "; ".join(f"seq {a.seq}: {a.code or 'REJECTED'}: {a.message}" for a in refused)
            stats.rejections.append(reason)
            log.warning("argus agent: collector rejected a batch (%d rows): %s", rows, reason)
            self.up.count_dropped(rows)
        if drained:
            # A flush held for these acknowledgements may go now (after the rows rejected are
            # counted: the next batch reports them).
            self.up._flush_wake.set()
