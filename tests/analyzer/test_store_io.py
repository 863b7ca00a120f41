"""Reading a window's rank status from a real store: process groups, exits, devices, hosts."""

from __future__ import annotations

import numpy as np

from argus.analyzer.store_io import read_liveness, read_window
from argus.schema import wire_table
from argus.store import Store

S = 1_000_000_000


def test_each_group_has_the_members_of_its_newest_row_and_exits_devices_and_hosts_are_kept(
    store: Store,
) -> None:
    t0 = 1_700_000_000 * S
    rows: dict[str, list[object]] = {k: [] for k in ("rank", "event", "time_ns", "group_name", "group_ranks")}
    rows |= {"device": [], "exit_code": [], "host": []}

    def event(
        rank: int, kind: str, t: int, group: str = "", members: list[int] | None = None, **kw: object
    ) -> None:
        for k, v in (("rank", rank), ("event", kind), ("time_ns", t), ("group_name", group)):
            rows[k].append(v)
        rows["group_ranks"].append(members or [])
        rows["device"].append(kw.get("device", "cpu"))
        rows["exit_code"].append(kw.get("exit_code", 0))
        rows["host"].append(kw.get("host", "node0"))

    for r in range(4):  # every member reports the world group, and its pair
        event(r, "attach", t0, device="cuda:0" if r == 1 else "cpu", host=f"node{r // 2}")
        event(r, "group", t0 + 1, "0", [3, 2, 1, 0])
        event(r, "group", t0 + 2, str(1 + r // 2), [r - r % 2, r - r % 2 + 1])
    event(0, "group", t0 + 5 * S, "9", [0, 1])  # redefined later...
    event(0, "group", t0 + 6 * S, "9", [0, 3])  # ...its newest row counts
    event(2, "group", t0 + 20 * S, "7", [2])  # after the window: not known yet
    event(3, "exit", t0 + 7 * S, exit_code=1)
    event(1, "attach", t0 + 8 * S, host="node7")  # restarted elsewhere: its newest attach counts
    n = len(rows["rank"])
    fixed = {"local_rank": [0] * n, "world_size": [4] * n, "pid": [1] * n}
    fixed |= {"agent_id": ["a"] * n, "clock_offset_ns": [0] * n, "group_backend": ["gloo"] * n}
    store.insert("ranks", wire_table("ranks", rows | fixed, job_id="j"))
    w1 = t0 + 10 * S
    status = read_window(store, "j", t0, w1, read_liveness(store, "j", t0, w1)).status
    assert {g: m.tolist() for g, m in status.groups.items()} == {
        "0": [0, 1, 2, 3],
        "1": [0, 1],
        "2": [2, 3],
        "9": [0, 3],
    }
    assert status.rank.tolist() == [0, 1, 2, 3]
    assert status.exited.tolist() == [False, False, False, True]
    assert status.exit_code.tolist() == [0, 0, 0, 1]
    assert status.has_gpu.tolist() == [False, True, False, False]
    assert [status.hosts[h] for h in status.host.tolist()] == ["node0", "node7", "node1", "node1"]


def test_the_newest_heartbeat_says_which_collective_a_rank_waits_in_across_reads(store: Store) -> None:
    """A rank's ``waiting_since_ns`` is the issue time of the collective its newest host sample shows
    pending (-1 when that sample shows none), and a later read's heartbeat replaces an earlier one."""
    t0 = 1_700_000_000 * S
    beats = [  # (rank, time, pending seq, its issue time)
        (0, t0 + 1 * S, 7, t0 + 500_000_000),
        (0, t0 + 2 * S, -1, 0),  # rank 0's all-reduce completed: it waits in nothing now
        (1, t0 + 1 * S, -1, 0),
        (1, t0 + 2 * S, 8, t0 + 1_500_000_000),  # rank 1 waits in seq 8 since 1.5 s
        (1, t0 + 12 * S, -1, 0),  # ...and no longer, per the next read's newest sample
    ]
    n = len(beats)
    cols: dict[str, list[object]] = {
        "rank": [b[0] for b in beats],
        "time_ns": [b[1] for b in beats],
        "pending_seq": [b[2] for b in beats],
        "pending_issue_ns": [b[3] for b in beats],
        "pending_group": ["0" if b[2] >= 0 else "" for b in beats],
        "pending_op": ["allreduce" if b[2] >= 0 else "" for b in beats],
        "host": ["node0"] * n,
        "interval_ns": [S] * n,
    }
    for zero in ("proc_cpu_ns", "gc_pause_ns", "gc_count", "rss_bytes", "dropped_events", "gpu_sm_clock_mhz"):
        cols[zero] = [0] * n
    for zero in ("host_cpu_pct", "gpu_temp_c", "gpu_power_w", "gpu_util_pct", "gpu_throttle_reasons"):
        cols[zero] = [0] * n
    store.insert("host_samples", wire_table("host_samples", cols, job_id="j"))
    first = read_liveness(store, "j", t0, t0 + 10 * S)
    status = read_window(store, "j", t0, t0 + 10 * S, first).status
    assert status.rank.tolist() == [0, 1]
    assert status.waiting_since_ns.tolist() == [-1, t0 + 1_500_000_000]
    later = first.merge(read_liveness(store, "j", t0 + 10 * S, t0 + 20 * S))
    status = read_window(store, "j", t0 + 10 * S, t0 + 20 * S, later).status
    assert status.waiting_since_ns.tolist() == [-1, -1]
    assert later.last_seen == {0: t0 + 2 * S, 1: t0 + 12 * S}
    # An older read merged after a newer one does not bring its stale heartbeat back.
    assert later.merge(first).heartbeat == later.heartbeat


def test_pairs_are_matched_as_sqls_tuple_in_whatever_their_values() -> None:
    """``_pairs_in`` (a table over the set's ranges, sorting only when sparse) marks the rows whose
    pair is in the set, as SQL's ``(a, b) IN``: dense, sparse (a restarted rank), empty, and values
    no key packs (an older store's steps and seqs past the limits, read as int64: negative)."""
    from argus.analyzer.store_io import _pairs_in

    rng = np.random.default_rng(5)
    for trial in range(400):
        n, m = int(rng.integers(0, 200)), int(rng.integers(0, 300))
        s_rank = rng.integers(0, 30, n)
        s_step = rng.integers(0, 12 if trial % 4 else 10**9, n)
        if trial % 5 == 4:  # past the limits: the largest uint64 steps, ranks past 2**23
            s_step[rng.random(n) < 0.3] = -1
            s_rank[rng.random(n) < 0.3] += 1 << 30
        rank = rng.integers(-1, 33, m)
        step = np.where(
            rng.random(m) < 0.5, s_step[rng.integers(0, n, m)] if n else 0, rng.integers(0, 14, m)
        )
        if n and trial % 5 == 4:
            rank = np.where(rng.random(m) < 0.5, s_rank[rng.integers(0, n, m)], rank)
            extreme = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)
            step = np.where(rng.random(m) < 0.1, extreme[rng.integers(0, 2, m)], step)
            rank = np.where(rng.random(m) < 0.1, extreme[rng.integers(0, 2, m)], rank)
        pairs = set(zip(s_rank.tolist(), s_step.tolist(), strict=True))
        expected = [(r, s) in pairs for r, s in zip(rank.tolist(), step.tolist(), strict=True)]
        assert _pairs_in(rank, step, s_rank, s_step).tolist() == expected
    # A dense set (a table) and rows whose difference from its ranges overflows int64.
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    rank = np.array([small, big, 0, 1, small + 1, 2, 1], np.int64)
    step = np.array([0, 1, big, small, 1, 3, -1], np.int64)
    assert _pairs_in(rank, step, np.array([0, 1, 2]), np.array([-1, 1, 3])).tolist() == [
        False,
        False,
        False,
        False,
        False,
        True,
        False,
    ]
    assert _pairs_in(rank, step, np.array([big, 2]), np.array([1, 3])).tolist() == [
        False,
        True,
        False,
        False,
        False,
        True,
        False,
    ]
