"""One job's analysis, window after window: the levels, causes and lifecycle without any I/O.

:class:`JobAnalysis` holds what must outlive a window (the job's recent step
times for L1, its groups' healthy transfer times for slow-link history, the
open diagnoses) and turns each :class:`~argus.analyzer.window.Window` into the
diagnoses to write. The service feeds it windows read from the store; the
detection benchmark feeds it synthetic windows directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from argus.analyzer.causes import attribute
from argus.analyzer.collectives import Decomposition, decompose, slow_links, transfer_medians
from argus.analyzer.findings import Finding
from argus.analyzer.host import host_signals
from argus.analyzer.iteration import compare_iterations, job_last_end, job_step_times
from argus.analyzer.kernels import score_kernels
from argus.analyzer.lifecycle import OPEN_SCORE, Tracker
from argus.analyzer.links import locate_slow_links
from argus.analyzer.liveness import find_unresponsive, silence_threshold_ns
from argus.analyzer.phase import WARMUP_STEPS, compare_phases
from argus.analyzer.window import Window
from argus.diagnosis import Diagnosis

__all__ = ["JobAnalysis", "WindowResult"]

#: Job step times of healthy windows (no finding at the opening score, nothing open) kept as the L1 baseline.
HISTORY_STEPS = 512
#: Healthy windows of each rank's trimmed self-time excess kept as its L2 baseline.
EXCESS_HISTORY_WINDOWS = 8
#: Windows of healthy transfer medians kept per (group, op, size class).
LINK_HISTORY_WINDOWS = 8


@dataclass(frozen=True)
class WindowResult:
    """What one window produced.

    Attributes:
        findings: Every finding of the window (before the lifecycle).
        changed: Diagnoses opened, updated or resolved (to write).
        suspects: ``(rank, score)`` of the highest-scoring ranks, best first.
    """

    findings: list[Finding]
    changed: list[Diagnosis]
    suspects: list[tuple[int, float]]


class JobAnalysis:
    """Stateful analysis of one job.

    Args:
        job_id: The job.
        window_ns: Analysis window, ns.
    """

    def __init__(self, job_id: str, window_ns: int) -> None:
        self.job_id = job_id
        self.window_ns = window_ns
        self.tracker = Tracker(job_id, window_ns=window_ns)
        self._steps: deque[float] = deque(maxlen=HISTORY_STEPS)
        self._links: dict[tuple[str, int], deque[float]] = {}
        self._excess: dict[int, deque[float]] = {}
        self._suspects: list[tuple[int, float]] = []
        #: (step, end ns) of the job's newest step seen, for the next window's first step time.
        self._last_end: tuple[int, int] | None = None

    @property
    def typical_step_ns(self) -> float | None:
        """Median of the job's recent step times in healthy windows, ns, or None before any."""
        return float(np.median(self._steps)) if self._steps else None

    def analyze(self, w: Window) -> WindowResult:
        """Run L1, L2, L3, liveness, causes and the lifecycle on one window."""
        c = w.collectives
        group_sizes = {name: int(m.size) for name, m in w.status.groups.items()}
        d: Decomposition | None = decompose(c, group_sizes=group_sizes) if c.rank.size else None
        step, step_ns = job_step_times(w.steps, min_step=WARMUP_STEPS, before=self._last_end)
        self._last_end = job_last_end(w.steps) or self._last_end
        l1 = compare_iterations(step, step_ns, list(self._steps))
        l2 = compare_phases(w, d, {r: float(np.median(v)) for r, v in self._excess.items() if len(v) >= 2})
        l3 = score_kernels(w.kernels)
        host = host_signals(w.host)
        history = {k: float(np.median(v)) for k, v in self._links.items() if len(v) >= 2}
        links = slow_links(d, c.group_names, history) if d is not None else []
        unresponsive = find_unresponsive(
            w.status,
            w.end_ns,
            silence_ns=silence_threshold_ns(self.window_ns),
            typical_step_ns=self.typical_step_ns,
        )
        findings = attribute(w, l1=l1, l2=l2, l3=l3, host=host, links=links, unresponsive=unresponsive)
        findings = locate_slow_links(findings, w, d)  # a slow group's ranks → the nodes whose link is slow
        observed = set(np.unique(w.steps.rank).tolist()) | set(np.unique(w.host.rank).tolist())
        observed |= set(np.unique(w.kernels.rank).tolist())
        changed = self.tracker.update(w.start_ns, findings, observed)
        if w.status.rank.size and bool(np.all(w.status.exited)):
            changed += self.tracker.finish()

        # The L1 baseline is the job's step time while healthy: a fault's windows would make its own
        # slowdown the baseline (and hide it from the evidence).
        if not self.tracker.open and not any(f.score >= OPEN_SCORE for f in findings):
            self._steps.extend(step_ns.tolist())
        flagged = {r for f in findings for r in f.ranks}
        for r, frac, score in zip(l2.rank.tolist(), l2.trimmed_frac.tolist(), l2.score.tolist(), strict=True):
            if np.isfinite(frac) and np.isfinite(score) and score < 0.5 and r not in flagged:
                self._excess.setdefault(r, deque(maxlen=EXCESS_HISTORY_WINDOWS)).append(frac)
        if d is not None:
            slow = {f.group for f in findings if f.cause == "communication"}
            for key, value in transfer_medians(d, c.group_names).items():
                if key[0] not in slow:
                    self._links.setdefault(key, deque(maxlen=LINK_HISTORY_WINDOWS)).append(value)
        if l2.rank.size or l3.rank.size or findings:
            self._suspects = _suspects(l2.rank, l2.score, l3.rank, l3.score, findings, self.tracker.open)
        # A window without comparable data (the job paused or ended) keeps the last suspects.
        return WindowResult(findings, changed, self._suspects)


def _suspects(
    r2: np.ndarray,
    s2: np.ndarray,
    r3: np.ndarray,
    s3: np.ndarray,
    findings: list[Finding],
    open_: list[Diagnosis],
    top: int = 5,
) -> list[tuple[int, float]]:
    """The ``top`` ranks by score over L2, L3, this window's findings and the open diagnoses."""
    best: dict[int, float] = {}
    for d in open_:
        for r in d.ranks[:top]:
            best[r] = max(best.get(r, 0.0), d.score)
    for ranks, scores in ((r2, s2), (r3, s3)):
        ok = np.isfinite(scores)
        if not np.any(ok):
            continue
        order = np.argsort(-scores[ok])[:top]
        for r, s in zip(ranks[ok][order].tolist(), scores[ok][order].tolist(), strict=True):
            best[r] = max(best.get(r, 0.0), s)
    for f in findings:
        for r in f.ranks:
            best[r] = max(best.get(r, 0.0), f.score)
    return sorted(best.items(), key=lambda kv: -kv[1])[:top]
