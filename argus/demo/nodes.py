"""`argus demo --nodes N`: the demo on N nodes of one machine, in network namespaces (root only).

The same parts as :mod:`argus.demo.local`, laid out as on a cluster (:mod:`argus.demo.multinode`):
`argus server` in the root namespace, and per node (a network namespace with its own
address and hostname, :mod:`argus.demo.netns`) a node agent and torchrun under `argus run`,
all with the same job id. The job's traffic crosses the nodes' job links; telemetry
goes over separate control links. ``--ranks`` is spread over the nodes:
``max(1, ranks // nodes)`` per node.

Scenarios: ``slow_link`` caps the job link of the node holding ``--slow-rank``
(default: node 1) at :data:`SLOW_LINK_MBIT` in both directions after the warm-up
(``tc`` ``tbf``); the others inject :mod:`argus.demo.job`'s faults on one rank, as
on one node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from argus.demo.local import CLEAN_RUN_S, FAULT_TIMEOUT_S, WINDOW_S, _print_human, trace_path
from argus.demo.multinode import MultiNodeJob
from argus.demo.netns import Cluster, netns_unavailable
from argus.diagnosis import Diagnosis
from argus.errors import ArgusError, ConfigError

__all__ = ["SLOW_LINK_MBIT", "main"]

#: The cap on the slow node's job link, Mbit/s (the demo job's all-reduce then takes ~20x longer).
SLOW_LINK_MBIT = 30.0
#: Healthy training before the fault, seconds: longer than on one node, because a slow link in a job
#: of one process group is judged against the group's own transfer times in earlier healthy windows
#: (:func:`argus.analyzer.collectives.slow_links`), and a loaded machine starts the ranks slowly.
WARMUP_S = 20.0


def _check(args: argparse.Namespace) -> None:
    if args.scenario == "slow_link" and args.nodes < 3:
        raise ConfigError("--scenario slow_link needs --nodes 3 or more (as root): one link among others")
    if args.nodes < 2:
        raise ConfigError("--nodes must be at least 2")
    why = netns_unavailable()
    if why is not None:
        raise ConfigError(f"--nodes runs each node in a network namespace: {why}; run it as root (sudo)")


def main(  # noqa: C901, PLR0912, PLR0915  (the multi-node demo's script, step after step)
    args: argparse.Namespace,
) -> int:
    """Run the multi-node demo; returns 0 when it ran (whatever it found)."""
    _check(args)
    per_node = max(1, args.ranks // args.nodes)
    world = per_node * args.nodes
    if args.slow_rank is not None and not 0 <= args.slow_rank < world:
        raise ConfigError(f"--slow-rank must be in 0..{world - 1} ({args.nodes} nodes x {per_node} ranks)")
    scenario: str = args.scenario
    slow_rank = None if scenario == "none" else (args.slow_rank if args.slow_rank is not None else None)
    if scenario == "slow_link":
        slow_node = slow_rank // per_node if slow_rank is not None else 1
    elif scenario != "none":
        slow_rank = slow_rank if slow_rank is not None else world - 1
        slow_node = slow_rank // per_node
    else:
        slow_node = None
    console = Console(stderr=True, soft_wrap=True)
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="argus-demo-nodes-"))
    work.mkdir(parents=True, exist_ok=True)
    job_id = f"demo-{scenario}-{args.nodes}n-{time.strftime('%Y%m%d-%H%M%S')}"
    in_job = "none" if scenario == "slow_link" else scenario  # a slow link is the harness's, not the job's
    job_args = [f"--scenario={in_job}", f"--fault-after-s={WARMUP_S}"]
    if slow_rank is not None and scenario != "slow_link":
        job_args.append(f"--slow-rank={slow_rank}")
    if args.steps is not None:
        job_args.append(f"--steps={args.steps}")
    try:
        with (
            Cluster(args.nodes) as cluster,
            MultiNodeJob(
                cluster, work, job_id, ranks_per_node=per_node, job_args=job_args, window_s=WINDOW_S
            ) as job,
        ):
            with console.status("starting argus server (embedded ClickHouse)"):
                job.start_server()
            console.print(f"[green]✓[/] argus server: gRPC {job.grpc} (control network), REST {job.http}")
            with console.status("starting a node agent on every node"):
                job.start_agents()
            for node in cluster.nodes:
                console.print(
                    f"[green]✓[/] {node.hostname}: job link {node.job_ip}, control link {node.control_ip}, "
                    f"ranks {job.ranks_of(node)}"
                )
            job.start_job()
            with console.status("starting the job on every node"):
                job.wait_attached(180)
            if scenario == "slow_link":
                fault = f"node{slow_node}'s job link capped at {SLOW_LINK_MBIT:g} Mbit/s"
            elif slow_rank is not None:
                fault = f"{scenario} on rank {slow_rank} (node{slow_node})"
            else:
                fault = "no fault"
            console.print(
                f"[green]✓[/] training job {job_id}: {world} ranks on {args.nodes} nodes, DDP over gloo; "
                f"{WARMUP_S:.0f} s healthy, then {fault}"
            )
            capped = slow_node if slow_node is not None else 1
            with console.status("training") as status:
                found = job.watch(
                    warmup_s=WARMUP_S,
                    fault=(lambda: job.limit(capped, SLOW_LINK_MBIT)) if scenario == "slow_link" else None,
                    expect_diagnosis=scenario != "none",
                    timeout_s=FAULT_TIMEOUT_S,
                    clean_s=CLEAN_RUN_S,
                    progress=lambda line: status.update(f"training ({line})"),
                )
                status.update("stopping the job")
                codes = job.stop_job()
            if any(codes):
                raise ArgusError(f"the training job failed (statuses {codes}); see {job.logs}")
            diagnoses = [Diagnosis.from_dict(d) for d in found]
            trace = trace_path(work, keep, job_id)
            shown = job.ranks_of(slow_node)[0] if slow_node is not None else 0
            with contextlib.suppress(OSError, ValueError):
                urllib.request.urlretrieve(f"{job.http}/api/v1/jobs/{job_id}/trace?ranks={shown},0", trace)
            if not args.json:
                _print_human(Console(soft_wrap=True), job_id, shown, diagnoses, trace, work / "store", keep)
    except BaseException:
        console.print(f"[red]the demo failed[/]; its logs are in {work / 'logs'}")
        raise
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        result: dict[str, Any] = {
            "job_id": job_id,
            "scenario": scenario,
            "slow_rank": slow_rank,
            "nodes": args.nodes,
            "slow_node": f"node{slow_node}" if slow_node is not None else None,
            "diagnoses": [d.to_dict() for d in diagnoses],
        }
        print(json.dumps(result, indent=2))
    return 0
