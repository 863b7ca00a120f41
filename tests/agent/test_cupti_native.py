"""The native CUPTI buffer decoder gives, column for column, what today's object path gives.

Issue 11, must show 2.

Buffers are laid out with the real record dtypes (cupti-python's where installed, else replicas
that a test here checks against them) and decoded twice: natively, and as cupti-python would
hand them over (one object per record, then ``collect``/``decode``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from argus.agent import cupti_native
from argus.agent.cupti import CollectiveJoin, CuptiSource, DutyCycle, backend_from_env, collect, decode
from argus.agent.cupti_lib import BufferPool, CuptiError, NativeCupti, find_libcupti
from argus.agent.cupti_native import NameTable, NativeDecoder, demangle
from argus.agent.cupti_records import (
    KIND_CONCURRENT_KERNEL,
    KIND_EXTERNAL_CORRELATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    LAYOUTS,
    Decoded,
)
from argus.agent.kernels import KernelWindows
from argus.agent.rows import CollectiveRow
from argus.kernels import KernelEvents, summarize
from argus.schema import wire_schema
from argus.window_grid import WindowGrid
from tests.agent import cupti_buffers as cb


def same(native: Decoded, objects: Decoded) -> None:
    """Column for column equality (names compared as strings)."""
    assert native.rows == objects.rows
    assert native.external == objects.external
    assert (native.dropped, native.skipped) == (objects.dropped, objects.skipped)


def native(bufs: cb.Buffers, offset_ns: int = 0, **kw) -> Decoded:  # type: ignore[no-untyped-def]
    return NativeDecoder(cb.sizes(), **kw).decode(bufs.memory, bufs.buffers, offset_ns)


@pytest.mark.parametrize("seed", [0, 1])
def test_interleaved_buffers_decode_as_the_object_path_does(seed: int) -> None:
    bufs = cb.realistic(30_000, seed=seed, buffer_bytes=1 << 20)
    got, want = native(bufs, 12_345), cb.object_path(bufs, 12_345)
    same(got, want)
    assert len(bufs.buffers) > 5 and len(got) > 25_000
    assert got.dropped > 100  # zero and inverted timestamps, counted and left out
    assert set(got.kinds) == {"kernel", "memcpy", "memset"} and len(got.external) > 2_000
    assert len(set(got.name)) > 250  # a few hundred kernel names, each resolved once
    assert (got.dur_ns >= 0).all() and (got.start_ns > 12_345).all()


def test_fields_that_look_like_record_kinds_do_not_mislead_the_walk(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Streams, devices and grid sizes equal to kind codes put a "record start" in most words;
    # small chunks make almost every walk start inside a record.
    monkeypatch.setattr(cupti_native, "CHUNK_WORDS", 40)
    for seed in range(3):
        bufs = cb.realistic(6_000, seed=seed, buffer_bytes=64 << 10, hostile=True)
        same(native(bufs), cb.object_path(bufs))


def test_the_walk_finds_exactly_the_record_offsets(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for words in (32, 512, 4096):
        monkeypatch.setattr(cupti_native, "CHUNK_WORDS", words)
        bufs = cb.realistic(8_000, seed=words, buffer_bytes=256 << 10, hostile=True)
        mem = bufs.memory
        walk = cupti_native._Walk(
            mem.view(np.uint32)[::2], NativeDecoder(cb.sizes())._steps, np.zeros(mem.size // 8, np.uint8)
        )
        starts = np.array([s for s, _ in bufs.buffers]) // 8
        ends = starts + np.array([v for _, v in bufs.buffers]) // 8
        records, stop = walk.run(starts, ends)
        assert np.array_equal(np.concatenate([p for p, _ in records]) * 8, bufs.offsets)
        assert np.array_equal(np.concatenate([k for _, k in records]), bufs.kinds) and (stop == -1).all()
        assert not walk.mark.any()  # the scratch marks are cleared for the next decode


def _records(spec: list[tuple[int, dict]]) -> cb.Buffers:  # type: ignore[type-arg]
    names = cb.Names(["gemm", *cb.NCCL_NAMES, "_ZN2at6native18elementwise_kernelILi128ELi4EEEviPf"])
    return cb.lay_out(spec, names)


def _k(name: int, corr: int, start: int, end: int, **kw) -> tuple[int, dict]:  # type: ignore[no-untyped-def,type-arg]
    fields = dict(name=name, correlation_id=corr, start=start, end=end, stream_id=7, device_id=0)
    return (KIND_CONCURRENT_KERNEL, {**fields, **kw})


def test_zero_and_inverted_timestamps_are_counted_as_dropped() -> None:
    bufs = _records(
        [
            _k(0, 1, 1_000, 6_000),
            _k(0, 2, 0, 0),
            _k(0, 3, 5_000, 0),
            _k(0, 4, 0, 5_000),
            _k(0, 5, 9_000, 8_999),
            (KIND_MEMSET, dict(correlation_id=6, start=0, end=0)),
            (KIND_MEMCPY, dict(copy_kind=1, correlation_id=7, start=20, end=70, stream_id=13)),
            _k(0, 8, 7_000, 7_000),  # zero length is a real kernel
        ]
    )
    got = native(bufs, 1_000)
    same(got, cb.object_path(bufs, 1_000))
    assert got.dropped == 5
    assert [r[:7] for r in got.rows] == [
        ("kernel", "gemm", 7, 0, 1, 2_000, 5_000),
        ("kernel", "gemm", 7, 0, 8, 8_000, 0),
        ("memcpy", "Memcpy HtoD", 13, 0, 7, 1_020, 50),
    ]


def test_kinds_not_decoded_are_skipped_and_counted() -> None:
    api = (KIND_RUNTIME, dict(cbid=211, start=5, end=9, correlation_id=3))
    bufs = _records([_k(0, 1, 10, 20), api, _k(0, 2, 30, 40), api, api])
    got = native(bufs)
    same(got, cb.object_path(bufs))
    assert got.skipped == 3 and len(got) == 2 and got.refused == 0


def _with_unknown(size: int = 48, kind: int = 45) -> tuple[cb.Buffers, int]:
    """Buffers whose 4th record is of a kind the decoder does not know (``size`` bytes)."""
    before = [_k(0, 1, 10, 20), _k(1, 2, 30, 40), (KIND_MEMSET, dict(correlation_id=3, start=50, end=60))]
    after = [
        _k(2, 4, 70, 80),
        (KIND_EXTERNAL_CORRELATION, dict(correlation_id=4, external_id=9)),
        _k(3, 5, 90, 95),
    ]
    first, second = _records(before), _records(after)
    a, b = first.buffers[0][1], second.buffers[0][1]
    memory = np.zeros(a + size + b + 64, np.uint8)
    memory[:a] = first.memory[:a]
    memory[a : a + 4] = np.frombuffer(np.int32(kind).tobytes(), np.uint8)
    memory[a + size : a + size + b] = second.memory[:b]
    offsets = np.concatenate([first.offsets, [a], second.offsets + a + size])
    kinds = np.concatenate([first.kinds, [kind], second.kinds])
    bufs = cb.Buffers(memory, [(0, a + size + b)], offsets, kinds, first.names, first.dtypes)
    bufs.keep.append(second.names)
    return bufs, a


def test_a_record_of_unknown_size_ends_the_walk_and_the_rest_is_refused() -> None:
    bufs, at = _with_unknown()
    got = native(bufs)
    whole = cb.Buffers(bufs.memory, [(0, at)], bufs.offsets[:3], bufs.kinds[:3], bufs.names, bufs.dtypes)
    same(got, cb.object_path(whole))
    assert got.refused == 1 and len(got) == 3


def test_libcupti_walks_what_the_decoder_cannot_and_teaches_it_the_size() -> None:
    bufs, _ = _with_unknown(size=48, kind=45)
    walked = []

    def walker(address: int, valid: int) -> list[int]:  # stands in for cuptiActivityGetNextRecord
        walked.append((address - bufs.memory.ctypes.data, valid))
        return bufs.offsets.tolist()

    decoder = NativeDecoder(cb.sizes(), walker=walker)
    got = decoder.decode(bufs.memory, bufs.buffers)
    assert walked == [(0, bufs.buffers[0][1])] and decoder.sizes[45] == 48
    records = cb.objects(
        cb.Buffers(
            bufs.memory, [(0, bufs.offsets[3])], bufs.offsets[:3], bufs.kinds[:3], bufs.names, bufs.dtypes
        ),
        0,
    )
    rest = cb.Buffers(
        bufs.memory, [(0, bufs.memory.size)], bufs.offsets[4:], bufs.kinds[4:], bufs.names, bufs.dtypes
    )
    want = decode([collect([*records, SimpleNamespace(kind=45), *cb.objects(rest, 0)])])
    same(got, want)
    assert got.refused == 0 and got.skipped == 1 and len(got) == 5
    # The next buffer of that kind is walked by the decoder alone.
    decoder.decode(bufs.memory, bufs.buffers)
    assert len(walked) == 1


@pytest.mark.parametrize("cut", [8, 16, 100, 3])
def test_a_truncated_buffer_keeps_its_whole_records_and_refuses_the_cut_one(cut: int) -> None:
    bufs = cb.realistic(500, seed=3, buffer_bytes=1 << 20)
    start, valid = bufs.buffers[0]
    bufs.buffers[0] = (start, valid - cut)
    got = native(bufs)
    same(got, cb.object_path(bufs))
    assert got.refused == 1 and len(got) + got.dropped < 500 - len(cb.object_path(bufs).external)


def test_buffers_outside_the_memory_are_refused_with_an_error() -> None:
    bufs = cb.realistic(100, buffer_bytes=1 << 16)
    decoder = NativeDecoder(cb.sizes())
    for bad in ([(4, 64)], [(0, bufs.memory.size + 8)], [(-8, 16)]):
        with pytest.raises(ValueError, match="inside the memory"):
            decoder.decode(bufs.memory, bad)
    assert len(decoder.decode(bufs.memory, [])) == 0 and len(decoder.decode(bufs.memory, [(0, 0)])) == 0


def test_nccl_kernels_of_both_families_join_their_collectives_by_external_correlation() -> None:
    bufs = _records(
        [
            (KIND_EXTERNAL_CORRELATION, dict(external_kind=5, external_id=5, correlation_id=12)),
            _k(1, 12, 1_000, 3_500, stream_id=13),  # ncclKernel_AllReduce_RING_LL_Sum_float
            (KIND_EXTERNAL_CORRELATION, dict(external_kind=5, external_id=6, correlation_id=14)),
            _k(0, 13, 3_600, 3_700),  # a compute kernel between them
            _k(2, 14, 4_000, 4_900, stream_id=13),  # ncclDevKernel_AllReduce_Sum_f32_RING_LL
        ]
    )
    got = native(bufs)
    same(got, cb.object_path(bufs))
    join = CollectiveJoin(timeout_ns=1_000_000)
    join.expect(5, CollectiveRow(3, "0", 17, "allreduce", 4096, 100, 100, 50, -1, 0))
    join.expect(6, CollectiveRow(3, "0", 18, "allreduce", 4096, 200, 200, 40, -1, 0))
    join.feed(got)
    assert join.ready(now_ns=300) == [
        (3, "0", 17, "allreduce", 4096, 100, 1_000, 2_500, -1, 0, 0),
        (3, "0", 18, "allreduce", 4096, 200, 4_000, 900, -1, 0, 0),
    ]


def test_graph_launched_kernels_are_captured_named_and_summarised_by_graph() -> None:
    node = 1 << 33
    bufs = _records(
        [
            _k(0, 1, 100, 1_100),  # eager
            _k(0, 2, 2_000, 3_000, graph_id=7, graph_node_id=node),
            _k(0, 2, 4_000, 5_000, graph_id=7, graph_node_id=node),  # a replay of the same node
            _k(5, 3, 6_000, 6_500, graph_id=7, graph_node_id=node + 1),
            _k(5, 3, 7_000, 7_400, graph_id=7, graph_node_id=node + 2),
            (KIND_MEMSET, dict(correlation_id=3, start=8_000, end=8_100, graph_id=7, graph_node_id=node + 3)),
        ]
    )
    got = native(bufs)
    same(got, cb.object_path(bufs))
    mangled = "void at::native::elementwise_kernel<128, 4>(int, float*)"
    assert got.graph_id.tolist() == [0, 7, 7, 7, 7, 7]
    assert got.name[3] == demangle("_ZN2at6native18elementwise_kernelILi128ELi4EEEviPf") == mangled
    table = got.table(rank=2)
    assert table.schema == wire_schema("kernel_events")
    assert table["graph_node_id"].to_pylist()[1:3] == [node, node]
    s = summarize(KernelEvents.from_wire(table), WindowGrid(10_000)).to_pandas()
    gemm = s[s.kernel == "gemm"].sort_values("graph_id")
    assert gemm.graph_id.tolist() == [0, 7] and gemm.graph_node_id.tolist() == [0, node]
    assert gemm["count"].tolist() == [1, 2]
    two_nodes = s[s.kernel == mangled]
    assert set(two_nodes.graph_id) == {7} and set(two_nodes.graph_node_id) == {0}  # two nodes: none named


def test_peer_to_peer_memcpys_read_with_their_own_layout_stay_in_record_order() -> None:
    def copy(kind: int, corr: int, start: int) -> tuple[int, dict]:  # type: ignore[type-arg]
        return (
            kind,
            dict(copy_kind=10 if kind == 22 else 1, correlation_id=corr, start=start, end=start + 9),
        )

    bufs = _records([copy(1, 1, 10), copy(22, 2, 20), copy(22, 3, 30), copy(1, 4, 0), copy(1, 5, 50)])
    got = native(bufs)
    same(got, cb.object_path(bufs))
    assert got.correlation.tolist() == [1, 2, 3, 5] and got.name[1] == "Memcpy PtoP"


def test_kernel_and_concurrent_kernel_records_are_both_kernels() -> None:
    bufs = _records([_k(0, 1, 10, 20), (KIND_KERNEL, dict(name=1, correlation_id=2, start=30, end=40))])
    got = native(bufs)
    same(got, cb.object_path(bufs))
    assert got.name == ["gemm", cb.NCCL_NAMES[0]]


def test_layouts_match_cupti_python_record_dtypes() -> None:
    cupti = pytest.importorskip("cupti.cupti")
    versions = {
        KIND_CONCURRENT_KERNEL: [f"activity_kernel{v}_dtype" for v in range(9, 14)],
        KIND_MEMCPY: ["activity_memcpy5_dtype", "activity_memcpy6_dtype", "activity_memcpy7_dtype"],
        22: ["activity_memcpy_pto_p4_dtype"],
        KIND_MEMSET: ["activity_memset4_dtype", "activity_memset5_dtype"],
        KIND_EXTERNAL_CORRELATION: ["activity_external_correlation_dtype"],
    }
    theirs = {
        "device": "device_id",
        "stream": "stream_id",
        "correlation": "correlation_id",
        "external_id": "external_id",
    }
    for kind, names in versions.items():
        layout = LAYOUTS[kind]
        for name in names:
            dt = getattr(cupti, name)
            assert dt.itemsize >= layout.min_size and dt.itemsize % 8 == 0, name
            for field, (offset, code) in layout.fields.items():
                sub, their_offset = dt.fields[theirs.get(field, field)][:2]
                assert (their_offset, sub.itemsize) == (offset, np.dtype(code).itemsize), (name, field)
    dtypes, source = cb.record_dtypes()
    assert source.startswith("cupti-python")
    for kind, replica in cb._REPLICAS.items():
        for field in replica.names:
            assert dtypes[kind].fields[field][1] == replica.fields[field][1], (kind, field)
        assert replica.itemsize == dtypes[kind].itemsize


def test_names_are_resolved_once_per_pointer_and_demangled() -> None:
    names = cb.Names(["_Z3foov", "ncclDevKernel_AllGather_RING_LL", "_Z3foov", "not_mangled_Z"])
    table = NameTable()
    ids = table.resolve(np.array([*names.pointers, names.pointers[1], 0], np.uint64))
    got = [table.names[i] for i in ids.tolist()]
    assert got == ["foo()", "ncclDevKernel_AllGather_RING_LL", "foo()", "not_mangled_Z", got[1], ""]
    assert ids[0] == ids[2]  # two pointers to one string: one name
    assert demangle("_Zbogus") == "_Zbogus"


def test_the_buffer_pool_is_bounded_and_counts_refused_requests() -> None:
    pool = BufferPool(buffer_bytes=1 << 12, buffers=3)
    got = [pool.request() for _ in range(4)]
    assert [size for _, size in got] == [4096, 4096, 4096, 0] and got[3] == (0, 0) and pool.refused == 1
    assert all(addr % 8 == 0 for addr, _ in got[:3])
    pool.complete(got[1][0], 100)
    pool.complete(got[0][0], 4096)
    pool.complete(12345, 8)  # not a buffer of the pool: ignored
    taken = pool.take()
    assert taken == [(4096, 100), (0, 4096)] and pool.take() == []
    pool.give_back(taken)
    assert pool.free == 2 and pool.request()[1] == 4096
    with pytest.raises(ValueError):
        BufferPool(buffer_bytes=100, buffers=2)


def test_libcupti_is_looked_for_without_loading_anything(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert find_libcupti({"ARGUS_LIBCUPTI": "/opt/x/libcupti.so.13"}) == "/opt/x/libcupti.so.13"
    found = find_libcupti({})
    assert found is None or "cupti" in found


class _Backend:
    """A backend that records enable/disable/flush (unit tests of CuptiSource's duty logic)."""

    name = "fake"
    lost = 0

    def __init__(self) -> None:
        self.enabled: set[int] = set()

    def enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def flush(self) -> None:
        pass


def test_always_on_capture_covers_the_whole_window() -> None:
    s = 1_000_000_000
    source = CuptiSource(duty=DutyCycle.parse("always"), backend=_Backend())  # type: ignore[arg-type]
    source.active, source._kinds = True, [KIND_CONCURRENT_KERNEL]
    t0 = 1_790_000_000 * s
    source.update(t0)
    assert source.capturing
    spans = []
    for i in range(1, 23):  # the probe takes spans at each shipment, every 0.5 s
        spans += source.take_spans(now_ns=t0 + i * s // 2)
        assert source.update(t0 + i * s // 2) > t0 + i * s // 2 and source.capturing
    windows = KernelWindows(WindowGrid.from_seconds(10.0), grace_s=0.0)
    windows.cover("job", 0, [(t0 - s, t0 + s // 2), *spans])  # capture from before the window on
    windows.add("job", Decoded().table(0))  # an empty shipment is nothing
    events = cb.object_path(_records([_k(0, 1, t0 + s, t0 + 2 * s)]))
    windows.add("job", events.table(0))
    (job, summary), *_ = windows.ready(now_ns=t0 + 20 * s)
    assert job == "job" and summary["covered_ns"].to_pylist() == [10 * s]


def test_backends_are_chosen_by_the_environment() -> None:
    assert backend_from_env({}) == ["native", "cupti-python"]
    assert backend_from_env({"ARGUS_CUPTI_BACKEND": "cupti-python"}) == ["cupti-python"]
    assert backend_from_env({"ARGUS_CUPTI_BACKEND": "bogus"}) == ["native", "cupti-python"]


def test_cupti_that_cannot_start_here_is_refused_cleanly(caplog) -> None:  # type: ignore[no-untyped-def]
    """On this GPU-less machine the real libcupti (where one is installed) loads and refuses to start."""
    path = find_libcupti()
    if path is None:
        with pytest.raises(CuptiError, match="no libcupti"):
            NativeCupti()
        return
    backend = NativeCupti(pool=BufferPool(buffer_bytes=1 << 16, buffers=2), path=path)
    source = CuptiSource(backend=backend)
    assert source.start() is False and not source.active and not source.capturing
    assert "CUPTI" in caplog.text
    assert source.take().rows == [] and source.lost == 0
    source.stop()
