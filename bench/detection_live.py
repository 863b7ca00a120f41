"""Labelled detection benchmark on real jobs (issue 10, "Must show" 1; the goals of issue 16).

About 30 real 4-rank gloo jobs (:mod:`argus.demo.job`, one CPU thread per rank)
run one after another under `argus run`, streaming to one `argus server` on an
embedded store with its analyzer on and one node agent (the demo's stack, its
5 s window): the diagnosis a user gets live. :data:`CASES` holds 15 faults
built from the failure classes, not from what an analyzer catches:

- the four layouts: data parallel (``dp``), pipeline × data parallel with
  unequal stages and a GPipe schedule over ``isend``/``recv`` (``pp``), tensor
  × data parallel with all-reduces inside the tensor-parallel group (``tp``),
  fully sharded data parallel (FSDP2: an all-gather per layer, reduce-scatters
  in backward; ``fsdp``);
- every fault kind: compute, steady host stall, rare large stall, slow
  dataloader, host work before an extra synchronisation point (a broadcast
  before forward), several ranks slow at once (3 of 4), one pipeline stage slow
  (both ranks of stage 1); three sizes of two of them (compute, host stall) in
  the dp layout, meant to cost 8–40 % of throughput.

:data:`CASES` also holds the **onset-at-start** class (``onset_at_start``: the fault from the
job's first step, no healthy warm-up, as when a job starts on a bad node): compute and host stall
in each layout (pp: rank 3 alone), and three of four ranks' compute. They share one clean twin
per layout. Others append cases to :data:`CASES` (a :class:`Case` each).

It also holds jobs of **real frameworks**, attached with no code change (layouts ``lightning``
and ``hf``: ``examples/frameworks/``, needs ``pip install -e '.[frameworks]'``): a Lightning
``Trainer(strategy="ddp")`` under its own launcher and a Hugging Face ``Trainer`` under torchrun,
with a fault in their own hooks (a training callback that sleeps, a dataset whose reads sleep)
and faults **from outside the process** (``bench/outside.py``): the rank's process stopped by
``SIGSTOP``/``SIGCONT`` now and then, or held to a CPU quota by a cgroup (root; cgroup v2
``cpu.max`` or v1 ``cpu.cfs_quota_us``). One of each pair is there from the first step.

Every faulty job is followed by its **clean twin** (the same command with
``--scenario none``), so runs interleave fault, twin, fault, twin, ... and the
machine's load drifts alike for both; the twins are the clean runs (two or more
per layout). Each job trains :data:`TRAIN_S` s: :data:`WARMUP_S` s healthy, then
the fault until the end. The job itself writes the wall time of every step end
(``--timeline``) and, per rank and step, the wall time it spent in the injected fault's own
work and, of it, the time its thread waited for a CPU, so the ground truth does not come from Argus.

Ground truth, per faulty job, over the fault period (its steps that end after
the fault starts; the twin's at the same offset from its own start):

- **lost time** = the time the job lost to the fault by its own account
  (:func:`injected_lost_s`): per step, the largest injected time of any rank in it (a
  synchronous job's step waits for its slowest rank; for a pipeline, see there), summed, each
  rank's being its wall time less its wait for a CPU (cores other ranks held: a benchmark
  accounting fix, why: there); a fault from outside the process is timed by its injector (the
  time the rank was stopped, or its main thread waited for a CPU under the quota: ``bench/outside.py``);
- **true cost** = lost time / the period's wall time (the share of throughput the fault took).

The clean twin gives the same two a second way, shown beside them for comparison (``twin%``,
``twin_s``): mean step time = the period's wall time / its steps; cost = 1 − twin's mean step
time / the faulty run's; lost time = the period's wall time − its steps × the twin's mean step
time. A twin is no reference under a load that moves between the two runs (on this shared
machine, 10 → 50: a pp fault cost 74 % by its twin in one run and 35 % in another, a tp fault
−19 %), so it is the measure only for recordings made before the jobs kept their own account
(``by``: ``job`` or ``twin``).

The table also shows, for information only, ``warm%``: the cost with each run's
fault period first divided by its own warm-up pace, which is less sensitive to a
machine whose load changes between runs (a shared 2-core machine's does).

Scoring, over every diagnosis Argus gave for the job (open or resolved). A
diagnosis *names* ``{rank}`` when ``rank`` is set, else its ``ranks``.

- **TP**: it names only injected ranks, at least one, and its windows reach the
  fault period. For a single-rank fault it must be rank-level (``rank`` is the
  injected rank): a job-level diagnosis (``rank`` null) is not a hit. For a
  fault on several ranks (3 of 4, a stage), a rank-level diagnosis of one of them
  or a job-level one whose ``ranks`` are among them is a hit.
- **FP**: it names a healthy rank (on a faulty or a clean job), or names the
  injected rank only in windows that end before the fault began (the rank was
  healthy then). On a clean job every rank is healthy.
- Neither: a job-level diagnosis that names no healthy rank but is not a hit
  (no ranks, or ``rank`` null on a single-rank fault). Shown in the table.
- **precision** = TP / (TP + FP) over all jobs.
- **recall**, over the faults whose true cost is ≥ :data:`RECALL_MIN_COST`:
  the mean share of each fault's injected ranks that its TPs name (a stage
  fault with one of its two ranks named counts 0.5; partial naming counts in
  proportion).
- **cause accuracy** over the TPs: the cause each fault should get
  (:data:`EXPECTED_CAUSE`): compute → ``compute``; steady and rare stalls →
  ``host_stall``; slow dataloader → ``dataloader``; host work before a sync
  point → ``host_stall`` (untracked host time; the wait it causes is absorbed
  at the broadcast); the slow stage and the 3-of-4 fault are compute → ``compute``;
  a framework's sleeping callback → ``host_stall``, its slow dataset → ``dataloader``,
  a stopped process and a CPU quota → ``host_stall`` (why: beside each in the table).
- **duplicate_diagnoses**: jobs with two diagnoses over overlapping windows whose causes differ,
  or a job-level one (``rank`` null) beside a rank-level one: one fault told twice (issue 38). A
  clean job's job-level loss naming no rank, its job really slower by the loss threshold (what
  ``assert_blames_no_one`` allows), is in no pair (:func:`duplicated`).
- **onset_at_start_recall**: recall over the onset-at-start faults alone; the table's ``win``
  is the window its first diagnosis begins in (the job's first analysed window is 1; the goal
  for an onset-at-start fault is 3 or less: ``onset_detected_by_window_3``).
- **unexplained_loss_pct**: the share of the faulty jobs' lost time that no
  diagnosis accounts for. A diagnosis that is not an FP accounts for its
  ``evidence.lost_s`` when present, else ``slowdown_pct`` × its span (first
  window to the end of its last); per job, at most the job's lost time. A job
  with no diagnoses is all unexplained (the same against the twin's loss:
  ``twin_unexplained_loss_pct``, for comparison). The table shows, per job, ``lost_s`` (the
  job's loss, ``by`` whose account), ``twin_s`` (the twin-based loss), ``argus_s`` (the
  analyzer's own lost time over the job's analysed windows, against its healthy pace or,
  without one, the time it waited for the ranks behind: the job summary's ``lost_s``) and
  ``expl_s`` (what the diagnoses account for): ``argus_s`` well below ``lost_s`` with ``expl_s``
  ≈ ``argus_s`` is a loss the analyzer did not measure; ``expl_s`` below ``argus_s`` is a loss
  measured but not attributed. ``load`` is the 1-minute load average when the run (and its
  twin) ended training.

A job that exits with a non-zero status is reported (``failed_jobs``) and kept:
no retry.

Keeping and re-scoring: ``--keep DIR`` records into ``DIR/store`` (the chDB data
dir) and writes ``DIR/labels.json`` (cases, job ids, timelines, window, the
live diagnoses). ``--rescore DIR`` re-analyses a copy of the kept store offline
with today's analyzer (:class:`argus.analyzer.service.Analyzer`, the same window,
the stored diagnoses dropped first) and scores that in seconds; ``--rescore DIR
--stored`` scores the diagnoses recorded live again (after a change of scoring).

The per-job table goes to stdout, progress to stderr; the last line is
``precision=… recall=… cause_accuracy=… unexplained_loss_pct=… duplicate_diagnoses=…
onset_at_start_recall=… jobs=…``.
A full recording takes about 30 minutes on a 2-core machine, the framework jobs 8 of them
(7 jobs: their start-up is longer); timings depend on the machine's load (quote it)::

    python bench/detection_live.py [--keep DIR] [--only NAME,...]
    python bench/detection_live.py --rescore DIR [--stored]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# bench/outside.py, beside this file: found whether this runs as a script or is loaded by path (tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import outside  # noqa: E402
from rich.console import Console  # noqa: E402

from argus.demo.local import WINDOW_S, Service, job_command, local_service  # noqa: E402
from argus.diagnosis import host_slowed_the_job  # noqa: E402
from argus.window_grid import WindowGrid  # noqa: E402

#: Healthy training before the fault, then training with it until the job stops, seconds.
WARMUP_S = 14.0
TRAIN_S = 40.0
WORLD = 4
#: Faults costing less than this share of throughput are scored but not counted in recall.
RECALL_MIN_COST = 0.10
#: The cause each fault kind should get, from what the fault physically does.
EXPECTED_CAUSE = {
    "compute": "compute",
    "host_stall": "host_stall",
    "spiky_stall": "host_stall",
    "dataloader": "dataloader",
    "host_work": "host_stall",
    # A framework's training callback that sleeps after a step: host time outside every phase
    # (forward, backward, optimizer, data), the rank comes late to the next step's collective.
    "callback": "host_stall",
    # The dataset's __getitem__ sleeps per sample: the time is inside the DataLoader's __next__.
    "dataset": "dataloader",
    # The process is frozen (SIGSTOP): wall time passes with no CPU and no run-queue wait, in
    # whatever phase it hits; the rank's own work did not grow.
    "sigstop": "host_stall",
    # The rank's work is unchanged, but it waits runnable for the CPU its quota denies (run-queue
    # delay, every phase stretched alike): the host held it back.
    "cpu_quota": "host_stall",
}
#: Layouts that are a framework's own job (``examples/frameworks/<layout>_job.py``), not the demo's:
#: a Lightning ``Trainer(strategy="ddp")`` under its own launcher, a Hugging Face ``Trainer`` under
#: torchrun. Their in-job faults are ``JOB_FAULT`` kinds; their knobs are ``JOB_*=value`` settings.
FRAMEWORKS = ("lightning", "hf")
FRAMEWORK_JOBS = ROOT / "examples" / "frameworks"


@dataclass(frozen=True)
class Case:
    """One faulty job: ``scenario`` of :mod:`argus.demo.job` on ``ranks``, with ``knobs`` (job arguments)."""

    name: str
    layout: str
    scenario: str
    ranks: tuple[int, ...]
    knobs: tuple[str, ...] = ()
    #: Job arguments shared with the twin (the extra sync point).
    shape: tuple[str, ...] = ()
    #: The fault is there from the job's first step (no healthy past: warm-up 0, twin shared).
    onset_at_start: bool = False

    @property
    def outside(self) -> bool:
        """The fault acts on the rank's process from outside (:mod:`outside`), the job unchanged."""
        return self.scenario in outside.KINDS

    @property
    def cause(self) -> str:
        return EXPECTED_CAUSE[self.scenario]

    @property
    def twin(self) -> str:
        """The twin's run name: the case's own, or one per (layout, shape) for onset-at-start cases."""
        return (
            f"{'-'.join([self.layout, *self.shape])}-onset~twin"
            if self.onset_at_start
            else f"{self.name}~twin"
        )


