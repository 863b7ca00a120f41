"""The analyzer on real data: a 4-rank gloo DDP job (argus.demo_job) under `argus run`, recorded by the agent.

One recording per scenario, made once per test session (session fixture): a real
`argus server` with its analyzer off stores what the node agent streams; then the
server stops and the analyzer runs offline over the store (`argus analyze --once`
semantics, 6 s windows: see ANALYSIS_WINDOW_S). Rank 3 is slowed for real after a healthy warm-up:

- ``compute``: extra encoder passes in its forward (more CPU work);
- ``host_stall``: a 0.15 s blocking sleep every 4 steps, outside the model and loader;
- ``dataloader``: its Dataset sleeps 4 ms per sample.

The analyzer must name rank 3 with the right cause and nobody else, and find
nothing in the clean run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from argus.analyzer.service import Analyzer
from argus.diagnosis import Diagnosis, read_diagnoses
from argus.store import open_store
from tests.agent.jobs import argus_run, job_env, short_dir
from tests.conftest import ArgusServer

pytestmark = pytest.mark.slow

SCENARIOS = ("none", "compute", "host_stall", "dataloader")
SLOW_RANK = 3
#: The node agent's compression window, seconds.
WINDOW_S = 2.0
#: The analysis window, seconds. Four ranks on a small, shared machine lose seconds at a time to
#: the scheduler (measured here: a clean rank 30-80 % slow for 2-4 s at a load average of 12);
#: 6 s windows average that out while a real fault lasts many windows.
ANALYSIS_WINDOW_S = 6.0
#: Healthy training before the fault, then training with it, seconds.
WARMUP_S = 8.0
FAULT_S = 30.0


def _record(server: ArgusServer, work: Path, scenario: str) -> None:
    stop = work / f"stop-{scenario}"
    job = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "-m", "argus.demo_job", f"--scenario={scenario}", f"--slow-rank={SLOW_RANK}",
        f"--fault-after-s={WARMUP_S}", f"--stop-file={stop}",
    ]  # fmt: skip
    cmd = argus_run(work, server.grpc_target, f"real-{scenario}", job, window_s=WINDOW_S)
    log_path = work / f"{scenario}.log"
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


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Diagnosis]]]:
    """Record every scenario once; yield each job's diagnoses from an offline analysis of the store."""
    root = tmp_path_factory.mktemp("real-runs")
    server = ArgusServer(root / "data", ("--no-analyzer",), root)
    server.start()
    try:
        with short_dir() as work:
            for scenario in SCENARIOS:
                _record(server, work, scenario)
    finally:
        assert server.stop() == 0, server.logs()
    # chDB allows one open data dir per process: analyse, read back and close before yielding.
    store = open_store(server.store_url)
    try:
        out = {}
        for scenario in SCENARIOS:
            job = f"real-{scenario}"
            analyzer = Analyzer(store, window_s=ANALYSIS_WINDOW_S, job=job, backlog_s=None)
            analyzer.run_once(now_ns=time.time_ns() + 60 * 10**9)
            out[scenario] = read_diagnoses(store, job)
    finally:
        store.close()
    yield out


def _describe(diagnoses: list[Diagnosis]) -> str:
    return "\n".join(
        f"{d.cause} rank={d.rank} ranks={d.ranks} phase={d.phase} score={d.score:.2f} {d.evidence}"
        for d in diagnoses
    )


def test_clean_run_has_no_diagnosis(recorded: dict[str, list[Diagnosis]]) -> None:
    assert recorded["none"] == [], _describe(recorded["none"])


@pytest.mark.parametrize(
    ("scenario", "phases"),
    [
        ("compute", {"forward", "backward"}),
        ("host_stall", {None, "forward", "data"}),
        ("dataloader", {"data"}),
    ],
)
def test_slow_rank_and_cause_are_named(
    recorded: dict[str, list[Diagnosis]], scenario: str, phases: set[str | None]
) -> None:
    found = recorded[scenario]
    assert [(d.rank, d.cause) for d in found] == [(SLOW_RANK, scenario)], _describe(found)
    d = found[0]
    assert d.phase in phases, _describe(found)
    assert d.slowdown_pct > 5 and d.evidence["windows"] >= 2, _describe(found)
