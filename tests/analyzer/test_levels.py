"""The levels as pure functions: collective decomposition, L1, L2, slow links, liveness, causes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from argus.analyzer.collectives import decompose, slow_links, transfer_medians
from argus.analyzer.iteration import compare_iterations, job_step_times
from argus.analyzer.liveness import find_unresponsive
from argus.analyzer.phase import RankBaseline, _common_change, compare_phases
from argus.analyzer.pipeline import JobAnalysis
from argus.analyzer.window import Collectives, RankStatus, Steps, Window
from synthetic.jobs import Fault, JobSpec, Simulation, simulate

MS = 1_000_000


def _instance(
    issue_ms: list[float], end_ms: float, offsets_ms: list[float], seq: int = 0
) -> dict[str, list[int]]:
    n = len(issue_ms)
    return {
        "rank": list(range(n)),
        "seq": [seq] * n,
        "issue": [int((i + o) * MS) for i, o in zip(issue_ms, offsets_ms, strict=True)],
        "end": [int((end_ms + o) * MS) for o in offsets_ms],
    }


def _collectives(instances: list[dict[str, list[int]]]) -> Collectives:
    cat = {k: np.concatenate([np.asarray(i[k], np.int64) for i in instances]) for k in instances[0]}
    n = cat["rank"].size
    return Collectives(
        rank=cat["rank"],
        step=np.full(n, 7),
        group=np.zeros(n, np.int64),
        seq=cat["seq"],
        op=np.zeros(n, np.int64),
        bytes=np.full(n, 1 << 20),
        issue_ns=cat["issue"],
        start_ns=cat["issue"],
        dur_ns=cat["end"] - cat["issue"],
        in_window=np.ones(n, bool),
        group_names=("0",),
        op_names=("allreduce",),
    )


@pytest.mark.parametrize("offsets_ms", [[0, 0, 0, 0], [4.0, -3.0, 2.5, -5.0]])
def test_decomposition_is_exact_and_cancels_clock_offsets(offsets_ms: list[float]) -> None:
    # Rank 2 arrives 30 ms after the first; transfer takes 5 ms; clocks are off by a few ms.
    instances = [_instance([100, 104, 130 + 10 * s, 101], 135 + 10 * s, offsets_ms, seq=s) for s in range(6)]
    d = decompose(_collectives(instances))
    wait = d.wait_ns.reshape(6, 4) / MS
    np.testing.assert_allclose(wait[0], [30, 26, 0, 29], atol=1e-3)
    np.testing.assert_allclose(d.transfer_ns / MS, 5.0, atol=1e-3)
    assert (d.inst_last_rank == 2).all()
    np.testing.assert_allclose(d.inst_late_ns[0] / MS, 130 - 102.5, atol=1e-3)


def test_l1_finds_a_change_point_and_spikes_but_not_noise() -> None:
    rng = np.random.default_rng(0)
    base = rng.lognormal(np.log(0.5e9), 0.03, 200)
    same = rng.lognormal(np.log(0.5e9), 0.03, 20)
    slower = rng.lognormal(np.log(0.56e9), 0.03, 20)
    steps = np.arange(20)
    assert not compare_iterations(steps, same, base).change
    r = compare_iterations(steps, slower, base)
    assert r.change and r.p_value < 1e-3 and r.slowdown_pct == pytest.approx(100 * (1 - 0.5 / 0.56), abs=2.0)
    spiky = same.copy()
    spiky[[4, 11]] *= 2.5
    assert compare_iterations(steps, spiky, base).spike_steps.tolist() == [4, 11]


def test_job_step_time_is_wall_time_between_the_slowest_ranks_step_ends() -> None:
    # Rank 1 pauses 50 ns after step 5: its own step 6 is long, and rank 0's step 7 waits for it.
    st = Steps(
        rank=np.array([0, 1, 0, 1, 0, 1, 0, 1]),
        step=np.array([5, 5, 6, 6, 7, 7, 9, 9]),
        start_ns=np.array([0, 0, 100, 100, 200, 250, 400, 400]),
        dur_ns=np.array([100, 100, 100, 150, 150, 100, 100, 98]),
    )
    s, t = job_step_times(st)
    assert s.tolist() == [6, 7, 9] and t.tolist() == [150, 100, 75]  # step 8 is missing: 150 / 2
    assert t @ np.diff([5, 6, 7, 9]) == 500 - 100  # wall time from the end of step 5 to that of step 9
    s, t = job_step_times(st, before=(4, 60))
    assert s.tolist() == [5, 6, 7, 9] and t[0] == 40


def _window(spec: JobSpec, k: int):
    return simulate(spec).windows[k]


def test_l2_names_the_straggler_and_its_phase() -> None:
    spec = JobSpec(world=8, windows=4, seed=3, faults=(Fault("compute", (5,), 0.3, 0.0),))
    w = _window(spec, 2)
    r = compare_phases(w, decompose(w.collectives))
    assert set(r.rank[r.score >= 1].tolist()) == {5}
    i = 5
    assert (
        r.component_excess_ns[i, 1:3].sum() > 0.8 * r.component_excess_ns[i].clip(0).sum()
    )  # forward + backward
    assert r.wait_ns[i] < r.ref_wait_ns[i]  # the straggler waits least
    assert 10 < r.slowdown_pct(r.rank == 5) < 30


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_l2_in_a_pair_names_the_rank_its_partner_waits_for_and_not_the_partner(seed: int) -> None:
    # Two ranks, no past: each is the other's reference, step by step.
    spec = JobSpec(world=2, windows=4, seed=seed, faults=(Fault("compute", (1,), 0.3, 0.0),))
    w = _window(spec, 2)
    r = compare_phases(w, decompose(w.collectives))
    assert r.basis == ("peers", "peers") and r.score[1] >= 1 and r.score[0] < 1, r.score
    assert r.ref_self_ns[1] == pytest.approx(r.self_ns[0]) and r.wait_ns[0] > r.wait_ns[1]
    clean = _window(replace(spec, faults=()), 2)
    assert np.all(compare_phases(clean, decompose(clean.collectives)).score < 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_l2_never_names_a_rank_ahead_of_its_peers_for_one_component(seed: int) -> None:
    # Three of four ranks 40 % slower; the fourth stalls on the host a little (untracked time
    # beyond the slow ranks') but still ends its work far ahead of them: nobody waits for it.
    faults = (Fault("compute", (0, 1, 3), 0.4, 0.0), Fault("host_stall", (2,), 0.1, 0.0))
    w = _window(JobSpec(world=4, windows=3, seed=seed, faults=faults), 1)
    r = compare_phases(w, decompose(w.collectives))
    # Ahead (with more untracked time than the slow ranks; with most of its role slow, it is
    # itself the best ranks' level its role is judged against).
    assert r.excess_ns[2] < 0
    assert r.score[2] < 1, r.score


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_l2_with_many_slow_ranks(share: float) -> None:
    world = 64
    slow = tuple(range(0, world, int(1 / share)))
    spec = JobSpec(
        world=world, windows=4, seed=4, gpu=True, group_size=8, faults=(Fault("compute", slow, 0.2, 0.0),)
    )
    w = _window(spec, 2)
    r = compare_phases(w, decompose(w.collectives))
    assert set(r.rank[r.score >= 1].tolist()) == set(slow)


def test_slow_link_is_found_by_peers_and_by_history() -> None:
    spec = JobSpec(
        world=64,
        windows=4,
        seed=5,
        gpu=True,
        group_size=8,
        faults=(Fault("communication", (), 3.0, 20.0, "4"),),
    )
    sim = simulate(spec)
    before, after = sim.windows[1], sim.windows[2]
    d = decompose(after.collectives)
    links = [f for f in slow_links(d, after.collectives.group_names, {}) if f.score >= 1]
    assert [f.group for f in links] == ["4"] and links[0].basis == "peers"
    # A job with a single group compares with its own past.
    spec1 = JobSpec(world=8, windows=4, seed=6, faults=(Fault("communication", (), 3.0, 20.0, "0"),))
    sim1 = simulate(spec1)
    history = {k: v for k, v in transfer_medians(decompose(sim1.windows[1].collectives), ("0",)).items()}
    d1 = decompose(sim1.windows[2].collectives)
    links1 = [f for f in slow_links(d1, ("0",), history) if f.score >= 1]
    assert [f.group for f in links1] == ["0"] and links1[0].basis == "history"
    assert not [
        f
        for f in slow_links(decompose(before.collectives), before.collectives.group_names, {})
        if f.score >= 1
    ]


@pytest.mark.parametrize("slowed", [("1",), ("1", "2")])
def test_with_two_groups_of_a_kind_a_slow_link_stands_out_from_the_other_group_too(
    slowed: tuple[str, ...],
) -> None:
    """Two groups of 8 (too few for a peer comparison): one slower than its past and than the other
    group is its link; both slower alike are the host's or the job's, no group's link."""
    faults = tuple(Fault("communication", (), 3.0, 20.0, g) for g in slowed)
    sim = simulate(JobSpec(world=16, windows=4, seed=5, gpu=True, group_size=8, faults=faults))
    names = sim.windows[1].collectives.group_names
    history = transfer_medians(decompose(sim.windows[1].collectives), names)
    links = [f for f in slow_links(decompose(sim.windows[2].collectives), names, history) if f.score >= 1]
    if len(slowed) == 1:
        assert [(f.group, f.basis) for f in links] == [("1", "history")]
    else:
        assert links == []


