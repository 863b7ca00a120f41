"""The run-queue delay a rank's own work explains (host.starved_wait), and the best-ranks reference
that discounts the rest (phase._starved_per_step), and each rank's delay against its own healthy windows
(loss.JobProfile.rank_host_delay_ns)."""

from __future__ import annotations

import numpy as np
import pytest

from argus.analyzer.host import starved_wait
from argus.analyzer.loss import JobProfile
from argus.analyzer.phase import _starved_per_step

MS = 1e6


def test_the_same_work_waiting_longer_is_the_hosts_doing_in_full() -> None:
    # As much CPU as the ranks that do its work, 0.25 of the wall time more wait than that CPU
    # time gets at their rate: all of it starvation.
    assert float(starved_wait(0.45, 0.40, 0.40, 0.5)) == pytest.approx(0.25)
    assert float(starved_wait(0.20, 0.40, 0.40, 0.5)) == pytest.approx(0.0)


def test_extra_work_waits_at_the_rank_s_own_rate_and_only_the_rest_is_the_host_s() -> None:
    # The onset recording's fsdp rank 1 (analyzer/causes.py's case): 12 % CPU, 120 % wait (10 s per
    # CPU second); the ranks that do its work 8 % at 7.6. Its 4 % extra CPU waits 40 % at its own
    # rate; 8 % at 7.6 explains 61 %: 19 % is left, not the 29 % its whole CPU at 7.6 leaves.
    got = float(starved_wait(1.20, 0.12, 0.08, 7.6))
    assert got == pytest.approx(1.20 - 0.08 * 7.6 - 0.04 * 10.0)
    assert got < 1.20 - 0.12 * 7.6
    # Arrays broadcast; a rank with no CPU time waited for nothing of its own.
    np.testing.assert_allclose(starved_wait(np.array([0.3, 0.1]), np.array([0.0, 0.1]), 0.1, 1.0), [0.3, 0.0])


def test_the_best_ranks_reference_keeps_a_slow_ranks_own_extra_work_waiting_at_its_rate() -> None:
    """Three of four ranks slow from the first step, one of them (rank 3) doing twice the extra work
    of the others: per step it runs 60 ms of CPU and waits 180 ms, 3 ms per CPU ms, as its extra
    work keeps it runnable in long stretches; the role's median rank runs 31 ms and waits 2.175 ms
    per CPU ms. Only its 31 ms of the median rank's work waiting at 3 rather than 2.175 is the
    host's scheduling delay (25.6 ms); at the median rate its whole CPU time left 49.5 ms,
    the wait of its own 29 ms of extra work (24 ms) subtracted from its self time as the host's.
    A rank held off the CPU for the same work as the median rank's is discounted in full."""
    rq = np.array([40.0, 62.0, 62.0, 180.0, 100.0]) * MS
    cpu = np.array([17.0, 31.0, 31.0, 60.0, 31.0]) * MS
    members = np.array([True, True, True, True, False])
    got = _starved_per_step(rq, cpu, members) / MS
    rate = float(np.median([40 / 17, 2.0, 2.0, 3.0]))
    assert got[3] == pytest.approx(31 * (3.0 - rate))
    assert got[4] == 0.0  # not of the role
    np.testing.assert_allclose(got[:3], [40 - 17 * rate, 0.0, 0.0])
    offset = _starved_per_step(rq, cpu, np.array([True, True, True, False, True])) / MS
    assert offset[4] == pytest.approx(100 - 31 * float(np.median([40 / 17, 2.0, 2.0, 100 / 31])))


def _profile(rank: list[int], rq_ms: list[float], cpu_ms: list[float]) -> JobProfile:
    """A profile of per-rank run-queue delay and CPU time per step (ms); the job's means beside."""
    rq, cpu = np.array(rq_ms) * 1e6, np.array(cpu_ms) * 1e6
    return JobProfile(np.zeros(5), 0.0, 0.0, float(rq.mean()), float(cpu.mean()), np.array(rank), rq, cpu)


def test_each_ranks_host_delay_is_judged_against_its_own_healthy_windows() -> None:
    """Ranks that differ by their work wait at different rates on a healthy host (a rank doing
    twice the work, runnable for long stretches, waits more per CPU second): unchanged, neither is
    delayed. Against the job's mean one would read +7.5 ms and the other -10 ms, and a sum of the
    positive parts would invent delay."""
    healthy = _profile([0, 1], [80, 25], [100, 50])
    assert _profile([0, 1], [80, 25], [100, 50]).rank_host_delay_ns(healthy) == pytest.approx([0, 0])
    # Rank 1 now waits 20 ms more for the same work: that is its host's doing; a rank the healthy
    # windows never saw has no reference.
    now = _profile([0, 1, 2], [80, 45, 30], [100, 50, 50])
    delay = now.rank_host_delay_ns(healthy) / 1e6
    assert delay[:2] == pytest.approx([0, 20]) and np.isnan(delay[2])
    assert np.isnan(now.rank_host_delay_ns(None)).all()
