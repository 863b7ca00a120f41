"""KDE compression of real GPU kernel durations: bytes per rank per step, and fidelity (docs/design.md §5).

For each real Kineto trace with kernels (``$ARGUS_KINETO_DIR``, default
``/work/shared/data/kineto``):

- raw: the trace's own GPU activity events (kernel, memcpy, memset) as compact
  JSON (``json.dumps`` with no spaces: smaller than the files' own pretty text,
  so the ratio is conservative), per profiled step;
- kde: the ``kernel_summaries`` rows the importer writes for that rank, as the
  Arrow IPC stream a node agent would send (wire columns, uncompressed), per step;
- reference, same run: the raw events gzip-compressed (level 6);
- fidelity per kernel group (window, kind, kernel, stream): W1 between the raw
  durations and the mixture rebuilt from the group's clusters, relative to
  ``max(IQR, resolution)`` (:func:`argus.kde.fidelity`).

Usage: ``python bench/compression.py [--window-s 10]``. Last line:
``ratio=<median raw/kde over files> w1_rel_err_p95=<p95 of per-group fidelity over all groups>``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import ijson
import numpy as np
import pyarrow as pa

from argus.collector.importer.kineto import parse_trace
from argus.collector.importer.tables import RankTrace, kernel_summaries_table
from argus.kde import compress, fidelity
from argus.kernels import summary_window
from argus.window_grid import WindowGrid

KINETO_DIR = Path(os.environ.get("ARGUS_KINETO_DIR", "/work/shared/data/kineto"))
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_event_bytes(path: Path) -> tuple[int, int]:
    """(compact JSON bytes, gzip bytes) of the trace's GPU activity events."""
    with gzip.open(path, "rb") as f:
        text = b"".join(
            json.dumps(e, separators=(",", ":"), default=str).encode() + b","
            for e in ijson.items(f, "traceEvents.item")
            if e.get("cat") in GPU_CATEGORIES
        )
    return len(text), len(gzip.compress(text, 6))


def ipc_bytes(table: pa.Table) -> int:
    """Bytes of ``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return int(sink.getvalue().size)


def group_fidelities(rt: RankTrace, window_ns: int) -> tuple[list[float], float]:
    """Fidelity of every (window, kind, kernel, stream) group, and the seconds compression took."""
    t = rt.trace
    window = summary_window(
        t.kernel_events(rt.rank), t.step_spans(rt.rank), WindowGrid(window_ns)
    )  # as summarised
    keys = np.stack([window, t.kind, t.kernel_code, t.stream])
    _, inverse = np.unique(keys, axis=1, return_inverse=True)
    out: list[float] = []
    spent = 0.0
    for g in range(int(inverse.max()) + 1):
        dur = t.dur_ns[inverse.ravel() == g]
        started = time.perf_counter()
        clusters = compress(dur, t.resolution_ns)
        spent += time.perf_counter() - started
        out.append(fidelity(dur, clusters, t.resolution_ns))
    return out, spent


def full_window(window_ns: int) -> None:
    """The same measure over one whole window of steps (the traces hold 2-6 steps each).

    One rank of a job resampled from ``diff_control``'s real kernels
    (``synthetic/kineto.py``) for as many steps as fill ``window_ns``;
    raw = its GPU events as compact Kineto JSON.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from synthetic.kineto import resample_job, write_kineto

    template = parse_trace(KINETO_DIR / "diff_control_rank3_of8.json.gz")
    steps = int(window_ns / np.median(template.step_dur_ns))
    start = (int(template.step_start_ns[0]) // window_ns + 1) * window_ns  # the steps fill one window
    trace = resample_job(template, ranks=2, steps=steps, seed=1, start_ns=start)[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_kineto(trace, Path(tmp) / "rank0.json")
        with path.open("rb") as f:
            raw = sum(
                len(json.dumps(e, separators=(",", ":")).encode()) + 1
                for e in ijson.items(f, "traceEvents.item")
                if e.get("cat") in GPU_CATEGORIES
            )
    table = kernel_summaries_table(RankTrace(trace, "bench", 0, 2), WindowGrid(window_ns))
    kde = ipc_bytes(table.drop_columns(["job_id"]))
    print(
        f"full window: {steps} steps resampled from diff_control, 1 rank: raw {raw / steps:.0f} B/step, "
        f"kde {kde / steps:.0f} B/step, ratio {raw / kde:.0f} ({table.num_rows} clusters)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=10.0, help="summary window, s (default 10)")
    args = parser.parse_args()
    window_ns = WindowGrid.from_seconds(args.window_s).length_ns
    files = sorted(KINETO_DIR.glob("*.json.gz"))
    if not files:
        print(f"no traces under {KINETO_DIR}", file=sys.stderr)
        return 1
    print(
        f"{'file':34} {'events':>6} {'groups':>6} {'steps':>5} {'raw_B/step':>11} {'gzip_B/step':>11} "
        f"{'kde_B/step':>10} {'ratio':>7} {'gz_ratio':>8} {'fid_p50':>7} {'fid_p95':>7} {'fid_max':>7} "
        f"{'kde_ms':>6}"
    )
    ratios: list[float] = []
    all_fid: list[float] = []
    for path in files:
        trace = parse_trace(path)
        if trace.start_ns.size == 0:
            print(f"{path.name:34} no GPU events: skipped")
            continue
        rt = RankTrace(trace, "bench", trace.rank or 0, trace.world_size or 1)
        steps = max(trace.step.size, 1)
        raw, raw_gz = raw_event_bytes(path)
        kde = ipc_bytes(kernel_summaries_table(rt, WindowGrid(window_ns)).drop_columns(["job_id"]))
        fid, spent = group_fidelities(rt, window_ns)
        ratios.append(raw / kde)
        all_fid += fid
        p50, p95 = np.quantile(fid, [0.5, 0.95])
        print(
            f"{path.name:34} {trace.start_ns.size:6d} {len(fid):6d} {steps:5d} {raw / steps:11.0f} "
            f"{raw_gz / steps:11.0f} {kde / steps:10.0f} {raw / kde:7.1f} {raw / raw_gz:8.1f} "
            f"{p50:7.4f} {p95:7.4f} {max(fid):7.4f} {spent * 1e3:6.0f}"
        )
    full_window(window_ns)
    ratio = float(np.median(ratios))
    p95_all = float(np.quantile(all_fid, 0.95))
    print(f"files={len(ratios)} groups={len(all_fid)} window_s={args.window_s:g}")
    print(f"ratio={ratio:.1f} w1_rel_err_p95={p95_all:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
