"""The ``argus.v1.Collector`` gRPC service: a thin servicer over :mod:`argus.collector.ingest`.

The servicer only moves messages: each ``Batch`` goes to :func:`ingest.ingest`
and each outcome becomes one ``Ack``. Errors of :mod:`argus.errors` map to gRPC
status codes in one place, :data:`GRPC_CODES`:

- ``InvalidBatch`` → a REJECTED ``Ack`` with ``INVALID_ARGUMENT``; the stream stays open.
- ``StoreError`` → the stream ends with ``UNAVAILABLE`` and the batch is *not*
  acknowledged, so the agent keeps it in its spool and sends it again later.
- a missing or wrong bearer token → the call ends with ``UNAUTHENTICATED`` before
  any batch is read.
- each ``Ack`` carries the pending stack captures of the batch's job not yet passed on that
  stream (:mod:`argus.collector.captures`).
- a message over :data:`argus.config.MAX_MESSAGE_BYTES` → gRPC itself ends the
  stream with ``RESOURCE_EXHAUSTED``; the server keeps serving other streams.
- a stream past ``max_streams`` open ones (``argus server --max-streams``) → ``UNAVAILABLE`` at
  once, before any batch is read, with a message naming the limit: the agent keeps its batches
  spooled and reconnects with back-off (nothing to do with size, so it never re-splits). Each
  open stream holds one thread; gRPC's own ``maximum_concurrent_rpcs`` stays a little above
  (Clock calls, refusals) as a backstop, answering ``RESOURCE_EXHAUSTED`` "Concurrent RPC limit
  exceeded!", which the agent also takes for a refusal.
"""

from __future__ import annotations

import hmac
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc

from argus.collector import ingest
from argus.collector.captures import PendingCaptures
from argus.collector.writer import SHUTTING_DOWN, BatchWriter
from argus.config import DEFAULT_MAX_STREAMS, MAX_MESSAGE_BYTES, TlsFiles
from argus.errors import (
    ArgusError,
    ConfigError,
    InvalidBatch,
    NotFound,
    StoreError,
    Unauthenticated,
)
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from argus.store import Store

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
#: ... and at most this many bytes of them (encoded): four messages of the largest size.
PIPELINE_BYTES = 4 * MAX_MESSAGE_BYTES
#: A batch read off a stream: the batch, the future of its ack, its arrival (``time.monotonic()``, s).
_Item = tuple[pb.Batch, Future[pb.Ack], float]
#: Threads beyond ``max_streams``: Clock calls and the refusals of streams past the limit.
_SPARE_WORKERS = 32


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for ``exc``: from :data:`GRPC_CODES`, else ``INTERNAL``."""
    for kind, code in GRPC_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _abort(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    context.abort(grpc_code(exc), str(exc))
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


class _Ahead:
    """A stream's batches read ahead (with their futures), a bounded queue; ``done`` stops the reader.

    Bounded in batches (``depth``) and in their bytes (``max_bytes``, the batches' encoded
    size; one batch is always let in): what one stream makes the server hold stays a few
    messages' worth, whatever its agent sends ahead.
    """

    def __init__(self, depth: int, max_bytes: int = PIPELINE_BYTES) -> None:
        self.queue: queue.Queue[_Item | BaseException | None] = queue.Queue(depth)
        self.done = threading.Event()
        self.max_bytes = max_bytes
        self._held = 0
        self._room = threading.Condition()

    def reserve(self, size: int) -> bool:
        """Wait until ``size`` more bytes fit (at once when none are held); False once done."""
        with self._room:
            while self._held and self._held + size > self.max_bytes and not self.done.is_set():
                self._room.wait(0.5)
            self._held += size
            return not self.done.is_set()

    def release(self, size: int) -> None:
        """``size`` bytes of an answered batch are no longer held."""
        with self._room:
            self._held -= size
            self._room.notify_all()

    def put(self, item: _Item | BaseException | None) -> bool:
        """Queue ``item``, waiting for room; False once the stream's answering side has ended."""
        while not self.done.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False


