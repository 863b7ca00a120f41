"""Kernel windows on the node: KDE compression per window and a bounded ring of raw events.

Kernel events from the probes (times already on the collector's clock) are
grouped into windows aligned to epoch multiples of ``window_s``. When a window
has been closed for ``grace_s`` (CUPTI hands records over in buffers, late),
each (rank, kind, kernel, stream, graph_id) group of durations is compressed with
:func:`argus.kde.compress` into ``kernel_summaries`` rows: kernels a CUDA graph
launched are summarised apart from the same kernels launched eagerly, and a
group's ``graph_node_id`` names its graph node when all of them ran at one. Events for a window
already compressed are counted as dropped, never summarised twice.

Probes with duty-cycled CUPTI capture report the spans they captured
(:meth:`KernelWindows.cover`); each summary row carries ``covered_ns``, the
part of its window its rank captured (``window_ns`` when the rank reported no
spans: capture ran throughout).

Raw events also go to a ring bounded by rows; they leave the node only when
asked for (:meth:`KernelWindows.raw`), as ``kernel_events`` rows.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import pyarrow as pa

from argus.agent.cupti import is_collective_kernel
from argus.kde import compress
from argus.schema import wire_schema

__all__ = ["KernelWindows", "summarize"]

#: CUPTI timestamps are integer ns.
RESOLUTION_NS = 1


def summarize(
    events: pa.Table, window_start_ns: int, window_ns: int, covered_ns: dict[int, int] | None = None
) -> pa.Table:
    """Compress one window's kernel events into ``kernel_summaries`` rows.

    Args:
        events: ``kernel_events`` wire rows of one window (any ranks).
        window_start_ns: Start of the window, ns since the epoch.
        window_ns: Window length, ns.
        covered_ns: rank → ns of the window its capture ran; a rank not in it: ``window_ns``.

    Returns:
        A table of :func:`argus.schema.wire_schema` ``("kernel_summaries")``, one row
        per cluster, groups in (rank, kind, kernel, stream, graph_id) order.
    """
    schema = wire_schema("kernel_summaries")
    if events.num_rows == 0:
        return schema.empty_table()
    keys = ["rank", "kind", "kernel", "stream", "graph_id"]
    grouped = events.group_by(keys).aggregate(
        [("dur_ns", "list"), ("graph_node_id", "min"), ("graph_node_id", "max")]
    )
    grouped = grouped.sort_by([(k, "ascending") for k in keys])
    cols: dict[str, list[object]] = {f.name: [] for f in schema}
    ranks = grouped["rank"].to_pylist()
    kinds = grouped["kind"].to_pylist()
    names = grouped["kernel"].to_pylist()
    streams = grouped["stream"].to_pylist()
    graphs = grouped["graph_id"].to_pylist()
    lo, hi = grouped["graph_node_id_min"].to_pylist(), grouped["graph_node_id_max"].to_pylist()
    durs = grouped["dur_ns_list"]
    covered = covered_ns or {}
    for i in range(grouped.num_rows):
        d = np.asarray(durs[i].values, dtype=np.float64)
        clusters = compress(d, RESOLUTION_NS)
        name = names[i]
        flag = 1 if kinds[i] == "kernel" and is_collective_kernel(name) else 0
        node = lo[i] if lo[i] == hi[i] else 0
        for k in range(clusters.size):
            c = clusters[k]
            cols["rank"].append(ranks[i])
            cols["window_start_ns"].append(window_start_ns)
            cols["window_ns"].append(window_ns)
            cols["kind"].append(kinds[i])
            cols["kernel"].append(name)
            cols["stream"].append(streams[i])
            cols["collective"].append(flag)
            cols["cluster"].append(k)
            cols["count"].append(int(c["count"]))
            cols["p50_ns"].append(float(c["p50_ns"]))
            cols["p99_ns"].append(float(c["p99_ns"]))
            cols["log_lo"].append(float(c["log_lo"]))
            cols["log_hi"].append(float(c["log_hi"]))
            cols["sum_ns"].append(float(c["sum_ns"]))
            cols["resolution_ns"].append(RESOLUTION_NS)
            cols["covered_ns"].append(covered.get(int(ranks[i] or 0), window_ns))
            cols["graph_id"].append(graphs[i])
            cols["graph_node_id"].append(node)
    return pa.Table.from_pydict(cols, schema=schema)


class KernelWindows:
    """Per-job kernel windows awaiting compression, and the raw-event ring.

    Args:
        window_s: Window length, seconds (windows start at epoch multiples of it).
        grace_s: How long after its end a window waits for late events.
        ring_rows: Bound on raw events kept for on-demand upload.
    """

    def __init__(self, window_s: float, grace_s: float = 5.0, ring_rows: int = 1_000_000) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_ns = int(window_s * 1e9)
        self.grace_ns = int(grace_s * 1e9)
        self.ring_rows = ring_rows
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], list[pa.Table]] = {}
        self._closed_upto: dict[str, int] = {}
        self._spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._ring: deque[tuple[str, pa.Table]] = deque()
        self._ring_size = 0
        #: Events that arrived after their window was compressed (monotonic).
        self.late_events = 0

    def add(self, job_id: str, events: pa.Table) -> None:
        """Take ``kernel_events`` wire rows of ``job_id``."""
        if events.num_rows == 0:
            return
        w = self.window_ns
        starts = events["start_ns"].to_numpy()
        wins = (starts // w) * w
        with self._lock:
            self._ring.append((job_id, events))
            self._ring_size += events.num_rows
            while self._ring_size > self.ring_rows and len(self._ring) > 1:
                _, old = self._ring.popleft()
                self._ring_size -= old.num_rows
            closed = self._closed_upto.get(job_id, -(1 << 62))
            for win in np.unique(wins):
                part = (
                    events if wins.size == 1 or (wins == win).all() else events.filter(pa.array(wins == win))
                )
                if win < closed:
                    self.late_events += part.num_rows
                    continue
                self._open.setdefault((job_id, int(win)), []).append(part)

    def cover(self, job_id: str, rank: int, spans: list[tuple[int, int]]) -> None:
        """Note that ``rank`` of ``job_id`` captured kernels during ``spans`` (``(start_ns, end_ns)``)."""
        if spans:
            with self._lock:
                self._spans.setdefault((job_id, rank), []).extend(spans)

    def _covered(self, job_id: str, win: int) -> dict[int, int]:
        """rank → ns of window ``win`` its capture spans cover (ranks that reported spans only)."""
        end = win + self.window_ns
        out: dict[int, int] = {}
        for (job, rank), spans in self._spans.items():
            if job == job_id:
                out[rank] = sum(max(0, min(b, end) - max(a, win)) for a, b in spans)
        return out

    def ready(self, now_ns: int) -> list[tuple[str, pa.Table]]:
        """Compress every window that ended more than ``grace_s`` ago: ``(job_id, summaries)``."""
        out: list[tuple[str, pa.Table]] = []
        with self._lock:
            due = sorted(
                (k for k in self._open if k[1] + self.window_ns + self.grace_ns <= now_ns), key=lambda k: k[1]
            )
            parts = [(k, self._open.pop(k), self._covered(*k)) for k in due]
            for job_id, win in due:
                self._closed_upto[job_id] = max(self._closed_upto.get(job_id, win), win + self.window_ns)
            self._prune_spans(now_ns)
        for (job_id, win), tables, covered in parts:
            out.append((job_id, summarize(pa.concat_tables(tables), win, self.window_ns, covered)))
        return out

    def _prune_spans(self, now_ns: int) -> None:
        """Forget spans that only cover windows already compressed (or long past)."""
        for key, spans in list(self._spans.items()):
            floor = self._closed_upto.get(key[0], now_ns - 2 * (self.window_ns + self.grace_ns))
            keep = [(a, b) for a, b in spans if b > floor]
            if keep:
                self._spans[key] = keep
            else:
                del self._spans[key]

    def flush_all(self) -> list[tuple[str, pa.Table]]:
        """Compress every open window now (at shutdown)."""
        return self.ready(1 << 62)

    def raw(self, job_id: str, start_ns: int, end_ns: int) -> pa.Table:
        """Raw events of ``job_id`` with ``start_ns`` in ``[start_ns, end_ns)`` still in the ring."""
        with self._lock:
            tables = [t for j, t in self._ring if j == job_id]
        if not tables:
            return wire_schema("kernel_events").empty_table()
        data = pa.concat_tables(tables)
        starts = data["start_ns"].to_numpy()
        return data.filter(pa.array((starts >= start_ns) & (starts < end_ns)))
