"""L5, stacks (docs/design.md §6.12): which diagnoses get a stack capture, and what the stacks say.

- **When.** A diagnosis that is open with a host-side cause (:data:`STACK_CAUSES`) gets a
  capture request when it opens, when its cause changes, and then at most once per
  ``interval`` while it stays open (``--stack-interval-s``, default
  :data:`argus.config.DEFAULT_STACK_INTERVAL_S`). The request (a ``stack_requests`` row) names
  the diagnosis's ranks (at most :data:`MAX_FLAGGED`) and one healthy peer of the same role
  (:func:`pick_peer`); an ``unresponsive`` one asks for a blocking dump with native frames
  (a hung rank may never run the Python code a non-blocking sampler would catch moving).
  Collectors pass pending requests to the node agents (:mod:`argus.collector.captures`). The
  store is the only memory: what was asked last is read back, so a restarted analyzer (or
  another one) asks again only when the interval has passed.
- **What.** :func:`compare` compares the flagged rank's samples with the peer's of the same
  capture, **by line** and **per thread**: per ``(function, file, line)``, the share of the
  rank's samples (one sample: one look at every thread of the process) in which one thread's
  stack holds it, against the same thread's on the peer. The lines of the *stalling thread*
  (the thread whose time the diagnosis is about: the training thread, the DataLoader workers of
  a ``dataloader`` diagnosis, or a thread holding the GIL the training thread waits for; how it
  is picked: :func:`compare`) whose share most exceeds the peer's come first. A thread only the
  flagged rank has and that waits throughout (Lightning's launcher watcher on rank 0) never
  leads. Argus's own threads (``argus-…``) are left out, and so are the probe's wrapper frames
  in the training threads (the ``wait``/c10d wrappers of ``argus/agent/collectives.py``,
  :func:`_probe_frame`): they sit between the user's collective and torch's in every stack that
  waits in one, so a rank waiting more would show Argus's frame where the collective's belongs.
  Each version of the diagnosis written after the stacks are stored carries them as
  ``evidence.top_frames`` (with ``evidence.stacks``: the capture, its sampler, the ranks
  compared, the thread, and ``why_no_frames`` when the list is empty).
- **Bad rows.** Labels are parsed in linear time (:func:`parse_label`); a row with a label past
  the stack limits of :mod:`argus.limits` (which ingest refuses; an older store may hold some)
  is skipped and counted (:attr:`Stacks.skipped_rows`).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from argus.analyzer.roles import Roles
from argus.config import DEFAULT_STACK_INTERVAL_S, DEFAULT_STACK_SECONDS
from argus.diagnosis import Cause, Diagnosis, State
from argus.limits import MAX_FRAME_LABEL_BYTES, MAX_FRAME_LINE
from argus.schema import wire_table
from argus.store import Store

__all__ = [
    "MAX_FLAGGED",
    "STACK_CAUSES",
    "Comparison",
    "Frame",
    "Sampled",
    "StackRequest",
    "Stacks",
    "compare",
    "parse_label",
    "pick_peer",
    "thread_key",
    "top_frames",
]

log = logging.getLogger(__name__)

#: Causes whose diagnoses get stacks: the rank's host is where the time goes.
STACK_CAUSES = frozenset(
    {Cause.HOST_STALL, Cause.DATALOADER, Cause.COMPUTE, Cause.UNKNOWN, Cause.UNRESPONSIVE}
)
#: Ranks of one diagnosis sampled at most (a many-rank diagnosis: its lowest ranks).
MAX_FLAGGED = 4
#: Top frames kept in the evidence.
TOP_FRAMES = 5
#: A fault whose latest window ended longer ago than this is not sampled (its rank moved on), ns.
STALE_NS = 60 * 10**9
#: The in-process sampler's name (``stacks.sampler``): its rows cannot tell idle samples.
_IN_PROCESS = "in-process"
#: The probe's module that wraps c10d calls (``argus/agent/collectives.py``; ``agent/…`` from a
#: source checkout), and the functions of it that run in a training thread's stack.
_PROBE_FILE = re.compile(r"(^|/)agent/collectives\.py$")
_PROBE_FUNCTIONS = ("_wrap_", "argus_comm_hook", "recorded_allreduce")


@dataclass(frozen=True)
class StackRequest:
    """One capture the analyzer asks for (a ``stack_requests`` row)."""

    request_id: str
    job_id: str
    diagnosis_id: str
    cause: str
    flagged: tuple[int, ...]
    #: The healthy peer, -1 when none.
    peer: int
    duration_ms: int
    blocking: bool
    requested_ns: int

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks to sample: flagged, then the peer."""
        return self.flagged + ((self.peer,) if self.peer >= 0 else ())


