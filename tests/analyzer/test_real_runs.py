"""The analyzer on live real jobs: jobs of tests/analyzer/real_jobs.py under `argus run` (:data:`LIVE`).

One recording per job, made once per test session (session fixture): a real `argus server`
with its analyzer off stores what the node agent streams; then the server stops and the
analyzer runs offline over the store (`argus analyze --once` semantics, 6 s windows).

What must hold in every run: every rank of every job is recorded from start to stop, and the
analyzer covers the whole of it. The verdicts (:func:`check_verdict`) of the jobs not in
:data:`ASSERTED` are marked :data:`~tests.conftest.LOAD_DEPENDENT_VERDICT`: on a shared 2-core
host no two live runs are alike, and the analyzer's verdict on them flips with the load
(ranks waiting for a slow one, or slowed by the scheduler, are named; a clean job opens a
small diagnosis). They stay running and visible in every report;
the verdict the suite pins is the one on recordings of these jobs (test_recorded_runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from argus.analyzer.service import Analyzer
from argus.diagnosis import Diagnosis, read_diagnoses
from argus.store import Store, open_store
from argus.window_grid import WindowGrid
from tests.agent.jobs import argus_run, job_env, short_dir
from tests.analyzer.real_jobs import ANALYSIS_WINDOW_S, FAULT_S, JOBS, WARMUP_S, WINDOW_S, check_verdict
from tests.conftest import LOAD_DEPENDENT_VERDICT, ArgusServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

#: The jobs run live, about a minute each: a clean job and a slow rank of the pipeline and the
#: tensor-parallel layout (data parallel's runs live in tests/demo; the verdicts on all eleven
#: are pinned on recordings); all of :data:`JOBS` with ``ARGUS_TEST_REAL_RUNS=all``, to make a
#: recording (:mod:`tests.analyzer.recordings`).
LIVE = list(JOBS) if os.environ.get("ARGUS_TEST_REAL_RUNS") == "all" else ["none", "pp_compute", "tp_compute"]


def _record(server: ArgusServer, work: Path, name: str) -> None:
    stop = work / f"stop-{name}"
    job = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "-m", "argus.demo.job", *JOBS[name], f"--fault-after-s={WARMUP_S}", f"--stop-file={stop}",
    ]  # fmt: skip
    cmd = argus_run(work, server.grpc_target, f"real-{name}", job, window_s=WINDOW_S)
    log_path = work / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=job_env(work), stdout=log, stderr=subprocess.STDOUT)
        try:
            # Start-up (imports, agent, rendezvous) takes from seconds to tens of seconds on a busy
            # host: time the run from rank 0's "step 50" line. The fault started at most WARMUP_S
            # after that, so it then runs for at least FAULT_S.
            deadline = time.monotonic() + 300
            while "step 50 " not in log_path.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.5)
            time.sleep(WARMUP_S + FAULT_S)
            stop.touch()
            assert proc.wait(timeout=120) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass
class Recorded:
    """One live job as stored and analysed."""

    #: rank -> (steps stored, first step's start, last step's end), ns since the epoch.
    steps: dict[int, tuple[int, int, int]]
    #: The analysis windows' span: first window's start, last window's end (ns); failed windows.
    analysed: tuple[int, int]
    failed_windows: int
    diagnoses: list[Diagnosis]


def _read(store: Store, job: str) -> Recorded:
    steps = store.query(
        "SELECT rank, count(), min(start_ns), max(start_ns + dur_ns) FROM steps WHERE job_id = {job:String} "
        "GROUP BY rank ORDER BY rank",
        {"job": job},
    ).to_pylist()
    windows = store.query(
        "SELECT min(window_start_ns) AS lo, max(window_start_ns + window_ns) AS hi, "
        "countIf(status = 'failed') AS failed "
        "FROM (SELECT * FROM analysis_windows FINAL WHERE job_id = {job:String})",
        {"job": job},
    ).to_pylist()[0]
    return Recorded(
        steps={r["rank"]: tuple(list(r.values())[1:]) for r in steps},  # type: ignore[misc]
        analysed=(windows["lo"], windows["hi"]),
        failed_windows=windows["failed"],
        diagnoses=read_diagnoses(store, job),
    )


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Recorded]]:
    """Record every live job once; yield what the store holds of each and the offline analysis's diagnoses."""
    root = tmp_path_factory.mktemp("real-runs")
    server = ArgusServer(root / "data", ("--no-analyzer",), root)
    server.start()
    try:
        with short_dir() as work:
            for name in LIVE:
                _record(server, work, name)
    finally:
        assert server.stop() == 0, server.logs()
    # chDB allows one open data dir per process: analyse, read back and close before yielding.
    store = open_store(server.store_url)
    try:
        out = {}
        for name in LIVE:
            job = f"real-{name}"
            analyzer = Analyzer(
                store, window=WindowGrid.from_seconds(ANALYSIS_WINDOW_S), job=job, backlog_s=None
            )
            analyzer.run_once(now_ns=time.time_ns() + 60 * 10**9)
            out[name] = _read(store, job)
    finally:
        store.close()
    yield out


@pytest.mark.parametrize("name", LIVE)
def test_every_rank_is_recorded_and_analysed_from_start_to_stop(
    recorded: dict[str, Recorded], name: str
) -> None:
    job = recorded[name]
    assert sorted(job.steps) == [0, 1, 2, 3], job
    # Each rank ran the warm-up and the fault (its first 50 steps come before the timed part).
    seconds = {rank: (last - first) / 1e9 for rank, (_, first, last) in job.steps.items()}
    assert min(seconds.values()) >= WARMUP_S + FAULT_S, seconds
    assert min(n for n, _, _ in job.steps.values()) > 100, job.steps
    # The analysis windows cover every rank's steps, and none of them failed.
    lo, hi = job.analysed
    assert lo <= min(first for _, first, _ in job.steps.values()) + ANALYSIS_WINDOW_S * 1e9, (
        job.analysed,
        job.steps,
    )
    assert hi >= max(last for _, _, last in job.steps.values()), (job.analysed, job.steps)
    assert job.failed_windows == 0, job


#: Live verdicts asserted: the clean job blamed no one in every run, and the pipeline job's slow rank
#: is named since the two ranks of its role are compared with each other (2026-12-06; before, it now
#: and then stayed inside its own past's noise: right in 6 of 8 runs). The tensor-parallel job's was
#: right in every run from 82d531a to 2026-12-07, when on a slower machine it got, beside rank 3's
#: diagnosis, a job-level one naming no rank in 2 of 3 runs (a fresh-clone CI's, and one under load
#: 7-10), the analyzer of before that day's changes alike: the host slowed the whole job, rank 3
#: included, late in the run (``test_recorded_runs``, ``knock``, from the CI's recording). A second,
#: true diagnosis beside the fault's is what ``check_verdict`` refuses, so load-dependent since.
#: The jobs run only with ``ARGUS_TEST_REAL_RUNS=all`` stay load-dependent (not asserted) until they
#: have a record (all 11 right in one run, 2026-12-06 11:32).
ASSERTED = {"none", "pp_compute"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n in ASSERTED else [LOAD_DEPENDENT_VERDICT]) for n in LIVE]
)
def test_the_verdict_on_a_live_job(recorded: dict[str, Recorded], name: str) -> None:
    check_verdict(name, recorded[name].diagnoses)
