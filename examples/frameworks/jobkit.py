"""What the two framework jobs share: their knobs, a fault clock, a token dataset and a timeline.

The jobs (``lightning_job.py``, ``hf_job.py``) hold no Argus line: `argus run` attaches the
probe from the outside. They are driven by environment variables so that a benchmark can run
them unchanged under Lightning's own launcher or torchrun:

- ``JOB_STEPS`` (default 200): training steps at most.
- ``JOB_DURATION_S`` (default 0: no limit): stop once rank 0 has trained this long; the ranks agree
  every :data:`STOP_CHECK_EVERY` steps (an all-reduce of one flag, the job's own collective).
- ``JOB_TIMELINE``: rank 0 writes there, as JSON at exit, the wall time (ns) of every step end, the
  fault's start and the injected ranks (``step_end_ns``, ``fault_start_ns``, ``slow_ranks``,
  ``scenario``, ``framework``), so a benchmark measures the job's pace without Argus; and every
  rank ``r`` writes ``<its stem>.rank<r>.json``: ``{"rank": r, "injected_ns": [...],
  "injected_run_delay_ns": [...]}``, per step the wall time it spent in the injected fault (the
  sleeps below) and, of it, the time its thread waited for a CPU (:func:`thread_run_delay_ns`), so
  a benchmark can tell what the fault cost the job without a second run to compare with.
- ``JOB_CLOCK_FILE``: rank 0 writes there, when training starts, ``{"fault_start_ns": …}`` (the
  fault's start, ns since the epoch), so that a fault injected from outside the job starts on its clock.
- ``JOB_OUT_DIR`` (default a folder under the system's temporary one): the framework's logs.
- ``JOB_THREADS`` (default 1): ``torch.set_num_threads`` of each rank.
- ``JOB_BATCH``, ``JOB_SEQ``, ``JOB_DIM``, ``JOB_VOCAB``: the model and batch sizes (defaults 16,
  64, 128, 1000).

Faults, injected in the framework's OWN hooks (nothing outside the job is touched):

- ``JOB_FAULT``: ``none`` (default), ``callback`` (a training callback sleeps on the faulty rank
  after every ``JOB_FAULT_EVERY``-th step: Lightning's ``Callback.on_train_batch_end``, the
  Hugging Face ``TrainerCallback.on_step_end``) or ``dataset`` (the dataset's ``__getitem__``
  sleeps per sample on the faulty rank, as a slow file system or decoder would).
- ``JOB_FAULT_RANK`` (default 2): the faulty rank (global rank).
- ``JOB_FAULT_AFTER_S`` (default 0): the fault starts this long after training starts (rank 0's
  clock, broadcast to every rank).
- ``JOB_FAULT_S``: seconds per sleep (default 0.2 for ``callback``, 0.01 per sample for ``dataset``).
- ``JOB_FAULT_EVERY`` (default 1): ``callback`` sleeps after every N-th step.

The sleeps run in :func:`injected_callback_stall` and :func:`injected_slow_read`, under their own
names, so that a rank's stacks name them.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

__all__ = [
    "FAULTS",
    "STOP_CHECK_EVERY",
    "Job",
    "TokenData",
    "injected_callback_stall",
    "injected_slow_read",
    "shutdown",
    "thread_run_delay_ns",
]

#: The fault kinds of ``JOB_FAULT``.
FAULTS = ("none", "callback", "dataset")
#: Steps between two checks of ``JOB_DURATION_S`` (each an all-reduce of one flag).
STOP_CHECK_EVERY = 10
#: ``JOB_FAULT_S`` when not set, per fault kind, seconds.
DEFAULT_FAULT_S = {"callback": 0.2, "dataset": 0.01}


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


def thread_run_delay_ns() -> int:
    """The calling thread's run-queue delay so far, ns (runnable, waiting for a CPU): the 2nd field
    of ``/proc/thread-self/schedstat``; 0 where the kernel does not keep it. The job holds no Argus
    line, so this is the job's own copy of ``argus.demo.job.thread_run_delay_ns`` (why it is kept:
    there)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def injected_callback_stall(seconds: float) -> None:
    """The ``callback`` fault: the training callback blocks for ``seconds`` (a sleep)."""
    time.sleep(seconds)


def injected_slow_read(seconds: float) -> None:
    """The ``dataset`` fault: one sample's slow read (a sleep of ``seconds``)."""
    time.sleep(seconds)


