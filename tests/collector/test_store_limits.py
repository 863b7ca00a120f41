"""Store calls are bounded (issue 12): every call carries max_execution_time and max_memory_usage."""

from __future__ import annotations

import pyarrow as pa
import pytest

from argus.config import DEFAULT_STORE_MEMORY_BYTES, DEFAULT_STORE_TIMEOUT_S
from argus.errors import ConfigError, StoreError
from argus.store import Store, open_store
from tests.collector.wire import sample


def _setting(store: Store, name: str) -> int:
    return int(store.query(f"SELECT toUInt64(getSetting('{name}')) AS v").column("v")[0].as_py())


def test_every_call_carries_the_default_limits(store: Store) -> None:
    assert _setting(store, "max_execution_time") == DEFAULT_STORE_TIMEOUT_S
    assert _setting(store, "max_memory_usage") == DEFAULT_STORE_MEMORY_BYTES


def test_a_call_past_a_limit_fails_and_the_store_goes_on(store_url: str) -> None:
    store = open_store(store_url, timeout_s=1, memory_bytes=64 * 1024**2)
    try:
        with pytest.raises(StoreError, match="TIMEOUT_EXCEEDED"):
            store.query("SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) = 0")
        with pytest.raises(StoreError, match="MEMORY_LIMIT_EXCEEDED"):
            store.query("SELECT length(groupArray(number)) AS n FROM numbers(100000000)")
        with pytest.raises(StoreError, match="TIMEOUT_EXCEEDED"):
            store.command("SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) = 0")
        # The store still answers and writes.
        rows = sample("steps")
        store.insert("steps", rows.append_column("job_id", pa.array(["j"] * rows.num_rows)))
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() > 0
    finally:
        store.close()


def test_limits_below_one_are_refused(store_url: str) -> None:
    with pytest.raises(ConfigError, match="store limits"):
        open_store(store_url, timeout_s=0)


def test_two_stores_of_one_process_keep_their_own_limits(store: Store, store_url: str) -> None:
    """The embedded engine holds the limits per client session (set once), not process-wide."""
    other = open_store(store_url, timeout_s=3, memory_bytes=96 * 1024**2)
    try:
        assert _setting(other, "max_execution_time") == 3
        assert _setting(other, "max_memory_usage") == 96 * 1024**2
        assert _setting(store, "max_execution_time") == DEFAULT_STORE_TIMEOUT_S
        assert _setting(store, "max_memory_usage") == DEFAULT_STORE_MEMORY_BYTES
    finally:
        other.close()
    assert _setting(store, "max_execution_time") == DEFAULT_STORE_TIMEOUT_S
