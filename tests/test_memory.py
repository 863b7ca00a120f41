"""The server's allocators give freed pages back at once (argus/memory.py, docs/design.md §11).

Each check runs in a process of its own: the engine reads its allocator's options once, when its
library loads, and Arrow's default pool is one per process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Opens an embedded store the way every part does and prints the engine allocator's options
#: as the engine reports them (jemalloc's own statistics, read through the store).
_ENGINE = """
import sys
from argus.store import open_store
store = open_store(sys.argv[1])
stats = store.query("SELECT * FROM system.jemalloc_stats")
print("\\n".join(str(v) for column in stats.columns for v in column.to_pylist()))
"""

#: A ZSTD batch that inflates to 64 MiB, charged to the collector's decoded-bytes budget, decoded
#: the way the collector decodes a large batch (in a decoding thread that lives on, into
#: :func:`argus.memory.decoding_pool`), let go by another thread (as the writer does), then its
#: charge given back: prints the process's anonymous resident memory before, holding and after
#: (MiB).
_ARROW = """
import asyncio, json, re
from concurrent.futures import ThreadPoolExecutor
from argus.collector.decoded_budget import DecodedBudget, batch_cost
from argus.collector.grpc_service import DECODE_THREADS
from argus.collector.ingest import decode
from argus.ipc_size import scan
from argus.memory import decoding_pool
from argus.proto import collector_pb2 as pb
from synthetic.bad_inputs import inflating_steps

def anon_mb():
    status = open("/proc/self/status").read()
    return int(re.search(r"RssAnon:\\s+(\\d+)", status).group(1)) / 1024

payload = inflating_steps(64 << 20)
batch = pb.Batch(agent_id="a", seq=1, job_id="job-mem", table=pb.STEPS, arrow_ipc=payload)
decoders = ThreadPoolExecutor(DECODE_THREADS)
found = {}

async def main():
    budget = DecodedBudget(1 << 30)
    cost = batch_cost(scan(payload))
    await budget.acquire(cost)
    found["before"] = anon_mb()
    decoded = decoders.submit(decode, batch, decoding_pool()).result()
    found["holding"] = anon_mb()
    found["rows"] = decoded.data.num_rows
    del decoded
    budget.release(cost)
    found["after"] = anon_mb()

asyncio.run(main())
print(json.dumps(found))
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _dirty_decay_ms(stats: str) -> int:
    found = re.search(r"opt\.dirty_decay_ms: (-?\d+)", stats)
    assert found, stats[:2000]
    return int(found.group(1))


def _without_malloc_conf() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "JE_MALLOC_CONF"}


def test_the_embedded_engine_gives_freed_pages_back_within_a_second(tmp_path: Path) -> None:
    """Read back from the engine's allocator: ``dirty_decay_ms`` 1,000, not ClickHouse's 5,000 (pages
    freed by merges and inserts stayed resident up to 5 s, 12-49 MB of the soak's server)."""
    stats = _run(_ENGINE, f"chdb://{tmp_path / 'store'}", env=_without_malloc_conf())
    assert _dirty_decay_ms(stats) == 1000
    assert re.search(r"opt\.muzzy_decay_ms: 0\b", stats), "and no page kept as muzzy"


def test_an_operator_setting_for_the_engine_allocator_is_kept(tmp_path: Path) -> None:
    env = {**_without_malloc_conf(), "JE_MALLOC_CONF": "dirty_decay_ms:2000"}
    assert _dirty_decay_ms(_run(_ENGINE, f"chdb://{tmp_path / 'store'}", env=env)) == 2000


def test_a_decoded_batch_let_go_leaves_nothing_resident_once_the_budget_is_empty() -> None:
    """Before, Arrow's default pool (mimalloc) kept the 64 MiB resident after the batch was let go
    (bench/soak.py's server kept ~140 MB so after its first burst, beside its 128 MiB budget)."""
    found = json.loads(_run(_ARROW, env=_without_malloc_conf()).strip().splitlines()[-1])
    assert found["holding"] - found["before"] >= 48, found
    assert found["after"] - found["before"] <= 8, found
