"""Trace import: time bases, sources, collectives, windows, job ids, streaming, the CLI."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from argus.collector.importer import default_job_id, import_traces, kineto
from argus.collector.importer.kineto import file_digest, parse_trace
from argus.store import Store
from argus.window_grid import WindowGrid

from .traces import T0_US, cpu_op, kernel, simple_events, step, write_trace


def _query(store: Store, sql: str, **params: Any) -> list[dict[str, Any]]:
    return store.query(sql, params).to_pylist()


def test_the_c_backend_is_used() -> None:
    assert kineto.BACKEND == "yajl2_c"


def test_relative_times_and_late_metadata(store: Store, tmp_path: Path) -> None:
    base_ns = 1_711_964_646_000_000_000
    events = [step(4, "100.5", 200), kernel("150.125", "2.5", correlation=9)]  # type: ignore[arg-type]
    text = write_trace(tmp_path / "x.json", [], base_ns=base_ns, info_after=True).read_text()
    # Decimal text the way Kineto writes it (json.dumps of a str would quote it).
    body = ",\n".join(
        f'{{"ph": "X", "cat": "{e["cat"]}", "name": "{e["name"]}", "pid": 1, "tid": 1, '
        f'"ts": {e["ts"]}, "dur": {e["dur"]}, "args": {{"stream": 7}}}}'
        for e in events
    )
    path = tmp_path / "rel.json"
    path.write_text(text.replace('"traceEvents": [\n\n]', '"traceEvents": [\n' + body + "\n]"))
    assert text.index("traceEvents") < text.index("distributedInfo") < text.index("baseTimeNanoseconds")
    result = import_traces(store, [path], job_id="rel")
    assert result.ranks == [0]
    assert _query(store, "SELECT start_ns, dur_ns FROM steps") == [
        {"start_ns": base_ns + 100_500, "dur_ns": 200_000}
    ]
    assert _query(store, "SELECT start_ns, dur_ns FROM kernel_events") == [
        {"start_ns": base_ns + 150_125, "dur_ns": 2_500}
    ]


def test_file_objects_with_names_as_an_upload_passes_them(store: Store, tmp_path: Path) -> None:
    raw = write_trace(tmp_path / "a.json.gz", simple_events(), rank=1).read_bytes()
    plain = gzip.decompress(raw)
    result = import_traces(
        store,
        [io.BytesIO(raw), io.BytesIO(plain.replace(b'"rank": 1', b'"rank": 2'))],
        names=["a.gz", "b.json"],
    )
    assert result.ranks == [1, 2]
    assert result.rows["kernel_events"] == 80 and result.rows["steps"] == 4
    digests = [file_digest(tmp_path / "a.json.gz")]
    assert parse_trace(io.BytesIO(raw)).digest == digests[0]


def test_default_job_id_is_stable_and_order_free(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", simple_events(), rank=0)
    b = write_trace(tmp_path / "b.json", simple_events(), rank=1)
    ids = {default_job_id([file_digest(a), file_digest(b)]), default_job_id([file_digest(b), file_digest(a)])}
    assert len(ids) == 1 and ids.pop().startswith("import-")
    assert default_job_id([file_digest(a)]) != default_job_id([file_digest(b)])


def _nccl_events() -> list[dict[str, Any]]:
    """Two steps; per step an allreduce on group '0' and a broadcast on group 'tp', launched from the CPU."""
    events: list[dict[str, Any]] = []
    corr = 100
    for s, t in enumerate((T0_US, T0_US + 50_000)):
        events.append(step(s + 10, t, 50_000))
        for i, (name, op, group, n, dtype) in enumerate(
            [
                (
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    "allreduce",
                    "0",
                    1000,
                    "Float",
                ),
                (
                    "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    "broadcast",
                    "tp",
                    10,
                    "BFloat16",
                ),
            ]
        ):
            corr += 1
            launch = t + 1000 + i * 10_000
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernelExC",
                    "pid": 1,
                    "tid": 1,
                    "ts": launch,
                    "dur": 5,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                kernel(
                    launch + 40,
                    300,
                    name=name,
                    stream=20,
                    correlation=corr,
                    **{
                        "Collective name": op,
                        "In msg nelems": n,
                        "Out msg nelems": n,
                        "dtype": dtype,
                        "Process Group Name": group,
                    },
                )
            )
        # An old-style NCCL kernel without metadata, and no launch event.
        events.append(
            kernel(
                t + 30_000,
                100,
                name="ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWork*)",
                stream=21,
                correlation=0,
            )
        )
        events.append(kernel(t + 31_000, 100, name="void nccl_lookalike_kernel()", stream=7))
    return events


def test_collectives_from_nccl_kernels(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "nccl.json", _nccl_events(), rank=1, world_size=4)
    import_traces(store, [path], job_id="c")
    rows = _query(
        store,
        "SELECT step, process_group, seq, op, bytes, issue_ns, start_ns, dur_ns FROM collectives "
        "ORDER BY process_group, seq",
    )
    ops = [(r["process_group"], r["seq"], r["op"], r["bytes"], r["step"]) for r in rows]
    assert ops == [
        ("0", 0, "allreduce", 4000, 10),
        ("0", 1, "sendrecv", 0, 10),
        ("0", 2, "allreduce", 4000, 11),
        ("0", 3, "sendrecv", 0, 11),
        ("tp", 0, "broadcast", 20, 10),
        ("tp", 1, "broadcast", 20, 11),
    ]
    with_launch = [r for r in rows if r["op"] != "sendrecv"]
    assert all(r["start_ns"] - r["issue_ns"] == 40_000 and r["dur_ns"] == 300_000 for r in with_launch)
    assert all(r["issue_ns"] == r["start_ns"] for r in rows if r["op"] == "sendrecv")
    flags = _query(store, "SELECT kernel, any(collective) AS c FROM kernel_summaries GROUP BY kernel")
    assert {r["kernel"][:4]: r["c"] for r in flags} == {"nccl": 1, "void": 0}
    # No pg_config: the default group of all world_size ranks.
    groups = _query(store, "SELECT group_name, group_ranks FROM ranks WHERE event = 'group'")
    assert groups == [{"group_name": "0", "group_ranks": [0, 1, 2, 3]}]


def test_summaries_per_window_aligned_to_the_epoch(store: Store, tmp_path: Path) -> None:
    # 3 s of kernels, 400 per second, two kernels; windows of 1 s start at whole seconds.
    rng = np.random.default_rng(1)
    start = T0_US + 250_000
    events = [
        kernel(
            start + i * 2500,
            int(rng.integers(40, 60)) if i % 2 else int(rng.integers(400, 500)),
            name="void a()" if i % 2 else "void b()",
        )
        for i in range(1200)
    ]
    import_traces(
        store, [write_trace(tmp_path / "w.json", events)], job_id="w", window=WindowGrid.from_seconds(1.0)
    )
    rows = _query(
        store,
        "SELECT window_start_ns, kernel, sum(count) AS n, min(log_lo) AS lo, max(log_hi) AS hi, "
        "any(resolution_ns) AS res FROM kernel_summaries GROUP BY ALL ORDER BY ALL",
    )
    windows = sorted({r["window_start_ns"] for r in rows})
    assert windows == [T0_US * 1000 + k * 10**9 for k in range(4)]
    assert sum(r["n"] for r in rows) == 1200 and {r["res"] for r in rows} == {1000}
    a = [r for r in rows if r["kernel"] == "void a()"]
    assert all(np.exp(r["lo"]) > 39_999 and np.exp(r["hi"]) < 60_001 for r in a) and len(a) == 4


def test_parsing_streams_instead_of_holding_the_file(tmp_path: Path) -> None:
    # 24k CPU ops (dropped by the importer) and 2k kernels: about 6 MB of JSON text.
    events: list[dict[str, Any]] = []
    for i in range(24_000):
        events.append(cpu_op(T0_US + i, i))
        if i % 12 == 0:
            events.append(kernel(T0_US + i, 5, correlation=i + 1))
    path = write_trace(tmp_path / "big.json", events)
    size = path.stat().st_size
    assert size > 5e6
    tracemalloc.start()
    try:
        parsed = parse_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parsed.start_ns.size == 2000
    # json.load would hold every event (~5x the text); streaming holds a chunk's events and the columns.
    assert peak < 0.25 * size, f"peak {peak / 1e6:.1f} MB for {size / 1e6:.1f} MB of JSON"


def _argus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", "import", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_imports_into_a_store(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json.gz", simple_events(), rank=0)
    b = write_trace(tmp_path / "b.json", simple_events(start_us=T0_US + 3), rank=1)
    url = f"chdb://{tmp_path / 'data'}"
    done = _argus("--store", url, str(a), str(b))
    assert done.returncode == 0, done.stderr
    job = default_job_id([file_digest(a), file_digest(b)])
    assert f"imported job {job} ranks [0, 1]" in done.stdout and "kernel_events=80" in done.stdout
    again = _argus("--store", url, "--job-id", job, str(a))
    assert again.returncode == 1 and "already has rank(s) [0]" in again.stderr
    norank = write_trace(tmp_path / "n.json", simple_events(), rank=None)
    failed = _argus("--store", url, str(norank))
    assert failed.returncode == 1
    assert "distributedInfo.rank" in failed.stderr and "--rank" in failed.stderr
    assert _argus("--store", url, "--rank", "7", "--job-id", job, str(norank)).returncode == 0


def test_cpu_only_trace_without_kernels(store: Store, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "cpu.json", [step(0, T0_US, 100), cpu_op(T0_US + 1, 0)], rank=0)
    result = import_traces(store, [path])
    assert result.rows["kernel_events"] == 0 and result.rows["steps"] == 1
    assert _query(store, "SELECT event FROM ranks ORDER BY time_ns, event") == [
        {"event": "attach"},
        {"event": "group"},
        {"event": "exit"},
    ]


def test_kernels_are_summarized_in_the_window_where_their_step_ends(store: Store, tmp_path: Path) -> None:
    # Step 7 runs from 0.95 s to 1.05 s past a whole second; its kernels start on both sides
    # of the window boundary but all belong to the window where the step ends.
    t0 = T0_US + 950_000
    events = [step(7, t0, 100_000)]
    events += [kernel(t0 + 1000 + i * 10_000, 500, correlation=i + 1) for i in range(9)]
    events.append(kernel(t0 + 1_100_000, 500, name="void after_the_steps()"))
    import_traces(
        store, [write_trace(tmp_path / "w.json", events)], job_id="w", window=WindowGrid.from_seconds(1.0)
    )
    rows = _query(store, "SELECT kernel, window_start_ns, sum(count) AS n FROM kernel_summaries GROUP BY ALL")
    second = T0_US * 1000 + 10**9
    assert sorted((r["kernel"][:9], r["window_start_ns"], r["n"]) for r in rows) == [
        ("void afte", second + 10**9, 1),
        ("void gemm", second, 9),
    ]
