"""L1: the job's step time against its own recent baseline — spikes and change points (docs/design.md §6.3).

The job's time for step ``s`` is the wall time between its end and the end of
step ``s - 1`` (a synchronous job ends each step when its slowest rank does;
:func:`job_step_times`). Against the baseline of earlier windows' steps:

* a **change point** is a window whose step times are stochastically larger
  than the baseline's: a one-sided Mann–Whitney U test
  (:func:`scipy.stats.mannwhitneyu`, ``alternative="greater"``) below
  :data:`CHANGE_P`, with a median shift of at least :data:`CHANGE_MIN_SHIFT`;
  its onset is the first step of the window above the midpoint of the two
  medians;
* a **spike** is a step above ``median + max(K·σ_MAD, SPIKE_MIN_RATIO·median)`` of
  the baseline.

The baseline is the job's step times in recent *healthy* windows (the
analyzer leaves out windows with an open diagnosis or a finding at the opening
score), so that a long fault does not become its own baseline.

L1 says *when*; it never names a rank, and a change alone never makes a
diagnosis (a checkpoint or a slower data epoch changes every rank). The
analyzer uses it for the evidence and the slowdown of faults found by L2/L3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import mannwhitneyu

from argus.analyzer import dense
from argus.analyzer.robust import MAD_TO_SIGMA
from argus.analyzer.window import Steps

__all__ = [
    "CHANGE_MIN_SHIFT",
    "CHANGE_P",
    "IterationResult",
    "compare_iterations",
    "job_last_end",
    "job_step_times",
]

#: p-value below which the window's step times differ from the baseline.
CHANGE_P = 1e-3
#: Smallest relative increase of the median step time that counts as a change.
CHANGE_MIN_SHIFT = 0.05
#: A spike is at least this much above the baseline median (and K robust σ).
SPIKE_MIN_RATIO = 0.5
_K = 5.0
#: Fewest baseline steps for a test.
MIN_BASELINE = 8


@dataclass(frozen=True)
class IterationResult:
    """L1 outcome for one window.

    Attributes:
        step: Step numbers of the window, ascending.
        step_ns: The job's time of each step (slowest rank), ns.
        median_ns: Median step time in the window (NaN if no step).
        baseline_ns: Median of the baseline steps (NaN if too few).
        change: True when the window is a change point.
        p_value: One-sided Mann–Whitney p-value (1.0 when not tested).
        onset_step: First step of the change, or None.
        spike_steps: Steps that are spikes.
        slowdown_pct: ``100·(1 − baseline/median)`` when positive, else 0.
    """

    step: NDArray[np.int64]
    step_ns: NDArray[np.float64]
    median_ns: float
    baseline_ns: float
    change: bool
    p_value: float
    onset_step: int | None
    spike_steps: NDArray[np.int64]
    slowdown_pct: float

    def evidence(self) -> dict[str, object]:
        """The numbers a person would check, JSON-ready."""
        return {
            "job_step_ms": _ms(self.median_ns),
            "baseline_step_ms": _ms(self.baseline_ns),
            "step_time_change": self.change,
            "change_p_value": float(f"{self.p_value:.3g}"),
            "onset_step": self.onset_step,
            "spike_steps": [int(s) for s in self.spike_steps[:20]],
        }


def _ms(ns: float) -> float | None:
    return None if not np.isfinite(ns) else round(ns / 1e6, 3)


def job_step_times(
    steps: Steps, *, min_step: int = 0, before: tuple[int, int] | None = None
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The job's time per step: wall time between the ends of consecutive steps, ns.

    A step ends for the job when its slowest rank ends it; the job's time for step
    ``s`` is that end minus step ``s - 1``'s (divided by the step-number gap when steps
    are missing), so the series sums to wall time and its mean is the inverse of the
    job's throughput. (The slowest rank's step *duration* would count a pause twice
    when it falls between steps: once in the pausing rank's step, once in its
    peers' next step, spent waiting for it.)

    Args:
        steps: The window's steps.
        min_step: Steps numbered below this are dropped (warm-up).
        before: ``(step, end ns)`` of the job's last step before the window, if known, so that
            the window's first step gets a time too.

    Returns:
        ``(step numbers ascending, step time ns)``.
    """
    keep = steps.step >= min_step
    s = steps.step[keep]
    end = (steps.start_ns[keep] + steps.dur_ns[keep]).astype(np.float64)
    if s.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    uniq, inv = dense.unique_inverse(s)
    job_end = np.full(uniq.size, -np.inf)
    np.maximum.at(job_end, inv, end)
    if before is not None and before[0] < uniq[0]:
        uniq = np.r_[before[0], uniq]
        job_end = np.r_[float(before[1]), job_end]
    return uniq[1:].astype(np.int64), np.diff(job_end) / np.diff(uniq)


def job_last_end(steps: Steps) -> tuple[int, int] | None:
    """``(step, end ns)`` of the window's last step (its slowest rank's end), or None."""
    if steps.step.size == 0:
        return None
    last = int(steps.step.max())
    on = steps.step == last
    return last, int((steps.start_ns[on] + steps.dur_ns[on]).max())


def compare_iterations(
    step: NDArray[np.int64], step_ns: NDArray[np.float64], baseline: Sequence[float]
) -> IterationResult:
    """Compare the window's job step times with ``baseline`` (earlier steps' times, ns).

    Args:
        step: Step numbers, ascending, shape ``(s,)``.
        step_ns: Job step time per step, ns, shape ``(s,)``.
        baseline: Earlier job step times, ns (the analyzer keeps a bounded history).
    """
    base = np.asarray(baseline, dtype=np.float64)
    median = float(np.median(step_ns)) if step_ns.size else np.nan
    if base.size < MIN_BASELINE or step_ns.size == 0:
        return IterationResult(step, step_ns, median, np.nan, False, 1.0, None, np.zeros(0, np.int64), 0.0)
    b_med = float(np.median(base))
    b_sigma = MAD_TO_SIGMA * float(np.median(np.abs(base - b_med)))
    spike_at = b_med + max(_K * b_sigma, SPIKE_MIN_RATIO * b_med)
    spikes = step[step_ns > spike_at]
    p = 1.0
    if step_ns.size >= 3:
        p = float(mannwhitneyu(step_ns, base, alternative="greater").pvalue)
    change = p < CHANGE_P and median >= (1 + CHANGE_MIN_SHIFT) * b_med
    onset = None
    if change:
        above = np.flatnonzero(step_ns > 0.5 * (median + b_med))
        onset = int(step[above[0]]) if above.size else int(step[0])
    slowdown = max(0.0, 100.0 * (1.0 - b_med / median)) if median > 0 else 0.0
    return IterationResult(step, step_ns, median, b_med, change, p, onset, spikes, slowdown)
