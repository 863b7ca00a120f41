"""The analyzer's verdict on recordings of the real jobs (tests/analyzer/real_jobs.py).

Each recording (:mod:`tests.analyzer.recordings`) is what a real `argus server` stored of the
eleven jobs on one occasion; the analyzer runs over it offline (`argus analyze --once`
semantics, 6 s windows), so its verdict is the same in every run and a change to the analyzer
shows here as a verdict gained or lost.

The verdicts it gets wrong today (:data:`_WRONG`) are marked ``strict`` known failures: when a
change fixes one, the test fails until its marker goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest

from argus.analyzer.service import Analyzer
from argus.config import DEFAULT_MIN_LOSS_PCT
from argus.diagnosis import Diagnosis, host_slowed_the_job, read_diagnoses
from argus.store import open_store
from argus.window_grid import WindowGrid
from tests.analyzer.real_jobs import ANALYSIS_WINDOW_S, JOBS, check_verdict
from tests.analyzer.recordings import RECORDINGS, load_recording, recording_jobs
from tests.conftest import assert_blames_no_one

#: Known-wrong verdicts, per recording. Since a rank's own past needs two healthy
#: windows and the job-level loss counts single-rank waits only beyond the healthy windows' (both
#: 2026-12-02), three slow ranks of four and the held-out clean tensor-parallel job are right;
#: since the one rank behind that explains a job's loss is named when nothing scored it
#: (2026-12-04), so is the loaded pipeline job; since the ranks of a role of two are compared
#: with each other step by step (2026-12-06), so is the held-out pipeline job, whose slow rank
#: stayed inside its own past's noise on that heavily loaded host. (Its clean data-parallel job
#: opens a job-level loss that names no rank, backed by a real slowdown of the whole job: right
#: since 2026-12-06, when a clean job's verdict became "blames no one",
#: :func:`tests.conftest.assert_blames_no_one`.)
_WRONG: dict[str, set[str]] = {
    "quiet": set(),
    "loaded": set(),
    "ci": set(),
    "held_out": set(),
}
_KNOWN_WRONG = pytest.mark.xfail(reason="a verdict known to be wrong on this recording", strict=True)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[Diagnosis]]:
    """Every recording loaded into its own embedded store and analysed: (recording, job) -> diagnoses."""
    out = {}
    for recording in _WRONG:
        # chDB allows one open data dir per process: one store after another.
        store = open_store(f"chdb://{tmp_path_factory.mktemp(recording)}")
        try:
            load_recording(store, RECORDINGS / recording)
            for name in JOBS:
                job = f"real-{name}"
                analyzer = Analyzer(
                    store, window=WindowGrid.from_seconds(ANALYSIS_WINDOW_S), job=job, backlog_s=None
                )
                analyzer.run_once(now_ns=time.time_ns())
                out[recording, name] = read_diagnoses(store, job)
        finally:
            store.close()
    return out


def test_every_recording_holds_every_job() -> None:
    for recording in _WRONG:
        assert recording_jobs(RECORDINGS / recording) == sorted(f"real-{name}" for name in JOBS)
        assert (RECORDINGS / recording / "README").is_file()
    assert sorted(p.name for p in RECORDINGS.iterdir() if p.is_dir()) == sorted(
        [*_WRONG, "dup", "onset", "recall", "wrong_two", "many", "stage", "pace", "knock", "starved"]
    )
    assert recording_jobs(RECORDINGS / "onset") == sorted(ONSET)
    assert recording_jobs(RECORDINGS / "recall") == sorted(RECALL)
    assert recording_jobs(RECORDINGS / "wrong_two") == sorted(WRONG_TWO)
    assert recording_jobs(RECORDINGS / "dup") == ["dup-fsdp-compute"]
    assert recording_jobs(RECORDINGS / "many") == sorted(MANY)
    assert recording_jobs(RECORDINGS / "stage") == sorted(STAGE)
    assert recording_jobs(RECORDINGS / "pace") == sorted(PACE)
    assert recording_jobs(RECORDINGS / "knock") == ["real-tp_compute"]
    assert recording_jobs(RECORDINGS / "starved") == ["starved-fsdp-twin"]


@pytest.mark.parametrize(
    ("recording", "name"),
    [
        pytest.param(recording, name, marks=[_KNOWN_WRONG] if name in wrong else [], id=f"{recording}-{name}")
        for recording, wrong in _WRONG.items()
        for name in JOBS
    ],
)
def test_the_verdict_on_a_recorded_job(
    verdicts: dict[tuple[str, str], list[Diagnosis]], recording: str, name: str
) -> None:
    check_verdict(name, verdicts[recording, name])


#: Jobs of the ``onset`` recording (bench/detection_live.py's onset-at-start cases: the fault from
#: the first step, no healthy past): the ranks their diagnosis must name, and its cause; none for a
#: clean twin. Named only since the best-ranks reference (2026-12-06): ``onset-dp-3-of-4``.
ONSET: dict[str, tuple[tuple[int, ...], str] | None] = {
    "onset-dp-compute": ((2,), "compute"),
    "onset-dp-3-of-4": ((1, 2, 3), "compute"),
    "onset-pp-compute": ((3,), "compute"),
    "onset-fsdp-compute": ((1,), "compute"),
    "onset-dp-twin": None,
    "onset-pp-twin": None,
}


def _analysed(
    tmp_path_factory: pytest.TempPathFactory, recording: str, jobs: Iterable[str], window_s: float
) -> dict[str, list[Diagnosis]]:
    """Each of ``jobs`` of ``recording`` analysed over its whole span, ``window_s`` windows:
    job -> diagnoses."""
    store = open_store(f"chdb://{tmp_path_factory.mktemp(recording)}")
    try:
        load_recording(store, RECORDINGS / recording)
        out = {}
        for job in jobs:
            Analyzer(store, window=WindowGrid.from_seconds(window_s), job=job, backlog_s=None).run_once(
                now_ns=time.time_ns()
            )
            out[job] = read_diagnoses(store, job)
        return out
    finally:
        store.close()


@pytest.fixture(scope="module")
def onset_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``onset`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "onset", ONSET, ANALYSIS_WINDOW_S)


@pytest.mark.parametrize("job", sorted(ONSET))
def test_a_fault_from_the_first_step_is_named_by_its_peers(
    onset_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    found = onset_verdicts[job]
    expected = ONSET[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    ranks, _ = expected
    assert len(found) == 1, found
    d = found[0]
    assert (set(d.ranks) if d.rank is None else {d.rank}) == set(ranks), found


@pytest.mark.parametrize("job", sorted(k for k, v in ONSET.items() if v is not None))
def test_a_fault_from_the_first_step_gets_its_cause(
    onset_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """The pp and fsdp jobs' compute faults read ``host_stall`` until 2026-12-06: the slow rank
    waited for a CPU 7-10 s per CPU second, its peers (asleep in the collectives between short
    bursts) 4-8, and only its CPU time at the peers' rate counted as its work's wait
    (:func:`argus.analyzer.causes._starved`)."""
    expected = ONSET[job]
    assert expected is not None
    assert [d.cause for d in onset_verdicts[job]] == [expected[1]]


#: Jobs of the ``recall`` recording (bench/detection_live.py's whole set at 492a69b, 5 s windows;
#: its README): the ranks a diagnosis must name and its cause; none for a clean twin. Wrong at
#: 492a69b: the CPU quota and the pipeline stall opened nothing, the 3-of-4 jobs named two of three.
RECALL: dict[str, tuple[tuple[int, ...], str] | None] = {
    "recall-hf-cpu_quota-onset": ((3,), "host_stall"),
    "recall-pp-host_stall-onset": ((3,), "host_stall"),
    "recall-dp-3-of-4-onset": ((1, 2, 3), "compute"),
    "recall-dp-3-of-4-compute": ((0, 1, 3), "compute"),
    "recall-hf-onset-twin": None,
    "recall-pp-onset-twin": None,
}
#: The window of bench/detection_live.py (argus.demo.local.WINDOW_S) the recording was made with.
_RECALL_WINDOW_S = 5.0


@pytest.fixture(scope="module")
def recall_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``recall`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "recall", RECALL, _RECALL_WINDOW_S)


@pytest.mark.parametrize("job", sorted(RECALL))
def test_a_fault_of_the_whole_live_set_is_named_with_all_its_ranks(
    recall_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """A rank held to a CPU quota is named against its peers' median, not made the best ranks'
    level less its wait for a CPU; a pipeline rank behind its partner is named (a pair's
    comparison has a side); a many-rank diagnosis keeps its ranks through the job's short last
    window. Each diagnosis names only the fault's ranks; the one that names them all has its cause."""
    found = recall_verdicts[job]
    expected = RECALL[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    ranks, cause = expected
    named = [{d.rank} if d.rank is not None else set(d.ranks) for d in found]
    assert all(n <= set(ranks) for n in named), found
    assert [d.cause for d, n in zip(found, named, strict=True) if n == set(ranks)] == [cause], found


#: Jobs of the ``wrong_two`` recording (the same whole set as ``recall``; its README): the ranks its
#: diagnoses must name together, and their cause; none for the clean twin. Wrong at 8fd8519: the
#: pipeline's slow stage opened nothing, the twin got a ``communication`` diagnosis naming every
#: rank; at 15460f8 the stage was named by rank 3 alone.
WRONG_TWO: dict[str, tuple[tuple[int, ...], str] | None] = {
    "wrong-pp-stage1-compute": ((2, 3), "compute"),
    "wrong-fsdp-dataloader-twin": None,
}


@pytest.fixture(scope="module")
def wrong_two_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``wrong_two`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "wrong_two", WRONG_TWO, _RECALL_WINDOW_S)


@pytest.mark.parametrize("job", sorted(WRONG_TWO))
def test_a_held_rank_leaves_the_others_references_and_a_busier_host_is_no_slow_link(
    wrong_two_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """A rank held at the keep score through a pipeline's warm-up keeps only its own (and its
    partner's) windows out of the references: the slow stage is measured against its own warm-up,
    less the change the other stage's levels say the job shared, and named with its cause. Both
    ranks of the slow stage are named, never stage 0's: stage 0 waited for them, so the job's
    common change is stage 0's (the stage's two ranks, each within its noisy steps' threshold,
    are behind as a role), and the fault's first window is no reference of the stage. A world
    group's transfers that grew while every rank waited longer for a CPU than its work explains
    are the host's, not a slow link: the clean twin blames no one."""
    found = wrong_two_verdicts[job]
    expected = WRONG_TWO[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    ranks, cause = expected
    named = [{d.rank} if d.rank is not None else set(d.ranks) for d in found]
    assert found, "nothing opened"
    assert all(n and n <= set(ranks) for n in named), found
    assert set().union(*named) == set(ranks), found
    assert [d.cause for d in found] == [cause], found


def test_a_job_level_loss_that_comes_to_name_a_straggler_becomes_its_diagnosis(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The ``dup`` recording (its README): a job-level diagnosis naming no rank opened as the host got
    busier and the fault began; once the job's residual loss names rank 1 and rank 1's compute
    straggler is ready, the straggler takes the job-level diagnosis over (its id and first window,
    the job's loss so far as its knock-on loss). One fault, one diagnosis, naming rank 1; before
    2026-12-07 a job-level ``compute`` naming rank 1 stayed open beside rank 1's."""
    (found,) = _analysed(tmp_path_factory, "dup", ["dup-fsdp-compute"], _RECALL_WINDOW_S).values()
    assert [(d.rank, d.cause) for d in found] == [(1, "compute")], found
    assert found[0].evidence["knock_on_lost_s"] > 0, found


#: Jobs of the ``many`` recording (bench/detection_live.py's whole set of 2026-12-07; its README):
#: the ranks the one diagnosis must name and its cause; none for a clean twin. Wrong at 15460f8: the
#: onset job named the fast rank 0 too, the job slow after its warm-up opened nothing.
MANY: dict[str, tuple[tuple[int, ...], str] | None] = {
    "many-dp-3-of-4-onset": ((1, 2, 3), "compute"),
    "many-dp-3-of-4-compute": ((0, 1, 3), "compute"),
    "many-dp-3-of-4-compute-twin": None,
    "many-dp-onset-twin": None,
}


@pytest.fixture(scope="module")
def many_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``many`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "many", MANY, _RECALL_WINDOW_S)


