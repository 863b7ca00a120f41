"""Must-show 3: a 64-rank job resampled from real kernels, one rank's GEMMs slowed 1.3x, is diagnosed.

The job (:mod:`synthetic.kineto`) goes through the importer's tables (KDE summaries
per window, steps, collectives, ranks) into a real chDB store, and the analyzer
runs over the imported windows as over live ones.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from argus.collector.importer import import_parsed, import_traces
from argus.collector.importer.kineto import ParsedTrace, parse_trace
from argus.diagnosis import Diagnosis
from argus.store import Store, open_store
from argus.window_grid import WindowGrid
from synthetic.kineto import GEMM, resample_job, write_kineto

TEMPLATE = "diff_control_rank3_of8.json.gz"
#: The analyzer's default window; a fault must persist 10 s before a diagnosis opens.
WINDOW_S = 10.0
#: About 10.5 s of the template's ~78 ms steps.
STEPS = 135
SLOW_RANK = 17


@pytest.fixture(scope="module")
def template(kineto_dir: Path) -> ParsedTrace:
    return parse_trace(kineto_dir / TEMPLATE)


def test_generated_ranks_read_back_from_kineto_files(
    template: ParsedTrace, store: Store, tmp_path: Path
) -> None:
    job = resample_job(template, ranks=4, steps=6, slow_rank=1, seed=3)
    paths = [write_kineto(t, tmp_path / f"rank{t.rank}.json") for t in job]
    for original, path in zip(job, paths, strict=True):
        parsed = parse_trace(path)
        for field in ("kind", "stream", "device", "start_ns", "dur_ns", "launch_ns", "step", "step_start_ns"):
            assert np.array_equal(getattr(parsed, field), getattr(original, field)), field
        names = np.array(parsed.kernel_names)[parsed.kernel_code]
        assert names.tolist() == np.array(original.kernel_names)[original.kernel_code].tolist()
        assert parsed.collectives == original.collectives
    result = import_traces(store, paths, job_id="synthetic", window=WindowGrid.from_seconds(WINDOW_S))
    assert result.ranks == [0, 1, 2, 3] and result.rows["kernel_events"] == sum(t.start_ns.size for t in job)


def test_generated_job_behaves_like_a_synchronous_one(template: ParsedTrace) -> None:
    job = resample_job(template, ranks=8, steps=12, slow_rank=5, seed=1)
    slow, peers = job[5], job[:5] + job[6:]
    # The real template's calls: every step replays the 1,575 GPU events of steps 1011-1014.
    assert slow.start_ns.size == 12 * 1575
    gemm = np.array([bool(GEMM.search(n)) for n in template.kernel_names])

    def gemm_time(t: ParsedTrace) -> float:
        return float(t.dur_ns[gemm[t.kernel_code]].sum())

    ratio = gemm_time(slow) / np.median([gemm_time(t) for t in peers])
    assert 1.2 < ratio < 1.4
    # Ranks start every step together; the slow rank reaches each NCCL kernel last and waits least.
    assert all(np.array_equal(t.step_start_ns, slow.step_start_ns) for t in peers)
    nccl = slow.is_collective
    assert slow.dur_ns[nccl].sum() < min(t.dur_ns[t.is_collective].sum() for t in peers)


def _analyzer_built() -> bool:
    return importlib.util.find_spec("argus.analyzer.pipeline") is not None


needs_analyzer = pytest.mark.skipif(not _analyzer_built(), reason="the analyzer (issue 4) is not merged yet")


def _job(template: ParsedTrace, ranks: int = 64, **kwargs: Any) -> list[ParsedTrace]:
    """A job of :data:`STEPS` steps starting at a window boundary, durations in whole µs as Kineto writes."""
    window_ns = int(WINDOW_S * 1e9)
    start = (int(template.step_start_ns[0]) // window_ns + 1) * window_ns
    return resample_job(template, ranks=ranks, steps=STEPS, start_ns=start, **kwargs)


def _analyze(store: Store, traces: list[ParsedTrace], job_id: str) -> list[Diagnosis]:
    """Import ``traces`` and run the analyzer over their windows; the latest version of each diagnosis."""
    from argus.analyzer.service import Analyzer

    import_parsed(store, traces, job_id=job_id, window=WindowGrid.from_seconds(WINDOW_S))
    end_ns = max(t.last_ns for t in traces)
    written = Analyzer(store, window=WindowGrid.from_seconds(WINDOW_S), job=job_id).run_once(
        end_ns + 60 * 10**9
    )
    latest: dict[str, Diagnosis] = {}
    for d in written:
        latest[d.id] = d
    return list(latest.values())


@pytest.fixture
def job_store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"chdb://{tmp_path / 'data'}")
    try:
        yield s
    finally:
        s.close()


@needs_analyzer
@pytest.mark.slow
def test_64_ranks_one_slow_gemm_rank_is_diagnosed(template: ParsedTrace, job_store: Store) -> None:
    diagnoses = _analyze(job_store, _job(template, slow_rank=SLOW_RANK, slowdown=1.3, seed=7), "slow-gemm")
    assert [(d.rank, d.cause) for d in diagnoses] == [(SLOW_RANK, "compute")], diagnoses
    assert diagnoses[0].kernel is not None and GEMM.search(diagnoses[0].kernel), diagnoses[0].kernel


@needs_analyzer
@pytest.mark.slow
def test_64_healthy_ranks_are_not_diagnosed(template: ParsedTrace, job_store: Store) -> None:
    assert _analyze(job_store, _job(template, slow_rank=None, seed=7), "healthy") == []


@needs_analyzer
@pytest.mark.slow
def test_the_two_real_ranks_of_job128_score_as_peers(kineto_dir: Path, job_store: Store) -> None:
    from argus.analyzer.service import Analyzer

    paths = [kineto_dir / "job128_rank0.json.gz", kineto_dir / "job128_rank1.json.gz"]
    import_traces(job_store, paths, job_id="job128", window=WindowGrid.from_seconds(WINDOW_S))
    end_ns = max(parse_trace(p).last_ns for p in paths)
    assert (
        Analyzer(job_store, window=WindowGrid.from_seconds(WINDOW_S), job="job128").run_once(
            end_ns + 60 * 10**9
        )
        == []
    )


@needs_analyzer
@pytest.mark.slow
@pytest.mark.parametrize(
    "backlog",
    [
        pytest.param(None, id="from-the-first-row"),
        # The server's default backlog_s (3600 s) limits live jobs only: an imported trace of a
        # past run is analysed over its whole span.
        pytest.param("default", id="server-default"),
    ],
)
def test_an_analyzer_on_the_wall_clock_reaches_imported_windows(
    template: ParsedTrace, job_store: Store, backlog: str | None
) -> None:
    from argus.analyzer.service import Analyzer

    # GEMMs 1.5x slower on one rank of eight cost the job about 9 % (above the loss threshold).
    traces = _job(template, ranks=8, slow_rank=3, slowdown=1.5, seed=2)
    import_parsed(job_store, traces, job_id="old-run", window=WindowGrid.from_seconds(WINDOW_S))
    analyzer = (
        Analyzer(job_store, window=WindowGrid.from_seconds(WINDOW_S), job="old-run")
        if backlog == "default"
        else Analyzer(job_store, window=WindowGrid.from_seconds(WINDOW_S), job="old-run", backlog_s=None)
    )
    assert (3, "compute") in {(d.rank, d.cause) for d in analyzer.run_once()}