CASES: tuple[Case, ...] = (
    # dp: three sizes of compute and of steady host stalls, then the other kinds.
    Case("dp-compute-small", "dp", "compute", (2,), ("--compute-repeat=0.17",)),
    Case("dp-compute-medium", "dp", "compute", (2,), ("--compute-repeat=0.5",)),
    Case("dp-compute-large", "dp", "compute", (2,), ("--compute-repeat=1.3",)),
    Case("dp-host_stall-small", "dp", "host_stall", (1,), ("--stall-every=4", "--stall-s=0.06")),
    Case("dp-host_stall-medium", "dp", "host_stall", (1,), ("--stall-every=4", "--stall-s=0.17")),
    Case("dp-host_stall-large", "dp", "host_stall", (1,), ("--stall-every=4", "--stall-s=0.45")),
    Case("dp-dataloader", "dp", "dataloader", (0,), ("--sample-delay-s=0.004",)),
    Case("dp-3-of-4-compute", "dp", "compute", (0, 1, 3), ("--compute-repeat=0.8",)),
    # pp: a slow stage (both ranks of stage 1, the heavy one), a rare large stall on stage 0.
    Case("pp-stage1-compute", "pp", "compute", (2, 3), ("--compute-repeat=0.4",)),
    Case("pp-spiky_stall", "pp", "spiky_stall", (1,), ("--spike-every=40", "--spike-s=2.5")),
    # tp: host work before a broadcast, a compute straggler.
    Case("tp-host_work", "tp", "host_work", (2,), ("--host-work-s=0.025",), ("--sync=broadcast",)),
    Case("tp-compute", "tp", "compute", (3,)),  # the layout's repeat (argus.demo.job.COMPUTE_REPEAT)
    # fsdp: every layer's all-gather is a synchronisation point; the step meets first at the
    # root's all-gather before forward, where a slow rank's lateness is absorbed.
    Case("fsdp-compute", "fsdp", "compute", (1,), ("--compute-repeat=4.0",)),
    Case("fsdp-host_stall", "fsdp", "host_stall", (3,), ("--stall-every=4", "--stall-s=0.17")),
    Case("fsdp-dataloader", "fsdp", "dataloader", (2,), ("--sample-delay-s=0.004",)),
    # Onset at start (a job started on a bad node): no healthy warm-up, one clean twin per layout.
    *(
        Case(f"{lay}-{kind}-onset", lay, kind, (r,), knobs, onset_at_start=True)
        for lay, r in (("dp", 2), ("pp", 3), ("tp", 3), ("fsdp", 1))  # pp: one rank of stage 1
        for kind, knobs in (
            (
                "compute",
                ("--compute-repeat=1.3",)
                if lay == "dp"
                else ("--compute-repeat=2.0",)
                if lay == "pp"
                else (),
            ),
            ("host_stall", ("--stall-every=4", "--stall-s=0.17")),
        )
    ),
    Case("dp-3-of-4-onset", "dp", "compute", (1, 2, 3), ("--compute-repeat=3.0",), onset_at_start=True),
    # Framework jobs attached with no code change (``FRAMEWORKS``; the 'frameworks' extra). Steps
    # of about 120 ms (Lightning) and 150 ms (HF) on a quiet 2-core machine; each fault is sized
    # to cost 20-35 % of that. Expected causes: EXPECTED_CAUSE, why: beside each kind there.
    # Lightning: the callback sleeps 0.2 s after every 4th step on rank 2, after a warm-up.
    Case("lightning-callback", "lightning", "callback", (2,), ("JOB_FAULT_S=0.2", "JOB_FAULT_EVERY=4")),
    # HF: every sample read on rank 1 sleeps 3 ms (48 ms a batch of 16) from the first step.
    Case("hf-dataset-onset", "hf", "dataset", (1,), ("JOB_FAULT_S=0.003",), onset_at_start=True),
    # From outside the process: Lightning's rank 2 frozen 0.4 s every 2 s after a warm-up (the
    # case of issue 38's duplicate); HF's rank 3 held to a quarter of a CPU from its launch.
    Case("lightning-sigstop", "lightning", "sigstop", (2,), ("every_s=2", "stop_s=0.4")),
    Case("hf-cpu_quota-onset", "hf", "cpu_quota", (3,), ("cpus=0.25",), onset_at_start=True),
)


