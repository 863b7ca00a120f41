"""Faults from outside a training process, for ``bench/detection_live.py`` (issue 38).

Nothing in the job changes: the benchmark finds the rank's process and acts on it from here.

- ``sigstop``: the rank's process is stopped (``SIGSTOP``, every thread of it) for ``stop_s``
  seconds every ``every_s`` seconds, then continued (``SIGCONT``), as a host that freezes a
  process now and then would (a hypervisor's steal, a debugger, memory compaction).
- ``cpu_quota``: the rank's process is moved into a CPU cgroup whose quota is ``cpus`` CPUs
  (``cpu.max`` on cgroup v2, ``cpu.cfs_quota_us`` on v1), as on a node whose container limit
  is too low. Needs root and a cgroup CPU controller; :func:`cpu_cgroup_root` says where.

A spec is ``[kind, "key=value", ...]`` (:func:`parse`). :class:`Injector` runs one spec on one
rank in a thread, from the job's fault start (a clock file the job writes: ``JOB_CLOCK_FILE`` of
``examples/frameworks/jobkit.py``) or, with ``at_launch``, as soon as the rank's process exists
(onset at start: the job starts on the bad node); it undoes what it did when the job has trained
or exited.

The rank's process: the one whose environment at exec holds ``ARGUS_JOB_ID=<job>`` and
``RANK=<rank>`` (torchrun) or ``LOCAL_RANK=<rank>`` (Lightning's launcher, one node), and whose
parent does not (its data-loader workers are left alone). Lightning's rank 0 is the launcher
itself (no such variable): not supported, :class:`Injector` raises ValueError.

A fault from outside cannot time itself inside the job, so the injector keeps the account of
what it did (:attr:`Injector.held`): ``(start_ns, end_ns, held_ns)`` spans of wall time in which
the rank was held ``held_ns`` in all. ``sigstop``: each stop, from ``SIGSTOP`` to ``SIGCONT``
(held the whole span). ``cpu_quota``: the run-queue delay of the rank's main thread (the one
that drives its steps: ``/proc/PID/task/PID/schedstat``, 2nd field) read every :data:`SAMPLE_S`,
its growth over each span beyond the median growth of the job's other ranks' main threads over
the same span: the time the thread was ready to run but kept off a CPU (where a quota's throttling
shows) less the wait for a core that every rank of the host had then (the peers' delay: the
host's ordinary contention, which the rank would have waited anyway; measured under load 16, the
main thread alone waited 37.9 s of a 56 s run whose twin lost nothing). Both are upper bounds on
what the rank lost: a stopped rank may have been waiting in a collective anyway, and a throttled
one waits for a core more often than its peers, which sleep in collectives while it catches up.

Not the cgroup's throttled time (``throttled_usec`` of ``cpu.stat`` on v2, ``throttled_time`` on
v1, kept in the notes only; a benchmark accounting fix, 2026-12-07): the kernel adds it up per
CPU run queue of the group, not per wall second the process was held, so it follows how many of
the rank's threads were runnable on how many CPUs and not the rank's loss. Measured on this
2-core host (kernel 6.18, v1, ``cpus=0.25``, 3 s): a 1-thread busy loop held 2.30 s (its run
delay; ~0.75 of the wall time, as the quota implies) counted 0.83-0.89 s throttled; a 2-thread
one counted 1.40 s and 2.37 s in two runs, while its main thread waited 2.60-2.63 s (~0.875 of
the wall time: two threads share a quarter CPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "KINDS",
    "Injector",
    "cpu_cgroup_root",
    "job_pids",
    "main_thread_run_delay_ns",
    "parse",
    "rank_pid",
]

#: Outside faults and their knobs (defaults).
KINDS: dict[str, dict[str, float]] = {
    "sigstop": {"every_s": 2.0, "stop_s": 0.4},
    "cpu_quota": {"cpus": 0.25, "period_us": 100_000},
}
#: Where cgroups are mounted.
CGROUP_FS = Path("/sys/fs/cgroup")
#: How often the ``cpu_quota`` injector reads its rank's and its peers' run-queue delay, seconds.
SAMPLE_S = 0.2
#: Every how many samples the ``cpu_quota`` injector looks for the job's other ranks again.
PEERS_EVERY = 25


def parse(spec: list[str]) -> tuple[str, dict[str, float]]:
    """``["sigstop", "stop_s=0.3"]`` → ``("sigstop", {"every_s": 2.0, "stop_s": 0.3})``.

    Raises:
        ValueError: an unknown kind or knob, or a value that is no number.
    """
    kind, *knobs = spec
    if kind not in KINDS:
        raise ValueError(f"unknown outside fault {kind!r}; known: {sorted(KINDS)}")
    values = dict(KINDS[kind])
    for knob in knobs:
        key, _, value = knob.partition("=")
        if key not in values:
            raise ValueError(f"{kind}: unknown knob {key!r}; known: {sorted(values)}")
        values[key] = float(value)
    return kind, values


def _environ(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        return dict(item.partition("=")[::2] for item in raw.decode(errors="replace").split("\0") if item)
    return {}


def _parent(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    return 0


def job_pids(job_id: str) -> dict[int, int]:
    """The pid of every rank of job ``job_id`` on this host (see the module doc), by rank."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        mine = env.get("RANK", env.get("LOCAL_RANK"))
        if env.get("ARGUS_JOB_ID") != job_id or mine is None or not mine.isdigit():
            continue
        parent = _environ(_parent(pid))
        if parent.get("ARGUS_JOB_ID") == job_id and parent.get("RANK", parent.get("LOCAL_RANK")) == mine:
            continue  # a data-loader worker of the rank
        pids[int(mine)] = pid
    return pids


