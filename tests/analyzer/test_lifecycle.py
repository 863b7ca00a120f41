"""Lifecycle: one diagnosis per fault, updated every window, resolved with hysteresis, no flapping."""

from __future__ import annotations

from dataclasses import replace

from argus.analyzer.findings import Finding
from argus.analyzer.lifecycle import RESOLVE_WINDOWS, Tracker, diagnosis_id

W = 10_000_000_000


def _f(rank: int, score: float, cause: str = "compute", **kw: object) -> Finding:
    kw = {"lost_ns": 0.1 * W, "wall_ns": float(W), **kw}  # a fault that costs the job 10 %
    return Finding(
        cause=cause,
        rank=rank,
        ranks=(rank,),
        group=None,
        phase="forward",
        kernel=None,
        score=score,
        slowdown_pct=5.0,
        subject=f"rank:{rank}",
        evidence={"x": score},
        **kw,  # type: ignore[arg-type]
    )


def _run(tracker: Tracker, windows: list[list[Finding]], observed: set[int] | None = None) -> list[list]:
    out = []
    for k, fs in enumerate(windows):
        out.append(tracker.update(k * W, fs, observed if observed is not None else {0, 1, 2, 3, 4, 5}))
    return out


def test_one_open_diagnosis_per_fault_updated_every_window_then_resolved() -> None:
    t = Tracker("job")
    scores = [0.2, 1.4, 1.3, 0.8, 1.1, 0.3, 0.1, 0.0, 0.0]
    changed = _run(t, [[_f(2, s)] if s >= 0.5 else [] for s in scores])
    ids = {d.id for ch in changed for d in ch}
    assert len(ids) == 1
    opened = changed[1][0]
    assert opened.state == "open" and opened.first_window_ns == W and opened.rank == 2
    # Kept through the 0.8 window (hysteresis), updated each window it was seen.
    assert [ch[0].last_window_ns for ch in changed[1:5]] == [W, 2 * W, 3 * W, 4 * W]
    # Resolved after RESOLVE_WINDOWS clean windows; last_window_ns stays the last window it was seen.
    resolved = [d for ch in changed for d in ch if d.state == "resolved"]
    assert len(resolved) == 1 and resolved[0].last_window_ns == 4 * W
    assert changed.index([resolved[0]]) == 4 + RESOLVE_WINDOWS
    assert t.open == []


def test_a_fault_hovering_around_the_threshold_does_not_flap() -> None:
    t = Tracker("job")
    scores = [1.2, 0.7, 1.05, 0.6, 0.95, 1.1, 0.55, 1.0]
    changed = _run(t, [[_f(1, s)] for s in scores])
    assert len({d.id for ch in changed for d in ch}) == 1
    assert all(d.state == "open" for ch in changed for d in ch)


def test_a_fault_that_costs_less_than_the_loss_threshold_never_opens() -> None:
    t = Tracker("job", min_loss_pct=5.0)
    cheap = [[_f(2, 3.0, lost_ns=0.04 * W)] for _ in range(4)]
    assert all(ch == [] for ch in _run(t, cheap))
    # The same evidence costing the job 6 % of its time opens.
    assert _run(Tracker("job", min_loss_pct=5.0), [[_f(2, 3.0, lost_ns=0.06 * W)]])[0][0].state == "open"


def test_below_open_score_nothing_opens() -> None:
    t = Tracker("job")
    assert _run(t, [[_f(1, 0.9)], [_f(1, 0.99)], [_f(1, 0.6)]]) == [[], [], []]


def test_windows_without_data_from_its_rank_neither_keep_nor_resolve() -> None:
    t = Tracker("job")
    t.update(0, [_f(3, 1.5)], {0, 1, 2, 3})
    for k in range(1, 10):  # rank 3's batches are missing for nine windows
        assert t.update(k * W, [], {0, 1, 2}) == []
    assert [d.rank for d in t.open] == [3]


