"""`argus run`'s choice of who prints the diagnoses and where it reads them (:mod:`argus.agent.follow`)."""

from __future__ import annotations

import subprocess
import sys

from argus.agent.follow import node_rank, server_url
from tests.agent.jobs import job_env, short_dir


def test_only_node_rank_0_prints_torchrun_s_flag_first_then_the_launchers_variables() -> None:
    torchrun = ["torchrun", "--nnodes", "4", "--nproc_per_node", "8"]
    assert node_rank([*torchrun, "train.py"], {}) == 0
    assert node_rank([*torchrun, "--node_rank", "2", "train.py"], {}) == 2
    assert node_rank([*torchrun, "--node-rank=3", "train.py"], {"NODE_RANK": "0"}) == 3
    assert node_rank(["python", "train.py"], {"NODE_RANK": "1"}) == 1
    assert node_rank(["python", "train.py"], {"GROUP_RANK": "5"}) == 5
    assert node_rank(["srun", "python", "train.py"], {"SLURM_NODEID": "7"}) == 7
    assert node_rank([*torchrun, "--node_rank", "$NODE_RANK"], {}) == 0  # not a number: node 0


def test_the_rest_url_is_the_variable_else_port_7471_on_the_collector_s_host() -> None:
    assert server_url("10.0.0.5:7470", {}) == "http://10.0.0.5:7471"
    assert (
        server_url("collector.argus:7470", {"ARGUS_SERVER": "https://argus.example"})
        == "https://argus.example"
    )


def test_with_no_server_to_ask_argus_run_says_so_once_and_gives_no_verdict() -> None:
    with short_dir() as work:
        cmd = [
            sys.executable, "-m", "argus.cli", "run", "--collector", "127.0.0.1:1", "--server", "http://127.0.0.1:1",
            "--socket", str(work / "agent.sock"), "--job-id", "nowhere-1", "--",
            sys.executable, "-c", "import time; time.sleep(5)",
        ]  # fmt: skip
        done = subprocess.run(
            cmd, env=job_env(work), capture_output=True, text=True, timeout=120, check=False
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("argus: cannot follow the diagnoses at http://127.0.0.1:1") == 1, done.stderr
    assert (
        "argus: no verdict for job nowhere-1: the argus server http://127.0.0.1:1 did not answer"
        in done.stderr
    )
    assert "no diagnosis" not in done.stderr