def _status(**kw: object) -> RankStatus:
    n = 4
    base = dict(
        rank=np.arange(n),
        exited=np.zeros(n, bool),
        exit_code=np.zeros(n, np.int64),
        last_seen_ns=np.full(n, 100 * 10**9),
        last_progress_ns=np.full(n, 100 * 10**9),
        position=np.full(n, 8 * 50 + 5),
        has_gpu=np.zeros(n, bool),
        groups={"0": np.arange(n)},
    )
    base.update(kw)
    return RankStatus(**base)  # type: ignore[arg-type]


def test_liveness_stopped_rank_exited_rank_and_everyone_silent() -> None:
    end = 110 * 10**9
    seen = np.array([109, 109, 100, 109]) * 10**9
    went_on = np.array([8 * 58 + 5, 8 * 58 + 5, 8 * 50 + 5, 8 * 58 + 5])  # its peers did 8 more steps
    found = find_unresponsive(
        _status(last_seen_ns=seen, position=went_on), end, silence_ns=6 * 10**9, typical_step_ns=1e8
    )
    assert [(u.rank, u.hung) for u in found] == [(2, False)]
    exited = np.array([False, False, True, False])
    assert (
        find_unresponsive(
            _status(last_seen_ns=seen, position=went_on, exited=exited),
            end,
            silence_ns=6 * 10**9,
            typical_step_ns=1e8,
        )
        == []
    )
    all_silent = np.full(4, 100 * 10**9)
    assert (
        find_unresponsive(_status(last_seen_ns=all_silent), end, silence_ns=6 * 10**9, typical_step_ns=1e8)
        == []
    )