def test_cause_follows_the_majority_of_windows() -> None:
    t = Tracker("job")
    seq = ["compute", "host_stall", "compute", "compute"]
    last = None
    for k, cause in enumerate(seq):
        ch = t.update(k * W, [_f(0, 1.5, cause)], {0})
        last = ch[-1]
    assert last is not None and last.cause == "compute"
    # The votes are the tracker's bookkeeping, not the diagnosis's evidence.
    assert t.state(last.id)["cause_votes"] == {"compute": 3, "host_stall": 1}
    assert "cause_votes" not in last.evidence and "subject" not in last.evidence
    assert len(t.open) == 1


def test_short_windows_need_consecutive_evidence() -> None:
    w2 = 5_000_000_000
    t = Tracker("job", window_ns=w2)  # 10 s of evidence = two 5 s windows
    assert t.confirm_windows == 2
    assert Tracker("job", window_ns=2_000_000_000).confirm_windows == 5
    burst = [[_f(0, 4.0)], [], [_f(0, 1.5)], [_f(0, 0.4)], [_f(0, 1.2)], [_f(0, 1.3)]]
    changed = [t.update(k * w2, fs, {0}) for k, fs in enumerate(burst)]
    assert [len(c) for c in changed] == [0, 0, 0, 0, 0, 1]  # one-window bursts never open
    assert changed[5][0].first_window_ns == 4 * w2  # first seen when its streak began


def test_the_opening_score_must_hold_over_the_whole_confirmation_span() -> None:
    w6 = 6_000_000_000  # two windows = 12 s >= CONFIRM_NS
    # Seen at the keep score, then once past the open score: 6 s of evidence at 1, not 10 s.
    t = Tracker("job", window_ns=w6)
    windows = [[_f(0, 0.6)], [_f(0, 1.3)], []]
    assert [t.update(k * w6, fs, {0}) for k, fs in enumerate(windows)] == [[], [], []]
    # Held past the open score for two windows: opens, first seen when its streak began.
    t = Tracker("job", window_ns=w6)
    changed = [t.update(k * w6, [_f(0, s)], {0}) for k, s in enumerate([0.6, 1.2, 1.1])]
    assert [len(c) for c in changed] == [0, 0, 1] and changed[2][0].first_window_ns == 0
    # A dip below the open score (but above the keep score) restarts the confirmation.
    t = Tracker("job", window_ns=w6)
    changed = [t.update(k * w6, [_f(0, s)], {0}) for k, s in enumerate([1.2, 0.7, 1.2, 1.3])]
    assert [len(c) for c in changed] == [0, 0, 0, 1]


def test_an_ambiguous_split_opens_only_when_strong_for_two_windows() -> None:
    def amb(rank: int, score: float) -> Finding:
        return _f(rank, score, needs_confirmation=True, ambiguous=True)

    t = Tracker("job")
    # Two of four ranks at 1.3-1.9 for three 10 s windows: which half is slow is unclear.
    assert _run(t, [[amb(1, 1.9), amb(2, 1.3)]] * 3) == [[], [], []]
    t = Tracker("job")  # strong once is not enough either
    assert _run(t, [[amb(1, 2.5)], [amb(1, 1.5)], [amb(1, 2.5)]]) == [[], [], []]
    t = Tracker("job")
    changed = _run(t, [[amb(1, 2.5), amb(2, 2.2)], [amb(1, 2.4), amb(2, 2.1)]])
    assert changed[0] == [] and sorted(d.rank for d in changed[1]) == [1, 2]
    # Once open, an ambiguous window keeps it like any other (hysteresis).
    assert [d.rank for d in t.update(2 * W, [amb(1, 0.9)], {1, 2})] == [1]


def test_thin_reference_needs_a_second_window_unless_strong() -> None:
    t = Tracker("job")
    assert t.update(0, [_f(0, 1.3, needs_confirmation=True)], {0}) == []
    assert [d.rank for d in t.update(W, [_f(0, 1.3, needs_confirmation=True)], {0})] == [0]
    t2 = Tracker("job")
    assert [d.rank for d in t2.update(0, [_f(1, 2.5, needs_confirmation=True)], {1})] == [1]
    t3 = Tracker("job")  # a one-window burst never opens
    assert _run(
        t3, [[_f(1, 1.3, needs_confirmation=True)], [], [_f(1, 1.3, needs_confirmation=True)], []]
    ) == [[], [], [], []]


