from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from argus.analyzer.causes import (
    SPIKY_TYPICAL,
    _Context,
    _drop_hidden,
    _starved,
    host_delay_bound,
    step_shares,
)
from argus.analyzer.findings import Finding
from argus.analyzer.phase import fell_behind


def _typical(excess: list[float]) -> float:
    return float(step_shares(np.array([excess], dtype=np.float64))[1][0])


def _spiky(excess: list[float]) -> float:
    return float(step_shares(np.array([excess], dtype=np.float64))[0][0])


@pytest.mark.parametrize("onset", [0, 10, 25, 33])
def test_a_steady_slowdown_that_begins_mid_window_is_not_spiky(onset: int) -> None:
    rng = np.random.default_rng(onset)
    excess = np.where(np.arange(37) >= onset, 40.0 + rng.normal(0, 8, 37), rng.normal(0, 1, 37))
    assert _typical(excess.tolist()) > SPIKY_TYPICAL


@pytest.mark.parametrize("seed", range(6))
def test_a_steady_slowdown_as_large_as_the_noise_is_not_spiky(seed: int) -> None:
    """10 ms more per step under per-step noise of 10 ms (a 2-core host): noise piles the excess
    into some steps (half of it or more in the worst third), but the typical step carries it."""
    excess = 10.0 + np.random.default_rng(seed).normal(0, 10, 60)
    assert _spiky(excess.tolist()) > 0.5
    assert _typical(excess.tolist()) > SPIKY_TYPICAL


@pytest.mark.parametrize("onset", [0, 13, 26])
def test_a_pause_every_few_steps_is_spiky_wherever_it_begins(onset: int) -> None:
    excess = [150.0 if i >= onset and i % 4 == 0 else 0.5 for i in range(37)]
    assert _typical(excess) < SPIKY_TYPICAL


def test_no_excess_has_no_share() -> None:
    assert np.isnan(_typical([0.0, -1.0, float("nan")]))
    assert np.isnan(_spiky([0.0, -1.0, float("nan")]))


def _straggler(rank: int, score: float) -> Finding:
    return Finding("compute", rank, (rank,), None, "forward", None, score, 10.0, f"rank:{rank}")


def _kept(
    excess: dict[int, list[float]], scores: dict[int, float], behind: dict[int, float] | None = None
) -> list[Finding]:
    """``_drop_hidden`` of stragglers ``scores`` over per-step ``excess``; ``behind``: the ranks'
    change against their own past (ms per step of a 100 ms step; none without history)."""
    ranks = sorted(excess)
    l2: Any = SimpleNamespace(
        rank=np.array(ranks),
        excess_filled=np.array([excess[r] for r in ranks]),
        behind_ns=np.array([(behind or {}).get(r, np.nan) for r in ranks]),
        past_step_ns=np.full(len(ranks), 100.0),
        behind_noise_ns=np.zeros(len(ranks)),
    )
    return _drop_hidden([_straggler(r, s) for r, s in scores.items()], l2)


def test_ranks_that_slowed_a_little_while_waiting_for_a_straggler_are_its_knock_on() -> None:
    rng = np.random.default_rng(1)
    excess = {r: (8.0 + rng.normal(0, 3, 40)).tolist() for r in (0, 1)}
    excess[2] = np.abs(rng.normal(0, 1, 40)).tolist()
    excess[3] = (30.0 + rng.normal(0, 3, 40)).tolist()
    kept = _kept(excess, {0: 1.2, 1: 1.1, 3: 5.0})
    assert [f.rank for f in kept] == [3]
    assert kept[0].evidence["knock_on_ranks"] == [0, 1]
    # Without rank 3 its knock-on goes too: the job would have waited only for rank 2's noise.
    np.testing.assert_allclose(kept[0].waited_ns, np.maximum(np.array(excess[3]) - excess[2], 0))