def test_a_silent_rank_is_named_only_when_its_peers_went_on_without_it_or_wait_for_it() -> None:
    """The clean Lightning job of issue 38 (kept recording r3): after the last step (step 19, seq 73
    of group "0" on every rank) ranks 0-2 sent nothing for 8.5 s while rank 3's heartbeat came back,
    waiting in no collective. No rank needs another: nobody is named. A rank that stops with its
    peers at the same point while they then wait in the next collective (it never issued it), or
    that they pass, is named."""
    end = 90 * 10**9
    seen = np.array([81.46, 81.47, 81.48, 89.86]) * 10**9
    seqs = dict(seq_groups=("0",), seq_group=np.zeros(4, np.int64), seq_rank=np.arange(4))
    last = np.full(4, 8 * 19 + 5)
    ended = _status(
        last_seen_ns=seen.astype(np.int64), position=last, seq_max=np.full(4, 73),
        waiting_since_ns=np.full(4, -1), **seqs,
    )  # fmt: skip
    assert find_unresponsive(ended, end, silence_ns=6 * 10**9, typical_step_ns=1.6e9) == []
    # Rank 0 died after step 19; rank 3 waits in seq 74 (its heartbeat), which rank 0 never issued.
    waits = _status(
        last_seen_ns=np.array([81.46, 89.8, 89.8, 89.86]) * 10**9, position=last,
        seq_max=np.array([73, 74, 74, 74]), waiting_since_ns=np.array([-1, 82, 82, 82]) * 10**9, **seqs,
    )  # fmt: skip
    assert [
        (u.rank, u.hung) for u in find_unresponsive(waits, end, silence_ns=6 * 10**9, typical_step_ns=1.6e9)
    ] == [(0, False)]
    # Rank 0 died inside seq 73 (its own heartbeat showed it waiting there too): peers wait in it.
    inside = _status(
        last_seen_ns=np.array([81.46, 89.8, 89.8, 89.86]) * 10**9, position=last, seq_max=np.full(4, 73),
        waiting_since_ns=np.array([81, 81, 81, 81]) * 10**9, **seqs,
    )  # fmt: skip
    assert [u.rank for u in find_unresponsive(inside, end, silence_ns=6 * 10**9, typical_step_ns=1.6e9)] == [
        0
    ]
    # Rank 0 died after step 19 and its peers did step 20 without it (a job with no collectives).
    passed = _status(
        last_seen_ns=np.array([81.46, 89.8, 89.8, 89.86]) * 10**9, position=np.array([157, 165, 165, 165]),
    )  # fmt: skip
    assert [u.rank for u in find_unresponsive(passed, end, silence_ns=6 * 10**9, typical_step_ns=1.6e9)] == [
        0
    ]


