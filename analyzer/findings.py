"""A finding: what one window says about one fault, before the lifecycle turns it into a diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from argus.diagnosis import Cause

__all__ = ["STRAGGLER_CAUSES", "Finding"]

#: Causes of one slow rank (or several): the lifecycle lets a fault's cause follow the evidence.
STRAGGLER_CAUSES = frozenset({Cause.COMPUTE, Cause.HOST_STALL, Cause.DATALOADER, Cause.THROTTLING})


@dataclass(frozen=True)
class Finding:
    """One fault seen in one window; fields as in :class:`argus.diagnosis.Diagnosis`.

    ``subject`` identifies the fault across windows together with ``family``:
    ``rank:R`` for one rank, ``many`` for many ranks of one cause, ``group:G``
    for a process group, ``ranks:a,b,...`` for a set of ranks outside any group.
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
    #: What ``slowdown_pct`` is computed from, when it is a time the job waited:
    #: ``(waited ns, job wall time ns, steps)`` summed over the window's steps. The lifecycle
    #: adds these up over a diagnosis's windows.
    cost_ns: tuple[float, float, int] | None = None
    #: True when as many ranks look slow as are left to compare them with, on a thin reference:
    #: which side is slow is unclear, so only a strong score held for two windows opens it.
    ambiguous: bool = False

    @property
    def family(self) -> str:
        """``straggler`` for the causes of :data:`STRAGGLER_CAUSES`, else the cause itself."""
        return "straggler" if self.cause in STRAGGLER_CAUSES else self.cause