def test_ranks_behind_their_past_without_a_finding_of_their_own_are_listed_as_knock_on() -> None:
    """A neighbour slowed by the straggler's work on a shared host, too little for a finding of
    its own, is still behind its own past: the job-level finding would name it beside the
    straggler, so the straggler's evidence lists it (and its loss joins the straggler's)."""
    rng = np.random.default_rng(3)
    excess = {0: np.abs(rng.normal(0, 1, 40)).tolist(), 2: (12.0 + rng.normal(0, 3, 40)).tolist()}
    excess[3] = (50.0 + rng.normal(0, 3, 40)).tolist()
    kept = _kept(excess, {3: 5.0}, behind={0: 1.0, 2: 12.0, 3: 50.0})
    assert [f.rank for f in kept] == [3]
    assert kept[0].evidence["knock_on_ranks"] == [2]  # rank 0 did not fall behind: not listed
    # A rank behind as far as the straggler is no knock-on of it.
    far = {**excess, 2: (50.0 + rng.normal(0, 3, 40)).tolist()}
    assert "knock_on_ranks" not in _kept(far, {3: 5.0}, behind={2: 50.0, 3: 50.0})[0].evidence


def test_a_rank_slowed_every_step_behind_one_that_stops_every_fourth_is_its_knock_on() -> None:
    excess = {0: [10.0] * 40, 1: [0.0] * 40, 3: [150.0 if i % 4 == 0 else 0.0 for i in range(40)]}
    assert [f.rank for f in _kept(excess, {0: 1.5, 3: 8.0})] == [3]


def test_a_rank_that_outscores_the_straggler_it_hid_behind_is_its_knock_on() -> None:
    """Rank 0, its own past quiet, scores above the slow ranks on half their excess and never leads
    them: it hid behind rank 3, which fell behind the others, so it is rank 3's knock-on. Had no
    rank fallen behind (the host slowed them all), only the top scorer is a rank hidden behind."""
    rng = np.random.default_rng(4)
    excess = {0: (10.0 + rng.normal(0, 2, 40)).tolist(), 1: [0.0] * 40}
    excess[2] = (20.0 + rng.normal(0, 3, 40)).tolist()
    excess[3] = (24.0 + rng.normal(0, 3, 40)).tolist()
    scores = {0: 1.6, 2: 1.0, 3: 1.4}
    kept = _kept(excess, scores, behind={0: 2.0, 2: 20.0, 3: 24.0})
    assert [f.rank for f in kept] == [2, 3]
    assert kept[1].evidence["knock_on_ranks"] == [0]
    # Rank 3's waits leave out rank 0's too: without rank 3 the job waited for rank 2 alone.
    np.testing.assert_allclose(kept[1].waited_ns, np.maximum(np.array(excess[3]) - excess[2], 0))
    assert [f.rank for f in _kept(excess, scores, behind={0: 2.0, 2: 2.0, 3: 2.0})] == [0, 2, 3]


def test_ranks_slow_alike_and_a_second_fault_over_half_as_large_are_all_named() -> None:
    rng = np.random.default_rng(2)
    alike = {r: (30.0 + rng.normal(0, 5, 40)).tolist() for r in (1, 2, 3)}
    assert [f.rank for f in _kept({0: [0.0] * 40, **alike}, {1: 3.0, 2: 3.5, 3: 4.0})] == [1, 2, 3]
    second = {0: [0.0] * 40, 2: [20.0] * 40, 3: [30.0] * 40}
    assert [f.rank for f in _kept(second, {2: 2.0, 3: 3.0})] == [2, 3]


def _role_counts(excess: dict[int, list[float]], scores: dict[int, float], i: int) -> tuple[int, int, int]:
    """``_Context.role_counts`` of row ``i`` in one role of ranks ``excess``; healthy: under 0.5."""
    ranks = sorted(excess)
    score = np.array([scores[r] for r in ranks])
    l2: Any = SimpleNamespace(
        rank=np.array(ranks),
        excess_filled=np.array([excess[r] for r in ranks]),
        score=score,
        healthy=score < 0.5,
    )
    return _Context.role_counts(SimpleNamespace(l2=l2, role=np.zeros(len(ranks), np.int64)), i)


