"""The ``argus.v1.Collector`` gRPC service: a thin servicer over :mod:`argus.collector.ingest`.

The servicer only moves messages: each ``Batch`` goes to :func:`ingest.decode` and the
:class:`BatchWriter`, and each outcome becomes one ``Ack``. A node agent's flush (``Batch.members``,
:func:`ingest.flush_members`) is one message: each member goes the same way, and the flush gets one
``Ack`` once every member is settled (1,250 agents sent about 5,000 messages a second, one per table,
each read, parsed and answered by this loop). It runs on gRPC's asyncio server
(``grpc.aio``) in one event-loop thread of its own: every stream is a coroutine, not a thread.
With one thread per stream (and a reader thread each), 1,250 node agents meant 2,500 threads
handing every batch from one to the next under the GIL: the server stored ~1,250 batches a
second on 1.3 cores (``bench/scale.py``, 400 agents), a few times its decode and store cost.
Small batches are decoded on the loop (~0.1 ms each, less than a hand-off to a thread);
a large one in a thread of :data:`DECODE_THREADS` (pyarrow releases the GIL), so the loop keeps
serving the other streams meanwhile. Large is what a batch costs to hold decoded (its payload plus
what it declares decoded, :func:`~argus.collector.decoded_budget.batch_cost`), not its payload: a
3 kB ZSTD batch that decodes to 32 MiB held the loop, and every stream's acks, for 10-400 ms.
Its decompressed buffers come from :func:`argus.memory.decoding_pool`, which gives their pages
back when they are freed. A large batch's values are checked there too
(:func:`_decoded_and_checked`), so one that breaks a
row rule is refused at once, its decoded-bytes charge given back, not held until the writer's next
group (groups start at most every half second) with every stream's batches queued behind it.

Errors of :mod:`argus.errors` map to gRPC status codes in one place, :data:`GRPC_CODES`:

- ``InvalidBatch`` → a REJECTED ``Ack`` with ``INVALID_ARGUMENT``; the stream stays open.
- ``StoreError`` → the stream ends with ``UNAVAILABLE`` and the batch is *not*
  acknowledged, so the agent keeps it in its spool and sends it again later.
- a missing or wrong bearer token → the call ends with ``UNAUTHENTICATED`` before
  any batch is read.
- each ``Ack`` carries the pending stack captures of the batch's job not yet passed on that
  stream (:mod:`argus.collector.captures`).
- a message over :data:`argus.config.MAX_MESSAGE_BYTES` → gRPC itself ends the
  stream with ``RESOURCE_EXHAUSTED``; the server keeps serving other streams.
- every stream's batches together hold at most ``max_decoded_bytes`` (``argus server
  --max-decoded-bytes``) from read to written, their payload plus what they declare decoded;
  past it a stream waits its turn (:mod:`argus.collector.decoded_budget`): backpressure.
- a stream past ``max_streams`` open ones (``argus server --max-streams``) → ``UNAVAILABLE`` at
  once, before any batch is read, with a message naming the limit: the agent keeps its batches
  spooled and reconnects with back-off (nothing to do with size, so it never re-splits). gRPC's
  own ``maximum_concurrent_rpcs`` stays a little above (Clock calls, refusals) as a backstop,
  answering ``RESOURCE_EXHAUSTED`` "Concurrent RPC limit exceeded!", which the agent also takes
  for a refusal.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import grpc.aio

from argus.collector import ingest
from argus.collector.captures import PendingCaptures
from argus.collector.decoded_budget import DEFAULT_MAX_DECODED_BYTES, DecodedBudget, batch_cost
from argus.collector.writer import SHUTTING_DOWN, BatchWriter
from argus.config import DEFAULT_MAX_STREAMS, MAX_MESSAGE_BYTES, ServerConfig
from argus.errors import (
    ArgusError,
    ConfigError,
    InvalidBatch,
    NotFound,
    StoreError,
    Unauthenticated,
)
from argus.ipc_size import Scanned, scan
from argus.memory import decoding_pool
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.rowrules import check_values
from argus.store import Store
from argus.threads import start_daemon

__all__ = [
    "GRPC_CODES",
    "STREAM_LIMIT",
    "CollectorServer",
    "CollectorServicer",
    "grpc_code",
    "start_collector",
]

log = logging.getLogger(__name__)

#: The one map from Argus errors to gRPC status codes; the first matching class wins.
GRPC_CODES: tuple[tuple[type[ArgusError], grpc.StatusCode], ...] = (
    (InvalidBatch, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (StoreError, grpc.StatusCode.UNAVAILABLE),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
)

#: The details of the UNAVAILABLE that refuses a stream past the limit (formatted with the limit).
STREAM_LIMIT = (
    "stream refused: {} agent streams are open, the server's limit (max_streams, argus server "
    "--max-streams); keep the batches and reconnect later"
)
#: Batches of one stream decoded and queued for storage ahead of the one being acknowledged
#: (the node agent keeps 64 in flight).
PIPELINE_DEPTH = 64
#: ... and at most this many bytes of their Arrow payloads: four messages of the largest size.
PIPELINE_BYTES = 4 * MAX_MESSAGE_BYTES
#: A batch that costs more than this to hold decoded (bytes, :func:`batch_cost`) is decoded in a
#: thread, not on the loop.
DECODE_ON_LOOP_BYTES = 256 << 10
#: Threads decoding large batches.
DECODE_THREADS = 2
#: A batch read off a stream: the batch, its ack (or error) to come, its arrival
#: (``time.monotonic()``, s) and the size of its Arrow payload (bytes).
_Item = tuple[pb.Batch, "asyncio.Future[pb.Ack]", float, int]
#: Calls beyond ``max_streams``: Clock calls and the refusals of streams past the limit.
_SPARE_CALLS = 32


def _decoded_and_checked(batch: pb.Batch, stream: Scanned) -> ingest.Decoded:
    """:func:`ingest.decode`, then the row rules (:func:`argus.rowrules.check_values`): for a large
    batch, in a decoding thread (module doc). The writer checks its group again; for a large batch
    that is ~10 ms per 32 MiB.

    Raises:
        InvalidBatch: what :func:`ingest.decode` raises, or the first row rule broken.
    """
    decoded = ingest.decode(batch, decoding_pool(), stream)
    check_values(decoded.table, decoded.data)
    return decoded


def _failed(exc: BaseException) -> asyncio.Future[pb.Ack]:
    """A future of the running loop that already holds ``exc``."""
    future: asyncio.Future[pb.Ack] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future


def _job_ids(batch: pb.Batch) -> list[str]:
    """The jobs whose rows ``batch`` carries: its own, or its members' (a flush), in order."""
    if not batch.members:
        return [batch.job_id]
    return list(dict.fromkeys(m.job_id for m in batch.members))


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for ``exc``: from :data:`GRPC_CODES`, else ``INTERNAL``."""
    for kind, code in GRPC_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    await context.abort(grpc_code(exc), str(exc))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class _Gate:
    """Counts batches being stored, so shutdown can wait until every one is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self.closed = False

    def enter(self) -> bool:
        with self._cond:
            if self.closed:
                return False
            self._active += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Refuse new batches; wait up to ``timeout`` s for the ones in flight. True when none is left."""
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self._active == 0, timeout)


class _Budget:
    """The bytes of one stream's batches read ahead and not yet answered, bounded by ``max_bytes``.

    One batch is always let in, whatever its size: what one stream makes the server hold stays
    a few messages' worth, whatever its agent sends ahead. For one event loop; not thread-safe.
    """

    def __init__(self, max_bytes: int = PIPELINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._room = asyncio.Condition()

    async def reserve(self, size: int) -> None:
        """Wait until ``size`` more bytes fit (at once when none are held)."""
        async with self._room:
            await self._room.wait_for(lambda: not self.held or self.held + size <= self.max_bytes)
            self.held += size

    async def release(self, size: int) -> None:
        """``size`` bytes of an answered batch are no longer held."""
        async with self._room:
            self.held -= size
            self._room.notify_all()


class CollectorServicer(pb_grpc.CollectorServicer):
    """``argus.v1.Collector`` over ``store``, for ``grpc.aio``; no per-agent state.

    Each stream reads its batches ahead (up to :data:`PIPELINE_DEPTH` and
    :data:`PIPELINE_BYTES`), decodes them and queues them on a :class:`BatchWriter`, which
    stores them in groups in its own thread; the stream answers them in order. Its coroutines
    run on one event loop; :meth:`drain` may be called from any thread.
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    ) -> None:
        self.metrics = metrics
        #: Bytes of every stream's batches held until written (:mod:`argus.collector.decoded_budget`).
        self.decoded = DecodedBudget(max_decoded_bytes)
        self.writer = BatchWriter(store, metrics)
        self.captures = PendingCaptures(store)
        self._gate = _Gate()
        self.max_streams = max_streams
        self._open = 0  # streams open; touched on the event loop only
        self._decoders = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="argus-decode")

    async def _submit(self, batch: pb.Batch, stream: Scanned, cost: int) -> asyncio.Future[pb.Ack]:
        """Decode ``batch`` (its payload walked once, ``stream``) and queue it for the writer; the
        future holds its Ack or its error.

        A batch that costs at most :data:`DECODE_ON_LOOP_BYTES` decoded (``cost``, bytes) is
        decoded on the loop, a larger one in a decoding thread.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.Ack]
        if not self._gate.enter():
            future = loop.create_future()
            future.set_exception(StoreError(SHUTTING_DOWN))
            return future
        try:
            if cost <= DECODE_ON_LOOP_BYTES:
                decoded = ingest.decode(batch, stream=stream)
            else:
                decoded = await loop.run_in_executor(self._decoders, _decoded_and_checked, batch, stream)
            future = self.writer.submit_async(decoded)
        except asyncio.CancelledError:
            self._gate.leave()
            raise
        except Exception as exc:
            self._gate.leave()
            future = loop.create_future()
            future.set_exception(ingest.detached(exc) if isinstance(exc, InvalidBatch) else exc)
            return future
        future.add_done_callback(lambda _: self._gate.leave())
        return future

    def _given_back(self, cost: int, _: asyncio.Future[pb.Ack]) -> None:
        """A batch's charge on :attr:`decoded` is given back: the writer settled it."""
        self.decoded.release(cost)

    def _rejected(self, batch: pb.Batch, exc: InvalidBatch) -> pb.Ack:
        """The REJECTED ``Ack`` of ``batch`` (one batch, a flush or a member of one), counted and logged."""
        code = grpc_code(exc).name
        self.metrics.ingest_batches.labels(ingest.TABLE_BY_ENUM.get(batch.table, "unknown"), "rejected").inc()
        self.metrics.ingest_rejected.labels(code).inc()
        log.info("rejected batch %s:%d: %s", batch.agent_id, batch.seq, exc)
        return pb.Ack(seq=batch.seq, status=pb.Ack.REJECTED, code=code, message=str(exc))

    async def _answer(
        self, batch: pb.Batch, future: asyncio.Future[pb.Ack], context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.Ack:
        try:
            # Shielded: a stream that ends meanwhile must not cancel the writer's future.
            return await asyncio.shield(future)
        except InvalidBatch as exc:
            return self._rejected(batch, exc)
        except ArgusError as exc:
            log.warning("batch %s:%d not stored: %s", batch.agent_id, batch.seq, exc)
            await _abort(context, exc)
        except Exception as exc:
            log.exception("batch %s:%d failed", batch.agent_id, batch.seq)
            await _abort(context, exc)

    async def _submit_flush(
        self, flush: pb.Batch, members: Sequence[pb.Batch], streams: Sequence[Scanned], costs: Sequence[int]
    ) -> asyncio.Future[pb.Ack]:
        """Submit each member of ``flush`` (:meth:`_submit`, ``streams`` and ``costs`` theirs); the
        future holds the flush's one Ack once every member is settled (:meth:`_flush_ack`), or the
        first error that leaves a member unstored."""
        futures = [await self._submit(m, s, c) for m, s, c in zip(members, streams, costs, strict=True)]
        joined: asyncio.Future[pb.Ack] = asyncio.get_running_loop().create_future()
        left = len(futures)

        def settled(_: asyncio.Future[pb.Ack]) -> None:
            nonlocal left
            left -= 1
            if left or joined.cancelled():
                return
            outcome = self._flush_ack(flush, members, futures)
            if isinstance(outcome, pb.Ack):
                joined.set_result(outcome)
            else:
                joined.set_exception(outcome)

        for future in futures:
            future.add_done_callback(settled)
        return joined

    def _flush_ack(
        self, flush: pb.Batch, members: Sequence[pb.Batch], futures: Sequence[asyncio.Future[pb.Ack]]
    ) -> pb.Ack | BaseException:
        """The Ack of ``flush`` from its members' settled ``futures`` (``Ack.members``, docs/design.md
        §3), or the first error that is not a refusal (the flush stays unacknowledged, resent whole)."""
        # Every member's error is read (asyncio logs those never read), the first that keeps a member
        # unstored answers the flush.
        errors = [StoreError(SHUTTING_DOWN) if f.cancelled() else f.exception() for f in futures]
        unstored = [e for e in errors if e is not None and not isinstance(e, InvalidBatch)]
        if unstored:
            return unstored[0]
        acks = [
            self._rejected(member, error) if isinstance(error, InvalidBatch) else future.result()
            for member, future, error in zip(members, futures, errors, strict=True)
        ]
        rows = sum(a.rows for a in acks)
        statuses = {a.status for a in acks}
        if pb.Ack.REJECTED in statuses:
            return pb.Ack(seq=flush.seq, status=pb.Ack.REJECTED, rows=rows, members=acks)
        status = pb.Ack.DUPLICATE if statuses == {pb.Ack.DUPLICATE} else pb.Ack.STORED
        return pb.Ack(seq=flush.seq, status=status, rows=rows)

    async def _take(self, batch: pb.Batch, budget: _Budget) -> tuple[asyncio.Future[pb.Ack], int]:
        """Reserve room for ``batch`` (a batch or a flush) on ``budget`` and :attr:`decoded`, then
        submit it; its future to answer, and the bytes of its Arrow payloads."""
        try:
            members = ingest.flush_members(batch)
        except InvalidBatch as exc:
            return _failed(exc), 0
        # The payload's size: upb's ByteSize() encodes the whole message to count it.
        payloads = [m.arrow_ipc for m in members] if members else [batch.arrow_ipc]
        size = sum(len(p) for p in payloads)
        await budget.reserve(size)
        # Each payload's messages are walked once: charged here, decoded from the same walk.
        streams = [scan(p) for p in payloads]
        costs = [batch_cost(s) for s in streams]
        cost = sum(costs)
        await self.decoded.acquire(cost)
        try:
            if members:
                future = await self._submit_flush(batch, members, streams, costs)
            else:
                future = await self._submit(batch, streams[0], cost)
        except BaseException:
            self.decoded.release(cost)
            raise
        # Given back when the writer settles it (written, refused, failed), not at its ack.
        future.add_done_callback(functools.partial(self._given_back, cost))
        return future, size

    async def _pipelined(self, requests: AsyncIterator[pb.Batch]) -> AsyncIterator[_Item]:
        """The stream's batches with their acks to come, arrival times and sizes, in order.

        A reader task takes the next batches off the stream while earlier ones are being
        stored, so one stream has several batches in the writer's group, as its agent has several
        in flight (otherwise each stream gets one batch stored per group, whatever it sent).
        """
        ahead: asyncio.Queue[_Item | BaseException | None] = asyncio.Queue(PIPELINE_DEPTH)
        budget = _Budget()

        async def read() -> None:
            try:
                async for batch in requests:
                    arrived = time.monotonic()
                    future, size = await self._take(batch, budget)
                    await ahead.put((batch, future, arrived, size))
                await ahead.put(None)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the call ended (cancelled, broken): the stream ends with it
                await ahead.put(exc)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await ahead.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # answered when the caller asks for the next one
                await budget.release(item[3])
        finally:
            reader.cancel()

    async def Stream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Batch], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.Ack]:
        if self._open >= self.max_streams:
            log.warning("refused an agent stream: %d open (max_streams)", self.max_streams)
            await context.abort(grpc.StatusCode.UNAVAILABLE, STREAM_LIMIT.format(self.max_streams))
        self._open += 1
        try:
            passed: set[str] = set()  # capture ids passed on this stream
            async for batch, future, arrived, _ in self._pipelined(request_iterator):
                ack = await self._answer(batch, future, context)
                for job_id in _job_ids(batch):
                    for capture in self.captures.cached(job_id):
                        if capture.capture_id not in passed:
                            passed.add(capture.capture_id)
                            ack.stack_captures.append(capture)
                self.metrics.ingest_ack_seconds.observe(time.monotonic() - arrived)
                yield ack
        finally:
            self._open -= 1

    async def Clock(  # noqa: N802
        self, request: pb.ClockRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ClockReply:
        return pb.ClockReply(agent_send_ns=request.agent_send_ns, server_ns=time.time_ns())

    def drain(self, timeout: float) -> bool:
        """Refuse further batches, wait for those being stored, stop the writer. True when all finished."""
        drained = self._gate.close(timeout)
        finished = self.writer.close(timeout) and drained
        self._decoders.shutdown(wait=False)
        return finished


class _BearerToken(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic only in the stubs
    """Ends every call without ``authorization: Bearer TOKEN`` metadata with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        metadata = dict(handler_call_details.invocation_metadata or ())
        sent = metadata.get("authorization", "")
        sent_bytes = sent.encode() if isinstance(sent, str) else bytes(sent)
        handler = await continuation(handler_call_details)
        if handler is None or hmac.compare_digest(sent_bytes, self._expected):
            return handler
        error = Unauthenticated("missing or wrong 'authorization: Bearer TOKEN' metadata")

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _abort(context, error)

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS {what} {path}: {exc}") from exc


@dataclass
class CollectorServer:
    """A started gRPC collector: the server, its servicer, the port it bound and its event loop."""

    server: grpc.aio.Server
    servicer: CollectorServicer
    host: str
    port: int
    tls: bool
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def address(self) -> str:
        """``host:port`` it listens on (the real port when asked for port 0)."""
        return f"{self.host}:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking batches, let each stream finish the batch it is storing, then close.

        Every batch acknowledged before this returns is stored; a batch that arrives
        later ends its stream with UNAVAILABLE unacknowledged, so its agent resends it.
        Call it from any thread but the loop's.
        """
        drained = self.servicer.drain(grace_s)
        # Once drained, open streams only wait for batches they may no longer send: a short
        # grace lets the last acks out, then they end (the agent reconnects elsewhere or later).
        grace = 1.0 if drained else grace_s
        stopping = asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)
        try:
            stopping.result(grace + 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        if not drained and not self.servicer.drain(grace_s):
            log.warning("batches still being stored after %.1f s", 2 * grace_s)


def start_collector(store: Store, metrics: Metrics, config: ServerConfig) -> CollectorServer:
    """Start serving ``argus.v1.Collector`` on ``config.grpc_listen`` (``host:port``; port 0: a free one).

    Serves TLS with ``config.tls``; with ``config.token``, every call needs ``authorization: Bearer
    TOKEN``. At most ``config.max_streams`` agent streams are open at once (module docstring),
    holding at most ``config.max_decoded_bytes`` of batches until written
    (:mod:`argus.collector.decoded_budget`). The server runs on an event loop in a thread of its own
    (``argus-grpc``), started here.

    Raises:
        ConfigError: an unreadable TLS file, or the address cannot be bound (in use, bad host).
    """
    listen, tls = config.grpc_listen, config.tls
    host, _, _ = listen.rpartition(":")
    credentials = None
    if tls is not None:
        credentials = grpc.ssl_server_credentials([(_read(tls.key, "key"), _read(tls.cert, "certificate"))])
    servicer = CollectorServicer(store, metrics, config.max_streams, config.max_decoded_bytes)
    loop = asyncio.new_event_loop()
    thread = start_daemon(loop.run_forever, "argus-grpc")
    try:
        server, port = asyncio.run_coroutine_threadsafe(
            _serve(servicer, listen, config.token, credentials), loop
        ).result(60)
    except BaseException:
        servicer.drain(1.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        raise
    return CollectorServer(server, servicer, host, port, tls is not None, loop, thread)


async def _serve(
    servicer: CollectorServicer,
    listen: str,
    token: str | None,
    credentials: grpc.ServerCredentials | None,
) -> tuple[grpc.aio.Server, int]:
    """Build and start the ``grpc.aio`` server on the running loop; returns it and its port.

    Raises:
        ConfigError: the address cannot be bound.
    """
    interceptors = [_BearerToken(token)] if token else []
    server = grpc.aio.server(
        interceptors=interceptors,
        # A backstop: past this many calls a new one fails at once with RESOURCE_EXHAUSTED
        # (streams are refused first, at max_streams).
        maximum_concurrent_rpcs=servicer.max_streams + _SPARE_CALLS,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Fail on a port in use instead of silently sharing it with another server.
            ("grpc.so_reuseport", 0),
            # Ping idle connections so a stream whose agent vanished ends.
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ],
    )
    pb_grpc.add_CollectorServicer_to_server(servicer, server)
    try:
        if credentials is not None:
            port = server.add_secure_port(listen, credentials)
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {listen}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"cannot listen for gRPC on {listen}: address in use or not local")
    await server.start()
    return server, port