def test_a_many_rank_diagnosis_absorbs_single_ones_and_members_have_hysteresis() -> None:
    t = Tracker("job")
    t.update(0, [_f(1, 1.5)], {0, 1, 2, 3, 4, 5, 6})
    many = Finding(
        cause="compute",
        rank=None,
        ranks=(1, 2, 3, 4, 5, 6),
        group=None,
        phase="forward",
        kernel=None,
        score=1.8,
        slowdown_pct=20.0,
        subject="many",
        member_scores={1: 1.5, 2: 1.2, 3: 1.3, 4: 1.1, 5: 1.6, 6: 0.7},
        lost_ns=0.2 * W,
        wall_ns=float(W),
    )
    ch = t.update(W, [many], {0, 1, 2, 3, 4, 5, 6})
    merged = [d for d in ch if d.state == "resolved"]
    assert [d.rank for d in merged] == [1] and "merged_into" in merged[0].evidence
    m = next(d for d in ch if d.state == "open")
    assert m.rank is None and m.ranks == [1, 2, 3, 4, 5]  # 6 is below the open score
    later = Finding(**{**many.__dict__, "member_scores": {1: 1.5, 2: 0.6, 3: 1.3, 4: 1.1, 5: 0.3, 6: 1.2}})
    m2 = t.update(2 * W, [later], {0, 1, 2, 3, 4, 5, 6})[0]
    # 2 kept at 0.6, 6 joins at 1.2; 5 at 0.3 stays until RESOLVE_WINDOWS windows in a row did
    # not keep it (as a diagnosis resolves: one window of few steps names few ranks)
    assert m2.id == m.id and m2.ranks == [1, 2, 3, 4, 5, 6]
    for k in range(3, 1 + RESOLVE_WINDOWS):
        assert t.update(k * W, [later], {0, 1, 2, 3, 4, 5, 6})[0].ranks == [1, 2, 3, 4, 5, 6]
    m3 = t.update((1 + RESOLVE_WINDOWS) * W, [later], {0, 1, 2, 3, 4, 5, 6})[0]
    assert m3.id == m.id and m3.ranks == [1, 2, 3, 4, 6]


def test_members_of_an_open_many_rank_diagnosis_stay_in_it_whatever_their_cause_this_window() -> None:
    # Three of four ranks slow: a many-rank `compute` diagnosis; in a later window two of its ranks
    # read `host_stall` and one `compute`, each alone. They stay its members: it does not shrink
    # to the one rank whose cause matched (which named 1 of the 3 slow ranks).
    t = Tracker("job")
    many = Finding(
        cause="compute",
        rank=None,
        ranks=(0, 1, 3),
        group=None,
        phase="forward",
        kernel=None,
        score=1.6,
        slowdown_pct=20.0,
        subject="many",
        member_scores={0: 1.4, 1: 1.5, 3: 1.6},
        lost_ns=0.2 * W,
        wall_ns=float(W),
    )
    opened = [d for k in range(2) for d in t.update(k * W, [many], {0, 1, 2, 3})]
    assert opened and opened[-1].ranks == [0, 1, 3]
    later = [_f(0, 1.04, "host_stall"), _f(1, 0.84, "host_stall"), _f(3, 0.8), _f(2, 0.9, "host_stall")]
    ch = t.update(2 * W, later, {0, 1, 2, 3})
    m = next(d for d in ch if d.id == opened[-1].id)
    assert m.ranks == [0, 1, 3] and m.cause == "compute"  # 2 is no member: its finding stays its own


def test_restart_adopts_open_diagnoses_and_ids_are_stable() -> None:
    t = Tracker("job")
    d = t.update(0, [_f(4, 1.5)], {4})[0]
    assert d.id == diagnosis_id("job", "straggler", "rank:4", 0)
    t2 = Tracker("job")
    t2.load([d])
    again = t2.update(W, [_f(4, 1.2)], {4})
    assert [x.id for x in again] == [d.id] and again[0].first_window_ns == 0


def test_finish_resolves_everything() -> None:
    t = Tracker("job")
    t.update(0, [_f(0, 1.5), _f(1, 1.5, "dataloader")], {0, 1})
    done = t.finish()
    assert {d.state for d in done} == {"resolved"} and all(d.evidence["job_finished"] for d in done)
    assert t.open == []