def test_a_rank_that_slowed_while_waiting_for_the_straggler_leaves_its_reference_in_no_doubt() -> None:
    """Rank 3, at the keep score on a third of rank 1's excess and never ahead of it, is rank 1's
    knock-on: 1 of 4 ranks looks slow, not 2 (which would make rank 1's finding ``ambiguous``:
    two windows at the strong score, recorded live in ``tests/test_diagnosis_under_bad_input.py``).
    Two ranks slow alike both look slow, whichever is asked about."""
    rng = np.random.default_rng(5)
    excess = {r: np.abs(rng.normal(0, 2, 40)).tolist() for r in (0, 2)}
    excess[1] = (30.0 + rng.normal(0, 6, 40)).tolist()
    excess[3] = (8.0 + rng.normal(0, 3, 40)).tolist()
    scores = {0: 0.3, 1: 1.9, 2: 0.1, 3: 0.56}
    assert _role_counts(excess, scores, 1) == (4, 1, 2)
    alike = {**excess, 3: (30.0 + rng.normal(0, 6, 40)).tolist()}
    assert _role_counts(alike, {**scores, 3: 1.5}, 1) == (4, 2, 2)
    assert _role_counts(alike, {**scores, 3: 1.5}, 3) == (4, 2, 2)


def test_step_shares_spread_of_each_ranks_excess_from_its_onset() -> None:
    nan = np.nan
    excess = np.array(
        [
            [3.0, 3.0, 3.0, 3.0, 3.0, 3.0],  # steady: median = mean, worst third holds a third
            [0.0, 0.0, 0.0, 0.0, 0.0, 9.0],  # one spike, at the end: its own onset, all of it
            [-1.0, 1.0, 0.0, 6.0, 6.0, 6.0],  # a steady slowdown from step 3 (the onset)
            [nan, 4.0, nan, 0.0, 8.0, nan],  # missing steps skipped; onset at the 4.0
            [-2.0, -1.0, nan, -3.0, nan, nan],  # faster than its reference: unknown
            [nan, nan, nan, nan, nan, nan],  # no steps: unknown
        ]
    )
    spiky, typical = step_shares(excess)
    assert spiky[:4] == pytest.approx([1 / 3, 1.0, 1 / 3, 8 / 12])
    assert typical[:4] == pytest.approx([1.0, 1.0, 1.0, 4 / 4])
    assert np.isnan(spiky[4:]).all() and np.isnan(typical[4:]).all()
    spiky, typical = step_shares(np.zeros((2, 0)))
    assert np.isnan(spiky).all() and np.isnan(typical).all()


def test_a_rank_behind_by_less_than_its_noise_is_not_behind() -> None:
    """The floor (4 % of a 55 ms step, 2.2 ms) is not enough: a rank 3.8 ms behind whose window
    means move by 8 ms with nothing wrong is not named behind; one 12 ms behind is."""
    l2: Any = SimpleNamespace(
        behind_ns=np.array([3.8, 12.0, 3.0, np.nan]) * 1e6,
        past_step_ns=np.full(4, 55.0e6),
        behind_noise_ns=np.array([8.0, 8.0, 0.5, 1.0]) * 1e6,
    )
    assert fell_behind(l2).tolist() == [False, True, True, False]


def _host_context(cpu: list[float], wait: list[float]) -> Any:
    """What :func:`_starved` reads of a window's context: rank 0 flagged, ranks 1.. its peers."""
    host = SimpleNamespace(rank=np.arange(len(cpu)), cpu_frac=np.array(cpu), wait_frac=np.array(wait))
    peers = np.arange(1, len(cpu))
    ratio = host.wait_frac[peers] / host.cpu_frac[peers]
    starved = host.wait_frac[peers] - host.cpu_frac[peers] * np.median(ratio)
    peer_cpu = float(np.median(host.cpu_frac[peers]))
    return SimpleNamespace(
        host=host,
        gpu=set(),
        work_cpu=lambda rank: peer_cpu,
        peer_wait=float(np.median(host.wait_frac[peers])),
        wait_per_cpu=float(np.median(ratio)),
        starved_noise=1.4826 * float(np.median(np.abs(starved - np.median(starved)))),
    )


def test_a_rank_that_waited_for_a_cpu_its_peers_got_is_starved() -> None:
    """Peers run 40 % of the wall time and wait 20 %; rank 0 runs as much but waits 45 %: the 25 %
    more it waited carries its 25 % extra self time."""
    ctx = _host_context([0.40, 0.41, 0.39, 0.40], [0.45, 0.20, 0.21, 0.19])
    ev: dict[str, Any] = {}
    assert _starved(ctx, 0, 0, 0.25, ev)
    assert ev["cpu_starved"] and ev["cpu_wait_pct"] == 45.0 and ev["peer_cpu_wait_pct"] == 20.0
    assert 0.9 < ev["starved_share"] < 1.1


