"""Must show 2 of issue 13: a node on a shifted wall clock, and a clock that steps mid-run.

Node 1's node agent and job run under libfaketime (:mod:`tests.cluster.faketime`),
the other nodes and the collector on the machine's clock. Each run is a clean
job (no fault) of about a minute.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from argus.netns import Cluster
from tests.cluster.faketime import faketime_env
from tests.cluster.harness import run_job

pytestmark = pytest.mark.slow

#: How close a stored offset must be to the clock's true offset, ns.
TOLERANCE_NS = 5_000_000


def _set_offset(spec: Path, offset: str) -> None:
    """Write a new libfaketime offset at once (rename: no process reads a half-written file)."""
    tmp = spec.with_suffix(".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, spec)


def test_a_node_3_s_ahead_is_corrected_its_offset_stored_and_nothing_opens(
    cluster3: Cluster, tmp_path: Path
) -> None:
    env, _ = faketime_env(tmp_path / "faketime", "+3")
    out = run_job(cluster3, tmp_path / "run", "clock-ahead", node_env={1: env}, clean_s=20)
    offsets = {r["rank"]: r["clock_offset_ns"] for r in out.ranks}
    assert sorted(offsets) == [0, 1, 2], out.describe()
    assert abs(offsets[1] - (-3_000_000_000)) < TOLERANCE_NS, offsets
    assert abs(offsets[0]) < TOLERANCE_NS and abs(offsets[2]) < TOLERANCE_NS, offsets
    hosts = {r["rank"]: r["host"] for r in out.ranks}
    assert hosts == {0: "node0", 1: "node1", 2: "node2"}
    assert out.diagnoses == [], out.describe()


def test_a_clock_step_mid_run_is_logged_refreshed_and_not_taken_for_lateness(
    cluster3: Cluster, tmp_path: Path
) -> None:
    env, spec = faketime_env(tmp_path / "faketime", "+0", steppable=True)
    out = run_job(
        cluster3,
        tmp_path / "run",
        "clock-step",
        node_env={1: env},
        fault=lambda _job: _set_offset(spec, "+2"),
        clean_s=25,
    )
    agent_log = out.logs["agent-node1.log"]
    assert "the wall clock stepped by +2.0" in agent_log, agent_log[-3000:]
    offsets = {r["rank"]: r["clock_offset_ns"] for r in out.ranks}
    # The offset stored for rank 1 is the refreshed one: the collector's clock did not move.
    assert abs(offsets[1] - (-2_000_000_000)) < TOLERANCE_NS, offsets
    assert abs(offsets[0]) < TOLERANCE_NS, offsets
    assert out.diagnoses == [], out.describe()
