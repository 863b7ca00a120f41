"""The probe never goes quiet by accident and never reaches training: many open files, hooks that raise."""

from __future__ import annotations

import subprocess
import sys

from argus.agent.node import NodeAgent
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
        agent = NodeAgent(sock, sink.address, str(work / "spool"), 1 << 30, 1.0, flush_s=0.1)
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
