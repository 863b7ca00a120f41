"""The REST API on loopback answers only loopback Host names (DNS rebinding), and refuses writes from
another site's page (CSRF): `start_http` on a real socket, requests over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from argus.collector.api.serve import HttpServer, start_http
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import Store
from tests.collector.importer.traces import simple_events, write_trace


@pytest.fixture
def http(store: Store) -> Iterator[HttpServer]:
    server = start_http(store, Metrics(), ServerConfig(http_listen="127.0.0.1:0"))
    yield server
    server.stop()


def _ranks(store: Store, job_id: str) -> int:
    found = store.query("SELECT uniqExact(rank) AS n FROM ranks WHERE job_id = {j:String}", {"j": job_id})
    return int(found.column("n")[0].as_py())


def test_a_rebound_host_name_is_refused_on_loopback(http: HttpServer) -> None:
    port = http.url.rsplit(":", 1)[1]
    assert httpx.get(f"{http.url}/api/v1/jobs").status_code == 200
    assert httpx.get(f"{http.url}/api/v1/jobs", headers={"Host": f"localhost:{port}"}).status_code == 200
    assert httpx.get(f"{http.url}/api/v1/jobs", headers={"Host": f"[::1]:{port}"}).status_code == 200
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        reply = httpx.get(f"{http.url}/api/v1/jobs", headers={"Host": host})
        assert reply.status_code == 403, (host, reply.text)
        assert "not a name of this server" in reply.json()["detail"]
    assert httpx.get(f"{http.url}/metrics", headers={"Host": "evil.example"}).status_code == 403


def test_an_upload_from_another_sites_page_is_refused(http: HttpServer, store: Store, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", simple_events(), rank=0, world_size=1).read_bytes()
    host = http.url.removeprefix("http://")

    def upload(job: str, headers: dict[str, str]) -> httpx.Response:
        files = [("file", ("t.json", trace))]
        return httpx.post(f"{http.url}/api/v1/jobs/{job}/traces", files=files, headers=headers, timeout=60)

    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://{host}", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        reply = upload("forged", headers)
        assert reply.status_code == 403, (headers, reply.text)
    assert _ranks(store, "forged") == 0
    assert upload("cli", {}).status_code == 201  # a client that is no browser: no Origin
    page = upload("page", {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
    assert page.status_code == 201, page.text
    assert _ranks(store, "cli") == _ranks(store, "page") == 1
