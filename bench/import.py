"""Trace import memory and speed on a 1 GB Kineto trace built by repeating a real one.

Builds, in a temporary folder, an uncompressed trace of at least ``--size-gb``
GB: the events of ``diff_control_rank3_of8.json.gz`` repeated back to back, each
copy shifted in time (``ts``), in correlation id and in ``ProfilerStep#`` number,
so that it reads as one long profile of one rank. Then runs, each in a fresh
process that reports its own peak RSS (``VmHWM`` of ``/proc/self/status``; a
forked child's ``ru_maxrss`` would count the parent's pages from before exec),
its wall time and its CPU time for the work:

- ``floor``: the importer's imports and an open embedded store, no trace;
- ``json.load (35 MB)``: the reference way (HTA, ``json.load`` of the whole file)
  on one copy of the real trace, and its RSS scaled to the big file;
- ``import (35 MB)``: :func:`argus.collector.importer.import_traces` of that copy;
- ``import (1 GB)``: the same of the big trace into a fresh chDB store.

Usage: ``python bench/import.py [--size-gb 1] [--keep DIR]``. Last line:
``mb_per_s=<uncompressed MB per wall second of the 1 GB import> peak_rss_mb=<its peak RSS>``
(the line before gives MB per CPU second, which a busy machine disturbs less).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KINETO_DIR = Path(os.environ.get("ARGUS_KINETO_DIR", "/work/shared/data/kineto"))
BASE = "diff_control_rank3_of8.json.gz"
_FIELD = re.compile(rb'("ts": |"correlation": |ProfilerStep#)(\d+)')
_EVENTS_OPEN = b'"traceEvents": ['


def build_trace(base_gz: Path, out: Path, size_bytes: int) -> tuple[int, int]:
    """Write ``out``: ``base_gz``'s events repeated until the file holds ``size_bytes``; (bytes, copies)."""
    text = gzip.decompress(base_gz.read_bytes())
    start = text.index(_EVENTS_OPEN) + len(_EVENTS_OPEN)
    end = text.rindex(b"]")
    if text[end + 1 :].strip() != b"}":
        raise ValueError(f"{base_gz}: expected traceEvents to be the last key")
    head, body, tail = text[:start], text[start:end].strip(), text[end:]
    pieces = _FIELD.split(body)
    texts, keys = pieces[0::3], pieces[1::3]
    values = np.array([int(v) for v in pieces[2::3]], dtype=np.int64)
    is_ts = np.array([k == b'"ts": ' for k in keys])
    is_corr = np.array([k == b'"correlation": ' for k in keys])
    is_step = ~(is_ts | is_corr)
    ts_span = int(values[is_ts].max() - values[is_ts].min()) + 100_000  # µs
    corr_span = int(values[is_corr].max()) + 1
    step_span = int(values[is_step].max() - values[is_step].min()) + 1
    prefixes = [t + k for t, k in zip(texts, keys, strict=False)]
    last = texts[-1]
    copies = 0
    written = 0
    with out.open("wb") as f:
        f.write(head + b"\n")
        while written < size_bytes:
            shift = np.where(
                is_ts, copies * ts_span, np.where(is_corr, copies * corr_span, copies * step_span)
            )
            numbers = [b"%d" % v for v in (values + shift).tolist()]
            parts = [x for pair in zip(prefixes, numbers, strict=True) for x in pair]
            chunk = (b",\n" if copies else b"") + b"".join(parts) + last
            f.write(chunk)
            written += len(chunk)
            copies += 1
        f.write(b"\n" + tail)
    return out.stat().st_size, copies


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def child(mode: str, path: str, store_url: str) -> None:
    """Run one measured step in this process; print ``seconds= cpu_s= peak_rss_mb=``."""
    store = None
    if mode != "json.load":
        from argus.store import open_store

        store = open_store(store_url)
    started, cpu = time.perf_counter(), time.process_time()
    if mode == "json.load":
        import json

        with gzip.open(path, "rb") as f:
            events = json.load(f)["traceEvents"]
        print(f"events={len(events)}")
    elif mode == "import" and store is not None:
        from argus.collector.importer import import_traces
        from argus.collector.importer.kineto import BACKEND

        result = import_traces(store, [Path(path)], job_id="bench")
        print(
            f"rows={sum(result.rows.values())} kernel_events={result.rows['kernel_events']} backend={BACKEND}"
        )
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if store is not None:
        store.close()
    print(f"seconds={seconds:.3f} cpu_s={cpu:.3f} peak_rss_mb={_peak_rss_mb():.1f}")


def measure(mode: str, path: Path | str, store_url: str) -> tuple[float, float, float, str]:
    """(peak RSS MB, wall seconds, CPU seconds of the work, output) of one child process."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path), store_url],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} {path} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    fields = dict(re.findall(r"(\w+)=(\S+)", done.stdout))
    out = " ".join(
        f"{k}={v}" for k, v in fields.items() if k in {"events", "rows", "kernel_events", "backend"}
    )
    return float(fields["peak_rss_mb"]), float(fields["seconds"]), float(fields["cpu_s"]), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the built trace, GB (default 1)")
    parser.add_argument("--keep", type=Path, default=None, help="build in (and keep) this folder")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    base = KINETO_DIR / BASE
    with tempfile.TemporaryDirectory(prefix="argus-bench-import-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        big = folder / "repeated.json"
        started = time.perf_counter()
        size, copies = build_trace(base, big, int(args.size_gb * 1e9))
        print(
            f"built {big} ({size / 1e6:.0f} MB, {copies} copies of {BASE}) "
            f"in {time.perf_counter() - started:.0f} s"
        )
        base_mb = len(gzip.decompress(base.read_bytes())) / 1e6
        rows = [
            ("floor", *measure("floor", "-", f"chdb://{folder / 'store-floor'}"), 0.0),
            ("json.load (35 MB)", *measure("json.load", base, "-"), base_mb),
            ("import (35 MB)", *measure("import", base, f"chdb://{folder / 'store-small'}"), base_mb),
            ("import (1 GB)", *measure("import", big, f"chdb://{folder / 'store-big'}"), size / 1e6),
        ]
    print(f"{'run':20} {'json_MB':>8} {'peak_rss_MB':>11} {'wall_s':>7} {'cpu_s':>7} {'MB/s':>6}  output")
    for name, rss, seconds, cpu, out, mb in rows:
        rate = mb / seconds if mb else 0.0
        print(f"{name:20} {mb:8.0f} {rss:11.0f} {seconds:7.2f} {cpu:7.2f} {rate:6.1f}  {out}")
    floor_rss, load_rss = rows[0][1], rows[1][1]
    scaled = load_rss * (size / 1e6) / base_mb
    print(
        f"json.load of the {size / 1e9:.2f} GB file would need about {scaled / 1024:.1f} GB "
        "(scaled from 35 MB)"
    )
    _, rss, seconds, cpu, _, mb = rows[-1]
    print(f"cpu_mb_per_s={mb / cpu:.1f} floor_rss_mb={floor_rss:.0f}")
    print(f"mb_per_s={mb / seconds:.1f} peak_rss_mb={rss:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