def pick_peer(flagged: Sequence[int], ranks: Sequence[int], busy: set[int], roles: Roles | None) -> int:
    """A healthy peer of ``flagged[0]``: a rank of the same role, in no open diagnosis (``busy``).

    The nearest rank number wins (deterministic); without one of the same role, the nearest
    healthy rank of any role; -1 when every rank is flagged or busy.
    """
    first = flagged[0]
    healthy = [r for r in sorted(set(ranks)) if r not in flagged and r not in busy]
    if not healthy:
        return -1
    if roles is not None:
        role = roles.of(np.array([first], np.int64))[0]
        same = [r for r, q in zip(healthy, roles.of(np.array(healthy, np.int64)), strict=True) if q == role]
        healthy = same or healthy
    return min(healthy, key=lambda r: (abs(r - first), r))


def _probe_frame(function: str, file: str) -> bool:
    """True for a frame of Argus's probe wrapping a c10d call (left out of the ranking)."""
    return function.startswith(_PROBE_FUNCTIONS) and _PROBE_FILE.search(file) is not None


class Sampled(NamedTuple):
    """Samples that found one thread in one stack (a ``stacks`` row, summed over a capture)."""

    thread: str
    #: Root to leaf, ``;``-joined ``function (file:line)``.
    frames: str
    #: Samples that found it so.
    samples: int
    #: The thread was not running in these samples (py-spy's; the in-process sampler cannot tell).
    idle: bool = False


#: A frame compared by line: (function, file, line); line 0 and file "" where the label has none.
Frame = tuple[str, str, int]


def parse_label(label: str) -> Frame | None:
    """``function (file:line)`` → (function, file, line), in time linear in the label's length.

    A label without ``(file:line)`` (a native frame py-spy could not place) is ``(label, "", 0)``.

    Returns:
        None for a label past the stack limits of :mod:`argus.limits` (longer than
        ``max_frame_label_bytes``, or a line number past ``max_frame_line``): ingest refuses such
        rows; a store written before it did may hold some, and their rows are skipped.
    """
    if len(label) > MAX_FRAME_LABEL_BYTES or len(label.encode()) > MAX_FRAME_LABEL_BYTES:
        return None
    if label.endswith(")"):
        head, colon, digits = label[:-1].rpartition(":")
        if colon and digits.isascii() and digits.isdigit():
            function, paren, file = head.rpartition(" (")
            if paren:
                if len(digits) > len(str(MAX_FRAME_LINE)) or int(digits) > MAX_FRAME_LINE:
                    return None
                return function, file, int(digits)
    return label, "", 0


def _frames(frames: str) -> list[Frame] | None:
    """A row's frames, root to leaf, without the probe's wrappers; None when a label is past the
    limits (:func:`parse_label`)."""
    out = []
    for label in frames.split(";") if frames else []:
        frame = parse_label(label)
        if frame is None:
            return None
        if not _probe_frame(frame[0], frame[1]):
            out.append(frame)
    return out


def _samples(rows: Sequence[Sampled]) -> int:
    """Samples of a capture: those of its most sampled thread (each sample sees every thread once)."""
    per_thread: Counter[str] = Counter()
    for r in rows:
        per_thread[r.thread] += r.samples
    return max(per_thread.values(), default=0)


_WORKER = re.compile(r" \[pid \d+\]$")
_NUMBER = re.compile(r"\d+")


def thread_key(name: str) -> str:
    """The name a thread is compared under across ranks: numbers made ``#`` (``Thread-3 (run)``
    and ``Thread-4 (run)`` are one thread counted differently on two ranks), and a DataLoader
    worker's ``name [pid N]`` made ``name [worker]`` (every worker process of a rank is one)."""
    worker = _WORKER.search(name) is not None
    base = _NUMBER.sub("#", _WORKER.sub("", name))
    return f"{base} [worker]" if worker else base


