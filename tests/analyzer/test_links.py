"""Node attribution of a slow process group: the node whose link was busy through the transfers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from argus.agent.links import LinkSample, link_rows
from argus.analyzer.links import BUSY_SHARE, attribute_links
from argus.analyzer.store_io import read_liveness, read_window
from argus.analyzer.window import LinkSamples
from argus.schema import wire_table
from argus.store import Store

S = 1_000_000_000


def _ring(cap_bps: list[int], bytes_per_s: int, seconds: int = 5) -> LinkSamples:
    """Three nodes of one rank each, 1 s samples of job0 and ctl0: every job link moves the same bytes."""
    rows = []
    for h, cap in enumerate(cap_bps):
        for t in range(seconds):
            rows.append((h, 0, t, bytes_per_s, bytes_per_s, cap, 10_000_000_000))  # job0
            rows.append((h, 1, t, 2_000, 2_000, 10_000_000_000, 10_000_000_000))  # ctl0: telemetry
    h, i, t, rx, tx, tx_cap, rx_cap = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    z = np.zeros(h.size, np.int64)
    return LinkSamples(
        host=h,
        interface=i,
        time_ns=(t + 1) * S,
        interval_ns=np.full(h.size, S),
        rx_bytes=rx,
        tx_bytes=tx,
        errors=z,
        drops=z,
        tx_capacity_bps=tx_cap,
        rx_capacity_bps=rx_cap,
        qdisc_backlog_bytes=z,
        qdisc_overlimits=z,
        qdisc_drops=z,
        host_names=("node0", "node1", "node2"),
        interface_names=("job0", "ctl0"),
        rank=np.array([0, 1, 2], np.int64),
        rank_host=np.array([0, 1, 2], np.int64),
    )


def test_the_capped_node_is_named_though_every_link_moved_the_same_bytes() -> None:
    # 2.35 MB/s through every node; node 1 can send 30 Mbit/s; the transfers took 4 s of 5.
    links = _ring([10_000_000_000, 30_000_000, 10_000_000_000], 2_350_000)
    a = attribute_links(links, np.array([0, 1, 2]), transfer_ns=4 * S)
    assert a.slow == ("node1",) and a.ranks == (1,)
    assert a.nodes[0].host == "node1" and a.nodes[0].interface == "job0"
    assert 0.75 < a.nodes[0].busy_share < 0.8  # 2.35 MB/s x 5 s x 8 / 30 Mbit/s = 3.13 s of 4
    assert all(n.busy_share < 0.01 for n in a.nodes[1:])


def test_no_node_is_named_when_no_link_was_busy_through_the_transfers_or_capacity_is_unknown() -> None:
    fast = _ring([10_000_000_000] * 3, 2_350_000)
    assert attribute_links(fast, np.array([0, 1, 2]), transfer_ns=4 * S).slow == ()
    ring = _ring([0, 0, 0], 2_350_000)
    none = np.zeros_like(ring.tx_capacity_bps)
    unknown = replace(ring, tx_capacity_bps=none, rx_capacity_bps=none)
    a = attribute_links(unknown, np.array([0, 1, 2]), transfer_ns=4 * S)
    assert a.slow == () and all(not np.isfinite(n.busy_share) for n in a.nodes)


def test_only_the_groups_ranks_are_named_and_ranks_of_nodes_without_samples_are_ignored() -> None:
    links = _ring([10_000_000_000, 30_000_000, 10_000_000_000], 2_350_000)
    assert attribute_links(links, np.array([0, 2]), transfer_ns=4 * S).slow == ()
    assert attribute_links(links, np.array([1, 7]), transfer_ns=4 * S).ranks == (1,)
    assert BUSY_SHARE == 0.5


def test_link_rows_and_each_ranks_host_are_read_into_the_window(store: Store) -> None:
    t0 = 1_700_000_000 * S
    ranks = {"rank": [0, 1], "event": ["attach", "attach"], "time_ns": [t0, t0], "local_rank": [0, 0]}
    ranks |= {"world_size": [2, 2], "host": ["node0", "node1"], "pid": [10, 11], "agent_id": ["a", "b"]}
    ranks |= {"device": ["cpu", "cpu"], "clock_offset_ns": [0, 0], "exit_code": [0, 0]}
    ranks |= {"group_name": ["", ""], "group_ranks": [[], []], "group_backend": ["", ""]}
    store.insert("ranks", wire_table("ranks", ranks, job_id="j"))
    samples = [
        LinkSample("job0", t0 + k * S, S, 100, 2_000_000, 1, 2, 0, 0, 30_000_000, 10**10, 4096, 7, 1)
        for k in (1, 2)
    ]
    rows = link_rows(samples, "node1")
    store.insert("host_samples", pa.table({"job_id": ["j"] * rows.num_rows, **rows.to_pydict()}))
    w = read_window(store, "j", t0, t0 + 10 * S, read_liveness(store, "j", t0, t0 + 10 * S))
    assert w.host.rank.size == 0  # node rows are not a rank's heartbeat
    links = w.links
    assert links.host_names == ("node1",) and links.interface_names == ("job0",)
    assert links.tx_bytes.tolist() == [2_000_000] * 2
    assert links.tx_capacity_bps.tolist() == [30_000_000] * 2
    assert links.qdisc_overlimits.tolist() == [7, 7] and links.qdisc_backlog_bytes.tolist() == [4096] * 2
    assert dict(zip(links.rank.tolist(), links.rank_host.tolist(), strict=True)) == {0: -1, 1: 0}
