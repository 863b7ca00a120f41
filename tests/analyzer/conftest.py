"""Fixtures of the analyzer tests: a real chDB store per test, and synthetic jobs written into it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from argus.store import Store, open_store
from synthetic.jobs import Simulation


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh embedded store (chDB allows one open data dir per process: closed at teardown)."""
    s = open_store(f"chdb://{tmp_path / 'store'}")
    yield s
    s.close()


def _time_column(table: str) -> str:
    return {
        "steps": "start_ns",
        "phases": "start_ns",
        "collectives": "issue_ns",
        "host_samples": "time_ns",
    }.get(table, "time_ns")


def load(
    store: Store, sim: Simulation, hold: Callable[[str, pa.Table], np.ndarray] | None = None
) -> dict[str, pa.Table]:
    """Insert every table of ``sim`` (``Store.insert``); rows where ``hold`` is True are returned instead."""
    held = {}
    for name, table in sim.tables().items():
        keep = table
        if hold is not None:
            mask = hold(name, table)
            if mask.any():
                held[name] = table.filter(pa.array(mask))
                keep = table.filter(pa.array(~mask))
        if keep.num_rows:
            store.insert(name, keep)
    return held


def rows_between(rank: int, t0: int, t1: int) -> Callable[[str, pa.Table], np.ndarray]:
    """A ``hold`` selecting one rank's rows of every timed table with time in ``[t0, t1)``."""

    def pick(name: str, table: pa.Table) -> np.ndarray:
        if name in ("ranks", "kernel_summaries"):
            return np.zeros(table.num_rows, bool)
        r = table.column("rank").to_numpy()
        t = table.column(_time_column(name)).to_numpy()
        return (r == rank) & (t >= t0) & (t < t1)

    return pick
