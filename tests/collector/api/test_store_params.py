"""chDB query parameters: ClickHouse's escaped-text format, and parallel queries from threads.

Both were bugs in ChdbStore found by the API (tabs/backslashes in a job id failed; parameters
of concurrent queries leaked into each other); the REST API depends on both fixes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa

from argus.store import Store


def test_strings_and_arrays_round_trip(store: Store) -> None:
    for value in ["plain", "tab\there", "new\nline", "back\\slash", "quote'", "ünïcode", "nul\x00byte"]:
        got = store.query("SELECT {v:String} AS v", {"v": value}).column("v")[0].as_py()
        assert got == value
    got = store.query("SELECT {v:Array(String)} AS v", {"v": ["a'b", "c\\d", "e\tf"]}).column("v")[0].as_py()
    assert got == ["a'b", "c\\d", "e\tf"]
    job = "job\twith\\odd'chars"
    rows = pa.table(
        {
            "job_id": [job],
            "rank": pa.array([3], pa.uint32()),
            "step": pa.array([1], pa.uint64()),
            "start_ns": [10],
            "dur_ns": [5],
        }
    )
    store.insert("steps", rows)
    found = (
        store.query("SELECT rank FROM steps WHERE job_id = {j:String}", {"j": job}).column("rank").to_pylist()
    )
    assert found == [3]


def test_parallel_parameterized_queries_see_their_own_values(store: Store) -> None:
    wrong: list[object] = []

    def work(thread: int) -> None:
        for i in range(40):
            value = thread * 1000 + i
            try:
                got = store.query("SELECT {v:Int64} AS v", {"v": value}).column("v")[0].as_py()
                if got != value:
                    wrong.append((value, got))
            except Exception as exc:  # a leaked/missing parameter is an error from chDB
                wrong.append((value, str(exc)[:80]))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


_INSERT_WHILE_QUERYING = """
import sys, threading, time
import pyarrow as pa
from argus.store import open_store
store = open_store("chdb://" + sys.argv[1])
rows = pa.table({"job_id": ["j"] * 500, "rank": pa.array(range(500), pa.uint32()),
                 "step": pa.array([1] * 500, pa.uint64()), "start_ns": list(range(500)), "dur_ns": [5] * 500})
stop = time.monotonic() + 3
def insert():
    while time.monotonic() < stop:
        store.insert("steps", rows)
def query():
    while time.monotonic() < stop:
        store.query("SELECT count() AS n FROM steps WHERE job_id = {j:String}", {"j": "j"})
threads = [threading.Thread(target=insert), threading.Thread(target=query)]
for t in threads:
    t.start()
for t in threads:
    t.join()
store.close()
print("done")
"""


def test_insert_and_parameterized_query_in_parallel_do_not_deadlock(tmp_path: Path) -> None:
    """An insert (Python() table function) running while a parameterized query runs hung both in chDB."""
    result = subprocess.run(
        [sys.executable, "-c", _INSERT_WHILE_QUERYING, str(tmp_path / "data")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-2000:]