@dataclass
class Run:
    """One recorded job: a case's faulty run, or its twin (``scenario`` none)."""

    name: str
    case: str
    layout: str
    scenario: str
    ranks: list[int]
    job_id: str
    args: list[str]
    returncode: int | None = None
    timeline: dict[str, Any] | None = None
    #: The faulty run's clean twin (its run name); "" for a twin.
    twin: str = ""
    #: The 1-minute load average when it ended training (NaN in recordings made before it was kept).
    load: float = math.nan
    #: The analyzer's own lost time of the job, s (the job summary's ``lost_s``; NaN unknown).
    argus_lost_s: float = math.nan
    #: A framework job's settings (``JOB_*``, see examples/frameworks/jobkit.py); empty for the demo job.
    env: dict[str, str] = field(default_factory=dict)
    #: A fault from outside the process (:func:`outside.parse`'s spec); empty for none.
    outside: list[str] = field(default_factory=list)
    #: What the outside fault's injector did (pid, stops, throttling).
    outside_notes: list[str] = field(default_factory=list)
    #: What the outside fault held its rank: ``(start_ns, end_ns, held_ns)`` spans
    #: (:attr:`outside.Injector.held`); empty for none (and in recordings made before it was kept).
    outside_held: list[list[int]] = field(default_factory=list)


def schedule(cases: tuple[Case, ...], tag: str, warmup_s: float, train_s: float) -> list[Run]:
    """Each case's faulty run, then its twin: fault, twin, fault, twin, ... (a twin shared by
    onset-at-start cases follows the first of them)."""
    runs = []
    twins: set[str] = set()
    for c in cases:
        start_s = 0.0 if c.onset_at_start else warmup_s
        job = f"live-{tag}-{c.name}"
        if c.layout in FRAMEWORKS:
            fault, twin = _framework_runs(c, job, start_s, train_s)
        elif c.outside:
            raise ValueError(f"{c.name}: outside faults need a framework job's clock file ({FRAMEWORKS})")
        else:
            common = [
                f"--layout={c.layout}",
                *c.shape,
                f"--fault-after-s={start_s}",
                f"--duration-s={train_s}",
            ]
            ranks = ",".join(map(str, c.ranks))
            args = [*common, f"--scenario={c.scenario}", f"--slow-ranks={ranks}", *c.knobs]
            fault = Run(c.name, c.name, c.layout, c.scenario, list(c.ranks), job, args, twin=c.twin)
            twin = Run(c.twin, c.name, c.layout, "none", [], "", [*common, "--scenario=none"])
        runs.append(fault)
        if c.twin in twins:
            continue
        twins.add(c.twin)
        twin.job_id = f"live-{tag}-{c.twin.replace('~', '-')}"
        runs.append(twin)
    return runs