def test_a_hung_rank_is_named_with_the_collective_its_peers_wait_in() -> None:
    end = 120 * 10**9
    alive = np.full(4, 119 * 10**9)
    progress = np.array([110.3, 110.3, 110.1, 110.3]) * 10**9
    position = np.array([8 * 50 + 2, 8 * 50 + 2, 8 * 50 + 1, 8 * 50 + 2])  # rank 2 never finished forward
    status = _status(
        last_seen_ns=alive,
        last_progress_ns=progress.astype(np.int64),
        position=position,
        seq_groups=("0",),
        seq_group=np.zeros(4, np.int64),
        seq_rank=np.arange(4),
        seq_max=np.array([812, 812, 809, 812]),  # its peers issued up to 812 (in flight); it stopped at 809
    )
    found = find_unresponsive(status, end, silence_ns=6 * 10**9, typical_step_ns=1e8)
    assert [(u.rank, u.hung) for u in found] == [(2, True)]
    assert found[0].evidence["process_group"] == "0" and found[0].evidence["seq"] == 810
    # Everyone paused at the same point (a checkpoint): nobody is named.
    same = _status(last_seen_ns=alive, last_progress_ns=np.full(4, 110 * 10**9))
    assert find_unresponsive(same, end, silence_ns=6 * 10**9, typical_step_ns=1e8) == []
    # Heartbeats stopped with the progress: the feed stopped, not a hang.
    stopped = _status(
        last_seen_ns=progress.astype(np.int64), last_progress_ns=progress.astype(np.int64), position=position
    )
    assert find_unresponsive(stopped, end, silence_ns=60 * 10**9, typical_step_ns=1e8) == []


def test_a_peer_blocked_in_a_collective_or_lagging_is_not_taken_for_the_hung_rank() -> None:
    """Rank 3 hangs outside any collective. Rank 1 stands at the same position: once because its
    newest heartbeat shows it waiting in an all-reduce (it is blocked, by rank 3), once because its
    rows lag (its newest row predates most of the stall, so its position is stale)."""
    end = 120 * 10**9
    position = np.array([8 * 50 + 2, 8 * 50 + 1, 8 * 50 + 2, 8 * 50 + 1])
    progress = np.full(4, 110 * 10**9)
    waiting = np.array([110, 110, 110, -1]) * 10**9  # issue times of the collectives they wait in
    blocked = _status(
        last_seen_ns=np.full(4, 119 * 10**9), last_progress_ns=progress, position=position,
        waiting_since_ns=np.where(waiting < 0, -1, waiting),
    )  # fmt: skip
    found = find_unresponsive(blocked, end, silence_ns=60 * 10**9, typical_step_ns=1e8)
    assert [(u.rank, u.hung) for u in found] == [(3, True)]
    # Without heartbeats' pending columns both stand behind and both are named (as before).
    both = _status(last_seen_ns=np.full(4, 119 * 10**9), last_progress_ns=progress, position=position)
    assert [u.rank for u in find_unresponsive(both, end, silence_ns=60 * 10**9, typical_step_ns=1e8)] == [
        1,
        3,
    ]
    lagging = _status(
        last_seen_ns=np.array([119, 110.5, 119, 119]) * 10**9, last_progress_ns=progress, position=position
    )
    found = find_unresponsive(lagging, end, silence_ns=60 * 10**9, typical_step_ns=1e8)
    assert [(u.rank, u.hung) for u in found] == [(3, True)]


