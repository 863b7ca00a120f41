"""Reads whose cost one request cannot grow without bound, over a live app on real chDB: the rows
each answer takes from the store are counted by a wrapper that passes every call on."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pyarrow as pa
import pytest

from argus.collector.api.jobs import MAX_SUGGESTION_IDS
from argus.collector.api.stacks import MAX_FOLDED_STACKS
from argus.metrics import Metrics
from argus.store import Store
from tests.collector.api.conftest import LiveApp
from tests.collector.wire import sample


class Counted:
    """``store``, with the rows each query returned recorded in ``returned`` (shared by its views)."""

    def __init__(self, store: Store, returned: list[int] | None = None) -> None:
        self.store = store
        self.url, self.embedded = store.url, store.embedded
        self.returned: list[int] = [] if returned is None else returned

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        found = self.store.query(sql, parameters)
        self.returned.append(found.num_rows)
        return found

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        self.store.insert(table, data, dedup_token=dedup_token)

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.store.command(sql, parameters)

    def close(self) -> None:
        self.store.close()

    def beside(self) -> Store:
        return self.store.beside()

    def reading_at_most(self, rows: int) -> Counted:
        return Counted(self.store.reading_at_most(rows), self.returned)


@pytest.fixture
def counted(store: Store) -> Iterator[tuple[Counted, str]]:
    wrapper = Counted(store)
    app = LiveApp(wrapper, Metrics()).start()  # type: ignore[arg-type]
    yield wrapper, app.url
    app.stop()


def _rows(table: str, n: int, job_ids: list[str] | str, **columns: Any) -> pa.Table:
    data = sample(table, n=n)
    for name, values in columns.items():
        data = data.set_column(
            data.schema.get_field_index(name), name, pa.array(values, data.schema.field(name).type)
        )
    jobs = job_ids if isinstance(job_ids, list) else [job_ids] * n
    return data.add_column(0, "job_id", pa.array(jobs, pa.string()))


def test_an_unknown_job_is_compared_with_a_bounded_number_of_ids(
    store: Store, counted: tuple[Counted, str]
) -> None:
    """5,000 stored ids like the unknown one: at most MAX_SUGGESTION_IDS are read and compared, and
    the closest is still named."""
    wrapper, url = counted
    ids = [f"train-2026-12-06-{k:05d}" for k in range(5_000)]
    store.insert("ranks", _rows("ranks", len(ids), ids, time_ns=list(range(len(ids)))))
    wrapper.returned.clear()
    reply = httpx.get(f"{url}/api/v1/jobs/train-2026-12-06-04999x", timeout=60)
    assert reply.status_code == 404
    assert "train-2026-12-06-04999" in reply.json()["detail"]
    assert max(wrapper.returned) <= MAX_SUGGESTION_IDS


def test_folded_stacks_stop_at_the_bound_keeping_the_most_sampled(
    store: Store, counted: tuple[Counted, str]
) -> None:
    wrapper, url = counted
    n = MAX_FOLDED_STACKS + 10
    frames = [f"main;work_{k}" for k in range(n)]
    counts = [1] * n
    counts[-1] = 99  # the most sampled stack is kept, whatever its place
    store.insert("ranks", _rows("ranks", 1, "deep"))
    store.insert("stacks", _rows("stacks", n, "deep", frames=frames, count=counts))
    wrapper.returned.clear()
    reply = httpx.get(f"{url}/api/v1/jobs/deep/stacks", params={"format": "collapsed"}, timeout=120)
    assert reply.status_code == 200, reply.text
    lines = reply.text.splitlines()
    assert len(lines) == MAX_FOLDED_STACKS
    assert any(line.endswith(f"main;work_{n - 1} 99") for line in lines)
    assert max(wrapper.returned) <= MAX_FOLDED_STACKS


def test_a_trace_holds_at_most_max_events_rows_of_the_four_tables(
    store: Store, counted: tuple[Counted, str]
) -> None:
    """300 rows in each of steps, phases, collectives and kernel events, max_events=200: the
    queries return at most 200 event rows together (before: 201 of each table, 804)."""
    wrapper, url = counted
    for table in ("steps", "phases", "collectives", "kernel_events"):
        store.insert(table, _rows(table, 300, "long", rank=[0] * 300))
    store.insert("ranks", _rows("ranks", 1, "long", rank=[0]))
    wrapper.returned.clear()
    reply = httpx.get(f"{url}/api/v1/jobs/long/trace", params={"max_events": 200}, timeout=60)
    assert reply.status_code == 200, reply.text
    doc = reply.json()
    assert doc["otherData"]["truncated"] is True
    assert 0 < sum(1 for e in doc["traceEvents"] if e["ph"] == "X") <= 200
    event_rows = sum(wrapper.returned) - 10  # the job check, the cutoff and the metadata: a few rows
    assert event_rows <= 200, wrapper.returned
