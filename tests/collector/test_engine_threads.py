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
#: count): a store whose ``steps`` keeps outdated parts (``old_parts_lifetime`` an hour) while 150
#: one-part inserts and an ``OPTIMIZE FINAL`` make hundreds of them; then, cleaned up every second
#: with a lifetime of 0, they all go in one cleanup. Prints the engine's global pool threads before
#: and after, the outdated parts held before the cleanup and those left. ``reset`` as a second
#: argument takes the table's part removal threshold back to the engine's default (100).
_CLEANUP = """
import json, sys, time
from argus.store import open_store
from tests.collector.wire import sample
import pyarrow as pa

store = open_store(sys.argv[1])
if sys.argv[2:] == ["reset"]:
    store.command("ALTER TABLE steps RESET SETTING concurrent_part_removal_threshold")
store.command(
    "ALTER TABLE steps MODIFY SETTING cleanup_delay_period = 1, cleanup_delay_period_random_add = 0, "
    "max_cleanup_delay_period = 1, old_parts_lifetime = 3600"
)
threads = "SELECT value FROM system.metrics WHERE metric = 'GlobalThread'"
outdated = "SELECT count() AS n FROM system.parts WHERE table = 'steps' AND NOT active"
before = store.query(threads).column("value")[0].as_py()
rows = sample("steps", n=10)
for k in range(150):
    store.insert("steps", rows.append_column("job_id", pa.array([f"job-{k}"] * rows.num_rows)))
store.command("OPTIMIZE TABLE steps FINAL")
held = store.query(outdated).column("n")[0].as_py()
store.command("ALTER TABLE steps MODIFY SETTING old_parts_lifetime = 0")
left, deadline = held, time.monotonic() + 120
while left and time.monotonic() < deadline:
    time.sleep(0.5)
    left = store.query(outdated).column("n")[0].as_py()
after = store.query(threads).column("value")[0].as_py()
print(json.dumps({"before": before, "after": after, "held": held, "left": left}))
"""


def _cleanup(store_dir: Path, *args: str) -> dict[str, int]:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CLEANUP, f"chdb://{store_dir}", *args],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    found: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
def test_removing_hundreds_of_outdated_parts_leaves_the_engine_no_new_threads(tmp_path: Path) -> None:
    """ClickHouse removes 100 or more outdated parts at once on a pool of up to 128 threads, which
    then stay in its global pool for the life of the process (in chDB: the server's, 35-40 MB in
    bench/soak.py). With ``concurrent_part_removal_threshold`` past any count the cleanup thread
    removes them alone: the engine's threads stay within a few of what they were. The same cleanup
    with the engine's default threshold grows them (measured: 16 -> 144), so the bound is the
    setting's doing."""
    found = _cleanup(tmp_path / "store")
    assert found["held"] >= 100 and found["left"] == 0, found
    assert found["after"] - found["before"] <= 8, found
    default = _cleanup(tmp_path / "default", "reset")
    assert default["held"] >= 100 and default["left"] == 0, default
    assert default["after"] - default["before"] > 8, default


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
