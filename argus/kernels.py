"""Kernel activity as live capture and trace import both see it: the rules they must share.

The analyzer compares one rank's kernel summaries with its peers', whether they came from
the node agent (CUPTI) or from a trace import (Kineto); a rule written twice would cut them
two ways. So each of these has one home here:

- **Which kernels are collectives**: :func:`collective_op` (and :func:`is_collective_kernel`),
  NCCL's communication kernels by name, demangled or not.
- **Which window a kernel belongs to**: :func:`summary_window`, the window in which the step
  that launched it ends.
- **Its summary rows**: :func:`summarize` turns kernel events (keys and durations), the
  ranks' steps and the window length into ``kernel_summaries`` rows (KDE clusters,
  :func:`argus.kde.compress`).

The window rule. Ranks of a synchronous job end a step within milliseconds of each other,
so a window boundary that splits no step splits every rank's kernels the same way; cutting
by kernel start would not: a rank running 1 % behind would hold one more call of a kernel in
one window and one fewer in the next, and look different from its peers for no reason. A
kernel is placed in a step by its CPU launch time when known (traces), else by its GPU start
(CUPTI); kernels outside every step (before the first, after the last one's end, or of a rank
that marks no steps) fall in the window of their GPU start. Windows start at epoch multiples
of the window length.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from argus.kde import compress
from argus.schema import wire_schema
from argus.window_grid import WindowGrid

__all__ = [
    "KINDS",
    "KernelEvents",
    "StepSpans",
    "collective_op",
    "is_collective_kernel",
    "summarize",
    "summary_window",
]

#: Values of ``kind`` (``kernel_events``, ``kernel_summaries``); a kind code is an index here.
KINDS = ("kernel", "memcpy", "memset")

#: NCCL's kernels, by the name CUPTI or Kineto reports: ``ncclKernel_AllReduce_RING_LL_Sum_float``,
#: ``void ncclDevKernel_Generic(...)``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, or mangled
#: (``_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL...``); not a kernel that merely starts with
#: ``nccl``. Group 1 names the operation.
_NCCL_KERNEL = re.compile(r"(?:void\s+|_Z\d+)?nccl(?:Dev)?(?:Kernel|Func)_([A-Za-z]+)")


def collective_op(name: str) -> str | None:
    """The collective an NCCL kernel runs, ``"allreduce"``, ``"sendrecv"``…; None for any other kernel.

    The operation is the word after ``Kernel_``/``Func_``, lower case (``AllReduce`` → ``allreduce``).
    """
    match = _NCCL_KERNEL.match(name)
    return match.group(1).lower() if match is not None else None


def is_collective_kernel(name: str) -> bool:
    """True for NCCL's communication kernels (``ncclKernel_*``, ``ncclDevKernel_*``, mangled or not)."""
    return _NCCL_KERNEL.match(name) is not None


