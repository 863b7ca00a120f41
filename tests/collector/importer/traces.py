"""Small Kineto-shaped traces written by the tests (never committed: built in tmp_path)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: 2024-01-01T00:00:00Z in µs: a plausible epoch for absolute `ts`.
T0_US = 1_704_067_200_000_000


def kernel(
    ts_us: float,
    dur_us: float,
    name: str = "void gemm_kernel<128>(float*)",
    stream: int = 7,
    correlation: int = 0,
    **args: Any,
) -> dict[str, Any]:
    """A GPU kernel event as Kineto writes it."""
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts_us,
        "dur": dur_us,
        "args": {"device": 0, "stream": stream, "correlation": correlation, **args},
    }


def step(n: int, ts_us: float, dur_us: float) -> dict[str, Any]:
    """A ``ProfilerStep#n`` annotation."""
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"ProfilerStep#{n}",
        "pid": 1,
        "tid": 1,
        "ts": ts_us,
        "dur": dur_us,
    }


def cpu_op(ts_us: float, i: int) -> dict[str, Any]:
    """A CPU operator event of the size real ones have (the importer drops these)."""
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 1,
        "ts": ts_us,
        "dur": 3,
        "args": {
            "External id": i,
            "Input Dims": [[64, 64], [64, 64]],
            "Input type": ["float", "float"],
            "Call stack": "",
            "Module Hierarchy": "",
        },
    }


def simple_events(start_us: int = T0_US, steps: int = 2) -> list[dict[str, Any]]:
    """``steps`` steps of 10 ms, each with 20 kernels of two kinds and a CPU op."""
    events: list[dict[str, Any]] = []
    for s in range(steps):
        t = start_us + s * 10_000
        events.append(step(s, t, 10_000))
        events.append(cpu_op(t + 1, s))
        for k in range(20):
            name = "void gemm_kernel<128>(float*)" if k % 2 else "void relu_kernel(float*)"
            events.append(kernel(t + 10 + k * 400, 100 + k, name=name, correlation=s * 100 + k + 1))
    return events


def write_trace(
    path: Path,
    events: Iterable[dict[str, Any]],
    *,
    rank: int | None = 0,
    world_size: int | None = 2,
    base_ns: int | None = None,
    info_after: bool = False,
) -> Path:
    """Write a Kineto-layout trace (gzip if ``path`` ends in .gz); ``base_ns`` goes after traceEvents."""
    info: dict[str, Any] = {"backend": "nccl"}
    if rank is not None:
        info["rank"] = rank
    if world_size is not None:
        info["world_size"] = world_size
    parts = ['{"schemaVersion": 1']
    if not info_after:
        parts.append(f'"distributedInfo": {json.dumps(info)}')
    parts.append('"traceEvents": [\n' + ",\n".join(json.dumps(e) for e in events) + "\n]")
    if info_after:
        parts.append(f'"distributedInfo": {json.dumps(info)}')
    parts.append('"displayTimeUnit": "ms"')
    if base_ns is not None:
        parts.append(f'"baseTimeNanoseconds": {base_ns}')
    text = (", ".join(parts) + "}").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path