def test_a_hung_rank_of_a_job_without_phases_is_named_by_the_collective_its_peers_wait_in() -> None:
    """A plain DDP loop records step ends only: every rank's last step end is step 50's, and the
    hung rank's peers sit in the next step's first all-reduce (seq 812 in their heartbeats), which
    the hung rank never issued."""
    end = 120 * 10**9
    seqs = dict(seq_groups=("0",), seq_group=np.zeros(4, np.int64), seq_rank=np.arange(4))
    status = _status(
        last_seen_ns=np.full(4, 119 * 10**9),
        last_progress_ns=np.full(4, 110 * 10**9),
        seq_max=np.array([812, 812, 811, 812]),
        **seqs,
    )
    found = find_unresponsive(status, end, silence_ns=6 * 10**9, typical_step_ns=1e8)
    assert [(u.rank, u.hung) for u in found] == [(2, True)]
    assert found[0].evidence["collective"] == "0#812"
    # Everyone waiting in the same collective, or none: nobody is named.
    for same in ([812] * 4, [811] * 4):
        quiet = _status(last_seen_ns=np.full(4, 119 * 10**9), seq_max=np.array(same), **seqs)
        assert find_unresponsive(quiet, end, silence_ns=6 * 10**9, typical_step_ns=1e8) == []


@pytest.mark.parametrize(
    ("kind", "gpu", "cause", "phase"),
    [
        ("compute", False, "compute", {"forward", "backward"}),
        ("compute", True, "compute", {"forward", "backward"}),
        ("host_stall", False, "host_stall", {None}),
        ("host_stall", True, "host_stall", {None}),
        ("dataloader", False, "dataloader", {"data"}),
        ("throttling", True, "throttling", {"forward", "backward"}),
        ("hung", False, "unresponsive", {None}),
        ("dead", True, "unresponsive", {None}),
    ],
)
def test_pipeline_names_rank_and_cause(kind: str, gpu: bool, cause: str, phase: set[str | None]) -> None:
    world = 64 if gpu else 8
    spec = JobSpec(
        world=world,
        gpu=gpu,
        group_size=8 if gpu else 0,
        windows=5,
        seed=7,
        faults=(Fault(kind, (3,), 0.2 if kind != "host_stall" else 0.15, 23.0),),
    )
    sim = simulate(spec)
    ja = JobAnalysis("t", spec.window_ns)
    for w in sim.windows:
        ja.analyze(w)
    open_ = ja.tracker.open
    assert [(d.rank, d.cause) for d in open_] == [(3, cause)], open_
    assert open_[0].phase in phase
    assert (
        open_[0].first_window_ns == sim.windows[2].start_ns
        or open_[0].first_window_ns == sim.windows[3].start_ns
    )
    if cause == "unresponsive" and kind == "hung":
        assert open_[0].evidence["hung"] is True and "seq" in open_[0].evidence


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_two_of_four_ranks_slow_are_named_together_a_single_window_of_it_is_not(seed: int) -> None:
    """Half the ranks slow together: one diagnosis names the ones behind (by their change against
    their own past), never the fast ones. What a 2-core CI host does to a clean job — two ranks
    slowed for a single window — opens nothing: a fault must hold over the confirmation span."""

    def opened(ranks: tuple[int, ...], end_s: float) -> list[tuple[int | None, list[int]]]:
        spec = JobSpec(
            world=4,
            windows=7,
            window_s=6.0,
            step_s=0.05,
            seed=seed,
            faults=(Fault("compute", ranks, 0.15, onset_s=24.0, end_s=end_s),),
        )
        ja = JobAnalysis("t", spec.window_ns)
        changed = [d for w in simulate(spec).windows for d in ja.analyze(w).changed]
        return [(d.rank, d.ranks) for d in changed if d.state == "open"]

    together = opened((1, 2), 42.0)
    assert together and {(rank, tuple(ranks)) for rank, ranks in together} == {(None, (1, 2))}
    assert opened((1, 2), 30.0) == []
    assert {rank for rank, _ in opened((2,), 42.0)} == {2}


def _mean_step_ns(sim: Simulation, from_ns: int, to_ns: int) -> float:
    """Mean job step time (wall time between the slowest ranks' step ends) of the steps ending in the span."""
    ends: dict[int, int] = {}
    for st in (w.steps for w in sim.windows):
        for s, a, d in zip(st.step.tolist(), st.start_ns.tolist(), st.dur_ns.tolist(), strict=True):
            ends[s] = max(ends.get(s, 0), a + d)
    inside = sorted(e for e in ends.values() if from_ns <= e < to_ns)
    return float(np.mean(np.diff(inside)))


