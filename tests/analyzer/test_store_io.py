"""Reading a window's rank status from a real store: process groups, exits, devices."""

from __future__ import annotations

from argus.analyzer.store_io import read_liveness, read_window
from argus.schema import wire_table
from argus.store import Store

S = 1_000_000_000


def test_each_group_has_the_members_of_its_newest_row_and_exits_and_devices_are_kept(store: Store) -> None:
    t0 = 1_700_000_000 * S
    rows: dict[str, list[object]] = {k: [] for k in ("rank", "event", "time_ns", "group_name", "group_ranks")}
    rows |= {"device": [], "exit_code": []}

    def event(
        rank: int, kind: str, t: int, group: str = "", members: list[int] | None = None, **kw: object
    ) -> None:
        for k, v in (("rank", rank), ("event", kind), ("time_ns", t), ("group_name", group)):
            rows[k].append(v)
        rows["group_ranks"].append(members or [])
        rows["device"].append(kw.get("device", "cpu"))
        rows["exit_code"].append(kw.get("exit_code", 0))

    for r in range(4):  # every member reports the world group, and its pair
        event(r, "attach", t0, device="cuda:0" if r == 1 else "cpu")
        event(r, "group", t0 + 1, "0", [3, 2, 1, 0])
        event(r, "group", t0 + 2, str(1 + r // 2), [r - r % 2, r - r % 2 + 1])
    event(0, "group", t0 + 5 * S, "9", [0, 1])  # redefined later...
    event(0, "group", t0 + 6 * S, "9", [0, 3])  # ...its newest row counts
    event(2, "group", t0 + 20 * S, "7", [2])  # after the window: not known yet
    event(3, "exit", t0 + 7 * S, exit_code=1)
    n = len(rows["rank"])
    fixed = {"local_rank": [0] * n, "world_size": [4] * n, "host": ["node0"] * n, "pid": [1] * n}
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
