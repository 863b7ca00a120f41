"""Must show 2 of issue 13: a node on a shifted wall clock, and the same clock stepping mid-run.

One clean job (no fault) on three nodes, about a minute and a half: node 1's node agent
and ranks run under libfaketime (:mod:`tests.cluster.faketime`) 3 s ahead of the
machine's clock; after the warm-up its clock steps forward by 2 s more. The other
nodes and the collector run on the machine's clock. The two tests read the one run:
the ranks as the REST API listed them just before the step, and at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from argus.demo.multinode import MultiNodeJob
from argus.demo.netns import Cluster, netns_unavailable
from tests.cluster.faketime import faketime_env
from tests.cluster.harness import Outcome, require, run_job
from tests.conftest import assert_blames_no_one

pytestmark = pytest.mark.slow

#: How close a stored offset must be to the clock's true offset, ns.
TOLERANCE_NS = 5_000_000
S = 1_000_000_000


def _set_offset(spec: Path, offset: str) -> None:
    """Write a new libfaketime offset at once (rename: no process reads a half-written file)."""
    tmp = spec.with_suffix(".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, spec)


@pytest.fixture(scope="module")
def clock_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Outcome, list[dict[str, Any]]]]:
    require(netns_unavailable())
    work = tmp_path_factory.mktemp("clocks")
    env, spec = faketime_env(work / "faketime", "+3", steppable=True)
    before: list[dict[str, Any]] = []

    def step(job: MultiNodeJob) -> None:
        before.extend(job.ranks())
        _set_offset(spec, "+5")

    with Cluster(3) as cluster:
        yield run_job(cluster, work / "run", "clocks", node_env={1: env}, fault=step, clean_s=25), before


def test_a_node_3_s_ahead_is_corrected_and_its_offset_stored_with_its_ranks(
    clock_run: tuple[Outcome, list[dict[str, Any]]],
) -> None:
    out, before = clock_run
    offsets = {r["rank"]: r["clock_offset_ns"] for r in before}
    assert sorted(offsets) == [0, 1, 2], out.describe()
    assert abs(offsets[1] - (-3 * S)) < TOLERANCE_NS, offsets
    assert abs(offsets[0]) < TOLERANCE_NS and abs(offsets[2]) < TOLERANCE_NS, offsets
    assert {r["rank"]: r["host"] for r in before} == {0: "node0", 1: "node1", 2: "node2"}


def test_a_step_of_2_s_mid_run_is_logged_refreshed_and_not_taken_for_lateness(
    clock_run: tuple[Outcome, list[dict[str, Any]]],
) -> None:
    out, _ = clock_run
    agent_log = out.logs["agent-node1.log"]
    assert agent_log.count("the wall clock stepped by") == 1, agent_log[-3000:]
    assert "the wall clock stepped by +2.0" in agent_log
    assert "estimated again after the step" in agent_log
    offsets = {r["rank"]: r["clock_offset_ns"] for r in out.ranks}
    # The offset stored for rank 1 now is the refreshed one: the collector's clock did not move.
    assert abs(offsets[1] - (-5 * S)) < TOLERANCE_NS, offsets
    assert abs(offsets[0]) < TOLERANCE_NS, offsets


def test_neither_the_offset_nor_its_step_opens_anything(
    clock_run: tuple[Outcome, list[dict[str, Any]]],
) -> None:
    out, _ = clock_run
    # A wrong offset would make node 1's ranks look seconds late (or early) in every collective.
    assert_blames_no_one(out.diagnoses, out.describe())