def _framework_runs(c: Case, job_id: str, start_s: float, train_s: float) -> tuple[Run, Run]:
    """A framework case's faulty run and its twin: the same job (``JOB_*`` settings), one with
    the fault in its own hooks (``JOB_FAULT``) or from outside (:attr:`Run.outside`)."""
    if len(c.ranks) != 1:
        raise ValueError(f"{c.name}: a framework job's fault hits one rank")
    common = {"JOB_DURATION_S": str(train_s), "JOB_STEPS": "1000000", "JOB_FAULT_AFTER_S": str(start_s)}
    own = {} if c.outside else dict(k.split("=", 1) for k in c.knobs)
    env = {
        **common,
        "JOB_FAULT": "none" if c.outside else c.scenario,
        "JOB_FAULT_RANK": str(c.ranks[0]),
        **own,
    }
    spec = [c.scenario, *c.knobs] if c.outside else []
    fault = Run(
        c.name, c.name, c.layout, c.scenario, list(c.ranks), job_id, [], twin=c.twin, env=env, outside=spec
    )
    twin = Run(c.twin, c.name, c.layout, "none", [], "", [], env={**common, "JOB_FAULT": "none"})
    return fault, twin


# --- recording ------------------------------------------------------------------------------------


def record(
    runs: list[Run], work: Path, console: Console
) -> tuple[list[Run], dict[str, list[dict[str, Any]]]]:
    """Run every job under one live server; return the runs (with timelines) and each job's diagnoses."""
    from argus.client import ArgusClient
    from argus.errors import NotFound

    timelines = work / "timelines"
    timelines.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    with local_service(work, console) as service:
        previous: tuple[Run, subprocess.Popen[bytes], float, outside.Injector | None] | None = None
        for i, run in enumerate(runs):
            tl = timelines / f"{run.name}.json"
            cmd, job_env = _command(service, run, tl, work)
            with (service.logs / f"{run.name}.log").open("wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, **job_env})
            injector = _inject(run, proc, tl, work)
            if previous is not None:
                _finish(*previous, timelines, console)
            # The next job starts once this one has trained (its timeline is written after its
            # process groups are destroyed): its start-up overlaps only this one's exit.
            while proc.poll() is None and not tl.exists():
                time.sleep(0.5)
            previous = (run, proc, time.monotonic(), injector)
            run.load = os.getloadavg()[0]
            console.print(f"[{i + 1}/{len(runs)}] {run.name} trained, load {run.load:.1f}")
        if previous is not None:
            _finish(*previous, timelines, console)
        # The analyzer analyses a job's windows up to 3 past its last row, each once it is complete.
        _wait_for_analysis(service, runs, console)
        found: dict[str, list[dict[str, Any]]] = {}
        with ArgusClient(service.http) as client:
            for r in runs:
                try:
                    found[r.job_id] = list(client.items(f"/api/v1/jobs/{r.job_id}/diagnoses"))
                    r.argus_lost_s = float(client.job(r.job_id).get("lost_s", math.nan))
                except NotFound:  # the job never reported (it failed to start)
                    found[r.job_id] = []
    return runs, found


def _command(service: Service, run: Run, timeline: Path, work: Path) -> tuple[list[str], dict[str, str]]:
    """The command of ``run`` under `argus run` and the settings it adds to the environment."""
    if run.layout not in FRAMEWORKS:
        return job_command(service, run.job_id, WORLD, [*run.args, f"--timeline={timeline}"]), {}
    script = str(FRAMEWORK_JOBS / f"{run.layout}_job.py")
    launch = [sys.executable, script]  # Lightning: its own launcher
    if run.layout == "hf":
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
        launch += [f"--log-dir={service.logs / 'torchrun'}", script]
    argus = [sys.executable, "-m", "argus.cli", "run", "--collector", service.grpc]
    argus += ["--socket", str(service.socket), "--job-id", run.job_id, "--server", service.http, "--"]
    job_env = {
        **run.env,
        "JOB_TIMELINE": str(timeline),
        "JOB_CLOCK_FILE": str(_clock_file(work, run)),
        "JOB_DEVICES": str(WORLD),
        "JOB_OUT_DIR": str(work / "jobs" / run.name),
    }
    return [*argus, *launch], job_env


def _clock_file(work: Path, run: Run) -> Path:
    return work / "timelines" / f"{run.name}.clock.json"


def _inject(run: Run, proc: subprocess.Popen[bytes], timeline: Path, work: Path) -> outside.Injector | None:
    """Start ``run``'s outside fault, if any: from the fault start, or from launch for onset at start."""
    if not run.outside:
        return None
    at_launch = float(run.env.get("JOB_FAULT_AFTER_S", "0")) == 0.0
    injector = outside.Injector(
        run.job_id,
        run.ranks[0],
        run.outside,
        _clock_file(work, run),
        at_launch,
        lambda: proc.poll() is not None or timeline.exists(),
    )
    injector.start()
    return injector


def _finish(
    run: Run,
    proc: subprocess.Popen[bytes],
    trained: float,
    injector: outside.Injector | None,
    timelines: Path,
    console: Console,
) -> None:
    """Wait for ``run``'s process to exit; keep its exit status, timeline and outside fault's notes."""
    if injector is not None:
        injector.stop()
        run.outside_notes = injector.notes
        run.outside_held = [list(span) for span in injector.held]
        for note in injector.notes:
            console.print(f"    {run.name}: {note}")
    run.returncode = proc.wait()
    tl = timelines / f"{run.name}.json"
    run.timeline = json.loads(tl.read_text()) if tl.exists() else None
    # Every rank's injected time per step (argus.demo.job.injected_path, jobkit's write_timeline).
    injected, delayed = {}, {}
    for f in timelines.glob(f"{run.name}.rank*.json"):
        doc = json.loads(f.read_text())
        injected[str(doc["rank"])] = doc["injected_ns"]
        if "injected_run_delay_ns" in doc:
            delayed[str(doc["rank"])] = doc["injected_run_delay_ns"]
    if run.timeline is not None and injected:
        run.timeline["injected_ns"] = injected
    if run.timeline is not None and delayed:
        run.timeline["injected_run_delay_ns"] = delayed
    steps = len(run.timeline["step_end_ns"]) if run.timeline else 0
    left = [t for t in (run.timeline or {}).get("threads_at_exit", []) if "gloo" in t]
    console.print(
        f"    {run.name}: exit {run.returncode}, {steps} steps, exited {time.monotonic() - trained:.0f} s "
        "after training" + (f", gloo threads left at exit: {left}" if left else "")
    )


def _wait_for_analysis(service: Service, runs: list[Run], console: Console) -> None:
    last_ns = max((r.timeline["step_end_ns"][-1] for r in runs if r.timeline), default=time.time_ns())
    ready_ns = last_ns + round((4 * WINDOW_S + max(2.0, WINDOW_S / 4) + WINDOW_S) * 1e9)
    with console.status("final analysis"):
        while time.time_ns() < ready_ns:
            time.sleep(1.0)


def reanalyse(kept: Path, runs: list[Run], window_s: float) -> dict[str, list[dict[str, Any]]]:
    """Today's analyzer over a copy of the kept store (its stored diagnoses dropped), job by job."""
    from argus.analyzer.service import Analyzer
    from argus.diagnosis import read_diagnoses
    from argus.store import open_store

    with tempfile.TemporaryDirectory(prefix="argus-rescore-") as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(kept / "store", copy, symlinks=True)  # ClickHouse links tables to their data
        store = open_store(f"chdb://{copy}")
        try:
            store.command("TRUNCATE TABLE diagnoses")
            analyzer = Analyzer(store, window=WindowGrid.from_seconds(window_s), backlog_s=None)
            analyzer.run_once(now_ns=time.time_ns() + 3600 * 10**9)
            out = {run.job_id: [d.to_dict() for d in read_diagnoses(store, run.job_id)] for run in runs}
            for run in runs:
                run.argus_lost_s = _analysed_lost_s(store, run.job_id)
        finally:
            store.close()
    return out


def _analysed_lost_s(store: Any, job_id: str) -> float:
    """The analyzer's lost time of ``job_id`` over its analysed windows, s (as the job summary's)."""
    rows = store.query(
        "SELECT sum(lost_ns) AS lost FROM analysis_windows FINAL WHERE job_id = {job:String}",
        {"job": job_id},
    )
    lost = rows["lost"].to_pylist()
    return float(lost[0] or 0) / 1e9 if lost else math.nan


# --- ground truth and scoring ---------------------------------------------------------------------


@dataclass(frozen=True)
class Pace:
    """A run's fault period: its steps, wall time (s) and mean step time (s)."""

    steps: int
    wall_s: float
    step_s: float


def _period(timeline: dict[str, Any]) -> int | None:
    """The index of the first step of the fault period: the steps ending after the fault starts,
    or, when it was there from the first step, all but the first (timed from its end); None when
    fewer than two steps are left or none is before them."""
    ends = timeline["step_end_ns"]
    first = sum(1 for t in ends if t <= timeline["fault_start_ns"]) or 1
    return first if len(ends) - first >= 2 else None


def pace(timeline: dict[str, Any]) -> Pace:
    """The steps ending after the fault starts (the twin: the same offset), timed from the step before."""
    ends = timeline["step_end_ns"]
    first = _period(timeline)
    if first is None:
        return Pace(0, 0.0, math.nan)
    wall = (ends[-1] - ends[first - 1]) / 1e9
    return Pace(len(ends) - first, wall, wall / (len(ends) - first))


def _held_in(spans: list[list[int]], lo_ns: int, hi_ns: int) -> int:
    """Of ``(start_ns, end_ns, held_ns)`` spans, the held time within ``(lo_ns, hi_ns]``, ns (each
    span's held time spread evenly over it)."""
    held = 0.0
    for start, end, ns in spans:
        if end > start:
            held += ns * max(min(end, hi_ns) - max(start, lo_ns), 0) / (end - start)
    return round(held)


def injected_lost_s(
    timeline: dict[str, Any], outside_held: list[list[int]] | None = None, *, less_cpu_wait: bool = True
) -> float:
    """The time the job lost to its fault over its fault period by the job's own account, s; NaN
    without one (a recording made before the jobs kept it).

    The account: per rank and step, the time the rank spent in the injected work: its wall time
    (``injected_ns`` of the timeline: the job times its own extra passes, sleeps and host work;
    ``argus.demo.job.Fault.timed``) less the time the rank's thread waited for a CPU within it
    (``injected_run_delay_ns``, when kept: the run-queue delay, ``/proc/thread-self/schedstat``);
    or, for a fault from outside the process, the time the injector held the rank in that step
    (``outside_held``: stopped, or its main thread kept waiting for a CPU under the quota;
    :mod:`outside`), each step being the wall time since the step before ended on rank 0.

    Why the wait for a CPU is left out (a benchmark accounting fix, 2026-12-07, not a change of
    what Argus measures): on a host whose 4 ranks share 2 cores, an injected block's wall time
    includes the time its thread waited while other ranks' ordinary work held the cores: work
    the job does with or without the fault, that a rank with a device of its own would not wait
    for. The block's own time is the extra work's CPU time, or the sleep itself (a sleeping
    thread is not runnable: its delay is only the wait to run again after it wakes). The rule is
    one for every fault in the job (compute, sleep, dataset, callback); a CPU quota's loss *is*
    waiting for a CPU, and its injector counts that wait, not subtracts it (:mod:`outside`).
    Recordings made before the delay was kept keep the wall-time account (an upper bound). Where
    processes outside the job hold the cores (a loaded host), the wait is a loss too and this
    account is low: at load 14-18 a ``dp-compute-onset`` counted 3.1 s against the twin's 9.0 s
    (its wall account 11.2 s); quote the load beside the figure (the table's ``load``).
    ``less_cpu_wait=False`` gives the wall-time account (the upper bound), which the summary
    line reports beside it (``wall_unexplained_loss_pct``), and a fault counts in recall when
    either account puts its cost at :data:`RECALL_MIN_COST` or more.

    What it costs the job, not the rank: the job's ranks meet every step (the gradient all-reduce
    of every layout, the pipeline's sends and receives within a step), so a step ends when its
    slowest rank does; a step's loss is the largest injected time of any rank in it (never more
    than the step took), not the sum: ranks delayed in one step wait in parallel. In the pipeline
    layout (two stages, GPipe) this holds for time on the critical path: stage 1 is the heavier
    stage, so its ranks' extra work delays their replica's step whole, and a stall before a step
    on either stage delays it whole; extra forward work on stage 0 past its first micro-batch
    would overlap stage 1's work and count in full here (an upper bound; no case of the set does
    it), and time injected on both stages of one replica in one step would add along its chain
    (the max a lower bound; no case does it either). On a host whose ranks share CPU cores a
    sleeping or stopped rank lends its core to the others, which win some of it back: there too
    the account is an upper bound (on this machine, with other load, little is won back).
    """
    first = _period(timeline)
    per_rank = timeline.get("injected_ns")
    if first is None or (per_rank is None and not outside_held):
        return math.nan
    delays = (timeline.get("injected_run_delay_ns") or {}) if less_cpu_wait else {}

    def own_ns(rank: str, i: int) -> int:
        delay = delays.get(rank, [])
        return (per_rank or {})[rank][i] - (delay[i] if i < len(delay) else 0)

    ends = timeline["step_end_ns"]
    lost = 0
    for i in range(first, len(ends)):
        span = ends[i] - ends[i - 1]
        own = max((own_ns(r, i) for r, v in (per_rank or {}).items() if i < len(v)), default=0)
        held = _held_in(outside_held or [], ends[i - 1], ends[i])
        lost += min(max(own, held), span)
    return lost / 1e9


def warm_step_s(timeline: dict[str, Any], skip: int = 5) -> float:
    """Mean step time of the warm-up after its first ``skip`` steps (start-up), seconds; NaN if too short."""
    ends = [t for t in timeline["step_end_ns"] if t <= timeline["fault_start_ns"]][skip:]
    return (ends[-1] - ends[0]) / 1e9 / (len(ends) - 1) if len(ends) >= 3 else math.nan


def named(d: dict[str, Any]) -> set[int]:
    """The ranks a diagnosis names: its rank, else its ``ranks``."""
    return {int(d["rank"])} if d.get("rank") is not None else {int(r) for r in d.get("ranks") or []}


def judge(d: dict[str, Any], injected: set[int], fault_start_ns: int | None, window_ns: int) -> str:
    """``tp``, ``fp`` or ``none`` (a job-level diagnosis that is not a hit and blames no healthy rank)."""
    who = named(d)
    if who - injected:
        return "fp"
    if not who:
        return "none"
    during = fault_start_ns is not None and int(d["last_window_ns"]) + window_ns > fault_start_ns
    if not during:
        return "fp"
    if len(injected) == 1 and d.get("rank") is None:
        return "none"
    return "tp"


def duplicated(diagnoses: list[dict[str, Any]], window_ns: int, clean: bool) -> bool:
    """Issue 38's duplicate: two diagnoses of one job over overlapping windows that tell two stories
    of one fault: their causes differ, or one is job-level (``rank`` null) beside a rank-level one.

    On a clean job (``clean``) a job-level loss that names no rank and is backed by a real slowdown
    of the whole job (:func:`argus.diagnosis.host_slowed_the_job`, what ``assert_blames_no_one``
    of the tests allows a clean job) tells no story of a fault: it is in no pair.
    """
    told = [d for d in diagnoses if not (clean and host_slowed_the_job(d))]
    for i, a in enumerate(told):
        for b in told[i + 1 :]:
            overlap = (
                int(a["first_window_ns"]) < int(b["last_window_ns"]) + window_ns
                and int(b["first_window_ns"]) < int(a["last_window_ns"]) + window_ns
            )
            job_beside_rank = (a.get("rank") is None) != (b.get("rank") is None)
            if overlap and (a["cause"] != b["cause"] or job_beside_rank):
                return True
    return False


def detect_windows(diagnoses: list[dict[str, Any]], timeline: dict[str, Any], window_ns: int) -> float:
    """How many windows after the job's first analysed one its first diagnosis begins (its first
    window is 1; the job's first analysed window holds its first step end); NaN without one."""
    if not diagnoses or not timeline.get("step_end_ns"):
        return math.nan
    first_ns = int(timeline["step_end_ns"][0]) // window_ns * window_ns
    return 1 + (min(int(d["first_window_ns"]) for d in diagnoses) - first_ns) / window_ns


def accounted_s(d: dict[str, Any], window_ns: int) -> float:
    """The job time a diagnosis accounts for: ``evidence.lost_s``, else slowdown × its span."""
    lost = (d.get("evidence") or {}).get("lost_s")
    if isinstance(lost, int | float) and math.isfinite(lost):
        return max(float(lost), 0.0)
    span_s = (int(d["last_window_ns"]) + window_ns - int(d["first_window_ns"])) / 1e9
    return max(float(d.get("slowdown_pct") or 0.0), 0.0) / 100 * span_s


@dataclass
class Row:
    """One job's line of the table."""

    name: str
    layout: str
    fault: str
    ranks: str
    exit: int | None
    #: The fault's cost: its lost time over the fault period's wall time by the job's own account,
    #: else (a recording without one) by its twin.
    cost: float = math.nan
    #: For comparison: the cost against the clean twin (1 - twin's mean step / the faulty run's).
    twin_cost: float = math.nan
    #: Information only: the cost with each run's fault period against its own warm-up first
    #: (1 - (twin fault / twin warm-up) / (fault / warm-up)), less sensitive to load between runs.
    cost_vs_warmup: float = math.nan
    #: The job's lost time to the fault (:func:`injected_lost_s`; the twin-based one without it), s.
    lost_s: float = math.nan
    #: For comparison: the lost time against the twin's pace, s.
    twin_lost_s: float = math.nan
    #: For comparison: the job's own account in wall time, its wait for a CPU kept in, s.
    wall_lost_s: float = math.nan
    #: Where ``lost_s`` comes from: ``job`` (the job's own account, or its injector's), ``twin``.
    lost_by: str = ""
    #: The analyzer's own lost time of the job (its accounting, before any diagnosis), s.
    argus_lost_s: float = math.nan
    #: The load average when the run (and its twin) ended training.
    load: float = math.nan
    twin_load: float = math.nan
    explained_s: float = 0.0
    tp: int = 0
    fp: int = 0
    other: int = 0
    share: float = math.nan
    cause_ok: int = 0
    counted: bool = False
    onset_at_start: bool = False
    duplicate: bool = False
    #: The window its first diagnosis begins in, counting the job's first analysed window as 1.
    detect_window: float = math.nan
    diagnoses: str = ""


def score(
    runs: list[Run], found: dict[str, list[dict[str, Any]]], window_s: float
) -> tuple[list[Row], dict[str, float]]:
    """Score every run (see the module docstring); returns the table's rows and the figures."""
    window_ns = WindowGrid.from_seconds(window_s).length_ns
    by_name = {r.name: r for r in runs}
    cases = {c.name: c for c in CASES}
    rows: list[Row] = []
    for run in runs:
        faulty = run.scenario != "none"
        injected = set(run.ranks)
        row = Row(
            run.name,
            run.layout,
            run.scenario if faulty else "clean",
            ",".join(map(str, run.ranks)) or "-",
            run.returncode,
            argus_lost_s=run.argus_lost_s,
            load=run.load,
        )
        start = run.timeline["fault_start_ns"] if run.timeline else None
        diagnoses = found.get(run.job_id, [])
        hits: set[int] = set()
        for d in diagnoses:
            verdict = judge(d, injected, start if faulty else None, window_ns)
            if verdict == "tp":
                row.tp += 1
                hits |= named(d)
                row.cause_ok += d["cause"] == cases[run.case].cause
            elif verdict == "fp":
                row.fp += 1
            else:
                row.other += 1
            if verdict != "fp":
                row.explained_s += accounted_s(d, window_ns)
        row.diagnoses = "; ".join(_describe(d) for d in diagnoses) or "-"
        row.duplicate = duplicated(diagnoses, window_ns, clean=not faulty)
        row.onset_at_start = run.case in cases and cases[run.case].onset_at_start and faulty
        if run.timeline:
            row.detect_window = detect_windows(diagnoses, run.timeline, window_ns)
        twin = by_name.get(run.twin or f"{run.name}~twin") if faulty else None
        if faulty and twin is not None and run.timeline and twin.timeline:
            mine, theirs = pace(run.timeline), pace(twin.timeline)
            row.twin_cost = 1 - theirs.step_s / mine.step_s
            drift = theirs.step_s / warm_step_s(twin.timeline)
            row.cost_vs_warmup = 1 - drift / (mine.step_s / warm_step_s(run.timeline))
            row.twin_lost_s = max(mine.wall_s - mine.steps * theirs.step_s, 0.0)
            row.twin_load = twin.load
            row.cost, row.lost_s, row.lost_by = row.twin_cost, row.twin_lost_s, "twin"
        wall_cost = math.nan
        if faulty and run.timeline:
            own = injected_lost_s(run.timeline, run.outside_held)
            wall = pace(run.timeline).wall_s
            if math.isfinite(own) and wall > 0:
                row.cost, row.lost_s, row.lost_by = own / wall, own, "job"
                row.wall_lost_s = injected_lost_s(run.timeline, run.outside_held, less_cpu_wait=False)
                wall_cost = row.wall_lost_s / wall
        # Counted when either of the job's accounts reaches the threshold: leaving the wait for a
        # CPU out must not take a fault out of recall.
        row.counted = row.cost >= RECALL_MIN_COST or wall_cost >= RECALL_MIN_COST
        if faulty:
            row.share = len(hits & injected) / len(injected)
        rows.append(row)
    faulty_rows = [r for r in rows if r.fault != "clean"]
    tp = sum(r.tp for r in rows)
    fp = sum(r.fp for r in rows)
    counted = [r for r in faulty_rows if r.counted]
    onset = [r for r in counted if r.onset_at_start]
    lost = sum(r.lost_s for r in faulty_rows if math.isfinite(r.lost_s))
    unexplained = sum(r.lost_s - min(r.explained_s, r.lost_s) for r in faulty_rows if math.isfinite(r.lost_s))
    wall_lost = sum(r.wall_lost_s for r in faulty_rows if math.isfinite(r.wall_lost_s))
    wall_unexplained = sum(
        r.wall_lost_s - min(r.explained_s, r.wall_lost_s) for r in faulty_rows if math.isfinite(r.wall_lost_s)
    )
    twin_lost = sum(r.twin_lost_s for r in faulty_rows if math.isfinite(r.twin_lost_s))
    twin_unexplained = sum(
        r.twin_lost_s - min(r.explained_s, r.twin_lost_s) for r in faulty_rows if math.isfinite(r.twin_lost_s)
    )
    figures = {
        "precision": tp / (tp + fp) if tp + fp else math.nan,
        "recall": statistics.fmean(r.share for r in counted) if counted else math.nan,
        "cause_accuracy": sum(r.cause_ok for r in rows) / tp if tp else math.nan,
        "unexplained_loss_pct": 100 * unexplained / lost if lost > 0 else math.nan,
        "duplicate_diagnoses": sum(r.duplicate for r in rows),
        "onset_at_start_recall": statistics.fmean(r.share for r in onset) if onset else math.nan,
        "onset_detected_by_window_3": sum(r.detect_window <= 3 for r in onset),
        "onset_counted": len(onset),
        "jobs": len(rows),
        "tp": tp,
        "fp": fp,
        "fp_on_clean_jobs": sum(r.fp for r in rows if r.fault == "clean"),
        "faults_counted": len(counted),
        "failed_jobs": sum(1 for r in rows if r.exit != 0),
        "lost_s": lost,
        "lost_by_job": sum(1 for r in faulty_rows if r.lost_by == "job"),
        "faulty_jobs": len(faulty_rows),
        "twin_lost_s": twin_lost,
        "twin_unexplained_loss_pct": 100 * twin_unexplained / twin_lost if twin_lost > 0 else math.nan,
        "wall_unexplained_loss_pct": 100 * wall_unexplained / wall_lost if wall_lost > 0 else math.nan,
        "argus_lost_s": sum(r.argus_lost_s for r in faulty_rows if math.isfinite(r.argus_lost_s)),
        "explained_s": sum(min(r.explained_s, r.lost_s) for r in faulty_rows if math.isfinite(r.lost_s)),
    }
    return rows, figures


def _describe(d: dict[str, Any]) -> str:
    who = (
        f"r{d['rank']}"
        if d.get("rank") is not None
        else "job[" + ",".join(map(str, d.get("ranks") or [])) + "]"
    )
    lost = (d.get("evidence") or {}).get("lost_s")
    extra = f" lost {lost:.1f}s" if isinstance(lost, int | float) else ""
    return f"{who} {d['cause']} {float(d.get('slowdown_pct') or 0):.0f}%{extra}"


def _load(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "?"


def report(rows: list[Row], figures: dict[str, float]) -> None:
    """The per-job table, then the summary lines (the figures last)."""
    print(
        f"{'job':24} {'lay':9} {'fault':11} {'ranks':6} {'exit':>4} {'cost%':>6} {'twin%':>6} {'warm%':>6} "
        f"{'lost_s':>6} {'by':>4} {'twin_s':>6} "
        f"{'argus_s':>7} {'expl_s':>6} {'load':>9} {'TP':>2} {'FP':>2} {'oth':>3} {'named':>5} {'cause':>5} "
        f"{'win':>3} {'dup':>3}  "
        "diagnoses"
    )
    for r in rows:
        cost = f"{100 * r.cost:6.1f}" if math.isfinite(r.cost) else f"{'':6}"
        twin_cost = f"{100 * r.twin_cost:6.1f}" if math.isfinite(r.twin_cost) else f"{'':6}"
        twin_lost = f"{r.twin_lost_s:6.1f}" if math.isfinite(r.twin_lost_s) else f"{'':6}"
        warm = f"{100 * r.cost_vs_warmup:6.1f}" if math.isfinite(r.cost_vs_warmup) else f"{'':6}"
        lost = f"{r.lost_s:6.1f}" if math.isfinite(r.lost_s) else f"{'':6}"
        argus = f"{r.argus_lost_s:7.1f}" if math.isfinite(r.argus_lost_s) else f"{'':7}"
        load = _load(r.load) + (f"/{_load(r.twin_load)}" if math.isfinite(r.twin_load) else "")
        share = f"{r.share:5.2f}" if math.isfinite(r.share) else f"{'':5}"
        cause = f"{r.cause_ok}/{r.tp}" if r.tp else ""
        mark = "" if r.counted or r.fault == "clean" else " (cost < 10 %: not in recall)"
        win = f"{r.detect_window:3.0f}" if math.isfinite(r.detect_window) else f"{'':3}"
        dup = "dup" if r.duplicate else ""
        print(
            f"{r.name:24} {r.layout:9} {r.fault:11} {r.ranks:6} {r.exit if r.exit is not None else '':>4} "
            f"{cost} {twin_cost} {warm} {lost} {r.lost_by:>4} {twin_lost} {argus} {r.explained_s:6.1f} "
            f"{load:>9} {r.tp:>2} {r.fp:>2} {r.other:>3} "
            f"{share} {cause:>5} "
            f"{win} {dup:>3}  "
            f"{r.diagnoses}{mark}"
        )
    f = figures
    print(
        f"tp={f['tp']} fp={f['fp']} fp_on_clean_jobs={f['fp_on_clean_jobs']} "
        f"faults_counted={f['faults_counted']} failed_jobs={f['failed_jobs']} lost_s={f['lost_s']:.1f} "
        f"explained_s={f['explained_s']:.1f} argus_lost_s={f['argus_lost_s']:.1f} "
        f"lost_by_job={f['lost_by_job']}/{f['faulty_jobs']} twin_lost_s={f['twin_lost_s']:.1f} "
        f"twin_unexplained_loss_pct={f['twin_unexplained_loss_pct']:.1f} "
        f"wall_unexplained_loss_pct={f['wall_unexplained_loss_pct']:.1f} "
        f"onset_detected_by_window_3={f['onset_detected_by_window_3']}/{f['onset_counted']}"
    )
    print(
        f"precision={f['precision']:.4f} recall={f['recall']:.4f} cause_accuracy={f['cause_accuracy']:.4f} "
        f"unexplained_loss_pct={f['unexplained_loss_pct']:.1f} "
        f"duplicate_diagnoses={f['duplicate_diagnoses']} "
        f"onset_at_start_recall={f['onset_at_start_recall']:.4f} jobs={f['jobs']}"
    )


# --- main -----------------------------------------------------------------------------------------


def _labels(
    runs: list[Run], found: dict[str, list[dict[str, Any]]], window_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    return {
        "window_s": window_s,
        "warmup_s": args.warmup_s,
        "train_s": args.train_s,
        "cases": [asdict(c) for c in CASES],
        "runs": [asdict(r) for r in runs],
        "live_diagnoses": found,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="keep the recording (store and labels) in DIR")
    parser.add_argument("--rescore", metavar="DIR", help="score a kept recording instead of running jobs")
    parser.add_argument(
        "--stored", action="store_true", help="--rescore: the live diagnoses, not a new analysis"
    )
    parser.add_argument("--only", metavar="NAME,...", help="only these cases (and their twins)")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S, help="healthy training before the fault")
    parser.add_argument("--train-s", type=float, default=TRAIN_S, help="training per job, warm-up included")
    args = parser.parse_args()
    console = Console(stderr=True, soft_wrap=True)
    if args.rescore:
        kept = Path(args.rescore)
        labels = json.loads((kept / "labels.json").read_text())
        runs = [Run(**r) for r in labels["runs"]]
        window_s = float(labels["window_s"])
        t0 = time.monotonic()
        found = labels["live_diagnoses"] if args.stored else reanalyse(kept, runs, window_s)
        console.print(
            f"{'scored' if args.stored else 're-analysed'} {len(runs)} jobs in {time.monotonic() - t0:.1f} s"
        )
    else:
        cases = CASES
        if args.only:
            wanted = set(args.only.split(","))
            cases = tuple(c for c in CASES if c.name in wanted)
            if unknown := wanted - {c.name for c in cases}:
                parser.error(f"unknown cases {sorted(unknown)}; known: {[c.name for c in CASES]}")
        work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="argus-live-bench-"))
        if args.keep and (work / "store").exists():
            parser.error(f"{work} already holds a recording")
        work.mkdir(parents=True, exist_ok=True)
        load_start = os.getloadavg()[0]
        tag = time.strftime("%Y%m%d-%H%M%S")
        runs, found = record(schedule(cases, tag, args.warmup_s, args.train_s), work, console)
        window_s = WINDOW_S
        console.print(f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
        if args.keep:
            (work / "labels.json").write_text(json.dumps(_labels(runs, found, window_s, args), indent=1))
            console.print(f"kept: {work} (re-score: python bench/detection_live.py --rescore {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    rows, figures = score(runs, found, window_s)
    report(rows, figures)


if __name__ == "__main__":
    main()
