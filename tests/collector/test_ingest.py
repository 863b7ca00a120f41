"""The ingest path against a real store: stored, duplicate, the token safety net, metrics, rejections."""

from __future__ import annotations

import pyarrow as pa
import pytest

from argus.collector import ingest
from argus.collector import ingest_record as record
from argus.errors import InvalidBatch, StoreError
from argus.metrics import Metrics
from argus.proto import collector_pb2 as pb
from argus.store import Store
from tests.collector.bad_batches import bad_batches
from tests.collector.wire import batch, sample


def _count(store: Store, table: str) -> int:
    """Rows of ``table``; of ``ingest_batches``, the batches' records (not the rows that only carry
    settlements, collector.ingest_record)."""
    where = " WHERE agent_id != ''" if table == "ingest_batches" else ""
    return int(store.query(f"SELECT count() AS n FROM {table}{where}").column("n")[0].as_py())


def _metric(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_stored_then_duplicate(store: Store) -> None:
    metrics = Metrics()
    b = batch("steps", sample("steps", n=6), seq=3, dropped_events=11)
    first = ingest.ingest(store, b, metrics)
    again = ingest.ingest(store, b, metrics)
    assert (first.seq, first.status, first.rows) == (3, pb.Ack.STORED, 6)
    assert (again.seq, again.status, again.rows) == (3, pb.Ack.DUPLICATE, 6)
    assert _count(store, "steps") == 6
    assert _count(store, "ingest_batches") == 1
    # Drops count once, with the stored batch, not again for its duplicate.
    assert _metric(metrics, "argus_agent_dropped_events_total") == 11
    assert _metric(metrics, "argus_ingest_rows_total", {"table": "steps"}) == 6
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "steps", "status": "stored"}) == 1
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "steps", "status": "duplicate"}) == 1
    assert _metric(metrics, "argus_ingest_bytes_total") == len(b.arrow_ipc)


def test_job_id_comes_from_the_header(store: Store) -> None:
    ingest.ingest(store, batch("phases", sample("phases", n=3), seq=1, job_id="job-α"), None)
    got = store.query("SELECT DISTINCT job_id FROM phases").column("job_id").to_pylist()
    assert got == ["job-α"]


def test_a_crash_between_data_and_record_stores_the_retry_once(store: Store) -> None:
    b = batch("kernel_events", sample("kernel_events", n=5), seq=9)
    decoded = ingest.decode(b)
    store.insert(decoded.table, ingest.with_job_id([decoded]), dedup_token=decoded.dedup_token)  # no record
    ack = ingest.ingest(store, b, None)
    assert ack.status == pb.Ack.STORED
    assert _count(store, "kernel_events") == 5
    assert ingest.already_stored(store, b.agent_id, 9) == 5


def test_a_group_is_one_insert_per_table_and_each_batch_keeps_its_ack(store: Store) -> None:
    metrics = Metrics()
    ingest.ingest(store, batch("steps", sample("steps", n=2), seq=1, agent_id="a"), metrics)  # stored before
    raw = [
        batch("steps", sample("steps", n=2), seq=1, agent_id="a"),  # a retry of the one stored before
        batch("steps", sample("steps", n=3, salt=1), seq=2, agent_id="a"),
        batch("phases", sample("phases", n=4), seq=1, agent_id="b", job_id="job-2"),
        batch("steps", sample("steps", n=5, salt=2), seq=2, agent_id="b", job_id="job-2"),
        batch("steps", sample("steps", n=3, salt=1), seq=2, agent_id="a"),  # twice in the group
        batch("phases", sample("phases", n=1, salt=3), seq=3, agent_id="a"),
    ]
    inserts: list[str] = []
    real_insert = store.insert

    def counting(table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        inserts.append(table)
        real_insert(table, data, dedup_token=dedup_token)

    store.insert = counting  # type: ignore[method-assign]  # the real store, its calls counted
    try:
        outcomes = ingest.write_group(store, [ingest.decode(b) for b in raw], metrics)
    finally:
        store.insert = real_insert  # type: ignore[method-assign]
    got = [(o.seq, o.status, o.rows) for o in outcomes if isinstance(o, pb.Ack)]
    stored, dup = pb.Ack.STORED, pb.Ack.DUPLICATE
    assert got == [(1, dup, 2), (2, stored, 3), (1, stored, 4), (2, stored, 5), (2, dup, 3), (3, stored, 1)]
    # The record, one insert per table, then the settlements (a call without a writer's groups).
    assert inserts == ["ingest_batches", "steps", "phases", "ingest_batches"]
    by_job = store.query("SELECT job_id, count() AS n FROM steps GROUP BY job_id ORDER BY job_id").to_pylist()
    assert by_job == [{"job_id": "job-1", "n": 5}, {"job_id": "job-2", "n": 5}]
    assert _count(store, "phases") == 5
    assert _count(store, "ingest_batches") == 5
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "steps", "status": "stored"}) == 3


