"""The demo job's layouts (argus.demo.job): real 4-rank gloo jobs that train and exit cleanly.

The pipeline layout runs under `argus run` so its point-to-point rows can be checked:
each send pairs with its receive by (group, sender, receiver, seq), a receive ends
after its send was issued, and the process groups are the ones the layout made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from argus import cli
from argus.demo import job as demo_job
from argus.demo import local as demo
from tests.agent.jobs import argus_run, job_env, read_tables, run, short_dir

STEPS = 12


def _job(timeline: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "-m", "argus.demo.job", f"--steps={STEPS}", f"--timeline={timeline}", *args,
    ]  # fmt: skip


def _timeline(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp", "tp"])
def test_layout_trains_and_leaves_no_gloo_thread_at_exit(layout: str, tmp_path: Path) -> None:
    # The fault starts at once: the job must also run with it (host work before a broadcast).
    timeline = tmp_path / "timeline.json"
    args = [
        "--layout",
        layout,
        "--fault-after-s=0",
        "--scenario=host_work",
        "--slow-rank=1",
        "--sync=broadcast",
    ]
    done = subprocess.run(_job(timeline, *args), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _timeline(timeline)
    assert len(doc["step_end_ns"]) == STEPS
    assert not [t for t in doc["threads_at_exit"] if "gloo" in t], doc["threads_at_exit"]
    # Every rank's own account of the injected work, per step: the host work (--host-work-s, 30 ms
    # by default) on rank 1 in every step, nothing elsewhere.
    injected = {r: _timeline(demo_job.injected_path(timeline, r))["injected_ns"] for r in range(4)}
    assert all(len(v) == STEPS for v in injected.values())
    assert all(ns >= 30e6 for ns in injected[1]) and not any(injected[0] + injected[2] + injected[3])


@pytest.mark.slow
def test_pipeline_rows_pair_each_send_with_its_receive(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    with short_dir() as work:
        timeline = work / "timeline.json"
        job = _job(timeline, "--layout=pp", "--scenario=compute", "--slow-stage=1", "--fault-after-s=0")
        out = run(argus_run(work, server.grpc_target, "pp-rows", job), job_env(work))
        assert out.returncode == 0, out.stderr[-3000:]
        doc = _timeline(timeline)
    assert not [t for t in doc["threads_at_exit"] if "gloo" in t]
    assert server.stop() == 0, server.logs()
    tables = read_tables(server.store_url, "pp-rows", ["collectives", "ranks"])
    co, ranks = (tables[t].to_pandas() for t in ("collectives", "ranks"))
    groups = {tuple(g) for g in ranks[ranks.event == "group"].group_ranks.map(list)}
    # Data-parallel groups per stage, pipeline groups per replica (and the world).
    assert {(0, 1), (2, 3), (0, 2), (1, 3), (0, 1, 2, 3)} <= groups
    p2p = co[co.op.isin(["send", "recv"])]
    micro = demo_job.MICRO_BATCHES
    for stage0, stage1 in ((0, 2), (1, 3)):
        # Per step, stage 0 sends the targets and one activation per micro-batch and receives
        # one gradient per micro-batch; stage 1 the reverse. Peers are global ranks.
        mine = p2p[p2p["rank"] == stage0]
        assert (mine.peer == stage1).all()
        assert (mine.op == "send").sum() == STEPS * (1 + micro) and (mine.op == "recv").sum() == STEPS * micro
        theirs = p2p[p2p["rank"] == stage1]
        assert (theirs.peer == stage0).all() and (theirs.op == "recv").sum() == STEPS * (1 + micro)
    sends = p2p[p2p.op == "send"].assign(sender=lambda f: f["rank"], receiver=lambda f: f.peer)
    recvs = p2p[p2p.op == "recv"].assign(sender=lambda f: f.peer, receiver=lambda f: f["rank"])
    key = ["process_group", "sender", "receiver", "seq"]
    pairs = pd.merge(sends, recvs, on=key, suffixes=("_send", "_recv"))
    assert len(pairs) == len(sends) == len(recvs)
    assert (pairs.bytes_send == pairs.bytes_recv).all()
    assert (pairs.issue_ns_recv + pairs.dur_ns_recv >= pairs.issue_ns_send).all()


@pytest.mark.slow
def test_fsdp_layout_records_every_layer_s_all_gather_and_reduce_scatter(argus_server_factory) -> None:
    """FSDP2 on gloo under `argus run`: its traffic is captured, and its waits are known.

    Each of the 2 sharded encoder layers and the root all-gather their parameters in forward and
    again in backward (resharded after forward) and reduce-scatter their gradients in backward.
    A compute fault on one rank from the start must not desynchronise the job's collectives.
    """
    server = argus_server_factory("--no-analyzer")
    with short_dir() as work:
        timeline = work / "timeline.json"
        job = _job(timeline, "--layout=fsdp", "--scenario=compute", "--slow-rank=1", "--fault-after-s=0")
        out = run(argus_run(work, server.grpc_target, "fsdp-rows", job), job_env(work))
        assert out.returncode == 0, out.stderr[-3000:]
        assert len(_timeline(timeline)["step_end_ns"]) == STEPS
    assert server.stop() == 0, server.logs()
    tables = read_tables(server.store_url, "fsdp-rows", ["collectives", "phases"])
    co, ph = (tables[t].to_pandas() for t in ("collectives", "phases"))
    sharded = 3  # two encoder layers and the root
    for r in range(4):
        mine = co[(co["rank"] == r) & co.step.between(1, STEPS - 2)]  # whole steps
        per_step = mine.groupby("step").op.value_counts().unstack(fill_value=0)
        assert (per_step["allgather"] >= sharded).all() and (per_step["reduce_scatter"] >= sharded).all(), (
            per_step
        )
        assert set(ph[ph["rank"] == r].phase) >= {"forward", "backward", "optimizer"}
    # Every rank issues the same collectives in the same order (one instance per seq).
    world = co[co.process_group == "0"]
    assert (world.groupby("seq")["rank"].nunique() == 4).all()
    assert (world.groupby("seq").op.nunique() == 1).all()


def _demo_choices(dest: str) -> list[str]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(next(a.choices for a in sub.choices["demo"]._actions if a.dest == dest))


def test_cli_offers_the_jobs_scenarios_and_layouts() -> None:
    # The CLI spells them out (demo_job imports torch); they must not drift apart.
    # slow_link is the multi-node harness's fault (argus.demo.nodes caps a link), not the job's.
    assert _demo_choices("scenario") == [*demo_job.SCENARIOS, "slow_link"]
    assert _demo_choices("layout") == list(demo_job.LAYOUTS)
    assert sorted(demo.LAYOUT_NAMES) == sorted(demo_job.LAYOUTS)  # the status line names each


def test_extra_passes_do_a_fraction_of_a_pass_on_that_share_of_the_batch() -> None:
    seen: list[int] = []
    demo_job.extra_passes(lambda x: seen.append(x.shape[0]), torch.zeros(16, 3), 2.25)
    assert seen == [16, 16, 4]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--layout=pp", "--scenario=dataloader", "--slow-rank=3"], "only stage 0"),
        (["--layout=dp", "--scenario=compute", "--slow-stage=1"], "--slow-stage needs --layout pp"),
        (["--scenario=host_work", "--slow-rank=1"], "needs --sync"),
        (["--scenario=compute", "--slow-ranks=1,7"], "must be in 0..3"),
    ],
)
def test_a_job_that_cannot_run_as_asked_says_why(args: list[str], problem: str) -> None:
    parsed = demo_job.parse_args(args)
    with pytest.raises(SystemExit, match=problem):
        demo_job._check(parsed, 4, demo_job._slow_ranks(parsed, 4))


@pytest.mark.parametrize("module", ["argus.demo.job", "argus.demo_job"])
def test_the_documented_command_and_the_module_run_the_same_job(module: str) -> None:
    # `python -m argus.demo_job`, the command of earlier versions and their scripts, is kept as a shim.
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "--layout {dp,pp,tp,fsdp}" in done.stdout, done.stderr


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_faults_own_time_leaves_out_its_wait_for_a_cpu_and_keeps_a_sleep_whole() -> None:
    # Real /proc reads: this thread and a busy competitor share one CPU, so a busy block's wall
    # time is half waiting for it (run-queue delay); its own time (wall - delay) is its CPU time.
    # A sleep is not runnable: its own time is the sleep, its delay only the wake-up's wait.
    fault = demo_job.Fault("compute", frozenset({0}), 0)
    cpu = min(os.sched_getaffinity(0))
    mask = os.sched_getaffinity(0)
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(rival.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        _busy(0.2)  # the rival is running
        cpu0 = time.thread_time_ns()
        with fault.timed():
            _busy(0.6)
        cpu_ns = time.thread_time_ns() - cpu0
        busy_ns, busy_delay_ns = fault.take()
    finally:
        os.sched_setaffinity(0, mask)
        rival.kill()
        rival.wait()
    assert busy_delay_ns > 0.25 * busy_ns, (busy_ns, busy_delay_ns)  # about half: the rival's share
    assert busy_ns - busy_delay_ns == pytest.approx(cpu_ns, rel=0.1, abs=20e6)
    with fault.timed():
        time.sleep(0.3)
    sleep_ns, sleep_delay_ns = fault.take()
    assert sleep_ns - sleep_delay_ns >= 0.3e9 and sleep_delay_ns < 0.1 * sleep_ns
    assert fault.take() == (0, 0)  # taken: the next step starts from nothing
    assert demo_job.thread_run_delay_ns() > 0
