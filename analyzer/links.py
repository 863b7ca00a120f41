"""Which node's link a slow process group waits on: the node attribution of a ``communication`` finding.

:func:`argus.analyzer.collectives.slow_links` finds a process group whose
transfers grew while nobody arrived late; it cannot say where. In a ring
all-reduce every link carries the same bytes each step and every rank waits for
the slowest link, so neither the ranks' timings nor the links' throughput point
at it: measured on three nodes in network namespaces (:mod:`argus.demo.netns`, 1 rank
each, the demo job) with node 1's job link capped at 30 Mbit/s by ``tbf``, every
node sent and received the same 2.3 MB/s; the rank downstream of the slow link
(node 0, which receives from node 1) finished its all-reduce *last*, 40 ms after
the median, and so arrived last at the next one; TCP retransmits stayed near 0.
What told node 1 apart was its link's own state: its egress queue (the ``tbf``
overlimits, a backlog up to 175 KB) and, above all, how long its link needed for
the bytes it moved.

So the mechanism is the time each node's link was busy — ``bytes × 8 /
capacity`` each way, capacity as the node agent reports it (the link speed, or a
shaper's rate when lower: :mod:`argus.agent.links`) — against the time the
group's transfers took in the window (the union of its instances'
``[last arrival, end]`` intervals). A link busy for most of the transfer time
(:data:`BUSY_SHARE`) is what the transfers waited on, and its busy time accounts
for the transfer growth: node 1's link needed 248 ms of each 291 ms transfer
(12 ms before the cap), the others' 0.7 ms. A link congested by other traffic
counts the same way (its bytes include the other traffic). The finding then
names that node's ranks and carries each node's link figures as evidence.

Where no node's link explains the transfer time — capacities unknown (0), the
traffic bypasses the kernel's counters (RDMA), or the link is slowed only past
the node (a switch port: the node sees nothing of it) — the finding keeps
naming the whole group, with the figures that were found.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from argus.analyzer.collectives import Decomposition
from argus.analyzer.findings import Finding
from argus.analyzer.window import LinkSamples, Window
from argus.diagnosis import Cause

__all__ = [
    "BUSY_SHARE",
    "LinkAttribution",
    "NodeLink",
    "attribute_links",
    "locate_slow_links",
    "transfer_time_ns",
]

#: A node's link busy for at least this share of the group's transfer time is what the transfers waited on.
BUSY_SHARE = 0.5


@dataclass(frozen=True)
class NodeLink:
    """One node's busiest link over the window.

    Attributes:
        host: The node.
        interface: Its interface with the largest busy time.
        busy_ns: Time that interface needed for the bytes it moved, the slower way, ns
            (NaN when its capacity is unknown).
        busy_share: ``busy_ns`` / the group's transfer time (may exceed 1: other traffic).
        tx_bps, rx_bps: Mean throughput over the window's samples, bit/s.
        tx_capacity_bps, rx_capacity_bps: Capacity each way, bit/s (0 = unknown).
        qdisc_backlog_max_bytes: Largest egress queue seen at a sample.
        qdisc_overlimits, qdisc_drops, drops, errors: Counts over the window.
    """

    host: str
    interface: str
    busy_ns: float
    busy_share: float
    tx_bps: float
    rx_bps: float
    tx_capacity_bps: float
    rx_capacity_bps: float
    qdisc_backlog_max_bytes: int
    qdisc_overlimits: int
    qdisc_drops: int
    drops: int
    errors: int


@dataclass(frozen=True)
class LinkAttribution:
    """The nodes of a process group's ranks, by how long their links were busy.

    Attributes:
        nodes: One entry per node hosting ranks of the group that sent link samples, busiest first.
        slow: Hosts whose link was busy for at least :data:`BUSY_SHARE` of the transfer time.
        ranks: The group's ranks on those hosts, sorted.
        transfer_ns: The group's transfer time in the window, ns.
    """

    nodes: tuple[NodeLink, ...]
    slow: tuple[str, ...]
    ranks: tuple[int, ...]
    transfer_ns: float


def transfer_time_ns(d: Decomposition, group: int, start_ns: int, end_ns: int) -> float:
    """Wall time, ns, during which some instance of ``group`` was transferring within ``[start_ns, end_ns)``.

    The union of ``[last arrival, last arrival + median transfer]`` over the group's complete
    instances, clipped to the window (overlapping instances, e.g. DDP buckets, count once).
    """
    sel = (d.inst_group == group) & d.inst_complete & np.isfinite(d.inst_last_arrival_ns)
    lo = np.clip(d.inst_last_arrival_ns[sel], start_ns, end_ns)
    hi = np.clip(d.inst_last_arrival_ns[sel] + d.inst_transfer_ns[sel], start_ns, end_ns)
    if lo.size == 0:
        return 0.0
    order = np.argsort(lo)
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    # An interval starts a new run where it begins after every earlier one ended.
    new_run = np.r_[True, lo[1:] > hi[:-1]]
    run = np.cumsum(new_run) - 1
    run_lo = lo[new_run]
    run_hi = np.zeros(run_lo.size)
    np.maximum.at(run_hi, run, hi)
    return float(np.sum(run_hi - run_lo))


def attribute_links(
    links: LinkSamples, members: NDArray[np.int64], transfer_ns: float, *, busy_share: float = BUSY_SHARE
) -> LinkAttribution:
    """Rank the nodes of ``members`` by their links' busy time against ``transfer_ns``.

    Args:
        links: The window's link samples and the node of each rank.
        members: Global ranks of the slow process group.
        transfer_ns: The group's transfer time in the window (:func:`transfer_time_ns`), ns.
        busy_share: Share of ``transfer_ns`` a link must be busy for to be named.

    Returns:
        :class:`LinkAttribution`; no nodes when the window holds no link samples of them.
    """
    rank_host = dict(zip(links.rank.tolist(), links.rank_host.tolist(), strict=True))
    hosts = sorted({rank_host[r] for r in members.tolist() if rank_host.get(r, -1) >= 0})
    nodes = []
    for h in hosts:
        nodes.append(_node_link(links, h, transfer_ns))
    nodes.sort(key=lambda n: -np.nan_to_num(n.busy_share, nan=-1.0))
    slow = tuple(sorted(n.host for n in nodes if np.isfinite(n.busy_share) and n.busy_share >= busy_share))
    slow_idx = {links.host_names.index(s) for s in slow}
    ranks = tuple(sorted(int(r) for r in members.tolist() if rank_host.get(r, -1) in slow_idx))
    return LinkAttribution(tuple(nodes), slow, ranks, transfer_ns)


def _node_link(links: LinkSamples, h: int, transfer_ns: float) -> NodeLink:
    """The busiest interface of host ``h`` over the window's samples."""
    best: NodeLink | None = None
    for i in np.unique(links.interface[links.host == h]).tolist():
        sel = (links.host == h) & (links.interface == i)
        busy = []
        for count, cap in ((links.tx_bytes, links.tx_capacity_bps), (links.rx_bytes, links.rx_capacity_bps)):
            known = cap[sel] > 0
            seconds = np.sum(count[sel][known] * 8 / cap[sel][known])
            busy.append(float(seconds) * 1e9 if np.any(known) else np.nan)
        busy_ns = float(np.nanmax(busy)) if np.any(np.isfinite(busy)) else np.nan
        wall_s = max(float(np.sum(links.interval_ns[sel])) / 1e9, 1e-9)
        candidate = NodeLink(
            host=links.host_names[h],
            interface=links.interface_names[i],
            busy_ns=busy_ns,
            busy_share=busy_ns / transfer_ns if transfer_ns > 0 else np.nan,
            tx_bps=float(np.sum(links.tx_bytes[sel])) * 8 / wall_s,
            rx_bps=float(np.sum(links.rx_bytes[sel])) * 8 / wall_s,
            tx_capacity_bps=float(np.median(links.tx_capacity_bps[sel])),
            rx_capacity_bps=float(np.median(links.rx_capacity_bps[sel])),
            qdisc_backlog_max_bytes=int(np.max(links.qdisc_backlog_bytes[sel])),
            qdisc_overlimits=int(np.sum(links.qdisc_overlimits[sel])),
            qdisc_drops=int(np.sum(links.qdisc_drops[sel])),
            drops=int(np.sum(links.drops[sel])),
            errors=int(np.sum(links.errors[sel])),
        )
        if best is None or np.nan_to_num(candidate.busy_ns, nan=-1.0) > np.nan_to_num(best.busy_ns, nan=-1.0):
            best = candidate
    assert best is not None
    return best