def test_a_window_its_steps_fill_only_in_part_does_not_open_a_fault_alone() -> None:
    """A job that ran 2 s of steps in one 10 s window (the README's example run) is no 10 s of
    evidence, however slow one of its ranks looked; the same fault over a window its steps fill
    opens, and a job's short first window followed by a full one opens at the second."""
    short = _run(Tracker("job"), [[_f(2, 3.0, lost_ns=0.4e9, wall_ns=2e9)]])
    assert short == [[]]
    full = _run(Tracker("job"), [[_f(2, 3.0, lost_ns=2e9, wall_ns=10e9)]])
    assert [(d.rank, d.state) for d in full[0]] == [(2, "open")]
    late = _run(
        Tracker("job"), [[_f(2, 3.0, lost_ns=0.4e9, wall_ns=2e9)], [_f(2, 3.0, lost_ns=2e9, wall_ns=10e9)]]
    )
    assert late[0] == [] and [d.first_window_ns for d in late[1]] == [0]


def _job(ranks: tuple[int, ...], score: float, lost_ns: float) -> Finding:
    """The job-level finding: a loss no rank explains, naming the ranks behind their own past."""
    return Finding(
        cause="compute",
        rank=None,
        ranks=ranks,
        group=None,
        phase="forward",
        kernel=None,
        score=score,
        slowdown_pct=100 * lost_ns / W,
        subject="job",
        lost_ns=lost_ns,
        wall_ns=float(W),
        job_loss=True,
    )


def test_the_job_s_loss_opens_only_when_held_for_two_windows_even_for_one_rank() -> None:
    """One 10 s window of the job's loss, however strong, opens nothing; so with the one rank
    behind that explains it (``rank:R``); the second window opens it."""
    for f in (_job((), 3.0, 0.5 * W), replace(_job((3,), 3.0, 0.5 * W), rank=3, subject="rank:3")):
        t = Tracker("job")
        out = _run(t, [[f], [f]])
        assert out[0] == [] and [(d.rank, d.state) for d in out[1]] == [(f.rank, "open")], out


def test_the_job_s_loss_is_one_streak_whether_one_rank_explains_it_or_not() -> None:
    """Rank 3 alone behind in one window, ranks 2 and 3 in the next: two windows of the job's loss
    open it (as the latest window names it), counted from the first."""
    one = replace(_job((3,), 3.0, 0.5 * W), rank=3, subject="rank:3")
    for first, second in ((one, _job((2, 3), 3.0, 0.5 * W)), (_job((2, 3), 3.0, 0.5 * W), one)):
        out = _run(Tracker("job"), [[first], [second]])
        assert out[0] == [] and [(d.rank, d.state, d.first_window_ns) for d in out[1]] == [
            (second.rank, "open", 0)
        ]


def test_a_residual_of_the_stragglers_own_ranks_joins_its_diagnosis_another_opens_its_own() -> None:
    """Rank 3 is slow and slows rank 2 beside it (``knock_on_ranks``); the job loses 0.5 s a window
    more than it waited for rank 3, and the ranks behind their own past are ranks 2 and 3: one
    diagnosis, rank 3's, takes in that loss. A residual that names ranks the straggler did not
    touch is a fault of its own."""
    straggler = replace(_f(3, 3.0, lost_ns=1e9), evidence={"knock_on_ranks": [2]})
    t = Tracker("job")
    out = _run(t, [[straggler, _job((2, 3), 1.5, 0.5e9)] for _ in range(4)])
    ids = {d.id for ch in out for d in ch}
    assert len(ids) == 1 and [(d.rank, d.cause) for d in t.open] == [(3, "compute")]
    (d,) = t.open
    # Four windows of rank 3's own 1 s, and the residual of the windows from its streak's start.
    assert d.evidence["lost_s"] == 4 + 2.0 and d.evidence["knock_on_lost_s"] == 2.0
    assert t.state(d.id)["knock_on_ns"] == 2e9

    t = Tracker("job")
    _run(t, [[straggler, _job((0, 1, 2, 3), 1.5, 0.5e9)] for _ in range(4)])
    assert sorted((d.ranks, d.cause) for d in t.open) == [([0, 1, 2, 3], "compute"), ([3], "compute")]
    assert "knock_on_lost_s" not in next(d for d in t.open if d.rank == 3).evidence