def rank_pid(job_id: str, rank: int) -> int | None:
    """The pid of ``rank`` of job ``job_id`` on this host (see the module doc), or None."""
    return job_pids(job_id).get(rank)


def cpu_cgroup_root() -> tuple[Path, int] | None:
    """The cgroup folder under which a CPU-limited child can be made, and its version (2 or 1).

    cgroup v2: the unified mount (``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified``) whose
    ``cgroup.subtree_control`` enables ``cpu``; v1: ``/sys/fs/cgroup/cpu``. None when neither is
    writable (not root, no controller).
    """
    for root in (CGROUP_FS, CGROUP_FS / "unified"):
        control = root / "cgroup.subtree_control"
        with contextlib.suppress(OSError):
            if "cpu" in control.read_text().split() and os.access(root, os.W_OK):
                return root, 2
    v1 = CGROUP_FS / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, 1
    return None


def _throttled_ns(group: Path, version: int) -> int:
    """The cgroup's throttled time so far, ns (``cpu.stat``: ``throttled_usec`` on v2,
    ``throttled_time`` in ns on v1)."""
    stat = (group / "cpu.stat").read_text().split()
    values = dict(zip(stat[::2], stat[1::2], strict=False))
    return int(values["throttled_usec"]) * 1000 if version == 2 else int(values["throttled_time"])


def main_thread_run_delay_ns(pid: int) -> int:
    """The run-queue delay of process ``pid``'s main thread so far, ns (the 2nd field of
    ``/proc/PID/task/PID/schedstat``: time it was runnable but waited for a CPU, a CPU quota's
    throttling included).

    Raises:
        OSError: the process is gone (or the kernel keeps no schedstat).
    """
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1])
    except (IndexError, ValueError) as exc:
        raise OSError(f"/proc/{pid}/task/{pid}/schedstat: unreadable") from exc


