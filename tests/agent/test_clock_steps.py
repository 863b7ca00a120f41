"""Steps of a node's wall clock: noticed, given their own epoch's offset, durations across them fixed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from argus.agent.clock import (
    STEP_NS,
    ClockEstimate,
    ClockStep,
    CollectorClock,
    OffsetMap,
    StepDetector,
    shift_times,
)
from argus.schema import wire_schema


class _Clocks:
    """A wall and a monotonic clock a test moves by hand (ns)."""

    def __init__(self) -> None:
        self.mono = 1_000_000_000_000
        self.wall_minus_mono = 1_700_000_000_000_000_000 - self.mono
        self.preempt_ns = 0  # added to the monotonic clock on the read after a wall read

    def read_mono(self) -> int:
        m = self.mono
        self.mono += self.preempt_ns
        self.preempt_ns = 0
        return m

    def read_wall(self) -> int:
        return self.mono + self.wall_minus_mono


def test_a_step_is_noticed_with_a_boundary_between_the_epochs_and_slewing_is_not() -> None:
    c = _Clocks()
    d = StepDetector(wall=c.read_wall, mono=c.read_mono)
    c.mono += 100_000_000
    c.wall_minus_mono += 50_000  # NTP slewing: 0.5 ms/s, far below a step
    assert d.check() is None
    before = c.read_wall()
    c.mono += 100_000_000
    c.wall_minus_mono += 2_000_000_000
    step = d.check()
    assert step is not None and step.step_ns == 2_000_000_000
    after = c.read_wall()
    assert before < step.boundary_ns <= after - 2_000_000_000 + 100_000_000 + 2_000_000_000
    assert d.check() is None


def test_a_read_preempted_between_the_clocks_is_not_a_step() -> None:
    c = _Clocks()
    d = StepDetector(wall=c.read_wall, mono=c.read_mono)
    c.mono += 100_000_000
    c.preempt_ns = 300_000_000  # descheduled 300 ms between the wall read and the second mono read
    assert d.check() is None


def test_rows_from_both_sides_of_a_step_get_their_epochs_offset_and_spanning_durations_lose_it() -> None:
    clock = OffsetMap(-100)
    clock.step(ClockStep(step_ns=2_000, boundary_ns=10_500))
    assert clock.current == -2_100
    stamps = np.array([10_000, 10_400, 12_600, 13_000], np.int64)
    assert clock.at(stamps).tolist() == [-100, -100, -2_100, -2_100]
    steps = pa.table(
        {
            "rank": pa.array([0, 0, 0], pa.uint32()),
            "step": pa.array([1, 2, 3], pa.uint64()),
            "start_ns": pa.array([9_000, 10_300, 12_700], pa.int64()),
            "dur_ns": pa.array([1_000, 2_500, 300], pa.int64()),  # the second spans the step
        },
        schema=wire_schema("steps"),
    )
    got = shift_times("steps", steps, clock).to_pydict()
    assert got["start_ns"] == [8_900, 10_200, 10_600]
    assert got["dur_ns"] == [1_000, 500, 300]
    assert shift_times("steps", steps, 5).to_pydict()["start_ns"] == [9_005, 10_305, 12_705]


def test_the_threshold_is_above_what_ntp_slewing_can_do_between_two_checks() -> None:
    slew_ppm, check_s = 500, 1.0
    assert slew_ppm * 1e-6 * check_s * 1e9 < STEP_NS


def test_the_agents_clock_takes_an_estimate_once_and_a_new_one_only_past_a_millisecond() -> None:
    """CollectorClock's thread: the first estimate is taken, one within 1 ms of it is not, a larger
    change is; each change calls on_change once; an estimate that fails keeps the offset."""
    answers = [5_000_000, 5_400_000, 9_000_000]
    changes: list[int] = []

    def estimate() -> ClockEstimate:
        if not answers:
            raise OSError("collector gone")
        return ClockEstimate(answers.pop(0), 1_000, 0)

    clock = CollectorClock(estimate, lambda: changes.append(clock.current_ns))
    stop = threading.Event()
    thread = threading.Thread(target=clock.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(3):  # one estimate now, the next CLOCK_EVERY_S later: ask again at once
            deadline = time.monotonic() + 10
            expected = len(answers) - 1
            while len(answers) > expected and time.monotonic() < deadline:
                time.sleep(0.02)
            clock._estimate_due = True
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(5)
    assert changes == [5_000_000, 9_000_000]
    assert clock.current_ns == 9_000_000
