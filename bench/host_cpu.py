"""Argus's CPU on a training host, in CPU seconds: the probes' shipper threads and the node agent.

With more ranks than cores (the development machine: 4 CPU ranks on 2 cores) every cycle Argus
spends anywhere on the host is a cycle of training, so Argus's total CPU per second of training is
the mechanism behind its step-time overhead (issue 43). Step-time ratios need a quiet machine; CPU
time does not: the scheduler's per-thread statistics (``/proc/PID/task/TID/schedstat``, ns on a
CPU, and the timeslices run: one per wake-up or preemption) count what a thread ran, whatever
else ran beside it.

It runs the demo job (``bench/overhead.py``'s worker: TinyLM, DDP over gloo, 4 CPU ranks) under
`argus run` with one node agent, ``--runs`` times, and reads over each run's measured steps:

- ``shipper``: the probe's shipper thread (``argus-probe``) of every rank, summed;
- ``agent``: every thread of the node agent process and the CPU of the children it ran (``tc``),
  sampled every 0.1 s from here: the rate between the first and last samples inside the measured
  steps; the detail line names the busiest threads (``py-spy dump`` maps thread ids to names);
- ``run``: the `argus run` process the job runs under (its threads: waiting for the job, following
  its diagnoses), read by rank 0;
- ``main``: the ranks' training threads (training and Argus's hooks), summed.

The agent's collector is unreachable by default (it spools, as in ``overhead.py --frameworks``:
the node's own cost); ``--collector ack`` gives it an acknowledge-only collector in this process.
With ``--plain`` each probed run is paired with a plain one and ``hook_cpu_ms_per_step`` is the
training threads' CPU per step under Argus minus without (noisier: the same threads' work).

Per run a detail line; the last line (medians over the runs)::

    shipper_cpu_pct=… agent_cpu_pct=… agent_children_cpu_pct=… shipper_cpu_ms_per_step=…
    agent_cpu_ms_per_step=… shipper_wakeups_per_s=… agent_wakeups_per_s=… run_cpu_pct=…
    run_wakeups_per_s=… argus_cpu_pct=… [hook_cpu_ms_per_step=…] runs=… load_avg=START/END

``*_pct`` is percent of one core during the measured steps; ``argus_cpu_pct`` is shipper + agent +
`argus run`.

    python bench/host_cpu.py [--runs 3] [--steps 400] [--collector unreachable|ack] [--plain]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead

#: Where a thread's Python name is read from (``py-spy dump``): ``Thread TID (idle): "NAME"``.
_DUMP_LINE = re.compile(r'^Thread (\d+) \((?:idle|active)\): "(.*)"$')
#: Clock ticks per second of ``/proc/PID/stat``'s CPU times.
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class ThreadSampler:
    """Samples every thread of process ``pid`` (:func:`overhead.thread_cpu`) and the CPU of its
    finished children (``/proc/PID/stat`` ``cutime + cstime``: the agent's ``tc`` runs) every
    ``every_s``; names threads from ``py-spy dump`` (when installed) every ``name_every_s``."""

    def __init__(self, pid: int, every_s: float = 0.1, name_every_s: float = 5.0) -> None:
        self.pid, self.every_s, self.name_every_s = pid, every_s, name_every_s
        self.times: list[float] = []
        self.samples: list[dict[int, tuple[int, int]]] = []
        self.children_s: list[float] = []
        #: Thread id -> its Python name (threads py-spy saw; others keep their kernel ``comm``).
        self.names: dict[int, str] = {}
        self._spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_names = 0.0
        while not self._stop.wait(self.every_s):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
                with open(f"/proc/{self.pid}/stat", "rb") as f:
                    stat = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            sample = {tid: overhead.thread_cpu(tid, self.pid) for tid in tids}
            self.times.append(time.time())
            self.samples.append(sample)
            self.children_s.append((int(stat[13]) + int(stat[14])) * _TICK_S)  # fields 16, 17
            if self._spy is not None and time.monotonic() >= next_names:
                next_names = time.monotonic() + self.name_every_s
                self._name_threads(tids)

    def _name_threads(self, tids: list[int]) -> None:
        for tid in tids:
            if tid not in self.names:
                try:
                    self.names[tid] = Path(f"/proc/{self.pid}/task/{tid}/comm").read_text().strip()
                except OSError:
                    continue
        assert self._spy is not None
        out = subprocess.run(
            [self._spy, "dump", "--pid", str(self.pid)], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            m = _DUMP_LINE.match(line)
            if m is not None:
                self.names[int(m[1])] = m[2]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> tuple[float, int, int, float, dict[int, int]]:
        """``(seconds, CPU ns, timeslices, children's CPU s, CPU ns per thread)`` from the first sample
        after ``t0`` to the last before ``t1``, over the threads alive at both (seconds 0: too few
        samples)."""
        i, j = bisect.bisect_left(self.times, t0), bisect.bisect_right(self.times, t1) - 1
        if j <= i:
            return 0.0, 0, 0, 0.0, {}
        a, b = self.samples[i], self.samples[j]
        per = {tid: b[tid][0] - a[tid][0] for tid in a.keys() & b.keys()}
        slices = sum(b[tid][1] - a[tid][1] for tid in a.keys() & b.keys())
        children = self.children_s[j] - self.children_s[i]
        return self.times[j] - self.times[i], sum(per.values()), slices, children, per

    def by_name(self, per_thread: dict[int, int]) -> dict[str, int]:
        """CPU ns per thread name (threads of one name summed: the probes' connections)."""
        out: dict[str, int] = {}
        for tid, ns in per_thread.items():
            name = self.names.get(tid, "?")
            name = "argus-send" if name.startswith("argus-send") else name
            out[name] = out.get(name, 0) + ns
        return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="probed runs (default 3)")
    p.add_argument("--steps", type=int, default=400, help="measured steps per run (default 400, ~15 s)")
    p.add_argument("--warmup", type=int, default=20, help="steps before measuring")
    p.add_argument("--ranks", type=int, default=4, help="CPU world size (default 4)")
    p.add_argument("--collector", choices=["unreachable", "ack"], default="unreachable")
    p.add_argument("--plain", action="store_true", help="pair each probed run with a plain run")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="argus-bench-cpu-", dir="/tmp"))
    bench_args = argparse.Namespace(warmup=args.warmup, capture="duty", cupti_duty="", ranks=args.ranks)
    bench = overhead.Bench(bench_args, work)
    collector = overhead.AckCollector() if args.collector == "ack" else None
    address = collector.address if collector is not None else f"127.0.0.1:{overhead.free_port()}"
    print(
        f"host_cpu: demo job, {args.ranks} ranks, {args.runs} runs of {args.steps} steps, collector "
        f"{args.collector}; load average {load_start:.2f}; work dir {work}",
        flush=True,
    )
    figures: dict[str, list[float]] = {}
    sampler = None
    try:
        sock = bench.start_agent(address, args.collector)
        sampler = ThreadSampler(bench.agent_pids[sock])
        for i in range(args.runs):
            arms = (["argus", "plain"] if i % 2 else ["plain", "argus"]) if args.plain else ["argus"]
            got: dict[str, dict[str, Any]] = {}
            for arm in arms:
                cmd, out = bench.job("demo", args.ranks, ["--steps", str(args.steps), "--measure-s", "0"])
                got[arm] = bench.launch(
                    cmd, out, arm, sock if arm == "argus" else None, f"bench-cpu-{i}-{arm}"
                )
            doc = got["argus"]
            t0, t1 = doc["measured_wall"]
            steps = len(doc["times"])
            ranks = doc["threads"]
            shipper_ns = sum(r["shipper"][0] for r in ranks)
            shipper_slices = sum(r["shipper"][1] for r in ranks)
            main_ns = sum(r["main"][0] for r in ranks)
            run_ns, run_slices = ranks[0].get("run", (0, 0))
            span_s, agent_ns, agent_slices, children_s, per_thread = sampler.between(t0, t1)
            agent_ns += int(children_s * 1e9)
            wall = t1 - t0
            run = {
                "shipper_cpu_pct": shipper_ns / 1e7 / wall,
                "agent_cpu_pct": agent_ns / 1e7 / span_s if span_s else float("nan"),
                "agent_children_cpu_pct": children_s * 100 / span_s if span_s else float("nan"),
                "shipper_cpu_ms_per_step": shipper_ns / 1e6 / steps,
                "agent_cpu_ms_per_step": agent_ns / 1e6 / span_s * wall / steps if span_s else float("nan"),
                "shipper_wakeups_per_s": shipper_slices / wall,
                "agent_wakeups_per_s": agent_slices / span_s if span_s else float("nan"),
            }
            run["run_cpu_pct"] = run_ns / 1e7 / wall
            run["run_wakeups_per_s"] = run_slices / wall
            run["argus_cpu_pct"] = run["shipper_cpu_pct"] + run["agent_cpu_pct"] + run["run_cpu_pct"]
            detail = ""
            if "plain" in got:
                plain_main = sum(r["main"][0] for r in got["plain"]["threads"])
                run["hook_cpu_ms_per_step"] = (
                    main_ns / steps - plain_main / len(got["plain"]["times"])
                ) / 1e6
                detail = f"; hooks {run['hook_cpu_ms_per_step']:.3f} ms/step"
            for k, v in run.items():
                figures.setdefault(k, []).append(v)
            top = sorted(sampler.by_name(per_thread).items(), key=lambda kv: -kv[1])[:8]
            print(
                f"[run {i + 1}/{args.runs}] ({bench.elapsed():.0f} s, load {os.getloadavg()[0]:.1f}) "
                f"{steps} steps in {wall:.1f} s ({wall / steps * 1e3:.1f} ms/step): shippers "
                f"{run['shipper_cpu_pct']:.2f} % of a core ({run['shipper_wakeups_per_s']:.1f} wake-ups/s), "
                f"agent {run['agent_cpu_pct']:.2f} % ({run['agent_wakeups_per_s']:.1f} wake-ups/s, "
                f"of which children {run['agent_children_cpu_pct']:.2f} %, threads "
                f"{', '.join(f'{name} {ns / 1e7 / span_s:.2f}' for name, ns in top)}), "
                f"argus run {run['run_cpu_pct']:.2f} % ({run['run_wakeups_per_s']:.1f} wake-ups/s), "
                f"training threads {main_ns / 1e6 / steps:.1f} ms CPU/step{detail}",
                flush=True,
            )
    finally:
        if sampler is not None:
            sampler.stop()
        bench.close()
        if collector is not None:
            collector.stop()
        shutil.rmtree(work, ignore_errors=True)
    line = " ".join(f"{k}={statistics.median(v):.4f}" for k, v in figures.items())
    print(f"{line} runs={args.runs} load_avg={load_start:.2f}/{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
