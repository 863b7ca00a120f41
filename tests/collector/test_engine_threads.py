"""The embedded engine's threads are the server's memory: a store's cleanup must not grow them for good."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from argus.schema import PART_REMOVAL_THRESHOLD, TABLE_SETTINGS, TABLES
from argus.store import Store, open_store

#: Run in a process of its own (one embedded engine per process, so no earlier test's threads
#: count): a store, its ``steps`` cleaned up every second, 300 one-part inserts merged and their
#: outdated parts removed; prints the engine's global pool threads before and after, and the
#: outdated parts left.
_CLEANUP = """
import json, sys, time
from argus.store import open_store
from tests.collector.wire import sample
import pyarrow as pa

store = open_store(sys.argv[1])
store.command(
    "ALTER TABLE steps MODIFY SETTING cleanup_delay_period = 1, cleanup_delay_period_random_add = 0, "
    "max_cleanup_delay_period = 1, old_parts_lifetime = 0"
)
threads = "SELECT value FROM system.metrics WHERE metric = 'GlobalThread'"
outdated = "SELECT count() AS n FROM system.parts WHERE table = 'steps' AND NOT active"
before = store.query(threads).column("value")[0].as_py()
rows = sample("steps", n=10)
for k in range(300):
    store.insert("steps", rows.append_column("job_id", pa.array([f"job-{k}"] * rows.num_rows)))
removed, deadline = 0, time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(1)
    left = store.query(outdated).column("n")[0].as_py()
    if removed and left == 0:
        break
    removed = removed or left >= 100
after = store.query(threads).column("value")[0].as_py()
print(json.dumps({"before": before, "after": after, "left": left}))
"""


@pytest.mark.slow
def test_removing_hundreds_of_outdated_parts_leaves_the_engine_no_new_threads(tmp_path: Path) -> None:
    """ClickHouse removes 100 or more outdated parts at once on a pool of up to 128 threads, which
    then stay in its global pool for the life of the process (in chDB: the server's, 35-40 MB in
    bench/soak.py). With ``concurrent_part_removal_threshold`` past any count the cleanup thread
    removes them alone: the engine's threads stay within a few of what they were."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CLEANUP, f"chdb://{tmp_path / 'store'}"],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["left"] == 0, found
    assert found["after"] - found["before"] <= 8, found


def _engines(store: Store) -> dict[str, str]:
    found = store.query("SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()")
    return dict(zip(found.column("name").to_pylist(), found.column("engine_full").to_pylist(), strict=True))


def test_every_table_carries_the_part_removal_threshold_and_an_older_store_gets_it(tmp_path: Path) -> None:
    """Read back from the engine: a new store's tables, and those of a store created without it."""
    assert TABLE_SETTINGS["concurrent_part_removal_threshold"] == PART_REMOVAL_THRESHOLD
    setting = f"concurrent_part_removal_threshold = {PART_REMOVAL_THRESHOLD}"
    url = f"chdb://{tmp_path / 'store'}"
    store = open_store(url)
    try:
        engines = _engines(store)
        assert set(TABLES) <= set(engines)
        assert all(setting in engines[name] for name in TABLES), engines
        for name in TABLES:  # as a store made before the setting existed
            store.command(f"ALTER TABLE {name} RESET SETTING concurrent_part_removal_threshold")
        assert not any(setting in e for e in _engines(store).values())
    finally:
        store.close()
    store = open_store(url)
    try:
        assert all(setting in _engines(store)[name] for name in TABLES)
    finally:
        store.close()
