"""The diagnosis (docs/design.md §7): the record, its JSON, its rows in the ``diagnoses`` table.

One owner for everything a diagnosis is, wherever it travels:

- :class:`Diagnosis`, a frozen dataclass; each field documents itself (``doc`` in its
  metadata), and the REST API's pydantic model is derived from it
  (:func:`argus.collector.api.models.model_of`), not written again;
- its JSON: :meth:`Diagnosis.to_dict` is the object of the REST API, `argus diagnose --json`
  and `argus demo --json`; :func:`finite` keeps it JSON (no NaN or infinity);
- its rows: :func:`write_diagnoses` writes the ``diagnoses`` table (:data:`argus.schema.TABLES`),
  :func:`read_diagnoses` reads the records back for the analyzer and the API alike, and
  :func:`read_states` the analyzer's bookkeeping kept beside them. The table's
  ``process_group`` column is the record's ``group``; ``evidence`` is stored as a JSON string;
  ``updated_ns`` versions the rows (the newest row per id wins, read with ``FINAL``);
  ``analysed_to_ns`` and ``tracker`` are the analyzer's, not the record's (a restart resumes
  from them; they are never part of the JSON).

How a diagnosis reads to a person is :mod:`argus.render`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from argus.config import DEFAULT_MIN_LOSS_PCT
from argus.errors import StoreError
from argus.schema import TABLES
from argus.store import given_conditions

if TYPE_CHECKING:
    from argus.store import Store

__all__ = [
    "Cause",
    "Diagnosis",
    "State",
    "StoredState",
    "finite",
    "host_slowed_the_job",
    "read_diagnoses",
    "read_states",
    "write_diagnoses",
]


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
    """Whether the fault is going on."""

    OPEN = "open"
    RESOLVED = "resolved"


def _doc(text: str, choices: type[StrEnum] | None = None) -> dict[str, Any]:
    """Field metadata: its description (OpenAPI, docs) and, for a string field, its allowed values."""
    return {"doc": text, "choices": choices}


@dataclass(frozen=True)
class Diagnosis:
    """One ongoing (or resolved) fault of one job. Each field's ``doc`` says what it holds.

    Raises:
        ValueError: ``cause`` or ``state`` is not one of :class:`Cause` / :class:`State`.
    """

    id: str = field(metadata=_doc("Stable id; the analyzer keeps it while the fault lasts."))
    job_id: str = field(metadata=_doc("The job."))
    rank: int | None = field(
        metadata=_doc(
            "The straggler's global rank, or null when the fault is not one rank's "
            "(a slow link between ranks, many slow ranks)."
        )
    )
    ranks: list[int] = field(metadata=_doc("Every rank involved, sorted."))
    group: str | None = field(
        metadata=_doc("Process group the comparison ran in, or null for the whole job.")
    )
    cause: str = field(metadata=_doc("The likely cause.", Cause))
    phase: str | None = field(metadata=_doc("`data`, `forward`, `backward`, `optimizer` or null."))
    kernel: str | None = field(metadata=_doc("Kernel name when L3 found it, else null."))
    score: float = field(metadata=_doc("Unitless; 0 = like its peers, >= 1 = past the detection threshold."))
    slowdown_pct: float = field(metadata=_doc("Estimated loss of the job's throughput, percent."))
    first_window_ns: int = field(
        metadata=_doc("Start of the first window the fault was seen in, ns since the epoch.")
    )
    last_window_ns: int = field(
        metadata=_doc("Start of the latest window it was seen in, ns since the epoch.")
    )
    state: str = field(metadata=_doc("Open while the fault lasts.", State))
    summary: str = field(
        default="",
        metadata=_doc(
            "One sentence a person reads first: who (rank, host, pid), what, how much, how we know. "
            "Written from the evidence when the diagnosis is read (argus.summary; the REST API fills "
            "it), not stored: empty where nobody has filled it yet."
        ),
    )
    evidence: dict[str, Any] = field(
        default_factory=dict, metadata=_doc("The numbers a person would check (JSON).")
    )

    def __post_init__(self) -> None:
        if self.cause not in Cause.__members__.values():
            raise ValueError(f"unknown cause {self.cause!r}; expected one of {[c.value for c in Cause]}")
        if self.state not in State.__members__.values():
            raise ValueError(f"unknown state {self.state!r}; expected 'open' or 'resolved'")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of docs/design.md §7, keys in contract order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
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


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None: JSON has none."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def host_slowed_the_job(d: Mapping[str, Any], min_loss_pct: float = DEFAULT_MIN_LOSS_PCT) -> bool:
    """True when diagnosis ``d`` (its JSON, :meth:`Diagnosis.to_dict`) is the one a job that ran no
    fault may carry: a job-level loss naming no rank, no ranks and no group, whose job ran slower
    than its healthy pace by the loss threshold (``evidence.job_step_ms`` over
    ``evidence.healthy_step_ms`` at least ``1 + min_loss_pct / 100``).

    docs/design.md §6.2: no slowdown above the loss threshold stays silent. A shared host now and
    then slows a whole job, every rank alike, for seconds, and Argus then opens such a diagnosis;
    it blames no one. Without a healthy pace (``healthy_step_ms`` absent) it is not this.
    """
    ev = d.get("evidence") or {}
    slower = float(ev.get("job_step_ms") or 0.0) / float(ev.get("healthy_step_ms") or math.inf)
    named = d.get("rank") is not None or bool(d.get("ranks")) or d.get("group") is not None
    return not named and slower >= 1 + min_loss_pct / 100


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=_json_default)


#: Record field → ``diagnoses`` column, where the names differ.
_COLUMN = {"group": "process_group"}
#: Record fields that are not stored: written when read (``summary``: :mod:`argus.summary`).
_DERIVED = frozenset({"summary"})
#: The columns that hold the record (``job_id`` aside).
_RECORD_COLUMNS = tuple(
    _COLUMN.get(f.name, f.name) for f in fields(Diagnosis) if f.name != "job_id" and f.name not in _DERIVED
)


def _table(
    diagnoses: Sequence[Diagnosis],
    updated_ns: int,
    analysed_to_ns: int,
    states: Mapping[str, Mapping[str, Any]],
) -> pa.Table:
    """Rows of ``diagnoses`` in the ``diagnoses`` table's columns (``job_id`` first)."""
    rows: dict[str, list[Any]] = {"job_id": [], **{c: [] for c in TABLES["diagnoses"].column_names}}
    for d in diagnoses:
        record = {k: v for k, v in d.to_dict().items() if k not in _DERIVED}
        record["ranks"] = [int(r) for r in d.ranks]
        record["score"], record["slowdown_pct"] = float(d.score), float(d.slowdown_pct)
        record["evidence"] = _json(d.evidence)
        for key, value in record.items():
            rows[_COLUMN.get(key, key)].append(value)
        rows["updated_ns"].append(int(updated_ns))
        rows["analysed_to_ns"].append(int(analysed_to_ns))
        state = states.get(d.id)
        rows["tracker"].append(_json(state) if state else "")
    schema = pa.schema(
        [pa.field("job_id", pa.string())]
        + [pa.field(c.name, c.arrow_type) for c in TABLES["diagnoses"].columns]
    )
    return pa.table(rows, schema=schema)


