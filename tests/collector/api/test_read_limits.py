"""Issue 12: REST reads are bounded in rows *read* (``--max-read-rows``), not only in rows returned.

A trace or heatmap whose range would scan more of the store than the limit is answered 422
naming the limit and the flag, at once, and the same server goes on answering other requests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from argus.cli import build_parser
from argus.collector.api import create_app
from argus.config import DEFAULT_MAX_READ_ROWS, ApiSettings, ServerConfig
from argus.errors import ConfigError, TooManyRows
from argus.metrics import Metrics
from argus.store import Store
from synthetic.wire import insert_direct, synthetic_job

#: Far below the big job's rows (64 ranks x 400 steps: 25,600 steps, 102,400 phases), above what
#: the primary key leaves of the small job (a few 8,192-row granules).
LIMIT = 40_000


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    insert_direct(store, "big", synthetic_job(world_size=64, steps=400))
    insert_direct(store, "small", synthetic_job(world_size=4, steps=10))
    with TestClient(create_app(store, metrics=Metrics(), settings=ApiSettings(max_read_rows=LIMIT))) as c:
        yield c


@pytest.mark.parametrize("path", ["/api/v1/jobs/big/trace", "/api/v1/jobs/big/heatmap?metric=forward"])
def test_a_read_past_the_limit_is_422_naming_it(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert "40,000 rows" in detail and "--max-read-rows" in detail and "max_read_rows" in detail


def test_the_server_goes_on_serving_other_reads(client: TestClient) -> None:
    assert client.get("/api/v1/jobs/big/trace").status_code == 422
    small = client.get("/api/v1/jobs/small/trace")
    assert small.status_code == 200 and {e["pid"] for e in small.json()["traceEvents"]} == {0, 1, 2, 3}
    assert client.get("/api/v1/jobs/small/heatmap").status_code == 200
    assert {j["job_id"] for j in client.get("/api/v1/jobs").json()["items"]} == {"big", "small"}


def test_the_store_view_counts_rows_read_and_leaves_the_store_unbounded(store: Store) -> None:
    insert_direct(store, "big", synthetic_job(world_size=64, steps=400))
    sql = "SELECT count() FROM phases WHERE job_id = 'big' AND dur_ns > 0"
    with pytest.raises(TooManyRows) as raised:
        store.reading_at_most(LIMIT).query(sql)
    assert raised.value.limit == LIMIT
    assert store.query(sql).column(0)[0].as_py() == 64 * 400 * 4
    with pytest.raises(ConfigError):
        store.reading_at_most(0)


def test_argus_server_takes_max_read_rows() -> None:
    args = build_parser().parse_args(["server", "--max-read-rows", "5000"])
    assert ServerConfig.from_args(args).max_read_rows == 5000
    assert (
        ServerConfig.from_args(build_parser().parse_args(["server"])).max_read_rows == DEFAULT_MAX_READ_ROWS
    )
    with pytest.raises(ConfigError, match="--max-read-rows"):
        ServerConfig.from_args(build_parser().parse_args(["server", "--max-read-rows", "0"]))
