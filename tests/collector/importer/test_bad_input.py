"""Bad input gets a clear error naming file and position, and writes nothing."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pytest

from argus.collector.importer import import_traces
from argus.collector.importer import load as importer
from argus.errors import StoreError, TraceError
from argus.schema import TABLES
from argus.store import Store

from .traces import T0_US, kernel, simple_events, write_trace


def _rows(store: Store) -> dict[str, int]:
    counts = {}
    for name in ("jobs", "ranks", "steps", "collectives", "kernel_summaries", "kernel_events"):
        counts[name] = store.query(f"SELECT count() FROM {name}").column(0)[0].as_py()
    return counts


def _assert_empty(store: Store) -> None:
    assert set(_rows(store).values()) == {0}


def test_trace_without_rank_names_the_field_and_the_option(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "norank.json", simple_events(), rank=None, world_size=None)
    with pytest.raises(TraceError) as err:
        import_traces(store, [path])
    assert str(path) in str(err.value)
    assert "distributedInfo.rank" in str(err.value) and "--rank" in str(err.value)
    _assert_empty(store)
    result = import_traces(store, [path], rank=5)
    assert result.ranks == [5]


def test_rank_option_contradicting_the_trace_is_refused(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "r1.json", simple_events(), rank=1)
    with pytest.raises(TraceError, match=r"contradicts distributedInfo\.rank 1"):
        import_traces(store, [path], rank=2)


def test_real_no_rank_file(store: Store, kineto_dir: Path) -> None:
    with pytest.raises(TraceError, match=r"no_rank_field\.json\.gz.*distributedInfo\.rank.*--rank"):
        import_traces(store, [kineto_dir / "no_rank_field.json.gz"])


def test_truncated_gzip(store: Store, tmp_path: Path, kineto_dir: Path) -> None:
    data = (kineto_dir / "job128_rank0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError) as err:
        import_traces(store, [path])
    message = str(err.value)
    assert str(path) in message and "truncated" in message
    assert "near byte" in message and "after traceEvents[" in message
    _assert_empty(store)


def test_truncated_plain_json(store: Store, tmp_path: Path) -> None:
    whole = write_trace(tmp_path / "whole.json", simple_events(steps=50)).read_bytes()
    path = tmp_path / "cut.json"
    path.write_bytes(whole[: int(len(whole) * 0.7)])
    with pytest.raises(
        TraceError, match=r"cut\.json: the JSON text ends early \(truncated file\?\) near byte"
    ):
        import_traces(store, [path])
    _assert_empty(store)


def test_invalid_json_names_the_position(store: Store, tmp_path: Path) -> None:
    text = write_trace(tmp_path / "ok.json", simple_events(steps=50)).read_text()
    cut = len(text) // 2
    bad = text[:cut] + "}}garbage" + text[cut:]
    path = tmp_path / "bad.json"
    path.write_text(bad)
    with pytest.raises(TraceError) as err:
        import_traces(store, [path])
    message = str(err.value)
    assert "bad.json: the JSON text is not valid JSON near byte" in message
    # The last complete event is named, and it lies before the damage.
    last = int(message.split("after traceEvents[")[1].split("]", maxsplit=1)[0])
    assert 0 < last < 50 * 22
    _assert_empty(store)


@pytest.mark.parametrize("missing", ["ts", "dur"])
def test_event_without_ts_or_dur(store: Store, tmp_path: Path, missing: str) -> None:
    events = simple_events()
    del events[7][missing]
    path = write_trace(tmp_path / "hole.json.gz", events)
    with pytest.raises(TraceError) as err:
        import_traces(store, [path])
    assert str(path) in str(err.value)
    assert f"traceEvents[7] ('{events[7]['name']}', ph 'X') has no {missing}" in str(err.value)
    _assert_empty(store)


def test_not_an_object(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text('[{"ph": "X", "ts": 1, "dur": 1}]')
    with pytest.raises(TraceError, match="must be an object"):
        import_traces(store, [path])


def test_relative_times_without_base_are_refused(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "rel.json", simple_events(start_us=5_000_000))
    with pytest.raises(TraceError, match="baseTimeNanoseconds"):
        import_traces(store, [path])


def test_one_bad_file_writes_nothing_of_the_others(store: Store, tmp_path: Path) -> None:
    good = write_trace(tmp_path / "good.json", simple_events(), rank=0)
    events = simple_events()
    del events[-1]["dur"]
    bad = write_trace(tmp_path / "bad.json", events, rank=1)
    with pytest.raises(TraceError, match=r"bad\.json"):
        import_traces(store, [good, bad])
    _assert_empty(store)


def test_two_files_claiming_one_rank_are_refused(store: Store, tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", simple_events(), rank=3)
    b = write_trace(tmp_path / "b.json.gz", simple_events(start_us=T0_US + 7), rank=3)
    with pytest.raises(TraceError, match=r"b\.json\.gz: claims rank 3, as does .*a\.json"):
        import_traces(store, [a, b], job_id="j")
    _assert_empty(store)


def test_rank_already_stored_for_the_job_is_refused(store: Store, tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", simple_events(), rank=3)
    b = write_trace(tmp_path / "b.json", simple_events(start_us=T0_US + 7), rank=3)
    import_traces(store, [a], job_id="j")
    before = _rows(store)
    with pytest.raises(TraceError, match=r"job j already has rank\(s\) \[3\]"):
        import_traces(store, [b], job_id="j")
    # The same trace again, under its default job id, is refused the same way.
    first = import_traces(store, [a])
    with pytest.raises(TraceError, match="already has rank"):
        import_traces(store, [a])
    assert _rows(store)["ranks"] == before["ranks"] + 3 and first.job_id.startswith("import-")
    # Another job may have a rank 3.
    assert import_traces(store, [b], job_id="k").ranks == [3]


class _FailingStore:
    """The real store, except that one table's insert fails once (a unit of the rollback)."""

    def __init__(self, store: Store, table: str) -> None:
        self.url = store.url
        self.embedded = store.embedded
        self._store = store
        self._table = table

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        if table == self._table:
            self._table = ""
            raise StoreError("injected failure")
        self._store.insert(table, data, dedup_token=dedup_token)

    def query(self, sql: str, parameters: dict[str, object] | None = None) -> pa.Table:
        return self._store.query(sql, parameters)

    def command(self, sql: str, parameters: dict[str, object] | None = None) -> None:
        self._store.command(sql, parameters)

    def close(self) -> None:
        self._store.close()


