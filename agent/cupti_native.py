"""Columnar decoding of raw CUPTI activity buffers with numpy: no Python per record.

A completed activity buffer is a run of records laid end to end, each starting
with its ``CUpti_ActivityKind`` (int32) and as long as its kind's struct (8-byte
aligned). Finding the records is therefore a walk in which each step depends on
the kind at the previous one. :class:`NativeDecoder` walks many chunks of the
buffers at once instead of one record at a time:

1. **Speculative walks.** Every buffer is cut into chunks of :data:`CHUNK_WORDS`
   words. All chunks step together, numpy-vectorised, from their first word: a
   word holding a known kind advances by that kind's size, any other word by
   one word. A chunk that starts a buffer starts on a record; the others start
   anywhere, and a walk that starts inside a record falls onto the record chain
   after a few steps (the walks are self-synchronising, as a decoder of a
   variable-length code started mid-stream is).
2. **Stitching.** Chunk *c*'s true entry is where the true chain leaves chunk
   *c-1*. From every chunk's entry the chain is walked (again all chunks at once)
   until it meets a position its chunk's walk recorded: from there on that walk is
   the chain (a walk is deterministic), and what it found before is discarded. A
   chunk whose walk never met the chain is covered by the walk from the chunk
   before. Each buffer's records are then checked to tile it (each record starts
   where the previous one ends); a buffer that fails the check, which the tests'
   adversarial buffers never do, is walked record by record instead.
3. **Columns.** Fields are gathered per kind from the record offsets with the
   layouts of :mod:`argus.agent.cupti_records`; kernel names are resolved once per
   distinct name pointer (:class:`NameTable`; CUPTI keeps one string per kernel for
   the life of the process) and demangled.

A record of a kind whose size is unknown ends what can be walked of its buffer;
so does a record cut by the buffer's valid size (a truncated buffer). With a
``walker`` (libcupti's ``cuptiActivityGetNextRecord``, :mod:`argus.agent.cupti_lib`)
such a buffer is walked by libcupti, which also teaches the decoder the missing
sizes; without one, the rest of the buffer is refused and counted
(:attr:`Decoded.refused`), never read.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from argus.agent.cupti_records import (
    LAYOUTS,
    MEMCPY_NAMES,
    MEMSET_NAME,
    Decoded,
    Layout,
)

__all__ = ["CHUNK_WORDS", "Buffer", "NameTable", "NativeDecoder", "Walker", "demangle"]

log = logging.getLogger(__name__)

#: Words (8 bytes) per speculative walk: fewer numpy steps per buffer vs. less wasted work per chunk.
CHUNK_WORDS = 8192
#: Kinds at or above this are unknown (CUpti_ActivityKind has about 60 values).
_KIND_LIMIT = 256
#: Outcomes of the walk from a chunk's entry.
_MERGED, _ENDED, _STOPPED, _LOST = 0, 1, 2, 3
_NEVER = np.iinfo(np.int64).max

#: ``(start byte, valid bytes)`` of one buffer inside the decoder's memory array.
Buffer = tuple[int, int]
#: ``walker(address, valid_bytes)`` → byte offsets of every record of a buffer, as libcupti walks it.
Walker = Callable[[int, int], Sequence[int]]

_I64 = npt.NDArray[np.int64]


# --- names ---------------------------------------------------------------------------------------


@cache
def _cxa_demangle() -> tuple[Any, Any] | None:
    """libstdc++'s ``__cxa_demangle`` and libc's ``free`` through ctypes, or None."""
    try:
        cxx = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = cxx.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    return fn, libc.free


@cache
def demangle(name: str) -> str:
    """The C++ name behind an Itanium-mangled symbol (``_Z...``), as Kineto's traces show it.

    Names that are not mangled (``ncclDevKernel_...`` of ``extern "C"`` kernels) and names
    the demangler rejects come back unchanged; so does everything where libstdc++ is absent.
    """
    if not name.startswith("_Z"):
        return name
    funcs = _cxa_demangle()
    if funcs is None:
        return name
    fn, free = funcs
    status = ctypes.c_int(0)
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        return ctypes.string_at(out).decode(errors="replace") if status.value == 0 else name
    finally:
        free(out)


class NameTable:
    """Names of decoded rows: memcpy and memset names first, then kernels, each name once.

    Kernel names are resolved once per distinct ``const char *`` CUPTI gives (and
    demangled); two pointers to equal strings share one id. Known pointers sit in an
    open hash table (multiplicative hashing), so a batch of rows is looked up in a few
    numpy passes; pointers not found there (new, or sharing a slot) take a slow path
    once per distinct value. Thread-safe.
    """

    _MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio (Knuth's multiplicative hash)

    def __init__(self) -> None:
        self.names: list[str] = [*MEMCPY_NAMES, MEMSET_NAME]
        self._ids: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self._by_pointer: dict[int, int] = {}
        self._lock = threading.Lock()
        self._rebuild()

    #: Id of the memset name.
    MEMSET = len(MEMCPY_NAMES)

    def _id(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def _rebuild(self) -> None:
        """Size the hash table to 64 slots per known pointer (few share a slot) and fill it."""
        self._bits = min(max(12, (64 * len(self._by_pointer)).bit_length()), 22)
        size = 1 << self._bits
        pointers = np.fromiter(self._by_pointer, np.uint64, len(self._by_pointer))
        ids = np.fromiter(self._by_pointer.values(), np.int32, len(self._by_pointer))
        self._slot_pointer = np.full(size, np.uint64(1), np.uint64)  # 1: no C string lives there
        self._slot_id = np.zeros(size, np.int32)
        slot = self._slot(pointers)
        self._slot_pointer[slot] = pointers
        self._slot_id[slot] = ids

    def _slot(self, pointers: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        return ((pointers * self._MULTIPLIER) >> np.uint64(64 - self._bits)).astype(np.intp)

    def resolve(self, pointers: npt.NDArray[np.uint64]) -> npt.NDArray[np.int32]:
        """Name ids of the C strings at ``pointers`` (a NULL pointer is the name ``""``)."""
        with self._lock:
            slot = self._slot(pointers)
            ids = self._slot_id[slot]
            miss = np.flatnonzero(self._slot_pointer[slot] != pointers)
            if miss.size:
                distinct, where = np.unique(pointers[miss], return_inverse=True)
                before = len(self._by_pointer)
                found = np.array([self._pointer(int(p)) for p in distinct.tolist()], np.int32)
                ids[miss] = found[where]
                if len(self._by_pointer) != before:
                    self._rebuild()
        return ids

    def _pointer(self, pointer: int) -> int:
        j = self._by_pointer.get(pointer)
        if j is None:
            text = ctypes.string_at(pointer).decode(errors="replace") if pointer else ""
            j = self._by_pointer[pointer] = self._id(demangle(text))
        return j


# --- the walk ------------------------------------------------------------------------------------


def _cat(parts: Sequence[npt.NDArray[Any]]) -> _I64:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class _Records:
    """Records a walk met: word position, the chunk it was walked for, its rank there, its kind."""

    def __init__(self) -> None:
        self.pos = self.chunk = self.rank = np.zeros(0, np.int64)
        self.kind: npt.NDArray[Any] = np.zeros(0, np.int64)

    def take(self, parts: Sequence[tuple[_I64, _I64, npt.NDArray[Any]]]) -> None:
        """Concatenate per-step parts ``(positions, chunks, kinds)``: one record per walk and step."""
        self.pos = _cat([p for p, _, _ in parts])
        self.chunk = _cat([c for _, c, _ in parts])
        self.kind = _cat([k for _, _, k in parts])
        self.rank = _cat([np.full(p.size, r, np.int64) for r, (p, _, _) in enumerate(parts)])


class _Speculation(_Records):
    """The chunk walks: what they stepped on (records, and unknown words), exits, counts."""

    def __init__(self, exits: _I64) -> None:
        super().__init__()
        self.exits = exits
        self.count = np.zeros(exits.size, np.int64)


class _Repair(_Records):
    """The walks from chunk entries: per chunk an outcome and its word, and the records walked."""

    def __init__(self, outcome: _I64, at: _I64) -> None:
        super().__init__()
        self.outcome = outcome  # _MERGED (at: where it met a walk), _ENDED, _STOPPED (at: unknown), _LOST
        self.at = at


class _Walk:
    """Record positions (in 8-byte words of the memory) of a set of buffers; see the module docstring."""

    def __init__(self, kinds: npt.NDArray[np.uint32], steps: _I64, mark: npt.NDArray[np.uint8]) -> None:
        self.kinds = kinds  # the int32 kind field at every word (a strided view of the memory)
        self.steps = steps  # kind -> record words, 0 = unknown
        self.walk_steps = np.where(steps > 0, steps, 1)  # unknown words: one word on
        self.mark = mark  # one byte per word of the memory, all 0 between walks

    def run(  # noqa: PLR0915  (one vectorised walk of the buffers; its steps share the arrays)
        self, starts: _I64, ends: _I64
    ) -> tuple[list[tuple[_I64, _I64]], _I64]:
        """Records of each buffer ``[starts[b], ends[b])`` (in words), and where each one stopped.

        Returns:
            ``(records, stop)``: per buffer, its records' word positions and kinds, in order; ``stop[b]``
            is the word where its records end early (a record of unknown kind, or one cut by
            the buffer's end), or -1 when they tile the buffer exactly.
        """
        nb = starts.size
        longest = int(self.steps.max(initial=0))
        cb, cl, cbuf = self._chunks(starts, ends, max(longest + 1, 2))
        nc = cb.size
        if nc == 0:
            empty = np.zeros(0, np.int64)
            return [(empty, empty) for _ in range(nb)], np.full(nb, -1, np.int64)
        chunk = np.arange(nc, dtype=np.int64)
        first = np.ones(nc, bool)
        first[1:] = cbuf[1:] != cbuf[:-1]
        head = np.zeros(nb, np.int64)  # first chunk of each buffer
        head[cbuf[first]] = chunk[first]
        tail = np.zeros(nb, np.int64)  # last chunk of each buffer
        last = np.append(first[1:], True)
        tail[cbuf[last]] = chunk[last]
        walk = self._speculate(cb, cl)
        known = np.take(self.steps, walk.kind, mode="clip") > 0
        mark = self.mark
        recorded = walk.pos[known]
        mark[recorded] = 1
        # Every chunk's entry is taken to be where the previous chunk's walk left it (a buffer's
        # first chunk: the buffer's start); from there the true chain is walked, all chunks at
        # once, until it meets a recorded walk, the buffer's end or an unknown kind.
        entry = np.where(first, cb, np.roll(walk.exits, 1))
        rep = self._repair(entry, ends[cbuf])
        mark[recorded] = 0
        # The chunk holding each outcome's position: the true chain is walked up to there.
        upto = np.where(
            rep.outcome == _MERGED,
            np.minimum(head[cbuf] + (rep.at - starts[cbuf]) // CHUNK_WORDS, tail[cbuf]),
            tail[cbuf],
        )
        # A chunk inside another chunk's span took a wrong entry (that chunk's walk never met the
        # chain): the span's walk is the truth there. Spans longer than one chunk are rare.
        covered = np.zeros(nc, bool)
        floor = np.full(nc, _NEVER, np.int64)
        own = (rep.outcome == _MERGED) & (upto == chunk)
        floor[own] = rep.at[own]
        for c in np.flatnonzero(upto > chunk).tolist():
            if covered[c]:
                continue
            m = int(upto[c])
            covered[c + 1 : m + 1] = True
            floor[c + 1 : m + 1] = _NEVER
            if rep.outcome[c] == _MERGED:
                floor[m] = rep.at[c]
        valid = ~covered
        stop = np.full(nb, _NEVER, np.int64)
        hit = valid & (rep.outcome == _STOPPED)
        np.minimum.at(stop, cbuf[hit], rep.at[hit])
        # An unknown word on a true chain is a record of unknown kind: its buffer ends there.
        unknown = np.flatnonzero(~known)
        up, uc = walk.pos[unknown], walk.chunk[unknown]
        on_chain = up >= floor[uc]
        np.minimum.at(stop, cbuf[uc[on_chain]], up[on_chain])
        # Records in order, chunk by chunk: the chunk's own repair walk, then its walk from its
        # floor on (a suffix of what the walk stepped on: positions rise with the step number).
        # Unknown words past a floor are stops: they, and all after them, are cut below.
        kept = walk.pos >= floor[walk.chunk]
        dropped = np.bincount(walk.chunk[~kept], minlength=nc)
        rv = valid[rep.chunk]
        n_rep = np.bincount(rep.chunk[rv], minlength=nc)
        offset = np.concatenate([[0], np.cumsum(n_rep + walk.count - dropped)])
        total = int(offset[-1])
        pos = np.empty(total + 1, np.int64)  # the last slot takes what is not kept
        kind = np.empty(total + 1, np.int64)
        dst = np.where(kept, (offset[:-1] + n_rep - dropped)[walk.chunk] + walk.rank, total)
        pos[dst], kind[dst] = walk.pos, walk.kind
        dst = offset[rep.chunk[rv]] + rep.rank[rv]
        pos[dst], kind[dst] = rep.pos[rv], rep.kind[rv]
        size = np.take(self.steps, kind, mode="clip")
        out: list[tuple[_I64, _I64]] = []
        stops = np.where(stop == _NEVER, -1, stop)
        has = np.zeros(nb, bool)
        has[cbuf] = True
        for b in range(nb):
            lo, hi = (int(offset[head[b]]), int(offset[tail[b] + 1])) if has[b] else (0, 0)
            if stops[b] >= 0:
                hi = lo + int(np.searchsorted(pos[lo:hi], stops[b]))
            found, stops[b], fast = self._checked(
                pos[lo:hi], size[lo:hi], int(starts[b]), int(ends[b]), int(stops[b])
            )
            out.append((found, kind[lo : lo + found.size] if fast else self.kinds[found].astype(np.int64)))
        return out, stops

    def _checked(self, found: _I64, size: _I64, s: int, e: int, stop: int) -> tuple[_I64, int, bool]:
        """``found`` if it is the chain a record-by-record walk of ``[s, e)`` gives, else that walk's.

        ``size`` holds each found record's words. A record running past ``e`` (a truncated
        buffer) is dropped and becomes the stop. The flag is False when the scalar walk answered.
        """
        end = stop if stop >= 0 else e
        unknown_stop = stop < 0 or int(self.steps[min(int(self.kinds[stop]), _KIND_LIMIT - 1)]) == 0
        if found.size:
            nxt = found + size
            if found[0] == s and bool((nxt[:-1] == found[1:]).all()):
                if nxt[-1] > e and stop < 0:
                    return found[:-1], int(found[-1]), True
                if nxt[-1] == end and unknown_stop:
                    return found, stop, True
        elif s == end and unknown_stop:
            return found, stop, True
        log.debug("argus: CUPTI buffer at word %d walked record by record", s)
        return (*self._scalar(s, e), False)

    def _scalar(self, s: int, e: int) -> tuple[_I64, int]:
        """The reference walk: record by record from ``s``, until ``e`` or an unknown or cut record."""
        out: list[int] = []
        pos, top = s, _KIND_LIMIT - 1
        while pos < e:
            step = int(self.steps[min(int(self.kinds[pos]), top)])
            if step == 0 or pos + step > e:
                return np.asarray(out, np.int64), pos
            out.append(pos)
            pos += step
        return np.asarray(out, np.int64), -1

    def _repair(self, entry: _I64, ends: _I64) -> _Repair:
        """Walk the chain from every chunk's entry (all at once) until it meets a recorded walk."""
        n = entry.size
        out = _Repair(np.full(n, _LOST, np.int64), np.full(n, -1, np.int64))
        ids = np.flatnonzero(entry >= 0)
        pos, end = entry[ids], ends[ids]
        mark, rank = self.mark, 0
        parts: list[tuple[_I64, _I64, npt.NDArray[Any]]] = []
        while ids.size:
            ended = pos >= end
            merged = ~ended
            merged[merged] = mark[pos[merged]] == 1
            step = np.zeros(ids.size, np.int64)
            kind = np.zeros(ids.size, np.int64)
            going = ~(ended | merged)
            kind[going] = self.kinds[pos[going]]
            step[going] = np.take(self.steps, kind[going], mode="clip")
            stopped = going & (step == 0)
            going &= ~stopped
            for flag, code in ((merged, _MERGED), (ended, _ENDED), (stopped, _STOPPED)):
                if flag.any():
                    out.outcome[ids[flag]] = code
                    out.at[ids[flag]] = pos[flag]
            if not going.any():
                break
            ids, pos, step, end, kind = ids[going], pos[going], step[going], end[going], kind[going]
            parts.append((pos, ids, kind))
            pos = pos + step
            rank += 1
        out.take(parts)
        return out

    def _speculate(self, cb: _I64, cl: _I64) -> _Speculation:
        """All chunk walks at once, one record (or unknown word) per walk and step.

        An unknown word advances its walk by one word; every walk ends within its chunk's
        words, so the loop runs at most :data:`CHUNK_WORDS` (plus a record) times.
        """
        kinds, steps = self.kinds, self.walk_steps
        out = _Speculation(np.full(cb.size, -1, np.int64))
        ids = np.arange(cb.size, dtype=np.int64)
        pos, lim = cb.copy(), cl.copy()
        parts: list[tuple[_I64, _I64, npt.NDArray[Any]]] = []
        t = 0
        while ids.size:
            kind = kinds[pos]
            step = np.take(steps, kind, mode="clip")
            parts.append((pos, ids, kind))
            pos = pos + step
            t += 1
            finished = pos >= lim
            if finished.any():
                done = ids[finished]
                out.exits[done] = pos[finished]
                out.count[done] = t
                keep = ~finished
                ids, pos, lim = ids[keep], pos[keep], lim[keep]
        out.take(parts)
        return out

    @staticmethod
    def _chunks(starts: _I64, ends: _I64, tail: int) -> tuple[_I64, _I64, _I64]:
        """Chunk begin, limit and buffer of every chunk; a buffer's last chunk is at least ``tail`` long."""
        begins, limits, owners = [], [], []
        for b, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            if e <= s:
                continue
            cuts = np.arange(s, e, CHUNK_WORDS, dtype=np.int64)
            if cuts.size > 1 and e - cuts[-1] < tail:
                cuts = cuts[:-1]
            lim = np.append(cuts[1:], e)
            begins.append(cuts)
            limits.append(lim)
            owners.append(np.full(cuts.size, b, np.int64))
        if not begins:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return np.concatenate(begins), np.concatenate(limits), np.concatenate(owners)


