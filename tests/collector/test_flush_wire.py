"""A node agent's flush as one message (``Batch.members``, docs/design.md §3), exactly once: the real
collector over real gRPC on a real chDB store, resent whole, as its members alone, as parts of a
member, and after a collector killed between a group's record and its data insert or between the data
insert and its settlement."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from argus.proto import collector_pb2 as pb
from tests.agent.chdb_collector import Collector, chdb_collector
from tests.collector.wire import batch, sample, stream

AGENT = "node-f-1700000000"
TABLES = ("steps", "phases", "host_samples")
ROWS = 20


def _member(table: str, seq: int, rows: int = ROWS) -> pb.Batch:
    return batch(table, sample(table, n=rows, salt=seq * rows), seq=seq, agent_id=AGENT)


def _flush(members: list[pb.Batch]) -> pb.Batch:
    return pb.Batch(agent_id=AGENT, seq=members[0].seq, members=members)


def _three(seq0: int) -> list[pb.Batch]:
    """One batch of each of :data:`TABLES`, seqs ``seq0`` on."""
    return [_member(table, seq0 + i) for i, table in enumerate(TABLES)]


def _halves(member: pb.Batch, seq0: int) -> list[pb.Batch]:
    """``member`` re-split into its two halves (parts 2 and 3), new seqs ``seq0`` on, as the agent does."""
    table = pb.Table.Name(member.table).lower()
    data = sample(table, n=ROWS, salt=member.seq * ROWS)
    out = []
    for half in (0, 1):
        part = batch(table, data.slice(half * ROWS // 2, ROWS // 2), seq=seq0 + half, agent_id=AGENT)
        part.parent.CopyFrom(pb.Batch.Parent(agent_id=AGENT, seq=member.seq, part=2 + half))
        out.append(part)
    return out


def _counts(collector: Collector) -> dict[str, int]:
    return {t: int(collector.rows(f"SELECT count() FROM {t}")[0][0]) for t in TABLES}  # type: ignore[call-overload]


def test_a_flush_is_one_ack_and_its_members_are_stored_once_however_they_come_back(tmp_path: Path) -> None:
    with chdb_collector(tmp_path) as collector:
        members = _three(1)
        (ack,) = stream(collector.address, [_flush(members)])
        assert (ack.seq, ack.status, ack.rows, len(ack.members)) == (1, pb.Ack.STORED, 3 * ROWS, 0)
        assert _counts(collector) == dict.fromkeys(TABLES, ROWS)
        # The same flush again (its ack was lost), its members alone (an older agent's spool, or a
        # flush re-split after a size refusal), and a member's halves (re-split further).
        again = stream(collector.address, [_flush(members), *members, *_halves(members[0], 50)])
        assert [(a.seq, a.status) for a in again] == [
            (1, pb.Ack.DUPLICATE),
            (1, pb.Ack.DUPLICATE),
            (2, pb.Ack.DUPLICATE),
            (3, pb.Ack.DUPLICATE),
            (50, pb.Ack.DUPLICATE),
            (51, pb.Ack.DUPLICATE),
        ]
        assert again[0].rows == 3 * ROWS
        # A flush of one member stored before and a new one: stored, with the rows of both.
        (mixed,) = stream(collector.address, [_flush([members[1], _member("steps", 4)])])
        assert (mixed.status, mixed.rows) == (pb.Ack.STORED, 2 * ROWS)
        assert _counts(collector) == {"steps": 2 * ROWS, "phases": ROWS, "host_samples": ROWS}


def test_a_flush_with_a_refused_member_stores_the_others_and_a_wrong_frame_stores_nothing(
    tmp_path: Path,
) -> None:
    with chdb_collector(tmp_path) as collector:
        members = _three(1)
        members[1].arrow_ipc = b"not arrow"
        (ack,) = stream(collector.address, [_flush(members)])
        assert (ack.seq, ack.status, ack.rows) == (1, pb.Ack.REJECTED, 2 * ROWS)
        assert [(a.seq, a.status, a.code) for a in ack.members] == [
            (1, pb.Ack.STORED, ""),
            (2, pb.Ack.REJECTED, "INVALID_ARGUMENT"),
            (3, pb.Ack.STORED, ""),
        ]
        assert "arrow_ipc" in ack.members[1].message
        assert _counts(collector) == {"steps": ROWS, "phases": 0, "host_samples": ROWS}
        # Members of another agent, or a flush with a table of its own: refused whole.
        other = _three(10)
        other[2].agent_id = "someone-else"
        framed = _flush(_three(20))
        framed.table = pb.STEPS
        refused = stream(collector.address, [_flush(other), framed])
        assert [(a.status, a.code, len(a.members)) for a in refused] == [
            (pb.Ack.REJECTED, "INVALID_ARGUMENT", 0)
        ] * 2
        assert "members[2].agent_id" in refused[0].message and "table" in refused[1].message
        assert _counts(collector) == {"steps": ROWS, "phases": 0, "host_samples": ROWS}


#: A collector process (the real servicer and writer) whose store stops, says so on stdout and waits to
#: be killed just before its first data insert ("recorded") or just after it ("inserted").
_COLLECTOR = """
import sys, time
from argus.collector.grpc_service import start_collector
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import open_store
from tests.collector.stopping_store import stop_at
url, point = sys.argv[1:3]
store = open_store(url)
stop_at(store, point)
server = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0"))
print(server.port, flush=True)
time.sleep(600)
"""


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready, "the collector said nothing"
    return proc.stdout.readline().strip()


def _killed_while_storing(folder: Path, point: str, flush: pb.Batch) -> None:
    """Send ``flush`` to a :data:`_COLLECTOR` on ``folder``'s store; SIGKILL it at ``point``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _COLLECTOR, f"chdb://{folder / 'store'}", point],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    sender: threading.Thread | None = None
    try:
        address = f"127.0.0.1:{_line(proc)}"

        def send() -> None:
            with contextlib.suppress(grpc.RpcError):  # the collector is killed before it answers
                stream(address, [flush], timeout_s=120)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        assert _line(proc) == point
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        if sender is not None:
            sender.join(60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("resent", ["whole", "regrouped"])
@pytest.mark.parametrize("point", ["recorded", "inserted"])
def test_a_flush_resent_after_its_collector_was_killed_while_storing_it_is_stored_once(
    tmp_path: Path, point: str, resent: str
) -> None:
    """Killed after the flush's record and before its data insert, nothing is stored and the resent
    members are; killed after a data insert and before its settlement, those rows are stored and the
    resent members holding them are duplicates. Either way each row is stored once, the flush's ack
    counts every row, and no marker row stays; resent whole, or regrouped: a member's halves, a member
    alone, a member in a new flush beside a new batch."""
    members = _three(1)
    _killed_while_storing(tmp_path, point, _flush(members))
    with chdb_collector(tmp_path) as collector:
        before = _counts(collector)
        recorded = collector.rows("SELECT count() FROM ingest_batches")[0][0]
        if point == "recorded":
            assert before == dict.fromkeys(TABLES, 0) and recorded
        else:
            assert sum(before.values()) > 0  # rows landed, never acknowledged
        if resent == "whole":
            acks = stream(collector.address, [_flush(members)])
            assert [(a.seq, a.rows) for a in acks] == [(1, 3 * ROWS)]
            assert acks[0].status == (
                pb.Ack.DUPLICATE if before == dict.fromkeys(TABLES, ROWS) else pb.Ack.STORED
            )
            expected = dict.fromkeys(TABLES, ROWS)
        else:
            new = _member("steps", 4)
            acks = stream(
                collector.address, [*_halves(members[0], 10), members[1], _flush([members[2], new])]
            )
            assert [a.seq for a in acks] == [10, 11, 2, 3]
            # A half found stored counts the rows of the whole it is within (docs/design.md §3).
            assert [a.rows for a in acks[2:]] == [ROWS, 2 * ROWS]
            assert {a.rows for a in acks[:2]} <= {ROWS // 2, ROWS}
            expected = {"steps": 2 * ROWS, "phases": ROWS, "host_samples": ROWS}
        assert all(a.status in (pb.Ack.STORED, pb.Ack.DUPLICATE) for a in acks)
        assert _counts(collector) == expected
        markers = [
            collector.rows(f"SELECT count() FROM {t} WHERE startsWith(job_id, 'argus/settle/')")[0][0]
            for t in TABLES
        ]
        assert markers == [0, 0, 0]
        (last,) = stream(collector.address, [_flush(members)])
        assert (last.status, last.rows) == (pb.Ack.DUPLICATE, 3 * ROWS)
        assert _counts(collector) == expected
