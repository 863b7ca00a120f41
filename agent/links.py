"""Link telemetry of one node: its network interfaces, sampled by the node agent about once a second.

Per interface that is up (loopback excluded), over the interval since the last sample:
bytes and packets each way, errors and drops (``psutil.net_io_counters``, i.e. the
kernel's ``/proc/net/dev`` of the agent's network namespace); the capacity each way
(``psutil.net_if_stats`` link speed; for sending, the rate of a ``tbf`` root qdisc when
that is lower, as ``tc`` reports it); and the root qdisc's backlog (bytes queued at
the sample), overlimits (times a shaper held a packet back) and drops (rtnetlink, as ``tc -s
qdisc show`` reads them: :mod:`argus.agent.qdiscs`; left 0 where neither netlink nor ``tc`` answers).

Why these: in a ring all-reduce every link carries the same bytes, so throughput
alone does not tell which node's link is slow. What does is how long each link
needs for those bytes — ``bytes / capacity``, the time the link was busy — against
how long the transfers took (:mod:`argus.analyzer.links`), with the queue at the
node's egress as direct evidence that packets waited there.

A row has the ``host_samples`` wire columns with ``rank`` = -1 (a node-level row) and
``net_if`` naming the interface; the rank-level columns stay at 0 / ''.
"""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from typing import Any

import psutil
import pyarrow as pa

from argus.agent.qdiscs import Qdisc, read_netlink, read_tc
from argus.schema import TABLES, wire_schema

__all__ = ["LinkSample", "LinkSampler", "link_rows"]


@dataclass(frozen=True)
class LinkSample:
    """One interface over one interval (counts are deltas; capacities in bit/s, 0 = unknown)."""

    interface: str
    time_ns: int
    interval_ns: int
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    errors: int
    drops: int
    tx_capacity_bps: int
    rx_capacity_bps: int
    qdisc_backlog_bytes: int
    qdisc_overlimits: int
    qdisc_drops: int


class LinkSampler:
    """Produces one :class:`LinkSample` per interface per call to :meth:`sample` (none on the first)."""

    def __init__(self) -> None:
        self._tc = shutil.which("tc")
        self._last: dict[str, tuple[Any, Qdisc | None]] = {}
        self._last_ns = 0

    def sample(self) -> list[LinkSample]:
        """Counters since the previous call, per interface that is up and not loopback."""
        now = time.time_ns()
        counters = psutil.net_io_counters(pernic=True)
        stats = psutil.net_if_stats()
        qdiscs = read_netlink()
        if qdiscs is None:  # no netlink here: ask tc
            qdiscs = read_tc(self._tc)
        out = []
        interval = now - self._last_ns
        for name, c in counters.items():
            st = stats.get(name)
            if st is None or not st.isup or _is_loopback(name):
                continue
            q = qdiscs.get(name)
            last = self._last.get(name)
            if last is not None and self._last_ns:
                prev, prev_q = last
                speed_bps = max(int(st.speed), 0) * 1_000_000
                shaped = q.rate_bps if q is not None and q.rate_bps > 0 else 0
                tx_cap = min(v for v in (speed_bps, shaped) if v > 0) if (speed_bps or shaped) else 0
                out.append(
                    LinkSample(
                        interface=name,
                        time_ns=now,
                        interval_ns=interval,
                        rx_bytes=_delta(c.bytes_recv, prev.bytes_recv),
                        tx_bytes=_delta(c.bytes_sent, prev.bytes_sent),
                        rx_packets=_delta(c.packets_recv, prev.packets_recv),
                        tx_packets=_delta(c.packets_sent, prev.packets_sent),
                        errors=_delta(c.errin + c.errout, prev.errin + prev.errout),
                        drops=_delta(c.dropin + c.dropout, prev.dropin + prev.dropout),
                        tx_capacity_bps=tx_cap,
                        rx_capacity_bps=speed_bps,
                        qdisc_backlog_bytes=q.backlog if q is not None else 0,
                        qdisc_overlimits=_delta(q.overlimits, prev_q.overlimits) if q and prev_q else 0,
                        qdisc_drops=_delta(q.drops, prev_q.drops) if q and prev_q else 0,
                    )
                )
            self._last[name] = (c, q)
        self._last_ns = now
        return out


def _is_loopback(name: str) -> bool:
    try:
        addrs = psutil.net_if_addrs().get(name, [])
    except OSError:
        return name == "lo"
    return name == "lo" or any(
        a.family == socket.AF_INET and str(a.address).startswith("127.") for a in addrs
    )


def _delta(now: int, before: int) -> int:
    """A counter's increase; a counter that went back (interface reset, qdisc replaced) counts from 0."""
    return now - before if now >= before else now


def link_rows(samples: list[LinkSample], host: str) -> pa.Table:
    """``host_samples`` rows (wire schema) for ``samples``: rank -1, ``net_if`` set, rank columns 0."""
    n = len(samples)
    values: dict[str, list[Any]] = {
        "rank": [-1] * n,
        "host": [host] * n,
        "time_ns": [s.time_ns for s in samples],
        "interval_ns": [s.interval_ns for s in samples],
        "pending_seq": [-1] * n,  # no pending collective: a node-level row
        "net_if": [s.interface for s in samples],
        "net_rx_bytes": [s.rx_bytes for s in samples],
        "net_tx_bytes": [s.tx_bytes for s in samples],
        "net_rx_packets": [s.rx_packets for s in samples],
        "net_tx_packets": [s.tx_packets for s in samples],
        "net_errors": [s.errors for s in samples],
        "net_drops": [s.drops for s in samples],
        "net_tx_capacity_bps": [s.tx_capacity_bps for s in samples],
        "net_rx_capacity_bps": [s.rx_capacity_bps for s in samples],
        "net_qdisc_backlog_bytes": [s.qdisc_backlog_bytes for s in samples],
        "net_qdisc_overlimits": [s.qdisc_overlimits for s in samples],
        "net_qdisc_drops": [s.qdisc_drops for s in samples],
    }
    arrays = []
    for column in TABLES["host_samples"].columns:
        v = values.get(column.name)
        if v is None:
            v = [column.default if column.default is not None else _zero(column.arrow_type)] * n
        arrays.append(pa.array(v, type=column.arrow_type))
    return pa.Table.from_arrays(arrays, schema=wire_schema("host_samples"))


def _zero(t: pa.DataType) -> Any:
    if pa.types.is_string(t):
        return ""
    if pa.types.is_floating(t):
        return 0.0
    return 0
