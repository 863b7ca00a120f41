"""Overhead of the probe + node agent on real DDP jobs: arms interleaved, separate processes.

CPU (default), the main figure: the `argus demo` training job (``argus.demo.job``:
the TinyLM transformer on synthetic tokens, a DataLoader, DDP over gloo with
default buckets, one thread per rank), 4 ranks under torchrun. Arm ``plain``
runs it as is; arm ``argus`` under `argus run` (probe in every rank, one node
agent streaming to an acknowledge-only gRPC collector in this process, as if
the collector were on another machine). Runs alternate plain/argus, argus/plain,
...; a pair's ratio is argus/plain, the figure the median of ``--pairs`` ratios
with a bootstrap 95 % interval. The full stack (a local `argus server` with
chDB and the analyzer on this machine) is measured in separate pairs.

Secondary, the worst case (``micro_*``): a tiny MLP with ``bucket_cap_mb=0.1``
(several DDP buckets per sub-ms step, so the per-bucket comm-hook cost shows):
``--micro-pairs`` process pairs, and ``--inprocess-pairs`` pairs of ``--block``
steps inside one probed job that alternate step by step between a DDP copy on
DDP's built-in C++ all-reduce with the probe switched off and the probed model
(the probe's hot-path cost with the machine's load identical for both arms).

``--cuda``: one GPU, NCCL, a model launching a few hundred kernels per step,
three arms: ``plain``, ``cupti_off`` (probe + agent, ``ARGUS_CUPTI=0``) and
``argus`` (CUPTI capture on, duty-cycled; ``--cupti-duty`` sets
``ARGUS_CUPTI_DUTY``). Each run measures ``--measure-s`` seconds (whole duty
periods, so every run holds the same share of capture). ``cupti_slice_ratio``
compares, inside the ``argus`` runs, the steps that ended while CUPTI captured
with those that did not: the cost of capture while it is on.

``--cuda --capture always`` (issue 11) captures every kernel (``ARGUS_CUPTI_DUTY=always``)
and adds the capture checks, each from separate runs (CUPTI has one subscriber):
``kernels_per_step`` of the argus runs (kernel counts of their ``kernel_summaries``
over their steps) against ``profiler_kernels_per_step``, a ``torch.profiler`` run of the
same deterministic job (``kernel_count_ratio``, goal within 1 %); ``dropped_records``,
the records the argus runs' probes lost (goal 0 at the default buffer settings); and a
CUDA-graph job (the same model captured whole into one ``torch.cuda.CUDAGraph`` and
replayed) whose graph-launched kernels per step (``graph_kernels_per_step``) are
compared with a profiler run of it (``graph_kernel_count_ratio``). It runs unattended
on one GPU in about 5-7 minutes.

Stack captures (issue 15), CPU: ``--capture-pairs`` pairs of ``plain`` and ``stacks``, the
``argus`` arm with rank 0's stacks captured (py-spy, 3 s) every 8 s, asked for by the
acknowledge-only collector on its acks as the analyzer would. ``capture_step_ratio`` compares rank
0's steps that overlapped a capture with its other steps; ``outside_capture_ratio`` (with
``outside_ci95_low``/``high``) those other steps with the plain run of the same pair: the cost of
Argus outside a capture, which should match ``step_time_ratio``.

``--frameworks`` (issue 43; needs ``pip install -e '.[frameworks]'``): jobs of the frameworks people
train with, attached with no code change, each ``--framework-pairs`` pairs of ``plain`` and ``argus``
run back to back (the jobs' order rotating, the arms' order alternating): a PyTorch Lightning
``Trainer(strategy="ddp")`` job under Lightning's own launcher and a Hugging Face ``Trainer`` job under
torchrun (``examples/frameworks/``), and the demo job beside them. The node agent runs with its
collector unreachable (it spools): the figures are the node's own cost. Each run's figure is rank 0's
mean step over ``--framework-steps`` steps after ``--framework-warmup``, from the job's own timeline
(``JOB_TIMELINE``), except the demo's: its steps are a third of the frameworks' (about 37 ms on 4 CPU
ranks), so it measures ``--framework-demo-steps`` steps (default 200, about 7.5 s: what 60 Lightning
steps take) after its warm-up; 60 demo steps (2.2 s) read anywhere from 0.81 to 1.09 on an idle
machine. Progress lines add the node agent's CPU per probed run (% of one core; the demo's also its
probes' shipper threads, ``bench/host_cpu.py`` has the whole account); detail lines give each
job's pairs, a bootstrap 95 % interval and the median-step ratio; the last line is
``lightning_step_ratio=… hf_step_ratio=… demo_step_ratio=… pairs=… failed_runs=… load_avg=START/END``.

A run's figure is rank 0's mean step time over its measured steps (after
``--warmup``): throughput, so that costs paid once a second (the shipper thread)
count. ``cpu_ratio`` compares the CPU time per step of all ranks together
(training, probe and gloo threads), a figure the machine's load disturbs less;
``agent_cpu_pct`` is the node agent's CPU use during the probed runs (% of one
core). Progress goes to stdout; the last line holds every figure::

    step_time_ratio=… ci95_low=… ci95_high=… pairs=… full_stack_ratio=… micro_ratio=…
    micro_inprocess_ratio=… cpu_ratio=… agent_cpu_pct=… capture_step_ratio=… outside_capture_ratio=…
    outside_ci95_low=… outside_ci95_high=… captured_steps=… failed_runs=… load_avg=START/END
    (--cuda adds cupti_off_ratio=… cupti_slice_ratio=… captured_share=… cupti=… kernel_summary_rows=…;
     --capture always adds kernels_per_step=… profiler_kernels_per_step=… kernel_count_ratio=…
     dropped_records=… graph_kernels_per_step=… graph_profiler_kernels_per_step=…
     graph_kernel_count_ratio=…)

    python bench/overhead.py [--pairs 15] [--full-stack-pairs 5] [--micro-pairs 5]
    python bench/overhead.py --cuda --full-stack-pairs 0      # about 4-5 minutes on one GPU
    python bench/overhead.py --cuda --capture always          # issue 11's check, about 5-7 minutes
    python bench/overhead.py --frameworks [--framework-pairs 3]  # about 4 minutes a pair (2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
#: The framework jobs of ``--frameworks`` (the optional extra ``frameworks``).
FRAMEWORK_JOBS = ROOT / "examples" / "frameworks"
FRAMEWORK_KINDS = ["lightning", "hf", "demo"]


# --- the training jobs (run by torchrun as `overhead.py --worker`) -------------------------------


@dataclass
class Job:
    """One training job: a model to wrap in DDP, its DDP options, batches and a step."""

    model: Any
    ddp_kwargs: dict[str, Any]
    batches: Iterator[Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Any], Any]


def build_job(kind: str, device: Any) -> Job:
    """``demo`` (the argus demo job), ``micro`` (tiny MLP, small buckets) or ``gpu``."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    if kind == "demo":
        from argus.demo.job import Fault, TinyLM, Tokens, parse_args

        d = parse_args([])
        fault = Fault("none", frozenset(), 0)
        model: nn.Module = TinyLM(d.vocab, d.dim, fault, d.compute_repeat)
        data = Tokens(d.batch_size * 64, d.seq_len, d.vocab, fault, d.sample_delay_s)
        loader = DataLoader(data, batch_size=d.batch_size, shuffle=True, drop_last=True)
        ce = nn.CrossEntropyLoss()

        def loss(out: Any, y: Any) -> Any:
            return ce(out.reshape(-1, d.vocab), y.reshape(-1))

        return Job(model, {}, _forever(loader), loss, lambda p: torch.optim.AdamW(p, lr=1e-3))
    g = torch.Generator().manual_seed(rank)
    if kind in ("gpu", "gpu_graph"):
        # ~12 blocks of (LayerNorm, Linear, GELU): a few hundred kernels per step.
        width, depth, batch, dim_in = 1024, 12, 256, 256
        layers: list[nn.Module] = [nn.Linear(dim_in, width)]
        for _ in range(depth):
            layers += [nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()]
        layers.append(nn.Linear(width, 10))
        model = nn.Sequential(*layers).to(device)
        kwargs: dict[str, Any] = {"device_ids": [device.index]}
    else:
        width, batch, dim_in = 256, 32, 128
        model = nn.Sequential(
            nn.Linear(dim_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
        )
        kwargs = {"bucket_cap_mb": 0.1}
    n = batch * 64
    tensors = TensorDataset(torch.randn(n, dim_in, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader: Any = DataLoader(tensors, batch_size=batch, shuffle=False, pin_memory=kind != "micro")
    return Job(model, kwargs, _forever(loader), nn.CrossEntropyLoss(), lambda p: torch.optim.SGD(p, lr=0.01))


def _forever(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def graphed_step(job: Job, device: Any) -> Callable[[], None]:
    """One training step of ``job``'s model captured whole into a CUDA graph; the callable replays it.

    PyTorch's whole-network capture: static input and target tensors, a few warm-up
    iterations on a side stream, then forward, backward and optimizer step in one graph.
    """
    import torch

    model, opt = job.model, job.optimizer(job.model.parameters())
    xb, yb = next(job.batches)
    static_x, static_y = xb.to(device), yb.to(device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            job.loss(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        job.loss(model(static_x), static_y).backward()
        opt.step()

    def step() -> None:
        x, y = next(job.batches)
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y, non_blocking=True)
        graph.replay()

    return step


def profiled_kernels_per_step(step: Callable[[], None], steps: int) -> float:
    """Kernels per step that ``torch.profiler`` records over ``steps`` steps (its trace's kernel events)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return sum(1 for e in events if e.get("cat") == "kernel") / steps


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from argus.demo.job import shutdown  # before init_process_group: see its docstring

    torch.set_num_threads(1)
    dist.init_process_group("nccl" if args.job in ("gpu", "gpu_graph") else "gloo")
    measure(args)  # its models (and DDP's reducers, which hold the group) are gone when it returns
    shutdown()


def measure(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = args.job in ("gpu", "gpu_graph")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    job = build_job(args.job, device)
    probe = _probe()
    if args.job == "gpu_graph":
        # One GPU, no DDP (a graph replay is not a DDP step): the probe is told of each step.
        replay = graphed_step(job, device)

        def graph_step() -> None:
            replay()
            if probe is not None:
                probe.mark_step()

        graph_run(args, graph_step, probe)
        return
    ddp = DistributedDataParallel(job.model, **job.ddp_kwargs)
    opt = job.optimizer(ddp.parameters())

    def capturing() -> bool:
        source = probe.gpu.source if probe is not None and probe.gpu is not None else None
        return bool(getattr(source, "capturing", False))

    def one_step(model: Any, opt: Any) -> None:
        xb, yb = next(job.batches)
        x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        job.loss(model(x), y).backward()
        opt.step()

    ends_ns: list[int] = []  # each measured step's end, ns since the epoch (stack captures)

    def train(model: Any, opt: Any, steps: int = 0, seconds: float = 0.0) -> tuple[list[float], list[bool]]:
        times: list[float] = []
        flags: list[bool] = []
        ends_ns.clear()
        t_start = t_prev = time.perf_counter()
        while (steps and len(times) < steps) or (seconds and t_prev - t_start < seconds):
            one_step(model, opt)
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            times.append(t - t_prev)
            flags.append(capturing())
            ends_ns.append(time.time_ns())
            t_prev = t
        return times, flags

    if args.profile_steps:
        train(ddp, opt, steps=args.warmup)
        per_step = profiled_kernels_per_step(lambda: one_step(ddp, opt), args.profile_steps)
        if rank == 0:
            Path(args.out).write_text(json.dumps({"kernels_per_step": per_step}))
        return
    if not args.inprocess_pairs:
        train(ddp, opt, steps=args.warmup)
        cpu0, threads0, wall0 = time.process_time(), argus_thread_cpu(), time.time()
        times, flags = train(ddp, opt, steps=args.steps, seconds=args.measure_s)
        threads1, wall1 = argus_thread_cpu(), time.time()
        cpu_per_step = (time.process_time() - cpu0) / max(len(times), 1)
        # Per thread: (CPU ns, timeslices) spent during the measured steps.
        spent = {
            k: [b - a for a, b in zip(threads0[k], v, strict=True)]
            for k, v in threads1.items()
            if k in threads0
        }
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, (cpu_per_step, spent))
        if rank == 0:
            doc = {
                "times": times,
                "capturing": flags,
                "cpu_per_step": sum(c for c, _ in every),
                "steps_total": args.warmup + len(times),
                "ends_ns": ends_ns,
                "threads": [t for _, t in every],
                "measured_wall": [wall0, wall1],
            }
            Path(args.out).write_text(json.dumps(doc))
    else:
        # Same processes, alternating step by step: A = a second DDP copy on DDP's built-in C++
        # all-reduce with the probe switched off, B = the probed model. Isolates the hot-path cost.
        import copy

        assert probe is not None, "run the in-process mode under argus run"
        plain = DistributedDataParallel(copy.deepcopy(job.model), **job.ddp_kwargs)
        plain.__dict__["_argus_builtin_hook"] = True  # keep DDP's own C++ all-reduce
        arms = {"A": (plain, job.optimizer(plain.parameters()), False), "B": (ddp, opt, True)}
        for arm in ("B", "A"):
            model_, opt_, active = arms[arm]
            probe.active = active
            train(model_, opt_, steps=args.warmup)
        ratios = []
        for i in range(args.inprocess_pairs):
            got: dict[str, list[float]] = {"A": [], "B": []}
            for k in range(2 * args.block):
                arm = "AB"[(k + i) % 2]
                model_, opt_, active = arms[arm]
                probe.active = active
                got[arm] += train(model_, opt_, steps=1)[0]
            ratios.append(statistics.median(got["B"]) / statistics.median(got["A"]))
        probe.active = True
        if rank == 0:
            Path(args.out).write_text(json.dumps({"ratios": ratios}))


def graph_run(args: argparse.Namespace, step: Callable[[], None], probe: Any) -> None:
    """The CUDA-graph job: profile it (``--profile-steps``), or replay it and count the replays."""
    import torch

    for _ in range(args.warmup):
        step()
    if args.profile_steps:
        doc: dict[str, Any] = {"kernels_per_step": profiled_kernels_per_step(step, args.profile_steps)}
    else:
        times: list[float] = []
        t_start = t_prev = time.perf_counter()
        while (args.steps and len(times) < args.steps) or (
            args.measure_s and t_prev - t_start < args.measure_s
        ):
            step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            times.append(t - t_prev)
            t_prev = t
        doc = {"times": times, "capturing": [], "cpu_per_step": float("nan"), "steps_total": len(times)}
        doc["replays"] = args.warmup + len(times)
    Path(args.out).write_text(json.dumps(doc))


def thread_cpu(tid: int, pid: int | str = "self") -> tuple[int, int]:
    """``(CPU ns, timeslices)`` of thread ``tid`` of process ``pid`` so far, from the scheduler's
    statistics (``/proc/PID/task/TID/schedstat``: time on a CPU in ns, run-queue wait, timeslices
    run); ``(0, 0)`` when the thread is gone. A timeslice begins at each wake-up or preemption."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return 0, 0


def _argus_run_pid() -> int | None:
    """The `argus run` process this one runs under (an ancestor), or None."""
    pid = os.getppid()
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        if b"argus.cli" in argv and b"run" in argv:
            return pid
        pid = int(stat[1])
    return None


def argus_thread_cpu() -> dict[str, tuple[int, int]]:
    """:func:`thread_cpu` of this process's main thread (``main``: training and its hooks), of the
    probe's shipper thread (``shipper``; absent without a probe) and, on rank 0, every thread of the
    `argus run` process the job runs under (``run``, summed; absent without one)."""
    out = {"main": thread_cpu(threading.main_thread().native_id or 0)}
    for t in threading.enumerate():
        if t.name == "argus-probe" and t.native_id is not None:
            out["shipper"] = thread_cpu(t.native_id)
    run_pid = _argus_run_pid() if os.environ.get("RANK", "0") == "0" else None
    if run_pid is not None:
        with contextlib.suppress(OSError):
            tids = os.listdir(f"/proc/{run_pid}/task")
            spent = [thread_cpu(int(tid), run_pid) for tid in tids]
            out["run"] = (sum(ns for ns, _ in spent), sum(n for _, n in spent))
    return out


def _probe() -> Any:
    if "argus.agent" not in sys.modules:
        return None
    import argus.agent

    return argus.agent._probe


# --- an acknowledge-only collector ----------------------------------------------------------------

#: Arm ``stacks``: a capture of rank 0 this often, seconds, each sampling this long, ms (the
#: analyzer's own capture length, argus.analyzer.stacks).
CAPTURE_EVERY_S = 8.0
CAPTURE_MS = 3000


class AckCollector:
    """``argus.v1.Collector`` that acknowledges every batch and counts rows per table.

    Per job it also sums what the capture checks need: kernels in ``kernel_summaries``
    (``count`` of kind ``kernel``; those with a ``graph_id`` apart) and dropped events
    (``host_samples.dropped_events`` and the batches' ``dropped_events``).
    """

    def __init__(self) -> None:
        import grpc

        from argus.proto import collector_pb2, collector_pb2_grpc

        pb = collector_pb2
        self.rows: dict[int, int] = {}
        self.kernels: dict[str, int] = {}
        self.graph_kernels: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        #: Jobs whose rank 0 is asked for a stack capture every CAPTURE_EVERY_S (arm ``stacks``).
        self.capture_jobs: set[str] = set()
        #: Per job, the (start, end) ns of the stack captures of rank 0 its agent sent.
        self.captures: dict[str, set[tuple[int, int]]] = {}
        asked: dict[str, float] = {}
        lock = threading.Lock()
        outer = self

        def requests(job: str) -> list[Any]:
            """A capture request of rank 0 when ``job``'s last one is CAPTURE_EVERY_S old."""
            now = time.monotonic()
            if job not in outer.capture_jobs or now - asked.get(job, 0.0) < CAPTURE_EVERY_S:
                return []
            asked[job] = now
            capture_id = f"bench-{job}-{int(now * 1e3)}"
            return [pb.StackCapture(capture_id=capture_id, job_id=job, ranks=[0], duration_ms=CAPTURE_MS)]

        class Servicer(collector_pb2_grpc.CollectorServicer):
            def Stream(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
                import pyarrow as pa
                import pyarrow.compute as pc

                for batch in request_iterator:
                    data = pa.ipc.open_stream(batch.arrow_ipc).read_all()
                    n = data.num_rows
                    job = batch.job_id
                    with lock:
                        outer.rows[batch.table] = outer.rows.get(batch.table, 0) + n
                        outer.dropped[job] = outer.dropped.get(job, 0) + batch.dropped_events
                        if batch.table == pb.KERNEL_SUMMARIES and n:
                            kernel = pc.equal(data["kind"], "kernel")
                            counts = data["count"].filter(kernel)
                            graphs = data["count"].filter(pc.and_(kernel, pc.greater(data["graph_id"], 0)))
                            outer.kernels[job] = outer.kernels.get(job, 0) + (pc.sum(counts).as_py() or 0)
                            extra = pc.sum(graphs).as_py() or 0
                            outer.graph_kernels[job] = outer.graph_kernels.get(job, 0) + extra
                        elif batch.table == pb.HOST_SAMPLES and n:
                            extra = pc.sum(data["dropped_events"]).as_py() or 0
                            outer.dropped[job] = outer.dropped.get(job, 0) + extra
                        elif batch.table == pb.STACKS and n:
                            columns = (data[c].to_pylist() for c in ("rank", "time_ns", "duration_ns"))
                            for rank, t, d in zip(*columns, strict=True):
                                if rank == 0:
                                    outer.captures.setdefault(job, set()).add((t, t + d))
                        asks = requests(job)
                    yield pb.Ack(seq=batch.seq, status=pb.Ack.STORED, rows=n, stack_captures=asks)

            def Clock(self, request: Any, context: Any) -> Any:  # noqa: N802
                return pb.ClockReply(agent_send_ns=request.agent_send_ns, server_ns=time.time_ns())

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        collector_pb2_grpc.add_CollectorServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


# --- orchestration --------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured run: rank 0's step times and whether CUPTI captured at each step's end."""

    times: list[float]
    capturing: list[bool] = field(default_factory=list)
    #: CPU seconds per measured step, summed over the ranks (their training, probe and gloo threads).
    cpu_per_step: float = float("nan")
    #: The node agent's CPU seconds per second of the run (0 for plain runs).
    agent_cpu: float = 0.0
    job_id: str = ""
    #: Training steps the run took (warm-up included): all of them ran under capture when always on.
    steps_total: int = 0
    #: Each measured step's end, ns since the epoch.
    ends_ns: list[int] = field(default_factory=list)
    #: The probes' shipper threads' CPU seconds per second of the measured steps, summed over the ranks.
    shipper_cpu: float = 0.0

    def mark_captures(self, captures: set[tuple[int, int]]) -> None:
        """Flag (in ``capturing``) the steps that overlap one of ``captures`` ((start, end) ns)."""
        spans = sorted(captures)
        self.capturing = [
            any(end - int(t * 1e9) <= hi and end >= lo for lo, hi in spans)
            for t, end in zip(self.times, self.ends_ns, strict=True)
        ]

    def outside(self) -> float:
        """Mean step time of the steps not flagged in ``capturing``, s."""
        off = [t for t, c in zip(self.times, self.capturing, strict=True) if not c]
        return statistics.fmean(off) if off else float("nan")

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    def slice_ratio(self) -> float | None:
        """Mean step time while capturing / while not; None without both kinds of step."""
        on = [t for t, c in zip(self.times, self.capturing, strict=True) if c]
        off = [t for t, c in zip(self.times, self.capturing, strict=True) if not c]
        if len(on) < 5 or len(off) < 5:
            return None
        return statistics.fmean(on) / statistics.fmean(off)


def shipper_cpu(doc: dict[str, Any]) -> float:
    """The shipper threads' CPU seconds per second of a worker's measured steps (0 without probes)."""
    t0, t1 = doc.get("measured_wall", (0.0, 0.0))
    spent = sum(r.get("shipper", (0, 0))[0] for r in doc.get("threads", []))
    return spent / 1e9 / (t1 - t0) if t1 > t0 else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.t0 = time.monotonic()
        # Our own environment, without the caller's Argus settings; arms add theirs.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGUS_", "TORCHELASTIC_"))}
        self.env.update(XDG_STATE_HOME=str(work / "state"), OMP_NUM_THREADS="1")
        self.agents: list[subprocess.Popen[bytes]] = []
        self.agent_pids: dict[str, int] = {}
        self.runs = 0
        self.failures: list[str] = []
        self.run_s: list[float] = []
        #: The acknowledge-only collector (arm ``stacks`` asks it for captures).
        self.collector: AckCollector | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def arm_env(self, arm: str) -> dict[str, str]:
        env = dict(self.env)
        if arm == "cupti_off":
            env["ARGUS_CUPTI"] = "0"
        elif arm == "argus" and self.args.capture == "always":
            env["ARGUS_CUPTI_DUTY"] = "always"
        elif arm == "argus" and self.args.cupti_duty:
            env["ARGUS_CUPTI_DUTY"] = self.args.cupti_duty
        return env

    def job(self, kind: str, nproc: int, extra: list[str]) -> tuple[list[str], Path]:
        out = self.work / f"times-{self.runs}.json"
        self.runs += 1
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += [__file__, "--worker", "--job", kind, "--warmup", str(self.args.warmup), "--out", str(out)]
        return cmd + extra, out

    def start_agent(self, collector: str, name: str) -> str:
        sock = str(self.work / f"{name}.sock")
        cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", collector]
        cmd += ["--spool", str(self.work / f"spool-{name}"), "--window-s", "10"]
        log = (self.work / f"agent-{name}.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.agents.append(proc)
        self.agent_pids[sock] = proc.pid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(sock)
                    return sock
                except OSError:
                    time.sleep(0.1)
        raise RuntimeError(f"the node agent did not start; see {self.work}/agent-{name}.log")

    def launch(
        self,
        cmd: list[str],
        out: Path,
        arm: str,
        sock: str | None,
        job_id: str,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        import psutil

        agent = None
        if arm != "plain":
            assert sock is not None
            cmd = [sys.executable, "-m", "argus.cli", "run", "--socket", sock, "--job-id", job_id, "--", *cmd]
            agent = psutil.Process(self.agent_pids[sock])
        for attempt in range(3):
            t = time.monotonic()
            agent_cpu = sum(agent.cpu_times()[:2]) if agent is not None else 0.0
            proc = subprocess.run(
                cmd, env={**self.arm_env(arm), **(env or {})}, capture_output=True, text=True, timeout=900,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                wall = time.monotonic() - t
                self.run_s.append(wall)
                doc = dict(json.loads(out.read_text()))
                if agent is not None:
                    doc["agent_cpu"] = (sum(agent.cpu_times()[:2]) - agent_cpu) / wall
                return doc
            self.failures.append(f"{arm} run {job_id} attempt {attempt + 1}")
            print(
                f"overhead: a {arm} run failed ({proc.returncode}); stderr tail:\n{proc.stderr[-1500:]}",
                flush=True,
            )
        raise RuntimeError(f"run {job_id} ({arm}) failed three times")

    def run(self, kind: str, arm: str, sock: str | None, job_id: str) -> Run:
        """One run of ``arm``; arm ``stacks`` is ``argus`` with rank 0's stacks captured now and then
        (:data:`CAPTURE_EVERY_S`), its steps flagged in ``capturing`` when they overlap a capture."""
        nproc = 1 if kind.startswith("gpu") else self.args.ranks
        extra = ["--steps", str(self.args.steps), "--measure-s", str(self.args.measure_s)]
        cmd, out = self.job(kind, nproc, extra)
        if arm == "stacks" and self.collector is not None:
            self.collector.capture_jobs.add(job_id)
        got = self.launch(cmd, out, arm, sock, job_id)
        steps = int(got.get("replays", got.get("steps_total", 0)))
        run = Run(
            got["times"],
            got["capturing"],
            got["cpu_per_step"],
            got.get("agent_cpu", 0.0),
            job_id,
            steps,
            [int(t) for t in got.get("ends_ns", [])],
            shipper_cpu(got),
        )
        if arm == "stacks" and self.collector is not None:
            self.collector.capture_jobs.discard(job_id)
            time.sleep(2.0)  # the last capture's rows are shipped within the agent's flush
            run.mark_captures(self.collector.captures.get(job_id, set()))
        return run

    def framework_run(self, kind: str, arm: str, sock: str, job_id: str) -> Run:
        """One run of a framework job (``lightning``: its own launcher; ``hf``: torchrun) or of the demo
        job; rank 0's step times after ``--framework-warmup`` steps, from the job's own timeline."""
        if kind == "demo":
            extra = ["--steps", str(self.args.framework_demo_steps), "--measure-s", "0"]
            cmd, out = self.job("demo", self.args.ranks, extra)
            got = self.launch(cmd, out, arm, sock, job_id)
            return Run(
                got["times"], agent_cpu=got.get("agent_cpu", 0.0), job_id=job_id, shipper_cpu=shipper_cpu(got)
            )
        out = self.work / f"timeline-{self.runs}.json"
        self.runs += 1
        script = str(FRAMEWORK_JOBS / f"{kind}_job.py")
        if kind == "lightning":
            cmd = [sys.executable, script]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += [f"--nproc-per-node={self.args.ranks}", script]
        steps = self.args.framework_warmup + self.args.framework_steps
        env = {
            "JOB_STEPS": str(steps),
            "JOB_TIMELINE": str(out),
            "JOB_DEVICES": str(self.args.ranks),
            "JOB_OUT_DIR": str(self.work / f"job-{kind}"),
        }
        got = self.launch(cmd, out, arm, sock, job_id, env)
        ends = got["step_end_ns"][self.args.framework_warmup :]
        times = [(b - a) / 1e9 for a, b in itertools.pairwise(ends)]
        return Run(times, agent_cpu=got.get("agent_cpu", 0.0), job_id=job_id)

    def framework_rounds(self, sock: str, n: int) -> dict[str, list[dict[str, Run]]]:
        """``n`` rounds; in each, every job runs plain and under `argus run` back to back (the pair), the
        jobs' order rotating and the arms' order alternating round by round."""
        out: dict[str, list[dict[str, Run]]] = {kind: [] for kind in FRAMEWORK_KINDS}
        for i in range(n):
            kinds = FRAMEWORK_KINDS[i % 3 :] + FRAMEWORK_KINDS[: i % 3]
            for j, kind in enumerate(kinds):
                order = ["plain", "argus"] if (i + j) % 2 == 0 else ["argus", "plain"]
                got = {
                    arm: self.framework_run(kind, arm, sock, f"bench-fw-{kind}-{i}-{arm}") for arm in order
                }
                out[kind].append(got)
                plain, argus = got["plain"], got["argus"]
                print(
                    f"[frameworks] round {i + 1}/{n} {kind} ({self.elapsed():.0f} s, load "
                    f"{os.getloadavg()[0]:.1f}): plain {plain.mean * 1e3:.1f} ms (median "
                    f"{statistics.median(plain.times) * 1e3:.1f}), argus {argus.mean * 1e3:.1f} ms (median "
                    f"{statistics.median(argus.times) * 1e3:.1f}); argus/plain "
                    f"{argus.mean / plain.mean:.4f}; agent {argus.agent_cpu * 100:.1f} % of a core"
                    + (f", shippers {argus.shipper_cpu * 100:.2f} %" if kind == "demo" else ""),
                    flush=True,
                )
        return out

    def profile(self, kind: str, steps: int = 50) -> float:
        """Kernels per step of ``kind`` as ``torch.profiler`` counts them (a plain run, no Argus)."""
        cmd, out = self.job(kind, 1, ["--profile-steps", str(steps)])
        got = self.launch(cmd, out, "plain", None, f"bench-profile-{kind}")
        per_step = float(got["kernels_per_step"])
        print(f"[profiler] {kind}: {per_step:.2f} kernels per step ({steps} steps)", flush=True)
        return per_step

    def rounds(
        self, kind: str, arms: list[str], sock: str, n: int, label: str, budget_s: float = 0.0
    ) -> list[dict[str, Run]]:
        """``n`` rounds of every arm, the order rotating each round; stops early past ``budget_s``."""
        out: list[dict[str, Run]] = []
        for i in range(n):
            if budget_s and out:
                per_run = statistics.fmean(self.run_s[-len(arms) :])
                if self.elapsed() + len(arms) * per_run > budget_s:
                    print(f"[{label}] stopping after {len(out)} rounds: the time budget is spent", flush=True)
                    break
            order = arms[i % len(arms) :] + arms[: i % len(arms)]
            if len(arms) == 2 and i % 2:
                order = arms[::-1]
            got = {arm: self.run(kind, arm, sock, f"bench-{label}-{i}-{arm}") for arm in order}
            out.append(got)
            plain = got["plain"].mean
            parts = [
                f"{arm} {got[arm].mean * 1e3:.2f} ms ({got[arm].cpu_per_step * 1e3:.1f} ms CPU"
                + (
                    f"; shippers {got[arm].shipper_cpu * 100:.2f} % of a core)"
                    if got[arm].shipper_cpu
                    else ")"
                )
                for arm in arms
            ]
            ratios = [f"{arm}/plain {got[arm].mean / plain:.4f}" for arm in arms if arm != "plain"]
            print(
                f"[{label}] round {i + 1}/{n} ({self.elapsed():.0f} s): "
                f"{', '.join(parts)}; {', '.join(ratios)}",
                flush=True,
            )
        return out

    def inprocess(self, kind: str, sock: str) -> list[float]:
        extra = ["--inprocess-pairs", str(self.args.inprocess_pairs), "--block", str(self.args.block)]
        cmd, out = self.job(kind, self.args.ranks, extra)
        got = self.launch(cmd, out, "argus", sock, f"bench-inproc-{kind}")
        ratios = [float(r) for r in got["ratios"]]
        print(
            f"[in-process {kind}] {len(ratios)} block pairs ({self.elapsed():.0f} s): "
            + " ".join(f"{r:.3f}" for r in ratios),
            flush=True,
        )
        return ratios

    def close(self) -> None:
        for proc in self.agents:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_server(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    grpc_port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "argus.cli", "server", "--store", f"chdb://{work / 'data'}"]
    cmd += ["--grpc-listen", f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}"]
    out = (work / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "argus server: gRPC on" in (work / "server.log").read_text(errors="replace"):
            return proc, f"127.0.0.1:{grpc_port}"
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"argus server did not start:\n{(work / 'server.log').read_text()[-3000:]}")


def bootstrap_ci(ratios: list[float], rounds: int = 10_000) -> tuple[float, float]:
    import numpy as np

    if not ratios:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    a = np.asarray(ratios)
    medians = np.median(a[rng.integers(0, a.size, (rounds, a.size))], axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def median_or_nan(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratios_of(rounds: list[dict[str, Run]], arm: str) -> list[float]:
    return [r[arm].mean / r["plain"].mean for r in rounds]


def cupti_available() -> bool:
    """A libcupti the probe can load (native capture), or cupti-python (its fallback)."""
    from argus.agent.cupti_lib import find_libcupti

    if find_libcupti() is not None:
        return True
    try:
        from cupti import cupti  # noqa: F401
    except ImportError:
        return False
    return True


def capture_checks(checks: dict[str, Any], main_rounds: list[dict[str, Run]], collector: AckCollector) -> str:
    """``--capture always``'s figures (issue 11): kernels per step vs the profiler, drops, CUDA graphs."""
    argus_runs = [r["argus"] for r in main_rounds if r["argus"].steps_total]
    per_step = [collector.kernels.get(r.job_id, 0) / r.steps_total for r in argus_runs]
    kps = median_or_nan(per_step)
    graph: Run = checks["graph_run"]
    graph_kps = collector.graph_kernels.get(graph.job_id, 0) / graph.steps_total if graph.steps_total else 0.0
    dropped = sum(collector.dropped.get(r.job_id, 0) for r in [*argus_runs, graph])
    ratio = kps / checks["profiler"] if checks["profiler"] else float("nan")
    graph_ratio = graph_kps / checks["graph_profiler"] if checks["graph_profiler"] else float("nan")
    print(
        f"overhead: capture always: {kps:.2f} kernels per step captured, {checks['profiler']:.2f} by the "
        f"profiler (goal: within 1 %); {dropped} records dropped (goal 0); CUDA graph job: "
        f"{graph_kps:.2f} graph kernels per step captured, {checks['graph_profiler']:.2f} by the profiler",
        flush=True,
    )
    return (
        f" kernels_per_step={kps:.2f} profiler_kernels_per_step={checks['profiler']:.2f}"
        f" kernel_count_ratio={ratio:.4f} dropped_records={dropped}"
        f" graph_kernels_per_step={graph_kps:.2f}"
        f" graph_profiler_kernels_per_step={checks['graph_profiler']:.2f}"
        f" graph_kernel_count_ratio={graph_ratio:.4f}"
    )


def stack_capture_figures(rounds: list[dict[str, Run]]) -> str:
    """Issue 15's figures of the ``stacks`` arm: rank 0's steps during a capture against outside one
    (``capture_step_ratio``), and its steps outside captures against the plain run of the same pair
    (``outside_capture_ratio``, with a bootstrap 95 % interval)."""
    during = [s for r in rounds if (s := r["stacks"].slice_ratio()) is not None]
    outside = [r["stacks"].outside() / r["plain"].mean for r in rounds]
    lo, hi = bootstrap_ci(outside)
    flags = [c for r in rounds for c in r["stacks"].capturing]
    return (
        f" capture_step_ratio={median_or_nan(during):.4f} outside_capture_ratio={median_or_nan(outside):.4f}"
        f" outside_ci95_low={lo:.4f} outside_ci95_high={hi:.4f} captured_steps={sum(flags)}/{len(flags)}"
    )


def frameworks_main(args: argparse.Namespace) -> int:
    """``--frameworks``: the node's own cost on each job (agent running, collector unreachable)."""
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="argus-bench-fw-", dir="/tmp"))
    bench = Bench(args, work)
    print(
        f"overhead --frameworks: {args.ranks} ranks, {args.framework_pairs} pairs per job, "
        f"{args.framework_steps} measured steps after {args.framework_warmup}; node agent with its "
        f"collector unreachable (spooling); load average {load_start:.2f}; work dir {work}",
        flush=True,
    )
    try:
        sock = bench.start_agent(f"127.0.0.1:{free_port()}", "unreachable")
        rounds = bench.framework_rounds(sock, args.framework_pairs)
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    line = []
    for kind in FRAMEWORK_KINDS:
        ratios = ratios_of(rounds[kind], "argus")
        medians = [
            statistics.median(r["argus"].times) / statistics.median(r["plain"].times) for r in rounds[kind]
        ]
        lo, hi = bootstrap_ci(ratios)
        print(
            f"overhead --frameworks: {kind}: step_ratio {median_or_nan(ratios):.4f} (95 % interval "
            f"{lo:.4f}-{hi:.4f}; pairs {' '.join(f'{r:.3f}' for r in ratios)}); median-step ratio "
            f"{median_or_nan(medians):.4f}; plain step "
            f"{median_or_nan([r['plain'].mean * 1e3 for r in rounds[kind]]):.1f} ms",
            flush=True,
        )
        line.append(f"{kind}_step_ratio={median_or_nan(ratios):.4f}")
    pairs = min(len(r) for r in rounds.values())
    load = f"load_avg={load_start:.2f}/{os.getloadavg()[0]:.2f}"
    print(f"overhead: {bench.elapsed():.0f} s", flush=True)
    print(" ".join(line) + f" pairs={pairs} failed_runs={len(bench.failures)} {load}")
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", default="demo", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cuda", action="store_true", help="one GPU, NCCL, CUPTI capture on")
    p.add_argument("--pairs", type=int, default=None, help="rounds of every arm (default 15 CPU, 2 CUDA)")
    p.add_argument("--full-stack-pairs", type=int, default=None, help="pairs with a local argus server")
    p.add_argument("--micro-pairs", type=int, default=None, help="process pairs of the worst-case micro job")
    p.add_argument("--ranks", type=int, default=4, help="CPU world size (default 4)")
    p.add_argument("--steps", type=int, default=None, help="measured steps per run (CPU default 150)")
    p.add_argument("--measure-s", type=float, default=None, help="measured seconds per run (CUDA default 20)")
    p.add_argument("--warmup", type=int, default=20, help="steps before measuring")
    p.add_argument(
        "--inprocess-pairs", type=int, default=None, help="micro-job block pairs in one probed job (0: skip)"
    )
    p.add_argument("--block", type=int, default=25, help="steps per in-process block")
    p.add_argument(
        "--capture-pairs",
        type=int,
        default=None,
        help="pairs of plain and argus with rank 0's stacks captured every 8 s (CPU default 3; 0: skip)",
    )
    p.add_argument(
        "--cupti-duty", default="", help="ARGUS_CUPTI_DUTY for the argus arm (default: the probe's)"
    )
    p.add_argument(
        "--capture",
        choices=["duty", "always"],
        default="duty",
        help="CUDA: 'always' captures every kernel and adds issue 11's capture checks (profiler "
        "kernel counts, dropped records, a CUDA-graph job); default: the duty cycle",
    )
    p.add_argument(
        "--frameworks",
        action="store_true",
        help="the Lightning and Hugging Face Trainer jobs and the demo job, plain vs argus run, with the "
        "node agent's collector unreachable (needs the 'frameworks' extra)",
    )
    p.add_argument("--framework-pairs", type=int, default=3, help="--frameworks: pairs per job")
    p.add_argument("--framework-steps", type=int, default=60, help="--frameworks: measured steps per run")
    p.add_argument(
        "--framework-demo-steps",
        type=int,
        default=200,
        help="--frameworks: the demo's measured steps per run",
    )
    p.add_argument("--framework-warmup", type=int, default=10, help="--frameworks: steps before measuring")
    p.add_argument("--profile-steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--budget-s", type=float, default=None, help="start no round past this (CUDA default 300)")
    p.add_argument(
        "--arms", default="", help="main arms, comma-separated (default plain,argus; CUDA adds cupti_off)"
    )
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.worker:
        args.steps, args.measure_s = args.steps or 0, args.measure_s or 0.0
        worker(args)
        return 0
    if args.frameworks:
        return frameworks_main(args)
    cuda = args.cuda
    args.pairs = args.pairs or (2 if cuda else 15)
    args.full_stack_pairs = args.full_stack_pairs if args.full_stack_pairs is not None else (0 if cuda else 5)
    args.micro_pairs = args.micro_pairs if args.micro_pairs is not None else (0 if cuda else 5)
    args.inprocess_pairs = args.inprocess_pairs if args.inprocess_pairs is not None else (0 if cuda else 15)
    args.capture_pairs = args.capture_pairs if args.capture_pairs is not None else (0 if cuda else 3)
    args.measure_s = args.measure_s if args.measure_s is not None else (20.0 if cuda else 0.0)
    args.steps = args.steps if args.steps is not None else (0 if cuda else 150)
    budget = args.budget_s if args.budget_s is not None else (300.0 if cuda else 0.0)
    cupti = "n/a"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            print("overhead --cuda: no CUDA device visible", file=sys.stderr)
            return 2
        cupti = "on" if cupti_available() else "off"
        if cupti == "off":
            print(
                "overhead --cuda: no libcupti found and cupti-python is NOT installed (pip install "
                "cupti-python): CUPTI capture is off, the figure covers steps, phases, collectives "
                "and NVML only",
                flush=True,
            )
    if args.capture == "always" and not cuda:
        raise SystemExit("overhead: --capture always needs --cuda")
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="argus-bench-", dir="/tmp"))
    bench = Bench(args, work)
    collector = AckCollector()
    bench.collector = collector
    server = None
    main_rounds: list[dict[str, Run]] = []
    micro_rounds: list[dict[str, Run]] = []
    capture_rounds: list[dict[str, Run]] = []
    full_rounds: list[dict[str, Run]] = []
    inproc: list[float] = []
    arms: list[str] = []
    checks: dict[str, Any] = {}
    try:
        what = "cuda, 1 GPU, arms plain/cupti_off/argus" if cuda else f"cpu, {args.ranks} ranks, demo job"
        print(f"overhead: {what}; load average {load_start:.2f}; work dir {work}", flush=True)
        sock = bench.start_agent(collector.address, "ack")
        arms = (
            args.arms.split(",")
            if args.arms
            else ["plain", "cupti_off", "argus"]
            if cuda
            else ["plain", "argus"]
        )
        if "plain" not in arms or "argus" not in arms:
            raise SystemExit("overhead: --arms needs plain and argus")
        main_rounds = bench.rounds("gpu" if cuda else "demo", arms, sock, args.pairs, "main", budget)
        if cuda and args.capture == "always":
            # Separate runs: the profiler and the probe cannot both hold CUPTI in one process.
            checks["profiler"] = bench.profile("gpu")
            checks["graph_profiler"] = bench.profile("gpu_graph")
            checks["graph_run"] = bench.run("gpu_graph", "argus", sock, "bench-graph")
        if not cuda:
            if args.micro_pairs:
                micro_rounds = bench.rounds("micro", ["plain", "argus"], sock, args.micro_pairs, "micro")
            if args.inprocess_pairs:
                inproc = bench.inprocess("micro", sock)
            if args.capture_pairs:
                capture_rounds = bench.rounds("demo", ["plain", "stacks"], sock, args.capture_pairs, "stacks")
        if args.full_stack_pairs:
            server, target = start_server(work, bench.env)
            full_sock = bench.start_agent(target, "server")
            kind = "gpu" if cuda else "demo"
            full_rounds = bench.rounds(
                kind, ["plain", "argus"], full_sock, args.full_stack_pairs, "full stack"
            )
    finally:
        bench.close()
        collector.stop()
        if server is not None:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
        rows = dict(collector.rows)
        shutil.rmtree(work, ignore_errors=True)
    ratios = ratios_of(main_rounds, "argus")
    lo, hi = bootstrap_ci(ratios)
    line = (
        f"step_time_ratio={median_or_nan(ratios):.4f} ci95_low={lo:.4f} ci95_high={hi:.4f} "
        f"pairs={len(ratios)} full_stack_ratio={median_or_nan(ratios_of(full_rounds, 'argus')):.4f}"
    )
    cpu = [r["argus"].cpu_per_step / r["plain"].cpu_per_step for r in main_rounds]
    agent_cpu = [r["argus"].agent_cpu * 100 for r in main_rounds]
    line += f" cpu_ratio={median_or_nan(cpu):.4f} agent_cpu_pct={median_or_nan(agent_cpu):.2f}"
    if "cupti_off" in arms:
        line += f" cupti_off_ratio={median_or_nan(ratios_of(main_rounds, 'cupti_off')):.4f}"
    if cuda:
        from argus.proto import collector_pb2

        slices = [s for r in main_rounds if (s := r["argus"].slice_ratio()) is not None]
        flags = [c for r in main_rounds for c in r["argus"].capturing]
        share = sum(flags) / len(flags) if flags else float("nan")
        line += (
            f" cupti_slice_ratio={median_or_nan(slices):.4f} captured_share={share:.3f}"
            f" step_ms={median_or_nan([r['plain'].mean * 1e3 for r in main_rounds]):.2f}"
            f" cupti={cupti} kernel_summary_rows={rows.get(collector_pb2.KERNEL_SUMMARIES, 0)}"
        )
    else:
        line += (
            f" micro_ratio={median_or_nan(ratios_of(micro_rounds, 'argus')):.4f}"
            f" micro_inprocess_ratio={median_or_nan(inproc):.4f}"
            f" step_ms={median_or_nan([r['plain'].mean * 1e3 for r in main_rounds]):.2f}"
        )
    if capture_rounds:
        line += stack_capture_figures(capture_rounds)
    if checks:
        line += capture_checks(checks, main_rounds, collector)
    line += f" failed_runs={len(bench.failures)} load_avg={load_start:.2f}/{os.getloadavg()[0]:.2f}"
    print(f"overhead: {bench.elapsed():.0f} s", flush=True)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