@pytest.mark.parametrize("seed", [5, 21])
@pytest.mark.parametrize(("kind", "magnitude"), [("host_stall", 0.25), ("dataloader", 0.3), ("compute", 0.5)])
def test_slowdown_is_the_share_of_wall_time_lost_over_the_diagnosis_span(
    kind: str, magnitude: float, seed: int
) -> None:
    """slowdown_pct = 100 · lost_s / span_s, summed over every window of the diagnosis, and it is the
    job's true loss: the faulty run's wall time against its fault-free twin over the same steps."""
    spec = JobSpec(
        world=8,
        windows=12,
        window_s=2.0,
        step_s=0.1,
        start_offset_s=0.7,
        seed=seed,
        faults=(Fault(kind, (5,), magnitude, 9.0),),
    )
    sim = simulate(spec)
    ja = JobAnalysis("t", spec.window_ns)
    versions = [d for w in sim.windows for d in ja.analyze(w).changed]
    assert versions and {(d.rank, d.cause) for d in versions} == {(5, kind)}
    d = versions[-1]
    e = d.evidence
    assert d.slowdown_pct == pytest.approx(100 * e["lost_s"] / e["span_s"], abs=0.01)
    span = sim.windows[-1].end_ns - d.first_window_ns
    assert e["span_s"] * 1e9 >= 0.7 * span  # every window of the diagnosis, not the latest alone
    # The true cost over the same span, from the fault-free twin (same jitter up to the onset).
    twin = simulate(replace(spec, faults=()))
    t0, t1 = d.first_window_ns, sim.windows[-1].end_ns
    true_pct = 100 * (1 - _mean_step_ns(twin, t0, t1) / _mean_step_ns(sim, t0, t1))
    assert d.slowdown_pct == pytest.approx(true_pct, abs=6.0), true_pct
    # One figure over the fault's span: it does not swing from window to window.
    assert max(v.slowdown_pct for v in versions) - min(v.slowdown_pct for v in versions) < 8.0


def test_a_long_fault_does_not_become_its_own_step_time_baseline() -> None:
    """After 70 s of a straggler (more steps than the L1 history holds) the evidence still
    compares the job's step time with its healthy one."""
    spec = JobSpec(
        world=8, windows=40, window_s=2.0, step_s=0.1, seed=4, faults=(Fault("dataloader", (2,), 0.4, 9.0),)
    )
    ja = JobAnalysis("t", spec.window_ns)
    versions = [d for w in simulate(spec).windows for d in ja.analyze(w).changed]
    e = versions[-1].evidence
    assert e["span_s"] >= 60 and e["step_time_change"] is True
    assert e["baseline_step_ms"] < 0.8 * e["job_step_ms"]
    sim = simulate(spec)
    twin = simulate(replace(spec, faults=()))
    t0, t1 = versions[-1].first_window_ns, sim.windows[-1].end_ns
    true_pct = 100 * (1 - _mean_step_ns(twin, t0, t1) / _mean_step_ns(sim, t0, t1))
    assert versions[-1].slowdown_pct == pytest.approx(true_pct, abs=5)


@pytest.mark.parametrize(
    ("kind", "magnitude", "seed"), [("host_stall", 0.07, 3), ("host_stall", 0.15, 3), ("compute", 0.07, 3)]
)
def test_a_two_rank_job_of_one_window_with_a_small_excess_opens_nothing(
    kind: str, magnitude: float, seed: int
) -> None:
    """`argus run -- torchrun --nproc_per_node 2 examples/train_ddp.py`: about 2 s of 11 ms steps,
    all in one 10 s window, then every rank exits. A rank 1 ms late per step for 2 s is no
    fail-slow fault (before 5db5319 these cases opened a one-window diagnosis, resolved at once by
    the job's end): its partner, which waits for it every step, may find it slower, but 2 s of
    steps never open a diagnosis."""
    spec = JobSpec(
        world=2,
        windows=2,
        window_s=10.0,
        step_s=0.011,
        start_offset_s=3.0,
        end_s=5.5,
        checkpoint_every=0,
        seed=seed,
        faults=(Fault(kind, (1,), magnitude, 0.5),),
    )
    sim = simulate(spec)
    assert sim.windows[0].steps.step.size > 400 and sim.windows[1].steps.step.size == 0
    ja = JobAnalysis("t", spec.window_ns)
    results = [ja.analyze(w) for w in sim.windows]
    # What is found is the slowed rank's (rank 0 waits for it), and held for one window only.
    assert {f.rank for r in results for f in r.findings if f.score >= 1.0} <= {1}
    assert [d for r in results for d in r.changed] == []
    assert bool(sim.windows[1].status.exited.all())  # the job ended


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_job_whose_ranks_drift_from_window_to_window_opens_nothing(seed: int) -> None:
    """A shared host's scheduler moves each rank's pace by several percent from one window to the
    next (``drift``; the clean twins of bench/detection_live.py). A rank's own past of a single
    window carries no estimate of that drift: compared against it, some rank of a clean job read
    as behind in every later window, so no window was healthy and a "many" diagnosis opened."""
    spec = JobSpec(world=4, windows=9, window_s=5.0, step_s=0.06, drift=0.06, seed=seed, start_offset_s=4.3)
    ja = JobAnalysis("t", spec.window_ns)
    opened = [d for w in simulate(spec).windows for d in ja.analyze(w).changed if d.state == "open"]
    assert opened == []


