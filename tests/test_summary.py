"""The diagnosis's summary sentence and its few evidence lines, on what the analyzer really writes.

The diagnoses come from the analyzer's own pipeline (:class:`JobAnalysis`) over simulated jobs with
one fault each, so the evidence keys are the ones the current analyzer writes, not a copy of them.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from argus.analyzer.pipeline import JobAnalysis
from argus.diagnosis import Cause, Diagnosis
from argus.summary import MAX_EVIDENCE_LINES, key_evidence, lines, summary
from synthetic.jobs import Fault, JobSpec, simulate

_UNIT = re.compile(r"\d (ms|µs|s|MHz|%)\b")


def _diagnosed(
    kind: str, gpu: bool = False, ranks: tuple[int, ...] = (3,), magnitude: float = 0.2
) -> Diagnosis:
    spec = JobSpec(
        world=64 if gpu else 8,
        gpu=gpu,
        group_size=8 if gpu else 0,
        windows=5,
        seed=7,
        faults=(Fault(kind, ranks, magnitude, 23.0),),
    )
    ja = JobAnalysis("t", spec.window_ns)
    for w in simulate(spec).windows:
        ja.analyze(w)
    (d,) = ja.tracker.open
    return d


@pytest.mark.parametrize(
    ("kind", "gpu", "says"),
    [
        ("compute", False, "computes more slowly"),
        ("host_stall", False, "stalls on the host"),
        ("dataloader", False, "waits for its input batches"),
        ("throttling", True, "is throttled"),
        ("hung", False, "hangs"),
    ],
)
def test_a_rank_diagnosis_reads_who_what_how_much_and_how_we_know(kind: str, gpu: bool, says: str) -> None:
    d = _diagnosed(kind, gpu, magnitude=0.15 if kind == "host_stall" else 0.2)
    text = summary(d, {3: ("node-a", 4121)})
    assert text.startswith(("Rank 3 (host node-a, pid 4121)", "The GPU of rank 3 (host node-a, pid 4121)"))
    assert says in text and text.endswith(".") and "\n" not in text
    if kind == "hung":
        assert "collective" in text and "no progress for" in text
    else:
        # How we know: it arrives last at each collective, and what it costs the job.
        assert "reaches each collective last" in text, text
        assert f"the job loses {d.slowdown_pct:.1f} %" in text or f"loses {d.slowdown_pct:.0f} %" in text
        wait = f"waits {d.evidence['wait_ms']:.1f} ms"
        assert wait in text, text
    figures = key_evidence(d)
    assert 1 <= len(figures) <= MAX_EVIDENCE_LINES
    assert all(_UNIT.search(value) or "#" in value for _, value in figures), figures
    # No raw field names, no p-values or booleans in the headline view.
    shown = " ".join(f"{k} {v}" for k, v in figures)
    assert "p_value" not in shown and "true" not in shown.lower() and "_ms" not in shown


def test_many_ranks_and_job_level_diagnoses_have_sentences() -> None:
    many = _diagnosed("compute", ranks=(1, 2, 3, 4, 5), magnitude=0.3)
    assert many.rank is None
    text = summary(many)
    assert text.startswith("5 ranks (1, 2, 3, 4, 5) are slower than the rest (compute)")
    assert "the slowest, rank" in text and "ms per step" in text
    job = Diagnosis(
        id="j",
        job_id="t",
        rank=None,
        ranks=[],
        group=None,
        cause="unknown",
        phase=None,
        kernel=None,
        score=2.0,
        slowdown_pct=12.0,
        first_window_ns=0,
        last_window_ns=0,
        state="resolved",
        evidence={
            "unexplained_ms_per_step": 60.0,
            "job_step_ms": 560.0,
            "healthy_step_ms": 500.0,
            "growth_ms_per_step": {"data": 1.0, "compute": 2.0},
            "ranks_behind": 0,
            "lost_s": 3.0,
            "span_s": 25.0,
            "job_finished": True,
        },
    )
    text = summary(job)
    assert text.startswith("Resolved (the job finished): the job's steps take 560.0 ms against its healthy")
    assert "no single rank explains" in text and "no phase or transfer grew" in text
    assert "loses 12 %" in text and "3.0 s over 25.0 s" in text
    assert ("job step", "560.0 ms (healthy 500.0 ms)") in key_evidence(job)
    assert "rank 3 is behind its own past" in summary(replace(job, ranks=[3]))
    assert "ranks 2, 3 are behind their own past" in summary(replace(job, ranks=[2, 3]))


@pytest.mark.parametrize("cause", [c.value for c in Cause])
@pytest.mark.parametrize("rank", [3, None])
@pytest.mark.parametrize(
    "evidence",
    [
        {},
        {"wait_ms": None, "phase_excess_ms": "x", "top": [], "example": 3, "growth_ms_per_step": {"a": None}},
        {"self_ms": True, "kernel": 5, "stall_ms": ["a"], "stalls": 2, "spiky": True, "hung": True},
    ],
)
def test_missing_or_odd_evidence_still_reads(cause: str, rank: int | None, evidence: dict[str, Any]) -> None:
    d = Diagnosis(
        "i", "t", rank, [] if rank is None else [rank], None, cause, None, None, 1.0, 5.0, 0, 0, "open"
    )
    d = replace(d, evidence=evidence)
    text = summary(d)
    assert text.endswith(".") and len(text) > 10
    assert len(key_evidence(d)) <= MAX_EVIDENCE_LINES
    assert lines(d)[0] == "  " + text  # the summary first, then the figures


def test_the_demo_report_prints_the_summary_first_then_at_most_five_figures(tmp_path: Path) -> None:
    from rich.console import Console

    from argus.demo.local import _print_human

    found = [_diagnosed("compute"), replace(_diagnosed("hung"), state="resolved")]
    console = Console(record=True, width=400)
    _print_human(console, "job", 3, found, tmp_path / "t.json", tmp_path / "store", kept=False)
    out = console.export_text().splitlines()
    for d in found:
        head = next(
            i for i, line in enumerate(out) if line.startswith(f"{d.state.upper()} rank 3: {d.cause}")
        )
        assert out[head + 1] == "  " + summary(d)
        figures = list(itertools.takewhile(lambda line: line.startswith("    "), out[head + 2 :]))
        assert 1 <= len(figures) <= MAX_EVIDENCE_LINES and all(_UNIT.search(f) or "#" in f for f in figures)
        assert out[head + 2 + len(figures)] == ""  # nothing else of the evidence


def test_the_ranks_slowed_while_waiting_for_the_straggler_are_said_and_odd_ones_ignored() -> None:
    d = _diagnosed("compute")
    told = summary(replace(d, evidence={**d.evidence, "knock_on_ranks": [0, 1]}))
    assert "ranks 0, 1 slowed down too while waiting for it" in told, told
    assert "rank 5 slowed down too" in summary(replace(d, evidence={**d.evidence, "knock_on_ranks": [5]}))
    assert "slowed down too" not in summary(replace(d, evidence={**d.evidence, "knock_on_ranks": ["x"]}))