@dataclass(frozen=True)
class _Thread:
    """One thread (key) of one rank's capture: per frame, the share of the rank's samples in which
    the thread's stack holds it, the frames above it in every such stack, its deepest position
    (0: the root); ``running``: the shares counting only the samples in which it ran (not idle)."""

    shares: dict[Frame, float]
    ancestors: dict[Frame, set[Frame]]
    depth: dict[Frame, int]
    running: dict[Frame, float]


def _threads(rows: Sequence[Sampled], total: int) -> dict[str, _Thread]:
    holding: dict[str, Counter[Frame]] = defaultdict(Counter)
    ancestors: dict[str, dict[Frame, set[Frame]]] = defaultdict(dict)
    depth: dict[str, dict[Frame, int]] = defaultdict(dict)
    running: dict[str, Counter[Frame]] = defaultdict(Counter)
    for r in rows:
        if r.thread.startswith("argus-"):
            continue
        frames = _frames(r.frames) or []
        key = thread_key(r.thread)
        holding.setdefault(key, Counter())  # every thread seen has an entry, even one with no frame
        above: set[Frame] = set()
        out = ancestors[key]
        for i, f in enumerate(frames):
            out[f] = out[f] & above if f in out else set(above)
            above.add(f)
            depth[key][f] = max(depth[key].get(f, 0), i)
        for f in set(frames):
            holding[key][f] += r.samples
            if not r.idle:
                running[key][f] += r.samples
    return {
        key: _Thread(
            {f: min(n / total, 1.0) for f, n in holding[key].items()} if total else {},
            ancestors[key],
            depth[key],
            {f: min(n / total, 1.0) for f, n in running[key].items()} if total else {},
        )
        for key in holding
    }


def _carried(
    excess: dict[Frame, float],
    shares: dict[Frame, float],
    ancestors: dict[Frame, set[Frame]],
    samples: int,
) -> dict[Frame, float]:
    """The frames whose excess one frame below them carries: per such frame, that frame's excess.

    A caller's share holds its callees'; a callee that holds most of the caller's excess (more
    than half of it, or all of it within the sampling error: the binomial standard error of the
    caller's share over ``samples`` samples) says the same, more precisely: a slow read under the
    DataLoader's ``__next__``, where some of the caller's samples fell in its own code, its other
    callees or a dump torn between two frames. A callee with less than half leaves the caller to
    lead: the caller's own time is then most of what sets the rank apart.
    """
    below: dict[Frame, list[Frame]] = defaultdict(list)
    for d, above in ancestors.items():
        for a in above:
            below[a].append(d)
    carriers: dict[Frame, list[Frame]] = {}
    for a, callees in below.items():
        s = shares.get(a, 0.0)
        error = (s * (1 - s) / samples) ** 0.5 if samples else 0.0
        found = [
            d
            for d in callees
            if excess.get(d, 0.0) > 0 and (excess[d] >= excess[a] - error or 2 * excess[d] > excess[a])
        ]
        if found and excess.get(a, 0.0) > 0:
            carriers[a] = found
    # The excess that ranks a carried caller is its most specific carrier's: one carried itself by
    # none (the read, not the fetch between it and ``__next__``).
    return {
        a: max(excess[d] for d in ([d for d in found if d not in carriers] or found))
        for a, found in carriers.items()
    }


@dataclass(frozen=True)
class Comparison:
    """What sets a flagged rank's stacks apart from its peer's (:func:`compare`).

    Attributes:
        frames: The top frames, ``{"function", "file", "line", "share", "peer_share"}`` each.
        thread: The thread they are of (its :func:`thread_key`), None when none was picked.
        why: Why ``frames`` is empty (one sentence), None when it is not.
    """

    frames: list[dict[str, Any]]
    thread: str | None
    why: str | None


def _excess(mine: _Thread, theirs: _Thread | None) -> dict[Frame, float]:
    return {f: s - (theirs.shares.get(f, 0.0) if theirs else 0.0) for f, s in mine.shares.items()}