@dataclass(frozen=True)
class KernelEvents:
    """GPU activity as columns, each of shape ``(n,)``: what a summary needs of it.

    Attributes:
        rank: Global rank of each event, int64.
        kind: Index into :data:`KINDS`, int64.
        kernel: Index into ``names``, int64.
        names: Distinct kernel (or memcpy/memset) names.
        stream: CUDA stream, int64.
        start_ns: GPU start, ns since the epoch, int64.
        when_ns: The time that places the event in a step: the CPU launch when known, else
            ``start_ns``; ns since the epoch, int64.
        dur_ns: Duration, ns (>= 0), int64.
        graph_id: CUDA graph the event ran in (CUPTI graphId), 0 when launched eagerly, int64.
        graph_node_id: Its node in that graph (CUPTI graphNodeId), 0 when launched eagerly, uint64.
    """

    rank: NDArray[np.int64]
    kind: NDArray[np.int64]
    kernel: NDArray[np.int64]
    names: tuple[str, ...]
    stream: NDArray[np.int64]
    start_ns: NDArray[np.int64]
    when_ns: NDArray[np.int64]
    dur_ns: NDArray[np.int64]
    graph_id: NDArray[np.int64]
    graph_node_id: NDArray[np.uint64]

    def __len__(self) -> int:
        return int(self.start_ns.size)

    def take(self, rows: NDArray[np.intp] | NDArray[np.bool_]) -> KernelEvents:
        """The events at ``rows`` (indices or a mask); ``names`` is kept whole."""
        return KernelEvents(
            self.rank[rows],
            self.kind[rows],
            self.kernel[rows],
            self.names,
            self.stream[rows],
            self.start_ns[rows],
            self.when_ns[rows],
            self.dur_ns[rows],
            self.graph_id[rows],
            self.graph_node_id[rows],
        )

    @classmethod
    def from_wire(cls, events: pa.Table) -> KernelEvents:
        """``kernel_events`` wire rows (live capture: the GPU start is the only time known).

        Raises:
            KeyError: a kernel_events column is missing.
            ValueError: a ``kind`` not in :data:`KINDS`.
        """
        kernel = cast("pa.DictionaryArray[Any, Any]", pc.dictionary_encode(events["kernel"]).combine_chunks())
        kinds = np.asarray(events["kind"].to_pylist(), dtype=object)
        kind = np.full(kinds.size, -1, np.int64)
        for code, value in enumerate(KINDS):
            kind[kinds == value] = code
        if np.any(kind < 0):
            raise ValueError(f"kernel_events.kind not one of {KINDS}")
        start = _ints(events["start_ns"])
        return cls(
            rank=_ints(events["rank"]),
            kind=kind,
            kernel=np.asarray(kernel.indices.to_numpy(zero_copy_only=False), np.int64),
            names=tuple(str(n) for n in kernel.dictionary.to_pylist()),
            stream=_ints(events["stream"]),
            start_ns=start,
            when_ns=start,
            dur_ns=_ints(events["dur_ns"]),
            graph_id=_ints(events["graph_id"]),
            graph_node_id=np.asarray(events["graph_node_id"].to_numpy(zero_copy_only=False), np.uint64),
        )


def _ints(column: pa.ChunkedArray[Any] | pa.Array[Any]) -> NDArray[np.int64]:
    return np.asarray(column.to_numpy(zero_copy_only=False), np.int64)


@dataclass(frozen=True)
class StepSpans:
    """Steps of one or more ranks, each of shape ``(m,)``: ``[start_ns, end_ns)`` per (rank, step).

    Sorted by rank, then start (:meth:`of` sorts). Times are ns since the epoch.
    """

    rank: NDArray[np.int64]
    start_ns: NDArray[np.int64]
    end_ns: NDArray[np.int64]

    @classmethod
    def of(
        cls,
        rank: Sequence[int] | NDArray[np.integer],
        start_ns: NDArray[np.integer],
        dur_ns: NDArray[np.integer],
    ) -> StepSpans:
        """Steps from ``steps`` columns (rank, start_ns, dur_ns), any order."""
        r = np.asarray(rank, np.int64)
        s = np.asarray(start_ns, np.int64)
        e = s + np.asarray(dur_ns, np.int64)
        order = np.lexsort((s, r))
        return cls(r[order], s[order], e[order])

    @classmethod
    def none(cls) -> StepSpans:
        """No steps: every kernel falls in the window of its start."""
        empty = np.zeros(0, np.int64)
        return cls(empty, empty, empty)

    def last_end(self, rank: int) -> int | None:
        """End of ``rank``'s latest step, ns; None when it has none."""
        lo, hi = np.searchsorted(self.rank, [rank, rank + 1])
        return int(self.end_ns[lo:hi].max()) if hi > lo else None