@pytest.mark.parametrize("table", ["kernel_summaries", "ranks", "jobs"])
def test_failed_insert_is_rolled_back_and_can_be_retried(store: Store, tmp_path: Path, table: str) -> None:
    paths = [write_trace(tmp_path / f"r{r}.json", simple_events(), rank=r) for r in (0, 1)]
    failing = _FailingStore(store, table)
    with pytest.raises(StoreError, match="injected"):
        import_traces(failing, paths, job_id="j")  # type: ignore[arg-type]
    _assert_empty(store)
    result = import_traces(failing, paths, job_id="j")  # type: ignore[arg-type]
    assert _rows(store) == {name: n for name, n in result.rows.items() if name in _rows(store)}
    assert _rows(store)["kernel_events"] == 2 * 40


def test_every_table_written_is_a_schema_table() -> None:
    assert set(importer._RANK_TABLES) | {"jobs"} <= set(TABLES)


def test_gzip_member_with_bad_crc(store: Store, tmp_path: Path) -> None:
    data = bytearray(
        gzip.compress(b'{"traceEvents": [' + b",".join([b'{"ph": "i", "ts": 1}'] * 1000) + b"]}")
    )
    data[-8] ^= 0xFF  # the CRC32 of the member
    path = tmp_path / "crc.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=r"crc\.json\.gz: cannot read near byte"):
        import_traces(store, [path])


def test_negative_kernel_duration(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "neg.json", [kernel(T0_US, -3)])
    with pytest.raises(TraceError, match=r"traceEvents\[0\].*negative duration"):
        import_traces(store, [path])
