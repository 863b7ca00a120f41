"""Many nodes on one machine: Linux network namespaces joined by veth pairs (root only).

A :class:`Cluster` of N nodes is N network namespaces, each a node with two
links, both veth pairs to a bridge in the root namespace:

* the **job link** ``job0`` (``10.234.K.(i+1)/24``): the training job's traffic
  (rendezvous on node 0, gloo between ranks; set ``GLOO_SOCKET_IFNAME=job0``).
  Its bridge has no address in the root namespace: it is the job's switch.
* the **control link** ``ctl0`` (``10.233.K.(i+2)/24``): telemetry only. The
  root namespace holds ``10.233.K.1`` on that bridge, where the collector
  listens; a limit on a job link never throttles telemetry.

``K`` is picked per cluster among subnets no root address uses, so clusters of
concurrent tests do not collide. Every process started with :meth:`Cluster.popen`
runs in its node's namespace (``ip netns exec``, which also gives it the node's
``/sys/class/net``) and in a UTS namespace of its own whose hostname is the
node's (``node0``, ``node1``, ...), so the ranks of each node report their own host.

:meth:`Cluster.limit` caps one node's job link in both directions with a token
bucket (``tc`` ``tbf`` on both ends of the veth pair: the node's egress and the
switch port's egress towards the node), as a slow NIC or a degraded cable would.

Everything is removed on :meth:`Cluster.close` (also when a test fails, through
the context manager): the processes it started (their whole process groups),
the namespaces (which removes their veth pairs) and the bridges. Names carry the
creating process's pid, so :func:`remove_stale` can remove what a killed process
left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from argus.errors import ConfigError

__all__ = ["CONTROL_IF", "JOB_IF", "Cluster", "Node", "netns_unavailable", "remove_stale"]

log = logging.getLogger(__name__)

#: Interface names inside every node.
JOB_IF = "job0"
CONTROL_IF = "ctl0"
_NETNS_PREFIX = "argus-"
_NAME = re.compile(r"^argus-(?P<pid>\d+)-(?P<tok>[0-9a-f]{4})-(?P<i>\d+)$")


@dataclass(frozen=True)
class Node:
    """One node of a :class:`Cluster`.

    Attributes:
        index: 0..N-1 (node 0 hosts the rendezvous).
        netns: Network namespace name.
        hostname: The hostname its processes see (``node<index>``).
        job_ip: Its address on the job network.
        control_ip: Its address on the control network.
        job_peer: The root-namespace end of its job link (the switch port).
    """

    index: int
    netns: str
    hostname: str
    job_ip: str
    control_ip: str
    job_peer: str


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ConfigError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can.

    Checks root, ``ip``, ``tc``, ``unshare``, and that a namespace and a bridge can
    really be made (a container without ``CAP_NET_ADMIN`` fails there).
    """
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, veth pairs, bridges, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    name = f"{_NETNS_PREFIX}probe-{os.getpid()}"
    made = _run("ip", "netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        inside = _run("ip", "netns", "exec", name, "ip", "link", "add", "b0", "type", "bridge", check=False)
        if inside.returncode != 0:
            return f"cannot create a bridge: {inside.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove namespaces and bridges of clusters whose creating process is gone; returns their names."""
    removed = []
    listing = _run("ip", "netns", "list", check=False).stdout.split()
    tokens = set()
    for name in listing:
        m = _NAME.match(name)
        if m and not _pid_alive(int(m["pid"])):
            _run("ip", "netns", "del", name, check=False)
            tokens.add(m["tok"])
            removed.append(name)
    for tok in tokens:
        for bridge in (f"ajb{tok}", f"acb{tok}"):
            if _run("ip", "link", "del", bridge, check=False).returncode == 0:
                removed.append(bridge)
    return removed


def _free_subnet() -> int:
    """A K such that neither 10.233.K.0/24 nor 10.234.K.0/24 is in use in the root namespace."""
    used = _run("ip", "-4", "-o", "addr", "show").stdout
    routes = _run("ip", "-4", "route", "show").stdout
    start = secrets.randbelow(256)
    for k in ((start + j) % 256 for j in range(256)):
        if f"10.233.{k}." not in used + routes and f"10.234.{k}." not in used + routes:
            return k
    raise ConfigError("no free 10.233.K.0/24 subnet for a cluster's control network")


class Cluster:
    """N nodes in network namespaces; see the module docstring.

    Args:
        nodes: How many nodes (>= 1).

    Raises:
        ConfigError: not root, or a namespace, link or address could not be made
            (whatever was made is removed again).
    """

    def __init__(self, nodes: int) -> None:
        if nodes < 1:
            raise ConfigError("a cluster needs at least one node")
        why = netns_unavailable()
        if why is not None:
            raise ConfigError(why)
        remove_stale()
        self._tok = secrets.token_hex(2)
        self._k = _free_subnet()
        self.job_bridge = f"ajb{self._tok}"
        self.control_bridge = f"acb{self._tok}"
        #: Where the collector listens for the nodes (root namespace, control network).
        self.control_ip = f"10.233.{self._k}.1"
        self.nodes: tuple[Node, ...] = tuple(
            Node(
                index=i,
                netns=f"{_NETNS_PREFIX}{os.getpid()}-{self._tok}-{i}",
                hostname=f"node{i}",
                job_ip=f"10.234.{self._k}.{i + 1}",
                control_ip=f"10.233.{self._k}.{i + 2}",
                job_peer=f"aj{self._tok}{i}",
            )
            for i in range(nodes)
        )
        self._procs: list[subprocess.Popen[bytes]] = []
        self._closed = False
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    # --- building and removing -------------------------------------------------------------------

    def _create(self) -> None:
        for bridge in (self.job_bridge, self.control_bridge):
            _run("ip", "link", "add", bridge, "type", "bridge")
            _run("ip", "link", "set", bridge, "up")
        _run("ip", "addr", "add", f"{self.control_ip}/24", "dev", self.control_bridge)
        for node in self.nodes:
            ns = node.netns
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for inner, outer, bridge, ip in (
                (JOB_IF, node.job_peer, self.job_bridge, node.job_ip),
                (CONTROL_IF, f"ac{self._tok}{node.index}", self.control_bridge, node.control_ip),
            ):
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
                _run("ip", "link", "set", outer, "master", bridge)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner)
                _run("ip", "-n", ns, "link", "set", inner, "up")

    def close(self) -> None:
        """Stop every process started here, then remove the namespaces and bridges (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            _stop_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.poll() is None:
                _stop_group(proc, signal.SIGKILL)
                proc.wait()
        for node in self.nodes:
            _kill_netns_pids(node.netns)
            _run("ip", "netns", "del", node.netns, check=False)
        for bridge in (self.job_bridge, self.control_bridge):
            _run("ip", "link", "del", bridge, check=False)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- processes -------------------------------------------------------------------------------

    def popen(
        self,
        node: Node,
        cmd: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` on ``node``: its namespace, its hostname, output to ``log_path``.

        ``env`` is added to this process's environment for ``cmd`` alone (not for the
        ``ip``/``unshare`` wrappers, so an ``LD_PRELOAD`` there touches only ``cmd``).
        The process leads a new process group; :meth:`close` stops the whole group.
        """
        wrapper = [
            "ip",
            "netns",
            "exec",
            node.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$1" && shift && exec "$@"',
            "sh",
            node.hostname,
            "env",
            *(f"{k}={v}" for k, v in (env or {}).items()),
            *cmd,
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                wrapper,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int:
        """SIGTERM ``proc``'s process group, SIGKILL it after ``timeout_s``; returns its exit status."""
        if proc.poll() is None:
            _stop_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _stop_group(proc, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    # --- links -----------------------------------------------------------------------------------

    def limit(self, node: Node, rate_mbit: float, *, latency_ms: float = 100.0) -> None:
        """Cap ``node``'s job link at ``rate_mbit`` in both directions (``tc`` ``tbf``).

        The bucket holds 10 ms of traffic (at least 16 KiB); packets queue for at
        most ``latency_ms`` before they are dropped, as on a switch port's buffer.
        """
        burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 * 0.010))
        spec = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", f"{latency_ms}ms"]
        _run("ip", "netns", "exec", node.netns, "tc", "qdisc", "replace", "dev", JOB_IF, "root", *spec)
        _run("tc", "qdisc", "replace", "dev", node.job_peer, "root", *spec)

    def unlimit(self, node: Node) -> None:
        """Remove the cap of :meth:`limit` (no error when there is none)."""
        _run("ip", "netns", "exec", node.netns, "tc", "qdisc", "del", "dev", JOB_IF, "root", check=False)
        _run("tc", "qdisc", "del", "dev", node.job_peer, "root", check=False)


def _stop_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_netns_pids(netns: str) -> None:
    """SIGKILL whatever still runs in ``netns`` (a process that left its process group)."""
    pids = _run("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