def compare(
    flagged: Sequence[Sampled | tuple[str, str, int]],
    peer: Sequence[Sampled | tuple[str, str, int]],
    *,
    cause: str | None = None,
    idle_known: bool = True,
    n: int = TOP_FRAMES,
) -> Comparison:
    """The lines of code that set the flagged rank's stacks apart from its peer's, in the thread
    whose time the diagnosis is about.

    Frames are compared **by line** ``(function, file, line)`` and **per thread**: the flagged
    rank's thread against the peer's thread of the same :func:`thread_key`. The stalling thread
    is picked thus:

    1. The candidates: every thread but Argus's own (``argus-…``); for a ``dataloader``
       diagnosis the rank's DataLoader worker processes when it has any (their time is what the
       training thread waits for), else every thread.
    2. A thread present on the flagged rank and not on its peer (there by construction, as
       Lightning's launcher watcher on rank 0) has no peer to be compared with: it is a candidate
       only by what it holds while it runs (py-spy's ``active``): its idle samples cost the
       training thread nothing, so a thread that waits (polling now and then) scores its few
       running samples only. The in-process sampler cannot tell idle samples, so under it such a
       thread is no candidate.
    3. Of the candidates, the thread with the largest excess at one line (``share -
       peer_share``) leads: the training thread stalled at a line its peer does not stall at,
       or a thread that holds the GIL at a line its peer's thread does not run, while the
       training thread waits for the GIL (the holder's excess is at one line, the waiter's is
       spread over its whole step). Ties go to ``MainThread``, then by name.

    Within that thread the lines whose excess is largest come first; a caller line whose excess
    a frame below it carries (:func:`_carried`) comes right after that frame; ties (a hung rank's
    one dump holds every frame of its stack in every sample) go to Python code before native
    frames, then to the frame nearest the leaf: the deepest frame with a file and line.

    Args:
        flagged: The flagged rank's rows of one capture (:class:`Sampled`, or ``(thread, frames,
            count)``).
        peer: The peer's rows of the same capture (empty: no peer; shares are then the rank's own).
        cause: The diagnosis's cause (``dataloader`` looks at the workers).
        idle_known: The rows tell idle samples (py-spy's do; the in-process sampler's do not).
        n: How many frames to keep.
    """
    mine_rows = [Sampled(*r) for r in flagged]
    peer_rows = [Sampled(*r) for r in peer]
    total = _samples(mine_rows)
    mine = _threads(mine_rows, total)
    theirs = _threads(peer_rows, _samples(peer_rows))
    if not mine:
        return Comparison([], None, "the capture holds no stack of the rank's threads")
    candidates = set(mine)
    workers = {t for t in candidates if t.endswith(" [worker]")}
    if cause == "dataloader" and workers:
        candidates = workers
    lone = {t for t in candidates if peer_rows and t not in theirs}
    if not idle_known:
        candidates -= lone
    # A lone thread (no peer thread to compare with) counts what it holds while it runs.
    mine = {t: replace(m, shares=m.running) if t in lone else m for t, m in mine.items()}
    scored = []
    for t in candidates:
        excess = _excess(mine[t], theirs.get(t))
        top = max(excess.values(), default=0.0)
        if top > 0:
            scored.append((-top, t != "MainThread", t))
    if not scored:
        if not peer_rows:
            return Comparison([], None, f"the rank's stacks hold no frame ({total} samples, no peer sampled)")
        return Comparison(
            [], None, f"no line is held more often in the rank's stacks than in its peer's ({total} samples)"
        )
    thread = min(scored)[2]
    me = mine[thread]
    excess = _excess(me, theirs.get(thread))
    carried = _carried(excess, me.shares, me.ancestors, total)
    ranked = sorted(
        excess,
        key=lambda f: (
            -carried.get(f, excess[f]),
            not f[1].endswith(".py"),
            f in carried,
            -me.depth.get(f, 0),
            f,
        ),
    )
    other = theirs.get(thread)
    frames = [
        {
            "function": f[0],
            "file": f[1],
            "line": f[2],
            "share": round(me.shares[f], 4),
            "peer_share": round(other.shares.get(f, 0.0) if other else 0.0, 4),
        }
        for f in ranked[:n]
        if excess[f] > 0
    ]
    return Comparison(frames, thread, None)


