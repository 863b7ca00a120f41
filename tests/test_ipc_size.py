"""Reading an Arrow IPC stream once, with its declared size checked batch by batch."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from argus import ipc_size
from argus.ipc_size import declared_bytes, read_stream


def _stream(*batches: pa.RecordBatch, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


def _batch(n: int, kind: pa.DataType | None = None) -> pa.RecordBatch:
    return pa.record_batch(
        {"rank": pa.array(range(n), kind or pa.int64()), "kernel": [f"k{i}" for i in range(n)]}
    )


def test_reads_every_batch_of_the_stream_as_arrow_does() -> None:
    payload = _stream(_batch(3), _batch(5), _batch(1))
    got = read_stream(payload, lambda _: None)
    assert got.equals(pa.ipc.open_stream(payload).read_all())
    assert got.num_rows == 9


def test_with_a_pool_the_decoded_buffers_are_its_own_and_every_batch_is_checked_first() -> None:
    payload = _stream(_batch(1000), _batch(2000), compression="zstd")
    pool = (
        pa.jemalloc_memory_pool() if "jemalloc" in pa.supported_memory_backends() else pa.system_memory_pool()
    )
    before, seen = pool.bytes_allocated(), []
    got = read_stream(payload, seen.append, pool)
    assert got.equals(pa.ipc.open_stream(payload).read_all())
    assert pool.bytes_allocated() - before >= 3000 * 8  # decompressed into the pool given
    assert len(seen) == 2 and seen[-1] == declared_bytes(payload)


def test_equal_names_with_other_types_get_their_own_schema() -> None:
    # Schemas are remembered by their message's bytes: a type change is a different schema.
    first = read_stream(_stream(_batch(2, pa.int64())), lambda _: None)
    second = read_stream(_stream(_batch(2, pa.int32())), lambda _: None)
    assert first.schema.field("rank").type == pa.int64()
    assert second.schema.field("rank").type == pa.int32()


def test_check_sees_the_running_total_before_each_batch_is_decoded() -> None:
    payload = _stream(_batch(1000), _batch(1000), compression="zstd")
    seen: list[int] = []
    read_stream(payload, seen.append)
    assert len(seen) == 2 and 0 < seen[0] < seen[1] == declared_bytes(payload)


def test_a_refusal_by_check_stops_before_the_bomb_is_inflated() -> None:
    payload = _stream(_batch(1000), compression="zstd")
    bomb = payload.replace(struct.pack("<q", 8000), struct.pack("<q", 2**40))

    class TooLarge(Exception):
        pass

    def refuse(total: int) -> None:
        if total > 2**30:
            raise TooLarge(total)

    with pytest.raises(TooLarge):
        read_stream(bomb, refuse)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"\x00\x01not arrow at all\xff" * 10, "malformed IPC"),
        (b"", "malformed IPC stream"),
        (
            _stream(pa.record_batch({"k": pa.DictionaryArray.from_arrays([0, 1], ["a", "b"])})),
            "a dictionary message inside the stream",
        ),
    ],
    ids=["garbage", "empty", "dictionary"],
)
def test_unreadable_streams_raise_value_error(payload: bytes, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        read_stream(payload, lambda _: None)


def test_a_batch_that_does_not_match_the_schema_is_unreadable() -> None:
    # The schema message of one stream, then the record batch of another.
    spliced = _schema_only(_stream(_batch(2))) + _batch_only(_stream(pa.record_batch({"x": [1.0, 2.0, 3.0]})))
    with pytest.raises(ValueError, match="unreadable record batch"):
        read_stream(spliced, lambda _: None)


def test_declared_bytes_counts_dictionary_batches() -> None:
    # A compressed dictionary declares its decoded size like a record batch does.
    words = pa.array([f"word-{i:06d}" for i in range(5000)])
    data = pa.record_batch({"k": pa.DictionaryArray.from_arrays(pa.array([0, 1] * 10, pa.int32()), words)})
    plain = _stream(data)
    assert declared_bytes(_stream(data, compression="zstd")) >= words.nbytes
    assert declared_bytes(plain) >= words.nbytes


def _schema_only(payload: bytes) -> bytes:
    reader = pa.ipc.MessageReader.open_stream(payload)
    return reader.read_next_message().serialize().to_pybytes()


def _batch_only(payload: bytes) -> bytes:
    reader = pa.ipc.MessageReader.open_stream(payload)
    reader.read_next_message()
    return reader.read_next_message().serialize().to_pybytes()


def test_a_schema_too_large_to_remember_is_read_and_not_remembered() -> None:
    big = _batch(2).replace_schema_metadata({"padding": "x" * (ipc_size._MAX_KEY_BYTES + 1)})
    before = len(ipc_size._schemas)
    got = read_stream(_stream(big), lambda _: None)
    assert got.schema.metadata[b"padding"] == b"x" * (ipc_size._MAX_KEY_BYTES + 1)
    assert len(ipc_size._schemas) == before


def test_a_walked_stream_is_decoded_without_reading_its_messages_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The collector walks a payload once to charge what it declares, then decodes that walk.
    payload = _stream(_batch(1000), _batch(2000), compression="zstd")
    walked = ipc_size.scan(payload)
    assert walked.error is None and walked.declared == declared_bytes(payload)
    opened: list[object] = []
    monkeypatch.setattr(ipc_size, "_declared", lambda message: opened.append(message) or 0)
    seen: list[int] = []
    got = read_stream(walked, seen.append)
    assert got.equals(pa.ipc.open_stream(payload).read_all())
    assert seen == list(walked.totals) and not opened  # the totals of the walk; no message read again


def test_a_walk_that_ends_early_refuses_the_stream_after_checking_the_batches_before() -> None:
    good = _stream(_batch(2))
    walked = ipc_size.scan(
        _schema_only(good) + _batch_only(good) + _schema_only(good)
    )  # a schema, not a batch
    assert walked.error is not None and len(walked.batches) == 1
    seen: list[int] = []
    with pytest.raises(ValueError, match="a schema message inside the stream"):
        read_stream(walked, seen.append)
    assert seen == [walked.declared]
