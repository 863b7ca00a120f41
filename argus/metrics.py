"""Prometheus metrics of an `argus server` (docs/design.md §9.3), on a registry of its own.

Every server instance builds one :class:`Metrics`; the collector, the analyzer
and the REST API (which serves ``/metrics``) share it. Label values are bounded:
``job_id``/``rank`` appear only for the ranks of open diagnoses and the top suspects the analyzer
exports, the other per-job series have ``job_id`` alone; and a job's series are removed once the
analyzer has analysed its last rows (:meth:`Metrics.forget_job`): an ended job fires no alert.
No ``_created`` series (:func:`prometheus_client.disable_created_metrics`, for the process): a
counter's start time is noise beside its rate. ``argus_analysis_lag_seconds`` is read when scraped
(:meth:`argus.analyzer.service.Analyzer.lag_s`): only jobs with data waiting count.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

__all__ = ["ACK_BUCKETS_S", "TOP_SUSPECTS", "Metrics"]

disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

#: At most this many (job_id, rank) series of argus_straggler_score per job.
TOP_SUSPECTS = 5
#: Buckets of ``argus_ingest_ack_seconds``, s: around the 1 s an agent's ack should stay under.
ACK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The server's metric objects; ``registry`` is what ``/metrics`` exposes."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.ingest_batches = Counter(
            "argus_ingest_batches_total",
            "Batches answered, by table and ack status.",
            ["table", "status"],
            registry=r,
        )
        self.ingest_rows = Counter("argus_ingest_rows_total", "Rows stored, by table.", ["table"], registry=r)
        self.ingest_bytes = Counter("argus_ingest_bytes_total", "Arrow payload bytes stored.", registry=r)
        self.ingest_ack_seconds = Histogram(
            "argus_ingest_ack_seconds",
            "From a batch's arrival on its agent stream to its ack, seconds: decode, validation, "
            "the writer's queue and insert, and the acks ahead of it on the stream.",
            buckets=ACK_BUCKETS_S,
            registry=r,
        )
        self.ingest_rejected = Counter(
            "argus_ingest_rejected_total", "Batches rejected, by gRPC status code name.", ["code"], registry=r
        )
        self.agent_dropped = Counter(
            "argus_agent_dropped_events_total",
            "Events node agents and probes reported lost (full buffers, full spool).",
            registry=r,
        )
        self.straggler_score = Gauge(
            "argus_straggler_score",
            "Straggler score of the ranks of a running job's open diagnoses and of its latest window's "
            "top suspects (0 = like its peers, >= 1 = detected); removed when the job ends.",
            ["job_id", "rank"],
            registry=r,
        )
        self.step_time = Gauge(
            "argus_step_time_seconds",
            "A running job's mean step time in its latest analysed window, seconds (one series per "
            "job, whatever its ranks); removed when the job ends.",
            ["job_id"],
            registry=r,
        )
        self.diagnosis_active = Gauge(
            "argus_diagnosis_active", "Open diagnoses, by job and cause.", ["job_id", "cause"], registry=r
        )
        self.lost_time = Counter(
            "argus_lost_time_seconds",
            "Job time lost against the job's own healthy pace, by job (argus.analyzer.loss).",
            ["job_id"],
            registry=r,
        )
        self.unexplained_loss = Gauge(
            "argus_unexplained_loss_ratio",
            "Share (0-1) of a job's lost time that no diagnosis accounts for, over its analysed windows.",
            ["job_id"],
            registry=r,
        )
        self.analysis_failures = Counter(
            "argus_analysis_failures",
            "Analysis windows skipped after their analysis failed, by job (their time is unexplained).",
            ["job_id"],
            registry=r,
        )
        self.window_mismatch_rows = Counter(
            "argus_window_mismatch_rows",
            "kernel_summaries rows the analyzer left out because their window_ns is not its window "
            "(an agent, or an import, with another --window-s); server-wide, so it outlives the job "
            "(the log line names the job).",
            registry=r,
        )
        self.analysis_skipped_rows = Counter(
            "argus_analysis_skipped_rows",
            "Stored rows the analyzer skipped where it read them, by table: values past the limits "
            "ingest applies (argus.limits), in a store written before it applied them.",
            ["table"],
            registry=r,
        )
        self.analysis_window_seconds = Histogram(
            "argus_analysis_window_seconds",
            "Wall time of one job window's analysis, seconds, by stage: read (its rows from the store), "
            "analyse (the levels and the lifecycle), write (diagnoses, accounting, roles).",
            ["stage"],
            buckets=ACK_BUCKETS_S,
            registry=r,
        )
        self.analysis_lag = Gauge(
            "argus_analysis_lag_seconds",
            "How long the oldest window due for analysis has waited (0 when no job has data waiting).",
            registry=r,
        )
        self.last_ingest = Gauge(
            "argus_last_ingest_timestamp_seconds", "Unix time of the last stored batch.", registry=r
        )
        self.jobs = Gauge(
            "argus_jobs",
            "Jobs with a lifecycle event or heartbeat in the last hour, by status (set on each scrape).",
            ["status"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._suspects: dict[str, set[str]] = {}
        self._causes: dict[str, set[str]] = {}

    def set_straggler_scores(
        self, job_id: str, scores: Mapping[int, float], flagged: Mapping[int, float] | None = None
    ) -> None:
        """Export the :data:`TOP_SUSPECTS` highest of ``scores`` (rank → score) for ``job_id``, and
        every rank of ``flagged`` (rank → score: the ranks of its open diagnoses).

        Replaces the job's previous series, so a job never has more than TOP_SUSPECTS series
        beside its open diagnoses' ranks, however many ranks it has.
        """
        top = heapq.nlargest(TOP_SUSPECTS, scores.items(), key=lambda item: item[1])
        merged = dict(top)
        for rank, score in (flagged or {}).items():
            merged[rank] = max(score, merged.get(rank, score))
        top = list(merged.items())
        with self._lock:
            keep = {str(rank) for rank, _ in top}
            for stale in self._suspects.get(job_id, set()) - keep:
                self.straggler_score.remove(job_id, stale)
            for rank, score in top:
                self.straggler_score.labels(job_id, str(rank)).set(score)
            self._suspects[job_id] = keep

    def set_active_diagnoses(self, job_id: str, counts: Mapping[str, int]) -> None:
        """Export ``counts`` (cause → open diagnoses) for ``job_id``; causes left out are removed."""
        with self._lock:
            keep = {cause for cause, n in counts.items() if n > 0}
            for cause in self._causes.get(job_id, set()) - keep:
                self.diagnosis_active.remove(job_id, cause)
            for cause in keep:
                self.diagnosis_active.labels(job_id, cause).set(counts[cause])
            self._causes[job_id] = keep

    def forget_job(self, job_id: str) -> None:
        """Remove every series of ``job_id`` (when its last rows are analysed: it ended, or fell silent)."""
        self.set_straggler_scores(job_id, {})
        self.set_active_diagnoses(job_id, {})
        with self._lock:
            self._suspects.pop(job_id, None)
            self._causes.pop(job_id, None)
            for per_job in (
                self.lost_time,
                self.unexplained_loss,
                self.analysis_failures,
                self.step_time,
            ):
                with contextlib.suppress(KeyError):  # never set for this job
                    per_job.remove(job_id)