@dataclass
class Injector:
    """One outside fault on one rank of a running job, in a thread (:meth:`start`, :meth:`stop`).

    Args:
        job_id: The job (``ARGUS_JOB_ID`` of its ranks).
        rank: The rank to act on.
        spec: ``[kind, "key=value", ...]`` (:func:`parse`).
        clock_file: The job writes ``{"fault_start_ns": …}`` there when training starts.
        at_launch: Act as soon as the rank's process exists, not at the fault start.
        done: True once the job has trained (the injector undoes its fault then).

    Raises:
        ValueError: a bad spec, rank 0 of a Lightning job, or ``cpu_quota`` with no writable cgroup.
    """

    job_id: str
    rank: int
    spec: list[str]
    clock_file: Path
    at_launch: bool
    done: Callable[[], bool]
    #: What happened, for the benchmark's log (pid, start, counts, errors).
    notes: list[str] = field(default_factory=list)
    #: When the fault was first applied, ns since the epoch (0: never).
    applied_ns: int = 0
    #: What the fault held the rank: ``(start_ns, end_ns, held_ns)`` spans (the module doc).
    held: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kind, self.knobs = parse(self.spec)
        if self.kind == "cpu_quota" and cpu_cgroup_root() is None:
            raise ValueError("cpu_quota needs root and a cgroup CPU controller (see bench/outside.py)")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"outside-{self.kind}", daemon=True)
        self._peers: list[int] = []
        self._samples = 0

    def start(self) -> None:
        """Start the thread (it waits for the rank's process and the fault start)."""
        self._thread.start()

    def stop(self) -> None:
        """Undo the fault (continue the process, lift the quota) and wait for the thread."""
        self._stop.set()
        self._thread.join(timeout=30)

    def _finished(self) -> bool:
        return self._stop.is_set() or self.done()

    def _run(self) -> None:
        pid = None
        while pid is None and not self._finished():
            pid = rank_pid(self.job_id, self.rank)
            if pid is None:
                time.sleep(0.1)
        if pid is None:
            self.notes.append(f"rank {self.rank} of {self.job_id} never seen: no fault applied")
            return
        start_ns = 0
        while not self.at_launch and not start_ns and not self._finished():
            with contextlib.suppress(OSError, ValueError, KeyError):
                start_ns = int(json.loads(self.clock_file.read_text())["fault_start_ns"])
            time.sleep(0.05)
        while time.time_ns() < start_ns and not self._finished():
            time.sleep(min(0.05, (start_ns - time.time_ns()) / 1e9))
        if self._finished():
            return
        try:
            if self.kind == "sigstop":
                self._pause(pid)
            else:
                self._quota(pid)
        except OSError as exc:  # the process exited meanwhile, or the cgroup refused
            self.notes.append(f"{self.kind} on pid {pid}: {exc}")

    def _pause(self, pid: int) -> None:
        every_s, stop_s = self.knobs["every_s"], self.knobs["stop_s"]
        stops = 0
        try:
            while not self._finished():
                os.kill(pid, signal.SIGSTOP)
                stopped_ns = time.time_ns()
                self.applied_ns = self.applied_ns or stopped_ns
                stops += 1
                try:
                    self._stop.wait(stop_s)
                finally:
                    os.kill(pid, signal.SIGCONT)
                    now = time.time_ns()
                    self.held.append((stopped_ns, now, now - stopped_ns))
                self._stop.wait(max(every_s - stop_s, 0.0))
        finally:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
            self.notes.append(f"sigstop: pid {pid} stopped {stops} times for {stop_s} s every {every_s} s")

    def _run_delays(self, pid: int) -> dict[int, int]:
        """The main-thread run delay of ``pid`` and of the job's other ranks (by pid), ns.

        Raises:
            OSError: ``pid`` is gone (a peer that is gone is left out).
        """
        delays = {pid: main_thread_run_delay_ns(pid)}
        self._samples += 1
        if len(self._peers) < 1 or self._samples % PEERS_EVERY == 0:  # at launch, not all may be up yet
            self._peers = [p for p in job_pids(self.job_id).values() if p != pid]
        for peer in self._peers:
            with contextlib.suppress(OSError):
                delays[peer] = main_thread_run_delay_ns(peer)
        return delays

    def _quota(self, pid: int) -> None:
        found = cpu_cgroup_root()
        assert found is not None  # checked in __post_init__
        root, version = found
        group = root / f"argus-bench-{os.getpid()}-{pid}"
        group.mkdir(exist_ok=True)
        period = int(self.knobs["period_us"])
        quota = max(int(self.knobs["cpus"] * period), 1000)
        if version == 2:
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        try:
            (group / "cgroup.procs").write_text(str(pid))
            self.applied_ns = last_ns = time.time_ns()
            throttled, own = _throttled_ns(group, version), 0
            last = self._run_delays(pid)
            with contextlib.suppress(OSError):  # until the rank exits
                while not self._finished():
                    self._stop.wait(SAMPLE_S)
                    now_ns, now = time.time_ns(), self._run_delays(pid)
                    grown = {p: now[p] - last[p] for p in now if p in last}
                    peers = sorted(v for p, v in grown.items() if p != pid)
                    baseline = peers[len(peers) // 2] if peers else 0
                    self.held.append((last_ns, now_ns, max(grown[pid] - baseline, 0)))
                    own += grown[pid]
                    last_ns, last = now_ns, now
            throttled = _throttled_ns(group, version) - throttled
            stat = (group / "cpu.stat").read_text().split()
            self.notes.append(
                f"cpu_quota: pid {pid} limited to {quota / period:.2f} CPU (cgroup v{version}); held "
                f"{sum(h for *_, h in self.held) / 1e9:.2f} s (its main thread's run delay {own / 1e9:.2f} s "
                f"less its peers' median), throttled time {throttled / 1e9:.2f} s; "
                + " ".join(f"{k}={v}" for k, v in zip(stat[::2], stat[1::2], strict=False))
            )
        finally:
            with contextlib.suppress(OSError):  # back to the parent group, if it still runs
                (root / "cgroup.procs").write_text(str(pid))
            for _ in range(50):
                with contextlib.suppress(OSError):
                    group.rmdir()
                    break
                time.sleep(0.1)
