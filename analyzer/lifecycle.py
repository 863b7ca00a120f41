"""Diagnosis lifecycle: one open diagnosis per ongoing fault, with hysteresis (docs/design.md §6.11).

A fault is identified by its *family* (``straggler`` for the four straggler
causes, else the cause) and *subject* (``rank:R``, ``many``, ``group:G``,
``ranks:...``; see :class:`argus.analyzer.findings.Finding`).

* **Open** when a finding with no open diagnosis has scored >= its opening
  score (:data:`OPEN_SCORE`) in every one of consecutive windows spanning at
  least :data:`CONFIRM_NS` (one 10 s window; two 6 s or five 2 s windows): on
  an oversubscribed host the scheduler can slow a rank by 10 % or more for
  several seconds, and that is no fail-slow fault. The span is the job's time
  as well as the windows': the steps of those windows must add up to half of
  :data:`CONFIRM_NS` at least (not all of it: windows cut steps at their edges,
  and a step's wall time leaves out what a job does between steps), so a job's
  first or last window, which its steps fill only in part (a job that ran 2 s
  of steps in one 10 s window), never opens a fault alone. This is hysteresis proper:
  the opening threshold must hold for the whole confirmation span, the keep
  threshold only keeps what is open (a window at 0.6 followed by one at 1.1
  is not 10 s of evidence at 1). A finding that ``needs_confirmation`` (its
  peers' reference was thin: fewer than four healthy ranks) needs two windows
  in any case unless it scores >= :data:`STRONG_SCORE`; an ``ambiguous`` one
  (as many ranks look slow as are left to compare with, on a thin
  reference: which side is slow is unclear) opens only at
  :data:`STRONG_SCORE`, held for two windows at least. The job's own loss
  (``job_loss``: the job-level finding, or the one rank behind that explains it)
  needs two windows however strong, one streak whether a rank explains it or
  not in each of them. ``unresponsive`` opens
  at once: its thresholds are durations already.
* **Update** every window a finding for it scores >= :data:`KEEP_SCORE`
  (hysteresis: a fault hovering around the threshold stays one diagnosis).
  A straggler's cause is the one most windows named (ties: the latest), so one
  noisy window cannot split a fault into two diagnoses.
* **Resolve** after :data:`RESOLVE_WINDOWS` consecutive windows in which its
  ranks reported data and no finding kept it; a window where none of its
  ranks reported (missing or late batches) neither keeps nor resolves it.
* **Lost time.** A fault opens only when, besides its score, the lost time it
  accounts for over the windows of its confirmation span (the latest ones; the
  window it began in mid-way does not dilute it; :mod:`argus.analyzer.loss`) is
  at least ``min_loss_pct`` of the wall time of those windows: a fault the job does
  not feel is no fault. ``unresponsive`` is exempt. Each finding's share
  (``lost_ns``) and the window's wall time (``wall_ns``) are summed over every
  window that updated the diagnosis: ``slowdown_pct = 100 · lost / wall`` over its
  span, ``evidence.lost_s`` is the job time it accounts for and ``evidence.span_s``
  the wall time of that span (with ``window_slowdown_pct`` for the latest window alone).
* The job-level fault (family ``job``, :data:`argus.analyzer.findings.JOB_SUBJECT`)
  is one diagnosis however its cause moves: its cause is the one most windows named.
  When the ranks it names are only an open straggler's and those the straggler slowed
  down, its loss joins the straggler's diagnosis instead (:meth:`Tracker._fold_job_loss`) and
  keeps it open in a window where the straggler has no finding of its own
  (:meth:`Tracker._keep_open_straggler`);
  when it opened first, the straggler that opens later and explains it (the ranks it named,
  and this window's) takes it over (its id and first window; :meth:`Tracker._adopt_job_loss`):
  one fault, one diagnosis.
* A many-rank straggler diagnosis absorbs the single-rank ones of its ranks
  (they are resolved with ``merged_into`` in their evidence), and while it is
  open every straggler of its cause joins it. A rank it names leaves it as a diagnosis
  resolves: after :data:`RESOLVE_WINDOWS` windows in a row that did not keep it (a job's short
  last window, whose few steps score low, does not drop two of three slow ranks).

The tracker is pure state over findings; the service writes what it returns.
Its bookkeeping (subject, cause votes, the lost-time sums) is its own state, not
part of a diagnosis's public evidence: :meth:`Tracker.state` gives it for the
store and :meth:`Tracker.load` takes it back after a restart.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from argus.analyzer.findings import JOB_SUBJECT, KEEP_SCORE, Finding, family
from argus.analyzer.loss import DEFAULT_MIN_LOSS_PCT
from argus.config import DEFAULT_WINDOW
from argus.diagnosis import Diagnosis, State

__all__ = ["OPEN_SCORE", "RESOLVE_WINDOWS", "STRONG_SCORE", "Tracker", "diagnosis_id"]

#: A new fault opens a diagnosis at this score.
OPEN_SCORE = 1.0
#: A finding that needs confirmation opens at once when it is this strong.
STRONG_SCORE = 2.0
#: A fault must be seen for this long (in consecutive windows) before it opens, ns.
CONFIRM_NS = 10_000_000_000
#: Clean windows (its ranks reported, nothing kept it) before a diagnosis is resolved.
RESOLVE_WINDOWS = 3
#: Windows of a streak's costs kept (enough for the longest confirmation span of short windows).
MAX_CONFIRM_WINDOWS = 64


def diagnosis_id(job_id: str, family: str, subject: str, first_window_ns: int) -> str:
    """Stable id of a fault: 16 hex digits of SHA-1 over its identity."""
    key = f"{job_id}\x00{family}\x00{subject}\x00{first_window_ns}".encode()
    return hashlib.sha1(key).hexdigest()[:16]


def _open_score(f: Finding) -> float:
    """The score a finding must reach, window after window, to open a diagnosis."""
    return STRONG_SCORE if f.ambiguous else OPEN_SCORE


def _subject(d: Diagnosis, state: dict[str, Any]) -> str:
    subject = state.get("subject", d.evidence.get("subject"))  # older rows kept it in the evidence
    if isinstance(subject, str):
        return subject
    if d.rank is not None:
        return f"rank:{d.rank}"
    if d.group is not None:
        return f"group:{d.group}"
    return "many"


@dataclass
class _Open:
    diagnosis: Diagnosis
    subject: str
    causes: Counter[str] = field(default_factory=Counter)
    clean: int = 0
    #: Summed over the windows that updated it: the lost time it accounts for and the wall time, ns.
    lost_ns: float = 0.0
    wall_ns: float = 0.0
    #: Of ``lost_ns``, the job's residual loss it took in (see :meth:`Tracker._fold_job_loss`), ns.
    knock_on_ns: float = 0.0
    #: Of a many-rank diagnosis, per rank it names: consecutive windows since one last kept it.
    member_clean: dict[int, int] = field(default_factory=dict)


@dataclass
class _Streak:
    """A fault not open yet: consecutive windows up to the last one it was seen in (>= KEEP_SCORE)."""

    seen: int = 0
    #: Of those, the consecutive windows (up to the last) at its opening score.
    opening: int = 0
    #: (lost time it accounted for and wall time of the steps, ns; cause) of its latest windows,
    #: oldest first.
    costs: tuple[tuple[float, float, str], ...] = ()


class Tracker:
    """Open diagnoses of one job and the rules above.

    Args:
        job_id: The job.
        window_ns: Analysis window, ns.
        resolve_windows: Clean windows before resolving (default :data:`RESOLVE_WINDOWS`).
        min_loss_pct: Loss threshold, percent of wall time over the confirmation span.
    """

    def __init__(
        self,
        job_id: str,
        *,
        window_ns: int = DEFAULT_WINDOW.length_ns,
        resolve_windows: int = RESOLVE_WINDOWS,
        min_loss_pct: float = DEFAULT_MIN_LOSS_PCT,
    ) -> None:
        self.job_id = job_id
        self.resolve_windows = resolve_windows
        self.min_loss_pct = min_loss_pct
        #: Consecutive windows a fault must be seen in before it opens (>= CONFIRM_NS of evidence).
        self.confirm_windows = max(1, -(-CONFIRM_NS // max(int(window_ns), 1)))
        self.window_ns = int(window_ns)
        self._open: dict[tuple[str, str], _Open] = {}
        #: Faults not open yet, by key.
        self._streak: dict[tuple[str, str], _Streak] = {}
        #: Keys of the last window's findings of the job's loss (``Finding.job_loss``).
        self._job_loss_keys: set[tuple[str, str]] = set()

    @property
    def open(self) -> list[Diagnosis]:
        """The open diagnoses, oldest first."""
        return sorted((o.diagnosis for o in self._open.values()), key=lambda d: d.first_window_ns)

    def load(self, diagnoses: list[Diagnosis], states: dict[str, dict[str, Any]] | None = None) -> None:
        """Adopt diagnoses read back from the store (e.g. after a restart); resolved ones are ignored.

        ``states`` maps a diagnosis id to what :meth:`state` gave for it when it was written.
        """
        for d in diagnoses:
            if d.state != State.OPEN or d.job_id != self.job_id:
                continue
            state = (states or {}).get(d.id, {})
            o = _Open(d, _subject(d, state))
            votes = state.get("cause_votes", d.evidence.get("cause_votes"))
            if isinstance(votes, dict):
                o.causes.update({str(k): int(v) for k, v in votes.items()})
            else:
                o.causes[d.cause] = int(d.evidence.get("windows", 1))
            o.lost_ns = float(state.get("lost_ns", 0.0))
            o.wall_ns = float(state.get("wall_ns", 0.0))
            o.knock_on_ns = float(state.get("knock_on_ns", 0.0))
            clean = state.get("member_clean", {})
            if isinstance(clean, dict):
                o.member_clean = {int(k): int(v) for k, v in clean.items()}
            self._open[(family(d.cause, o.subject), o.subject)] = o

    def state(self, diagnosis_id: str) -> dict[str, Any]:
        """The tracker's bookkeeping of an open diagnosis (JSON-ready; empty once it is closed)."""
        for o in self._open.values():
            if o.diagnosis.id == diagnosis_id:
                return {
                    "subject": o.subject,
                    "cause_votes": dict(o.causes),
                    "lost_ns": o.lost_ns,
                    "wall_ns": o.wall_ns,
                    "knock_on_ns": o.knock_on_ns,
                    "member_clean": {str(r): n for r, n in o.member_clean.items()},
                }
        return {}

    def update(  # noqa: C901  (the module doc's rules, one clause each, in its order)
        self, window_ns: int, findings: list[Finding], observed: set[int]
    ) -> list[Diagnosis]:
        """Apply one window's findings.

        Args:
            window_ns: Start of the window, ns since the epoch.
            findings: The window's findings (:func:`argus.analyzer.causes.attribute`).
            observed: Ranks that reported any data in the window.

        Returns:
            Diagnoses opened, updated or resolved in this window (to be written).
        """
        findings = self._fold_into_many(findings)
        streak: dict[tuple[str, str], _Streak] = {}
        # The job's loss is one streak whether one rank explains it or not this window (its
        # subject moves between ``job`` and ``rank:R`` as ranks fall behind by more or less).
        job_loss = next((s for k, s in self._streak.items() if k in self._job_loss_keys), _Streak())
        self._job_loss_keys = {
            (f.family, f.subject) for f in findings if f.job_loss and f.score >= KEEP_SCORE
        }
        for f in sorted(findings, key=lambda f: f.score):  # the best finding of a key counts
            if f.score >= KEEP_SCORE:
                was = self._streak.get((f.family, f.subject), job_loss if f.job_loss else _Streak())
                costs = (*was.costs[-MAX_CONFIRM_WINDOWS:], (f.lost_ns, f.wall_ns, f.cause))
                s = _Streak(was.seen + 1, costs=costs)
                if f.score >= _open_score(f):
                    s.opening = was.opening + 1
                streak[(f.family, f.subject)] = s
        self._streak = streak
        findings, knock_on = self._fold_job_loss(findings)
        changed: list[Diagnosis] = []
        matched: set[tuple[str, str]] = set()
        for f in sorted(findings, key=lambda f: -f.score):
            key = (f.family, f.subject)
            o = self._open.get(key)
            if o is None:
                s = streak.get(key, _Streak())
                if not self._ready(f, s):
                    continue
                # The fault was first seen when its streak of windows began: its cost counts from there.
                d = self._new(window_ns - (s.seen - 1) * self.window_ns, f)
                o = self._open[key] = _Open(d, f.subject)
                o.lost_ns = sum(c[0] for c in s.costs[:-1])
                o.wall_ns = sum(c[1] for c in s.costs[:-1])
                o.causes.update(c[2] for c in s.costs[:-1])
                changed.extend(self._absorb(key, d))
            elif key in matched or f.score < KEEP_SCORE:
                continue
            o.causes[f.cause] += 1
            o.clean = 0
            taken = knock_on.pop(key, 0.0)
            o.lost_ns += taken
            o.knock_on_ns += taken
            o.diagnosis = self._refresh(o, window_ns, f)
            matched.add(key)
            changed.append(o.diagnosis)
        for key, o in list(self._open.items()):
            if key in matched:
                continue
            if not observed.intersection(o.diagnosis.ranks) and o.diagnosis.ranks:
                continue
            o.clean += 1
            if o.clean >= self.resolve_windows:
                del self._open[key]
                changed.append(replace(o.diagnosis, state=State.RESOLVED.value))
        return changed

    def _ready(self, f: Finding, s: _Streak) -> bool:
        """A fault with no open diagnosis opens now: its score held over the confirmation span."""
        needed = 1 if f.family == "unresponsive" else self.confirm_windows
        # The job's own loss has no peers to stand out from: one window of it, however
        # large (a checkpoint), is no sustained loss.
        if (f.needs_confirmation and f.score < STRONG_SCORE) or f.ambiguous or f.job_loss:
            needed = max(needed, 2)
        if f.score < _open_score(f) or s.opening < needed:
            return False
        return self._long_enough(f, s) and self._costly(f, s, needed)

    def _fold_job_loss(self, findings: list[Finding]) -> tuple[list[Finding], dict[tuple[str, str], float]]:
        """The job's residual loss joins the straggler diagnosis whose fault it is.

        When the job loses more than the time it waited for a straggler and the ranks behind
        their own past (the job-level finding's ranks) are only that straggler's ranks and the
        ranks it slowed down while they waited for it (``knock_on_ranks``: on a shared host, the
        straggler's extra work slows its neighbours too), the residual is the straggler's fault
        as well: its lost time joins that diagnosis (``evidence.knock_on_lost_s``) instead of
        opening a second one for the same ranks. The straggler's diagnosis is open or opens in
        this window. The first window of it folds only once the residual would open on its own
        (the same rules), taking in its streak's earlier windows; after that, every window's
        residual of those ranks (at the keep score) joins it.

        Returns:
            ``(findings without the job-level one if it joined, {straggler key: lost time it takes in, ns})``.
        """
        key = ("job", JOB_SUBJECT)
        job = next((f for f in findings if f.family == "job"), None)
        if key in self._open:
            return self._adopt_job_loss(findings, job)
        if job is None or not job.ranks or job.score < KEEP_SCORE:
            return findings, {}
        for f in sorted(findings, key=lambda f: -f.score):
            host = (f.family, f.subject)
            o = self._open.get(host)
            if f.family != "straggler" or f.score < KEEP_SCORE:
                continue
            if o is None and not self._ready(f, self._streak.get(host, _Streak())):
                continue
            covered = {*f.ranks, *(o.diagnosis.ranks if o else ()), *f.evidence.get("knock_on_ranks", ())}
            if not set(job.ranks) <= covered:
                continue
            s = self._streak.get(key, _Streak())
            take = job.lost_ns
            if o is None or not o.knock_on_ns:
                if not self._ready(job, s):
                    return findings, {}
                take += sum(c[0] for c in s.costs[:-1])
            self._streak.pop(key, None)
            return [x for x in findings if x is not job], {host: take}
        return self._keep_open_straggler(findings, job)

    def _keep_open_straggler(
        self, findings: list[Finding], job: Finding
    ) -> tuple[list[Finding], dict[tuple[str, str], float]]:
        """The job's residual loss keeps the open straggler diagnosis whose ranks it names, when that
        straggler has no finding of its own this window.

        A fault that comes and goes within windows (a rank stopped 0.4 s every 2 s) lands in one
        window as the rank's own excess and in the next as the job's loss, naming the same rank
        behind its own past. One fault, one diagnosis: when the job-level finding names only the
        ranks of an open straggler diagnosis and those it slowed down (``knock_on_ranks``), that
        diagnosis is updated (cause and phase as they were; the loss is its knock-on loss) instead of
        counting a clean window while a job-level diagnosis of another cause opens beside it.

        Returns:
            As :meth:`_fold_job_loss`.
        """
        for host, o in sorted(self._open.items(), key=lambda kv: -kv[1].diagnosis.score):
            d = o.diagnosis
            if host[0] != "straggler" or not set(job.ranks) <= {
                *d.ranks,
                *d.evidence.get("knock_on_ranks", ()),
            }:
                continue
            keep = replace(
                job,
                cause=d.cause,
                rank=d.rank,
                ranks=tuple(d.ranks),
                group=d.group,
                phase=d.phase,
                kernel=d.kernel,
                subject=o.subject,
                evidence=dict(d.evidence),
                member_scores={},
                lost_ns=0.0,
                job_loss=False,
            )
            self._streak.pop(("job", JOB_SUBJECT), None)
            return [keep if x is job else x for x in findings], {host: job.lost_ns}
        return findings, {}

    def _adopt_job_loss(
        self, findings: list[Finding], job: Finding | None
    ) -> tuple[list[Finding], dict[tuple[str, str], float]]:
        """The open job-level diagnosis becomes the straggler's that explains it, when one opens now.

        One fault, one diagnosis: when the job-level diagnosis opened first (the straggler's
        score or evidence came a window later), the straggler finding that is ready to open
        and whose ranks, with those it slowed down (``knock_on_ranks``), cover every rank the
        job-level diagnosis (and this window's job-level finding) names takes it over: same id
        and first window, now naming the straggler's rank and cause; the job's loss it had
        accounted is the straggler's knock-on loss (``evidence.knock_on_lost_s``). The ranks it
        names include this window's: a job-level diagnosis that opened naming no rank (a busier
        host as the fault began) is taken over once its loss names the straggler's ranks. One
        naming no rank now, or a rank no straggler explains, stays.

        Returns:
            As :meth:`_fold_job_loss`.
        """
        key = ("job", JOB_SUBJECT)
        o = self._open[key]
        named = set(o.diagnosis.ranks) | set(job.ranks if job is not None else ())
        if not named:
            return findings, {}
        for f in sorted(findings, key=lambda f: -f.score):
            host = (f.family, f.subject)
            if f.family != "straggler" or host in self._open or f.score < KEEP_SCORE:
                continue
            s = self._streak.get(host, _Streak())
            if not self._ready(f, s) or not named <= {*f.ranks, *f.evidence.get("knock_on_ranks", ())}:
                continue
            del self._open[key]
            d = replace(o.diagnosis, rank=f.rank, ranks=list(f.ranks), group=f.group, cause=f.cause)
            d = replace(d, phase=f.phase, kernel=f.kernel)
            adopted = self._open[host] = _Open(d, f.subject, lost_ns=o.lost_ns, wall_ns=o.wall_ns)
            adopted.knock_on_ns = o.lost_ns
            adopted.causes.update(c[2] for c in s.costs[:-1])
            self._streak.pop(key, None)
            take = job.lost_ns if job is not None else 0.0
            return [x for x in findings if x is not job], {host: take}
        return findings, {}

    def _long_enough(self, f: Finding, s: _Streak) -> bool:
        """The steps of the streak's opening windows add up to half of :data:`CONFIRM_NS` at least.

        ``unresponsive`` is exempt (its thresholds are durations, and a hung job takes no steps).
        Windows whose steps' wall time is unknown (0) count as their length (the window count
        already holds then).
        """
        if f.family == "unresponsive":
            return True
        recent = s.costs[-s.opening :]
        if not any(c[1] > 0 for c in recent):
            return True
        return 2 * sum(c[1] for c in recent) >= CONFIRM_NS

    def _costly(self, f: Finding, s: _Streak, windows: int) -> bool:
        """The fault cost the job at least the loss threshold over its latest ``windows`` windows."""
        if f.family == "unresponsive":
            return True
        recent = s.costs[-windows:]
        lost = sum(c[0] for c in recent)
        wall = sum(c[1] for c in recent)
        return wall > 0 and 100.0 * lost >= self.min_loss_pct * wall

    def finish(self) -> list[Diagnosis]:
        """The job ended (every rank exited): resolve every open diagnosis."""
        out = [
            replace(
                o.diagnosis,
                state=State.RESOLVED.value,
                evidence={**o.diagnosis.evidence, "job_finished": True},
            )
            for o in self._open.values()
        ]
        self._open.clear()
        return out

    def _fold_into_many(self, findings: list[Finding]) -> list[Finding]:
        """While a many-rank diagnosis of a cause is open, single stragglers of that cause join it,
        and so do its own ranks' whatever their cause this window (a member's cause wavers between
        windows; the diagnosis's cause is the one most windows named)."""
        many = {
            o.diagnosis.cause: key
            for key, o in self._open.items()
            if key[0] == "straggler" and key[1] == "many"
        }
        if not many:
            return findings
        member_of = {r: cause for cause, key in many.items() for r in self._open[key].diagnosis.ranks}
        out: list[Finding] = []
        joined: dict[str, list[Finding]] = {}
        for f in findings:
            if f.family != "straggler" or f.subject == "many":
                out.append(f)
            elif f.cause in many:
                joined.setdefault(f.cause, []).append(f)
            elif f.ranks and all(r in member_of for r in f.ranks):
                joined.setdefault(member_of[f.ranks[0]], []).append(replace(f, cause=member_of[f.ranks[0]]))
            else:
                out.append(f)
        for cause, fs in joined.items():
            existing = next((f for f in out if f.subject == "many" and f.cause == cause), None)
            members = dict(existing.member_scores) if existing else {}
            for f in fs:
                for r in f.ranks:
                    members[r] = max(members.get(r, 0.0), f.score)
            base = existing or max(fs, key=lambda f: f.score)
            if existing:
                out.remove(existing)
            lost = sum(f.lost_ns for f in fs) + (existing.lost_ns if existing else 0.0)
            out.append(
                replace(
                    base,
                    lost_ns=min(lost, base.wall_ns) if base.wall_ns > 0 else lost,
                    rank=None,
                    ranks=tuple(sorted(members)),
                    member_scores=members,
                    subject="many",
                    score=max([f.score for f in fs] + ([existing.score] if existing else [])),
                    slowdown_pct=max(
                        [f.slowdown_pct for f in fs] + ([existing.slowdown_pct] if existing else [])
                    ),
                )
            )
        return out

    def _absorb(self, key: tuple[str, str], many: Diagnosis) -> list[Diagnosis]:
        """A new many-rank diagnosis resolves the single-rank ones of its ranks."""
        if key[1] != "many":
            return []
        out = []
        for other_key, o in list(self._open.items()):
            d = o.diagnosis
            if other_key[0] == key[0] and other_key[1].startswith("rank:") and d.rank in many.ranks:
                del self._open[other_key]
                out.append(
                    replace(d, state=State.RESOLVED.value, evidence={**d.evidence, "merged_into": many.id})
                )
        return out

    def _new(self, window_ns: int, f: Finding) -> Diagnosis:
        return Diagnosis(
            id=diagnosis_id(self.job_id, f.family, f.subject, window_ns),
            job_id=self.job_id,
            rank=f.rank,
            ranks=list(f.ranks),
            group=f.group,
            cause=f.cause,
            phase=f.phase,
            kernel=f.kernel,
            score=f.score,
            slowdown_pct=f.slowdown_pct,
            first_window_ns=window_ns,
            last_window_ns=window_ns,
            state=State.OPEN.value,
            evidence={},
        )

    def _refresh(self, o: _Open, window_ns: int, f: Finding) -> Diagnosis:
        top = max(o.causes.values())
        cause = f.cause if o.causes[f.cause] == top else next(c for c, n in o.causes.items() if n == top)
        o.lost_ns += f.lost_ns
        o.wall_ns += f.wall_ns
        slowdown = min(100.0, 100.0 * o.lost_ns / o.wall_ns) if o.wall_ns > 0 else f.slowdown_pct
        evidence: dict[str, Any] = {
            **f.evidence,
            "lost_s": round(o.lost_ns / 1e9, 3),
            "span_s": round(o.wall_ns / 1e9, 3),
            "window_slowdown_pct": round(f.slowdown_pct, 3),
        }
        if o.knock_on_ns:
            evidence["knock_on_lost_s"] = round(o.knock_on_ns / 1e9, 3)
        same = cause == f.cause or not o.diagnosis.evidence
        ranks = list(f.ranks)
        if f.member_scores:
            was = set(o.diagnosis.ranks) if o.diagnosis.evidence else set()
            kept = {
                r for r, s in f.member_scores.items() if s >= OPEN_SCORE or (r in was and s >= KEEP_SCORE)
            }
            # A rank leaves the diagnosis as a diagnosis resolves: after RESOLVE_WINDOWS windows in
            # a row that did not keep it (one window of few steps, the job's last, names few ranks).
            o.member_clean = {r: 0 if r in kept else o.member_clean.get(r, 0) + 1 for r in kept | was}
            ranks = sorted(r for r, n in o.member_clean.items() if n < self.resolve_windows)
        return replace(
            o.diagnosis,
            rank=f.rank,
            ranks=ranks,
            group=f.group,
            cause=cause,
            phase=f.phase if same else o.diagnosis.phase,
            kernel=f.kernel if same else o.diagnosis.kernel,
            score=round(f.score, 4),
            slowdown_pct=round(slowdown, 3),
            last_window_ns=window_ns,
            evidence=evidence,
        )