def test_a_crash_between_a_groups_data_and_record_stores_its_retry_once(store: Store) -> None:
    group = [ingest.decode(batch("steps", sample("steps", n=3, salt=s), seq=s, agent_id="a")) for s in (1, 2)]
    store.insert("steps", ingest.with_job_id(group), dedup_token=ingest.group_token(group))  # no record
    outcomes = ingest.write_group(store, group)
    assert [o.status for o in outcomes if isinstance(o, pb.Ack)] == [pb.Ack.STORED] * 2
    assert _count(store, "steps") == 6
    assert ingest.group_token(group) != ingest.group_token(group[::-1])


def test_new_sequence_numbers_and_new_agents_are_not_duplicates(store: Store) -> None:
    data = sample("steps", n=2)
    acks = [
        ingest.ingest(store, batch("steps", data, seq=0, agent_id="node-a-100"), None),
        ingest.ingest(store, batch("steps", data, seq=1, agent_id="node-a-100"), None),
        # The same node's agent restarted: a new start time in its id, seq from 0 again.
        ingest.ingest(store, batch("steps", data, seq=0, agent_id="node-a-200"), None),
        # An agent that keeps its sequence in its spool goes on under the same id.
        ingest.ingest(store, batch("steps", data, seq=2, agent_id="node-a-100"), None),
    ]
    assert [a.status for a in acks] == [pb.Ack.STORED] * 4
    assert _count(store, "steps") == 8


@pytest.mark.parametrize("case", [c for c, _, _ in bad_batches(0)])
def test_bad_batches_write_nothing(store: Store, case: str) -> None:
    _, b, fragment = next(x for x in bad_batches(0) if x[0] == case)
    with pytest.raises(InvalidBatch) as raised:
        ingest.ingest(store, b, None)
    assert fragment in str(raised.value)
    for table in ("steps", "kernel_events", "ingest_batches"):
        assert _count(store, table) == 0


def test_columns_in_another_order_are_accepted() -> None:
    data = sample("steps", n=2)
    shuffled = data.select(list(reversed(data.column_names)))
    decoded = ingest.decode(batch("steps", shuffled, seq=1))
    assert decoded.data.equals(data)
    assert ingest.with_job_id([decoded]).column_names == [*data.column_names, "job_id"]


def test_a_bad_batch_in_a_group_is_refused_alone_and_its_neighbours_stored(store: Store) -> None:
    good = [batch("steps", sample("steps", n=2, salt=s), seq=s) for s in (1, 3)]
    negative = sample("steps", n=2, salt=2)
    negative = negative.set_column(
        negative.column_names.index("dur_ns"), "dur_ns", pa.array([5, -1], pa.int64())
    )
    group = [ingest.decode(b) for b in (good[0], batch("steps", negative, seq=2), good[1])]
    outcomes = ingest.write_group(store, group)
    assert [o.status for o in (outcomes[0], outcomes[2]) if isinstance(o, pb.Ack)] == [pb.Ack.STORED] * 2
    assert isinstance(outcomes[1], InvalidBatch) and "steps.dur_ns: negative value -1" in str(outcomes[1])
    assert _count(store, "steps") == 4 and _count(store, "ingest_batches") == 2


def test_null_inside_a_list_column_is_rejected() -> None:
    data = sample("ranks", n=2)
    i = data.column_names.index("group_ranks")
    data = data.set_column(i, "group_ranks", pa.array([[0, None], [1]], pa.list_(pa.uint32())))
    with pytest.raises(InvalidBatch, match=r"ranks.group_ranks: 1 null value"):
        ingest.validate_columns("ranks", data)


