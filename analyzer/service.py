"""The analyzer as a service: windows from the store in, diagnoses and gauges out.

`argus server` runs :class:`Analyzer` in a thread (:meth:`Analyzer.run_forever`);
`argus analyze` runs it alone (:func:`main`).

Windows are those of the analyzer's :class:`~argus.window_grid.WindowGrid` (epoch multiples
of its length). A window ``[w0, w1)`` of a job is analysed once, when ``now >= w1 + grace``
(rows may arrive up to ``grace`` late: node agents batch for about a second) and every rank that still
reports has its heartbeat past ``w1`` stored (:func:`~argus.analyzer.store_io.read_watermark`:
a node agent behind on its spool holds the window back), or, whatever the
heartbeats, once :data:`WAIT_WINDOWS` more windows have passed. Rows arriving
later than that are not in its analysis, and a window in which a rank's rows are
missing neither opens nor resolves a diagnosis of that rank
(:mod:`argus.analyzer.lifecycle`). A job's windows run from its first data to
shortly after its last; on a live job the server starts at most ``backlog_s``
back (`argus analyze --once` starts at the beginning). An imported job (a
trace of a past run, ``jobs.source = 'import'``) is analysed over its whole
span whatever its age; one first met mid-import, before its ``jobs`` row was
written, starts over from its first row once the import is complete.

Restarts: every diagnosis version written records (column ``analysed_to_ns``)
the end of the window whose analysis wrote it, and the tracker's bookkeeping
(column ``tracker``). A job met for the first time
(after a restart, or by `argus analyze` over a store a server already analysed)
resumes after the newest such point of its stored diagnoses: the windows
before it are *replayed* (analysed to rebuild the job's baselines, nothing
found in them written), then the tracker takes over the stored open diagnoses
and analysis goes on as if it had never stopped. A fault already recorded,
open or resolved, is never recorded again under another id, whatever the
window size of the earlier analysis. A finished job whose stored diagnoses
cover its whole analysis is not replayed at all.

Per window the service reads the job's rows (:mod:`argus.analyzer.store_io`),
runs :class:`argus.analyzer.pipeline.JobAnalysis`, writes every diagnosis that
was opened, updated or resolved as a new version of its row in ``diagnoses``
(a ReplacingMergeTree on ``updated_ns``: read it with ``FINAL``), the window's
lost-time accounting in ``analysis_windows`` and the ranks' roles in ``roles``
when they change, and updates ``argus_straggler_score`` (the ranks of the job's open diagnoses, with
their score, and the :data:`~argus.metrics.TOP_SUSPECTS` highest-scoring ranks of its latest window),
``argus_diagnosis_active``, ``argus_lost_time_seconds_total``, ``argus_step_time_seconds``,
``argus_unexplained_loss_ratio`` and ``argus_analysis_lag_seconds``. A job's series last while it has
rows to analyse: once its last rows and the :data:`TRAILING_WINDOWS` after them are analysed (it
ended, or fell silent; an import once analysed), they are removed, so no alert fires for an ended
job. A job that reports again gets them back (its counters start again from 0).

Which jobs: ``argus server`` (a backlog limit, no ``--job``) lists in a pass only the jobs with a
batch stored in the last ``idle_s`` (default :data:`DEFAULT_IDLE_S`; ``ingest_batches``, read through
its ``stored_at`` index) and those whose import was stored in the last :data:`IMPORT_IDLE_S`
(their ``jobs`` row), at most ``max_active_jobs`` of each, reading at most ``max_job_list_rows``
(:mod:`argus.limits`), plus those with windows still due; each live job's span is read from its
rows since the backlog limit, an import's once. What the store held before does not cost a pass
anything. The state of a job no longer listed is dropped (its open diagnoses stay open in the
store, as they would without new windows); if it reports again it resumes as after a restart.
``argus analyze`` (``--once`` or ``--job``) lists every job of the store.

Analysis lag counts only jobs with data waiting: per job, the time since its oldest unanalysed
window became complete (its end plus the grace for late rows; for data met all at once, an import or
a backlog, the pass that first saw it), read when scraped, so a stuck analyzer shows a growing lag.
A job whose rows are all analysed (finished, or silent past its trailing windows) waits for nothing:
an idle server reports 0.

Isolation: jobs take turns in a pass, and nothing one job does delays the others. A turn analyses at
most :data:`SLICE_WINDOWS` of a job's windows; a job with more due (a backlog, an import) has its
next turn after every other job has had one, so a live job's new window waits for at most one turn
of each other job. :meth:`Analyzer.run_forever` ends a pass after the first round of turns that
ends past its polling interval (the rest waits for the next pass, which sees the new windows of
live jobs first). An imported job is analysed only where it has data (each window with a row, and
the :data:`TRAILING_WINDOWS` after it): a trace whose parts lie years apart is not years of empty
windows. A window whose analysis fails on its data (anything but a store error) is retried on later
passes with backoff (``retry_backoff_s``, doubling: at most :data:`MAX_ATTEMPTS` attempts; the job's
later windows wait, the other jobs go on), then logged once, counted
(``argus_analysis_failures_total{job_id}``), recorded as ``failed`` and skipped; its whole wall time
counts as unexplained loss (nothing was said about it). A job whose last window was skipped so has
its next failing windows skipped at once (no retries) until one is analysed again, so a job that
fails on every window keeps pace with the clock. A store error stops only its job's pass (the window
is analysed again on the next); the other jobs go on, and the pass then raises the first such error.
Any other exception in a window, in its read, its analysis or its L5 and write stages, is that
job's failed window as above, never the pass's; one outside a window (listing the job's state) is
logged and counted, and stops only that job's pass. Rows past :mod:`argus.limits` in an older store
(ingest refuses them today) are skipped where they are read and counted
(``argus_analysis_skipped_rows_total{table}``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from argus import render
from argus.analyzer.lifecycle import Tracker
from argus.analyzer.loss import DEFAULT_MIN_LOSS_PCT, Accounting
from argus.analyzer.pipeline import JobAnalysis
from argus.analyzer.stacks import Stacks
from argus.analyzer.store_io import (
    JobSpan,
    Liveness,
    active_job_ids,
    list_jobs,
    read_data_windows,
    read_liveness,
    read_watermark,
    read_window,
    write_roles,
    write_window,
)
from argus.config import DEFAULT_STACK_INTERVAL_S, check_min_loss_pct
from argus.diagnosis import (
    Diagnosis,
    State,
    StoredState,
    read_diagnoses,
    read_states,
    write_diagnoses,
)
from argus.errors import ArgusError, ConfigError
from argus.metrics import TOP_SUSPECTS, Metrics
from argus.store import Store, open_store
from argus.window_grid import WindowGrid

__all__ = ["DEFAULT_BACKLOG_S", "Analyzer", "main"]

log = logging.getLogger(__name__)

#: How far back a long-running analyzer starts on a job it has not seen yet, seconds.
DEFAULT_BACKLOG_S = 3600.0
#: Windows analysed after a job's newest row (enough to see a rank fall silent).
TRAILING_WINDOWS = 3
#: How long, in windows, a window waits for every reporting rank's rows to be stored.
WAIT_WINDOWS = 3
#: Rows stamped later than this past the present are left out of a job's span (a clock decades
#: ahead would keep the job due every window forever), ns.
FUTURE_SLACK_NS = 86_400 * 10**9
#: Attempts at a window whose analysis raises before it is skipped (see the module doc).
MAX_ATTEMPTS = 3
#: Windows one job is analysed in a row before every other job has had its turn (a *slice*;
#: see the module doc, "Isolation").
SLICE_WINDOWS = 4
#: A live job with no batch stored for this long is no longer listed, and its state is dropped
#: (module doc, "Which jobs"); longer with long windows (its trailing windows must fit), seconds.
DEFAULT_IDLE_S = 600
#: How long an imported job is listed after its import was stored, seconds.
IMPORT_IDLE_S = 86_400


@dataclass
class _Job:
    analysis: JobAnalysis
    cursor_ns: int
    #: What the job's rows say of each rank's liveness so far (merged window after window).
    live: Liveness = field(default_factory=Liveness)
    suspects: list[tuple[int, float]] = field(default_factory=list)
    analysed_to_ns: int = 0
    #: The backlog limit moved its start past its first window (its earliest data is not analysed).
    capped: bool = False
    #: Windows starting before this were analysed by an earlier analyzer (see the module doc):
    #: they are replayed, and nothing found in them is written.
    replay_to_ns: int = 0
    #: The open diagnoses stored when the job was met (the tracker's state once any replay ends).
    stored_open: list[Diagnosis] = field(default_factory=list)
    #: Their tracker bookkeeping, by id.
    stored_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Lost and unexplained time analysed so far, ns (for argus_unexplained_loss_ratio).
    lost_ns: float = 0.0
    unexplained_ns: float = 0.0
    #: Failed attempts at the window at ``cursor_ns``; no attempt before ``retry_at_ns``.
    attempts: int = 0
    retry_at_ns: int = 0
    #: The job's last window was skipped after its attempts: its next failures are skipped at once.
    failing: bool = False
    #: An imported job's windows worth analysing (each window with data and the
    #: :data:`TRAILING_WINDOWS` after it), ascending; None for a live job (every window).
    visit: NDArray[np.int64] | None = None
    #: kernel_summaries rows of another window length met so far (:meth:`Analyzer._mismatch`).
    mismatched_rows: int = 0

    def next_visit(self) -> int | None:
        """The first window at or after the cursor worth analysing, ns; None when none is left."""
        if self.visit is None:
            return self.cursor_ns
        i = int(np.searchsorted(self.visit, self.cursor_ns))
        return int(self.visit[i]) if i < self.visit.size else None


class Analyzer:
    """Windowed, incremental analysis of every job in ``store``.

    Args:
        store: Where timings are read and diagnoses written.
        window: The analysis window (:class:`~argus.window_grid.WindowGrid`, from ``--window-s``).
        metrics: Gauges to update (straggler scores, active diagnoses, lag); None = no metrics.
        job: Only this job (default: every job).
        grace_s: How late rows may arrive; default ``max(2, window length in s / 4)``.
        backlog_s: Start at most this far before now on a new job; None = from its first row.
        min_loss_pct: Loss threshold: sustained loss (percent of wall time over the
            confirmation span) below which nothing opens.
        stack_interval_s: Seconds between two stack captures of one open diagnosis
            (:mod:`argus.analyzer.stacks`).
        retry_backoff_s: Wait before the first retry of a window whose analysis raised, seconds
            (doubled for each further attempt); default the polling interval of
            :meth:`run_forever`.
        idle_s: With a backlog limit and no ``job`` (the server): a job without a batch stored
            for this long is no longer listed and its state is dropped, seconds; default
            :data:`DEFAULT_IDLE_S`, at least the job's trailing and waiting windows and the grace.

    Raises:
        ConfigError: ``min_loss_pct`` or ``stack_interval_s`` is out of range.
    """

    def __init__(
        self,
        store: Store,
        *,
        window: WindowGrid,
        metrics: Metrics | None = None,
        job: str | None = None,
        grace_s: float | None = None,
        backlog_s: float | None = DEFAULT_BACKLOG_S,
        min_loss_pct: float = DEFAULT_MIN_LOSS_PCT,
        stack_interval_s: float = DEFAULT_STACK_INTERVAL_S,
        retry_backoff_s: float | None = None,
        idle_s: float | None = None,
    ) -> None:
        if not stack_interval_s > 0:
            raise ConfigError(f"--stack-interval-s must be > 0, got {stack_interval_s}")
        self.min_loss_pct = check_min_loss_pct(min_loss_pct)
        self.store = store
        self.stacks = Stacks(store, stack_interval_s)
        self.window = window
        self.metrics = metrics
        self.job = job
        self.window_ns = window.length_ns
        self.grace_ns = int((grace_s if grace_s is not None else max(2.0, window.seconds / 4)) * 1e9)
        self.backlog_ns = None if backlog_s is None else int(backlog_s * 1e9)
        backoff = self._poll_s() if retry_backoff_s is None else retry_backoff_s
        self.retry_backoff_ns = int(max(backoff, 0.0) * 1e9)
        self._jobs: dict[str, _Job] = {}
        reach_s = (TRAILING_WINDOWS + WAIT_WINDOWS + 2) * window.seconds + self.grace_ns / 1e9
        self.idle_s = int(max(DEFAULT_IDLE_S if idle_s is None else idle_s, reach_s))
        #: Each job's span as last listed (kept while its state is).
        self._spans: dict[str, JobSpan] = {}
        #: Imported jobs' spans (fixed once the import is stored), with when it was stored.
        self._imports: dict[str, tuple[int, JobSpan]] = {}
        self._stop = threading.Event()
        self._last_version = 0
        self._stage_start = 0.0  # time.monotonic() at the end of a window's last stage (_time)
        self._backlog = False  # the last pass ended on its budget with windows still due
        #: Per job with data still to analyse, when its oldest unanalysed window was due, ns.
        self._due: dict[str, int] = {}
        #: Jobs that may have metric series (removed when their rows are all analysed).
        self._exported: set[str] = set()
        if metrics is not None:
            metrics.analysis_lag.set_function(self.lag_s)

    def lag_s(self, now_ns: int | None = None) -> float:
        """How long the oldest window due for analysis (of any job) has waited, seconds; 0 when none."""
        now = time.time_ns() if now_ns is None else int(now_ns)
        due = list(self._due.values())
        return max(0.0, (now - min(due)) / 1e9) if due else 0.0

    def run_once(self, now_ns: int | None = None, *, budget_s: float | None = None) -> list[Diagnosis]:
        """Analyze every complete window not analyzed yet; return the diagnoses written.

        Jobs take turns (module doc, "Isolation"): at most :data:`SLICE_WINDOWS` windows of one
        job before every other job with windows due has had its turn.

        Args:
            now_ns: The present, ns since the epoch (default: the wall clock).
            budget_s: Stop after the first round of turns that ends past this many seconds
                (the rest waits for the next pass); None = go on until nothing is due.

        Returns:
            Every diagnosis version written, in order (one id may appear several times).

        Raises:
            StoreError: the store failed (for a job: nothing of it past the failing window was
                analysed, the other jobs were; the first such error is raised after the pass).
        """
        now = time.time_ns() if now_ns is None else int(now_ns)
        deadline = None if budget_s is None else time.monotonic() + budget_s
        written: list[Diagnosis] = []
        spans = self._list(now)
        first_error: ArgusError | None = None
        turn = spans
        behind: list[JobSpan] = []  # jobs with more windows due than their turn took
        while turn:
            behind = []
            for span in turn:
                try:
                    if self._run_job(span, now, written):
                        behind.append(span)
                except ArgusError as exc:  # its store calls failed: the other jobs go on
                    log.warning("analysis of job %s stopped for this pass: %s", span.job_id, exc)
                    first_error = first_error or exc
                except Exception:  # outside its windows (they contain their own): the others go on
                    log.exception("analysis of job %s failed for this pass", span.job_id)
                    if self.metrics is not None:
                        self.metrics.analysis_failures.labels(job_id=span.job_id).inc()
            if deadline is not None and time.monotonic() >= deadline:
                break
            turn = behind
        self._backlog = bool(behind)
        self._forget({span.job_id for span in spans})
        if first_error is not None:
            raise first_error
        return written

    def held(self) -> list[str]:
        """Ids of the jobs whose analysis state this analyzer holds, sorted."""
        return sorted(self._jobs)

    def _list(self, now: int) -> list[JobSpan]:
        """The jobs of this pass, with their spans, in job-id order (module doc, "Which jobs").

        Raises:
            StoreError: a query failed (the store's).
        """
        until = now + FUTURE_SLACK_NS
        if self.job is not None or self.backlog_ns is None:
            return list_jobs(self.store, self.job, until_ns=until)
        active = active_job_ids(self.store, self.idle_s, IMPORT_IDLE_S)
        imports = active.imported
        # A job this analyzer still has windows of to analyse (it is behind) stays listed.
        waiting = set(self._due) | {j for j, job in self._jobs.items() if job.attempts}
        live = sorted((set(active.live) | waiting) - imports.keys() - self._imports.keys())
        lo = now - self.backlog_ns - self.window_ns
        for span in list_jobs(self.store, until_ns=until, jobs=live, from_ns=lo):
            self._spans[span.job_id] = span
        fresh = [j for j, seen in imports.items() if self._imports.get(j, (None,))[0] != seen]
        for span in list_jobs(self.store, until_ns=until, jobs=fresh):
            self._imports[span.job_id] = (imports[span.job_id], span)
        spans = [self._spans[j] for j in live if j in self._spans]
        spans += [span for j, (_, span) in self._imports.items() if j in imports]
        return sorted(spans, key=lambda span: span.job_id)

    def _forget(self, listed: set[str]) -> None:
        """Drop what is held of the jobs not ``listed`` in this pass (idle past the horizon, nothing
        of them due): their state, spans and metric series. Their open diagnoses stay open in the
        store, as the tracker would keep them without new windows; a job that reports again
        resumes from what its diagnoses recorded, as after a restart (module doc)."""
        for gone in self._due.keys() - listed:
            del self._due[gone]
        for gone in self._jobs.keys() - listed:
            del self._jobs[gone]
            if self.metrics is not None and gone in self._exported:
                self.metrics.forget_job(gone)
            self._exported.discard(gone)
        for held in (self._spans, self._imports):
            for gone in held.keys() - listed:
                del held[gone]

    def retrying(self) -> bool:
        """Whether a window of some job waits to be retried (its analysis raised; see the module doc)."""
        return any(job.attempts for job in self._jobs.values())

    def _run_job(self, span: JobSpan, now: int, written: list[Diagnosis]) -> bool:
        """One job's turn in a pass: its complete windows not analysed yet, in order, at most
        :data:`SLICE_WINDOWS` of them; the diagnoses written go into ``written``. True when more
        of its windows are complete (its next turn comes after the other jobs')."""
        job = self._job(span, now)
        end = self._complete_to(span, job, now)
        if job.cursor_ns + self.window_ns <= end:
            self._due.setdefault(span.job_id, now)  # due by now at the latest
        analysed = 0
        while job.cursor_ns + self.window_ns <= end and now >= job.retry_at_ns:
            nxt = job.next_visit()
            if nxt != job.cursor_ns:  # an imported job's gap: nothing in it to analyse
                job.cursor_ns = self.window.start_ns(end) if nxt is None else nxt
                job.analysed_to_ns = job.cursor_ns
                continue
            if analysed == SLICE_WINDOWS:
                return True  # its turn is over; the others go first
            done = self._analyze_window(job, job.cursor_ns, now)
            if done is None:
                break  # retried on a later pass
            analysed += 1
            written.extend(done)
            job.cursor_ns += self.window_ns
            job.analysed_to_ns = job.cursor_ns
        more = span.last_ns + TRAILING_WINDOWS * self.window_ns  # its rows reach this far
        if not span.imported and job.cursor_ns + self.window_ns <= more:
            self._due[span.job_id] = job.cursor_ns + self.window_ns + self.grace_ns  # its next window
        else:
            self._due.pop(span.job_id, None)  # nothing of it waits
        if span.job_id in self._due:
            self._update_gauges(span.job_id, job)
        elif self.metrics is not None and span.job_id in self._exported:
            self._exported.discard(span.job_id)
            self.metrics.forget_job(span.job_id)  # its rows are all analysed: it ended (module doc)
        return False

    def _complete_to(self, span: JobSpan, job: _Job, now: int) -> int:
        """Where ``job``'s complete windows end, ns: past the grace for late rows, within its rows'
        reach, and for a live job no later than its ranks' stored heartbeats (module doc)."""
        end = min(now - self.grace_ns, span.last_ns + TRAILING_WINDOWS * self.window_ns)
        if not span.imported and job.cursor_ns + self.window_ns <= end:
            # Wait for every rank still reporting to have its rows past the window stored (its
            # node agent may be behind), at most WAIT_WINDOWS windows: a window analysed with
            # some ranks' rows missing sees a fault that is not there, or misses one.
            since = job.cursor_ns - WAIT_WINDOWS * self.window_ns
            mark = read_watermark(self.store, span.job_id, since)
            if mark is not None:
                end = min(end, max(mark, now - (WAIT_WINDOWS + 1) * self.window_ns))
        return end

    def _job(self, span: JobSpan, now: int) -> _Job:
        job = self._jobs.get(span.job_id)
        if job is not None and not (job.capped and span.imported):
            return job
        # Imported traces are of past runs: the backlog limit (for live jobs) does not apply.
        start = span.first_ns
        if self.backlog_ns is not None and not span.imported:
            start = max(start, now - self.backlog_ns)
        cursor = self.window.start_ns(start)
        old = job
        job = _Job(JobAnalysis(span.job_id, self.window_ns, min_loss_pct=self.min_loss_pct), cursor)
        job.capped = cursor > self.window.start_ns(span.first_ns)
        if span.imported:
            with_data = read_data_windows(self.store, span.job_id, self.window_ns)
            after = np.arange(TRAILING_WINDOWS + 1, dtype=np.int64) * self.window_ns
            job.visit = np.unique((with_data[:, None] + after).ravel())
        stored = read_diagnoses(self.store, span.job_id)
        states = read_states(self.store, span.job_id)
        job.stored_states = {i: st.tracker for i, st in states.items()}
        # An import met again (see the module doc) is analysed from its start, replacing this
        # analyzer's own partial pass: nothing to resume.
        resume = max((self._analysed_to(d, states) for d in stored), default=0) if old is None else 0
        job.replay_to_ns = -(-resume // self.window_ns) * self.window_ns  # the first whole window after it
        if job.replay_to_ns >= span.last_ns + TRAILING_WINDOWS * self.window_ns:
            job.cursor_ns = max(job.cursor_ns, job.replay_to_ns)  # finished and fully analysed
        job.stored_open = [d for d in stored if d.state == State.OPEN.value]
        if job.replay_to_ns <= job.cursor_ns:
            job.analysis.tracker.load(job.stored_open, job.stored_states)
        self._jobs[span.job_id] = job
        return job

    def _analysed_to(self, d: Diagnosis, states: dict[str, StoredState]) -> int:
        """End of the window whose analysis wrote ``d``, ns (older rows: their evidence, or the window
        after its last)."""
        stored = states.get(d.id)
        if stored is not None and stored.analysed_to_ns > 0:
            return stored.analysed_to_ns
        end = d.evidence.get("analysed_to_ns")
        return int(end) if isinstance(end, int) else d.last_window_ns + self.window_ns

    def _resume(self, job: _Job) -> None:
        """End of the replay: the stored open diagnoses replace what the replay found."""
        job.analysis.tracker = Tracker(
            job.analysis.job_id, window_ns=self.window_ns, min_loss_pct=self.min_loss_pct
        )
        # Nothing of the job is written during a replay.
        job.analysis.tracker.load(job.stored_open, job.stored_states)

    def _analyze_window(self, job: _Job, w0: int, now: int) -> list[Diagnosis] | None:
        """The diagnoses written for window ``w0``; None when it failed and is retried later.

        Any exception but a store error, in any stage (read, analysis, L5 and writes), is this
        job's failed window (:meth:`_window_failed`), never the pass's.

        Raises:
            ArgusError: a store call failed (the window is analysed again on the next pass).
        """
        tracker = copy.deepcopy(job.analysis.tracker)  # small: the open diagnoses and streaks
        try:
            return self._window_stages(job, w0, now)
        except ArgusError:
            job.analysis.tracker = tracker  # the window is analysed again on the next pass
            raise
        except Exception:
            job.analysis.tracker = tracker  # as before the attempt
            return self._window_failed(job, w0, now)

    def _window_failed(self, job: _Job, w0: int, now: int) -> list[Diagnosis] | None:
        """A window whose analysis raised: retried with backoff, then skipped (module doc)."""
        job.attempts += 1
        if job.attempts < MAX_ATTEMPTS and not job.failing:
            job.retry_at_ns = now + self.retry_backoff_ns * 2 ** (job.attempts - 1)
            log.debug("analysis of job %s window %d failed; retried", job.analysis.job_id, w0, exc_info=True)
            return None
        self._failed(job, w0, w0 + self.window_ns)
        job.attempts, job.retry_at_ns, job.failing = 0, 0, True
        return []

    def _window_stages(self, job: _Job, w0: int, now: int) -> list[Diagnosis]:
        """Read, analyse and write window ``w0`` (:meth:`_analyze_window` contains what raises)."""
        self._stage_start = time.monotonic()
        w1 = w0 + self.window_ns
        job.live = job.live.merge(read_liveness(self.store, job.analysis.job_id, w0 - self.window_ns, w1))
        window = read_window(self.store, job.analysis.job_id, w0, w1, job.live)
        self._time("read")
        if job.attempts == 0:
            self._mismatch(job, w0, window.mismatched_kernel_rows)
        if w0 < job.replay_to_ns:
            with contextlib.suppress(Exception):  # a window that failed before fails again: skip it
                job.suspects = job.analysis.analyze(window).suspects
            if w1 >= job.replay_to_ns:
                self._resume(job)
            return []
        result = job.analysis.analyze(window)
        self._time("analyse")
        changed = result.changed
        self._last_version = max(time.time_ns(), self._last_version + 1)
        states = {d.id: job.analysis.tracker.state(d.id) for d in changed}
        # L5: the stacks of flagged ranks go into the evidence; new captures are asked for.
        requests = self.stacks.requests(
            changed,
            job.analysis.tracker.open,
            list(job.live.last_seen),
            job.analysis.roles,
            time.time_ns(),
            self.window_ns,
        )
        changed = self.stacks.with_top_frames(changed)
        self._count_skipped(window.skipped_rows)
        write_diagnoses(self.store, changed, self._last_version, analysed_to_ns=w1, states=states)
        self.stacks.write(requests)
        self._account(job, w0, result.accounting)
        if result.roles is not None:
            write_roles(self.store, job.analysis.job_id, result.roles, self._last_version)
        job.attempts, job.retry_at_ns, job.failing = 0, 0, False
        self._time("write")
        job.suspects = result.suspects
        for d in changed:
            log.info("diagnosis %s", render.line(d))
        return changed

    def _mismatch(self, job: _Job, w0: int, rows: int) -> None:
        """Report ``rows`` kernel summaries of window ``w0`` summarised in another window length (a
        node agent or an import with another ``--window-s``): counted, and logged once per job."""
        if rows == 0:
            return
        if self.metrics is not None:
            self.metrics.window_mismatch_rows.inc(rows)
        if job.mismatched_rows == 0:
            log.warning(
                "job %s: %d kernel_summaries rows of window %d were summarised in another window than "
                "the analyzer's %s (a node agent or an import with another --window-s): they are left out "
                "of the analysis; give the server, agents and `argus run` one --window-s",
                job.analysis.job_id,
                rows,
                w0,
                self.window,
            )
        job.mismatched_rows += rows

    def _count_skipped(self, rows: dict[str, int]) -> None:
        """Count the rows a window's reads skipped (past :mod:`argus.limits`; an older store's)."""
        skipped = dict(rows)
        if self.stacks.skipped_rows:
            skipped["stacks"] = skipped.get("stacks", 0) + self.stacks.skipped_rows
            self.stacks.skipped_rows = 0
        for table, n in skipped.items():
            if n and self.metrics is not None:
                self.metrics.analysis_skipped_rows.labels(table=table).inc(n)

    def _time(self, stage: str) -> None:
        """Observe the wall time since the last stage of a window's analysis ended (or its start)."""
        now = time.monotonic()
        if self.metrics is not None:
            self.metrics.analysis_window_seconds.labels(stage).observe(now - self._stage_start)
        self._stage_start = now

    def _account(self, job: _Job, w0: int, acc: Accounting, status: str = "analysed") -> None:
        """Record a window's lost time (store and metrics)."""
        job_id = job.analysis.job_id
        write_window(
            self.store,
            job_id,
            w0,
            self.window_ns,
            status=status,
            wall_ns=acc.wall_ns,
            steps=acc.steps,
            lost_ns=acc.lost_ns,
            explained_ns=acc.explained_ns,
            updated_ns=self._last_version,
        )
        job.lost_ns += acc.lost_ns
        job.unexplained_ns += acc.unexplained_ns
        if self.metrics is not None:
            self._exported.add(job_id)
            self.metrics.lost_time.labels(job_id=job_id).inc(acc.lost_ns / 1e9)
            if acc.steps > 0:
                self.metrics.step_time.labels(job_id=job_id).set(acc.wall_ns / acc.steps / 1e9)
            ratio = job.unexplained_ns / job.lost_ns if job.lost_ns > 0 else 0.0
            self.metrics.unexplained_loss.labels(job_id=job_id).set(min(max(ratio, 0.0), 1.0))

    def _failed(self, job: _Job, w0: int, w1: int) -> None:
        """A window whose analysis raised: logged, counted, recorded; its time counts as unexplained."""
        log.exception(
            "analysis of job %s window %d failed %d times; skipped", job.analysis.job_id, w0, job.attempts
        )
        if self.metrics is not None:
            self._exported.add(job.analysis.job_id)
            self.metrics.analysis_failures.labels(job_id=job.analysis.job_id).inc()
        self._last_version = max(time.time_ns(), self._last_version + 1)
        lost = float(w1 - w0)
        self._account(job, w0, Accounting(lost, 0, lost, 0.0, float("nan")), status="failed")

    def _update_gauges(self, job_id: str, job: _Job) -> None:
        """The job's score and open-diagnosis series: the ranks of its open diagnoses (their score)
        and its latest window's top suspects."""
        m = self.metrics
        if m is None:
            return
        self._exported.add(job_id)
        open_by_cause: dict[str, int] = {}
        flagged: dict[int, float] = {}
        for d in job.analysis.tracker.open:
            open_by_cause[d.cause] = open_by_cause.get(d.cause, 0) + 1
            for r in [d.rank] if d.rank is not None else d.ranks[:TOP_SUSPECTS]:  # bounded series
                flagged[r] = max(flagged.get(r, 0.0), float(d.score), 0.0)
        m.set_straggler_scores(job_id, {r: max(float(score), 0.0) for r, score in job.suspects}, flagged)
        m.set_active_diagnoses(job_id, open_by_cause)

    def run_forever(self) -> None:
        """Call :meth:`run_once` until :meth:`stop`; store errors are logged and retried.

        The next pass starts when the next window of a job falls due (its end plus the grace),
        after the polling interval at the latest, or at once when this one ended on its budget
        with windows still due (an analyzer behind catches up without sleeping).
        """
        poll = self._poll_s()
        while not self._stop.is_set():
            self._backlog = False
            try:
                self.run_once(budget_s=poll)
            except ArgusError as exc:
                log.warning("analysis failed, retrying: %s", exc)
            except Exception:
                log.exception("analysis failed unexpectedly, retrying")
            self._stop.wait(0.0 if self._backlog else self._until_due_s(poll))

    def _until_due_s(self, poll: float) -> float:
        """Seconds until the next job's window falls due, at most ``poll``. Windows due already
        (waiting for a node agent's rows) are looked at again after ``poll``, not at once."""
        now = time.time_ns()
        ahead = [(due - now) / 1e9 for due in self._due.values() if due > now]
        return min([poll, *ahead])

    def _poll_s(self) -> float:
        # A window completes every window_s; checking twice as often bounds the lag to half a window
        # (plus the grace) without querying the store more than needed.
        return min(max(self.window.seconds / 2, 0.5), 5.0)

    def stop(self) -> None:
        """Make :meth:`run_forever` return after the current pass."""
        self._stop.set()


def main(args: argparse.Namespace) -> int:
    """`argus analyze --store URL [--window-s S] [--once] [--job ID]`.

    With ``--once``, analyzes every complete window stored (from each job's first
    row, or after what an earlier analysis recorded), prints every stored diagnosis
    (of ``--job``, or of every job) one per line, and exits 0. Without it, runs
    until interrupted.
    """
    store = open_store(args.store)
    analyzer = Analyzer(
        store,
        window=WindowGrid.from_seconds(args.window_s),
        job=args.job,
        backlog_s=None if args.once else DEFAULT_BACKLOG_S,
        min_loss_pct=args.min_loss_pct,
        stack_interval_s=args.stack_interval_s,
        retry_backoff_s=0.0 if args.once else None,
    )
    if not args.once:
        try:
            analyzer.run_forever()
        except KeyboardInterrupt:
            analyzer.stop()
        return 0
    analyzer.run_once()
    while analyzer.retrying():  # a window whose analysis raised: its attempts, then skipped
        analyzer.run_once()
    stored = read_diagnoses(store, args.job)
    for d in sorted(stored, key=lambda d: (d.job_id, d.first_window_ns)):
        print(render.line(d))
    if not stored:
        print("no diagnoses")
    return 0
