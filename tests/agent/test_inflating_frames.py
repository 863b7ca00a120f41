"""A probe frame whose compressed Arrow body inflates past ``max_batch_decoded_bytes`` is refused from
its metadata, before the node agent inflates it (issue 39): the real `argus agent` process on its
socket, and its frame decoder.

Before: ``decode_batch`` read any LZ4/ZSTD body with ``pa.ipc.open_stream(...).read_all()``: a
frame of 17 kB (11 million zero rows of ``steps``, ZSTD) became 308 MB in the agent, and was
acknowledged.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from argus.agent.protocol import (
    FrameType,
    ProtocolError,
    decode_batch,
    encode_frame,
    encode_json,
    read_frame,
    table_code,
)
from argus.limits import LIMITS
from argus.schema import wire_schema
from tests.agent.chdb_collector import chdb_collector
from tests.agent.jobs import job_env, short_dir
from tests.agent.test_node_agent import HELLO, wait_for

#: Rows of the inflating batch: 28 bytes each decoded, past the limit.
ROWS = LIMITS["max_batch_decoded_bytes"] // 28 + 1_000_000


def _inflating_payload() -> bytes:
    """A ``steps`` BATCH payload of :data:`ROWS` zero rows, ZSTD-compressed: kilobytes on the wire."""
    schema = wire_schema("steps")
    zeros = {f.name: pa.array(np.zeros(ROWS, f.type.to_pandas_dtype())) for f in schema}
    table = pa.Table.from_pydict(zeros, schema=schema)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        writer.write_table(table, max_chunksize=ROWS)
    return bytes([table_code("steps")]) + sink.getvalue().to_pybytes()


def test_the_decoder_refuses_what_a_frame_declares_past_the_limit() -> None:
    payload = _inflating_payload()
    assert len(payload) < 1 << 20 and LIMITS["max_batch_decoded_bytes"] < ROWS * 28
    with pytest.raises(
        ProtocolError, match=r"decoded size: \d+ is larger than the limit max_batch_decoded_bytes"
    ):
        decode_batch(payload)


def test_the_agent_refuses_an_inflating_frame_and_goes_on() -> None:
    payload = _inflating_payload()
    with short_dir() as work, chdb_collector(work) as collector:
        sock = str(work / "a.sock")
        cmd = [sys.executable, "-m", "argus.cli", "agent", "--socket", sock, "--collector", collector.address]
        cmd += ["--spool", str(work / "spool"), "--window-s", "1"]
        agent = subprocess.Popen(cmd, env=job_env(work), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: os.path.exists(sock))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                raw.settimeout(60)
                raw.connect(sock)
                raw.sendall(
                    encode_json(FrameType.HELLO, 0, {**HELLO, "version": 3, "rank": 2, "pid": os.getpid()})
                )
                raw.sendall(encode_frame(FrameType.BATCH, 1, payload))
                assert read_frame(raw) == (FrameType.REFUSED, 1, b"")
                raw.sendall(encode_json(FrameType.DUMP, 0, {"job_id": "job-n", "start_ns": 0, "end_ns": 1}))
                assert read_frame(raw) == (FrameType.ACK, 0, b""), "the connection goes on"
            assert agent.poll() is None
        finally:
            agent.terminate()
            agent.wait(timeout=20)
        assert collector.rows("SELECT count() FROM steps") == [(0,)]
