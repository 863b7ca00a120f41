"""The per-window tables' sort keys (argus.schema.by_second): a window's reads scan that window's
rows, not the job's; a store created with the keys of before still opens and reads the same windows."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from argus import schema
from argus.analyzer.store_io import Liveness, read_liveness, read_window
from argus.errors import TooManyRows
from argus.store import Store, open_store
from synthetic.fleet import Fleet

S = 1_000_000_000
WINDOW_NS = 10 * S
JOB = "layout"
#: The keys these tables had before they were sorted by time (a store created then keeps them).
OLD_KEYS = {
    "steps": ("job_id", "rank", "start_ns"),
    "phases": ("job_id", "rank", "start_ns"),
    "collectives": ("job_id", "process_group", "seq", "rank"),
    "host_samples": ("job_id", "rank", "time_ns"),
}


def _fill(store: Store, agents: int, windows: int) -> tuple[int, int]:
    """Store ``windows`` windows of a synchronous job of ``agents`` × 8 ranks (one rank slowed from
    window 2), as the node agents send it; ``(t0_ns, rows a window holds in the per-rank event
    tables)``: steps, phases, collectives, host samples (not its kernel summaries)."""
    t0 = 1_700_000_000 * S
    fleet = Fleet(agents, 8, t0_ns=t0, window_ns=WINDOW_NS, slow_rank=3, onset_ns=t0 + 2 * WINDOW_NS)
    for a in range(agents):
        for table, rows in fleet.lifecycle(a, t0 - S // 2).items():
            store.insert(table, _with_job(rows))
    end = t0 + windows * WINDOW_NS + 2 * S
    tables: dict[str, list[pa.Table]] = {}
    step = 0
    while fleet.step_end_ns(step) <= end:
        for table, rows in fleet.steps(step, 0, agents).items():
            tables.setdefault(table, []).append(rows)
        step += 1
    tables["host_samples"] = [fleet.host_samples(s, 0, agents) for s in range(1, windows * 10 + 3)]
    tables["kernel_summaries"] = [
        fleet.kernel_summaries(t0 + w * WINDOW_NS, 0, agents) for w in range(windows)
    ]
    rows = 0
    for table, parts in tables.items():
        data = pa.concat_tables(parts)
        rows += data.num_rows if table in OLD_KEYS else 0
        store.insert(table, _with_job(data))
    return t0, rows // windows


def _with_job(rows: pa.Table) -> pa.Table:
    return rows.add_column(0, "job_id", pa.array([JOB] * rows.num_rows, pa.string()))


def _windows(store: Store, t0: int, windows: int) -> list[dict[str, dict[str, Any]]]:
    """Every window as the analyzer reads it: each part's arrays in one row order (a store's row
    order is its own), with its other fields."""
    live, out = Liveness(), []
    for w in range(windows + 1):
        w0, w1 = t0 + w * WINDOW_NS, t0 + (w + 1) * WINDOW_NS
        live = live.merge(read_liveness(store, JOB, w0 - WINDOW_NS, w1))
        window = read_window(store, JOB, w0, w1, live)
        parts: dict[str, dict[str, Any]] = {}
        for name in ("steps", "phases", "collectives", "host", "kernels"):
            fields = {
                f.name: getattr(getattr(window, name), f.name)
                for f in dataclasses.fields(getattr(window, name))
            }
            arrays = {k: v for k, v in fields.items() if isinstance(v, np.ndarray)}
            order = np.lexsort([arrays[k] for k in sorted(arrays, reverse=True)])
            parts[name] = {k: v[order].tolist() for k, v in arrays.items()} | {
                k: v for k, v in fields.items() if not isinstance(v, np.ndarray)
            }
        parts["status"] = {
            "rank": window.status.rank.tolist(),
            "last_seen": window.status.last_seen_ns.tolist(),
        }
        out.append(parts)
    return out


def _sorting_keys(store: Store) -> dict[str, str]:
    t = store.query(
        "SELECT name, sorting_key FROM system.tables WHERE database = currentDatabase() "
        "AND name IN ('steps', 'phases', 'collectives', 'host_samples')"
    )
    return dict(zip(t.column("name").to_pylist(), t.column("sorting_key").to_pylist(), strict=True))


def test_a_windows_reads_scan_about_that_windows_rows_not_the_jobs(store: Store) -> None:
    """16 windows of 256 ranks: each window's reads (liveness and window) stay under 5 windows'
    rows (with whole granules). Keys led by the rank or the process group scan every window of the
    job in the phases' and collectives' reads."""
    windows = 16
    t0, per_window = _fill(store, 32, windows)
    assert _sorting_keys(store)["collectives"].startswith("job_id, intDiv(issue_ns, 1000000000)")
    bounded = store.reading_at_most(5 * per_window)
    live = Liveness()
    for w in (1, 8, 15):
        w0, w1 = t0 + w * WINDOW_NS, t0 + (w + 1) * WINDOW_NS
        try:
            live = live.merge(read_liveness(bounded, JOB, w0 - WINDOW_NS, w1))
            window = read_window(bounded, JOB, w0, w1, live)
        except TooManyRows:
            pytest.fail(f"window {w}'s reads scanned more than 5 windows' rows ({5 * per_window})")
        # Every step of the window is there, each with its four collectives.
        assert window.steps.rank.size >= 256 * 16
        assert int(np.count_nonzero(window.collectives.in_window)) == 4 * window.steps.rank.size


def test_a_store_created_with_the_keys_of_before_reads_the_same_windows(tmp_path: Any) -> None:
    """Tables created with the former keys keep them when today's code opens the store (ClickHouse
    cannot change a key's leading columns in place), and every window reads as from today's tables."""
    url = f"chdb://{tmp_path / 'store'}"
    old = open_store(url, create=False)
    try:
        before = {
            name: dataclasses.replace(schema.TABLES[name], order_by=key, indexes=())
            for name, key in OLD_KEYS.items()
        }
        with pytest.MonkeyPatch.context() as mp:
            for name, table in before.items():
                mp.setitem(schema.TABLES, name, table)
            for statement in schema.create_statements():
                old.command(statement)
    finally:
        old.close()
    store = open_store(url)  # today's code: creates what is missing, migrates, keeps the keys
    try:
        kept = _sorting_keys(store)
        assert kept == {name: ", ".join(key) for name, key in OLD_KEYS.items()}
        windows = 5
        t0, _ = _fill(store, 4, windows)
        from_old = _windows(store, t0, windows)
        # The same rows in tables of today's keys.
        for name in OLD_KEYS:
            store.command(f"RENAME TABLE {name} TO {name}_before")
        for statement in schema.create_statements():
            store.command(statement)
        for name in OLD_KEYS:
            store.command(f"INSERT INTO {name} SELECT * FROM {name}_before")
        assert all(not key.startswith("job_id, rank") for key in _sorting_keys(store).values())
        from_new = _windows(store, t0, windows)
    finally:
        store.close()
    assert sum(len(w["collectives"]["rank"]) for w in from_new) > 0
    assert from_old == from_new
