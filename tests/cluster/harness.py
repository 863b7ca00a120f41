"""Running a multi-node job under Argus for a test: the skip rule and one call per scenario.

:func:`run_job` starts `argus server`, one node agent per node and the demo job on
every node (:class:`argus.demo.multinode.MultiNodeJob`), lets it train healthy for
:data:`WARMUP_S`, injects the fault, and returns the diagnoses Argus gave while
the job ran, its ranks as the REST API lists them, and the logs. Windows are
5 s, as in `argus demo`: short, yet long enough for a shared 2-core machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from argus.demo.multinode import MultiNodeJob
from argus.demo.netns import Cluster

ENV_REQUIRE = "ARGUS_REQUIRE_NETNS"
WINDOW_S = 5.0
#: Healthy training before the fault (the analyzer's baselines: three windows).
WARMUP_S = 15.0


def require(reason: str | None) -> None:
    """Skip the test for ``reason`` (fail it under ``ARGUS_REQUIRE_NETNS=1``); nothing when None."""
    if reason is None:
        return
    if os.environ.get(ENV_REQUIRE, "").strip() == "1":
        pytest.fail(f"{ENV_REQUIRE}=1 but {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Outcome:
    """What a run left: diagnoses seen while it ran, its ranks (REST objects), logs by file name."""

    diagnoses: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    logs: dict[str, str]
    ranks_of: Callable[[int], list[int]]

    def describe(self) -> str:
        """Diagnoses and log tails, for assertion messages."""
        import json

        tails = "\n".join(f"--- {k}\n{v[-2500:]}" for k, v in sorted(self.logs.items()))
        return json.dumps(self.diagnoses, indent=1)[:6000] + "\n" + tails


def run_job(
    cluster: Cluster,
    work: Path,
    job_id: str,
    *,
    ranks_per_node: int = 1,
    job_args: Sequence[str] = (),
    node_env: Mapping[int, Mapping[str, str]] | None = None,
    fault: Callable[[MultiNodeJob], None] | None = None,
    expect_diagnosis: bool = False,
    clean_s: float = 25.0,
    timeout_s: float = 75.0,
) -> Outcome:
    """Run the demo job on every node of ``cluster`` under Argus; see the module docstring."""
    with MultiNodeJob(
        cluster,
        work,
        job_id,
        ranks_per_node=ranks_per_node,
        job_args=job_args,
        window_s=WINDOW_S,
        node_env=node_env,
    ) as job:
        job.start_server()
        job.start_agents()
        job.start_job()
        job.wait_attached(180)
        diagnoses = job.watch(
            warmup_s=WARMUP_S,
            fault=(lambda: fault(job)) if fault is not None else None,
            expect_diagnosis=expect_diagnosis,
            timeout_s=timeout_s,
            clean_s=clean_s,
        )
        ranks = job.ranks()
        codes = job.stop_job()
        logs = {p.name: p.read_text(errors="replace") for p in sorted(job.logs.glob("*.log"))}
        assert codes == [0] * len(codes), f"job exit statuses {codes}\n" + "\n".join(
            f"--- {k}\n{v[-3000:]}" for k, v in logs.items()
        )
        ranks_of = job.ranks_of
    return Outcome(diagnoses, ranks, logs, ranks_of)