def _from_row(row: dict[str, Any]) -> Diagnosis:
    """A stored row as a record, whatever wrote it: bad evidence or a non-finite number stays readable.

    Raises:
        StoreError: the row is not a diagnosis (an unknown cause or state, a missing column).
    """
    values = {field: row.pop(column) for field, column in _COLUMN.items()} | row
    try:
        evidence = json.loads(values["evidence"]) if values["evidence"] else {}
    except ValueError:
        evidence = {"unparsed": values["evidence"]}
    values["evidence"] = finite(evidence) if isinstance(evidence, dict) else {"value": finite(evidence)}
    for key in ("score", "slowdown_pct"):
        # The contract says float; a non-finite value (an analyzer bug) must not break a reader.
        if not math.isfinite(values[key]):
            values[key] = (
                0.0 if math.isnan(values[key]) else math.copysign(1.7976931348623157e308, values[key])
            )
    try:
        return Diagnosis.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"diagnosis {values.get('id')!r} in the store is malformed: {exc}") from exc


def write_diagnoses(
    store: Store,
    diagnoses: Sequence[Diagnosis],
    updated_ns: int,
    *,
    analysed_to_ns: int = 0,
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Insert one row per diagnosis: a new version of each id (``diagnoses`` keeps the newest).

    Args:
        store: The store.
        diagnoses: Versions to write.
        updated_ns: Their version, ns (larger than any earlier version of the same ids).
        analysed_to_ns: End of the window whose analysis wrote them, ns (where a restart resumes).
        states: The analyzer's bookkeeping per diagnosis id (its tracker's state), JSON-able.

    Raises:
        StoreError: the insert failed.
    """
    if diagnoses:
        store.insert("diagnoses", _table(diagnoses, updated_ns, analysed_to_ns, states or {}))


@dataclass(frozen=True)
class StoredState:
    """What the analyzer kept with a stored diagnosis version (see :func:`write_diagnoses`)."""

    analysed_to_ns: int
    tracker: dict[str, Any]


def read_states(store: Store, job_id: str) -> dict[str, StoredState]:
    """Per diagnosis id of ``job_id``, the analyzer's state stored with its newest version.

    Rows written before these columns existed read ``analysed_to_ns = 0`` and no state: the
    caller falls back to what their evidence kept.

    Raises:
        StoreError: the query failed.
    """
    t = store.query(
        "SELECT id, analysed_to_ns, tracker FROM diagnoses FINAL WHERE job_id = {job:String}",
        {"job": job_id},
    )
    out = {}
    for i, to, tracker in zip(
        t.column("id").to_pylist(),
        t.column("analysed_to_ns").to_numpy(),
        t.column("tracker").to_pylist(),
        strict=True,
    ):
        try:
            state = json.loads(tracker) if tracker else {}
        except ValueError:
            state = {}
        out[str(i)] = StoredState(int(to), state if isinstance(state, dict) else {})
    return out


def read_diagnoses(
    store: Store,
    job_id: str | None = None,
    *,
    state: str | None = None,
    cause: str | None = None,
    newest_first: bool = False,
    after: tuple[int, str] | None = None,
    limit: int | None = None,
) -> list[Diagnosis]:
    """The newest version of every diagnosis (``FINAL``), filtered, in ``first_window_ns`` order.

    Args:
        store: Where the ``diagnoses`` table is.
        job_id: Only this job's (default: every job's).
        state: Only ``open`` or ``resolved`` ones.
        cause: Only this cause.
        newest_first: Order by ``first_window_ns`` descending (the REST API's pages), else
            ascending; ties by ``id`` ascending either way.
        after: ``(first_window_ns, id)`` of the last item of the previous page: only what follows it.
        limit: At most this many.

    Raises:
        StoreError: the query failed, or a row is not a diagnosis.
    """
    where, params = given_conditions(
        {"job_id = {job:String}": job_id, "state = {state:String}": state, "cause = {cause:String}": cause}
    )
    where.insert(0, "1 = 1")
    if after is not None:
        before = "<" if newest_first else ">"
        where.append(
            f"(first_window_ns {before} {{after_ns:Int64}} "
            "OR (first_window_ns = {after_ns:Int64} AND id > {after_id:String}))"
        )
        params["after_ns"], params["after_id"] = after
    order = "first_window_ns DESC, id" if newest_first else "first_window_ns, id"
    sql = (
        f"SELECT job_id, {', '.join(_RECORD_COLUMNS)} FROM diagnoses FINAL "
        f"WHERE {' AND '.join(where)} ORDER BY {order}"
    )
    if limit is not None:
        sql += " LIMIT {limit:UInt32}"
        params["limit"] = limit
    return [_from_row(row) for row in store.query(sql, params).to_pylist()]
