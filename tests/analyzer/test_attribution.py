"""Who caused the wait: blocking at every synchronisation point, roles, many slow ranks (synthetic)."""

from __future__ import annotations

import numpy as np
import pytest

from argus.analyzer.collectives import decompose
from argus.analyzer.pipeline import JobAnalysis
from argus.analyzer.roles import infer_roles
from argus.analyzer.waits import blocking_rows, step_times
from argus.analyzer.window import Collectives, Phases, Steps, Window
from synthetic.jobs import Fault, JobSpec, simulate
from synthetic.layout3d import Layout3D, windows

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _window(
    steps: list[tuple[int, int, float, float]],
    phases: list[tuple[int, int, int, float, float]],
    colls: list[tuple[int, int, str, int, str, float, float, int, bool]],
    waits: list[float] | None = None,
) -> Window:
    """A window from rows in ms: steps (rank, step, start, dur), phases (rank, step, phase, start, dur),
    collectives (rank, step, group, seq, op, issue, end, peer, overlapped) and their wait (0: none)."""
    groups = tuple(sorted({c[2] for c in colls}))
    ops = tuple(sorted({c[4] for c in colls}))
    i64 = lambda v: np.asarray(v, np.int64)  # noqa: E731
    ms = lambda v: i64([round(T0 + x * MS) for x in v])  # noqa: E731
    st = Steps(i64([s[0] for s in steps]), i64([s[1] for s in steps]), ms([s[2] for s in steps]),
               i64([round(s[3] * MS) for s in steps]))  # fmt: skip
    ph = Phases(i64([p[0] for p in phases]), i64([p[1] for p in phases]), i64([p[2] for p in phases]),
                ms([p[3] for p in phases]), i64([round(p[4] * MS) for p in phases]))  # fmt: skip
    issue = ms([c[5] for c in colls])
    end = ms([c[6] for c in colls])
    co = Collectives(
        rank=i64([c[0] for c in colls]),
        step=i64([c[1] for c in colls]),
        group=i64([groups.index(c[2]) for c in colls]),
        seq=i64([c[3] for c in colls]),
        op=i64([ops.index(c[4]) for c in colls]),
        bytes=i64([1 << 20] * len(colls)),
        issue_ns=issue,
        start_ns=issue,
        dur_ns=end - issue,
        in_window=np.ones(len(colls), bool),
        group_names=groups,
        op_names=ops,
        peer=i64([c[7] for c in colls]),
        overlapped=np.array([c[8] for c in colls], bool),
        wait_ns=ms(waits) * (np.asarray(waits) > 0) if waits else None,
    )
    return Window("t", T0 - 10**9, T0 + 10**10, st, ph, co)


def test_a_barrier_absorbs_lateness_and_only_the_late_rank_keeps_the_extra_self_time() -> None:
    """Rank 3 works 50 ms before a barrier: its peers wait there, and the all-reduce at the end of
    the step sees everyone on time. The waits go to the peers' blocked time, the 50 ms to rank 3."""
    steps, phases, colls = [], [], []
    for r in range(4):
        late = 50.0 if r == 3 else 0.0
        steps.append((r, 10, 0.0, 200.0))
        colls.append((r, 10, "0", 0, "barrier", 10.0 + late, 61.0, -1, False))  # all released at 61
        phases.append((r, 10, 1, 61.0, 60.0))  # forward
        phases.append((r, 10, 2, 121.0, 70.0))  # backward, ending with the gradient all-reduce
        colls.append((r, 10, "0", 1, "allreduce", 185.0, 190.0, -1, True))
    t = step_times(_window(steps, phases, colls), np.array([10]))
    np.testing.assert_allclose(t.blocked_ns[:, 0] / MS, [51 + 5, 51 + 5, 51 + 5, 1 + 5], atol=0.01)
    np.testing.assert_allclose(t.self_ns[:, 0] / MS - t.self_ns[0, 0] / MS, [0, 0, 0, 50], atol=0.01)