@pytest.mark.parametrize(("world", "slow"), [(4, (1, 2, 3)), (4, (0, 1, 3)), (8, (0, 2, 3, 5, 6, 7))])
def test_l2_with_most_of_a_role_slow_from_the_start_judges_it_against_its_best_ranks(
    world: int, slow: tuple[int, ...]
) -> None:
    # No past, more than half of the role slow: the median is a slow rank. The ranks behind the
    # role's best ranks are named, never the fast ones; the clean twin names nobody.
    spec = JobSpec(world=world, windows=3, seed=world + len(slow), faults=(Fault("compute", slow, 0.4, 0.0),))
    w = _window(spec, 1)
    r = compare_phases(w, decompose(w.collectives))
    assert set(r.rank[r.score >= 1].tolist()) == set(slow), r.score
    clean = _window(replace(spec, faults=()), 1)
    assert np.all(compare_phases(clean, decompose(clean.collectives)).score < 1)


def test_a_job_started_with_most_of_its_ranks_slow_is_diagnosed_by_its_third_window() -> None:
    # Three of four ranks 50 % slower from the first step: no healthy past ever. A diagnosis naming
    # exactly them opens by the job's third window, and its first window is the job's first or second.
    spec = JobSpec(world=4, windows=5, seed=11, faults=(Fault("compute", (1, 2, 3), 0.5, 0.0),))
    sim = simulate(spec)
    ja = JobAnalysis("j", spec.window_ns)
    for w in sim.windows[:3]:
        ja.analyze(w)
    assert [sorted(d.ranks) for d in ja.tracker.open] == [[1, 2, 3]], ja.tracker.open
    assert ja.tracker.open[0].first_window_ns <= sim.windows[1].start_ns


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_fault_from_the_first_step_that_dips_for_a_window_keeps_its_lost_time(seed: int) -> None:
    """A rank slow from the job's first step whose finding dips below the opening score for one
    window (still at the keep score) before its diagnosis opens: that window's loss is the fault's
    (hysteresis, as the lifecycle's), so it is neither lossless nor the job's healthy pace, and the
    job's lost time stays that of its fault-free twin. Before, the dip window became the pace and
    the next window's loss was measured against it."""
    faults = (
        Fault("compute", (3,), 0.4, 0.0, end_s=6.0),
        Fault("compute", (3,), 0.05, 6.0, end_s=12.0),
        Fault("compute", (3,), 0.4, 12.0),
    )
    spec = JobSpec(world=4, windows=5, window_s=6.0, step_s=0.1, seed=seed, start_offset_s=0.5, faults=faults)
    sim = simulate(spec)
    ja = JobAnalysis("t", spec.window_ns)
    accounts = [ja.analyze(w).accounting for w in sim.windows]
    dip = accounts[1]
    assert dip.lost_ns > 0
    assert ja.pace_ns is None  # no window of the fault became its healthy pace
    twin = simulate(replace(spec, faults=()))
    t0, t1 = sim.windows[0].start_ns, sim.windows[-1].end_ns
    lost = sum(a.lost_ns for a in accounts)
    true_ns = sum(a.wall_ns for a in accounts) - sum(a.steps for a in accounts) * _mean_step_ns(twin, t0, t1)
    assert lost >= 0.8 * true_ns, (lost / 1e9, true_ns / 1e9)


def _pooled_best(windows: list[Window], k: int) -> list[int]:
    """The ranks L2 names in window ``k`` with the best-ranks evidence of windows ``0..k-1`` pooled."""
    prior: dict[int, tuple[float, int, float]] = {}
    for w in windows[:k]:
        r = compare_phases(w, decompose(w.collectives), best_carried=prior)
        for rank, (total, steps, raw) in zip(r.rank.tolist(), r.best_sums.tolist(), strict=True):
            was = prior.get(rank, (0.0, 0, 0.0))
            prior[rank] = (was[0] + total, was[1] + int(steps), was[2] + raw)
    r = compare_phases(windows[k], decompose(windows[k].collectives), best_carried=prior)
    return sorted(r.rank[r.score >= 1].tolist())


