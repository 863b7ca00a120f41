"""Response bodies of the REST API, as pydantic models (they make the OpenAPI schema).

Times are integer ns since the epoch; ``None`` where not known yet. A body that is one of
Argus's records (the diagnosis) is derived from the record (:func:`model_of`), not written again.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, create_model

from argus.diagnosis import Diagnosis

__all__ = [
    "DiagnosisModel",
    "DiagnosisPage",
    "Health",
    "Heatmap",
    "HeatmapRow",
    "ImportOut",
    "Job",
    "JobPage",
    "JobStatus",
    "ProcessGroup",
    "Rank",
    "RankPage",
    "StackPage",
    "StackRow",
    "TraceDocument",
    "model_of",
]

JobStatus = Literal["running", "finished", "unknown"]


class Health(BaseModel):
    status: Literal["ok"]


class Job(BaseModel):
    """One job; see :mod:`argus.collector.api.jobs` for how ``status`` is derived."""

    job_id: str
    status: JobStatus
    world_size: int = Field(description="largest world size any rank or node reported")
    start_ns: int | None = Field(description="first attach (or trace start)")
    start_at: str | None = Field(description="start_ns as RFC 3339 (UTC, ms)")
    end_ns: int | None = Field(description="last exit, once finished")
    end_at: str | None = Field(description="end_ns as RFC 3339 (UTC, ms)")
    last_seen_ns: int | None = Field(description="newest heartbeat (host sample or attach)")
    last_seen_at: str | None = Field(description="last_seen_ns as RFC 3339 (UTC, ms)")
    ranks_attached: int
    ranks_exited: int
    ranks_failed: int = Field(description="ranks that exited with a non-zero status")
    hosts: int
    source: str = Field(description="'live', 'import', or '' when no node reported it")
    command: str
    open_diagnoses: int
    windows_analysed: int = Field(description="analysis windows of the job analysed so far")
    windows_failed: int = Field(
        description="of those, windows whose analysis failed (their time is unexplained)"
    )
    analysed_s: float = Field(description="wall time of the analysed windows' steps, seconds")
    steps_analysed: int = Field(description="training steps in the analysed windows")
    lost_s: float = Field(description="time the job lost against its own healthy pace, seconds")
    unexplained_loss_ratio: float = Field(description="share (0-1) of lost_s that no diagnosis accounts for")


class JobPage(BaseModel):
    items: list[Job]
    next: str | None = Field(description="cursor of the next page; null on the last")


class ProcessGroup(BaseModel):
    name: str
    backend: str
    size: int


class Rank(BaseModel):
    """One rank of a job, from its lifecycle events and heartbeats."""

    rank: int
    status: JobStatus
    host: str
    pid: int
    local_rank: int
    device: str
    world_size: int
    clock_offset_ns: int = Field(
        description="offset its node agent adds to its times, ns: the latest (a clock step or a new "
        "estimate changes it)"
    )
    attach_ns: int | None
    attach_at: str | None = Field(description="attach_ns as RFC 3339 (UTC, ms)")
    exit_ns: int | None
    exit_at: str | None = Field(description="exit_ns as RFC 3339 (UTC, ms)")
    exit_code: int | None
    last_seen_ns: int | None
    last_seen_at: str | None = Field(description="last_seen_ns as RFC 3339 (UTC, ms)")
    groups: list[ProcessGroup]


class RankPage(BaseModel):
    items: list[Rank]
    next: str | None


class StackRow(BaseModel):
    """Samples that found one thread of a rank in one stack, in one capture (the ``stacks`` table)."""

    rank: int
    pid: int
    capture_id: str
    time_ns: int = Field(description="when the capture began, ns since the epoch")
    duration_ns: int = Field(description="how long it sampled, ns (0: one blocking dump)")
    sampler: str = Field(description="`py-spy`, `py-spy-native` or `in-process`")
    thread: str
    frames: str = Field(description="root to leaf, `;`-joined `function (file:line)`")
    count: int = Field(description="samples")
    idle: bool = Field(description="the thread was not running (in-process: always false)")
    gil: bool = Field(description="it held the GIL (in-process: always false)")


class StackPage(BaseModel):
    items: list[StackRow]
    next: str | None


def model_of(record: type[Any]) -> type[BaseModel]:
    """A pydantic model of a dataclass record: its fields, types and ``doc`` metadata.

    A string field whose metadata names ``choices`` (a ``StrEnum``) takes only their values.
    """
    hints = typing.get_type_hints(record)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        kind = hints[f.name]
        choices = f.metadata.get("choices")
        if choices is not None:
            kind = Literal[tuple(c.value for c in choices)]
        fields[f.name] = (kind, Field(description=f.metadata.get("doc")))
    doc = (record.__doc__ or "").split("\n\n")[0]
    return create_model(f"{record.__name__}Model", __doc__=doc, **fields)


if TYPE_CHECKING:
    DiagnosisModel = BaseModel
else:
    #: The diagnosis object of docs/design.md §7 (``argus.diagnosis.Diagnosis.to_dict()``).
    DiagnosisModel = model_of(Diagnosis)


class DiagnosisPage(BaseModel):
    items: list[DiagnosisModel]
    next: str | None


class HeatmapRow(BaseModel):
    rank_lo: int
    rank_hi: int


class Heatmap(BaseModel):
    """Rank × time matrix of one metric; rows are ranks (or rank ranges), columns time bins.

    ``dur_ms[i][j]`` is the mean duration of row i in bin j (the slowest rank of a
    rank range); ``slowdown_pct[i][j]`` is how much longer that is than the median
    row of bin j, percent. ``null`` where a row has no data in a bin.
    """

    metric: str
    start_ns: int
    bin_ns: int
    times_ns: list[int]
    rows: list[HeatmapRow]
    dur_ms: list[list[float | None]]
    slowdown_pct: list[list[float | None]]


class ImportOut(BaseModel):
    job_id: str
    ranks: list[int]
    rows: dict[str, int]


class TraceDocument(BaseModel):
    """Chrome trace JSON (the JSON Object Format that Perfetto and chrome://tracing open)."""

    traceEvents: list[dict[str, Any]]  # noqa: N815 - the format's own key
    displayTimeUnit: str  # noqa: N815
    otherData: dict[str, Any]  # noqa: N815
