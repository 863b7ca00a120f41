"""The diagnosis object of DESIGN §5, the same in the REST API, `diagnose --json` and `demo --json`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Cause", "Diagnosis", "State"]


class Cause(StrEnum):
    """Likely cause of a fail-slow fault; exactly one per diagnosis."""

    #: The rank's own compute (forward/backward kernels or CPU ops) is slower than its peers'.
    COMPUTE = "compute"
    #: The rank's host stalls: CPU contention, GC pauses, a blocked Python thread.
    HOST_STALL = "host_stall"
    #: The rank waits for its input batches (the `data` phase grows).
    DATALOADER = "dataloader"
    #: Transfers are slow without a late arrival: a slow link or NIC.
    COMMUNICATION = "communication"
    #: The GPU's clocks are reduced (thermal, power) per NVML throttle reasons.
    THROTTLING = "throttling"
    #: The rank stopped reporting, or hangs: alive but never issuing the collective peers wait in.
    UNRESPONSIVE = "unresponsive"
    #: The job loses time against its own healthy pace and the evidence names no cause.
    UNKNOWN = "unknown"


class State(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class Diagnosis:
    """One ongoing (or resolved) fault of one job.

    Attributes:
        id: Stable id; the analyzer keeps it while the fault lasts.
        job_id: The job.
        rank: The straggler's global rank, or None when the fault is not one rank's
            (a slow link between ranks, many slow ranks).
        ranks: Every rank involved, sorted.
        group: Process group name the comparison ran in, or None for the whole job.
        cause: One of :class:`Cause`'s values.
        phase: ``data``/``forward``/``backward``/``optimizer`` or None.
        kernel: Kernel name when L3 found it, else None.
        score: Unitless; 0 = like its peers, >= 1 = past the detection threshold.
        slowdown_pct: Estimated loss of the job's throughput, percent.
        first_window_ns: Start of the first window the fault was seen in, ns since the epoch.
        last_window_ns: Start of the latest window it was seen in, ns since the epoch.
        state: ``open`` or ``resolved``.
        summary: One sentence a person reads first (who, what, how much, how we know), written
            from the evidence by :func:`argus.summary.summary` when the diagnosis is read (the
            REST API fills it; it is not stored): ``""`` where nobody has filled it yet.
        evidence: The numbers a person would check (JSON-serialisable).
    """

    id: str
    job_id: str
    rank: int | None
    ranks: list[int]
    group: str | None
    cause: str
    phase: str | None
    kernel: str | None
    score: float
    slowdown_pct: float
    first_window_ns: int
    last_window_ns: int
    state: str
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cause not in Cause.__members__.values():
            raise ValueError(f"unknown cause {self.cause!r}; expected one of {[c.value for c in Cause]}")
        if self.state not in State.__members__.values():
            raise ValueError(f"unknown state {self.state!r}; expected 'open' or 'resolved'")

    def to_dict(self) -> dict[str, Any]:
        """The DESIGN §5 JSON object, keys in contract order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        """Inverse of :meth:`to_dict`; ``evidence`` may also be a JSON string.

        Raises:
            ValueError: unknown cause or state.
            TypeError: missing or unexpected keys.
        """
        values = dict(data)
        if isinstance(values.get("evidence"), str):
            values["evidence"] = json.loads(values["evidence"])
        values["ranks"] = [int(r) for r in values.get("ranks", [])]
        return cls(**values)
