"""What one trace upload may cost the server: text per gzip byte, CPU seconds, and text shared by
the uploads parsed at once (POST /api/v1/jobs/{id}/traces on a live app over real HTTP)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import httpx
import pytest

from argus.errors import TooLarge
from argus.limits import INFLATE_SLACK_BYTES, LIMITS, ByteBudget, SharedBytes
from argus.metrics import Metrics
from argus.store import Store
from tests.collector.api.conftest import LiveApp

from .traces import simple_events, write_trace

#: Bytes of JSON text the server parses at a time (kineto's chunk): what it may read past a bound.
CHUNK_BYTES = 1 << 16


def _ranks(store: Store, job_id: str) -> int:
    found = store.query("SELECT uniqExact(rank) AS n FROM ranks WHERE job_id = {j:String}", {"j": job_id})
    return int(found.column("n")[0].as_py())


def test_a_gzip_bomb_is_refused_after_200_bytes_of_text_per_gzip_byte(store: Store) -> None:
    """64 MiB of one JSON string gzips to ~64 KiB (1,000x): refused with 413 naming the ratio once
    the text passes 200 bytes per gzip byte read (+ 1 MiB), long before its end; nothing is written."""
    text = b'{"distributedInfo": {"rank": 0}, "traceEvents": [], "pad": "' + b"a" * (64 << 20) + b'"}'
    bomb = gzip.compress(text, compresslevel=9)
    assert len(text) > 500 * len(bomb)
    app = LiveApp(store, Metrics()).start()
    try:
        reply = httpx.post(
            f"{app.url}/api/v1/jobs/bomb/traces", files=[("file", ("bomb.json.gz", bomb))], timeout=120
        )
    finally:
        app.stop()
    assert reply.status_code == 413, reply.text
    detail = reply.json()["detail"]
    assert "max_inflate_ratio" in detail, detail
    found = re.search(r"(\d+) bytes of text from (\d+) gzip bytes", detail)
    assert found is not None, detail
    text_bytes, read_bytes = int(found.group(1)), int(found.group(2))
    ratio = LIMITS["max_inflate_ratio"]
    assert text_bytes <= ratio * read_bytes + INFLATE_SLACK_BYTES + CHUNK_BYTES
    assert text_bytes < len(text) // 4  # stopped early, not at the end
    assert _ranks(store, "bomb") == 0


def test_real_traces_compress_well_within_the_ratio(kineto_dir: Path) -> None:
    for path in sorted(kineto_dir.glob("*.json.gz")):
        with gzip.open(path) as f:
            text_bytes = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
        assert text_bytes < LIMITS["max_inflate_ratio"] / 4 * path.stat().st_size, path.name


def test_an_upload_past_its_parse_time_is_refused_with_413(store: Store, tmp_path: Path) -> None:
    """With a budget of 1 ns of CPU, the first chunk of text is past it: 413 naming the limit and its
    flag, nothing written; the same upload with the default budget is imported."""
    trace = write_trace(tmp_path / "t.json.gz", simple_events(), rank=0, world_size=1)
    tight = LiveApp(store, Metrics(), max_upload_parse_s=1e-9).start()
    try:
        with trace.open("rb") as f:
            reply = httpx.post(f"{tight.url}/api/v1/jobs/slow/traces", files=[("file", f)], timeout=60)
    finally:
        tight.stop()
    assert reply.status_code == 413, reply.text
    assert "max_upload_parse_s" in reply.json()["detail"] and "--max-upload-parse-s" in reply.json()["detail"]
    assert _ranks(store, "slow") == 0
    normal = LiveApp(store, Metrics()).start()
    try:
        with trace.open("rb") as f:
            reply = httpx.post(f"{normal.url}/api/v1/jobs/slow/traces", files=[("file", f)], timeout=60)
    finally:
        normal.stop()
    assert reply.status_code == 201, reply.text
    assert _ranks(store, "slow") == 1


def test_uploads_parsed_at_once_share_one_text_budget() -> None:
    """Two uploads' budgets over one shared pool: together they may not pass it; what one gives
    back when done is the other's again."""
    shared = SharedBytes(100)
    first = ByteBudget(80, shared=shared)
    second = ByteBudget(80, shared=shared)
    first.take(60)
    second.take(30)
    with pytest.raises(TooLarge, match="uploads being parsed now"):
        second.take(20)
    assert shared.used == 90 and second.used == 30
    first.release()
    second.take(20)
    assert shared.used == 50
    second.release()
    assert shared.used == 0