def top_frames(
    flagged: Sequence[Sampled | tuple[str, str, int]],
    peer: Sequence[Sampled | tuple[str, str, int]],
    n: int = TOP_FRAMES,
    *,
    cause: str | None = None,
) -> list[dict[str, Any]]:
    """The lines that set the flagged rank's stacks apart from its peer's: :func:`compare`'s frames.

    Returns:
        Up to ``n`` dicts ``{"function", "file", "line", "share", "peer_share"}``, the largest
        ``share - peer_share`` first, each > 0: ``share`` is the fraction (0-1) of the flagged
        rank's samples in which the stalling thread was at that line.
    """
    return compare(flagged, peer, cause=cause, n=n).frames


class Stacks:
    """The analyzer's L5 around the store: asks for captures, puts their top frames in the evidence.

    Args:
        store: Where ``stack_requests`` are written and ``stacks`` read.
        interval_s: Seconds between two captures of one open diagnosis.
        seconds: How long each capture samples.
    """

    def __init__(
        self,
        store: Store,
        interval_s: float = DEFAULT_STACK_INTERVAL_S,
        seconds: float = DEFAULT_STACK_SECONDS,
    ) -> None:
        self.store = store
        self.interval_ns = int(interval_s * 1e9)
        self.duration_ms = int(seconds * 1000)
        #: ``stacks`` rows read and skipped so far (a frame past the limits; a store written
        #: before ingest refused them).
        self.skipped_rows = 0

    def requests(
        self,
        changed: Sequence[Diagnosis],
        open_: Sequence[Diagnosis],
        ranks: Sequence[int],
        roles: Roles | None,
        now_ns: int,
        window_ns: int,
    ) -> list[StackRequest]:
        """The captures due for ``changed`` diagnoses (nothing written; see :meth:`write`).

        Args:
            changed: Diagnoses written by this window.
            open_: Every open diagnosis of the job (their ranks are no healthy peers).
            ranks: The job's ranks that report.
            roles: Their roles, or None when not known yet.
            now_ns: The present, ns since the epoch.
            window_ns: The analysis window, ns.

        Raises:
            StoreError: reading the earlier requests failed.
        """
        wanted = [
            d
            for d in changed
            if d.state == State.OPEN.value
            and d.cause in STACK_CAUSES
            and (d.ranks or d.rank is not None)
            and now_ns - (d.last_window_ns + window_ns) < STALE_NS
        ]
        if not wanted:
            return []
        last = self._last_requests(wanted[0].job_id, [d.id for d in wanted])
        busy = {r for d in open_ for r in d.ranks}
        out = []
        for d in wanted:
            before = last.get(d.id)
            if before is not None and before[0] == d.cause and now_ns - before[1] < self.interval_ns:
                continue
            first = [d.rank] if d.rank is not None else []
            flagged = tuple(first + [r for r in sorted(d.ranks) if r != d.rank])[:MAX_FLAGGED]
            out.append(
                StackRequest(
                    request_id=uuid.uuid4().hex,
                    job_id=d.job_id,
                    diagnosis_id=d.id,
                    cause=d.cause,
                    flagged=flagged,
                    peer=pick_peer(flagged, ranks, busy, roles),
                    duration_ms=self.duration_ms,
                    blocking=d.cause == Cause.UNRESPONSIVE,
                    requested_ns=now_ns,
                )
            )
        return out

    def write(self, requests: Sequence[StackRequest]) -> None:
        """Store ``requests`` (``stack_requests`` rows) for collectors to pass on.

        Raises:
            StoreError: the insert failed.
        """
        by_job: dict[str, list[StackRequest]] = defaultdict(list)
        for r in requests:
            by_job[r.job_id].append(r)
        for job_id, rs in by_job.items():
            table = wire_table(
                "stack_requests",
                {
                    "request_id": [r.request_id for r in rs],
                    "diagnosis_id": [r.diagnosis_id for r in rs],
                    "cause": [r.cause for r in rs],
                    "ranks": [list(r.ranks) for r in rs],
                    "flagged": [list(r.flagged) for r in rs],
                    "peer": [r.peer for r in rs],
                    "duration_ms": [r.duration_ms for r in rs],
                    "blocking": [int(r.blocking) for r in rs],
                    "requested_ns": [r.requested_ns for r in rs],
                },
                job_id=job_id,
            )
            self.store.insert("stack_requests", table)

    def with_top_frames(self, diagnoses: Sequence[Diagnosis]) -> list[Diagnosis]:
        """``diagnoses`` with ``evidence.top_frames`` and ``evidence.stacks`` where stacks are stored.

        The newest capture of each diagnosis that has rows counts; a diagnosis without one is
        returned as it is.

        Raises:
            StoreError: a read failed.
        """
        if not diagnoses:
            return []
        job_id = diagnoses[0].job_id
        captures = self.store.query(
            "SELECT r.diagnosis_id AS diagnosis_id, r.request_id AS request_id, r.flagged AS flagged, "
            "r.peer AS peer FROM stack_requests AS r "
            "WHERE r.job_id = {job:String} AND r.diagnosis_id IN {ids:Array(String)} "
            "AND r.request_id IN (SELECT DISTINCT capture_id FROM stacks WHERE job_id = {job:String}) "
            "ORDER BY r.requested_ns DESC LIMIT 1 BY r.diagnosis_id",
            {"job": job_id, "ids": [d.id for d in diagnoses]},
        ).to_pylist()
        if not captures:
            return list(diagnoses)
        rows = self.store.query(
            "SELECT capture_id, rank, sampler, time_ns, thread, frames, idle, sum(count) AS n FROM stacks "
            "WHERE job_id = {job:String} AND capture_id IN {ids:Array(String)} "
            "GROUP BY capture_id, rank, sampler, time_ns, thread, frames, idle",
            {"job": job_id, "ids": [c["request_id"] for c in captures]},
        )
        out, skipped = _attach(diagnoses, captures, rows)
        if skipped:
            log.warning("job %s: %d stacks row(s) past the stack limits skipped", job_id, skipped)
            self.skipped_rows += skipped
        return out

    def _last_requests(self, job_id: str, ids: list[str]) -> dict[str, tuple[str, int]]:
        got = self.store.query(
            "SELECT diagnosis_id, cause, requested_ns FROM stack_requests "
            "WHERE job_id = {job:String} AND diagnosis_id IN {ids:Array(String)} "
            "ORDER BY requested_ns DESC LIMIT 1 BY diagnosis_id",
            {"job": job_id, "ids": ids},
        ).to_pylist()
        return {str(r["diagnosis_id"]): (str(r["cause"]), int(r["requested_ns"])) for r in got}