def test_a_straggler_that_explains_an_open_job_level_diagnosis_takes_it_over() -> None:
    """The job's loss naming rank 2 opens first (two windows); in the third window rank 2's own
    host stall is ready to open. One fault, one diagnosis: the job-level one becomes rank 2's
    ``host_stall`` (same id and first window), and this window's job-level loss joins it."""
    job = _job((2,), 1.5, 0.5e9)
    stall = _f(2, 3.0, "host_stall", lost_ns=1e9)
    t = Tracker("job")
    out = _run(t, [[job], [job], [stall, job], [stall, job], [stall, job]])
    ids = {d.id for ch in out for d in ch}
    assert len(ids) == 1, out
    (d,) = t.open
    assert (d.rank, d.cause, d.first_window_ns) == (2, "host_stall", 0)
    assert d.evidence["knock_on_lost_s"] >= 1.0 + 0.5  # the two job-level windows and this one's

    # A job-level loss naming a rank the straggler does not explain stays its own.
    t = Tracker("job")
    _run(t, [[_job((1, 2), 1.5, 0.5e9)]] * 2 + [[stall, _job((1, 2), 1.5, 0.5e9)]] * 3)
    assert sorted((d.rank or -1, d.cause) for d in t.open) == [(-1, "compute"), (2, "host_stall")]


def test_the_job_s_loss_naming_an_open_straggler_s_rank_keeps_that_diagnosis() -> None:
    """A fault that comes and goes within windows (Lightning's rank 2 stopped 0.4 s every 2 s):
    rank 2's host stall opens; in the next windows rank 2 has no finding of its own and the job's
    residual loss names rank 2 behind its own past. One fault, one diagnosis: rank 2's host stall
    stays open and takes that loss in; no job-level ``compute`` opens beside it, and it does not
    resolve while its rank's loss goes on."""
    stall = _f(2, 3.0, "host_stall", lost_ns=1e9)
    job = _job((2,), 1.5, 0.5e9)
    t = Tracker("job")
    out = _run(t, [[stall], [stall], [job], [job], [job], [stall, job]])
    assert len({d.id for ch in out for d in ch}) == 1, out
    assert all(d.state == "open" for ch in out for d in ch)
    (d,) = t.open
    assert (d.rank, d.cause, d.first_window_ns) == (2, "host_stall", 0)
    assert d.evidence["knock_on_lost_s"] == 2.0  # three windows' 0.5 s, and the last one's
    assert d.evidence["lost_s"] == 3 * 1.0 + 2.0

    # A residual that names a rank the open straggler does not explain is its own fault.
    t = Tracker("job")
    _run(t, [[stall], [stall]] + [[_job((1, 2), 1.5, 0.5e9)]] * 3)
    assert [(d.rank, d.cause) for d in t.open] == [(None, "compute")]


def test_a_job_level_diagnosis_naming_no_rank_is_taken_over_once_its_loss_names_the_straggler() -> None:
    """The job's loss with no rank behind opens a job-level diagnosis (two windows); then its loss
    names rank 1 behind its own past and rank 1's straggler is ready: one fault, one diagnosis,
    rank 1's, with the job-level one's id and first window. Before 2026-12-07 a job-level
    diagnosis naming no rank was never taken over, and both stayed open over the same windows."""
    stall = _f(1, 3.0, lost_ns=1e9)
    t = Tracker("job")
    out = _run(t, [[_job((), 1.5, 0.5e9)]] * 2 + [[stall, _job((1,), 1.5, 0.5e9)]] * 3)
    assert len({d.id for ch in out for d in ch}) == 1, out
    (d,) = t.open
    assert (d.rank, d.first_window_ns) == (1, 0)

    # A job-level loss that still names no rank is no straggler's: it stays its own.
    t = Tracker("job")
    _run(t, [[_job((), 1.5, 0.5e9)]] * 2 + [[stall, _job((), 1.5, 0.5e9)]] * 3)
    assert sorted((d.rank if d.rank is not None else -1) for d in t.open) == [-1, 1]