def test_overlapped_buckets_block_only_where_backward_waits_and_a_busy_call_blocks_nobody() -> None:
    colls = [
        # Rank 0's first bucket completes while it still computes (its second bucket is issued
        # inside it): not blocked. Its last bucket ends right before backward ends: blocked.
        (0, 10, "0", 0, "allreduce", 100.0, 150.0, -1, True),
        (0, 10, "0", 1, "allreduce", 120.0, 160.0, -1, True),
        # An isend whose rank issued another call before it completed: asynchronous, and so is
        # its matching recv on rank 1 (one participant busy during the call blocks nobody).
        (0, 10, "p", 0, "send", 170.0, 200.0, 1, False),
        (0, 10, "0", 2, "barrier", 180.0, 181.0, -1, False),
        (1, 10, "p", 0, "recv", 172.0, 200.0, 0, False),
        (1, 10, "0", 2, "barrier", 180.5, 181.0, -1, False),
    ]
    phases = [(0, 10, 2, 50.0, 110.5), (1, 10, 2, 50.0, 110.5)]  # backward ends at 160.5
    steps = [(0, 10, 0.0, 220.0), (1, 10, 0.0, 220.0)]
    w = _window(steps, phases, colls)
    blocked = blocking_rows(w, np.array([0, 1]), decompose(w.collectives).instance)
    assert blocked.tolist() == [False, True, False, True, False, True]


def test_the_last_bucket_blocks_until_backward_ends_however_late_the_rank_resumes() -> None:
    """On a busy host a rank woken at its last bucket's end may wait for a core: backward ended
    20 ms after the bucket on rank 0, still its wait (DDP's backward waits for every bucket). On
    rank 1 the bucket ended 20 ms before its next call, inside the optimizer: it worked on."""
    colls = [
        (0, 10, "0", 0, "allreduce", 100.0, 150.0, -1, True),
        (1, 10, "0", 0, "allreduce", 100.0, 150.0, -1, True),
        (1, 10, "1", 0, "barrier", 170.0, 171.0, -1, False),
    ]
    phases = [(0, 10, 2, 50.0, 120.0), (1, 10, 2, 50.0, 50.0), (1, 10, 3, 100.0, 80.0)]
    steps = [(0, 10, 0.0, 200.0), (1, 10, 0.0, 200.0)]
    w = _window(steps, phases, colls)
    blocked = blocking_rows(w, np.array([0, 1]), decompose(w.collectives).instance)
    assert blocked.tolist() == [True, False, True]


def test_a_transfer_waited_later_blocks_from_its_wait() -> None:
    """Stage 1 posts irecv at 10 ms, computes, and waits at 80 ms for the activation that lands at
    130 ms: 50 ms blocked (not 120). The sender's isend, waited at once, blocked until it landed."""
    colls = [
        (1, 10, "p", 0, "recv", 10.0, 130.0, 0, False),
        (1, 10, "0", 0, "barrier", 30.0, 31.0, -1, False),  # something else while the recv is posted
        (0, 10, "p", 0, "send", 120.0, 130.0, 1, False),
    ]
    phases = [(1, 10, 1, 131.0, 20.0), (0, 10, 1, 0.0, 119.0)]
    steps = [(1, 10, 0.0, 160.0), (0, 10, 0.0, 160.0)]
    w = _window(steps, phases, colls, waits=[80.0, 0.0, 0.0])
    t = step_times(w, np.array([10]), decompose(w.collectives).instance)
    np.testing.assert_allclose(t.blocked_ns[:, 0] / MS, [10.0, 1.0 + 50.0], atol=0.01)


def test_roles_are_pipeline_stages_in_a_3d_job() -> None:
    lay = Layout3D(stages=3, tp=2, dp=2, step_ms=120.0, stage_work=(1.0, 1.4, 0.8), seed=1)
    (w,) = windows(lay, 1, window_s=3.0)
    roles = infer_roles(w.status.rank, w.collectives, decompose(w.collectives), {})
    stage_of = {int(r): int(s) for r, s in zip(roles.rank, roles.stage, strict=True)}
    assert stage_of == {(d * 3 + s) * 2 + p: s for d in range(2) for s in range(3) for p in range(2)}
    assert roles.n_roles == 3 and sorted(roles.labels) == ["stage 0", "stage 1", "stage 2"]


