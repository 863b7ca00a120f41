"""Overhead of the probe + node agent on a real DDP job, interleaved A/B pairs.

CPU (default): a 4-rank gloo DDP job (one thread per rank) of a small MLP with a
DataLoader, run under torchrun; arm A plain, arm B under `argus run` (probe in
every rank, one node agent streaming to an acknowledge-only gRPC collector in
this process, as if the collector were on another machine). The full stack (a
local `argus server` with chDB and the analyzer on this machine) is measured
in separate pairs.

``--cuda``: the same on one GPU (NCCL DDP, world size 1, CUPTI kernel capture on
when cupti-python is installed), with a model launching a few hundred kernels
per step.

Each run reports rank 0's median step time over its last ``--steps`` steps
(after ``--warmup``); a pair's ratio is B/A; runs alternate AB, BA, ... The
result is the median ratio with a bootstrap 95 % interval over pairs.

Also, inside one probed job, ``--inprocess-pairs`` pairs of ``--block`` steps
per arm, alternating step by step, compare a DDP copy on DDP's built-in C++
all-reduce with the probe switched off (A) against the probed model (B): the
probe's hot-path cost with the machine's load identical for both arms
(``inprocess_ratio``, median of the pairs' ratios).

Last line: ``step_time_ratio=… ci95_low=… ci95_high=… pairs=… full_stack_ratio=…
inprocess_ratio=…`` (plus ``cupti=…`` and ``kernel_summary_rows=…`` with ``--cuda``).

    python bench/overhead.py [--pairs 15] [--full-stack-pairs 5] [--cuda]
"""

from __future__ import annotations

import argparse
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
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# --- the training job (run by torchrun as `overhead.py --worker`) --------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    cuda = args.cuda
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    if cuda:
        # ~12 blocks of (Linear, LayerNorm, GELU, residual): a few hundred kernels per step.
        width, depth, batch = 1024, 12, 256
        layers: list[nn.Module] = [nn.Linear(256, width)]
        for _ in range(depth):
            layers += [nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()]
        layers.append(nn.Linear(width, 10))
        model: nn.Module = nn.Sequential(*layers).to(device)
        ddp = DistributedDataParallel(model, device_ids=[device.index])
    else:
        width, batch = 256, 32
        model = nn.Sequential(
            nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
        )
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.1)
    g = torch.Generator().manual_seed(rank)
    n = batch * 64
    data = TensorDataset(
        torch.randn(n, 256 if cuda else 128, generator=g), torch.randint(0, 10, (n,), generator=g)
    )
    loader = DataLoader(data, batch_size=batch, shuffle=False, pin_memory=cuda)
    loss_fn = nn.CrossEntropyLoss()

    def batches() -> Any:
        while True:
            yield from loader

    stream = batches()

    def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
        times: list[float] = []
        t_prev = time.perf_counter()
        for _ in range(steps):
            xb, yb = next(stream)
            x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            times.append(t - t_prev)
            t_prev = t
        return times

    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    if not args.inprocess_pairs:
        times = train(ddp, opt, args.warmup + args.steps)[args.warmup :]
        if rank == 0:
            Path(args.out).write_text(json.dumps(times))
    else:
        # Same processes, alternating blocks: A = a second DDP copy on DDP's built-in C++ all-reduce
        # with the probe switched off, B = the probed model. Isolates the probe's hot-path cost.
        import copy

        import argus.agent

        probe = argus.agent._probe
        assert probe is not None, "run the in-process mode under argus run"
        plain = DistributedDataParallel(copy.deepcopy(model), **({} if cuda else {"bucket_cap_mb": 0.1}))
        plain.__dict__["_argus_builtin_hook"] = True  # keep DDP's own C++ hook
        plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)
        arms = {"A": (plain, plain_opt, False), "B": (ddp, opt, True)}
        for arm in ("B", "A"):
            model_, opt_, active = arms[arm]
            probe.active = active
            train(model_, opt_, args.warmup)
        ratios = []
        for i in range(args.inprocess_pairs):
            # Within a pair the arms alternate step by step, so both see the same machine load.
            got: dict[str, list[float]] = {"A": [], "B": []}
            for k in range(2 * args.block):
                arm = "AB"[(k + i) % 2]
                model_, opt_, active = arms[arm]
                probe.active = active
                got[arm] += train(model_, opt_, 1)
            ratios.append(statistics.median(got["B"]) / statistics.median(got["A"]))
        probe.active = True
        if rank == 0:
            Path(args.out).write_text(json.dumps(ratios))
    dist.destroy_process_group()