class CollectorServicer(pb_grpc.CollectorServicer):
    """``argus.v1.Collector`` over ``store``; thread-safe, no per-agent state.

    Each stream's reader thread decodes its batches and queues them, up to :data:`PIPELINE_DEPTH`
    ahead; a :class:`BatchWriter` stores them in groups; the stream's own thread answers them in
    order.
    """

    def __init__(self, store: Store, metrics: Metrics, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self.metrics = metrics
        self.writer = BatchWriter(store, metrics)
        self.captures = PendingCaptures(store)
        self._gate = _Gate()
        self.max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    def _submit(self, batch: pb.Batch) -> Future[pb.Ack]:
        """Decode ``batch`` and queue it for the writer; the future holds its Ack or its error."""
        if not self._gate.enter():
            failed: Future[pb.Ack] = Future()
            failed.set_exception(StoreError(SHUTTING_DOWN))
            return failed
        try:
            future = self.writer.submit(ingest.decode(batch))
        except BaseException as exc:
            self._gate.leave()
            failed = Future()
            failed.set_exception(exc)
            return failed
        future.add_done_callback(lambda _: self._gate.leave())
        return future

    def _answer(self, batch: pb.Batch, future: Future[pb.Ack], context: grpc.ServicerContext) -> pb.Ack:
        try:
            return future.result()
        except InvalidBatch as exc:
            code = grpc_code(exc).name
            self.metrics.ingest_batches.labels(
                ingest.TABLE_BY_ENUM.get(batch.table, "unknown"), "rejected"
            ).inc()
            self.metrics.ingest_rejected.labels(code).inc()
            log.info("rejected batch %s:%d: %s", batch.agent_id, batch.seq, exc)
            return pb.Ack(seq=batch.seq, status=pb.Ack.REJECTED, code=code, message=str(exc))
        except ArgusError as exc:
            log.warning("batch %s:%d not stored: %s", batch.agent_id, batch.seq, exc)
            _abort(context, exc)
        except Exception as exc:
            log.exception("batch %s:%d failed", batch.agent_id, batch.seq)
            _abort(context, exc)

    def _pipelined(self, requests: Iterator[pb.Batch], context: grpc.ServicerContext) -> Iterator[_Item]:
        """The stream's batches with their futures and arrival times (``time.monotonic()``, s), in
        order, at most :data:`PIPELINE_DEPTH` ahead.

        A reader thread takes the next batches off the stream while earlier ones are being
        stored, so one stream has several batches in the writer's group, as its agent has several
        in flight (otherwise each stream gets one batch stored per group, whatever it sent).
        """
        ahead = _Ahead(PIPELINE_DEPTH)

        def read() -> None:
            try:
                for batch in requests:
                    arrived = time.monotonic()
                    if not ahead.reserve(batch.ByteSize()):
                        return
                    if not ahead.put((batch, self._submit(batch), arrived)):
                        return
                ahead.put(None)
            except BaseException as exc:  # the call ended (cancelled, broken): the stream ends with it
                ahead.put(exc)

        threading.Thread(target=read, name="argus-stream-reader", daemon=True).start()
        try:
            while True:
                item = ahead.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # answered when the caller asks for the next one
                ahead.release(item[0].ByteSize())
        finally:
            ahead.done.set()

    def Stream(self, request_iterator: Iterator[pb.Batch], context: grpc.ServicerContext) -> Iterator[pb.Ack]:  # noqa: N802
        if not self._streams.acquire(blocking=False):
            log.warning("refused an agent stream: %d open (max_streams)", self.max_streams)
            context.abort(grpc.StatusCode.UNAVAILABLE, STREAM_LIMIT.format(self.max_streams))
        try:
            passed: set[str] = set()  # capture ids passed on this stream
            for batch, future, arrived in self._pipelined(request_iterator, context):
                ack = self._answer(batch, future, context)
                for capture in self.captures.for_job(batch.job_id):
                    if capture.capture_id not in passed:
                        passed.add(capture.capture_id)
                        ack.stack_captures.append(capture)
                self.metrics.ingest_ack_seconds.observe(time.monotonic() - arrived)
                yield ack
        finally:
            self._streams.release()

    def Clock(self, request: pb.ClockRequest, context: grpc.ServicerContext) -> pb.ClockReply:  # noqa: N802
        return pb.ClockReply(agent_send_ns=request.agent_send_ns, server_ns=time.time_ns())

    def drain(self, timeout: float) -> bool:
        """Refuse further batches, wait for those being stored, stop the writer. True when all finished."""
        drained = self._gate.close(timeout)
        return self.writer.close(timeout) and drained


class _BearerToken(grpc.ServerInterceptor):  # type: ignore[type-arg]  # generic only in the stubs
    """Ends every call without ``authorization: Bearer TOKEN`` metadata with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        sent = metadata.get("authorization", "")
        sent_bytes = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(sent_bytes, self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        error = Unauthenticated("missing or wrong 'authorization: Bearer TOKEN' metadata")

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            _abort(context, error)

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
    """A started gRPC collector: the server, its servicer and the port it bound."""

    server: grpc.Server
    servicer: CollectorServicer
    host: str
    port: int
    tls: bool

    @property
    def address(self) -> str:
        """``host:port`` it listens on (the real port when asked for port 0)."""
        return f"{self.host}:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking batches, let each stream finish the batch it is storing, then close.

        Every batch acknowledged before this returns is stored; a batch that arrives
        later ends its stream with UNAVAILABLE unacknowledged, so its agent resends it.
        """
        drained = self.servicer.drain(grace_s)
        # Once drained, open streams only wait for batches they may no longer send: a short
        # grace lets the last acks out, then they end (the agent reconnects elsewhere or later).
        self.server.stop(1.0 if drained else grace_s).wait()
        if not drained and not self.servicer.drain(grace_s):
            log.warning("batches still being stored after %.1f s", 2 * grace_s)


def start_collector(
    store: Store,
    metrics: Metrics,
    listen: str,
    *,
    token: str | None = None,
    tls: TlsFiles | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
) -> CollectorServer:
    """Start serving ``argus.v1.Collector`` on ``listen`` (``host:port``; port 0 picks a free one).

    Serves TLS with ``tls``; with ``token``, every call needs ``authorization: Bearer TOKEN``.
    At most ``max_streams`` agent streams are open at once (module docstring); threads are
    started as streams need them.

    Raises:
        ConfigError: an unreadable TLS file, or the address cannot be bound (in use, bad host).
    """
    host, _, _ = listen.rpartition(":")
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = [_BearerToken(token)] if token else []
    workers = max_streams + _SPARE_WORKERS
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="argus-grpc"),
        interceptors=interceptors,
        # A backstop: past this many calls a new one fails at once with RESOURCE_EXHAUSTED
        # instead of waiting unseen for a free thread (streams are refused first, at max_streams).
        maximum_concurrent_rpcs=workers,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Fail on a port in use instead of silently sharing it with another server.
            ("grpc.so_reuseport", 0),
            # Ping idle connections so a stream whose agent vanished frees its thread.
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ],
    )
    servicer = CollectorServicer(store, metrics, max_streams)
    pb_grpc.add_CollectorServicer_to_server(servicer, server)
    try:
        if tls is not None:
            credentials = grpc.ssl_server_credentials(
                [(_read(tls.key, "key"), _read(tls.cert, "certificate"))]
            )
            port = server.add_secure_port(listen, credentials)
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {listen}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"cannot listen for gRPC on {listen}: address in use or not local")
    server.start()
    return CollectorServer(server, servicer, host, port, tls=tls is not None)
