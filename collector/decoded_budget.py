"""The server-wide budget of decoded batch bytes: what every agent stream together makes the server hold.

A batch is charged what it costs the server to hold from the moment it is read off its stream
until the writer has written it (:func:`batch_cost`): its payload as received plus what its
Arrow buffers declare decoded (an LZ4/ZSTD body inflates: 12.8 MB of ZSTD can declare 138 MB).
The charge is taken before the batch is decoded and given back when the writer settles it
(written, refused or failed), not when its ack is sent; by then nothing holds its decoded rows
(the writer lets its group go first, and an outcome keeps no traceback:
:func:`argus.collector.ingest.detached`). Past ``max_bytes`` (``argus server
--max-decoded-bytes``, default :data:`DEFAULT_MAX_DECODED_BYTES`) a stream's reader waits:
backpressure through gRPC's flow control, nothing refused, nothing lost. Each time a charge is
given back, Arrow's default pool gives back the pages it freed on this loop
(:func:`argus.memory.release_arrow_pool`, about 2 µs when there is nothing to give back):
mimalloc keeps freed pages for later allocations otherwise.

Fair sharing: the waiting streams are served first come, first served, and each stream's
reader asks for one batch at a time, so a stream whose batch got in queues behind every stream
already waiting. With 2,048 streams each waits for at most 2,047 other batches, one per stream;
over time each stream gets an equal number of batches in, and one stream holds at most its own
read-ahead (``PIPELINE_BYTES`` of payload, :mod:`argus.collector.grpc_service`). A batch larger
than the whole budget gets in alone, when nothing else is held, so it is never stuck.

For one event loop (the collector's); not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque

from argus.config import DEFAULT_MAX_DECODED_BYTES
from argus.ipc_size import Scanned
from argus.limits import LIMITS
from argus.memory import release_arrow_pool

__all__ = ["DEFAULT_MAX_DECODED_BYTES", "DecodedBudget", "batch_cost"]


def batch_cost(stream: Scanned) -> int:
    """Bytes holding a batch, its Arrow IPC stream walked once (:func:`argus.ipc_size.scan`; its
    decode reads the same walk), costs until it is written.

    The payload plus what its record batches declare decoded (its body again when stored
    uncompressed: counted twice, an upper bound). A payload whose metadata cannot be read, or
    that declares more than ``max_batch_decoded_bytes``, is refused before anything is
    decoded (:func:`argus.collector.ingest.decode`): it costs only its own size.
    """
    if stream.error is not None or stream.declared > LIMITS["max_batch_decoded_bytes"]:
        return len(stream.payload)
    return len(stream.payload) + stream.declared


class DecodedBudget:
    """Bytes of batches held by the server, all streams together, bounded by ``max_bytes``.

    Attributes:
        held: Bytes charged now.
        peak: The most bytes ever charged at once.
        waited: Batches that had to wait for room.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_DECODED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self.peak = 0
        self.waited = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.max_bytes

    def _take(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)

    async def acquire(self, size: int) -> None:
        """Charge ``size`` bytes, waiting behind every earlier waiter until they fit."""
        if not self._waiters and self._fits(size):
            self._take(size)
            return
        self.waited += 1
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted, but its stream ended before it could use it
            else:
                self._wake()  # it may have been the first in line
            raise

    def release(self, size: int) -> None:
        """``size`` bytes charged by :meth:`acquire` are no longer held; let waiters in, in order.

        Arrow's pool gives back the pages it freed first (module docstring).
        """
        self.held -= size
        release_arrow_pool()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            size, granted = self._waiters[0]
            if granted.done():  # its stream ended while it waited
                self._waiters.popleft()
                continue
            if not self._fits(size):
                return
            self._waiters.popleft()
            self._take(size)
            granted.set_result(None)