@dataclass
class Job:
    """A framework job's knobs (from the environment), its fault clock and its timeline.

    Raises:
        ValueError: ``JOB_FAULT`` is not one of :data:`FAULTS`.
    """

    framework: str
    steps: int = field(default_factory=lambda: _env_int("JOB_STEPS", 200))
    duration_s: float = field(default_factory=lambda: _env_float("JOB_DURATION_S", 0.0))
    timeline: str = field(default_factory=lambda: os.environ.get("JOB_TIMELINE", ""))
    clock_file: str = field(default_factory=lambda: os.environ.get("JOB_CLOCK_FILE", ""))
    fault: str = field(default_factory=lambda: os.environ.get("JOB_FAULT", "") or "none")
    fault_rank: int = field(default_factory=lambda: _env_int("JOB_FAULT_RANK", 2))
    fault_after_s: float = field(default_factory=lambda: _env_float("JOB_FAULT_AFTER_S", 0.0))
    fault_every: int = field(default_factory=lambda: max(1, _env_int("JOB_FAULT_EVERY", 1)))
    batch: int = field(default_factory=lambda: _env_int("JOB_BATCH", 16))
    seq: int = field(default_factory=lambda: _env_int("JOB_SEQ", 64))
    dim: int = field(default_factory=lambda: _env_int("JOB_DIM", 128))
    vocab: int = field(default_factory=lambda: _env_int("JOB_VOCAB", 1000))
    #: This rank (known at :meth:`start`; -1 before).
    rank: int = -1
    #: When the fault starts, ns since the epoch (0 before :meth:`start`).
    fault_start_ns: int = 0
    step_end_ns: list[int] = field(default_factory=list)
    #: Per step, the wall time this rank spent in the injected fault, ns.
    injected_ns: list[int] = field(default_factory=list)
    #: Per step, of :attr:`injected_ns`, the time this rank's thread waited for a CPU, ns.
    injected_run_delay_ns: list[int] = field(default_factory=list)
    _started_s: float = 0.0
    _spent_ns: int = 0
    _delay_ns: int = 0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"JOB_FAULT={self.fault!r}: expected one of {', '.join(FAULTS)}")
        self.fault_s = _env_float("JOB_FAULT_S", DEFAULT_FAULT_S.get(self.fault, 0.0))

    @property
    def out_dir(self) -> Path:
        """Where the framework writes its logs (``JOB_OUT_DIR``)."""
        default = Path(tempfile.gettempdir()) / f"argus-{self.framework}-job"
        return Path(os.environ.get("JOB_OUT_DIR", "") or default)

    def start(self) -> None:
        """At training start, on every rank: agree on when the fault starts (rank 0's clock)."""
        self.rank = dist.get_rank()
        start = torch.tensor([time.time_ns() + round(self.fault_after_s * 1e9)], dtype=torch.int64)
        dist.broadcast(start, src=0)
        self.fault_start_ns = int(start.item())
        self._started_s = time.monotonic()
        if self.rank == 0 and self.clock_file:
            Path(self.clock_file).write_text(json.dumps({"fault_start_ns": self.fault_start_ns}))

    def faulty(self, kind: str) -> bool:
        """True on the faulty rank once the fault of ``kind`` has started."""
        return (
            self.fault == kind and self.rank == self.fault_rank and 0 < self.fault_start_ns <= time.time_ns()
        )

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Count the wall time of the block (the fault's own work) in this step's injected time, and
        the thread's run-queue delay over it."""
        t0, d0 = time.perf_counter_ns(), thread_run_delay_ns()
        try:
            yield
        finally:
            self._delay_ns += thread_run_delay_ns() - d0
            self._spent_ns += time.perf_counter_ns() - t0

    def step_end(self) -> bool:
        """A step ended (after its callback fault, if any); True when every rank must stop now."""
        step = len(self.step_end_ns)
        if self.faulty("callback") and step % self.fault_every == 0:
            with self.timed():
                injected_callback_stall(self.fault_s)
        self.step_end_ns.append(time.time_ns())
        self.injected_ns.append(self._spent_ns)
        self.injected_run_delay_ns.append(self._delay_ns)
        self._spent_ns = self._delay_ns = 0
        if not self.duration_s or (step + 1) % STOP_CHECK_EVERY:
            return False
        late = self.rank == 0 and time.monotonic() - self._started_s >= self.duration_s
        flag = torch.tensor([int(late)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def write_timeline(self) -> None:
        """Write this rank's injected time per step beside ``JOB_TIMELINE`` and, on rank 0, the
        timeline (when set)."""
        if not self.timeline:
            return
        path = Path(self.timeline)
        mine = path.with_name(f"{path.stem}.rank{self.rank}.json")
        delay = self.injected_run_delay_ns
        mine.write_text(
            json.dumps({"rank": self.rank, "injected_ns": self.injected_ns, "injected_run_delay_ns": delay})
        )
        if self.rank != 0:
            return
        doc = {
            "framework": self.framework,
            "scenario": self.fault,
            "slow_ranks": [] if self.fault == "none" else [self.fault_rank],
            "fault_start_ns": self.fault_start_ns,
            "step_end_ns": self.step_end_ns,
        }
        Path(self.timeline).write_text(json.dumps(doc))


class TokenData(Dataset[Any]):
    """Random token sequences (seeded), next-token targets; ``__getitem__`` carries the dataset fault.

    Args:
        job: The job (its sizes and its fault clock).
        size: Samples.
        as_dict: Samples as ``{"input_ids", "labels"}`` (Hugging Face) instead of ``(x, y)``.
    """

    def __init__(self, job: Job, size: int, as_dict: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, job.vocab, (size, job.seq + 1), generator=g)
        self.job = job
        self.as_dict = as_dict

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __getitem__(self, i: int) -> Any:
        if self.job.faulty("dataset"):
            with self.job.timed():
                injected_slow_read(self.job.fault_s)
        row = self.tokens[i]
        if self.as_dict:
            return {"input_ids": row[:-1], "labels": row[:-1].clone()}
        return row[:-1], row[1:]


def shutdown() -> None:
    """Destroy the process group once nothing holds it, so gloo's threads are joined before exit."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
