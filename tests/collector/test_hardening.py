"""Bad input against a live `argus server`: job ids, upload caps, crafted Arrow, declared sizes.

Each refusal names the field and the rule or limit, writes nothing, and the server
keeps serving (``/healthz`` and a good batch on the same stream afterwards).
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import urllib.parse
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from argus.collector import importer
from argus.collector.ingest import encode_arrow_ipc
from argus.errors import TraceError
from argus.jobid import JOB_ID_RULE, check_job_id, content_disposition
from argus.limits import MAX_WORLD_SIZE, Gunzip
from argus.proto import collector_pb2 as pb
from argus.store import open_store
from synthetic.bad_inputs import zstd_bomb
from tests.collector.importer.traces import simple_events, write_trace
from tests.collector.wire import batch, sample, stream
from tests.conftest import ArgusServer

GOOD_IDS = ["jöb ü 名前", 'a "quoted" id', "sp ace's; x=1%20?#&\\", "x" * 256, "é" * 128]
BAD_IDS = {
    "": "empty",
    "a/b": "contains '/'",
    "tab\there": "control character U+0009",
    "del\x7f": "control character U+007F",
    "c1\x85": "control character U+0085",
    "x" * 257: "257 bytes",
    "é" * 129: "258 bytes",
}


# -- the rule itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", GOOD_IDS)
def test_the_rule_takes_unicode_spaces_and_quotes(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize(("job_id", "problem"), BAD_IDS.items())
def test_the_rule_refuses_naming_the_problem_and_the_rule(job_id: str, problem: str) -> None:
    with pytest.raises(ValueError, match="job id") as caught:
        check_job_id(job_id)
    assert problem in str(caught.value) and JOB_ID_RULE in str(caught.value)


def test_content_disposition_round_trips_any_name_per_rfc_6266() -> None:
    name = 'argus-jöb "x"\\ 名.json'
    value = content_disposition(name)
    value.encode("latin-1")  # a header value Starlette can send
    fallback, exact = value.split("; filename=", 1)[1].split("; filename*=UTF-8''")
    assert fallback == '"argus-j_b _x__ _.json"'
    assert urllib.parse.unquote(exact) == name


def test_gunzip_reads_members_in_bounded_chunks_and_tells_truncation() -> None:
    text = b"[" + b" " * 1_000_000 + b"]"
    data = gzip.compress(text) + gzip.compress(b"tail")
    reader = Gunzip(io.BytesIO(data))
    chunks = list(iter(lambda: reader.read(1 << 20), b""))
    assert b"".join(chunks) == text + b"tail"
    assert max(len(c) for c in chunks) <= 1 << 16
    truncated = Gunzip(io.BytesIO(gzip.compress(text)[:-20]))
    with pytest.raises(EOFError):
        while truncated.read(1 << 16):
            pass


# -- a live server -----------------------------------------------------------------------------

CAP = 1_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgusServer]:
    root = tmp_path_factory.mktemp("hardening")
    srv = ArgusServer(root / "data", ("--no-analyzer", "--max-upload-bytes", str(CAP)), root)
    srv.start()
    yield srv
    srv.stop(timeout_s=15)


@pytest.fixture(scope="module")
def http(server: ArgusServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{server.http_url}/api/v1", timeout=60) as client:
        yield client


def _path(job_id: str) -> str:
    return "/jobs/" + urllib.parse.quote(job_id, safe="")


def _rss_mb(server: ArgusServer) -> float:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _still_serving(server: ArgusServer, http: httpx.Client, seq: int) -> None:
    assert httpx.get(f"{server.http_url}/healthz", timeout=10).status_code == 200
    (ack,) = stream(
        server.grpc_target, [batch("steps", sample("steps", n=2, salt=seq), seq=seq, job_id="ok")]
    )
    assert ack.status == pb.Ack.STORED, ack


@pytest.mark.slow
def test_ids_with_unicode_spaces_and_quotes_work_on_every_endpoint(
    server: ArgusServer, http: httpx.Client, tmp_path: Path
) -> None:
    for i, job_id in enumerate(GOOD_IDS):
        (ack,) = stream(
            server.grpc_target, [batch("steps", sample("steps", n=3), seq=100 + i, job_id=job_id)]
        )
        assert ack.status == pb.Ack.STORED, ack
        base = _path(job_id)
        job = http.get(base)
        assert job.status_code == 200, job.text
        assert job.json()["job_id"] == job_id
        for tail in ("/ranks", "/diagnoses", "/heatmap"):
            reply = http.get(base + tail)
            assert reply.status_code == 200, (tail, reply.text)
        trace = http.get(base + "/trace")
        assert trace.status_code == 200, trace.text
        exact = trace.headers["content-disposition"].split("filename*=UTF-8''")[1]
        assert urllib.parse.unquote(exact) == f"argus-{job_id}.json"
        path = write_trace(tmp_path / f"t{i}.json.gz", simple_events(), rank=0, world_size=1)
        upload = http.post(
            f"/jobs/{urllib.parse.quote(job_id + '-imported', safe='')}/traces",
            files={"file": (path.name, path.read_bytes())},
        )
        if len((job_id + "-imported").encode()) > 256:
            assert upload.status_code == 422, upload.text
        else:
            assert upload.status_code == 201, upload.text
            assert upload.json()["job_id"] == job_id + "-imported"
    assert any(j["job_id"] == GOOD_IDS[0] for j in http.get("/jobs", params={"limit": 1000}).json()["items"])


@pytest.mark.slow
def test_bad_ids_are_refused_at_every_entry_with_the_rule(
    server: ArgusServer, http: httpx.Client, tmp_path: Path
) -> None:
    bad = [j for j in BAD_IDS if j and "/" not in j]  # "" and "a/b" are other routes in a URL path
    for i, job_id in enumerate(bad):
        for tail in ("", "/ranks", "/diagnoses", "/trace", "/heatmap"):
            reply = http.get(_path(job_id) + tail)
            assert reply.status_code == 422, (job_id, tail, reply.text)
            assert JOB_ID_RULE in reply.text
        path = write_trace(tmp_path / f"b{i}.json", simple_events(), rank=0, world_size=1)
        upload = http.post(_path(job_id) + "/traces", files={"file": (path.name, path.read_bytes())})
        assert upload.status_code == 422 and JOB_ID_RULE in upload.text
    acks = stream(
        server.grpc_target,
        [batch("steps", sample("steps", n=2), seq=200 + i, job_id=j) for i, j in enumerate(BAD_IDS)],
    )
    for ack, job_id in zip(acks, BAD_IDS, strict=True):
        assert ack.status == pb.Ack.REJECTED and ack.code == "INVALID_ARGUMENT", (job_id, ack)
        assert ack.message.startswith("job_id:"), ack.message
    listed = {j["job_id"] for j in http.get("/jobs", params={"limit": 1000}).json()["items"]}
    assert not listed & set(BAD_IDS)
    _still_serving(server, http, seq=299)


def test_bad_ids_are_refused_by_the_importer_and_argus_run(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        path = write_trace(tmp_path / "t.json", simple_events(), rank=0, world_size=1)
        with pytest.raises(TraceError, match="--job-id: job id 'a/b' contains '/'"):
            importer.import_traces(store, [path], job_id="a/b")
        assert store.query("SELECT count() AS n FROM steps").column("n")[0].as_py() == 0
    finally:
        store.close()
    run = subprocess.run(
        [sys.executable, "-m", "argus.cli", "run", "--job-id", "bad\nid", "--", sys.executable, "-c", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "control character U+000A" in run.stderr and JOB_ID_RULE in run.stderr


# -- bounded uploads ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_gzip_bomb_and_an_oversized_body_get_413_and_write_nothing(
    server: ArgusServer, http: httpx.Client, tmp_path: Path
) -> None:
    rss_before = _rss_mb(server)
    # 200 MB of JSON text in ~200 KB of gzip: far past the 1 MB cap once inflated.
    inflater = zlib.compressobj(9, wbits=31)
    bomb = inflater.compress(b'{"traceEvents": [') + b"".join(
        inflater.compress(b" " * (1 << 20)) for _ in range(200)
    )
    bomb += inflater.compress(b"]}") + inflater.flush()
    assert len(bomb) < CAP
    reply = http.post("/jobs/bomb/traces", files={"file": ("bomb.json.gz", bomb)})
    assert reply.status_code == 413, reply.text
    assert "max_upload_bytes" in reply.text and "--max-upload-bytes" in reply.text
    # Many small bombs of one request share the one cap.
    small = gzip.compress(b'{"traceEvents": [' + b" " * 600_000 + b"]}")
    files = [("file", (f"s{i}.json.gz", small)) for i in range(3)]
    assert http.post("/jobs/bombs/traces", files=files).status_code == 413
    # A body past the cap is refused from its Content-Length, before it is read.
    big = write_trace(tmp_path / "big.json", simple_events() * 1, rank=0, world_size=1)
    padded = big.read_bytes()[:-1] + b" " * CAP + b"}"
    reply = http.post("/jobs/big/traces", files={"file": ("big.json", padded)})
    assert reply.status_code == 413 and "request body is larger than" in reply.text
    for job in ("bomb", "bombs", "big"):
        assert http.get(f"/jobs/{job}").status_code == 404
    assert _rss_mb(server) - rss_before < 200, "inflating the bomb must not hold its text"
    # Under the cap the same server imports.
    ok = http.post("/jobs/fits/traces", files={"file": ("ok.json", big.read_bytes())})
    assert ok.status_code == 201, ok.text
    _still_serving(server, http, seq=399)


# -- Arrow validated in full -------------------------------------------------------------------


def _kernels_with_strings(values: list[str]) -> pa.Table:
    data = sample("kernel_events", n=len(values))
    i = data.schema.get_field_index("kernel")
    return data.set_column(i, "kernel", pa.array(values, pa.string()))


def _bad_offsets() -> bytes:
    payload = encode_arrow_ipc(_kernels_with_strings(["aaaaa", "bbbbb", "ccccc", "ddddd"]))
    offsets = np.array([0, 5, 10, 15, 20], np.int32).tobytes()
    assert payload.count(offsets) == 1
    return payload.replace(offsets, np.array([0, 10, 5, 15, 20], np.int32).tobytes())


def _bad_utf8() -> bytes:
    data = sample("kernel_events", n=2)
    offsets = pa.py_buffer(np.array([0, 2, 4], np.int32).tobytes())
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ok\xff\xfe")])
    return encode_arrow_ipc(data.set_column(data.schema.get_field_index("kernel"), "kernel", bad))


@pytest.mark.slow
def test_crafted_arrow_batches_are_rejected_and_the_stream_goes_on(
    server: ArgusServer, http: httpx.Client
) -> None:
    job = "arrow-crafted"
    acks = stream(
        server.grpc_target,
        [
            batch("kernel_events", _bad_offsets(), seq=500, job_id=job),
            batch("kernel_events", _bad_utf8(), seq=501, job_id=job),
            batch("kernel_events", zstd_bomb(), seq=503, job_id=job),
            batch("steps", sample("steps", n=3), seq=502, job_id=job),
        ],
    )
    assert [a.status for a in acks] == [pb.Ack.REJECTED] * 3 + [pb.Ack.STORED], acks
    assert "is larger than the limit max_batch_decoded_bytes" in acks[2].message
    assert "arrow_ipc: invalid Arrow data" in acks[0].message and "non-monotonic offset" in acks[0].message
    assert "arrow_ipc: invalid Arrow data" in acks[1].message and "Invalid UTF8" in acks[1].message
    trace = http.get(_path(job) + "/trace").json()
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]


# -- declared sizes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_declared_sizes_past_the_limits_are_refused_naming_field_and_limit(
    server: ArgusServer, http: httpx.Client, tmp_path: Path
) -> None:
    rss_before = _rss_mb(server)
    ranks = sample("ranks", n=2)
    huge_world = ranks.set_column(
        ranks.schema.get_field_index("world_size"), "world_size", pa.array([4, 2**31], pa.uint32())
    )
    huge_group = ranks.set_column(
        ranks.schema.get_field_index("group_ranks"),
        "group_ranks",
        pa.array([[0, 1], [0, 2**32 - 1]], pa.list_(pa.uint32())),
    )
    acks = stream(
        server.grpc_target,
        [
            batch("ranks", huge_world, seq=600, job_id="sizes"),
            batch("ranks", huge_group, seq=601, job_id="sizes"),
            batch("ranks", ranks, seq=602, job_id="sizes"),
        ],
    )
    assert [a.status for a in acks] == [pb.Ack.REJECTED, pb.Ack.REJECTED, pb.Ack.STORED], acks
    assert f"ranks.world_size: 2147483648 is larger than the limit max_world_size = {MAX_WORLD_SIZE}" in (
        acks[0].message
    )
    assert "ranks.group_ranks: 4294967295 is larger than the limit max_rank" in acks[1].message
    # A trace of a few hundred bytes declaring 2**31 ranks, or rank 2**32 - 2 by the query.
    tiny = write_trace(tmp_path / "w.json", simple_events(steps=1)[:3], rank=0, world_size=2**31)
    reply = http.post("/jobs/huge-world/traces", files={"file": ("w.json", tiny.read_bytes())})
    assert reply.status_code == 422 and "world_size: 2147483648 is larger than the limit max_world_size" in (
        reply.text
    )
    norank = write_trace(tmp_path / "r.json", simple_events(steps=1), rank=None, world_size=None)
    reply = http.post(
        "/jobs/huge-rank/traces", params={"rank": 2**32 - 2}, files={"file": ("r.json", norank.read_bytes())}
    )
    assert reply.status_code == 422 and "rank: 4294967294 is larger than the limit max_rank" in reply.text
    for job in ("huge-world", "huge-rank"):
        assert http.get(f"/jobs/{job}").status_code == 404
    assert _rss_mb(server) - rss_before < 200
    _still_serving(server, http, seq=699)
