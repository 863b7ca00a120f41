"""The probe's run-queue delay (:class:`argus.agent.host.RunDelay`) against the real scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from argus.agent.host import HostSampler, RunDelay

pytestmark = pytest.mark.skipif(not RunDelay().available, reason="no /proc/self/task/*/schedstat here")

#: A process that spins on CPU 0 for 5 s.
_SPIN = "\n".join(
    [
        "import os, time",
        "os.sched_setaffinity(0, {0})",
        "t = time.monotonic()",
        "while time.monotonic() - t < 5: pass",
    ]
)


def _spin(seconds: float) -> None:
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        pass


def test_a_thread_sharing_its_cpu_with_two_busy_processes_waits_about_two_thirds_of_the_time() -> None:
    """Three runnable tasks on one CPU: each runs about a third of the time and waits the rest."""
    before = os.sched_getaffinity(0)
    rivals = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {0})
        time.sleep(0.3)  # the rivals are spinning on CPU 0
        delay = RunDelay()
        t0 = time.monotonic_ns()
        _spin(1.0)
        waited, wall = delay.take(), time.monotonic_ns() - t0
    finally:
        os.sched_setaffinity(0, before)
        for p in rivals:
            p.kill()
            p.wait()
    assert 0.4 * wall < waited < wall, (waited, wall)


def test_a_thread_alone_on_an_idle_cpu_hardly_waits() -> None:
    delay = RunDelay()
    time.sleep(0.5)
    assert 0 <= delay.take() < 100_000_000


def test_the_host_sample_carries_the_run_delay_last() -> None:
    sample = HostSampler().sample()
    assert len(sample) == 13 and sample[-1] >= 0