def test_a_group_stores_each_batch_once_and_spots_repeats_inside_it(store: Store) -> None:
    metrics = Metrics()
    a = ingest.decode(batch("steps", sample("steps", n=2), seq=1))
    b = ingest.decode(batch("steps", sample("steps", n=3, salt=9), seq=2))
    c = ingest.decode(batch("collectives", sample("collectives", n=4), seq=3))
    first = ingest.write_group(store, [a, b, a, c], metrics)
    assert [(o.seq, o.status, o.rows) for o in first if isinstance(o, pb.Ack)] == [
        (1, pb.Ack.STORED, 2),
        (2, pb.Ack.STORED, 3),
        (1, pb.Ack.DUPLICATE, 2),
        (3, pb.Ack.STORED, 4),
    ]
    second = ingest.write_group(store, [c, b], metrics)
    assert [(o.status, o.rows) for o in second if isinstance(o, pb.Ack)] == [
        (pb.Ack.DUPLICATE, 4),
        (pb.Ack.DUPLICATE, 3),
    ]
    assert (_count(store, "steps"), _count(store, "collectives"), _count(store, "ingest_batches")) == (
        5,
        4,
        3,
    )
    assert ingest.stored_rows(store, [(a.agent_id, 1), (a.agent_id, 3), (a.agent_id, 99), ("other", 1)]) == {
        (a.agent_id, 1): 2,
        (a.agent_id, 3): 4,
    }


def test_a_failed_insert_fails_only_its_batch(store: Store) -> None:
    good = ingest.decode(batch("steps", sample("steps", n=2), seq=1))
    broken = ingest.decode(batch("steps", sample("steps", n=2), seq=2))
    # A table the store does not have: the insert fails like a store outage would.
    broken = ingest.Decoded("no_such_table", broken.data, broken.agent_id, broken.seq, broken.job_id)
    outcomes = ingest.write_group(store, [broken, good], None)
    assert isinstance(outcomes[0], StoreError)
    assert isinstance(outcomes[1], pb.Ack) and outcomes[1].status == pb.Ack.STORED
    assert ingest.stored_rows(store, [(good.agent_id, 1), (good.agent_id, 2)]) == {(good.agent_id, 1): 2}


def test_agent_ids_and_job_ids_with_quotes_and_newlines(store: Store) -> None:
    odd = "node'a\\b\nc-1700000000"
    # Quotes and spaces are fine in a job id; control characters are not (argus.jobid).
    with pytest.raises(InvalidBatch, match="control character U\\+0009"):
        ingest.ingest(store, batch("steps", sample("steps"), seq=4, agent_id=odd, job_id="job\t'x'"), None)
    ack = ingest.ingest(store, batch("steps", sample("steps"), seq=5, agent_id=odd, job_id="job 'x\""), None)
    assert ack.status == pb.Ack.STORED
    assert ingest.already_stored(store, odd, 5) == 5
    again = ingest.ingest(store, batch("steps", sample("steps"), seq=5, agent_id=odd), None)
    assert again.status == pb.Ack.DUPLICATE
    assert store.query("SELECT DISTINCT job_id FROM steps").column("job_id").to_pylist() == ["job 'x\""]


def test_the_lookup_reads_the_asked_batches_only_not_every_asked_agent_under_every_asked_seq(
    store: Store,
) -> None:
    # Agents flush in step: a group asks for agent a's seq 2 and b's seq 1 while a's 1 and b's 2 are stored.
    stored = [
        ingest.decode(batch("steps", sample("steps", n=2), seq=s, agent_id=a))
        for a, s in (("a", 1), ("b", 2))
    ]
    ingest.write_group(store, stored)
    assert record.lookup(store, [("a", 2, 0), ("b", 1, 0)]) == {}
    assert set(record.lookup(store, [("a", 1, 0), ("b", 1, 0)])) == {("a", 1)}


def test_a_groups_metrics_count_each_table_and_outcome(store: Store) -> None:
    metrics = Metrics()
    first = [ingest.decode(batch("steps", sample("steps", n=3, salt=s), seq=s)) for s in (1, 2)]
    ingest.write_group(store, first, metrics)
    again = [
        first[0],  # a duplicate
        ingest.decode(batch("steps", sample("steps", n=4, salt=9), seq=3)),
        ingest.decode(batch("phases", sample("phases", n=5), seq=4)),
    ]
    ingest.write_group(store, again, metrics)
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "steps", "status": "stored"}) == 3
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "steps", "status": "duplicate"}) == 1
    assert _metric(metrics, "argus_ingest_batches_total", {"table": "phases", "status": "stored"}) == 1
    assert _metric(metrics, "argus_ingest_rows_total", {"table": "steps"}) == 10
    assert _metric(metrics, "argus_ingest_rows_total", {"table": "phases"}) == 5
    payloads = sum(d.payload_bytes for d in (*first, *again[1:]))
    assert _metric(metrics, "argus_ingest_bytes_total") == payloads
