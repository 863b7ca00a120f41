"""`argus server` as a process: ready line, signals, option and store errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from tests.collector.wire import batch, channel, sample

pytestmark = pytest.mark.slow


def test_ready_line_names_grpc_http_and_store(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    line = server.stdout_path.read_text().splitlines()[0]
    assert line == (
        f"argus server: gRPC on {server.grpc_target}, HTTP on {server.http_url}, store {server.store_url}"
    )
    with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=10) as reply:
        assert reply.status == 200


def test_sigint_stops_it_cleanly_with_the_analyzer_running(argus_server_factory) -> None:
    server = argus_server_factory("--window-s", "1")
    assert server.stop(sig=signal.SIGINT) == 0
    assert "argus server: stopped" in server.stderr_path.read_text()


def test_a_second_server_on_the_same_data_dir_says_it_is_locked(argus_server_factory) -> None:
    first = argus_server_factory("--no-analyzer")
    second = argus_server_factory("--no-analyzer", data_dir=first.data_dir, start=False)
    with pytest.raises(RuntimeError, match="another process holds it"):
        second.start()
    assert second.proc is not None and second.proc.returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grpc-listen", "nowhere"], "--grpc-listen 'nowhere': expected HOST:PORT"),
        (["--http-listen", "127.0.0.1:99999"], "--http-listen '127.0.0.1:99999': expected HOST:PORT"),
        (["--retention-days", "0"], "--retention-days must be >= 1"),
        (["--store", "mysql://x"], "unknown store URL"),
    ],
)
def test_bad_options_exit_1_with_a_message(args: list[str], message: str, tmp_path) -> None:
    command = [sys.executable, "-m", "argus.cli", "server", "--no-analyzer"]
    command += [
        "--store",
        f"chdb://{tmp_path / 'd'}",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]
    done = subprocess.run([*command, *args], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr


def test_sigterm_with_an_idle_agent_stream_open_stops_promptly(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer")
    release = threading.Event()
    acks: list[pb.Ack] = []
    errors: list[grpc.RpcError] = []

    def held_open() -> Iterator[pb.Batch]:
        yield batch("steps", sample("steps"), seq=1)
        release.wait(60)

    def agent() -> None:
        with channel(server.grpc_target) as ch:
            try:
                acks.extend(pb_grpc.CollectorStub(ch).Stream(held_open(), timeout=60))
            except grpc.RpcError as exc:
                errors.append(exc)

    sender = threading.Thread(target=agent)
    sender.start()
    try:
        deadline = time.monotonic() + 60
        while not acks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [a.status for a in acks] == [pb.Ack.STORED]
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 15
    finally:
        release.set()
        sender.join(60)
    assert errors and errors[0].code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
