"""The stack samplers (argus.agent.stacks) on real processes: py-spy on a child, in-process on us."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from argus.agent import stacks

CHILD = textwrap.dedent(
    """
    import sys, threading, time

    def quietly_waiting_elsewhere():
        time.sleep(60)

    def very_distinctive_spin_for_stacks():
        end = time.time() + 60
        while time.time() < end:
            pass

    threading.Thread(target=quietly_waiting_elsewhere, name="sleeper", daemon=True).start()
    print("ready", flush=True)
    very_distinctive_spin_for_stacks()
    """
)


@pytest.fixture
def child() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _leaf(row: stacks.StackRow) -> str:
    return row.frames.rsplit(";", 1)[-1]


def test_pyspy_samples_a_spinning_child(child: int) -> None:
    rows = stacks.sample_pyspy(child, seconds=1.0, rate_hz=10)
    spin = [r for r in rows if "very_distinctive_spin_for_stacks (<string>:" in _leaf(r)]
    assert spin, rows
    assert all(r.thread == "MainThread" and not r.idle for r in spin)
    assert any(r.gil for r in spin)  # the spinning loop holds the GIL most of the time
    assert spin[0].frames.startswith("<module> (<string>:")  # root first
    sleeping = [r for r in rows if "quietly_waiting_elsewhere" in r.frames]
    assert sleeping and all(r.thread == "sleeper" and r.idle and not r.gil for r in sleeping)
    # About 10 samples a second, each seeing both threads.
    assert 3 <= sum(r.count for r in spin) <= 12


def test_pyspy_blocking_dump_has_native_frames(child: int) -> None:
    rows = stacks.sample_pyspy(child, seconds=1.0, blocking=True)
    assert sum(r.count for r in rows) == 2  # one dump: both threads once
    sleeping = next(r for r in rows if r.thread == "sleeper")
    assert "quietly_waiting_elsewhere" in sleeping.frames
    assert "libc" in sleeping.frames or "libpython" in sleeping.frames  # below the Python frame


def test_pyspy_error_on_a_process_it_cannot_read() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(stacks.SamplerError, match="cannot dump"):
            stacks.sample_pyspy(proc.pid, seconds=0.5)
    finally:
        proc.kill()
        proc.wait()


def very_distinctive_in_process_spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_in_process_sampler_sees_its_own_threads() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=very_distinctive_in_process_spin, args=(stop,), name="spinner")
    worker.start()
    try:
        rows = stacks.sample_threads(seconds=0.5, rate_hz=20)
    finally:
        stop.set()
        worker.join()
    spin = [r for r in rows if r.thread == "spinner"]
    assert spin and all(
        "very_distinctive_in_process_spin (tests/agent/test_stacks.py:" in r.frames for r in spin
    )
    assert 3 <= sum(r.count for r in spin) <= 11  # 20 Hz for 0.5 s at most (the spinner holds the GIL)
    assert all(not r.idle and not r.gil for r in rows)
    assert not any("sample_threads" in r.frames for r in rows)  # the sampling thread is left out


def test_pyspy_capture_survives_a_failed_first_dump(
    child: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first dump can fail like any later one (a CI run: "Failed to find python version from
    # target process" on a torch rank, then the capture fell back to in-process sampling).
    real = stacks.pyspy_path()
    assert real is not None
    flaky = tmp_path / "py-spy"
    calls = tmp_path / "calls"
    flaky.write_text(
        f"#!/bin/sh\necho x >> {calls}\n"
        f'[ "$(wc -l < {calls})" -eq 1 ] && {{ echo "Error: Failed to find python version" >&2; exit 1; }}\n'
        f'exec {real} "$@"\n'
    )
    flaky.chmod(0o755)
    monkeypatch.setenv("ARGUS_PYSPY", str(flaky))
    rows = stacks.sample_pyspy(child, seconds=0.5, rate_hz=10)
    assert any("very_distinctive_spin_for_stacks" in r.frames for r in rows), rows


def test_pyspy_capture_goes_on_past_a_failed_dump(
    child: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A non-blocking dump can fail on a frame read mid-update (seen on a demo rank: its capture
    # ended after 4 of 30 samples); only the rank's exit ends a capture early.
    real = stacks.pyspy_path()
    assert real is not None
    flaky = tmp_path / "py-spy"
    calls = tmp_path / "calls"
    flaky.write_text(
        f"#!/bin/sh\necho x >> {calls}\n"
        f'[ "$(wc -l < {calls})" -eq 2 ] && {{ echo "Error: torn frame" >&2; exit 1; }}\n'
        f'exec {real} "$@"\n'
    )
    flaky.chmod(0o755)
    monkeypatch.setenv("ARGUS_PYSPY", str(flaky))
    rows = stacks.sample_pyspy(child, seconds=1.0, rate_hz=10)
    spin = sum(r.count for r in rows if "very_distinctive_spin_for_stacks" in r.frames)
    assert len(calls.read_text().splitlines()) >= 5 and spin >= 4, rows
