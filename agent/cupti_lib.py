"""libcupti through ctypes: activity buffers from a bounded pool, decoded natively.

:class:`NativeCupti` is the default backend of :class:`argus.agent.cupti.CuptiSource`.
It loads the libcupti already mapped into the process (the one PyTorch's CUDA build
loaded, so there is one CUPTI instance), else the one cupti-python or the CUDA toolkit
provides (:func:`find_libcupti`), and calls CUPTI's C API directly; nothing is compiled
at install time and nothing is loaded before a GPU rank starts capture.

Buffers come from a :class:`BufferPool`: one memory block of ``buffers`` ×
``buffer_bytes``, handed to CUPTI one buffer at a time by the buffer-request
callback. The buffer-complete callback only queues the filled buffer (no Python
runs per record); the probe's shipper thread decodes the queued buffers with
:class:`~argus.agent.cupti_native.NativeDecoder` and gives them back. When every
buffer is out, the request callback hands CUPTI none: CUPTI drops those records and
counts them (``cuptiActivityGetNumDroppedRecords``), and so does Argus
(:attr:`NativeCupti.lost`); memory never grows past the pool.

Record sizes are not assumed from the CUPTI release: the first buffer holding a kind
is walked by libcupti (``cuptiActivityGetNextRecord``), which shows each record's
size; later buffers are walked by the decoder alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from argus.agent.cupti_native import NativeDecoder
from argus.agent.cupti_records import Decoded
from argus.config import ENV_LIBCUPTI

__all__ = [
    "BUFFERS",
    "BUFFER_BYTES",
    "BufferPool",
    "CuptiBusy",
    "CuptiError",
    "LibCupti",
    "NativeCupti",
    "find_libcupti",
]

log = logging.getLogger(__name__)

#: Bytes of each activity buffer (about 18,000 kernel records).
BUFFER_BYTES = 4 << 20
#: Buffers in the pool: 128 MiB at most, touched only as CUPTI fills them.
BUFFERS = 32

# CUptiResult values (cupti_result.h).
_SUCCESS = 0
_MAX_LIMIT_REACHED = 12
_MULTIPLE_SUBSCRIBERS = 39
_FLUSH_FORCED = 1

_REQUEST = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_COMPLETE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)
_SUBSCRIBER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
#: ctypes callbacks handed to libcupti stay alive for the whole process: CUPTI may call them late.
_KEEP: list[Any] = []


class CuptiError(RuntimeError):
    """A CUPTI call failed, or no libcupti could be loaded (internal: the probe logs it and goes on)."""


class CuptiBusy(CuptiError):
    """Another tool holds CUPTI's subscriber slot (Nsight, a running ``torch.profiler``, ...)."""


def _mapped(fragment: str) -> str | None:
    """Path of a shared library already mapped into this process whose name contains ``fragment``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if fragment in os.path.basename(path) and os.path.isfile(path):
                    return path
    except OSError:
        return None
    return None


def find_libcupti(  # noqa: C901, PLR0911  (the places the docstring lists, tried in its order)
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The libcupti to load, in this order (None when there is none).

    ``$ARGUS_LIBCUPTI``; a libcupti already mapped into the process (PyTorch's); the one
    ``cuda.pathfinder`` finds (as cupti-python does); an ``nvidia/*/lib`` wheel directory
    on ``sys.path``; the dynamic linker's; ``$CUDA_HOME``/``/usr/local/cuda`` ``extras/CUPTI``.
    """
    env = os.environ if environ is None else environ
    if env.get(ENV_LIBCUPTI):
        return env[ENV_LIBCUPTI]
    loaded = _mapped("libcupti.so")
    if loaded:
        return loaded
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:
        pass
    for root in sys.path:
        for pattern in ("nvidia/cuda_cupti/lib/libcupti.so*", "nvidia/cu*/lib/libcupti.so*"):
            found = sorted(glob.glob(os.path.join(root, pattern)))
            if found:
                return found[-1]
    name = ctypes.util.find_library("cupti")
    if name:
        return name
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found = sorted(glob.glob(os.path.join(home, "extras/CUPTI/lib64/libcupti.so*")))
            if found:
                return found[-1]
    return None


