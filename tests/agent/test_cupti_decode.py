"""CUPTI decoding (the cupti-python object path) and compression on a CPU machine, from records shaped
like cupti-python's; the native decoder is checked against this path in test_cupti_native.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from argus.agent.cupti import (
    DEFAULT_DUTY,
    KIND_CONCURRENT_KERNEL,
    KIND_EXTERNAL_CORRELATION,
    KIND_MEMCPY,
    KIND_MEMSET,
    CollectiveJoin,
    CuptiSource,
    DutyCycle,
    collect,
    decode,
    decode_records,
    duty_from_env,
)
from argus.agent.kernels import KernelWindows
from argus.agent.rows import CollectiveRow
from argus.kde import CLUSTER_DTYPE, fidelity
from argus.kernels import KernelEvents, is_collective_kernel, summarize
from argus.schema import wire_schema, wire_table
from argus.window_grid import WindowGrid


def kernel(
    name: str, start: int, end: int, stream: int = 7, corr: int = 1, device: int = 0, graph: int = 0
) -> SimpleNamespace:
    return SimpleNamespace(
        kind=KIND_CONCURRENT_KERNEL,
        name=name,
        stream_id=stream,
        device_id=device,
        correlation_id=corr,
        start=start,
        end=end,
        graph_id=graph,
        graph_node_id=graph * 100,
    )


def memcpy(copy_kind: int, start: int, end: int, corr: int, stream: int = 7) -> SimpleNamespace:
    return SimpleNamespace(
        kind=KIND_MEMCPY,
        copy_kind=copy_kind,
        stream_id=stream,
        device_id=0,
        correlation_id=corr,
        start=start,
        end=end,
        graph_id=0,
        graph_node_id=0,
    )


def memset(start: int, end: int, corr: int) -> SimpleNamespace:
    return SimpleNamespace(
        kind=KIND_MEMSET,
        stream_id=7,
        device_id=0,
        correlation_id=corr,
        start=start,
        end=end,
        graph_id=0,
        graph_node_id=0,
    )


def test_records_decode_with_zero_timestamps_counted_as_dropped() -> None:
    records = [
        kernel("ampere_sgemm_128x64_nn", 1_000, 6_000, corr=11),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 7_000, 9_500, stream=13, corr=12),
        kernel("ncclDevKernel_AllGather_RING_LL", 10_000, 12_000, stream=13, corr=13),
        kernel("lost_timestamps", 0, 0, corr=14),
        kernel("half_lost", 5_000, 0, corr=15),
        memcpy(1, 20, 70, corr=16),
        memset(0, 0, corr=17),
        SimpleNamespace(kind=KIND_EXTERNAL_CORRELATION, correlation_id=12, external_id=5, external_kind=5),
        SimpleNamespace(kind=5, start=1, end=2),  # a runtime API record: not ours
    ]
    out = decode_records(records, offset_ns=1_000_000)
    assert out.dropped == 3 and out.skipped == 1
    assert out.external == {12: 5}
    assert [r[:2] for r in out.rows] == [
        ("kernel", "ampere_sgemm_128x64_nn"),
        ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float"),
        ("kernel", "ncclDevKernel_AllGather_RING_LL"),
        ("memcpy", "Memcpy HtoD"),
    ]
    assert out.rows[0] == ("kernel", "ampere_sgemm_128x64_nn", 7, 0, 11, 1_001_000, 5_000, 0, 0)
    assert all(r[6] >= 0 for r in out.rows)


def test_both_nccl_kernel_families_are_collectives() -> None:
    assert is_collective_kernel("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert is_collective_kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL")
    assert not is_collective_kernel("void at::native::vectorized_elementwise_kernel<4>")


def test_collective_takes_its_device_times_from_correlated_kernels() -> None:
    join = CollectiveJoin(timeout_ns=1_000)
    host_row = CollectiveRow(3, "0", 17, "allreduce", 4096, 100, 100, 50, -1, 0)
    join.expect(5, host_row)
    join.expect(6, CollectiveRow(3, "0", 18, "allreduce", 4096, 200, 200, 40, -1, 0))
    decoded = decode_records(
        [
            SimpleNamespace(
                kind=KIND_EXTERNAL_CORRELATION, correlation_id=12, external_id=5, external_kind=5
            ),
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1_000, 3_500, stream=13, corr=12),
        ]
    )
    join.feed(decoded)
    rows = join.ready(now_ns=150)
    assert rows == [(3, "0", 17, "allreduce", 4096, 100, 1_000, 2_500, -1, 0, 0)]
    # No kernel ever came for uid 6: after the timeout it leaves with its host times.
    assert join.ready(now_ns=5_000) == [(3, "0", 18, "allreduce", 4096, 200, 200, 40, -1, 0, 0)]


def _events(rows: list[tuple], rank: int = 0) -> pa.Table:
    """``kernel_events`` of :attr:`Decoded.rows`-shaped tuples (graph columns optional)."""
    names = ("kind", "kernel", "stream", "device", "correlation", "start_ns", "dur_ns", "graph_id")
    cols = dict(zip((*names, "graph_node_id"), zip(*rows, strict=True), strict=False))
    return wire_table("kernel_events", {"rank": [rank] * len(rows), **cols})


def test_decoded_records_compress_per_window_kernel_and_stream() -> None:
    rng = np.random.default_rng(3)
    window = 1_000_000_000
    base = 5 * window
    records = []
    corr = 0
    for i in range(3000):
        corr += 1
        d = int(rng.lognormal(np.log(40_000), 0.05)) if i % 2 else int(rng.lognormal(np.log(90_000), 0.05))
        start = base + i * 200_000
        records.append(kernel("gemm", start, start + d, corr=corr))
        corr += 1
        records.append(
            kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", start + 100, start + 20_100, stream=13, corr=corr
            )
        )
    records.append(kernel("gemm", 0, 0))
    decoded = decode_records(records)
    assert decoded.dropped == 1
    windows = KernelWindows(WindowGrid.from_seconds(1.0), grace_s=0.0)
    windows.add("job", _events(decoded.rows))
    out = windows.ready(now_ns=base + 10 * window)
    assert [job for job, _ in out] == ["job"]
    s = out[0][1].to_pandas()
    gemm = s[s.kernel == "gemm"]
    # 3000 gemms over 0.6 s fall in one window: a bimodal gemm gives two clusters.
    assert sorted(gemm.p50_ns.round(-3)) == [40_000, 90_000] and gemm["count"].sum() == 3000
    nccl = s[s.kernel.str.startswith("ncclDevKernel")]
    assert (nccl.collective == 1).all() and (gemm.collective == 0).all()
    assert set(s.stream) == {7, 13} and (s.window_start_ns == base).all()
    # Late events for a compressed window are counted, not summarised twice.
    windows.add("job", _events([("kernel", "gemm", 7, 0, 1, base + 10, 1000, 0, 0)]))
    assert windows.late_events == 1 and windows.ready(now_ns=base + 20 * window) == []


def test_summary_rebuilds_within_five_percent() -> None:
    rng = np.random.default_rng(5)
    durs = rng.lognormal(np.log(120_000), 0.2, 20_000).astype(np.int64)
    rows = [("kernel", "k", 1, 0, 0, 1_000_000 + i, int(d), 0, 0) for i, d in enumerate(durs)]
    s = summarize(KernelEvents.from_wire(_events(rows)), WindowGrid(10**10))
    clusters = np.array(
        list(
            zip(
                s["count"].to_pylist(),
                s["p50_ns"].to_pylist(),
                s["p99_ns"].to_pylist(),
                s["log_lo"].to_pylist(),
                s["log_hi"].to_pylist(),
                s["sum_ns"].to_pylist(),
                strict=True,
            )
        ),
        dtype=CLUSTER_DTYPE,
    )
    assert fidelity(durs, clusters) < 0.05


def test_collected_batches_decode_together_with_memcpy_names_and_external_ids() -> None:
    first = collect(
        [
            kernel("gemm", 100, 400, corr=1),
            memcpy(8, 500, 900, corr=2),
            SimpleNamespace(kind=KIND_EXTERNAL_CORRELATION, correlation_id=3, external_id=42),
        ]
    )
    second = collect(
        [
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1_000, 1_800, stream=13, corr=3, graph=2),
            memcpy(99, 0, 50, corr=4),
            memset(2_000, 2_100, corr=5),
        ]
    )
    assert (len(first), len(second)) == (2, 3)
    out = decode([first, second], offset_ns=10)
    assert out.dropped == 1 and out.external == {3: 42}
    assert out.rows == [
        ("kernel", "gemm", 7, 0, 1, 110, 300, 0, 0),
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 13, 0, 3, 1_010, 800, 2, 200),
        ("memcpy", "Memcpy DtoD", 7, 0, 2, 510, 400, 0, 0),
        ("memset", "Memset", 7, 0, 5, 2_010, 100, 0, 0),
    ]
    table = out.table(rank=5)
    assert table.schema == wire_schema("kernel_events") and table["rank"].to_pylist() == [5] * 4
    assert table["graph_id"].to_pylist() == [0, 2, 0, 0] and table["graph_node_id"].to_pylist()[1] == 200
    assert table["kernel"].to_pylist()[2:] == ["Memcpy DtoD", "Memset"]
    assert decode([]).rows == [] and len(decode([collect([])])) == 0


def test_duty_cycle_slices_are_epoch_aligned_and_cover_their_share() -> None:
    s = 1_000_000_000
    duty = DutyCycle.parse("1/10")
    assert (duty.on_ns, duty.period_ns, duty.always) == (s, 10 * s, False)
    t0 = 1_790_000_000 * s  # a multiple of 10 s
    assert duty.state(t0) == (True, t0 + s)
    assert duty.state(t0 + s - 1) == (True, t0 + s)
    assert duty.state(t0 + s) == (False, t0 + 10 * s)
    assert duty.state(t0 + 9 * s) == (False, t0 + 10 * s)
    # Any interval of whole periods holds exactly the duty's share, wherever it starts.
    for start in (t0, t0 + 300_000_000, t0 + 5 * s):
        assert duty.covered_ns(start, start + 20 * s) == 2 * s
    assert duty.covered_ns(t0 + s // 2, t0 + 2 * s) == s // 2
    always = DutyCycle.parse("always")
    assert always.always and always.state(t0 + 3) == (True, t0 + 3 + s) and always.covered_ns(0, 7) == 7
    assert DutyCycle.parse(" 0.5/2 ") == DutyCycle(s // 2, 2 * s)
    for bad in ("", "10", "2/1", "0/10", "a/b", "1/0"):
        with pytest.raises(ValueError, match="ARGUS_CUPTI_DUTY"):
            DutyCycle.parse(bad)
    assert duty_from_env({"ARGUS_CUPTI_DUTY": "nonsense"}) == DutyCycle.parse(DEFAULT_DUTY)
    assert duty_from_env({}) == DutyCycle.parse(DEFAULT_DUTY)


class _FakeBackend:
    """Records the activity calls CuptiSource.update makes (unit test of that one method)."""

    name = "fake"
    lost = 0

    def __init__(self) -> None:
        self.enabled: set[int] = set()
        self.flushes = 0

    def enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def flush(self) -> None:
        self.flushes += 1


def test_update_enables_capture_inside_slices_only_and_reports_spans() -> None:
    s = 1_000_000_000
    fake = _FakeBackend()
    source = CuptiSource(duty=DutyCycle(s, 10 * s), backend=fake)  # type: ignore[arg-type]
    source.active = True
    source._kinds = [10, 1, 2, 39]
    t0 = 1_790_000_000 * s
    assert source.update(t0 + 5 * s) == t0 + 10 * s and not source.capturing and not fake.enabled
    assert source.update(t0 + 10 * s) == t0 + 11 * s
    assert source.capturing and source.correlates and fake.enabled == {10, 1, 2, 39}
    assert source.update(t0 + 11 * s) == t0 + 20 * s
    assert not source.capturing and not source.correlates and not fake.enabled and fake.flushes == 1
    spans = source.take_spans()
    assert len(spans) == 1 and spans[0][0] <= spans[0][1] and source.take_spans() == []
    source.update(t0 + 20 * s)  # inside a slice: an open span is cut at each take
    first = source.take_spans(now_ns=spans[0][1] + 10)
    assert len(first) == 1 and source.take_spans(now_ns=first[0][1] + 5) == [(first[0][1], first[0][1] + 5)]