def _attach(
    diagnoses: Sequence[Diagnosis], captures: list[dict[str, Any]], rows: pa.Table
) -> tuple[list[Diagnosis], int]:
    """The diagnoses with their captures' comparison in the evidence, and the rows skipped (a
    frame past the stack limits: :func:`parse_label`)."""
    by_capture: dict[str, dict[int, list[Sampled]]] = defaultdict(lambda: defaultdict(list))
    sampler: dict[tuple[str, int], str] = {}
    started: dict[str, int] = {}
    skipped = 0
    for r in rows.to_pylist():
        cid, rank, frames = str(r["capture_id"]), int(r["rank"]), str(r["frames"])
        if _frames(frames) is None:
            skipped += 1
            continue
        by_capture[cid][rank].append(Sampled(str(r["thread"]), frames, int(r["n"]), bool(r["idle"])))
        sampler[(cid, rank)] = str(r["sampler"])
        started[cid] = min(started.get(cid, int(r["time_ns"])), int(r["time_ns"]))
    latest = {str(c["diagnosis_id"]): c for c in captures}
    out = []
    for d in diagnoses:
        c = latest.get(d.id)
        if c is None:
            out.append(d)
            continue
        cid, peer = str(c["request_id"]), int(c["peer"])
        per_rank = by_capture.get(cid, {})
        flagged = [int(r) for r in c["flagged"] if int(r) in per_rank]
        if not flagged:
            out.append(d)
            continue
        rank = d.rank if d.rank in flagged else flagged[0]
        peer_rows = per_rank.get(peer, [])
        kind = sampler[(cid, rank)]
        got = compare(per_rank[rank], peer_rows, cause=d.cause, idle_known=kind != _IN_PROCESS)
        evidence = dict(d.evidence)
        evidence["top_frames"] = got.frames
        evidence["stacks"] = {
            "capture_id": cid,
            "time_ns": started.get(cid, 0),
            "rank": rank,
            "peer": peer if peer_rows else None,
            "sampler": kind,
            "samples": _samples(per_rank[rank]),
            "thread": got.thread,
        }
        if got.why is not None:
            evidence["stacks"]["why_no_frames"] = got.why
        out.append(replace(d, evidence=evidence))
    return out, skipped
