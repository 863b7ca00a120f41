"""The node agent reads each interface's root qdisc over rtnetlink (:mod:`argus.agent.qdiscs`) and gets
what ``tc -s qdisc show`` reports: in a network namespace of its own, shaped links (a 20 Mbit/s
``tbf``, and a 40 Gbit/s one whose rate needs the 64-bit attribute) after a burst the shaper held
back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

_READ = """
import json, shutil, socket
from argus.agent.qdiscs import read_netlink, read_tc
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE (root): the burst waits in the qdisc
for _ in range(2000):
    try:
        s.sendto(b"x" * 1400, ("10.213.0.2", 9))
    except OSError:  # ENOBUFS: the qdisc dropped it (counted in its drops)
        pass
def plain(found):
    return {name: q.__dict__ for name, q in sorted(found.items())} if found is not None else None
print(json.dumps({"netlink": plain(read_netlink()), "tc": plain(read_tc(shutil.which("tc")))}))
"""


@contextmanager
def _netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root, ip and tc")
    name = f"argus-qd-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], check=False, capture_output=True).returncode:
        pytest.skip("cannot make a network namespace here")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _in(ns: str, *cmd: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True
    ).stdout


def test_netlink_reads_the_root_qdiscs_tc_reports_rates_backlog_and_overlimits() -> None:
    with _netns() as ns:
        for dev, rate in (("slow0", "20mbit"), ("fast0", "40gbit")):
            _in(ns, "ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev[:-1]}1")
            for end in (dev, f"{dev[:-1]}1"):
                _in(ns, "ip", "link", "set", end, "up")
            tbf = [
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "32kbit",
                "latency",
                "2s",
            ]
            _in(ns, *tbf)
        _in(ns, "ip", "addr", "add", "10.213.0.1/24", "dev", "slow0")
        neighbour = ["ip", "neigh", "add", "10.213.0.2", "lladdr", "02:00:00:00:00:02", "dev", "slow0"]
        _in(ns, *neighbour, "nud", "permanent")  # the burst leaves through slow0's qdisc, no ARP first
        # 2.8 MB into a 20 Mbit/s shaper (about a second's worth): held back, queued while read.
        got = json.loads(_in(ns, sys.executable, "-c", _READ))
    netlink, tc = got["netlink"], got["tc"]
    assert netlink is not None and set(netlink) == set(tc) >= {"slow0", "fast0", "slow1"}, got
    assert netlink["slow0"]["rate_bps"] == tc["slow0"]["rate_bps"] == 20_000_000
    assert (
        netlink["fast0"]["rate_bps"] == tc["fast0"]["rate_bps"] == 40_000_000_000
    )  # past 32 bits of bytes/s
    assert netlink["slow0"]["overlimits"] > 0 and netlink["slow0"]["backlog"] > 0, got
    for dev in tc:  # read one after the other while the queue drains: counters only grow
        assert netlink[dev]["overlimits"] <= tc[dev]["overlimits"], (dev, got)
        assert netlink[dev]["drops"] == tc[dev]["drops"], (dev, got)
    assert netlink["slow1"]["rate_bps"] == 0  # the peer's default qdisc: not a shaper
