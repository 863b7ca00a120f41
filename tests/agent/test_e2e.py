"""Real gloo DDP jobs under `argus run` (no Argus line in the script) into a real `argus server`.

Must show 1-4 of issue 3: steps, phases, every DDP bucket all-reduce with
matching sequence numbers, timings that nest, lifecycle rows; a delayed rank
waits least; a collector killed for 10 s loses and duplicates nothing; a
user's comm hook and in-place ops train to the same loss with and without Argus.
And a rank that stops issuing collectives: its peers' heartbeats name the
collective they wait in, which the stuck rank never issued.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.agent.jobs import argus_run, job_env, read_tables, run, short_dir, torchrun

pytestmark = pytest.mark.slow

TABLES = ["jobs", "ranks", "steps", "phases", "collectives", "host_samples"]


def _frames(server, job_id: str) -> dict[str, pd.DataFrame]:
    assert server.stop() == 0, server.logs()
    return {k: v.to_pandas() for k, v in read_tables(server.store_url, job_id, TABLES).items()}


def test_four_rank_ddp_job_is_recorded_whole(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    steps = 12
    with short_dir() as work:
        job = torchrun(4, "--steps", str(steps), "--subgroups")
        out = run(argus_run(work, server.grpc_target, "e2e-whole", job), job_env(work))
        agent_log = (work / "agent.log").read_text()
    assert out.returncode == 0, out.stderr[-3000:] + agent_log
    t = _frames(server, "e2e-whole")

    jobs = t["jobs"]
    assert len(jobs) == 1 and jobs.world_size[0] == 4 and jobs.source[0] == "live"
    assert "ddp_job.py" in jobs.command[0]

    ranks = t["ranks"]
    for r in range(4):
        mine = ranks[ranks["rank"] == r]
        assert mine.event.tolist().count("attach") == 1
        exits = mine[mine.event == "exit"]
        assert exits.exit_code.tolist() == [0]
        world = mine[(mine.event == "group") & (mine.group_name == "0")]
        assert [list(g) for g in world.group_ranks] == [[0, 1, 2, 3]]
        pair = [0, 1] if r < 2 else [2, 3]
        sub = mine[(mine.event == "group") & (mine.group_name != "0")]
        assert [list(g) for g in sub.group_ranks] == [pair] and set(sub.group_backend) == {"gloo"}
        assert (mine.agent_id != "").all()

    st, ph, co = t["steps"], t["phases"], t["collectives"]
    for r in range(4):
        s = st[st["rank"] == r].sort_values("step")
        assert s.step.tolist() == list(range(steps)), f"rank {r} steps"
        # Steps are back to back: each starts where the previous ended.
        ends = (s.start_ns + s.dur_ns).to_numpy()
        assert (s.start_ns.to_numpy()[1:] == ends[:-1]).all()
        p = ph[ph["rank"] == r].merge(s, on=["rank", "step"], suffixes=("", "_step"))
        for step, grp in p.groupby("step"):
            assert set(grp.phase) == {"data", "forward", "backward", "optimizer"}, (r, step)
        assert (p.start_ns >= p.start_ns_step).all()
        assert (p.start_ns + p.dur_ns <= p.start_ns_step + p.dur_ns_step).all()

    # Every DDP bucket all-reduce: same number per step on every rank, (group, seq) matching across ranks.
    ar = co[(co.op == "allreduce") & (co.step < steps)]
    per_step = ar.groupby(["step", "rank"]).size().unstack()
    assert per_step.shape == (steps, 4) and (per_step.nunique(axis=1) == 1).all()
    # DDP rebuilds its buckets after the first iteration; from then on there are several.
    assert (per_step.loc[1:, 0] >= 2).all()
    by_instance = co.groupby(["process_group", "seq"])
    sizes = co.groupby("process_group")["rank"].nunique()
    assert sizes["0"] == 4 and len(sizes) == 3 and (sizes.drop("0") == 2).all()
    assert (
        by_instance["rank"].nunique() == sizes.reindex(by_instance.size().index.get_level_values(0)).values
    ).all()
    assert (by_instance["op"].nunique() == 1).all() and (by_instance["bytes"].nunique() == 1).all()
    for (r, pg), grp in co.groupby(["rank", "process_group"]):
        assert sorted(grp.seq) == list(range(len(grp))), (r, pg)
    assert (co[co.process_group != "0"].groupby("rank").size() == 3).all()
    # Bucket all-reduces are issued and complete inside their step's backward.
    bw = ph[ph.phase == "backward"][["rank", "step", "start_ns", "dur_ns"]]
    j = ar.merge(bw, on=["rank", "step"], suffixes=("", "_bw"))
    assert len(j) == len(ar)
    assert (j.issue_ns >= j.start_ns_bw).all()
    assert (j.issue_ns + j.dur_ns <= j.start_ns_bw + j.dur_ns_bw).all()
    assert (j.dur_ns >= 0).all() and (j.start_ns == j.issue_ns).all()

    hs = t["host_samples"]
    node, hs = hs[hs["rank"] < 0], hs[hs["rank"] >= 0]
    assert set(hs["rank"]) == {0, 1, 2, 3}
    assert (hs.proc_cpu_ns > 0).any() and (hs.rss_bytes > 0).all() and (hs.dropped_events == 0).all()
    # Four ranks on two cores: they wait in the run queue now and then; the node's rows know no such thing.
    assert (hs.run_delay_ns >= 0).all() and (hs.run_delay_ns > 0).any()
    # The node agent's link rows (rank -1): one per network interface and second, loopback left out.
    assert len(node) > 0 and (node.net_if != "").all() and "lo" not in set(node.net_if)
    assert (node.run_delay_ns == -1).all()


def test_delayed_rank_waits_least(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    delay_s, slow = 0.25, 2
    args = ["--steps", "10", "--delay-rank", str(slow), "--delay-s", str(delay_s), "--delay-from", "2"]
    with short_dir() as work:
        out = run(argus_run(work, server.grpc_target, "e2e-delay", torchrun(4, *args)), job_env(work))
    assert out.returncode == 0, out.stderr[-3000:]
    co = _frames(server, "e2e-delay")["collectives"]
    ar = co[(co.op == "allreduce") & (co.step >= 2) & (co.step < 10)].copy()
    ar["last_arrival"] = ar.groupby(["process_group", "seq"]).issue_ns.transform("max")
    ar["wait_s"] = (ar.last_arrival - ar.issue_ns) / 1e9
    wait = ar.groupby("rank").wait_s.mean()
    assert wait.idxmin() == slow, wait
    others = wait.drop(slow)
    assert wait[slow] < 0.02, wait
    assert ((others - wait[slow]) > 0.7 * delay_s).all() and ((others - wait[slow]) < 1.5 * delay_s).all(), (
        wait
    )


def test_heartbeats_name_the_collective_a_stuck_rank_never_issued(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    stuck, stall_s, stall_step = 3, 6.0, 4
    args = ["--steps", "7", "--delay-rank", str(stuck), "--delay-s", str(stall_s)]
    args += ["--delay-from", str(stall_step), "--delay-to", str(stall_step + 1)]
    with short_dir() as work:
        out = run(argus_run(work, server.grpc_target, "e2e-hang", torchrun(4, *args)), job_env(work))
    assert out.returncode == 0, out.stderr[-3000:]
    t = _frames(server, "e2e-hang")
    hs, co = t["host_samples"], t["collectives"]
    waiting = hs[hs.pending_seq >= 0]
    # For seconds every peer's heartbeat names one collective instance: the stalled step's first bucket.
    stalled = co[(co.step == stall_step) & (co.op == "allreduce") & (co.process_group == "0")]
    first_seq = int(stalled.seq.min())
    assert (stalled.groupby("rank").seq.min() == first_seq).all()
    long_waits = waiting[waiting.pending_seq == first_seq]
    for r in range(4):
        if r != stuck:
            mine = long_waits[long_waits["rank"] == r]
            assert len(mine) >= 3, (r, waiting)
            assert set(mine.pending_group) == {"0"} and set(mine.pending_op) == {"allreduce"}
            issued = stalled[(stalled["rank"] == r) & (stalled.seq == first_seq)].issue_ns.item()
            assert (mine.pending_issue_ns == issued).all()  # the same instance, its issue time
    # Until it issues that collective the stuck rank waits in nothing, and the last one it had issued
    # is lower. (Once it issues it, the peers' collective still takes a moment to complete, so their
    # last beats naming it may fall after that issue; the window ends at the issue, not at those beats.)
    lo = int(long_waits.time_ns.min())
    late = stalled[(stalled["rank"] == stuck) & (stalled.seq == first_seq)].issue_ns.item()
    assert late - lo > 0.5 * stall_s * 1e9  # it issued the collective after its peers had waited seconds
    mine = hs[(hs["rank"] == stuck) & (hs.time_ns >= lo) & (hs.time_ns < late)]
    assert len(mine) >= 3 and (mine.pending_seq == -1).all() and (mine.pending_group == "").all()
    assert (mine.pending_op == "").all() and (mine.pending_issue_ns == 0).all()
    before = co[(co["rank"] == stuck) & (co.process_group == "0") & (co.issue_ns <= lo)]
    assert int(before.seq.max()) == first_seq - 1
    # Outside the stall a beat names a collective only when it lands inside one.
    assert len(waiting) - len(long_waits) <= 0.25 * len(hs), waiting


def test_collector_killed_for_ten_seconds_loses_and_duplicates_nothing(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    steps = 80
    with short_dir() as work:
        cmd = argus_run(
            work,
            server.grpc_target,
            "e2e-outage",
            torchrun(4, "--steps", str(steps), "--step-sleep-s", "0.25"),
        )
        job = subprocess.Popen(
            cmd, env=job_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            log = work / "agent.log"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if log.exists() and log.read_text().count("connected") >= 4:
                    break
                time.sleep(0.2)
            time.sleep(3)
            server.kill()
            killed_at = time.monotonic()
            time.sleep(10)
            assert job.poll() is None, "the job must still be running after the outage"
            server.start()
            outage_s = time.monotonic() - killed_at
            output, _ = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
        agent_log = (work / "agent.log").read_text()
    assert job.returncode == 0, output[-3000:]
    assert outage_s >= 10
    t = _frames(server, "e2e-outage")
    st = t["steps"]
    for r in range(4):
        assert sorted(st[st["rank"] == r].step) == list(range(steps)), (r, agent_log[-3000:])
    # Phases and collectives arrived exactly once too.
    ph = t["phases"]
    assert not ph.duplicated(["rank", "step", "phase", "start_ns"]).any()
    co = t["collectives"]
    assert not co.duplicated(["rank", "process_group", "seq"]).any()
    assert "stream to" in agent_log  # the agent saw the collector go away


#: What libstdc++ prints when gloo's threads are torn down still joinable at exit: seen once, in a
#: CI run of the plain reference job, which runs without Argus (2026-12-04).
_GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def _loss(work: Path, cmd: list[str], env: dict[str, str], *, reference: bool = False) -> float:
    """The final loss the job wrote. ``reference``: the job runs without Argus, and an abort in
    torch's own teardown after it wrote its loss is accepted (it says nothing about Argus; seen in
    2 of 3 CI runs of 2026-12-04, twice in a row once); the probed run must exit cleanly."""
    loss = work / "loss.txt"
    loss.unlink(missing_ok=True)
    out = run(cmd, env)
    torn_down = reference and _GLOO_TEARDOWN_ABORT in out.stderr and loss.exists()
    assert out.returncode == 0 or torn_down, out.stderr[-3000:]
    return float(loss.read_text())


def test_user_comm_hook_and_inplace_model_train_the_same(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    with short_dir() as work:
        args = ["--steps", "15", "--hook", "fp16", "--inplace", "--loss-out", str(work / "loss.txt")]
        plain = _loss(work, torchrun(2, *args), job_env(work), reference=True)
        probed = _loss(
            work, argus_run(work, server.grpc_target, "e2e-hook", torchrun(2, *args)), job_env(work)
        )
    assert probed == plain
    co = _frames(server, "e2e-hook")["collectives"]
    ar = co[co.op == "allreduce"]
    # The user's fp16 hook ran (wrapped, once per bucket): the all-reduces carry fp16 buckets.
    assert len(ar) >= 2 * 15 * 2
    fp32_bucket_bytes = {64 * 4 + 64 * 64 * 4, 32 * 64 * 4 + 64 * 4 + 4 * 64 * 4 + 4 * 4}
    assert not set(ar.bytes) & fp32_bucket_bytes


def test_point_to_point_transfers_name_their_peer_and_pair_up(argus_server_factory) -> None:
    """Peers, seq pairing, and timing: gloo's send/recv have no future, so a receive ends at its wait."""
    server = argus_server_factory("--no-analyzer")
    rounds = 3
    delay_s = 0.3  # even ranks wait this long before each blocking send
    with short_dir() as work:
        job = torchrun(4, "--steps", "4", "--p2p", str(rounds), "--p2p-delay-s", str(delay_s))
        out = run(argus_run(work, server.grpc_target, "e2e-p2p", job), job_env(work))
    assert out.returncode == 0, out.stderr[-3000:]
    co = _frames(server, "e2e-p2p")["collectives"]
    p2p = co[co.op.isin(["send", "recv"])]
    assert (co[~co.op.isin(["send", "recv"])].peer == -1).all()
    for r in range(4):
        mine = p2p[p2p["rank"] == r]
        right, left = (r + 1) % 4, (r - 1) % 4
        # Blocking and non-blocking rounds: a send to each neighbour, a receive from each.
        assert sorted(mine[mine.op == "send"].peer) == sorted([right] * rounds + [left] * rounds)
        assert sorted(mine[mine.op == "recv"].peer) == sorted([left] * rounds + [right] * rounds)
        for op, peer in (("send", right), ("send", left), ("recv", left), ("recv", right)):
            seqs = mine[(mine.op == op) & (mine.peer == peer)].seq
            assert sorted(seqs) == list(range(rounds)), (r, op, peer)
        # Collectives on the world group keep a seq of their own, with no gap left by transfers.
        world = co[(co["rank"] == r) & (co.process_group == "0") & (co.peer == -1)]
        assert sorted(world.seq) == list(range(len(world)))
    # Every send pairs with exactly one receive: (group, sender, receiver, seq).
    sends = p2p[p2p.op == "send"].assign(sender=lambda f: f["rank"], receiver=lambda f: f.peer)
    recvs = p2p[p2p.op == "recv"].assign(sender=lambda f: f.peer, receiver=lambda f: f["rank"])
    key = ["process_group", "sender", "receiver", "seq"]
    assert sorted(map(tuple, sends[key].values.tolist())) == sorted(map(tuple, recvs[key].values.tolist()))
    # A receive ends after its send was issued; the odd ranks' blocking receives from their even
    # left neighbour (one a round) wait out the delay.
    pairs = sends.merge(recvs, on=key, suffixes=("_send", "_recv"))
    assert len(pairs) == len(sends)
    recv_end = pairs.issue_ns_recv + pairs.dur_ns_recv
    assert (recv_end >= pairs.issue_ns_send).all(), pairs[recv_end < pairs.issue_ns_send]
    blocked = recvs[(recvs["rank"] % 2 == 1) & (recvs.peer == recvs["rank"] - 1)]
    assert len(blocked) == 2 * rounds and (blocked.dur_ns >= 0.8 * delay_s * 1e9).all(), blocked.dur_ns


