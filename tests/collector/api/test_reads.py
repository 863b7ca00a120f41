"""The API's reading of the store: job status rule, diagnoses (FINAL, contract shape), heatmap, trace.

The app runs in-process over a real chDB store filled with ``Store.insert`` (diagnoses are
not a wire table: only the analyzer writes them), so each rule can be set up exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from argus.collector.api import create_app
from argus.diagnosis import Diagnosis
from argus.metrics import Metrics
from argus.store import Store
from synthetic.wire import diagnosis_row, insert_direct, synthetic_job

MINUTE_NS = 60 * 10**9


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(store, metrics=Metrics())) as c:
        yield c


def test_status_rule(store: Store, client: TestClient) -> None:
    now = time.time_ns()
    insert_direct(store, "live", synthetic_job(world_size=2, steps=3))
    insert_direct(
        store, "done", synthetic_job(world_size=2, steps=3, exited=True, start_ns=now - 10 * MINUTE_NS)
    )
    insert_direct(store, "silent", synthetic_job(world_size=2, steps=3, start_ns=now - 10 * MINUTE_NS))
    imported = pa.table(
        {
            "job_id": ["trace"],
            "world_size": pa.array([2], pa.uint32()),
            "start_ns": [now - 60 * MINUTE_NS],
            "command": ["python train.py"],
            "source": ["import"],
        }
    )
    store.insert("jobs", imported)
    jobs = {j["job_id"]: j for j in client.get("/api/v1/jobs").json()["items"]}
    assert {k: j["status"] for k, j in jobs.items()} == {
        "live": "running",
        "done": "finished",
        "silent": "unknown",
        "trace": "finished",
    }
    assert jobs["done"]["ranks_exited"] == 2 and jobs["done"]["end_ns"] is not None
    assert jobs["silent"]["end_ns"] is None and jobs["trace"]["command"] == "python train.py"
    # Newest first: live started last.
    assert next(iter(jobs)) == "live"
    ranks = client.get("/api/v1/jobs/silent/ranks").json()["items"]
    assert [r["status"] for r in ranks] == ["unknown", "unknown"]
    assert ranks[0]["groups"] == [{"name": "default_pg", "backend": "gloo", "size": 2}]


def test_jobs_pagination_visits_every_job_once(store: Store, client: TestClient) -> None:
    now = time.time_ns()
    for i in range(7):
        insert_direct(store, f"job-{i}", synthetic_job(world_size=1, steps=1, start_ns=now - i * MINUTE_NS))
    seen, cursor = [], None
    while True:
        page = client.get(
            "/api/v1/jobs", params={"limit": 3, **({"cursor": cursor} if cursor else {})}
        ).json()
        assert len(page["items"]) <= 3
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [f"job-{i}" for i in range(7)]


def test_diagnoses_final_shape_filters_and_pages(store: Store, client: TestClient) -> None:
    now = time.time_ns()
    insert_direct(store, "j", synthetic_job(world_size=4, steps=2))
    store.insert(
        "diagnoses", diagnosis_row("j", "a", state="open", updated_ns=1, first_ns=now - 5 * MINUTE_NS)
    )
    # A newer version of "a": FINAL must show only this one.
    store.insert(
        "diagnoses", diagnosis_row("j", "a", state="resolved", updated_ns=2, first_ns=now - 5 * MINUTE_NS)
    )
    store.insert(
        "diagnoses",
        diagnosis_row(
            "j", "b", state="open", updated_ns=1, first_ns=now - MINUTE_NS, cause="dataloader", rank=None
        ),
    )
    store.insert(
        "diagnoses", diagnosis_row("j", "c", state="open", updated_ns=1, first_ns=now - 2 * MINUTE_NS)
    )
    items = client.get("/api/v1/jobs/j/diagnoses").json()["items"]
    assert [d["id"] for d in items] == ["b", "c", "a"]
    assert items[2]["state"] == "resolved"
    for item in items:
        assert list(item) == list(Diagnosis.from_dict(item).to_dict())
        assert Diagnosis.from_dict(item).to_dict() == item
    assert items[0]["rank"] is None and items[0]["evidence"] == {
        "forward_ms": {"rank": 30.0, "peers_median": 10.0}
    }
    every = client.get("/api/v1/jobs/j/diagnoses?state=all").json()["items"]
    assert [d["id"] for d in every] == ["b", "c", "a"]  # `all`: open and resolved, as without `state`
    assert all(d["summary"].endswith(".") for d in every)
    open_ids = [d["id"] for d in client.get("/api/v1/jobs/j/diagnoses?state=open").json()["items"]]
    assert open_ids == ["b", "c"]
    assert [d["id"] for d in client.get("/api/v1/jobs/j/diagnoses?cause=dataloader").json()["items"]] == ["b"]
    first = client.get("/api/v1/jobs/j/diagnoses?limit=2").json()
    second = client.get("/api/v1/jobs/j/diagnoses", params={"limit": 2, "cursor": first["next"]}).json()
    assert [d["id"] for d in first["items"] + second["items"]] == ["b", "c", "a"] and second["next"] is None
    assert client.get("/api/v1/jobs/j").json()["open_diagnoses"] == 2


def test_heatmap_shows_the_slow_rank(store: Store, client: TestClient) -> None:
    insert_direct(store, "h", synthetic_job(world_size=8, steps=10, slow_rank=6, slow_phase="backward"))
    busy = client.get("/api/v1/jobs/h/heatmap?bins=5").json()
    assert [r["rank_lo"] for r in busy["rows"]] == list(range(8))
    assert len(busy["times_ns"]) == 5
    worst = [max(v for v in line if v is not None) for line in busy["slowdown_pct"]]
    assert worst.index(max(worst)) == 6 and worst[6] > 30 and max(worst[:6]) < 1
    step = client.get("/api/v1/jobs/h/heatmap?metric=step&bins=5").json()
    assert max(v for line in step["slowdown_pct"] for v in line if v is not None) < 1  # synchronous steps
    backward = client.get("/api/v1/jobs/h/heatmap?metric=backward&max_rows=3").json()
    assert [(r["rank_lo"], r["rank_hi"]) for r in backward["rows"]] == [(0, 2), (3, 5), (6, 7)]
    assert backward["dur_ms"][2][0] == pytest.approx(60.0) and backward["dur_ms"][0][0] == pytest.approx(20.0)


def test_trace_is_a_chrome_trace_of_the_chosen_ranks_and_range(store: Store, client: TestClient) -> None:
    tables = synthetic_job(world_size=4, steps=6)
    insert_direct(store, "t", tables)
    steps = tables["steps"].to_pylist()
    start, end = steps[8]["start_ns"], steps[16]["start_ns"]  # steps 2..4
    doc = client.get(f"/api/v1/jobs/t/trace?ranks=1,3&start={start}&end={end}").json()
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == {1, 3}
    assert {e["cat"] for e in complete} == {"step", "phase", "collective", "kernel"}
    assert doc["otherData"]["base_ns"] == start and not doc["otherData"]["truncated"]
    for e in complete:
        assert e["ts"] + e["dur"] >= 0 and e["ts"] <= (end - start) / 1000
    assert {e["args"]["step"] for e in complete if e["cat"] == "step"} == {2, 3, 4}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(1, "rank 1 (node0)"), (3, "rank 3 (node1)")}
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert lanes == {"steps", "phases", "collectives default_pg", "stream 7"}
    collective = next(e for e in complete if e["cat"] == "collective")
    assert collective["args"]["process_group"] == "default_pg" and collective["args"]["bytes"] == 4 << 20
    # A capped trace is every event that begins before a time, at most max_events of them (events
    # sharing the first time past the cap are left out together).
    capped = client.get("/api/v1/jobs/t/trace?max_events=10").json()
    kept = [e for e in capped["traceEvents"] if e["ph"] == "X"]
    assert 0 < len(kept) <= 10 and capped["otherData"]["truncated"]
    whole = client.get("/api/v1/jobs/t/trace").json()
    assert whole["otherData"]["base_ns"] == capped["otherData"]["base_ns"]
    last = max(e["ts"] for e in kept)
    assert len([e for e in whole["traceEvents"] if e["ph"] == "X" and e["ts"] <= last]) == len(kept)
    rfc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start // 10**9))
    assert client.get(f"/api/v1/jobs/t/trace?start={rfc}").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs?limit=0",
        "/api/v1/jobs?limit=1001",
        "/api/v1/jobs?cursor=garbage",
        "/api/v1/jobs/x/ranks?ranks=3-1",
        "/api/v1/jobs/x/diagnoses?state=closed",
        "/api/v1/jobs/x/trace?start=noon",
        "/api/v1/jobs/x/trace?start=20&end=10",
        "/api/v1/jobs/x/heatmap?metric=loss",
    ],
)
def test_bad_parameters_are_422(store: Store, client: TestClient, path: str) -> None:
    insert_direct(store, "x", synthetic_job(world_size=2, steps=1))
    response = client.get(path)
    assert response.status_code == 422, response.text
    assert "detail" in response.json()


@pytest.mark.parametrize("endpoint", ["ranks", "trace"])
def test_a_selection_of_ranks_the_job_does_not_have_is_422_naming_them(
    store: Store, client: TestClient, endpoint: str
) -> None:
    insert_direct(store, "two", synthetic_job(world_size=2, steps=2))
    for asked, named in (("5", "5"), ("0,3-7", "3-7"), ("1-4,9", "2-4,9")):
        response = client.get(f"/api/v1/jobs/two/{endpoint}?ranks={asked}")
        assert response.status_code == 422, response.text
        assert response.json()["detail"] == (
            f"ranks: job 'two' has no rank(s) {named}: its world size is 2 (ranks 0-1)"
        )
    assert client.get(f"/api/v1/jobs/two/{endpoint}?ranks=0-1").status_code == 200
    assert client.get(f"/api/v1/jobs/nope/{endpoint}?ranks=5").status_code == 404


def test_metrics_endpoint_counts_jobs_by_status(store: Store, client: TestClient) -> None:
    insert_direct(store, "live", synthetic_job(world_size=2, steps=3))
    text = client.get("/metrics").text
    assert 'argus_jobs{status="running"} 1.0' in text
    assert "argus_ingest_batches_total" in text or "argus_ingest_rows" in text
