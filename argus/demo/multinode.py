"""A training job across the nodes of a :class:`~argus.demo.netns.Cluster`, under Argus (root only).

What a user does on a real cluster, on one machine:

* `argus server` in the root namespace: gRPC on the cluster's control address
  (reached by each node over its control link), REST on loopback;
* on every node, its own `argus agent` (``--collector`` = that control address,
  a socket and spool of its own);
* on every node, ``argus run --job-id ID -- torchrun --nnodes N --node_rank i
  --nproc_per_node K --master_addr <node 0's job address> ... -m argus.demo.job``:
  static rendezvous on node 0, so node i holds ranks ``i*K .. i*K+K-1``; gloo over
  the job links (``GLOO_SOCKET_IFNAME=job0``). Every node passes the same job id
  (docs/design.md §8.2: a multi-node job needs the same id on every node).

:class:`MultiNodeJob` starts and stops these pieces; the faults it can inject
are a rate limit on one node's job link (:meth:`MultiNodeJob.limit`) and those
of :mod:`argus.demo.job` on one rank (``job_args``). Per-node environment
(``node_env``) runs a node's agent and job under, for instance, libfaketime.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from argus.demo.netns import JOB_IF, Cluster, Node
from argus.errors import ArgusError

__all__ = ["MultiNodeJob"]

#: Rendezvous port on node 0's job address.
MASTER_PORT = 29400


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _argus(*args: str) -> list[str]:
    return [sys.executable, "-m", "argus.cli", *args]


class MultiNodeJob:
    """`argus server`, one node agent per node and one torchrun per node; see the module docstring.

    Args:
        cluster: The nodes.
        work: Folder for the store, sockets, spools, logs and the stop file.
        job_id: The job id every node passes to `argus run`.
        ranks_per_node: torchrun's ``--nproc_per_node``.
        job_args: Arguments of :mod:`argus.demo.job` (``--scenario``, ``--slow-rank``, ...).
        window_s: Analysis and compression window, seconds.
        node_env: Extra environment per node index for that node's agent and job.
    """

    def __init__(
        self,
        cluster: Cluster,
        work: Path,
        job_id: str,
        *,
        ranks_per_node: int = 1,
        job_args: Sequence[str] = (),
        window_s: float = 5.0,
        node_env: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.work = work
        self.job_id = job_id
        self.ranks_per_node = ranks_per_node
        self.job_args = list(job_args)
        self.window_s = window_s
        self.node_env = {i: dict(e) for i, e in (node_env or {}).items()}
        self.logs = work / "logs"
        self.stop_file = work / "stop"
        self.grpc = f"{cluster.control_ip}:{_free_port(cluster.control_ip)}"
        self.http = f"http://127.0.0.1:{_free_port('127.0.0.1')}"
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: list[subprocess.Popen[bytes]] = []
        self.jobs: list[subprocess.Popen[bytes]] = []

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * len(self.cluster.nodes)

    def ranks_of(self, node: Node | int) -> list[int]:
        """Global ranks on ``node`` (static rendezvous: node i holds ``i*K .. i*K+K-1``)."""
        i = node if isinstance(node, int) else node.index
        return list(range(i * self.ranks_per_node, (i + 1) * self.ranks_per_node))

    def node_dir(self, node: Node) -> Path:
        return self.work / node.hostname

    # --- starting --------------------------------------------------------------------------------

    def start_server(self, timeout_s: float = 90.0) -> None:
        """Start `argus server` (root namespace) and wait until /healthz answers."""
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = _argus(
            "server",
            "--store",
            f"chdb://{self.work / 'store'}",
            "--grpc-listen",
            self.grpc,
            "--http-listen",
            self.http.removeprefix("http://"),
            "--window-s",
            str(self.window_s),
        )
        with (self.logs / "server.log").open("ab") as out:
            self.server = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait(lambda: self.get("/healthz") is not None, timeout_s, "argus server", self.server)

    def start_agents(self, timeout_s: float = 60.0) -> None:
        """Start one `argus agent` per node and wait until each listens on its socket."""
        for node in self.cluster.nodes:
            d = self.node_dir(node)
            d.mkdir(parents=True, exist_ok=True)
            cmd = _argus(
                "agent",
                "--collector",
                self.grpc,
                "--socket",
                str(d / "agent.sock"),
                "--spool",
                str(d / "spool"),
                "--window-s",
                str(self.window_s),
            )
            self.agents.append(
                self.cluster.popen(
                    node, cmd, log_path=self.logs / f"agent-{node.hostname}.log", env=self._env(node)
                )
            )
        for node, agent in zip(self.cluster.nodes, self.agents, strict=True):
            sock = self.node_dir(node) / "agent.sock"
            self._wait(sock.exists, timeout_s, f"the node agent of {node.hostname}", agent)

    def start_job(self) -> None:
        """Start the job on every node (node 0 first: it hosts the rendezvous)."""
        self.stop_file.unlink(missing_ok=True)
        n = len(self.cluster.nodes)
        master = self.cluster.nodes[0].job_ip
        for node in self.cluster.nodes:
            d = self.node_dir(node)
            cmd = _argus(
                "run",
                "--collector",
                self.grpc,
                "--socket",
                str(d / "agent.sock"),
                "--job-id",
                self.job_id,
                "--",
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={n}",
                f"--node_rank={node.index}",
                f"--nproc_per_node={self.ranks_per_node}",
                f"--master_addr={master}",
                f"--master_port={MASTER_PORT}",
                "-m",
                "argus.demo.job",
                f"--stop-file={self.stop_file}",
                *self.job_args,
            )
            env = {"GLOO_SOCKET_IFNAME": JOB_IF, "OMP_NUM_THREADS": "1", **self._env(node)}
            self.jobs.append(
                self.cluster.popen(node, cmd, log_path=self.logs / f"job-{node.hostname}.log", env=env)
            )

    def _env(self, node: Node) -> dict[str, str]:
        # Each node's own state folder: `argus run` falls back to it for the agent log.
        return {"XDG_STATE_HOME": str(self.node_dir(node) / "state"), **self.node_env.get(node.index, {})}

    # --- while it runs ---------------------------------------------------------------------------

    def limit(self, node: Node | int, rate_mbit: float) -> None:
        """Rate-limit one node's job link (see :meth:`argus.demo.netns.Cluster.limit`)."""
        self.cluster.limit(self._node(node), rate_mbit)

    def unlimit(self, node: Node | int) -> None:
        self.cluster.unlimit(self._node(node))

    def _node(self, node: Node | int) -> Node:
        return self.cluster.nodes[node] if isinstance(node, int) else node

    def running(self) -> bool:
        """True while every node's job runs."""
        return all(j.poll() is None for j in self.jobs)

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET ``path`` of the server's REST API as JSON; None when it does not answer."""
        url = f"{self.http}{path}"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.load(r)
        return None

    def diagnoses(self) -> list[dict[str, Any]]:
        """The job's diagnoses as the REST API gives them ([] while it cannot be reached)."""
        body = self.get(f"/api/v1/jobs/{self.job_id}/diagnoses")
        return list(body["items"]) if body else []

    def ranks(self) -> list[dict[str, Any]]:
        """The job's ranks as the REST API gives them."""
        body = self.get(f"/api/v1/jobs/{self.job_id}/ranks")
        return list(body["items"]) if body else []

    def wait_attached(self, timeout_s: float) -> None:
        """Wait until every rank of the job has attached (the REST API lists ``world_size`` ranks)."""

        def ready() -> bool:
            if not self.running():
                raise ArgusError(f"the job exited early:\n{self.log_tail()}")
            return len(self.ranks()) == self.world_size

        self._wait(ready, timeout_s, "every rank attached", None)

    def watch(
        self,
        *,
        warmup_s: float,
        fault: Callable[[], None] | None = None,
        expect_diagnosis: bool = False,
        timeout_s: float = 90.0,
        clean_s: float = 30.0,
        progress: Callable[[str], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Let the started job run, inject ``fault`` after ``warmup_s``, collect the diagnoses.

        With ``expect_diagnosis``, returns one window after the first diagnosis opens
        (or after ``timeout_s`` of fault); otherwise after ``clean_s`` past the warm-up.
        Times count from the moment every rank has attached.

        Returns:
            The latest version of every diagnosis seen while the job ran (REST objects).
        """
        started = time.monotonic()
        seen: dict[str, dict[str, Any]] = {}
        opened_at: float | None = None
        injected = False
        limit = warmup_s + (timeout_s if expect_diagnosis else clean_s)
        while time.monotonic() - started < limit:
            if not self.running():
                raise ArgusError(f"the job exited early:\n{self.log_tail()}")
            elapsed = time.monotonic() - started
            if fault is not None and not injected and elapsed >= warmup_s:
                fault()
                injected = True
            for d in self.diagnoses():
                seen[d["id"]] = d
            if opened_at is None and any(d["state"] == "open" for d in seen.values()):
                opened_at = time.monotonic()
            if progress is not None:
                stage = "warm-up" if elapsed < warmup_s else ("fault" if expect_diagnosis else "clean")
                progress(f"{stage}, {elapsed:.0f} s: {len(seen)} diagnoses so far")
            if expect_diagnosis and opened_at is not None and time.monotonic() - opened_at > self.window_s:
                break
            time.sleep(1.0)
        for d in self.diagnoses():
            seen[d["id"]] = d
        return list(seen.values())

    # --- stopping --------------------------------------------------------------------------------

    def stop_job(self, timeout_s: float = 60.0) -> list[int]:
        """Ask every rank to stop at the same step (the stop file), wait; returns each node's status."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout_s
        codes = []
        for job in self.jobs:
            try:
                codes.append(job.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(self.cluster.stop(job))
        return codes

    def close(self) -> None:
        """Stop the jobs, the agents (they drain to the server) and the server."""
        for proc in (*self.jobs, *self.agents):
            self.cluster.stop(proc)
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def __enter__(self) -> MultiNodeJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every log, for error messages."""
        out = []
        for p in sorted(self.logs.glob("*.log")):
            out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    @staticmethod
    def _wait(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise ArgusError(f"{what}: the process exited with status {proc.returncode}")
            with contextlib.suppress(OSError, ValueError):
                if predicate():
                    return
            time.sleep(0.2)
        raise ArgusError(f"{what}: not ready after {timeout_s:.0f} s")
