"""`argus run`'s choice of who prints the diagnoses and where it reads them (:mod:`argus.agent.follow`)."""

from __future__ import annotations

from argus.agent.follow import node_rank, server_url


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
