"""Capture requests through the store: the analyzer's row → a collector's Ack → a node agent → stacks rows.

Real chDB store, real collector over gRPC, real node agent, a real child process registered on the
agent's socket by itself (the agent samples the process on the other end of a socket, never a pid a
HELLO names).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow.compute as pc

from argus.agent.node import NodeAgent
from argus.agent.sink import AgentLink
from argus.analyzer.stacks import StackRequest, Stacks
from argus.collector.captures import PendingCaptures
from argus.collector.grpc_service import start_collector
from argus.config import ServerConfig
from argus.metrics import Metrics
from argus.store import Store
from argus.window_grid import WindowGrid
from tests.agent.jobs import short_dir
from tests.agent.test_node_agent import HELLO, wait_for
from tests.agent.test_stacks import CHILD

#: Rank 3 of job-c: connects to the agent's socket (argv[1]) as its own probe, then spins.
PROBED_CHILD = (
    "import os, sys\n"
    "from argus.agent.sink import AgentLink\n"
    "from tests.agent.test_node_agent import HELLO\n"
    "link = AgentLink(sys.argv[1], {**HELLO, 'job_id': 'job-c', 'pid': os.getpid()})\n"
    "link.pump()\n"
    "assert link.connected\n" + CHILD
)


def test_a_stored_request_reaches_the_agent_of_its_rank_and_its_stacks_come_back(store: Store) -> None:
    collector = start_collector(store, Metrics(), ServerConfig(grpc_listen="127.0.0.1:0"))
    with short_dir() as work:
        agent = NodeAgent(
            str(work / "a.sock"),
            collector.address,
            str(work / "spool"),
            1 << 30,
            WindowGrid.from_seconds(1.0),
        )
        agent.start()
        child = subprocess.Popen(
            [sys.executable, "-c", PROBED_CHILD, str(work / "a.sock")], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            try:
                # Rank 2 of the same job, this process: its heartbeats make batches, so acks flow.
                link = AgentLink(str(work / "a.sock"), {**HELLO, "job_id": "job-c", "rank": 2})
                link.pump()
                wait_for(lambda: agent.probes.rank_process("job-c", 3) is not None)
                request = StackRequest(
                    request_id="req-1", job_id="job-c", diagnosis_id="d", cause="host_stall", flagged=(3,),
                    peer=6, duration_ms=600, blocking=False, requested_ns=time.time_ns(),
                )  # fmt: skip
                Stacks(store).write([request])

                def stored() -> int:
                    link.pump()  # the probe's heartbeat: batches, so acks flow
                    got = store.query("SELECT count() AS n FROM stacks WHERE job_id = 'job-c'")
                    return int(got["n"][0].as_py())

                wait_for(lambda: stored() > 0, timeout=30)
                rows = store.query("SELECT * FROM stacks WHERE job_id = 'job-c'")
                time.sleep(1.2)  # the collector's next read of pending requests
                pending = collector.servicer.captures.for_job("job-c")
            finally:
                agent.stop(drain_s=2)
        finally:
            child.kill()
            child.wait()
            collector.stop(1.0)
    assert set(rows["capture_id"].to_pylist()) == {"req-1"}
    assert set(rows["rank"].to_pylist()) == {3}
    spin = rows.filter(pc.match_substring(rows["frames"], "very_distinctive_spin_for_stacks"))
    assert spin.num_rows > 0
    # Rank 3 answered; rank 6 (no agent serves it here) is still pending.
    assert [(c.capture_id, list(c.ranks)) for c in pending] == [("req-1", [6])]


def test_pending_captures_read_only_their_jobs_stacks_rows(store: Store) -> None:
    """100,000 stacks rows of another job: reading the pending requests of one job, through a view
    of the store that refuses to scan more than 20,000 rows, works (before, the whole table was
    scanned every second on the ingest side)."""
    from tests.collector.api.test_bounded_reads import _rows

    now = time.time_ns()
    store.insert("stacks", _rows("stacks", 100_000, "busy", time_ns=[now] * 100_000))
    store.insert(
        "stack_requests",
        _rows("stack_requests", 1, "mine", request_id=["cap-1"], ranks=[[0, 1]], requested_ns=[now]),
    )
    store.insert("stacks", _rows("stacks", 1, "mine", capture_id=["cap-1"], rank=[0], time_ns=[now]))
    pending = PendingCaptures(store.reading_at_most(20_000))._read()
    assert [(c.capture_id, list(c.ranks)) for c in pending["mine"]] == [("cap-1", [1])]