def summary_window(events: KernelEvents, steps: StepSpans, grid: WindowGrid) -> NDArray[np.int64]:
    """Start, ns, of the summary window of each event, shape ``(n,)`` (the rule of the module doc)."""
    window = grid.starts_ns(events.start_ns)
    for rank in np.unique(events.rank).tolist():
        lo, hi = np.searchsorted(steps.rank, [rank, rank + 1])
        if hi == lo:
            continue
        starts, ends = steps.start_ns[lo:hi], steps.end_ns[lo:hi]
        mine = np.flatnonzero(events.rank == rank)
        when = events.when_ns[mine]
        step = np.maximum(np.searchsorted(starts, when, side="right") - 1, 0)
        inside = (when >= starts[step]) & (when < ends[step])
        window[mine[inside]] = grid.starts_ns(ends[step[inside]])
    return window


def summarize(
    events: KernelEvents,
    grid: WindowGrid,
    *,
    steps: StepSpans | None = None,
    resolution_ns: int = 1,
    covered_ns: Mapping[tuple[int, int], int] | None = None,
) -> pa.Table:
    """``kernel_summaries`` rows of ``events``: KDE clusters per (window, rank, kind, kernel, stream, graph).

    Kernels a CUDA graph launched are summarised apart from the same kernels launched eagerly
    (``graph_id``); a group's ``graph_node_id`` is its graph node when every kernel of it ran at
    that one node, else 0.

    Args:
        events: The events to summarise (any ranks, any windows).
        grid: The summary windows (:class:`~argus.window_grid.WindowGrid`).
        steps: The ranks' steps, for :func:`summary_window` (None: no steps known).
        resolution_ns: Timer resolution of the durations (1 for CUPTI, 1000 for µs traces).
        covered_ns: ``(rank, window_start_ns)`` → ns of that window the rank's capture ran;
            absent: the window's length (captured throughout).

    Returns:
        A table of :func:`argus.schema.wire_schema` ``("kernel_summaries")``, one row per
        cluster, groups in (window, rank, kind, kernel name code, stream, graph_id) order.
    """
    window = summary_window(events, steps if steps is not None else StepSpans.none(), grid)
    schema = wire_schema("kernel_summaries")
    cols: dict[str, list[object]] = {name: [] for name in schema.names}
    if len(events) == 0:
        return pa.Table.from_pydict(cols, schema=schema)
    order = np.lexsort((events.graph_id, events.stream, events.kernel, events.kind, events.rank, window))
    keys = np.stack([window, events.rank, events.kind, events.kernel, events.stream, events.graph_id])[
        :, order
    ]
    bounds = np.flatnonzero(np.any(keys[:, 1:] != keys[:, :-1], axis=0)) + 1
    collective = np.array([is_collective_kernel(n) for n in events.names], bool)
    covered = covered_ns or {}
    for group in np.split(order, bounds):
        first = int(group[0])
        clusters = compress(events.dur_ns[group], resolution_ns)
        k = int(clusters.size)
        rank, start = int(events.rank[first]), int(window[first])
        kind, code = int(events.kind[first]), int(events.kernel[first])
        cols["rank"] += [rank] * k
        cols["window_start_ns"] += [start] * k
        cols["kind"] += [KINDS[kind]] * k
        cols["kernel"] += [events.names[code]] * k
        cols["stream"] += [int(events.stream[first])] * k
        cols["collective"] += [int(kind == 0 and collective[code])] * k
        cols["cluster"] += list(range(k))
        cols["covered_ns"] += [covered.get((rank, start), grid.length_ns)] * k
        nodes = events.graph_node_id[group]
        node = int(nodes[0]) if bool(np.all(nodes == nodes[0])) else 0
        cols["graph_id"] += [int(events.graph_id[first])] * k
        cols["graph_node_id"] += [node] * k
        for field in ("count", "p50_ns", "p99_ns", "log_lo", "log_hi", "sum_ns"):
            cols[field] += clusters[field].tolist()
    n = len(cols["cluster"])
    cols["window_ns"] = [grid.length_ns] * n
    cols["resolution_ns"] = [resolution_ns] * n
    return pa.Table.from_pydict(cols, schema=schema)