# --- the decoder ---------------------------------------------------------------------------------


class NativeDecoder:
    """Decodes activity buffers held in one memory array into :class:`Decoded` columns.

    Args:
        sizes: CUpti_ActivityKind → record bytes, for the kinds the buffers may hold
            (measured from libcupti by the live source, or cupti-python's dtype sizes).
            Kinds missing here end what can be walked of a buffer (see ``walker``).
        names: The name table rows refer to (shared across decodes: names are resolved once).
        walker: libcupti's record walk, for buffers the decoder cannot walk itself; the sizes it
            shows are learned.

    Raises:
        ValueError: a size is not a positive multiple of 8, or shorter than the layout of its kind.
    """

    def __init__(
        self, sizes: Mapping[int, int], names: NameTable | None = None, walker: Walker | None = None
    ) -> None:
        self.sizes: dict[int, int] = {}
        self.names = names if names is not None else NameTable()
        self.walker = walker
        self._steps = np.zeros(_KIND_LIMIT, np.int64)
        self._mark: npt.NDArray[np.uint8] | None = None
        self._lock = threading.Lock()
        self.learn(sizes)

    def learn(self, sizes: Mapping[int, int]) -> None:
        """Add or confirm record sizes (bytes per kind).

        Raises:
            ValueError: as for the constructor, or a size that differs from one already known.
        """
        for kind, size in sizes.items():
            if not 0 <= kind < _KIND_LIMIT - 1 or size < 16 or size % 8:
                raise ValueError(
                    f"CUPTI record kind {kind}: size {size} is not a multiple of 8 of 16 or more"
                )
            layout = LAYOUTS.get(kind)
            if layout is not None and size < layout.min_size:
                raise ValueError(
                    f"CUPTI record kind {kind}: {size} bytes, shorter than the {layout.min_size} "
                    "bytes of the fields Argus reads (an older CUPTI?)"
                )
            known = self.sizes.get(kind)
            if known is not None and known != size:
                raise ValueError(f"CUPTI record kind {kind}: size {size} bytes, was {known}")
            self.sizes[kind] = size
            self._steps[kind] = size // 8

    def decode(self, memory: npt.NDArray[np.uint8], buffers: Sequence[Buffer], offset_ns: int = 0) -> Decoded:
        """Decode ``buffers`` (oldest first) of ``memory`` on this thread.

        Args:
            memory: uint8 array holding the buffers (the live source's buffer pool).
            buffers: ``(start byte, valid bytes)`` per buffer; starts are multiples of 8.
            offset_ns: Added to CUPTI timestamps to get ns since the epoch.

        Returns:
            :class:`Decoded` rows in the order :func:`argus.agent.cupti.decode` gives them.

        Raises:
            ValueError: a buffer outside ``memory`` or not 8-byte aligned.
        """
        words = memory.size // 8
        starts = np.array([s for s, _ in buffers], np.int64)
        valid = np.array([v for _, v in buffers], np.int64)
        if (
            (starts % 8).any()
            or (starts < 0).any()
            or (valid < 0).any()
            or (starts + valid > memory.size).any()
        ):
            raise ValueError("CUPTI buffers must lie inside the memory and start on 8-byte boundaries")
        with self._lock:
            if self._mark is None or self._mark.size != words:
                self._mark = np.zeros(words, np.uint8)
            walk = _Walk(memory[: words * 8].view(np.uint32)[::2], self._steps, self._mark)
            records, stop = walk.run(starts // 8, (starts + valid) // 8)
            refused = 0
            for b, (s, v) in enumerate(buffers):
                if stop[b] < 0 and v % 8 == 0:
                    continue
                redo = self._libcupti_walk(memory, s, v) if self.walker is not None else None
                if redo is not None:
                    records[b] = (redo, walk.kinds[redo].astype(np.int64))
                else:
                    refused += 1
            pos, kind = _cat([p for p, _ in records]), _cat([k for _, k in records])
            out = self._columns(_Memory(memory), pos, kind, offset_ns)
            out.refused = refused
            return out

    def _libcupti_walk(self, memory: npt.NDArray[np.uint8], start: int, valid: int) -> _I64 | None:
        """Word positions of a buffer's records as libcupti walks it; learns their kinds' sizes."""
        assert self.walker is not None
        try:
            offsets = np.asarray(self.walker(memory.ctypes.data + start, valid), np.int64)
        except Exception:
            log.warning("argus: libcupti could not walk an activity buffer", exc_info=True)
            return None
        if offsets.size == 0:
            return offsets
        words = (offsets + start) // 8
        kinds = memory[: memory.size // 8 * 8].view(np.uint32)[::2][words].astype(np.int64)
        ends = np.append(offsets[1:], valid)
        learned: dict[int, int] = {}
        for kind, size in zip(kinds[:-1].tolist(), (ends - offsets)[:-1].tolist(), strict=True):
            if kind < _KIND_LIMIT and kind not in self.sizes:
                learned.setdefault(kind, size)
        try:
            self.learn(learned)
        except ValueError:
            log.warning("argus: CUPTI record sizes are not what Argus can read", exc_info=True)
        log.info("argus: CUPTI record sizes (bytes per kind): %s", dict(sorted(self.sizes.items())))
        return words

    def _columns(self, mem: _Memory, pos: _I64, kind: _I64, offset_ns: int) -> Decoded:
        """Gather the rows of the records at word positions ``pos``, event by event, batch by batch."""
        # What each kind becomes: an event (0, 1, 2), external correlation (-1), or skipped (-2).
        event_of = np.full(_KIND_LIMIT + 1, -2, np.int8)
        layouts: dict[int, list[int]] = {}
        for k, layout in LAYOUTS.items():
            if self.sizes.get(k, 0) >= layout.min_size:
                event_of[k] = layout.event
                layouts.setdefault(layout.event, []).append(k)
        event = np.take(event_of, kind, mode="clip")
        order = np.argsort(event, kind="stable")  # by event, each in record order (a radix sort)
        pos, kind = pos[order], kind[order]
        counts = np.bincount(event.astype(np.int64) + 2, minlength=5).tolist()
        bounds = np.cumsum([0, *counts]).tolist()
        cols = _Columns(counts[2:])
        cols.skipped = counts[0]
        for k in layouts.get(-1, []):
            ext = pos[bounds[1] : bounds[2]]
            corr = mem.gather(ext, LAYOUTS[k], "correlation", np.empty(ext.size, np.int64))
            ids = mem.gather(ext, LAYOUTS[k], "external_id", np.empty(ext.size, np.uint64))
            cols.external = corr, ids
        for e in (0, 1, 2):
            p, kp = pos[bounds[e + 2] : bounds[e + 3]], kind[bounds[e + 2] : bounds[e + 3]]
            kinds = layouts.get(e, [])
            single = len({id(LAYOUTS[k]) for k in kinds}) == 1
            for lo in range(0, p.size, _BATCH):
                q = p[lo : lo + _BATCH]
                if single:
                    cols.add(e, mem, q, LAYOUTS[kinds[0]], offset_ns)
                    continue
                # Several layouts in one event (memcpy, peer-to-peer memcpy): by layout, then re-sorted.
                kq, begin = kp[lo : lo + _BATCH], cols.fill[e]
                for k in kinds:
                    if (part := kq == k).any():
                        cols.add(e, mem, q[part], LAYOUTS[k], offset_ns, keep_pos=True)
                cols.reorder(e, begin)
        k0, k1 = cols.region(0)
        cols.name_id[k0:k1] = self.names.resolve(cols.pointer[k0:k1])
        out = cols.finish()
        out.names = self.names.names
        return out


#: Records gathered per step of :meth:`NativeDecoder._columns` (their leading bytes stay in cache).
_BATCH = 1 << 13


class _Memory:
    """Field gathers from the buffers' memory (one numpy pass per field, straight into the output)."""

    def __init__(self, memory: npt.NDArray[np.uint8]) -> None:
        self.u64 = memory[: memory.size // 8 * 8].view(np.uint64)

    def gather(self, pos: _I64, layout: Layout, name: str, out: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Field ``name`` of the records at word positions ``pos``, into 8-byte ``out`` (returned)."""
        offset, dtype = layout.fields[name]
        dest = out.view(np.uint64)
        np.take(self.u64, pos + offset // 8, out=dest, mode="clip")
        low, bits = 8 * (offset % 8), 8 * np.dtype(dtype).itemsize
        if low:
            np.right_shift(dest, np.uint64(low), out=dest)
        if low + bits < 64:
            np.bitwise_and(dest, np.uint64((1 << bits) - 1), out=dest)
        return out


class _Columns:
    """Output columns, one region per event (kernels, memcpys, memsets) filled batch by batch.

    Rows with unusable timestamps are left out and counted.
    """

    _NAMES = (
        "name_id",
        "pointer",
        "pos",
        "stream",
        "device",
        "correlation",
        "start_ns",
        "dur_ns",
        "graph_id",
        "graph_node_id",
    )

    def __init__(self, counts: list[int]) -> None:
        size = sum(counts)
        self.begin = [0, counts[0], counts[0] + counts[1]]
        self.fill = list(self.begin)
        self.dropped = 0
        self.skipped = 0
        self.external = (np.zeros(0, np.int64), np.zeros(0, np.uint64))
        self.name_id = np.empty(size, np.int32)
        self.pointer = np.empty(size, np.uint64)
        self.pos = np.empty(size, np.int64)
        self.stream, self.device, self.correlation, self.start_ns, self.dur_ns, self.graph_id = (
            np.empty(size, np.int64) for _ in range(6)
        )
        self.graph_node_id = np.empty(size, np.int64)

    def region(self, event: int) -> tuple[int, int]:
        return self.begin[event], self.fill[event]

    def add(
        self, event: int, mem: _Memory, pos: _I64, layout: Layout, offset_ns: int, keep_pos: bool = False
    ) -> None:
        """Append the rows of the records at ``pos`` (one layout) to ``event``'s region."""
        w0 = self.fill[event]
        w = slice(w0, w0 + pos.size)
        start = mem.gather(pos, layout, "start", self.start_ns[w])
        end = mem.gather(pos, layout, "end", self.dur_ns[w])
        ok = (start > 0) & (end > 0) & (end >= start)
        kept = int(np.count_nonzero(ok))
        self.dropped += pos.size - kept
        if kept < pos.size:
            sel = np.flatnonzero(ok)
            pos = pos[sel]
            w = slice(w0, w0 + kept)
            self.start_ns[w], self.dur_ns[w] = start[sel], end[sel]
            start, end = self.start_ns[w], self.dur_ns[w]
        np.subtract(end, start, out=end)
        np.add(start, offset_ns, out=start)
        if keep_pos:
            self.pos[w] = pos
        for name in ("stream", "device", "correlation", "graph_id", "graph_node_id"):
            mem.gather(pos, layout, name, getattr(self, name)[w])
        if "name" in layout.fields:
            mem.gather(pos, layout, "name", self.pointer[w])
        elif "copy_kind" in layout.fields:
            kinds = mem.gather(pos, layout, "copy_kind", np.empty(pos.size, np.int64))
            self.name_id[w] = np.minimum(kinds, len(MEMCPY_NAMES) - 1)
        else:
            self.name_id[w] = NameTable.MEMSET
        self.fill[event] += kept

    def reorder(self, event: int, begin: int) -> None:
        """Put ``event``'s rows from ``begin`` on back in record order (after a split by layout)."""
        w = slice(begin, self.fill[event])
        order = np.argsort(self.pos[w], kind="stable")
        for name in self._NAMES:
            column = getattr(self, name)
            column[w] = column[w][order]

    def finish(self) -> Decoded:
        """The columns as a :class:`Decoded`: regions moved together (left-out rows leave gaps)."""
        out = Decoded()
        (out.external_correlation, out.external_id), out.dropped = self.external, self.dropped
        out.skipped = self.skipped
        kind = np.empty(sum(f - b for b, f in zip(self.begin, self.fill, strict=True)), np.uint8)
        n = 0
        for e in (0, 1, 2):
            b, f = self.begin[e], self.fill[e]
            kind[n : n + f - b] = e
            if b != n:
                for name in self._NAMES:
                    column = getattr(self, name)
                    column[n : n + f - b] = column[b:f]
            n += f - b
        out.kind, out.name_id = kind, self.name_id[:n]
        out.stream, out.device, out.correlation = self.stream[:n], self.device[:n], self.correlation[:n]
        out.start_ns, out.dur_ns = self.start_ns[:n], self.dur_ns[:n]
        out.graph_id, out.graph_node_id = self.graph_id[:n], self.graph_node_id[:n]
        return out