def _opened(lay: Layout3D, n: int = 4) -> list[tuple[int | None, list[int], str]]:
    ws = windows(lay, n, window_s=3.0)
    ja = JobAnalysis("l", ws[0].end_ns - ws[0].start_ns)
    return [(d.rank, d.ranks, d.cause) for w in ws for d in ja.analyze(w).changed if d.state == "open"]


def test_a_healthy_pipeline_job_with_unequal_stages_opens_nothing() -> None:
    lay = Layout3D(stages=3, tp=2, dp=4, step_ms=120.0, stage_work=(1.0, 1.6, 0.7), seed=2)
    assert _opened(lay) == []


def test_a_slow_rank_of_a_pipeline_job_is_named_and_its_neighbours_are_not() -> None:
    # Rank 9: replica 1, stage 1, tensor position 1 (its TP partner is 8, its stages' partners 7 and 11).
    lay = Layout3D(stages=3, tp=2, dp=4, step_ms=120.0, stage_work=(1.0, 1.6, 0.7), slow=(9,), seed=3)
    opened = _opened(lay)
    assert opened and {rank for rank, _, _ in opened} == {9}
    assert {cause for _, _, cause in opened} == {"compute"}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("slow", [(3,), ()])
def test_a_slow_rank_with_one_role_peer_and_one_window_of_past_is_named(
    seed: int, slow: tuple[int, ...]
) -> None:
    # Two stages of two replicas: each role holds two ranks (no peer majority), and rank 3 slows
    # in the job's second window, when its own past is one window long: its partner in the role
    # (rank 2, which waits for it in their all-reduce) names it, step by step.
    lay = Layout3D(stages=2, tp=1, dp=2, step_ms=120.0, stage_work=(1.0, 1.6), slow=slow, slowdown=0.4,
                   onset_s=12.0, seed=seed)  # fmt: skip
    ws = windows(lay, 6, window_s=6.0)[1:]  # the first window the analyzer sees is whole
    ja = JobAnalysis("l", ws[0].end_ns - ws[0].start_ns)
    opened = [
        (d.rank, d.ranks, d.cause, d.phase) for w in ws for d in ja.analyze(w).changed if d.state == "open"
    ]
    if not slow:
        assert opened == []
        return
    assert opened and all(o[:3] == (3, [3], "compute") and o[3] in ("forward", "backward") for o in opened), (
        opened
    )
    evidence = ja.tracker.open[0].evidence
    assert evidence["compared_with"] == "peers" and evidence["role"] == "stage 1", evidence


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("slow", [(1,), ()])
def test_a_slow_stage_of_a_pipeline_without_replicas_is_named_against_its_own_past(
    seed: int, slow: tuple[int, ...]
) -> None:
    # Two stages of one rank each: every role holds one rank, so only its own past can name it.
    lay = Layout3D(stages=2, tp=1, dp=1, step_ms=120.0, stage_work=(1.0, 1.6), slow=slow, slowdown=0.4,
                   onset_s=12.0, seed=seed)  # fmt: skip
    ws = windows(lay, 6, window_s=6.0)[1:]
    ja = JobAnalysis("l", ws[0].end_ns - ws[0].start_ns)
    opened = [(d.rank, d.ranks, d.cause) for w in ws for d in ja.analyze(w).changed if d.state == "open"]
    if not slow:
        assert opened == []
        return
    assert opened and all(o == (1, [1], "compute") for o in opened), opened
    # Named by the job's loss that its change explains (one healthy window of its own past).
    assert ja.tracker.open[0].evidence["basis"] == "own past"


@pytest.mark.parametrize("seed", [0, 1])
def test_three_of_four_ranks_slow_open_one_diagnosis_that_never_names_the_fast_rank(seed: int) -> None:
    spec = JobSpec(
        world=4,
        windows=7,
        window_s=6.0,
        step_s=0.05,
        seed=seed,
        faults=(Fault("compute", (0, 1, 3), 0.3, 24.0),),
    )
    ja = JobAnalysis("t", spec.window_ns)
    changed = [d for w in simulate(spec).windows for d in ja.analyze(w).changed]
    named = {r for d in changed for r in d.ranks}
    assert len({d.id for d in changed}) == 1 and named == {0, 1, 3}, [(d.rank, d.ranks) for d in changed]
