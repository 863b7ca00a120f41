"""The probe socket's JSON messages, typed (argus.agent.messages): what a peer sends is read once
and checked; a bad field is a ProtocolError naming it, never a KeyError deep in the agent."""

from __future__ import annotations

import json

import pytest

from argus.agent.messages import Bye, Capture, Dump, Hello, Sample
from argus.agent.protocol import ProtocolError
from tests.agent.test_node_agent import HELLO


def test_every_message_round_trips() -> None:
    hello = Hello.decode(json.dumps(HELLO).encode())
    assert (hello.job_id, hello.rank, hello.pid, hello.version, hello.takes_one) == ("job-n", 3, 1, 1, False)
    assert Hello.decode(hello.encode()) == hello
    for message in (Bye(-9), Dump("j", 1, 2), Capture([(1, 2), (5, 9)]), Sample("cap", 300)):
        assert type(message).decode(message.encode()) == message


def test_an_older_probes_hello_takes_the_defaults_and_numbers_sent_as_strings() -> None:
    doc = {"job_id": "j", "rank": "2", "world_size": 4, "pid": 7, "attach_ns": 5}
    hello = Hello.decode(json.dumps(doc).encode())
    assert (hello.rank, hello.local_rank, hello.host, hello.version) == (2, 0, "", 1)
    assert hello.key == ("j", "2", "", "7", "5")


@pytest.mark.parametrize(
    ("kind", "doc", "field"),
    [
        (Hello, {**HELLO, "world_size": None}, "world_size"),
        (Hello, {k: v for k, v in HELLO.items() if k != "job_id"}, "job_id"),
        (Hello, {**HELLO, "rank": [3]}, "rank"),
        (Dump, {"job_id": "j", "start_ns": "soon", "end_ns": 1}, "start_ns"),
        (Capture, {"spans": "not spans"}, "spans"),
        (Capture, {"spans": [[1, 2, 3]]}, "spans"),
        (Sample, {"capture_id": "c"}, "duration_ms"),
    ],
)
def test_a_bad_field_is_a_protocol_error_naming_it(kind: type, doc: dict[str, object], field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        kind.decode(json.dumps(doc).encode())