class LibCupti:
    """The libcupti functions Argus calls, with their C signatures.

    Raises:
        CuptiError: the library cannot be loaded or lacks a function.
    """

    _SIGNATURES: ClassVar[dict[str, list[Any]]] = {
        "cuptiGetVersion": [ctypes.POINTER(ctypes.c_uint32)],
        "cuptiGetResultString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuptiSubscribe": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p],
        "cuptiUnsubscribe": [ctypes.c_void_p],
        "cuptiActivityRegisterCallbacks": [ctypes.c_void_p, ctypes.c_void_p],
        "cuptiActivityEnable": [ctypes.c_int],
        "cuptiActivityDisable": [ctypes.c_int],
        "cuptiActivityFlushAll": [ctypes.c_uint32],
        "cuptiActivityGetNextRecord": [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
        "cuptiActivityGetNumDroppedRecords": [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_size_t),
        ],
        "cuptiActivityPushExternalCorrelationId": [ctypes.c_int, ctypes.c_uint64],
        "cuptiActivityPopExternalCorrelationId": [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)],
        "cuptiGetTimestamp": [ctypes.POINTER(ctypes.c_uint64)],
    }

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
            for name, args in self._SIGNATURES.items():
                fn = getattr(self.lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
        except (OSError, AttributeError) as exc:
            raise CuptiError(f"cannot use libcupti at {path}: {exc}") from exc
        self.path = path

    def check(self, rc: int, what: str) -> None:
        """Raise :class:`CuptiError` naming ``what`` when ``rc`` is not CUPTI_SUCCESS."""
        if rc != _SUCCESS:
            raise CuptiError(f"{what} failed: {self.result(rc)}")

    def result(self, rc: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuptiGetResultString(rc, ctypes.byref(text)) == _SUCCESS and text.value:
            return f"{text.value.decode(errors='replace')} ({rc})"
        return f"CUPTI error {rc}"

    def version(self) -> int:
        out = ctypes.c_uint32()
        self.check(self.lib.cuptiGetVersion(ctypes.byref(out)), "cuptiGetVersion")
        return int(out.value)

    def timestamp(self) -> int:
        out = ctypes.c_uint64()
        self.check(self.lib.cuptiGetTimestamp(ctypes.byref(out)), "cuptiGetTimestamp")
        return int(out.value)

    def walk(self, address: int, valid: int) -> list[int]:
        """Byte offsets of every record of the buffer at ``address`` (``cuptiActivityGetNextRecord``)."""
        record = ctypes.c_void_p(None)
        out: list[int] = []
        get = self.lib.cuptiActivityGetNextRecord
        while True:
            rc = get(address, valid, ctypes.byref(record))
            if rc == _MAX_LIMIT_REACHED:
                return out
            self.check(rc, "cuptiActivityGetNextRecord")
            out.append(int(record.value or 0) - address)


class BufferPool:
    """Activity buffers of one memory block, handed out and queued without allocation.

    Args:
        buffer_bytes: Bytes of each buffer (a multiple of 8).
        buffers: How many; CUPTI gets none while all are out (its records are then dropped).

    Raises:
        ValueError: a size that is not positive, or ``buffer_bytes`` not a multiple of 8.
    """

    def __init__(self, buffer_bytes: int = BUFFER_BYTES, buffers: int = BUFFERS) -> None:
        if buffer_bytes <= 0 or buffer_bytes % 8 or buffers <= 0:
            raise ValueError(f"a buffer pool needs buffers > 0 of 8k bytes, got {buffers} x {buffer_bytes}")
        self.buffer_bytes = buffer_bytes
        self.memory = np.empty(buffer_bytes * buffers, np.uint8)  # pages are touched as CUPTI writes
        self.base = int(self.memory.ctypes.data)
        if self.base % 8:
            raise ValueError("activity buffers must be 8-byte aligned")
        self._free: deque[int] = deque(range(buffers))
        self._done: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        #: Requests CUPTI made while every buffer was out.
        self.refused = 0

    def request(self) -> tuple[int, int]:
        """``(address, bytes)`` of a free buffer, or ``(0, 0)`` when all are out."""
        with self._lock:
            if not self._free:
                self.refused += 1
                return 0, 0
            i = self._free.popleft()
        return self.base + i * self.buffer_bytes, self.buffer_bytes

    def complete(self, address: int, valid: int) -> None:
        """Queue the buffer at ``address`` holding ``valid`` bytes of records."""
        start = address - self.base
        if not 0 <= start < self.memory.size or start % self.buffer_bytes:
            log.warning("argus: CUPTI completed a buffer Argus did not hand out (%#x)", address)
            return
        with self._lock:
            self._done.append((start, min(valid, self.buffer_bytes)))

    def take(self) -> list[tuple[int, int]]:
        """The completed buffers, oldest first, as ``(start byte, valid bytes)`` in :attr:`memory`."""
        with self._lock:
            out, self._done = self._done, []
        return out

    def give_back(self, buffers: list[tuple[int, int]]) -> None:
        """Return buffers from :meth:`take` to the free list."""
        with self._lock:
            self._free.extend(start // self.buffer_bytes for start, _ in buffers)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


class NativeCupti:
    """The CUPTI backend on libcupti (see the module docstring); one per process.

    Args:
        pool: The buffer pool (default :data:`BUFFERS` × :data:`BUFFER_BYTES`).
        path: libcupti to load (default :func:`find_libcupti`).

    Raises:
        CuptiError: no libcupti, or it cannot be loaded.
    """

    name = "native"

    def __init__(self, pool: BufferPool | None = None, path: str | None = None) -> None:
        path = path or find_libcupti()
        if path is None:
            raise CuptiError("no libcupti found (set ARGUS_LIBCUPTI, or pip install cupti-python)")
        self.lib = LibCupti(path)
        self.pool = pool or BufferPool()
        self.decoder = NativeDecoder({}, walker=self.lib.walk)
        self._subscriber = ctypes.c_void_p(None)
        self._dropped = 0
        self._refused = 0
        self._callbacks = (_SUBSCRIBER(_ignore), _REQUEST(self._requested), _COMPLETE(self._completed))
        _KEEP.append(self._callbacks)

    def claim(self) -> None:
        """Subscribe (CUPTI's single slot) and register the buffer callbacks.

        Raises:
            CuptiBusy: another subscriber holds the slot.
            CuptiError: CUPTI cannot start (no driver, ...), or registering the callbacks failed.
        """
        handle = ctypes.c_void_p(None)
        rc = self.lib.lib.cuptiSubscribe(ctypes.byref(handle), self._callbacks[0], None)
        if rc == _MULTIPLE_SUBSCRIBERS:
            raise CuptiBusy(f"cuptiSubscribe: {self.lib.result(rc)}")
        self.lib.check(rc, "cuptiSubscribe")
        self._subscriber = handle
        try:
            self.lib.check(
                self.lib.lib.cuptiActivityRegisterCallbacks(self._callbacks[1], self._callbacks[2]),
                "cuptiActivityRegisterCallbacks",
            )
        except CuptiError:
            self.release()
            raise
        log.info("argus: CUPTI %d through %s (native buffer decode)", self.lib.version(), self.lib.path)

    def enable(self, kind: int) -> None:
        self.lib.check(self.lib.lib.cuptiActivityEnable(kind), f"cuptiActivityEnable({kind})")

    def disable(self, kind: int) -> None:
        self.lib.check(self.lib.lib.cuptiActivityDisable(kind), f"cuptiActivityDisable({kind})")

    def flush(self) -> None:
        """Hand over every buffer now, partly filled ones included (completion runs in this call)."""
        self.lib.check(self.lib.lib.cuptiActivityFlushAll(_FLUSH_FORCED), "cuptiActivityFlushAll")

    def push(self, external_kind: int, uid: int) -> None:
        self.lib.check(
            self.lib.lib.cuptiActivityPushExternalCorrelationId(external_kind, uid),
            "cuptiActivityPushExternalCorrelationId",
        )

    def pop(self, external_kind: int) -> None:
        last = ctypes.c_uint64()
        self.lib.check(
            self.lib.lib.cuptiActivityPopExternalCorrelationId(external_kind, ctypes.byref(last)),
            "cuptiActivityPopExternalCorrelationId",
        )

    def timestamp(self) -> int:
        return self.lib.timestamp()

    def take(self, offset_ns: int) -> Decoded:
        """Decode every completed buffer (shipper thread) and return them to the pool."""
        buffers = self.pool.take()
        if not buffers:
            return Decoded()
        try:
            decoded = self.decoder.decode(self.pool.memory, buffers, offset_ns)
        finally:
            self.pool.give_back(buffers)
        self._refused += decoded.refused
        return decoded

    @property
    def lost(self) -> int:
        """Records lost so far: dropped by CUPTI for want of a buffer, and refused buffer tails."""
        return self._dropped + self._refused

    def release(self) -> None:
        if self._subscriber.value:
            with contextlib.suppress(Exception):
                self.lib.lib.cuptiUnsubscribe(self._subscriber)
        self._subscriber = ctypes.c_void_p(None)

    # --- called by CUPTI (its threads, or a CUDA call of a training thread) -----------------------

    def _requested(self, buffer: int, size: int, max_records: int) -> None:
        try:
            address, nbytes = self.pool.request()
        except Exception:
            address, nbytes = 0, 0
        ctypes.c_void_p.from_address(buffer).value = address or None
        ctypes.c_size_t.from_address(size).value = nbytes
        ctypes.c_size_t.from_address(max_records).value = 0

    def _completed(self, context: int, stream: int, buffer: int, size: int, valid: int) -> None:
        try:
            dropped = ctypes.c_size_t(0)
            if self.lib.lib.cuptiActivityGetNumDroppedRecords(context, stream, ctypes.byref(dropped)) == 0:
                self._dropped += int(dropped.value)
            if buffer:
                self.pool.complete(int(buffer), int(valid))
        except Exception:
            log.debug("argus: CUPTI buffer completion failed", exc_info=True)


def _ignore(*_args: Any) -> None:
    """Subscriber callback: no callback domain is enabled, so CUPTI never calls it."""
