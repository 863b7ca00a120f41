"""`argus run`: who prints the diagnoses, where and how it reads them (:mod:`argus.agent.follow`)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time

from argus.agent.follow import Follower, node_rank, server_url
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


class _CountingServer(http.server.ThreadingHTTPServer):
    """A REST stand-in on a real socket: every job has no diagnosis; counts connections and reads."""

    daemon_threads = True

    def __init__(self) -> None:
        self.connections = 0
        self.reads = 0
        self.lock = threading.Lock()

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the REST server answers

            def setup(self) -> None:
                super().setup()
                with server.lock:
                    server.connections += 1

            def do_GET(self) -> None:
                body = json.dumps({"items": [], "next": None}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with server.lock:
                    server.reads += 1

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_the_follower_reads_every_poll_over_one_kept_client() -> None:
    # A client per read (its TLS context and CA bundle) cost ~20 ms of CPU each 2 s beside the job;
    # one client kept for the job's life holds one connection open across the reads.
    server = _CountingServer()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    said: list[str] = []
    follower = Follower(
        f"http://127.0.0.1:{server.server_address[1]}", "kept-1", say=said.append, poll_s=0.05
    )
    try:
        follower.start()
        deadline = time.monotonic() + 30
        while server.reads < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        follower.finish()
    finally:
        server.shutdown()
        server.server_close()
    assert server.reads >= 7, server.reads  # the polls and the final read
    assert server.connections == 1, (server.connections, server.reads)
    assert said and "no diagnosis" in said[-1]
