"""Sampled CPU stacks of one rank (docs/design.md §6.12, L5): py-spy from outside, or the rank's own threads.

Two samplers give the same rows, :class:`StackRow` — (thread, frames, count, idle, gil): how many
samples found ``thread`` in the stack ``frames`` (root to leaf, ``;``-joined
``function (file:line)``), idle or not, holding the GIL or not:

- :func:`sample_pyspy` — ``py-spy dump --json --nonblocking --subprocesses`` repeated at
  ``rate_hz`` for ``seconds`` (sampler ``py-spy``). Repeated dumps, not ``py-spy record``:
  record's raw (collapsed) output carries no per-sample idle or GIL state, each JSON dump does
  (``active``, ``owns_gil`` per thread). Non-blocking: the rank is never paused, so a frame read
  mid-update can be torn (py-spy's own caveat); at a few samples per stack that is noise. One dump
  costs py-spy about 30 ms of CPU here, so the rate stays low (10 Hz) and a capture lasts seconds.
  ``--subprocesses`` takes the rank's DataLoader workers too (their threads read
  ``name [pid N]``). With ``blocking`` (a hung rank, ``unresponsive``): one blocking
  ``py-spy dump --native`` of every thread, native frames included (py-spy takes ``--native``
  only when it pauses the process), sampler ``py-spy-native``.
- :func:`sample_threads` — inside the rank, ``sys._current_frames()`` at ``rate_hz`` for
  ``seconds`` (sampler ``in-process``): the fallback where py-spy cannot attach (no ptrace
  permission: a container without ``SYS_PTRACE``, Yama's ``ptrace_scope``; or py-spy absent).
  It sees Python frames only and cannot tell idle from running: ``idle`` and ``gil`` are
  False; and it holds the GIL while it reads, a cost py-spy does not have.

py-spy needs ptrace rights on the rank: the node agent runs as the rank's user (or root) with
``CAP_SYS_PTRACE`` in a container, and in the rank's pid namespace (``hostPID`` on Kubernetes);
``deploy/kubernetes`` says how.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import pyarrow as pa

from argus import config
from argus.errors import ArgusError
from argus.schema import wire_table

__all__ = [
    "IN_PROCESS",
    "PYSPY",
    "PYSPY_NATIVE",
    "SamplerError",
    "StackRow",
    "aggregate",
    "frame_label",
    "pyspy_path",
    "sample_pyspy",
    "sample_threads",
    "stack_table",
]

#: Sampler names, as the ``stacks.sampler`` column and the evidence give them.
PYSPY = "py-spy"
PYSPY_NATIVE = "py-spy-native"
IN_PROCESS = "in-process"
#: Samples per second of either sampler by default.
DEFAULT_RATE_HZ = 10.0
#: Tries of a capture's first py-spy dump before the capture falls back, and the pause between them.
FIRST_TRIES = 3
FIRST_RETRY_S = 0.2
#: Seconds one py-spy call may take before it counts as failed.
PYSPY_TIMEOUT_S = 10.0


class SamplerError(ArgusError):
    """py-spy is absent or cannot attach to the process (no ptrace permission, process gone)."""


@dataclass(frozen=True, slots=True)
class StackRow:
    """Samples that found one thread in one stack.

    ``frames``: root to leaf, ``;``-joined ``function (file:line)``; ``count``: samples;
    ``idle``: the thread was not running (sleeping, waiting on I/O or a lock); ``gil``: it held
    the GIL.
    """

    thread: str
    frames: str
    count: int
    idle: bool
    gil: bool


def frame_label(function: str, file: str, line: int) -> str:
    """One frame as the rows name it: ``function (file:line)``."""
    return f"{function} ({file}:{line})"


def aggregate(samples: Iterable[tuple[str, str, bool, bool]]) -> list[StackRow]:
    """Rows from single samples ``(thread, frames, idle, gil)``: one per distinct tuple, most first."""
    counts = Counter(samples)
    return [StackRow(t, f, n, i, g) for (t, f, i, g), n in counts.most_common()]


def pyspy_path() -> str | None:
    """The py-spy executable: ``$ARGUS_PYSPY`` (``off``: none), else beside this Python (a venv's
    ``bin``), else on ``PATH``; None if absent."""
    chosen = os.environ.get(config.ENV_PYSPY, "").strip()
    if chosen:
        return None if chosen.lower() == "off" else chosen
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _pyspy_dump(exe: str, pid: int, *, blocking: bool) -> list[dict[str, Any]]:
    cmd = [exe, "dump", "--pid", str(pid), "--json", "--subprocesses"]
    cmd += ["--native"] if blocking else ["--nonblocking"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PYSPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SamplerError(f"py-spy dump of pid {pid} failed: {exc}") from exc
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise SamplerError(f"py-spy cannot dump pid {pid}: {first}")
    try:
        threads = json.loads(done.stdout)
    except ValueError as exc:
        raise SamplerError(f"py-spy dump of pid {pid}: unreadable output ({exc})") from exc
    return list(threads) if isinstance(threads, list) else []


def _thread_samples(pid: int, threads: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, bool, bool]]:
    out = []
    for t in threads:
        name = str(t.get("thread_name") or f"thread {t.get('os_thread_id') or t.get('thread_id')}")
        if int(t.get("pid") or pid) != pid:
            name = f"{name} [pid {t.get('pid')}]"
        frames = [
            frame_label(
                str(f.get("name")), str(f.get("short_filename") or f.get("filename")), int(f.get("line") or 0)
            )
            for f in reversed(t.get("frames") or [])  # py-spy lists leaf first
        ]
        out.append((name, ";".join(frames), not t.get("active", True), bool(t.get("owns_gil", False))))
    return out


def sample_pyspy(
    pid: int, seconds: float, rate_hz: float = DEFAULT_RATE_HZ, *, blocking: bool = False
) -> list[StackRow]:
    """Sample process ``pid`` (and its child processes) with py-spy; see the module docstring.

    Args:
        pid: The rank's process id.
        seconds: How long to sample (ignored with ``blocking``: one dump).
        rate_hz: Dumps per second at most (each takes py-spy some 30 ms).
        blocking: One blocking dump of every thread with native frames (a hung rank).

    Raises:
        SamplerError: py-spy is absent, or its first dump failed :data:`FIRST_TRIES` times (no
            ptrace permission, no such process, not a Python process). A later failed dump
            loses that sample only (a non-blocking read can catch a frame mid-update); the
            rank's exit ends the capture early.
    """
    exe = pyspy_path()
    if exe is None:
        raise SamplerError("py-spy is not installed (pip install py-spy, or the [agent] extra)")
    if blocking:
        return aggregate(_thread_samples(pid, _pyspy_dump(exe, pid, blocking=True)))
    samples = _first_samples(exe, pid)
    period = 1.0 / rate_hz
    deadline = time.monotonic() + seconds
    next_at = time.monotonic() + period
    while next_at < deadline:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += period
        try:
            samples += _thread_samples(pid, _pyspy_dump(exe, pid, blocking=False))
        except SamplerError:
            # A non-blocking dump can read a frame mid-update and fail: that sample is lost, the
            # capture goes on. Once the rank has exited, keep what was sampled.
            if not psutil.pid_exists(pid):
                break
    return aggregate(samples)


def _first_samples(exe: str, pid: int) -> list[tuple[str, str, bool, bool]]:
    """The first non-blocking dump, tried up to :data:`FIRST_TRIES` times: like any later one it
    can fail on a read mid-update (py-spy then reports it cannot find the Python version); only
    failing every time means py-spy cannot read the process. Raises the last :class:`SamplerError`."""
    for _ in range(FIRST_TRIES - 1):
        try:
            return _thread_samples(pid, _pyspy_dump(exe, pid, blocking=False))
        except SamplerError:
            if not psutil.pid_exists(pid):
                raise
            time.sleep(FIRST_RETRY_S)
    return _thread_samples(pid, _pyspy_dump(exe, pid, blocking=False))


def _python_frames(frame: FrameType | None) -> str:
    labels: list[str] = []
    while frame is not None:
        code = frame.f_code
        labels.append(frame_label(code.co_qualname, _short(code.co_filename), frame.f_lineno or 0))
        frame = frame.f_back
    return ";".join(reversed(labels))


def _short(filename: str) -> str:
    """``filename`` relative to the longest ``sys.path`` entry holding it (as py-spy shortens)."""
    best = ""
    for entry in sys.path:
        if entry and filename.startswith(entry.rstrip("/") + "/") and len(entry) > len(best):
            best = entry.rstrip("/") + "/"
    return filename[len(best) :] if best else filename


def sample_threads(seconds: float, rate_hz: float = DEFAULT_RATE_HZ) -> list[StackRow]:
    """Sample this process's own Python threads for ``seconds`` (the in-process fallback).

    Runs in the calling thread (which it leaves out); ``idle`` and ``gil`` are False (see the
    module docstring). Threads of Argus's own (named ``argus-…``) are left out too.
    """
    me = threading.get_ident()
    samples: list[tuple[str, str, bool, bool]] = []
    period = 1.0 / rate_hz
    deadline = time.monotonic() + seconds
    while True:
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            name = names.get(ident, f"thread {ident}")
            if ident == me or name.startswith("argus-"):
                continue
            samples.append((name, _python_frames(frame), False, False))
        if time.monotonic() + period > deadline:
            break
        time.sleep(period)
    return aggregate(samples)


def stack_table(
    rows: Sequence[StackRow],
    *,
    rank: int,
    pid: int,
    capture_id: str,
    time_ns: int,
    duration_ns: int,
    sampler: str,
) -> pa.Table:
    """``rows`` of one capture as a ``stacks`` table (wire schema, :data:`argus.schema.TABLES`)."""
    n = len(rows)
    return wire_table(
        "stacks",
        {
            "rank": [rank] * n,
            "pid": [pid] * n,
            "capture_id": [capture_id] * n,
            "time_ns": [time_ns] * n,
            "duration_ns": [duration_ns] * n,
            "sampler": [sampler] * n,
            "thread": [r.thread for r in rows],
            "frames": [r.frames for r in rows],
            "count": [r.count for r in rows],
            "idle": [int(r.idle) for r in rows],
            "gil": [int(r.gil) for r in rows],
        },
    )
