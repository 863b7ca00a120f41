"""The node agent's kernel windows follow the window rule trace import uses (issue 14's intended change).

A kernel belongs to the window in which the step that launched it ends; the node agent knows the
probes' step ends, so its summaries and an import's are cut the same way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from argus.agent.kernels import KernelWindows
from argus.kernels import KernelEvents, StepSpans, summarize
from argus.schema import wire_schema, wire_table
from argus.window_grid import WindowGrid

S = 1_000_000_000
W0 = 1_800_000_000 * S  # a window start (a multiple of 10 s)


def _events(rank: int, starts_ns: list[int], dur_ns: int = 50_000, name: str = "gemm") -> pa.Table:
    n = len(starts_ns)
    return wire_table(
        "kernel_events",
        {
            "rank": [rank] * n,
            "kind": ["kernel"] * n,
            "kernel": [name] * n,
            "stream": [7] * n,
            "device": [0] * n,
            "correlation": list(range(n)),
            "start_ns": starts_ns,
            "dur_ns": [dur_ns] * n,
        },
    )


def _steps(rank: int, bounds_ns: list[int]) -> pa.Table:
    starts, ends = bounds_ns[:-1], bounds_ns[1:]
    return pa.Table.from_pydict(
        {
            "rank": [rank] * len(starts),
            "step": list(range(len(starts))),
            "start_ns": starts,
            "dur_ns": [b - a for a, b in zip(starts, ends, strict=True)],
        },
        schema=wire_schema("steps"),
    )


def _counts(table: pa.Table) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for row in table.to_pylist():
        key = (row["rank"], row["window_start_ns"])
        out[key] = out.get(key, 0) + row["count"]
    return out


def test_a_kernel_goes_to_the_window_where_its_step_ends() -> None:
    windows = KernelWindows(WindowGrid.from_seconds(10.0), grace_s=1.0)
    # One step from 9.5 s to 10.5 s of the window: its kernels start in W0 and W1, it ends in W1.
    windows.steps("job", _steps(0, [W0 + 8 * S, W0 + 9_500_000_000, W0 + 10_500_000_000]))
    early = [W0 + 8 * S + i * 1_000_000 for i in range(100)]  # in the step ending at 9.5 s
    straddling = [W0 + 9_600_000_000 + i * 1_000_000 for i in range(100)]  # the step ending at 10.5 s
    windows.add("job", _events(0, early + straddling))
    out = windows.ready(W0 + 20 * S + 2 * S)
    assert [job for job, _ in out] == ["job"]
    assert _counts(out[0][1]) == {(0, W0): 100, (0, W0 + 10 * S): 100}


def test_live_and_imported_kernels_are_summarised_alike() -> None:
    rng = np.random.default_rng(3)
    bounds = [W0 + 3 * S + k * 700_000_000 for k in range(40)]  # steps of 0.7 s over 27 s
    starts = np.sort(rng.integers(bounds[0], bounds[-1], 3000)).tolist()
    durs = rng.lognormal(np.log(40_000), 0.3, 3000).astype(np.int64)
    events = _events(0, starts)
    events = events.set_column(events.schema.get_field_index("dur_ns"), "dur_ns", pa.array(durs))
    windows = KernelWindows(WindowGrid.from_seconds(10.0), grace_s=1.0)
    windows.steps("job", _steps(0, bounds))
    windows.add("job", events)
    live = pa.concat_tables([t for _, t in windows.flush_all()])
    steps = StepSpans.of([0] * (len(bounds) - 1), np.array(bounds[:-1]), np.diff(bounds))
    imported = summarize(KernelEvents.from_wire(events), WindowGrid(10 * S), steps=steps)
    key = ["window_start_ns", "kernel", "cluster"]
    assert live.sort_by([(k, "ascending") for k in key]).equals(
        imported.sort_by([(k, "ascending") for k in key])
    )


def test_a_rank_without_steps_is_summarised_in_the_window_of_each_kernel_start() -> None:
    windows = KernelWindows(WindowGrid.from_seconds(10.0), grace_s=1.0, step_wait_s=5.0)
    windows.add("job", _events(1, [W0 + 2 * S, W0 + 12 * S]))
    assert windows.ready(W0 + 12 * S) == []  # W0 is past its grace, but its kernel may be in a step
    (job, table), *rest = windows.ready(W0 + 17 * S)  # waited step_wait_s: outside every step
    assert job == "job" and not rest and _counts(table) == {(1, W0): 1}
    (_, table), *_ = windows.flush_all()
    assert _counts(table) == {(1, W0 + 10 * S): 1}


def test_events_for_a_summarised_window_are_counted_late_not_summarised_twice() -> None:
    windows = KernelWindows(WindowGrid.from_seconds(10.0), grace_s=1.0)
    windows.steps("job", _steps(0, [W0 + 1 * S, W0 + 2 * S]))
    windows.add("job", _events(0, [W0 + 1_500_000_000]))
    assert len(windows.ready(W0 + 12 * S)) == 1
    windows.add("job", _events(0, [W0 + 1_600_000_000]))  # its step ended in W0, summarised
    assert windows.late_events == 1 and windows.ready(W0 + 30 * S) == []
