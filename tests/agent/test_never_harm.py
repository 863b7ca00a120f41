"""The probe never harms the job: no agent, an agent killed mid-run, ARGUS_DISABLE, no CUDA libraries."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from argus.agent.run import bootstrap_dir
from argus.agent.sink import AgentLink
from argus.schema import wire_schema
from tests.agent.collector_sink import Sink
from tests.agent.jobs import argus_run, job_env, run, short_dir, torchrun


def probe_env(work: Path, socket_path: str, **extra: str) -> dict[str, str]:
    """Environment that auto-attaches the probe, as `argus run` sets it, without starting an agent."""
    env = job_env(work, **extra)
    env.update(
        PYTHONPATH=os.pathsep.join([bootstrap_dir(), env.get("PYTHONPATH", "")]),
        ARGUS_AUTOATTACH="1",
        ARGUS_SOCKET=socket_path,
        ARGUS_JOB_ID="harm",
    )
    return env


@pytest.mark.slow
def test_no_node_agent_training_finishes_and_losses_are_reported() -> None:
    with short_dir() as work:
        out = run(torchrun(2, "--steps", "20"), probe_env(work, str(work / "nobody.sock")))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no node agent at" in out.stderr
    assert "rows not delivered to the node agent" in out.stderr


def test_probe_memory_is_bounded_without_an_agent(tmp_path: Path) -> None:
    link = AgentLink(str(tmp_path / "none.sock"), {"job_id": "j"}, max_pending_bytes=200_000)
    batch = pa.Table.from_pydict(
        {"rank": [0] * 500, "step": list(range(500)), "start_ns": [0] * 500, "dur_ns": [1] * 500},
        schema=wire_schema("steps"),
    )
    for _ in range(200):
        link.enqueue("steps", batch)
        link.pump()
    assert link._bytes <= 200_000
    assert link.dropped_rows == 200 * 500 - link.pending_rows > 0


@pytest.mark.slow
def test_node_agent_killed_mid_run_then_restarted_loses_no_step(tmp_path: Path) -> None:
    sink = Sink()
    with short_dir() as work:
        sock = str(work / "agent.sock")
        env = job_env(work)

        def start_agent(n: int) -> subprocess.Popen[bytes]:
            cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", sink.address]
            cmd += ["--spool", str(work / "spool"), "--window-s", "1"]
            proc = subprocess.Popen(
                cmd, env=env, stdout=(work / f"agent{n}.log").open("wb"), stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + 30
            while not os.path.exists(sock):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            return proc

        agent = start_agent(1)
        job = subprocess.Popen(
            torchrun(2, "--steps", "60", "--step-sleep-s", "0.1"),
            env=probe_env(work, sock),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while (work / "agent1.log").read_text().count("connected") < 2:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.5)
            agent.send_signal(signal.SIGKILL)
            agent.wait()
            os.unlink(sock)
            time.sleep(2)
            agent = start_agent(2)
            _, err = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
        assert job.returncode == 0, err[-3000:]
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        log2 = (work / "agent2.log").read_text()
    sink.stop()
    assert "lost the node agent" in err
    steps = sink.table("steps").to_pandas()
    for r in range(2):
        assert sorted(steps[steps["rank"] == r].step) == list(range(60)), log2[-2000:]  # once each
    exits = sink.table("ranks").to_pandas()
    assert sorted(exits[exits.event == "exit"]["rank"]) == [0, 1]


def test_argus_disable_makes_attach_a_no_op() -> None:
    code = (
        "import argus.agent, sys\n"
        "argus.agent.attach(job_id='x')\n"
        "assert argus.agent._probe is None\n"
        "assert 'torch' not in sys.modules\n"
    )
    env = dict(os.environ, ARGUS_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_attached_probe_loads_no_cuda_library_on_a_cpu_machine(tmp_path: Path) -> None:
    code = (
        "import argus.agent, torch, sys\n"
        f"argus.agent.attach(job_id='x', socket_path={str(tmp_path / 'none.sock')!r})\n"
        "assert argus.agent._probe is not None\n"
        "torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum().backward()\n"
        "maps = open('/proc/self/maps').read()\n"
        "bad = [n for n in ('libcuda', 'libcudart', 'libcupti', 'libnvidia-ml') if n in maps]\n"
        "assert not bad, bad\n"
        "assert 'cupti' not in sys.modules and 'pynvml' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_argus_run_says_at_once_when_the_collector_is_unreachable_and_why_it_waits_at_exit() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    target = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: connections are refused
    try:
        with short_dir() as work:
            env = job_env(work)
            done = run(
                argus_run(work, target, "unreachable", [sys.executable, "-c", "print('trained')"]), env
            )
            spool = work / "state" / "argus" / "spool"
    finally:
        closed.close()
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    said = done.stderr.splitlines()
    line = next((s for s in said if "unreachable" in s), "")
    assert line.startswith(f"argus: collector {target} unreachable: spooling to {spool}/"), said
    assert line.endswith("run `argus server` or pass --collector"), said
    # It says why it may wait at exit (only for a collector reached meanwhile) and where rows stay.
    stop = next((s for s in said if s.startswith("argus: stopping the node agent:")), "")
    assert "only if it reached it meanwhile" in stop and str(spool) in stop, said