def _mbit(bps: float) -> float | None:
    return round(bps / 1e6, 3) if np.isfinite(bps) else None


def _evidence(a: LinkAttribution) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "link_busy_pct": {
            n.host: round(100 * n.busy_share, 1) if np.isfinite(n.busy_share) else None for n in a.nodes
        },
        "link_throughput_mbit_s": {n.host: _mbit(max(n.tx_bps, n.rx_bps)) for n in a.nodes},
        "transfer_time_ms": round(a.transfer_ns / 1e6, 3),
    }
    if a.slow:
        ev["slow_link_nodes"] = list(a.slow)
    shown = [n for n in a.nodes if n.host in a.slow] or list(a.nodes[:1])
    ev["node_links"] = {
        n.host: {
            "interface": n.interface,
            "busy_ms": round(n.busy_ns / 1e6, 3) if np.isfinite(n.busy_ns) else None,
            "tx_mbit_s": _mbit(n.tx_bps),
            "rx_mbit_s": _mbit(n.rx_bps),
            "tx_capacity_mbit_s": _mbit(n.tx_capacity_bps),
            "rx_capacity_mbit_s": _mbit(n.rx_capacity_bps),
            "qdisc_backlog_max_kb": round(n.qdisc_backlog_max_bytes / 1024, 1),
            "qdisc_overlimits": n.qdisc_overlimits,
            "qdisc_drops": n.qdisc_drops,
            "interface_drops": n.drops,
            "interface_errors": n.errors,
        }
        for n in shown
    }
    return ev