@pytest.mark.parametrize("job", sorted(MANY))
def test_most_of_a_role_slow_is_named_without_its_fast_rank(
    many_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """Three of four ranks slow, from the first step and after a warm-up: one diagnosis names
    exactly them. The best ranks' test judges the slow ranks' spread on their self time (one
    rank's scheduling correction clears that rank alone), the level rank's wait for a CPU never
    puts another behind it, and a rank's score is the pooled test's own: no window of the fault
    becomes the job's pace or a rank's own past, so the fast rank is never named."""
    found = many_verdicts[job]
    expected = MANY[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    ranks, cause = expected
    assert [(d.rank, set(d.ranks), d.cause) for d in found] == [(None, set(ranks), cause)], found


#: Jobs of the ``stage`` recording (bench/detection_live.py's whole set of 2026-12-07; its README):
#: the ranks the one diagnosis must name and its cause; none for the clean twin. Wrong at a9c251e:
#: the healthy rank 0 was named beside the slow stage.
STAGE: dict[str, tuple[tuple[int, ...], str] | None] = {
    "stage-pp-stage1-compute": ((2, 3), "compute"),
    "stage-pp-stage1-compute-twin": None,
}


@pytest.fixture(scope="module")
def stage_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``stage`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "stage", STAGE, _RECALL_WINDOW_S)


@pytest.mark.parametrize("job", sorted(STAGE))
def test_a_rank_that_slowed_behind_a_slow_stage_is_its_knock_on_whatever_its_score(
    stage_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """A pipeline's slow stage (ranks 2 and 3): in the job's last window stage 0's rank 0, its own
    past quiet, scores above both slow ranks on half their excess. It hid behind rank 3, which
    fell behind the others, so it is rank 3's knock-on: one diagnosis names the stage alone."""
    found = stage_verdicts[job]
    expected = STAGE[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    ranks, cause = expected
    assert [(d.rank, set(d.ranks), d.cause) for d in found] == [(None, set(ranks), cause)], found


#: Jobs of the ``pace`` recording (bench/detection_live.py's whole set of 2026-12-07; its README): the
#: rank and cause its one diagnosis must name; none for the clean twin. Wrong at a9c251e: nothing
#: opened on the faulty job; right since a rank at the keep score against its peers is no reference
#: of itself (2026-12-07, ``argus.analyzer.pipeline._doubtful``).
PACE: dict[str, tuple[int, str] | None] = {
    "pace-dp-compute-medium": (2, "compute"),
    "pace-dp-compute-medium-twin": None,
}
#: When rank 2's compute began to slow in ``pace-dp-compute-medium`` (the benchmark's timeline), ns.
_PACE_FAULT_NS = 1_796_625_311_126_714_210


@pytest.fixture(scope="module")
def pace_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diagnosis]]:
    """The ``pace`` recording analysed: job -> diagnoses."""
    return _analysed(tmp_path_factory, "pace", PACE, _RECALL_WINDOW_S)


@pytest.mark.parametrize("job", sorted(PACE))
def test_a_slowdown_as_the_host_gets_quieter_opens_from_its_first_window(
    pace_verdicts: dict[str, list[Diagnosis]], job: str
) -> None:
    """The host got quieter as rank 2's compute fault began (the job's steps 100-115 ms, then
    65-75 ms): rank 2 sat 8-11 ms a step above its peers' median in every window of the fault,
    yet scored 0.3-0.8 while each of those windows became its own past and grew its drift (the
    peer threshold's, 2.3 ms before the fault, 3.1-4.5 ms in it), and the job ran faster than its
    warm-up pace, so no loss showed against it. A window where it sits at the keep score against
    its peers is no reference of itself: its drift stays what healthy windows measured (2.3-3.1
    ms) and it scores 0.79, 1.03, 0.94, 1.20, 1.45. One diagnosis must name rank 2's compute from
    the window the fault began in; the clean twin blames no one."""
    found = pace_verdicts[job]
    expected = PACE[job]
    if expected is None:
        assert_blames_no_one([d.to_dict() for d in found])
        return
    assert [(d.rank, d.cause) for d in found] == [expected], found
    window_ns = int(_RECALL_WINDOW_S * 1e9)
    assert found[0].first_window_ns == _PACE_FAULT_NS // window_ns * window_ns, found


@pytest.fixture(scope="module")
def knock_verdict(tmp_path_factory: pytest.TempPathFactory) -> list[Diagnosis]:
    """The ``knock`` recording analysed: the diagnoses of its one job."""
    return _analysed(tmp_path_factory, "knock", ["real-tp_compute"], ANALYSIS_WINDOW_S)["real-tp_compute"]


def test_a_whole_job_slowdown_beside_a_straggler_is_not_the_stragglers(
    knock_verdict: list[Diagnosis],
) -> None:
    """The tensor-parallel job of ``test_real_runs`` as a fresh-clone CI recorded it (2026-12-07): rank 3
    is named ``compute`` from the fault's second window, and in the job's last two windows a job-level
    ``compute`` naming no rank opens beside it. A replay of the windows shows whose loss that is: rank
    3's excess over its peers held at 10.8-12.2 ms a step from the fault's first window to the job's
    end, while in the last two every rank's forward, rank 3's included, grew by 3.5-4.3 ms a step (the
    peers' self time 16.6 -> 20.1 and 20.9 ms) and the job's steps 57.5 -> 63-65 ms: the shared host
    slowed the whole job 18 s after rank 3's fault began, and no rank fell behind the job's common
    change. That loss is no rank's: rank 3's diagnosis must not take it in (its loss would be wrong),
    and a job-level diagnosis naming no rank tells it (docs/design.md §6.2: no slowdown above the loss
    threshold stays silent), as a clean job may carry one (``assert_blames_no_one``)."""
    named = [d for d in knock_verdict if d.rank is not None or d.ranks]
    check_verdict("tp_compute", named)
    for d in knock_verdict:
        if d in named:
            continue
        e = d.evidence
        assert host_slowed_the_job(d.to_dict()), knock_verdict
        # The job's own loss beyond the straggler's, at the loss threshold, with no rank behind.
        assert e["ranks_behind"] == 0, knock_verdict
        assert e["unexplained_ms_per_step"] >= DEFAULT_MIN_LOSS_PCT / 100 * e["healthy_step_ms"], (
            knock_verdict
        )
        assert d.first_window_ns > named[0].first_window_ns, knock_verdict


def test_a_ring_slowed_by_a_starved_host_is_no_slow_link(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The ``starved`` recording (its README): a clean 4-rank FSDP job whose host got busier after one
    healthy window (steps 127 -> 160-200 ms). Its one process group's transfers grew 44-54 ms a
    step against their own past while each rank waited 25-36 ms a step longer for a CPU than its
    work explains. A ring's transfer needs each of its ranks on a CPU in turn, so it can wait for
    each one's delay: ``causes._links`` leaves a link judged against its own past to the host when
    the delays of the group's ranks on one host, summed, cover the link's extra transfer (one
    rank's mean delay did not, and a ``communication`` diagnosis naming the four ranks opened).
    Only a job-level loss naming no rank may open, and its cause is the host (``host_stall``: the
    ranks' delay and the transfer time it explains grew most), not ``communication``."""
    (found,) = _analysed(tmp_path_factory, "starved", ["starved-fsdp-twin"], _RECALL_WINDOW_S).values()
    assert_blames_no_one([d.to_dict() for d in found])
    assert {d.cause for d in found} <= {"host_stall"}, found
