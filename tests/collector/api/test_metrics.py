"""Label cardinality of the server's metrics stays bounded whatever the job's size."""

from __future__ import annotations

from prometheus_client import generate_latest

from argus.metrics import TOP_SUSPECTS, Metrics


def _series(metrics: Metrics, name: str) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_ten_thousand_ranks_export_only_the_top_suspects() -> None:
    metrics = Metrics()
    scores = {rank: rank / 10_000 for rank in range(10_000)}
    scores[4242] = 7.5
    metrics.set_straggler_scores("big", scores)
    series = _series(metrics, "argus_straggler_score")
    assert len(series) == TOP_SUSPECTS
    assert 'argus_straggler_score{job_id="big",rank="4242"} 7.5' in series
    # A new window with other suspects replaces the old series instead of adding to them.
    metrics.set_straggler_scores("big", {rank: 1.0 for rank in range(100, 10_000)})
    assert len(_series(metrics, "argus_straggler_score")) == TOP_SUSPECTS
    assert not any('rank="4242"' in s for s in _series(metrics, "argus_straggler_score"))


def test_active_diagnoses_and_forget() -> None:
    metrics = Metrics()
    metrics.set_active_diagnoses("a", {"compute": 1, "dataloader": 2})
    metrics.set_straggler_scores("a", {3: 2.0})
    metrics.set_active_diagnoses("b", {"throttling": 1})
    metrics.set_active_diagnoses("a", {"compute": 0, "dataloader": 1})
    assert _series(metrics, "argus_diagnosis_active") == [
        'argus_diagnosis_active{cause="dataloader",job_id="a"} 1.0',
        'argus_diagnosis_active{cause="throttling",job_id="b"} 1.0',
    ]
    metrics.forget_job("a")
    assert _series(metrics, "argus_straggler_score") == []
    assert _series(metrics, "argus_diagnosis_active") == [
        'argus_diagnosis_active{cause="throttling",job_id="b"} 1.0'
    ]