def locate_slow_links(findings: list[Finding], w: Window, d: Decomposition | None) -> list[Finding]:
    """Narrow each ``communication`` finding of a process group to the ranks of the nodes whose link is slow.

    A finding keeps its subject (``group:G``), so a diagnosis follows the same fault whether or
    not a window's link samples name the node; its ranks become the ranks of the nodes named
    (``rank`` the one rank when there is one), and the nodes' link figures join its evidence
    (``link_busy_pct``, ``link_throughput_mbit_s``, ``node_links``, ``slow_link_nodes``,
    ``transfer_time_ms``, ``transfer_growth_ms``). Other findings pass unchanged.
    """
    if d is None or w.links.host.size == 0:
        return findings
    out = []
    names = w.collectives.group_names
    for f in findings:
        if f.cause != Cause.COMMUNICATION.value or f.group is None or f.group not in names:
            out.append(f)
            continue
        transfer = transfer_time_ns(d, names.index(f.group), w.start_ns, w.end_ns)
        a = attribute_links(w.links, np.asarray(f.ranks, np.int64), transfer)
        if not a.nodes:
            out.append(f)
            continue
        ev = {**f.evidence, **_evidence(a)}
        t, ref = f.evidence.get("transfer_ms"), f.evidence.get("reference_transfer_ms")
        if isinstance(t, int | float) and isinstance(ref, int | float):
            ev["transfer_growth_ms"] = round(t - ref, 3)
        if a.ranks:
            out.append(replace(f, ranks=a.ranks, rank=a.ranks[0] if len(a.ranks) == 1 else None, evidence=ev))
        else:
            out.append(replace(f, evidence=ev))
    return out
