"""Native CUPTI buffer decode vs today's per-record object path, on a CPU (issue 11, must show 1).

One stream of ``--records`` activity records is laid out in activity buffers of
``--buffer-mib`` MiB as libcupti fills them: the real record dtypes and sizes
(cupti-python's ``activity_kernel11_dtype``, ``activity_memcpy6_dtype``,
``activity_memset4_dtype``, ``activity_external_correlation_dtype`` where cupti-python
is installed, else replicas of them), kinds interleaved at random (80 % concurrent
kernels over ``--names`` distinct kernel names held as real C strings, 7 % memcpy,
5 % memset, 8 % external correlation), timestamps rising with 1 % of them zero or
inverted, 20 % of the kernels launched from CUDA graphs, and small fields
(grid and block sizes of 1, ...) as real kernels have them. Both arms decode the
same bytes on one thread, names included:

* **native**: :class:`argus.agent.cupti_native.NativeDecoder` over all buffers
  (a fresh decoder per round, so every name is resolved again);
* **object**: today's path, one Python object per record built from the bytes as
  cupti-python hands them to its buffer-completed callback (its
  ``ActivityKernel11`` ... classes over the record memory; plain ``struct``-read
  objects without cupti-python), :func:`argus.agent.cupti.collect` per buffer,
  then one :func:`argus.agent.cupti.decode`.

The first round checks that both give the same columns. Rounds alternate the order
of the arms; a figure is records per second of the decoding thread's CPU time
(``time.thread_time``: on a shared machine wall time also counts other processes'
turns; wall figures are printed too), the median over ``--rounds`` with its range.
Progress goes to stdout; the last line holds the figures::

    native_records_per_s=… object_records_per_s=… speedup=… distinct_names=…

    python bench/cupti_decode.py [--records 1000000] [--names 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from argus.agent.cupti import collect, decode  # noqa: E402
from argus.agent.cupti_native import NativeDecoder, demangle  # noqa: E402
from tests.agent import cupti_buffers as cb  # noqa: E402

#: Goals of issue 11.
GOAL_RECORDS_PER_S = 5_000_000
GOAL_SPEEDUP = 50


def run_native(bufs: cb.Buffers) -> tuple[Any, float, float]:
    demangle.cache_clear()
    decoder = NativeDecoder(cb.sizes())
    t, w = time.thread_time(), time.perf_counter()
    out = decoder.decode(bufs.memory, bufs.buffers)
    return out, time.thread_time() - t, time.perf_counter() - w


def run_objects(bufs: cb.Buffers) -> tuple[Any, float, float]:
    demangle.cache_clear()
    t, w = time.thread_time(), time.perf_counter()
    batches = [collect(cb.objects(bufs, b)) for b in range(len(bufs.buffers))]
    out = decode(batches)
    return out, time.thread_time() - t, time.perf_counter() - w


def check_same(a: Any, b: Any) -> None:
    """Column-for-column equality of two decodes (names as strings)."""
    for column in (
        "kind",
        "stream",
        "device",
        "correlation",
        "start_ns",
        "dur_ns",
        "graph_id",
        "graph_node_id",
    ):
        if not np.array_equal(getattr(a, column), getattr(b, column)):
            raise SystemExit(f"cupti_decode: the two paths differ in column {column}")
    names_a = np.array(a.names, dtype=object)[a.name_id]
    names_b = np.array(b.names, dtype=object)[b.name_id]
    if not (names_a == names_b).all() or a.external != b.external or a.dropped != b.dropped:
        raise SystemExit("cupti_decode: the two paths differ in names, external ids or dropped records")


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):,.0f} (range {min(values):,.0f}-{max(values):,.0f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="records in the stream (default 1,000,000)")
    p.add_argument("--names", type=int, default=300, help="distinct kernel names (default 300)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of both arms (default 5)")
    p.add_argument("--buffer-mib", type=float, default=4.0, help="activity buffer size, MiB (default 4)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    bufs = cb.realistic(
        args.records, seed=args.seed, names=args.names, buffer_bytes=int(args.buffer_mib * (1 << 20))
    )
    _, source = cb.record_dtypes()
    n = int(bufs.kinds.size)
    sizes = {k: d.itemsize for k, d in bufs.dtypes.items()}
    print(
        f"cupti_decode: {n:,} records in {len(bufs.buffers)} buffers of {args.buffer_mib:g} MiB "
        f"({sum(v for _, v in bufs.buffers) / 2**20:,.0f} MiB), record dtypes of {source} {sizes}, "
        f"{args.names} kernel names; built in {time.perf_counter() - t0:.1f} s; load average {load:.2f}",
        flush=True,
    )
    rates: dict[str, list[float]] = {"native": [], "object": []}
    walls: dict[str, list[float]] = {"native": [], "object": []}
    arms = {"native": run_native, "object": run_objects}
    distinct = 0
    for r in range(args.rounds):
        order = ["native", "object"] if r % 2 == 0 else ["object", "native"]
        got = {}
        for arm in order:
            got[arm], cpu_s, wall_s = arms[arm](bufs)
            rates[arm].append(n / cpu_s)
            walls[arm].append(n / wall_s)
        if r == 0:
            check_same(got["native"], got["object"])
            kernels = got["native"].name_id[got["native"].kind == 0]
            distinct = len(np.unique(kernels))
            print(
                f"cupti_decode: both paths give the same {len(got['native']):,} rows "
                f"({got['native'].dropped:,} dropped, {len(got['native'].external):,} external ids, "
                f"{distinct} kernel names)",
                flush=True,
            )
        print(
            f"cupti_decode: round {r + 1}/{args.rounds}: native {rates['native'][-1]:,.0f} records/s, "
            f"object {rates['object'][-1]:,.0f} records/s (CPU time); wall {walls['native'][-1]:,.0f} / "
            f"{walls['object'][-1]:,.0f}",
            flush=True,
        )
    native_rate, object_rate = statistics.median(rates["native"]), statistics.median(rates["object"])
    speedup = statistics.median([a / b for a, b in zip(rates["native"], rates["object"], strict=True)])
    print(
        f"cupti_decode: records/s of CPU time: native {spread(rates['native'])}, "
        f"object {spread(rates['object'])}"
    )
    print(f"cupti_decode: wall clock: native {spread(walls['native'])}, object {spread(walls['object'])}")
    met = native_rate >= GOAL_RECORDS_PER_S and speedup >= GOAL_SPEEDUP
    print(
        f"cupti_decode: goal (>= {GOAL_RECORDS_PER_S:,} records/s and >= {GOAL_SPEEDUP}x) "
        f"{'met' if met else 'NOT met'}; load average {load:.2f} -> {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"native_records_per_s={native_rate:.0f} object_records_per_s={object_rate:.0f} "
        f"speedup={speedup:.1f} distinct_names={distinct}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
