"""A many-rank GPU job built from the real kernels of one Kineto trace (Must-show 3).

:func:`resample_job` plays a synchronous data-parallel job for ``ranks`` ranks
and ``steps`` steps from one real rank's trace (``diff_control_rank3_of8``):

* Every generated step replays the kernel sequence that several of the
  template's profiled steps share (in ``diff_control``: steps 1011-1014, 1,575
  GPU events each): the same kernels, memcpys, memsets and NCCL kernels on the
  same streams, at the same offsets into the step.
* Each call's duration is the real duration of that same call in one of those
  steps, picked at random per generated step and call but the same on every
  rank (data-parallel ranks run the same shapes), times the rank's persistent
  speed (log-normal, ``rank_spread``: GPUs of one model differ by about 1 %)
  and per-call noise (log-normal, ``call_jitter``).
* ``slow_rank``'s GEMM kernels (names matching ``gemm`` but not ``fbgemm``) are
  ``slowdown`` times longer.
* Ranks are synchronous: a rank's compute stretches its timeline
  (``compute / template compute``), so it reaches each NCCL kernel later; an
  NCCL kernel ends on every rank when the last rank has reached it plus a
  common transfer time, so a slow rank waits least. The step ends when the
  slowest rank is done; all ranks start the next step together.
* Durations and offsets are whole µs, as in the template (resolution 1000 ns).

The result is one :class:`~argus.collector.importer.kineto.ParsedTrace` per rank, what
the importer's parser would make of each rank's trace file;
:func:`write_kineto` writes one as a Kineto trace, whose parse gives it back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from argus.collector.importer.kineto import CollectiveMeta, ParsedTrace
from argus.kernels import KINDS

__all__ = ["GEMM", "resample_job", "write_kineto"]

#: GEMM kernels: cutlass/cuBLAS (s1688gemm, sgemm, ...), not fbgemm's permute kernels.
GEMM = re.compile(r"(?<!fb)gemm", re.IGNORECASE)


def _aligned_steps(t: ParsedTrace) -> tuple[list[NDArray[np.intp]], int]:
    """Rows of the profiled steps that replay one identical event sequence, and their count.

    Each step's GPU events are ordered by (stream, start); the largest set of steps
    with the same (kind, kernel, stream) sequence is kept (the first profiled steps
    of a trace often differ: warm-up, events spilling over the boundary). Row
    arrays are aligned: position ``p`` is the same kernel call in every step.
    """
    step_of = np.searchsorted(t.step_start_ns, t.start_ns, side="right") - 1
    ordered = []
    for i in range(t.step.size):
        rows = np.flatnonzero(step_of == i)
        ordered.append(rows[np.lexsort((t.start_ns[rows], t.stream[rows]))])
    signature = [(t.kind[r].tobytes(), t.kernel_code[r].tobytes(), t.stream[r].tobytes()) for r in ordered]
    best = max(set(signature), key=signature.count)
    chosen = [i for i, sig in enumerate(signature) if sig == best]
    return [ordered[i] for i in chosen], chosen[0]


def resample_job(
    template: ParsedTrace,
    *,
    ranks: int = 64,
    steps: int = 24,
    slow_rank: int | None = None,
    slowdown: float = 1.3,
    rank_spread: float = 0.01,
    call_jitter: float = 0.02,
    seed: int = 0,
    start_ns: int | None = None,
    resolution_ns: int = 1000,
) -> list[ParsedTrace]:
    """``ranks`` traces of ``steps`` steps built from ``template``'s kernels; see the module doc.

    Args:
        template: One real rank's parsed trace with ``ProfilerStep`` events and GPU events,
            at least two of whose steps replay the same kernel sequence.
        ranks: World size.
        steps: Steps to generate.
        slow_rank: The rank whose GEMM kernels are slowed, or None.
        slowdown: Factor on that rank's GEMM durations.
        rank_spread: Log-normal sigma of each rank's persistent speed (1 %: GPUs of one model).
        call_jitter: Log-normal sigma of each call's noise on top of the real step-to-step variation.
        seed: Random seed.
        start_ns: Start of the first step (default: the template's).
        resolution_ns: Durations and offsets are rounded to this (1000: whole µs, as Kineto writes).
    """
    rng = np.random.default_rng(seed)
    aligned, first = _aligned_steps(template)
    if len(aligned) < 2:
        raise ValueError(f"{template.name}: fewer than two profiled steps replay the same kernels")
    rows0 = aligned[0]
    # durations[j, p]: the real duration of call p in aligned step j.
    durations = np.stack([template.dur_ns[r] for r in aligned]).astype(np.float64)
    offsets = template.start_ns[rows0] - template.step_start_ns[first]
    step_dur = float(np.median([template.step_dur_ns[i] for i in range(template.step.size)]))
    nccl = template.is_collective[rows0]
    meta = {c.row: c for c in template.collectives}
    names = template.kernel_names
    gemm = np.array([bool(GEMM.search(names[c])) for c in template.kernel_code[rows0]])
    speed = rng.lognormal(0.0, rank_spread, ranks)
    template_compute = float(np.where(nccl, 0.0, durations.mean(axis=0)).sum())
    positions = rows0.size
    t = int(template.step_start_ns[0] if start_ns is None else start_ns)
    starts, durs, step_starts, step_durs = [], [], [], []
    for _ in range(steps):
        # Which real step each call's work comes from is the same on every rank (data-parallel
        # ranks run the same shapes); ranks differ by their speed and the per-call noise.
        pick = rng.integers(len(aligned), size=positions)
        dur = durations[pick, np.arange(positions)][None, :] * speed[:, None]
        dur *= rng.lognormal(0.0, call_jitter, (ranks, positions))
        if slow_rank is not None:
            dur[slow_rank, gemm] *= slowdown
        stretch = np.where(nccl[None, :], 0.0, dur).sum(axis=1) / template_compute
        start = offsets[None, :] * stretch[:, None]  # ns into the step (float64 cannot hold epoch ns)
        # NCCL: ends for everyone when the last rank arrived plus a common transfer time.
        transfer = durations[rng.integers(len(aligned)), nccl] * rng.lognormal(
            0.0, call_jitter, int(nccl.sum())
        )
        end = start[:, nccl].max(axis=0) + transfer
        dur[:, nccl] = end[None, :] - start[:, nccl]
        this_step = int(max(step_dur * stretch.max(), float((start + dur).max())) // 1000 * 1000)
        starts.append(t + np.round(start / resolution_ns).astype(np.int64) * resolution_ns)
        durs.append(np.maximum(np.round(dur / resolution_ns), 0).astype(np.int64) * resolution_ns)
        step_starts.append(t)
        step_durs.append(this_step)
        t += this_step
    all_start = np.concatenate(starts, axis=1)
    all_dur = np.concatenate(durs, axis=1)
    rows = np.tile(rows0, steps)
    n = rows.size
    collectives = tuple(
        CollectiveMeta(row=int(j), op=meta[int(rows[j])].op, bytes=meta[int(rows[j])].bytes, process_group="")
        for j in np.flatnonzero(template.is_collective[rows])
    )
    first_step = int(template.step[0])
    step_start = np.array(step_starts, np.int64)
    step_len = np.array(step_durs, np.int64)
    traces = []
    for r in range(ranks):
        launch = np.where(template.is_collective[rows], all_start[r] - 10_000, -1)
        traces.append(
            ParsedTrace(
                name=f"synthetic rank {r}",
                digest=f"synthetic-{seed}-{r:05d}",
                rank=r,
                world_size=ranks,
                backend="nccl",
                process_groups=(),
                resolution_ns=resolution_ns,
                kind=template.kind[rows],
                kernel_code=template.kernel_code[rows],
                kernel_names=names,
                stream=template.stream[rows],
                device=np.full(n, r % 8, np.int64),
                correlation=np.arange(1, n + 1, dtype=np.int64),
                start_ns=all_start[r],
                dur_ns=all_dur[r],
                launch_ns=launch,
                collectives=collectives,
                step=np.arange(first_step, first_step + steps, dtype=np.int64),
                step_start_ns=step_start,
                step_dur_ns=step_len,
                pid=1000 + r,
                first_ns=int(step_start[0]),
                last_ns=int(max((all_start[r] + all_dur[r]).max(), step_start[-1] + step_len[-1])),
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
