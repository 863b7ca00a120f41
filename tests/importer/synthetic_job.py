"""A many-rank GPU job built from the real kernels of one Kineto trace (Must-show 3).

:func:`resample_job` plays a synchronous data-parallel job for ``ranks`` ranks
and ``steps`` steps from one real rank's trace (``diff_control_rank3_of8``):

* Every generated step replays one of the template's profiled steps (in turn):
  the same GPU events (kernels, memcpys, memsets, NCCL kernels) on the same
  streams, at the same offsets into the step.
* Each event's duration is resampled (bootstrap) from the real durations of its
  (kernel, stream) group in the template, then multiplied by the rank's
  persistent speed (log-normal, ``rank_spread``: GPUs of one model differ by a
  few per cent) and by per-call noise (log-normal, ``call_jitter``).
* ``slow_rank``'s GEMM kernels (names matching ``gemm`` but not ``fbgemm``) are
  ``slowdown`` times longer.
* Ranks are synchronous: a rank's compute stretches its timeline
  (``compute / template compute``), so it reaches each NCCL kernel later; an
  NCCL kernel ends on every rank when the last rank has reached it plus a
  common transfer time, so a slow rank waits least. The step ends when the
  slowest rank is done; all ranks start the next step together.
* Durations and offsets are whole µs, as in the template (resolution 1000 ns).

The result is one :class:`~argus.collector.kineto.ParsedTrace` per rank, what
the importer's parser would make of each rank's trace file;
:func:`write_kineto` writes one as a Kineto trace, whose parse gives it back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from argus.collector.kineto import KINDS, CollectiveMeta, ParsedTrace
from numpy.typing import NDArray

__all__ = ["GEMM", "resample_job", "write_kineto"]

#: GEMM kernels: cutlass/cuBLAS (s1688gemm, sgemm, ...), not fbgemm's permute kernels.
GEMM = re.compile(r"(?<!fb)gemm", re.IGNORECASE)


def _steps_of(t: ParsedTrace) -> NDArray[np.intp]:
    """Index of the profiled step each GPU event belongs to (by start; -1 before the first)."""
    return np.searchsorted(t.step_start_ns, t.start_ns, side="right") - 1


def resample_job(
    template: ParsedTrace,
    *,
    ranks: int = 64,
    steps: int = 24,
    slow_rank: int | None = None,
    slowdown: float = 1.3,
    rank_spread: float = 0.02,
    call_jitter: float = 0.03,
    seed: int = 0,
    start_ns: int | None = None,
) -> list[ParsedTrace]:
    """``ranks`` traces of ``steps`` steps built from ``template``'s kernels; see the module doc.

    Args:
        template: One real rank's parsed trace with ``ProfilerStep`` events and GPU events.
        ranks: World size.
        steps: Steps to generate.
        slow_rank: The rank whose GEMM kernels are slowed, or None.
        slowdown: Factor on that rank's GEMM durations.
        rank_spread: Log-normal sigma of each rank's persistent speed.
        call_jitter: Log-normal sigma of each call's noise.
        seed: Random seed.
        start_ns: Start of the first step (default: the template's).
    """
    rng = np.random.default_rng(seed)
    step_of = _steps_of(template)
    keep = step_of >= 0
    is_nccl = template.is_collective
    meta = {c.row: c for c in template.collectives}
    # Real durations of each (kernel, stream) group, for the bootstrap.
    group_keys = template.kernel_code.astype(np.int64) * 1_000_003 + template.stream
    pools = {k: template.dur_ns[group_keys == k] for k in np.unique(group_keys)}
    names = template.kernel_names
    gemm_code = np.array([bool(GEMM.search(n)) for n in names])
    speed = rng.lognormal(0.0, rank_spread, ranks)
    n_template = template.step.size
    t = int(template.step_start_ns[0] if start_ns is None else start_ns)
    per_rank: list[dict[str, list[NDArray[np.int64]]]] = [
        {k: [] for k in ("row", "start", "dur", "launch", "step_start", "step_dur")} for _ in range(ranks)
    ]
    for g in range(steps):
        i = g % n_template
        rows = np.flatnonzero(keep & (step_of == i))
        offsets = template.start_ns[rows] - template.step_start_ns[i]
        nccl = is_nccl[rows]
        base = np.array([rng.choice(pools[k]) for k in group_keys[rows]], dtype=np.float64)
        dur = base[None, :] * speed[:, None] * rng.lognormal(0.0, call_jitter, (ranks, rows.size))
        if slow_rank is not None:
            dur[slow_rank, gemm_code[template.kernel_code[rows]]] *= slowdown
        compute = np.where(nccl[None, :], 0.0, dur).sum(axis=1)
        stretch = compute / max(float(np.where(nccl, 0.0, template.dur_ns[rows]).sum()), 1.0)
        start = offsets[None, :] * stretch[:, None]  # ns into the step (float64 cannot hold epoch ns)
        # NCCL: ends for everyone when the last rank arrived plus a common transfer time.
        transfer = base[nccl] * rng.lognormal(0.0, call_jitter, int(nccl.sum()))
        end = start[:, nccl].max(axis=0) + transfer
        dur[:, nccl] = end[None, :] - start[:, nccl]
        start_us, dur_us = np.round(start / 1000), np.maximum(np.round(dur / 1000), 0)
        step_dur = int(template.step_dur_ns[i] * stretch.max() // 1000 * 1000)
        for r in range(ranks):
            out = per_rank[r]
            out["row"].append(rows)
            begin = t + start_us[r].astype(np.int64) * 1000
            out["start"].append(begin)
            out["dur"].append(dur_us[r].astype(np.int64) * 1000)
            out["launch"].append(np.where(nccl, begin - 10_000, -1))
            out["step_start"].append(np.array([t], np.int64))
            out["step_dur"].append(np.array([step_dur], np.int64))
        t += step_dur
    traces = []
    for r in range(ranks):
        out = {k: np.concatenate(v) for k, v in per_rank[r].items()}
        rows = out["row"]
        n = rows.size
        collectives = tuple(
            CollectiveMeta(
                row=int(j), op=meta[int(rows[j])].op, bytes=meta[int(rows[j])].bytes, process_group=""
            )
            for j in np.flatnonzero(is_nccl[rows])
        )
        first_step = int(template.step[0])
        traces.append(
            ParsedTrace(
                name=f"synthetic rank {r}",
                digest=f"synthetic-{seed}-{r:05d}",
                rank=r,
                world_size=ranks,
                backend="nccl",
                process_groups=(),
                resolution_ns=1000,
                kind=template.kind[rows],
                kernel_code=template.kernel_code[rows],
                kernel_names=names,
                stream=template.stream[rows],
                device=np.full(n, r % 8, np.int64),
                correlation=np.arange(1, n + 1, dtype=np.int64),
                start_ns=out["start"],
                dur_ns=out["dur"],
                launch_ns=out["launch"],
                collectives=collectives,
                step=np.arange(first_step, first_step + steps, dtype=np.int64),
                step_start_ns=out["step_start"],
                step_dur_ns=out["step_dur"],
                pid=1000 + r,
                first_ns=int(out["step_start"][0]),
                last_ns=int(
                    max((out["start"] + out["dur"]).max(), out["step_start"][-1] + out["step_dur"][-1])
                ),
            )
        )
    return traces


def write_kineto(trace: ParsedTrace, path: Path) -> Path:
    """Write ``trace`` as a Kineto trace file (epoch-µs ``ts``), the inverse of parsing it."""
    cats = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
    nccl = {c.row: c for c in trace.collectives}
    events: list[dict[str, object]] = []
    for n, start, dur in zip(trace.step, trace.step_start_ns, trace.step_dur_ns, strict=True):
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": trace.pid,
             "tid": trace.pid, "ts": int(start) // 1000, "dur": int(dur) // 1000}
        )  # fmt: skip
    for j in range(trace.start_ns.size):
        args: dict[str, object] = {
            "device": int(trace.device[j]),
            "stream": int(trace.stream[j]),
            "correlation": int(trace.correlation[j]),
        }
        if j in nccl:
            args["Collective name"] = nccl[j].op
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": trace.pid,
                 "tid": trace.pid, "ts": int(trace.launch_ns[j]) // 1000, "dur": 3,
                 "args": {"correlation": int(trace.correlation[j])}}
            )  # fmt: skip
        events.append(
            {"ph": "X", "cat": cats[KINDS[trace.kind[j]]], "name": trace.kernel_names[trace.kernel_code[j]],
             "pid": int(trace.device[j]), "tid": int(trace.stream[j]), "ts": int(trace.start_ns[j]) // 1000,
             "dur": int(trace.dur_ns[j]) // 1000, "args": args}
        )  # fmt: skip
    info = {"backend": trace.backend, "rank": trace.rank, "world_size": trace.world_size}
    with path.open("w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": ' + json.dumps(info) + ', "traceEvents": [\n')
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in events))
        f.write("\n]}")
    return path
