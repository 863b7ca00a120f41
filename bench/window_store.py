"""One analysis window through a real store at scale (issue 40): read, analyse and write, timed apart.

``bench/analyzer_scale.py`` times the analysis of windows built in memory; ``bench/scale.py``
times the whole server live, where ingest shares the cores. This one sits between: a real
embedded store (chDB) filled with ``--windows`` windows of a synchronous job of ``--ranks``
ranks (:class:`synthetic.fleet.Fleet`, the rows ``bench/scale.py``'s simulated node agents send:
per rank a ~500 ms step of four phases and four all-reduces, a host sample a second, 150 kernel
summaries a window, each rank's attach and its two process groups, the world group listing every
rank; one rank 20 % slower from window 2), written through the collector's store path
(:func:`argus.collector.ingest.write_group`, one group per step, per second of host samples and
per window of kernel summaries, as the writer makes about two groups a second). Then a fresh
:class:`argus.analyzer.service.Analyzer` analyses every window, ``--rounds`` times (the
analyzer's rows removed between rounds), and its own ``argus_analysis_window_seconds``
histogram gives the mean time per window of each stage — ``read`` (its rows from the store:
liveness and the window), ``analyse`` (the levels and the lifecycle), ``write`` (diagnoses,
accounting, roles) — as ``argus server`` reports them.

Last line: ``ranks=… windows=… window_read_s=… window_analyse_s=… window_write_s=…
window_analysis_s=… window_read_cpu_s=… window_analyse_cpu_s=… window_write_cpu_s=… rows=… named=…
load=…``: medians over the rounds of each stage's mean wall time per window; ``window_analysis_s``
their sum (``bench/scale.py``'s figure); ``window_*_cpu_s`` each stage's CPU time per window (the
process's, every thread, chDB's included: on a loaded machine the wall times grow, these hardly
do); ``rows`` the rows stored;
``named`` 1 when the last round's diagnoses name the slowed rank alone; ``load`` the load average
over one minute at the end.

    python bench/window_store.py [--ranks 10000] [--windows 4] [--rounds 3] [--keep DIR | --reuse DIR]

``--keep DIR`` fills DIR and keeps it; ``--reuse DIR`` times a store filled before (A/B of two
versions of the analyzer on the same rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # synthetic/ lives at the root

import pyarrow as pa  # noqa: E402

from argus.analyzer.service import Analyzer  # noqa: E402
from argus.collector import ingest  # noqa: E402
from argus.diagnosis import read_diagnoses  # noqa: E402
from argus.metrics import Metrics  # noqa: E402
from argus.store import Store, open_store  # noqa: E402
from argus.window_grid import WindowGrid  # noqa: E402
from synthetic.fleet import Fleet  # noqa: E402

JOB_ID = "window-store"
NS = 1_000_000_000
#: Window of the slowdown's onset (windows count from 0), as in ``bench/scale.py``.
ONSET_WINDOW = 2
#: Host samples go on this long after the last window (its heartbeats complete it), s.
TAIL_S = 2
#: The job's first step begins this long before the bench starts, in windows (a past job).
AGO_WINDOWS = 100
#: Agents whose lifecycle rows (the world group lists every rank) go in one group.
LIFECYCLE_AGENTS = 125
#: Tables the analyzer writes: emptied between rounds.
OUTPUTS = ("diagnoses", "analysis_windows", "roles", "stack_requests")
STAGES = ("read", "analyse", "write")


class _Groups:
    """Stores groups of one table's rows each through the collector's path, as one agent's batches."""

    def __init__(self, store: Store) -> None:
        self.store, self.seq, self.rows = store, 0, 0

    def write(self, tables: dict[str, pa.Table]) -> None:
        group = []
        for table, data in tables.items():
            self.seq += 1
            group.append(ingest.Decoded(table, ingest.conform(table, data), "bench-fill", self.seq, JOB_ID))
        for outcome in ingest.write_group(self.store, group):
            if isinstance(outcome, Exception):
                raise outcome
            self.rows += outcome.rows


