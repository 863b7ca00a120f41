"""A finding: what one window says about one fault, before the lifecycle turns it into a diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from argus.diagnosis import Cause

__all__ = ["JOB_SUBJECT", "KEEP_SCORE", "STRAGGLER_CAUSES", "Finding", "family"]

#: Findings below this score are dropped (:mod:`~argus.analyzer.causes`); an open diagnosis is
#: kept by findings down to it (:mod:`~argus.analyzer.lifecycle`).
KEEP_SCORE = 0.5

#: Causes of one slow rank (or several): the lifecycle lets a fault's cause follow the evidence.
STRAGGLER_CAUSES = frozenset({Cause.COMPUTE, Cause.HOST_STALL, Cause.DATALOADER, Cause.THROTTLING})


@dataclass(frozen=True)
class Finding:
    """One fault seen in one window; fields as in :class:`argus.diagnosis.Diagnosis`.

    ``subject`` identifies the fault across windows together with ``family``:
    ``rank:R`` for one rank, ``many`` for many ranks of one cause, ``group:G``
    for a process group, ``ranks:a,b,...`` for a set of ranks outside any group,
    ``job`` for the job's loss that no rank explains.
    """

    cause: str
    rank: int | None
    ranks: tuple[int, ...]
    group: str | None
    phase: str | None
    kernel: str | None
    score: float
    slowdown_pct: float
    subject: str
    evidence: dict[str, Any] = field(default_factory=dict)
    #: For a many-rank finding, every candidate rank's score (the lifecycle keeps members down
    #: to the keep score and admits new ones at the open score).
    member_scores: dict[int, float] = field(default_factory=dict)
    #: True when one window is not enough to open a diagnosis (see :mod:`argus.analyzer.lifecycle`).
    needs_confirmation: bool = False
    #: The share of the window's lost time this fault accounts for, ns, and the wall time of the
    #: window's steps, ns (:mod:`argus.analyzer.loss`); the lifecycle adds both up over a
    #: diagnosis's windows: ``slowdown_pct = 100 · lost / wall`` over its span.
    lost_ns: float = 0.0
    wall_ns: float = 0.0
    #: Per step column of the window's L2 result, how long the job waited for this fault, ns
    #: (what :mod:`argus.analyzer.loss` shares the window's lost time by); empty when unknown.
    waited_ns: tuple[float, ...] = ()
    #: True when as many ranks look slow as are left to compare them with, on a thin reference:
    #: which side is slow is unclear, so only a strong score held for two windows opens it.
    ambiguous: bool = False
    #: True when the finding is the job's unexplained loss (:mod:`argus.analyzer.loss`: the
    #: job-level finding, or the one rank behind that explains it): one window of it, however
    #: large (a checkpoint, a rank the scheduler held up), is no sustained loss; two open it.
    job_loss: bool = False

    @property
    def family(self) -> str:
        """``job`` for the unexplained loss, ``straggler`` for :data:`STRAGGLER_CAUSES`, else the cause."""
        return family(self.cause, self.subject)


def family(cause: str, subject: str) -> str:
    """The family a fault of ``cause`` and ``subject`` belongs to (its identity with the subject)."""
    if subject == JOB_SUBJECT:
        return "job"
    return "straggler" if cause in STRAGGLER_CAUSES else cause


#: Subject of the job-level finding (a loss no rank-level finding explains).
JOB_SUBJECT = "job"
