"""The probe never goes quiet by accident and never reaches training: many open files, hooks that raise."""

from __future__ import annotations

import subprocess
import sys

from argus.agent.node import NodeAgent
from argus.window_grid import WindowGrid
from tests.agent.collector_sink import Sink
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import wait_for

#: A one-process training loop with the probe attached; ``{setup}`` runs before it.
TRAIN = """
import resource, os, sys, torch, argus.agent
{setup}
argus.agent.attach(job_id="guard", socket_path={sock!r})
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range({steps}):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
argus.agent._detach()
print("trained", {steps})
"""

MANY_FILES = """
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
assert max(held) > 1024
"""


def train(sock: str, steps: int, setup: str = "") -> subprocess.CompletedProcess[str]:
    code = TRAIN.format(setup=setup, sock=sock, steps=steps)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_rank_with_1100_open_files_reports_its_steps() -> None:
    sink = Sink()
    with short_dir() as work:
        sock = str(work / "a.sock")
        agent = NodeAgent(
            sock, sink.address, str(work / "spool"), 1 << 30, WindowGrid.from_seconds(1.0), flush_s=0.1
        )
        agent.start()
        try:
            out = train(sock, 6, MANY_FILES)
            assert out.returncode == 0 and "trained 6" in out.stdout, out.stderr[-3000:]
            wait_for(lambda: sink.table("steps").num_rows >= 5)
        finally:
            agent.stop(drain_s=2)
            sink.stop()
    got = sink.table("steps")["step"].to_pylist()
    assert len(got) == len(set(got)) >= 5, got


#: Training (DDP over a one-process gloo group, a DataLoader) while every Argus recording call raises.
BROKEN_ARGUS = """
import sys, torch, torch.distributed as dist, argus.agent
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from argus.agent import guard
from argus.agent.probe import Probe
from argus.agent.recorder import Recorder
from argus.agent.steps import StepTracker

def broken_argus(*args, **kwargs):
    raise RuntimeError("a bug inside Argus")

StepTracker.begin = StepTracker.end = broken_argus
Recorder.open_collective = Recorder.collective = Recorder.bucket_done = broken_argus
Probe.mark_step = broken_argus
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
argus.agent.attach(job_id="guard", socket_path={sock!r})
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
losses = []
for _ in range(3):
    for xb, yb in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        argus.agent.step()
        losses.append(loss.item())
dist.all_reduce(torch.ones(1))
print("steps", len(losses), "loss fell", losses[-1] < losses[0], "argus errors", guard.errors)
argus.agent._detach()
dist.destroy_process_group()
"""


def test_an_exception_inside_every_hook_leaves_training_running() -> None:
    with short_dir() as work:
        code = BROKEN_ARGUS.format(store=work / "store", sock=str(work / "none.sock"))
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "steps 24 loss fell True" in out.stdout, out.stdout
    assert "'broken_argus':" in out.stdout and "a bug inside Argus" in out.stderr  # the hooks ran, and raised