# --- an acknowledge-only collector ----------------------------------------------------------------


class AckCollector:
    """``argus.v1.Collector`` that acknowledges every batch and counts rows per table."""

    def __init__(self) -> None:
        import grpc

        from argus.proto import collector_pb2, collector_pb2_grpc

        pb = collector_pb2
        self.rows: dict[int, int] = {}
        lock = threading.Lock()
        outer = self

        class Servicer(collector_pb2_grpc.CollectorServicer):
            def Stream(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
                import pyarrow as pa

                for batch in request_iterator:
                    n = pa.ipc.open_stream(batch.arrow_ipc).read_all().num_rows
                    with lock:
                        outer.rows[batch.table] = outer.rows.get(batch.table, 0) + n
                    yield pb.Ack(seq=batch.seq, status=pb.Ack.STORED, rows=n)

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.nproc = 1 if args.cuda else args.ranks
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGUS_", "TORCHELASTIC_"))}
        self.env.update(XDG_STATE_HOME=str(work / "state"), OMP_NUM_THREADS="1")
        self.agents: list[subprocess.Popen[bytes]] = []
        self.runs = 0
        self.failures: list[str] = []

    def job(self) -> list[str]:
        out = self.work / f"times-{self.runs}.json"
        self.runs += 1
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.nproc}",
            __file__,
            "--worker",
            "--steps",
            str(self.args.steps),
            "--warmup",
            str(self.args.warmup),
            "--out",
            str(out),
            "--inprocess-pairs",
            "0",
            *(["--cuda"] if self.args.cuda else []),
        ]

    def start_agent(self, collector: str, name: str) -> str:
        sock = str(self.work / f"{name}.sock")
        cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", collector]
        cmd += ["--spool", str(self.work / f"spool-{name}"), "--window-s", "10"]
        log = (self.work / f"agent-{name}.log").open("wb")
        self.agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(sock)
                    return sock
                except OSError:
                    time.sleep(0.1)
        raise RuntimeError(f"the node agent did not start; see {self.work}/agent-{name}.log")

    def run(self, sock: str | None, job_id: str) -> float:
        cmd = self.job()
        out = Path(cmd[cmd.index("--out") + 1])
        if sock is not None:
            cmd = [sys.executable, "-m", "argus.cli", "run", "--socket", sock, "--job-id", job_id, "--", *cmd]
        for attempt in range(3):
            proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode == 0:
                return statistics.median(json.loads(out.read_text()))
            self.failures.append(f"{'argus' if sock else 'plain'} run {job_id} attempt {attempt + 1}")
            print(
                f"overhead: a {'probed' if sock else 'plain'} job failed ({proc.returncode}); "
                f"stderr tail:\n{proc.stderr[-1500:]}",
                flush=True,
            )
        raise RuntimeError(f"job {job_id} failed three times")

    def inprocess(self, sock: str) -> list[float]:
        cmd = self.job()
        out = Path(cmd[cmd.index("--out") + 1])
        cmd += ["--inprocess-pairs", str(self.args.inprocess_pairs), "--block", str(self.args.block)]
        cmd = [
            sys.executable,
            "-m",
            "argus.cli",
            "run",
            "--socket",
            sock,
            "--job-id",
            "bench-inproc",
            "--",
            *cmd,
        ]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"in-process job failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        ratios = [float(r) for r in json.loads(out.read_text())]
        print(f"[in-process] {len(ratios)} block pairs: " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
        return ratios

    def pairs(self, sock: str, n: int, label: str) -> list[float]:
        ratios = []
        for i in range(n):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            got = {arm: self.run(sock if arm == "B" else None, f"bench-{label}-{i}") for arm in order}
            ratios.append(got["B"] / got["A"])
            print(
                f"[{label}] pair {i + 1}/{n}: plain {got['A'] * 1e3:.2f} ms, argus {got['B'] * 1e3:.2f} ms, "
                f"ratio {ratios[-1]:.4f}",
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

    rng = np.random.default_rng(0)
    a = np.asarray(ratios)
    medians = np.median(a[rng.integers(0, a.size, (rounds, a.size))], axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def cupti_available() -> bool:
    try:
        from cupti import cupti  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cuda", action="store_true", help="one GPU, NCCL, CUPTI capture on")
    p.add_argument("--pairs", type=int, default=None, help="A/B pairs (default 15 CPU, 8 CUDA)")
    p.add_argument("--full-stack-pairs", type=int, default=None, help="pairs with a local argus server")
    p.add_argument("--ranks", type=int, default=4, help="CPU world size (default 4)")
    p.add_argument("--steps", type=int, default=None, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=20, help="steps before measuring")
    p.add_argument(
        "--inprocess-pairs", type=int, default=15, help="block pairs inside one probed job (0: skip)"
    )
    p.add_argument("--block", type=int, default=25, help="steps per in-process block")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    args.pairs = args.pairs or (8 if args.cuda else 15)
    args.full_stack_pairs = (
        args.full_stack_pairs if args.full_stack_pairs is not None else (3 if args.cuda else 5)
    )
    args.steps = args.steps or (200 if args.cuda else 150)
    cupti = "n/a"
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print("overhead --cuda: no CUDA device visible", file=sys.stderr)
            return 2
        cupti = "on" if cupti_available() else "off"
        if cupti == "off":
            print(
                "overhead --cuda: cupti-python is NOT installed (pip install cupti-python): CUPTI capture is "
                "off, the figure covers steps, phases, collectives and NVML only",
                flush=True,
            )
    work = Path(tempfile.mkdtemp(prefix="argus-bench-", dir="/tmp"))
    bench = Bench(args, work)
    collector = AckCollector()
    server = None
    t0 = time.monotonic()
    try:
        print(
            f"overhead: {'cuda, 1 GPU' if args.cuda else f'cpu, {args.ranks} ranks'}; work dir {work}",
            flush=True,
        )
        sock = bench.start_agent(collector.address, "ack")
        inproc = bench.inprocess(sock) if args.inprocess_pairs else []
        ratios = bench.pairs(sock, args.pairs, "probe+agent")
        full: list[float] = []
        if args.full_stack_pairs:
            server, target = start_server(work, bench.env)
            full = bench.pairs(bench.start_agent(target, "server"), args.full_stack_pairs, "full stack")
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
    lo, hi = bootstrap_ci(ratios)
    line = (
        f"step_time_ratio={statistics.median(ratios):.4f} ci95_low={lo:.4f} ci95_high={hi:.4f} "
        f"pairs={len(ratios)} full_stack_ratio={statistics.median(full) if full else float('nan'):.4f}"
    )
    if inproc:
        line += f" inprocess_ratio={statistics.median(inproc):.4f}"
    line += f" failed_runs={len(bench.failures)}"
    if args.cuda:
        from argus.proto import collector_pb2

        line += f" cupti={cupti} kernel_summary_rows={rows.get(collector_pb2.KERNEL_SUMMARIES, 0)}"
    print(f"overhead: {time.monotonic() - t0:.0f} s", flush=True)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