def test_a_rank_with_more_cpu_work_on_a_busy_host_waits_more_but_is_not_starved() -> None:
    """Twice the CPU work: on a host where every thread waits half a second per CPU second, it waits
    twice as long too, which its own work explains (``compute``, not the host)."""
    ctx = _host_context([0.80, 0.41, 0.39, 0.40], [0.40, 0.20, 0.21, 0.19])
    ev: dict[str, Any] = {}
    assert not _starved(ctx, 0, 0, 0.5, ev)
    assert "cpu_starved" not in ev and ev["starved_share"] < 0.1


def test_a_rank_whose_extra_work_waited_at_the_rate_it_got_is_not_starved() -> None:
    """The onset recording's fsdp rank 1 (window 937, load 10-30 on 2 cores): it runs 12 % of the
    wall time and waits 120 %, 10 s per CPU second; its peers, asleep in the collectives between
    short bursts of work, wait 7-9 s per CPU second. Its 4 % of extra CPU work at its own rate
    (1.2 / 0.12 = 10 s besides each CPU second) costs 44 % of the wall time: all of its 43 % extra
    self time. At its peers' rate its whole CPU time left 29 % unexplained (starved before)."""
    ctx = _host_context([0.12, 0.07, 0.08, 0.08], [1.20, 0.53, 0.56, 0.73])
    ev: dict[str, Any] = {}
    assert not _starved(ctx, 0, 0, 0.43, ev)
    assert "cpu_starved" not in ev and ev["starved_share"] < 0


def test_without_run_queue_delays_nothing_is_starved_and_nothing_is_claimed() -> None:
    ctx = _host_context([0.40, 0.41, 0.39, 0.40], [np.nan] * 4)
    ev: dict[str, Any] = {}
    assert not _starved(ctx, 0, 0, 0.25, ev)
    assert ev == {}


def _bound(delay_ms: list[float], host: list[int], members: list[int], gpu: tuple[int, ...] = ()) -> float:
    """``host_delay_bound`` of per-rank delays (ms per step) of ranks 0..n-1 on ``host`` (-1: unknown);
    ``gpu``: the GPU ranks."""
    ranks = np.arange(len(delay_ms))
    status = SimpleNamespace(rank=ranks, host=np.array(host, np.int64), has_gpu=np.isin(ranks, gpu))
    w: Any = SimpleNamespace(status=status)
    l2: Any = SimpleNamespace(rank=ranks)
    return host_delay_bound(w, l2, np.array(members), np.array(delay_ms) * 1e6) / 1e6


def test_a_rings_host_delay_bound_sums_its_ranks_on_one_host_never_across_hosts() -> None:
    """A ring's transfer waits for each of its ranks on a CPU in turn: the delays of a host's ranks
    add up; two hosts' do not (summed over a job, every rank's noise would excuse any link)."""
    # Four ranks on one host, 30 ms each beyond their work: the ring can owe the host 120 ms.
    assert _bound([30, 30, 30, 30], [0, 0, 0, 0], [0, 1, 2, 3]) == pytest.approx(120)
    # Two hosts of two: the larger host's sum, signed (a rank ahead of its healthy delay offsets
    # its host's others, as noise about it does); never below 0.
    assert _bound([30, 10, 25, -40], [0, 0, 1, 1], [0, 1, 2, 3]) == pytest.approx(40)
    assert _bound([3, -5, 2, -4], [0, 0, 1, 1], [0, 1, 2, 3]) == 0
    # Ranks of unknown host count alone; ranks outside the group not at all.
    assert _bound([30, 20, 50, 5], [-1, -1, 0, 0], [0, 1, 3]) == pytest.approx(30)
    assert np.isnan(_bound([np.nan, np.nan], [0, 0], [0, 1]))
    # GPU ranks' transfers run on their devices: their hosts' run queues bound nothing.
    assert _bound([30, 30, 30, 30], [0, 0, 0, 0], [0, 1, 2, 3], gpu=(0, 1)) == pytest.approx(60)
