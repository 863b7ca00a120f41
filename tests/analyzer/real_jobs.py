"""The real jobs the analyzer is judged on: how each runs, and what the analyzer must say of it.

Eleven 4-rank gloo jobs of :mod:`argus.demo.job` under `argus run`. The faulty ranks are slowed
for real after a healthy warm-up:

- data parallel (``dp``): rank 3 with extra encoder passes in its forward (``compute``), a
  0.15 s blocking sleep every 4 steps outside the model and loader (``host_stall``), a Dataset
  sleeping 4 ms per sample (``dataloader``), one 1 s stop every 40 steps (``spiky_stall``: rare
  but long), CPU work before a barrier it then waits in (``host_work``); ranks 1-3 with extra
  passes (``three_of_four``);
- pipeline x data parallel (``pp``: two unequal stages, GPipe over send/recv): rank 3 (stage 1)
  with extra passes; its pipeline neighbour is rank 1, its data-parallel peer rank 2;
- tensor x data parallel (``tp``): rank 3 with extra passes;
- and a clean job of each layout.

``test_real_runs`` runs them live; ``test_recorded_runs`` analyses recordings of them
(:mod:`tests.analyzer.recordings`). Both judge the verdict with :func:`check_verdict`: the faulty
ranks named, with the right cause, and nobody else; nobody blamed in a clean job
(:func:`tests.conftest.assert_blames_no_one`).
"""

from __future__ import annotations

from argus.diagnosis import Diagnosis
from tests.conftest import assert_blames_no_one

__all__ = [
    "ANALYSIS_WINDOW_S",
    "FAULT_S",
    "JOBS",
    "SLOW_RANK",
    "WARMUP_S",
    "WINDOW_S",
    "check_verdict",
    "describe",
]

#: Each job: its name, and its demo_job arguments (layout, fault, who).
JOBS = {
    "none": ["--layout=dp", "--scenario=none"],
    "compute": ["--layout=dp", "--scenario=compute", "--slow-rank=3"],
    "host_stall": ["--layout=dp", "--scenario=host_stall", "--slow-rank=3"],
    "dataloader": ["--layout=dp", "--scenario=dataloader", "--slow-rank=3"],
    "spiky_stall": ["--layout=dp", "--scenario=spiky_stall", "--slow-rank=3", "--spike-s=1.0"],
    "host_work": ["--layout=dp", "--scenario=host_work", "--slow-rank=3", "--sync=barrier"],
    "three_of_four": ["--layout=dp", "--scenario=compute", "--slow-ranks=1,2,3"],
    "pp_none": ["--layout=pp", "--scenario=none"],
    "pp_compute": ["--layout=pp", "--scenario=compute", "--slow-rank=3"],
    "tp_none": ["--layout=tp", "--scenario=none"],
    "tp_compute": ["--layout=tp", "--scenario=compute", "--slow-rank=3"],
}
SLOW_RANK = 3
#: The node agent's compression window, seconds.
WINDOW_S = 2.0
#: The analysis window, seconds. Four ranks on a small, shared machine lose seconds at a time to
#: the scheduler (measured here: a clean rank 30-80 % slow for 2-4 s at a load average of 12);
#: 6 s windows average that out while a real fault lasts many windows.
ANALYSIS_WINDOW_S = 6.0
#: Healthy training before the fault, then training with it, seconds.
WARMUP_S = 8.0
FAULT_S = 24.0

#: The cause and the phases a single-rank fault must be named with. A host stall outside the
#: model has no phase of its own (or lands in the forward or data phase that it delays); CPU work
#: before a barrier reads as a host stall: the others wait in the barrier, not in the all-reduce.
_CAUSES: dict[str, tuple[str, set[str | None]]] = {
    "compute": ("compute", {"forward", "backward"}),
    "host_stall": ("host_stall", {None, "forward", "data"}),
    "dataloader": ("dataloader", {"data"}),
    "spiky_stall": ("host_stall", {None, "forward", "data", "backward"}),
    "host_work": ("host_stall", {None, "forward", "data"}),
    "pp_compute": ("compute", {"forward", "backward"}),
    "tp_compute": ("compute", {"forward", "backward"}),
}


def describe(diagnoses: list[Diagnosis]) -> str:
    """One line per diagnosis: what a failed assertion shows."""
    return (
        "\n".join(
            f"{d.cause} rank={d.rank} ranks={d.ranks} phase={d.phase} score={d.score:.2f} {d.evidence}"
            for d in diagnoses
        )
        or "(no diagnosis)"
    )


def check_verdict(name: str, found: list[Diagnosis]) -> None:
    """Assert that ``found``, the diagnoses of job ``name`` (a key of :data:`JOBS`), are right.

    Raises:
        AssertionError: what is wrong, with every diagnosis found.
    """
    if name.endswith("none"):
        assert_blames_no_one([d.to_dict() for d in found])
        return
    if name == "three_of_four":
        # One diagnosis for the job's slow majority; the fast rank is never named.
        assert len(found) == 1, describe(found)
        d = found[0]
        assert 0 not in d.ranks and d.rank != 0 and d.cause == "compute", describe(found)
        return
    cause, phases = _CAUSES[name]
    # In the pipeline job, rank 3's neighbour (rank 1, stage 0) waits on its receives for rank 3
    # and its data-parallel peer (rank 2) in the all-reduce: neither may be named.
    assert [(d.rank, d.cause) for d in found] == [(SLOW_RANK, cause)], describe(found)
    d = found[0]
    assert d.phase in phases, describe(found)
    # Open for two windows at least, and the job's loss accounted to it.
    assert d.last_window_ns > d.first_window_ns, describe(found)
    assert d.slowdown_pct > 0 and d.evidence["lost_s"] > 0, describe(found)
    if name == "spiky_stall":
        e = d.evidence
        assert e["spiky"] is True and e["stalls"] >= 1 and max(e["stall_ms"]) > 500, describe(found)
