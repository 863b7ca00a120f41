"""The harness itself: nodes with their own addresses, hostnames and links; telemetry of a capped link."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from argus.demo.netns import Cluster, netns_unavailable
from tests.cluster.harness import require

_SINK = """
import socket, sys
s = socket.create_server(("0.0.0.0", 5001)); c, _ = s.accept(); n = 0
while (b := c.recv(1 << 16)):
    n += len(b)
print(n, socket.gethostname())
"""
_SEND = """
import json, socket, sys, time
from argus.agent.links import LinkSampler
sampler = LinkSampler(); sampler.sample()
t = time.monotonic()
with socket.create_connection((sys.argv[1], 5001)) as s:
    s.sendall(b"x" * 2_000_000)
    s.shutdown(socket.SHUT_WR); s.recv(1)
took = time.monotonic() - t
rows = [x.__dict__ for x in sampler.sample()]
print(json.dumps({"took_s": took, "host": socket.gethostname(), "rows": rows}))
"""


def test_a_capped_job_link_shows_in_its_nodes_link_samples_and_everything_is_removed(tmp_path: Path) -> None:
    require(netns_unavailable())
    with Cluster(2) as cluster:
        n0, n1 = cluster.nodes
        cluster.limit(n1, 20)
        sink = cluster.popen(n0, [sys.executable, "-c", _SINK], log_path=tmp_path / "sink.log")
        time.sleep(1.0)
        send = cluster.popen(n1, [sys.executable, "-c", _SEND, n0.job_ip], log_path=tmp_path / "send.log")
        assert send.wait(60) == 0, (tmp_path / "send.log").read_text()
        assert sink.wait(10) == 0
        assert (tmp_path / "sink.log").read_text().split() == ["2000000", "node0"]
        out = json.loads((tmp_path / "send.log").read_text().splitlines()[-1])
        names = {r["interface"] for r in out["rows"]}
        assert out["host"] == "node1" and names == {"job0", "ctl0"}, out  # the node's own interfaces
        job0 = next(r for r in out["rows"] if r["interface"] == "job0")
        assert job0["tx_bytes"] >= 2_000_000 and job0["tx_capacity_bps"] == 20_000_000, job0
        assert job0["rx_capacity_bps"] > job0["tx_capacity_bps"]  # the veth's speed; only egress is shaped
        assert job0["qdisc_overlimits"] > 0, job0
        assert out["took_s"] >= 0.6 * 2_000_000 * 8 / 20e6, out  # the cap held the transfer back
        ctl0 = next(r for r in out["rows"] if r["interface"] == "ctl0")
        assert ctl0["tx_capacity_bps"] > 20_000_000, ctl0  # telemetry's own link is not capped
        names_made = [n.netns for n in cluster.nodes]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(n in listed for n in names_made)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert cluster.job_bridge not in links and cluster.control_bridge not in links
