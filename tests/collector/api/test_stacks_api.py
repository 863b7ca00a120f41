"""``GET /api/v1/jobs/{job_id}/stacks`` over a real chDB store, and `argus diagnose`'s top-frame lines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from argus import render
from argus.collector.api import create_app
from argus.diagnosis import Diagnosis
from argus.metrics import Metrics
from argus.schema import wire_table
from argus.store import Store

S = 10**9
STALL, STEP = "main (t.py:1);stall (t.py:9)", "main (t.py:1);step (t.py:4)"


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    jobs = {"world_size": [4], "start_ns": [S], "command": ["x"], "source": ["live"]}
    store.insert("jobs", wire_table("jobs", jobs, job_id="j"))
    rows = {
        "rank": [3, 3, 2, 3, 2], "pid": [7, 7, 8, 7, 8], "capture_id": ["a", "a", "a", "b", "b"],
        "time_ns": [10 * S, 10 * S, 10 * S, 400 * S, 400 * S], "duration_ns": [3 * S] * 5,
        "sampler": ["py-spy"] * 5, "thread": ["MainThread"] * 5,
        "frames": [STALL, STEP, STEP, STALL, STEP],
        "count": [12, 18, 30, 5, 25], "idle": [1, 0, 0, 1, 0], "gil": [0, 1, 1, 0, 1],
    }  # fmt: skip
    store.insert("stacks", wire_table("stacks", rows, job_id="j"))
    with TestClient(create_app(store, metrics=Metrics())) as c:
        yield c


def test_stack_rows_page_by_page_and_filtered(client: TestClient) -> None:
    seen, cursor = [], None
    while True:
        body = client.get(
            "/api/v1/jobs/j/stacks", params={"limit": 2, **({"cursor": cursor} if cursor else {})}
        )
        assert body.status_code == 200
        page = body.json()
        seen += page["items"]
        cursor = page["next"]
        if cursor is None:
            break
    assert len(seen) == 5 and [r["time_ns"] for r in seen] == sorted(r["time_ns"] for r in seen)
    first = seen[0]
    assert set(first) == {
        "rank", "pid", "capture_id", "time_ns", "duration_ns", "sampler", "thread", "frames", "count",
        "idle", "gil",
    }  # fmt: skip
    only = client.get("/api/v1/jobs/j/stacks", params={"rank": 3, "end": 100 * S}).json()["items"]
    assert {(r["capture_id"], r["rank"]) for r in only} == {("a", 3)}
    assert {r["frames"]: r["idle"] for r in only} == {
        "main (t.py:1);stall (t.py:9)": True,
        "main (t.py:1);step (t.py:4)": False,
    }


def test_collapsed_is_folded_text_for_flame_graphs(client: TestClient) -> None:
    got = client.get("/api/v1/jobs/j/stacks", params={"rank": 3, "format": "collapsed"})
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    assert (
        got.text == "MainThread;main (t.py:1);stall (t.py:9) 17\nMainThread;main (t.py:1);step (t.py:4) 18\n"
    )


def test_one_capture_by_its_id(client: TestClient) -> None:
    got = client.get("/api/v1/jobs/j/stacks", params={"capture": "b", "format": "collapsed"})
    assert (
        got.text == "MainThread;main (t.py:1);stall (t.py:9) 5\nMainThread;main (t.py:1);step (t.py:4) 25\n"
    )
    rows = client.get("/api/v1/jobs/j/stacks", params={"capture": "a", "rank": 2}).json()["items"]
    assert [(r["capture_id"], r["rank"], r["count"]) for r in rows] == [("a", 2, 30)]
    assert client.get("/api/v1/jobs/j/stacks", params={"capture": "nope"}).json() == {
        "items": [],
        "next": None,
    }


def test_unknown_job_is_404_and_bad_parameters_422(client: TestClient) -> None:
    assert client.get("/api/v1/jobs/nope/stacks").status_code == 404
    assert client.get("/api/v1/jobs/j/stacks", params={"cursor": "bm90IGEgY3Vyc29y"}).status_code == 422
    assert client.get("/api/v1/jobs/j/stacks", params={"format": "svg"}).status_code == 422
    assert client.get("/api/v1/jobs/j/stacks", params={"start": 5 * S, "end": S}).status_code == 422


def test_diagnose_prints_the_top_frames_under_the_diagnosis() -> None:
    d = Diagnosis(
        id="d", job_id="j", rank=3, ranks=[3], group=None, cause="host_stall", phase=None, kernel=None,
        score=2.0, slowdown_pct=20.0, first_window_ns=S, last_window_ns=2 * S, state="open",
        evidence={
            "top_frames": [{"function": "stall", "file": "t.py", "line": 9, "share": 0.4, "peer_share": 0.0}],
            "stacks": {
                "capture_id": "a", "time_ns": S, "rank": 3, "peer": 2, "sampler": "py-spy", "samples": 30
            },
        },
    )  # fmt: skip
    assert render.top_frames(d) == [
        "    top frames of rank 3 against rank 2 (py-spy, share of samples):",
        "       40.0 %  stall (t.py:9)  peer 0.0 %",
    ]
    job = {"job_id": "j", "status": "running", "ranks_attached": 4, "world_size": 4, "open_diagnoses": 1}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render.table(job, [d]))
    assert "stall (t.py:9)" in console.export_text()


def test_diagnose_says_why_when_there_are_no_top_frames() -> None:
    """Issue 42: never a heading with nothing under it: the analyzer's reason is printed."""
    why = "no line is held more often in the rank's stacks than in its peer's (30 samples)"
    d = Diagnosis(
        id="d", job_id="j", rank=3, ranks=[3], group=None, cause="host_stall", phase=None, kernel=None,
        score=2.0, slowdown_pct=20.0, first_window_ns=S, last_window_ns=2 * S, state="open",
        evidence={
            "top_frames": [],
            "stacks": {
                "capture_id": "a", "time_ns": S, "rank": 3, "peer": 2, "sampler": "py-spy", "samples": 30,
                "thread": None, "why_no_frames": why,
            },
        },
    )  # fmt: skip
    assert render.top_frames(d) == [f"    no top frames of rank 3 against rank 2 (py-spy): {why}"]
