"""Must show 1 of issue 13: a slow link on one node of three, diagnosed live, and what is not one.

Three nodes in network namespaces, one rank each (DDP over gloo on the job links; two
ranks per node work the same and cost twice the CPU). The slow link runs through
`argus demo --nodes 3 --scenario slow_link`, as a user runs it; the clean and the
compute runs through the same harness directly. Each run takes a little over a
minute on a quiet 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from argus.demo.netns import Cluster, netns_unavailable
from argus.demo.nodes import SLOW_LINK_MBIT
from tests.cluster.harness import WARMUP_S, require, run_job
from tests.conftest import LOAD_DEPENDENT_VERDICT, assert_blames_no_one

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow_link_demo() -> dict[str, Any]:
    """`argus demo --nodes 3 --scenario slow_link --json`, run once for the tests that read it."""
    require(netns_unavailable())
    done = subprocess.run(
        [sys.executable, "-m", "argus.cli", "demo", "--nodes", "3", "--scenario", "slow_link", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["nodes"], result["slow_node"]) == (3, "node1")
    return result


def test_a_rate_limited_link_on_node_1_opens_a_diagnosis(slow_link_demo: dict[str, Any]) -> None:
    found = slow_link_demo["diagnoses"]
    assert any(d["state"] == "open" for d in found), json.dumps(slow_link_demo, indent=1)


# Failed once in the fresh-clone CI of 0024baa (a job-level loss instead of `communication` on rank 1)
# and once in four runs on 2026-12-06 20:07-20:13 (quiet machine; passed in that day's fresh-clone CI
# of 3ddf006 and twice alone): the link's own history is built from healthy warm-up windows only.
@LOAD_DEPENDENT_VERDICT
def test_the_limited_link_alone_is_named_communication_with_its_evidence(
    slow_link_demo: dict[str, Any],
) -> None:
    found = slow_link_demo["diagnoses"]
    assert len(found) == 1, json.dumps(found, indent=1)
    d = found[0]
    assert (d["cause"], d["ranks"]) == ("communication", [1]), json.dumps(d, indent=1)
    ev = d["evidence"]
    assert ev["slow_link_nodes"] == ["node1"], json.dumps(ev)
    # The grown transfer time ...
    assert ev["transfer_ms"] > 2 * ev["reference_transfer_ms"], json.dumps(ev)
    assert ev["transfer_growth_ms"] > 0
    # ... and node 1's capped link: its capacity, a throughput under it, busy through the transfers.
    link = ev["node_links"]["node1"]
    assert link["interface"] == "job0" and link["tx_capacity_mbit_s"] == SLOW_LINK_MBIT, json.dumps(ev)
    assert 0 < link["tx_mbit_s"] <= SLOW_LINK_MBIT * 1.05
    assert link["qdisc_overlimits"] > 0
    busy = ev["link_busy_pct"]
    assert busy["node1"] >= 50 and max(busy["node0"], busy["node2"]) < 10, json.dumps(ev)


# Flaked until 2026-12-06 (a host_stall or compute on one rank, against its peers' median one 5 s
# window and its own past the next): a busy host's scheduler holds one rank back for seconds, and
# the peers' threshold counted only its steps' noise, not how far its mean moves between windows.
# Since the peer comparison counts that drift too: 5 of 5 runs passed (21:30-21:44, load 16-41).
def test_the_same_job_without_the_limit_opens_nothing(cluster3: Cluster, tmp_path: Path) -> None:
    out = run_job(cluster3, tmp_path, "no-limit", clean_s=25)
    # Nothing blamed: at most the job's own loss when the shared host slowed it (fresh-clone CI
    # runs of 2026-12-06 opened one twice: every rank 15-30 % slower for 10-15 s, ranks []).
    assert_blames_no_one(out.diagnoses, out.describe())


def test_a_compute_straggler_on_node_2_is_compute_on_that_rank(cluster3: Cluster, tmp_path: Path) -> None:
    out = run_job(
        cluster3,
        tmp_path,
        "compute-node2",
        job_args=["--scenario=compute", "--slow-rank=2", f"--fault-after-s={WARMUP_S}"],
        expect_diagnosis=True,
    )
    assert any(d["state"] == "open" for d in out.diagnoses), out.describe()
    for d in out.diagnoses:
        assert (d["rank"], d["ranks"], d["cause"]) == (2, [2], "compute"), out.describe()