def test_most_of_a_role_slow_from_the_start_is_named_on_evidence_pooled_over_windows() -> None:
    """Three of four ranks 15 % slower from the first step, 5 s windows of ten steps: one window
    alone leaves them under the best-ranks bar; pooled with the job's two earlier windows (a
    sequential test) it names exactly them. The bar is not lowered: the clean twin pooled alike
    names nobody."""
    spec = JobSpec(world=4, windows=3, window_s=5.0, seed=3, faults=(Fault("compute", (1, 2, 3), 0.15, 0.0),))
    windows = simulate(spec).windows
    r = compare_phases(windows[2], decompose(windows[2].collectives))
    assert not np.any(r.score >= 1), r.score  # one window's ten steps: too few
    assert _pooled_best(windows, 2) == [1, 2, 3]
    for seed in range(4):
        assert _pooled_best(simulate(replace(spec, faults=(), seed=seed)).windows, 2) == []


def test_l2_against_its_peers_a_rank_is_judged_with_how_far_its_mean_moves_between_windows() -> None:
    """A role of three, rank 0 a little slower (its steps' noise alone makes that a straggler). When
    its healthy windows showed its mean moving about the others' by half that excess with nothing
    wrong (a busy host's scheduler: a clean three-node job's rank 0 ran 26 ms per step behind
    its peers for one 5 s window and 13 ms the next, then level again), the excess is within reach
    of that drift: no straggler, against its peers as against its own past."""
    spec = JobSpec(world=3, windows=4, seed=0, faults=(Fault("compute", (0,), 0.15, 0.0),))
    w = _window(spec, 2)
    d = decompose(w.collectives)
    r = compare_phases(w, d)
    assert r.basis[0] == "peers" and r.score[0] >= 1, r.score
    half = float(r.excess_ns[0]) / 2
    past = {
        int(rank): RankBaseline(
            self_ns=float(r.self_ns[i]),
            sigma_ns=0.0,
            comp_ns=np.zeros(5),
            step_ns=float(r.step_ns[i]),
            drift_ns=half,
            comp_drift_ns=np.full(5, half),
        )
        for i, rank in enumerate(r.rank.tolist())
    }
    drifting = compare_phases(w, d, baseline=past)
    assert drifting.peer_score[0] < 1 and drifting.score[0] < 1, (drifting.peer_score, drifting.past_score)


def test_a_stage_behind_as_a_whole_leaves_the_job_s_common_change_to_the_stage_that_waited() -> None:
    """The numbers of the recorded pp-stage1-compute job's first window of its fault (5 s, 62 steps
    a rank; tests/data/real_runs/wrong_two): stage 1 (ranks 2, 3) 9.2 and 11.0 ms a step slower
    than its own past, stage 0 0.4 and 2.9 ms. Rank by rank, stage 1's noisy steps (16 ms) keep
    each of its ranks within its threshold (10.3 ms), and the median of the four made 6.1 ms the
    job's common change: half the stage's slowdown. As a role, its mean change is 8.5 ms above
    stage 0's against a threshold of 7.3 ms: the common change is stage 0's, and stage 1 is behind
    as a whole. A job of one role, and a stage within its threshold, are judged as before."""
    change = np.array([0.4, 2.9, 9.2, 11.0]) * MS
    sigma = np.array([8.9, 3.8, 16.1, 16.3]) * MS
    n = np.full(4, 62)
    step = np.full(4, 73.0 * MS)
    level, rest, whole = _common_change(change, sigma, n, step, np.array([0, 0, 1, 1]))
    assert level == pytest.approx(1.65 * MS)
    assert rest.tolist() == [True, True, False, False]
    assert whole.tolist() == [False, False, True, True]
    one_role, rest, whole = _common_change(change, sigma, n, step, np.zeros(4, np.int64))
    assert one_role == pytest.approx(6.05 * MS) and rest.all() and not whole.any()
    near = np.array([0.4, 2.9, 6.0, 7.0]) * MS  # 5.0 ms above stage 0: within the role's noise
    _, rest, whole = _common_change(near, sigma, n, step, np.array([0, 0, 1, 1]))
    assert rest.all() and not whole.any()
    # A stage that sped up (a core freed) puts no other stage behind it.
    faster = np.array([-9.0, -11.0, 0.4, 1.0]) * MS
    level, rest, whole = _common_change(faster, sigma, n, step, np.array([0, 0, 1, 1]))
    assert not whole.any() and rest[2:].all()