def test_every_public_collective_is_recorded_with_its_op(argus_server_factory) -> None:
    """all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single too: FSDP's and MoE's traffic.

    In torch 2.13 those three end in ProcessGroup methods of their own (``all_gather_single``, ...),
    not in ``_allgather_base``; a probe that wraps only the older names sees none of FSDP's
    all-gathers and reduce-scatters.
    """
    from tests.agent.ddp_job import EVERY_COLLECTIVE

    server = argus_server_factory("--no-analyzer")
    with short_dir() as work:
        job = torchrun(2, "--steps", "2", "--every-collective")
        out = run(argus_run(work, server.grpc_target, "e2e-every", job), job_env(work))
    assert out.returncode == 0, out.stderr[-3000:]
    co = _frames(server, "e2e-every")["collectives"]
    for r in range(2):
        world = co[(co["rank"] == r) & (co.process_group == "0")].sort_values("seq")
        # The training steps' bucket all-reduces, then the calls in order, then the final loss's.
        tail = world[world.step >= 2].op.tolist()
        assert tail == [*EVERY_COLLECTIVE, "allreduce"], tail
        called = world[world.step >= 2].iloc[: len(EVERY_COLLECTIVE)]
        assert (called.dur_ns >= 0).all() and (called[called.op != "barrier"].bytes > 0).all(), called