def fill(store: Store, fleet: Fleet, windows: int) -> int:
    """Store ``windows`` windows of ``fleet``'s job from its ``t0_ns``; the rows stored."""
    groups = _Groups(store)
    agents, t0, window_ns = fleet.agents, fleet.t0_ns, fleet.window_ns
    for a0 in range(0, agents, LIFECYCLE_AGENTS):
        parts = [fleet.lifecycle(a, t0 - NS // 2) for a in range(a0, min(agents, a0 + LIFECYCLE_AGENTS))]
        groups.write({t: pa.concat_tables([p[t] for p in parts]) for t in ("jobs", "ranks")})
    stop = t0 + windows * window_ns + TAIL_S * NS
    step, second, window = 0, 1, 0
    while (end := fleet.step_end_ns(step)) <= stop:
        groups.write(fleet.steps(step, 0, agents))
        fleet.forget(step)
        step += 1
        while t0 + second * NS <= end:
            groups.write({"host_samples": fleet.host_samples(second, 0, agents)})
            second += 1
        # A window's kernel summaries a second after its end, as the node agent sends them.
        while window < windows and t0 + (window + 1) * window_ns + NS <= end:
            groups.write({"kernel_summaries": fleet.kernel_summaries(t0 + window * window_ns, 0, agents)})
            window += 1
    return groups.rows


def stage_means(metrics: Metrics) -> dict[str, float]:
    """Mean wall time per window of each stage so far, s."""
    out = {}
    for stage in STAGES:
        total = metrics.registry.get_sample_value("argus_analysis_window_seconds_sum", {"stage": stage})
        count = metrics.registry.get_sample_value("argus_analysis_window_seconds_count", {"stage": stage})
        out[stage] = (total or 0.0) / count if count else float("nan")
    return out


class _CpuTimed(Analyzer):
    """The service, with each stage's CPU time (the process's, every thread) summed beside its wall time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_s = dict.fromkeys(STAGES, 0.0)
        self._cpu_mark = 0.0

    def _window_stages(self, job: Any, w0: int, now: int) -> Any:
        self._cpu_mark = time.process_time()
        return super()._window_stages(job, w0, now)

    def _time(self, stage: str) -> None:
        mark = time.process_time()
        self.cpu_s[stage] += mark - self._cpu_mark
        self._cpu_mark = mark
        super()._time(stage)


def analyse(store: Store, t0_ns: int, windows: int, window_s: int) -> tuple[dict[str, float], set[int]]:
    """One fresh analyzer over every window: each stage's mean wall time per window, s, its CPU time per
    window (``<stage>_cpu``, the process's: every thread, chDB's included), and the ranks diagnosed."""
    for table in OUTPUTS:
        store.command(f"TRUNCATE TABLE {table}")
    metrics = Metrics()
    analyzer = _CpuTimed(
        store, window=WindowGrid.from_seconds(window_s), job=JOB_ID, backlog_s=None, metrics=metrics
    )
    # Every window complete (past the grace), the next one not: the job's windows, none more.
    analyzer.run_once(now_ns=t0_ns + windows * window_s * NS + 3 * NS)
    cpu = {f"{stage}_cpu": analyzer.cpu_s[stage] / windows for stage in STAGES}
    named = set()
    for d in read_diagnoses(store, JOB_ID):
        named |= {d.rank} if d.rank is not None else set(d.ranks)
    return stage_means(metrics) | cpu, named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000, help="a multiple of 8")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--keep", type=Path, help="fill this new store dir and keep it")
    where.add_argument("--reuse", type=Path, help="time a store filled before with --keep")
    args = parser.parse_args()
    window_ns = args.window_s * NS
    slow_rank = args.ranks // 2 + 3
    with tempfile.TemporaryDirectory(prefix="argus-window-store-") as tmp:
        path = args.reuse or args.keep or Path(tmp) / "store"
        store = open_store(f"chdb://{path}")
        try:
            stamp = path / "bench-t0"
            if args.reuse:
                t0 = int(stamp.read_text())
            else:
                t0 = (time.time_ns() // window_ns - AGO_WINDOWS) * window_ns
                fleet = Fleet(
                    args.ranks // 8,
                    8,
                    t0_ns=t0,
                    window_ns=window_ns,
                    slow_rank=slow_rank,
                    onset_ns=t0 + ONSET_WINDOW * window_ns,
                )
                began = time.perf_counter()
                rows = fill(store, fleet, args.windows)
                stamp.write_text(str(t0))
                print(f"filled {rows} rows in {time.perf_counter() - began:.1f} s", flush=True)
            count = (
                store.query("SELECT sum(rows) AS n FROM ingest_batches WHERE agent_id = 'bench-fill'")
                .column("n")[0]
                .as_py()
            )
            rounds: list[dict[str, float]] = []
            named: set[int] = set()
            for i in range(args.rounds):
                means, named = analyse(store, t0, args.windows, args.window_s)
                rounds.append(means)
                print(
                    f"round {i + 1}: "
                    + " ".join(f"{s}={v:.3f}" for s, v in means.items())
                    + f" s per window; diagnosed ranks {sorted(named)[:5]}; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        finally:
            store.close()
    med = {s: statistics.median(r[s] for r in rounds) for s in rounds[0]}
    print(
        f"ranks={args.ranks} windows={args.windows} window_read_s={med['read']:.3f} "
        f"window_analyse_s={med['analyse']:.3f} window_write_s={med['write']:.3f} "
        f"window_analysis_s={sum(med[s] for s in STAGES):.3f} "
        f"window_read_cpu_s={med['read_cpu']:.3f} window_analyse_cpu_s={med['analyse_cpu']:.3f} "
        f"window_write_cpu_s={med['write_cpu']:.3f} "
        f"rows={count} named={int(named == {slow_rank})} "
        f"load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
