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
- **What.** :func:`top_frames` compares the flagged rank's samples with the peer's of the
  same capture: per function (``function``, its file), the share of the rank's samples (one
  sample: one look at every thread of the process) in which a thread's stack holds it; the
  functions whose share most exceeds the peer's come first. Argus's own threads (``argus-…``)
  are left out, and so are the probe's wrapper frames in the training threads (the
  ``wait``/c10d wrappers of ``argus/agent/collectives.py``, :func:`_probe_frame`): they sit
  between the user's collective and torch's in every stack that waits in one, so a rank
  waiting more would show Argus's frame where the collective's belongs. Each version
  of the diagnosis written after the stacks are stored carries them as ``evidence.top_frames``
  (with ``evidence.stacks``: the capture, its sampler and the ranks compared).
"""

from __future__ import annotations

import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from argus.analyzer.roles import Roles
from argus.config import DEFAULT_STACK_INTERVAL_S, DEFAULT_STACK_SECONDS
from argus.diagnosis import Cause, Diagnosis, State
from argus.schema import wire_table
from argus.store import Store

__all__ = [
    "MAX_FLAGGED",
    "STACK_CAUSES",
    "StackRequest",
    "Stacks",
    "pick_peer",
    "top_frames",
]

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
_LABEL = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
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


def _function(label: str) -> tuple[str, str, int]:
    m = _LABEL.match(label)
    if m is None:
        return label, "", 0
    return m["function"], m["file"], int(m["line"])


def _samples(rows: list[tuple[str, str, int]]) -> int:
    """Samples of a capture: those of its most sampled thread (each sample sees every thread once)."""
    per_thread: Counter[str] = Counter()
    for thread, _, n in rows:
        per_thread[thread] += n
    return max(per_thread.values(), default=0)


def _shares(
    rows: list[tuple[str, str, int]],
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int]]:
    """Per (function, file): share of the samples in which a stack holds it; its most sampled line.

    Each sample sees every thread once, so the samples are those of the most sampled thread.
    """
    total = _samples(rows)
    holding: Counter[tuple[str, str]] = Counter()
    lines: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    for thread, frames, n in rows:
        if thread.startswith("argus-"):
            continue
        seen = set()
        for label in frames.split(";") if frames else []:
            function, file, line = _function(label)
            if _probe_frame(function, file):
                continue
            key = (function, file)
            lines[key][line] += n
            if key not in seen:
                seen.add(key)
                holding[key] += n
    shares = {k: min(v / total, 1.0) for k, v in holding.items()} if total else {}
    return shares, {k: c.most_common(1)[0][0] for k, c in lines.items()}


def _ancestors(rows: list[tuple[str, str, int]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """Per (function, file): the functions above it in every stack that holds it."""
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for thread, frames, _ in rows:
        if thread.startswith("argus-"):
            continue
        above: set[tuple[str, str]] = set()
        for label in frames.split(";") if frames else []:
            function, file, _line = _function(label)
            if _probe_frame(function, file):
                continue
            key = (function, file)
            out[key] = out[key] & above if key in out else set(above)
            above.add(key)
    return out


def _carried(
    excess: dict[tuple[str, str], float],
    shares: dict[tuple[str, str], float],
    ancestors: dict[tuple[str, str], set[tuple[str, str]]],
    samples: int,
) -> dict[tuple[str, str], float]:
    """The functions whose excess one function below them carries: per such function, that
    function's excess.

    A caller's share holds its callees'; a callee that holds most of the caller's excess (more
    than half of it, or all of it within the sampling error: the binomial standard error of the
    caller's share over ``samples`` samples) says the same, more precisely: a slow read under the
    DataLoader's ``__next__``, where some of the caller's samples fell in its own code, its other
    callees or a dump torn between two frames. A callee with less than half leaves the caller to
    lead: the caller's own time is then most of what sets the rank apart.
    """
    below: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for d, above in ancestors.items():
        for a in above:
            below[a].append(d)
    carriers: dict[tuple[str, str], list[tuple[str, str]]] = {}
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


def _depths(rows: list[tuple[str, str, int]]) -> dict[tuple[str, str], int]:
    """Per (function, file): its deepest position in any stack (0 = the root)."""
    out: dict[tuple[str, str], int] = {}
    for _, frames, _ in rows:
        for i, label in enumerate(frames.split(";") if frames else []):
            function, file, _line = _function(label)
            out[function, file] = max(out.get((function, file), 0), i)
    return out


def top_frames(
    flagged: list[tuple[str, str, int]], peer: list[tuple[str, str, int]], n: int = TOP_FRAMES
) -> list[dict[str, Any]]:
    """The functions that set the flagged rank's stacks apart from its peer's.

    Args:
        flagged: The flagged rank's rows of one capture, ``(thread, frames, count)``: ``frames``
            root to leaf, ``;``-joined ``function (file:line)`` (the ``stacks`` table's).
        peer: The peer's rows of the same capture (empty: no peer; shares are then the rank's own).
        n: How many to keep.

    Returns:
        Up to ``n`` dicts ``{"function", "file", "line", "share", "peer_share"}``, the largest
        ``share - peer_share`` first, each > 0: ``share`` is the fraction (0-1) of the flagged
        rank's samples in which one of its threads was in the function, ``line`` its most
        sampled line. A caller whose excess a function below it carries (most of it,
        :func:`_carried`) comes right after that function, not before it; ties (a hung rank's
        one dump holds every frame of its stack in every sample) go to Python code before
        native frames, then to the frame nearest the leaf: the most specific.
    """
    mine, lines = _shares(flagged)
    theirs, _ = _shares(peer)
    depth = _depths(flagged)
    excess = {k: s - theirs.get(k, 0.0) for k, s in mine.items()}
    carried = _carried(excess, mine, _ancestors(flagged), _samples(flagged))
    ranked = sorted(
        excess,
        key=lambda k: (
            -carried.get(k, excess[k]),
            not k[1].endswith(".py"),
            k in carried,
            -depth.get(k, 0),
            k,
        ),
    )
    return [
        {
            "function": k[0],
            "file": k[1],
            "line": lines[k],
            "share": round(mine[k], 4),
            "peer_share": round(theirs.get(k, 0.0), 4),
        }
        for k in ranked[:n]
        if excess[k] > 0
    ]


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
            "SELECT capture_id, rank, sampler, time_ns, thread, frames, sum(count) AS n FROM stacks "
            "WHERE job_id = {job:String} AND capture_id IN {ids:Array(String)} "
            "GROUP BY capture_id, rank, sampler, time_ns, thread, frames",
            {"job": job_id, "ids": [c["request_id"] for c in captures]},
        )
        return _attach(diagnoses, captures, rows)

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
) -> list[Diagnosis]:
    by_capture: dict[str, dict[int, list[tuple[str, str, int]]]] = defaultdict(lambda: defaultdict(list))
    sampler: dict[tuple[str, int], str] = {}
    started: dict[str, int] = {}
    for r in rows.to_pylist():
        cid, rank = str(r["capture_id"]), int(r["rank"])
        by_capture[cid][rank].append((str(r["thread"]), str(r["frames"]), int(r["n"])))
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
        evidence = dict(d.evidence)
        evidence["top_frames"] = top_frames(per_rank[rank], peer_rows)
        evidence["stacks"] = {
            "capture_id": cid,
            "time_ns": started.get(cid, 0),
            "rank": rank,
            "peer": peer if peer_rows else None,
            "sampler": sampler[(cid, rank)],
            "samples": _samples(per_rank[rank]),
        }
        out.append(replace(d, evidence=evidence))
    return out