def test_bucket_callbacks_keep_their_thread_state_and_buckets_stay_recorded(argus_server_factory) -> None:
    """The completion callbacks on gloo's worker threads keep one Python thread state per thread
    (argus.agent.foreign_threads), and every DDP bucket is still recorded whole."""
    server = argus_server_factory("--no-analyzer")
    steps = 12
    with short_dir() as work:
        states_file = work / "states.json"
        job = torchrun(2, "--steps", str(steps), "--callback-states", str(states_file))
        out = run(argus_run(work, server.grpc_target, "e2e-states", job), job_env(work))
        agent_log = (work / "agent.log").read_text()
        assert out.returncode == 0, out.stderr[-3000:] + agent_log
        states = json.loads(states_file.read_text())
    # Rank 0's all-reduces completed on gloo's worker threads, whose state the probe's own callback
    # (the wrapped all-reduce's) kept: only a thread's first callback finds no mark.
    assert len(states) >= 10, states
    firsts = {}
    for thread, marked in states:
        if thread in firsts:
            assert marked, states
        firsts.setdefault(thread, marked)

    t = _frames(server, "e2e-states")
    co, ph = t["collectives"], t["phases"]
    ar = co[(co.op == "allreduce") & (co.step < steps)]
    # Two buckets a step once DDP has rebuilt them (bucket_cap_mb=0.01): the last two layers', then
    # the first's (float32 bytes), on both ranks.
    buckets = {(64 * 64 + 64 + 4 * 64 + 4) * 4, (32 * 64 + 64) * 4}
    later = ar[ar.step >= 1]
    assert (later.groupby(["rank", "step"]).size() == 2).all() and len(later) == 2 * 2 * (steps - 1)
    assert set(later.bytes) == buckets
    assert (later.groupby(["rank", "step"]).bytes.sum() == sum(buckets)).all()
    assert (ar.groupby("seq")["rank"].nunique() == 2).all() and (ar.groupby("seq").bytes.nunique() == 1).all()
    # Issued and completed inside their step's backward; stamped when they completed.
    bw = ph[ph.phase == "backward"][["rank", "step", "start_ns", "dur_ns"]]
    j = ar.merge(bw, on=["rank", "step"], suffixes=("", "_bw"))
    assert len(j) == len(ar)
    assert (j.issue_ns >= j.start_ns_bw).all() and (j.dur_ns > 0).all()
    assert (j.issue_ns + j.dur_ns <= j.start_ns_bw + j.dur_ns_bw).all()
