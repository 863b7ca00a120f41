"""The server's allocators give freed memory back: its resident memory is what it holds.

Two allocators hold the server's large buffers, and neither is Python's:

- the embedded engine's (chDB bundles ClickHouse's jemalloc): merges, inserts and reads allocate
  and free tens of MB; with ClickHouse's ``dirty_decay_ms:5000`` and no background thread the
  freed pages stayed resident for up to 5 s (12-49 MB kept in ``bench/soak.py``, beside 80-120 MB
  allocated). :data:`ENGINE_MALLOC_CONF` makes it ``dirty_decay_ms:1000``: what one write group
  frees is there for the next (the writer's groups come about twice a second under traffic)
  and given back within a second, not five. ``dirty_decay_ms:0`` (every page back when
  freed) cost 80 % more CPU per insert (60 inserts of 65,536 kernel events: 5.35-6.14 against
  2.96-3.09 CPU-s, 8x the page faults); 1,000 ms cost 4-8 % (3.56-3.73 against 3.43-3.45).
  The engine reads its allocator's options once, when its library loads, from
  ``JE_MALLOC_CONF`` (chDB's jemalloc is built with the ``je_`` prefix), so
  :func:`set_engine_allocator` sets it (unless the operator did) before the first embedded store
  opens (what the engine runs with: ``opt.dirty_decay_ms`` in ``system.jemalloc_stats``).
- Arrow's (batches decoded from agents): pyarrow's default pool, mimalloc, keeps the pages it
  freed for later allocations until ``release_unused()``. After the first burst of large batches
  the soak's server kept about what the burst had decoded (+140 MB of anonymous memory with
  nothing allocated in Arrow or the engine, beside the 128 MiB decoded-bytes budget), for good.
  :func:`release_arrow_pool`, called each time a batch's charge to the decoded-bytes budget is
  given back (:mod:`argus.collector.decoded_budget`), brought the floor between bursts back to the
  first minute's, but each burst still peaked ~105 MB above it with nothing allocated (large
  batches are decoded in the collector's decoding threads and freed by its writer; mimalloc keeps
  per-thread heaps). :func:`decoding_pool` is where large batches are decoded instead: Arrow's
  jemalloc with decay 0, so a decoded batch's pages go back when it is freed, by whichever thread;
  with it the bursts cost what the budget holds (bench/README.md, soak).

What it costs: a page given back and allocated again is faulted in again (zeroed by the
kernel). Decoding a 32 MiB ZSTD batch took 16-17 ms of CPU into :func:`decoding_pool` against
1.6-3.5 ms into mimalloc, which reuses its pages (2026-12-07, load 8-16; bench/README.md, soak).
"""

from __future__ import annotations

import functools
import os

import pyarrow as pa

__all__ = [
    "ENGINE_MALLOC_CONF",
    "ENGINE_MALLOC_CONF_VAR",
    "decoding_pool",
    "release_arrow_pool",
    "set_engine_allocator",
]

#: The environment variable chDB's jemalloc reads its options from (its ``je_`` prefix).
ENGINE_MALLOC_CONF_VAR = "JE_MALLOC_CONF"
#: The embedded engine's allocator options: freed pages given back within a second.
ENGINE_MALLOC_CONF = "dirty_decay_ms:1000"


def set_engine_allocator() -> None:
    """Give the embedded engine :data:`ENGINE_MALLOC_CONF`, unless ``JE_MALLOC_CONF`` is set already.

    Takes effect only if the engine's library (``chdb``) is not loaded yet in this process: it
    reads the variable once, when it loads. Child processes inherit it.
    """
    os.environ.setdefault(ENGINE_MALLOC_CONF_VAR, ENGINE_MALLOC_CONF)


@functools.cache
def decoding_pool() -> pa.MemoryPool:
    """Arrow's jemalloc pool with decay 0, for decoded batches: freed pages given back at once.

    Where pyarrow was built without jemalloc, Arrow's default pool (pages kept, as before).
    Setting jemalloc's decay applies to Arrow's jemalloc only, which nothing else here uses.
    """
    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except NotImplementedError:
        return pa.default_memory_pool()
    return pool


def release_arrow_pool() -> None:
    """Give the pages Arrow's default pool has freed back to the system (see the module docstring).

    ``MemoryPool.release_unused`` (mimalloc's collect: this thread's heap and those of exited
    threads): a median of 2 µs with 240 MB held in small buffers and nothing to give back, under
    1 ms giving back 128 MiB (2-core development machine, 2026-12-07).
    """
    pa.default_memory_pool().release_unused()
