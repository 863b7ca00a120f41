"""`argus demo`: the whole system on one machine against a real training job with a fault injected.

It starts `argus server` on an embedded store, a node agent, and a real N-rank
``torch.distributed`` job (gloo on the CPU, :mod:`argus.demo.job`, in the
``--layout`` chosen: data, pipeline × data or tensor × data parallel) under
`argus run`; after a healthy warm-up the chosen fault hits one rank. The demo
polls the REST API until a diagnosis has held for two windows (or, for
``--scenario none``, for a fixed time), and, when the diagnosis gets a stack capture (L5),
until its top frames are in it (at most :data:`STACKS_WAIT_S` more); it stops the job
cleanly, and prints the diagnoses: as a person reads them (the top frames under each), or
with ``--json`` as one JSON document.
Progress goes to stderr, the report (or the JSON document) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from argus import render
from argus.analyzer.stacks import STACK_CAUSES
from argus.config import DEFAULT_SERVER_URL
from argus.diagnosis import Diagnosis
from argus.errors import ArgusError, ConfigError

__all__ = ["WINDOW_S", "Service", "job_command", "local_service", "main"]

#: Analysis and compression window of the demo, seconds: short, so it ends quickly, yet long
#: enough that a busy 2-core machine's hiccups do not look like a straggler.
WINDOW_S = 5.0
#: Healthy training before the fault starts, seconds (the analyzer's baseline).
WARMUP_S = 10.0
#: With a fault, give up waiting for a diagnosis after this long, seconds.
FAULT_TIMEOUT_S = 75.0
#: With no fault, train this long after the warm-up, seconds.
CLEAN_RUN_S = 25.0
#: Longest wait, past the window after a diagnosis opens, for its stack capture's top frames, s:
#: the request, a 3 s capture, its rows' trip to the store and the next window's analysis took
#: 23 s from the diagnosis's opening on this 2-core machine at a load of 15 (5-10 s unloaded).
STACKS_WAIT_S = 4 * WINDOW_S
#: How the status line names each ``--layout``.
LAYOUT_NAMES = {
    "dp": "data parallel (DDP)",
    "pp": "pipeline (2 unequal stages, GPipe) x data parallel",
    "tp": "tensor (2-way, Megatron-style) x data parallel",
    "fsdp": "fully sharded data parallel (FSDP2)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)


def _wait(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ArgusError(f"{what}: the process exited with status {proc.returncode}")
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            if predicate():
                return
        time.sleep(0.2)
    raise ArgusError(f"{what}: not ready after {timeout_s:.0f} s")


def _argus(*args: str) -> list[str]:
    return [sys.executable, "-m", "argus.cli", *args]


@contextlib.contextmanager
def _process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` with output to ``log``; SIGTERM (then SIGKILL) it on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _diagnoses(http: str, job_id: str) -> list[Diagnosis]:
    body = _get_json(f"{http}/api/v1/jobs/{job_id}/diagnoses")
    return [Diagnosis.from_dict(item) for item in body["items"]]


def _any_open(diagnoses: list[Diagnosis]) -> bool:
    return any(d.state == "open" for d in diagnoses)


def _have_stacks(diagnoses: list[Diagnosis]) -> bool:
    """Whether every open diagnosis that gets a stack capture carries its top frames."""
    return all("top_frames" in d.evidence for d in diagnoses if d.state == "open" and d.cause in STACK_CAUSES)


def _with_stacks(live: list[Diagnosis], final: list[Diagnosis]) -> list[Diagnosis]:
    """``live`` with the top frames (``evidence.top_frames``, ``evidence.stacks``) of the final
    version of each where only that one has them (the capture landed after the last look)."""
    latest = {d.id: d for d in final}
    return [_stacks_from(d, latest.get(d.id)) for d in live]


def _stacks_from(d: Diagnosis, later: Diagnosis | None) -> Diagnosis:
    if "top_frames" in d.evidence or later is None or "top_frames" not in later.evidence:
        return d
    stacks: dict[str, Any] = {k: later.evidence[k] for k in ("top_frames", "stacks") if k in later.evidence}
    return replace(d, evidence={**d.evidence, **stacks})


def _waited_enough(live: list[Diagnosis], opened_at: float | None) -> bool:
    """One window after the first diagnosis opened (so that the report shows it updated and
    anything else that opens beside it), and its stack capture's top frames are in (or
    :data:`STACKS_WAIT_S` more have passed)."""
    if opened_at is None:
        return False
    waited = time.monotonic() - opened_at
    return waited > WINDOW_S and (_have_stacks(live) or waited > WINDOW_S + STACKS_WAIT_S)


def _print_human(
    console: Console,
    job_id: str,
    slow_rank: int | None,
    diagnoses: list[Diagnosis],
    trace: Path,
    store: Path,
    kept: bool,
) -> None:
    if not diagnoses:
        console.print(f"\n[bold green]No diagnosis[/]: the ranks of job {job_id} ran like their peers.")
    else:
        console.print("\nDiagnoses while the job ran (Argus resolves them once the job has finished):")
    console.print(render.report(diagnoses))
    console.print("\nWhere to look next:")
    whose = "rank 0" if slow_rank in (None, 0) else f"rank 0 and the slow rank {slow_rank}"
    console.print(f"  the timeline of {whose} (open it in https://ui.perfetto.dev): {trace}")
    if kept:
        console.print(f"  this run's data: argus server --store chdb://{store.resolve()}, then")
        console.print(f"    {DEFAULT_SERVER_URL}/ (jobs, heatmap, diagnoses with evidence)")
        console.print(
            f"    {DEFAULT_SERVER_URL}/api/v1/jobs/{job_id}/diagnoses, argus diagnose --job {job_id}"
        )
    else:
        console.print("  run the demo with --data-dir DIR to keep its store and browse it with argus server")
    console.print("  your own job: argus server, then argus run -- torchrun ... (see README)")


class _Progress:
    """The training status line: the stage, the windows analysed and steps seen (the REST job
    object), the diagnoses so far. Where stderr is no terminal (no spinner line to update), each
    newly analysed window prints a line instead."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.job: dict[str, Any] = {}
        self._printed = 0  # windows analysed when a line was last printed

    def poll(self, http: str, job_id: str, live: list[Diagnosis]) -> list[Diagnosis]:
        """The job's diagnoses now (``live`` when the server does not answer); notes its job object."""
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            live = _diagnoses(http, job_id)
            self.job = _get_json(f"{http}/api/v1/jobs/{job_id}")
        return live

    def line(self, stage: str, elapsed_s: float, diagnoses: int) -> str:
        windows = int(self.job.get("windows_analysed", 0))
        text = (
            f"training ({stage}, {elapsed_s:.0f} s): {windows} window(s) analysed, "
            f"{int(self.job.get('steps_analysed', 0))} steps seen, {diagnoses} diagnosis(es) so far"
        )
        if not self.console.is_terminal and windows > self._printed:
            self._printed = windows
            self.console.print(text)
        return text


def _default_slow_rank(args: argparse.Namespace) -> int:
    """``--slow-rank``, else the last rank (pp dataloader: the last rank of stage 0, which reads data)."""
    if args.slow_rank is not None:
        return int(args.slow_rank)
    ranks = int(args.ranks)
    return ranks // 2 - 1 if (args.layout, args.scenario) == ("pp", "dataloader") else ranks - 1


@dataclass(frozen=True)
class Service:
    """A running `argus server` (embedded store, analyzer on) and node agent (see :func:`local_service`)."""

    grpc: str
    http: str
    socket: Path
    store: Path
    logs: Path


@contextlib.contextmanager
def local_service(work: Path, console: Console, window_s: float = WINDOW_S) -> Iterator[Service]:
    """Start `argus server` (store ``work/store``) and `argus agent` on free loopback ports; stop both after.

    Logs go to ``work/logs``. Raises ArgusError when either does not come up.
    """
    grpc_addr = f"127.0.0.1:{_free_port()}"
    http = f"http://127.0.0.1:{_free_port()}"
    sock = work / "agent.sock"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    window = str(window_s)
    server_cmd = _argus(
        "server", "--store", f"chdb://{work / 'store'}", "--grpc-listen", grpc_addr,
        "--http-listen", http.removeprefix("http://"), "--window-s", window,
    )  # fmt: skip
    agent_cmd = _argus(
        "agent", "--collector", grpc_addr, "--socket", str(sock), "--spool", str(work / "spool"),
        "--window-s", window,
    )  # fmt: skip
    with _process(server_cmd, logs / "server.log") as server:
        with console.status("starting argus server (embedded ClickHouse)"):
            _wait(lambda: _get_json(f"{http}/healthz", 1.0), 90, "argus server", server)
        store_url = f"chdb://{(work / 'store').resolve()}"
        console.print(f"[green]✓[/] argus server: gRPC {grpc_addr}, REST {http}, store {store_url}")
        with _process(agent_cmd, logs / "agent.log") as agent:
            _wait(sock.exists, 60, "node agent", agent)
            console.print(f"[green]✓[/] node agent on {sock}")
            yield Service(grpc_addr, http, sock, work / "store", logs)


def job_command(service: Service, job_id: str, ranks: int, job_args: list[str]) -> list[str]:
    """`argus run` of :mod:`argus.demo.job` under torchrun with ``ranks`` ranks and ``job_args``;
    torchrun's own files go under the service's logs (not a ``torchelastic_*`` folder left in /tmp)."""
    return _argus(
        "run", "--collector", service.grpc, "--socket", str(service.socket), "--job-id", job_id,
        "--server", service.http, "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
        f"--log-dir={service.logs / 'torchrun'}", "-m", "argus.demo.job", *job_args,
    )  # fmt: skip


#: Where a demo without ``--data-dir`` leaves its timelines (the report names the file).
TRACE_DIR = Path(tempfile.gettempdir()) / "argus-demo-traces"
#: The time a demo job's id ends with (:func:`_run`), left out of its timeline's name in TRACE_DIR.
_STAMP = re.compile(r"-\d{8}-\d{6}$")


def trace_path(work: Path, keep_data: bool, job_id: str) -> Path:
    """Where the demo writes the timeline of ``job_id``: in ``--data-dir`` (``work``) when given,
    else in :data:`TRACE_DIR` (the demo's temporary data dir is removed when it ends) under the
    job id less its time, so a run replaces the last timeline of its layout and scenario and the
    folder does not grow run after run."""
    folder = work if keep_data else TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{job_id if keep_data else _STAMP.sub('', job_id)}.trace.json"


def _job_args(args: argparse.Namespace, slow_rank: int | None, stop_file: Path) -> list[str]:
    """The demo job's command-line arguments (:mod:`argus.demo.job`) for the demo's ``args``."""
    scenario: str = args.scenario
    job_args = [
        f"--layout={args.layout}",
        f"--scenario={scenario}",
        f"--fault-after-s={WARMUP_S}",
        f"--stop-file={stop_file}",
    ]
    if slow_rank is not None:
        job_args.append(f"--slow-rank={slow_rank}")
    if scenario == "host_work":
        job_args.append("--sync=broadcast")  # the fault is host work before this sync point
    if args.steps is not None:
        job_args.append(f"--steps={args.steps}")
    return job_args


def _run(args: argparse.Namespace, console: Console, work: Path, keep_data: bool) -> dict[str, Any]:
    scenario: str = args.scenario
    slow_rank = None if scenario == "none" else _default_slow_rank(args)
    layout: str = args.layout
    job_id = f"demo-{layout}-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    stop_file = work / "stop"
    job_args = _job_args(args, slow_rank, stop_file)

    with local_service(work, console) as service:
        http, logs = service.http, service.logs
        with _process(job_command(service, job_id, args.ranks, job_args), logs / "job.log") as job:
            fault = f"{scenario} on rank {slow_rank}" if slow_rank is not None else "no fault"
            console.print(
                f"[green]✓[/] training job {job_id}: {args.ranks} ranks, {LAYOUT_NAMES[layout]} over gloo; "
                f"{WARMUP_S:.0f} s healthy, then {fault}"
            )
            started = time.monotonic()
            limit = WARMUP_S + (FAULT_TIMEOUT_S if slow_rank is not None else CLEAN_RUN_S)
            live: list[Diagnosis] = []
            opened_at: float | None = None
            progress = _Progress(console)
            with console.status("training") as status:
                while job.poll() is None and time.monotonic() - started < limit:
                    time.sleep(1.0)
                    live = progress.poll(http, job_id, live)
                    elapsed = time.monotonic() - started
                    stage = (
                        "warm-up" if elapsed < WARMUP_S else ("fault" if slow_rank is not None else "clean")
                    )
                    status.update(progress.line(stage, elapsed, len(live)))
                    if opened_at is None and _any_open(live):
                        opened_at = time.monotonic()
                    if args.steps is None and _waited_enough(live, opened_at):
                        break
                with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                    live = _diagnoses(http, job_id)
                stop_file.touch()
                status.update("stopping the job")
                try:
                    job.wait(timeout=60)
                except subprocess.TimeoutExpired as exc:
                    raise ArgusError(f"the training job did not stop; see {logs / 'job.log'}") from exc
            if job.returncode != 0:
                raise ArgusError(f"the training job failed (status {job.returncode}); see {logs / 'job.log'}")
        with console.status("final analysis"):
            time.sleep(WINDOW_S * 1.5)
            final = _diagnoses(http, job_id)
        # The report is what Argus said while the job ran (it resolves a finished job's
        # diagnoses), plus anything that opened only at the end, which should be nothing.
        seen = {d.id for d in live}
        found = _with_stacks(live, final) + [d for d in final if d.id not in seen]
        trace = trace_path(work, keep_data, job_id)
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            ranks = f"{slow_rank},0" if slow_rank not in (None, 0) else "0"
            urllib.request.urlretrieve(f"{http}/api/v1/jobs/{job_id}/trace?ranks={ranks}", trace)
        if args.json:
            console.print(f"the timeline of the slow rank, for https://ui.perfetto.dev: {trace}")
        else:
            # The report is the command's output: stdout (progress stays on stderr).
            _print_human(Console(soft_wrap=True), job_id, slow_rank, found, trace, work / "store", keep_data)
    return {
        "job_id": job_id,
        "layout": layout,
        "scenario": scenario,
        "slow_rank": slow_rank,
        "diagnoses": [d.to_dict() for d in found],
    }


def _check(args: argparse.Namespace) -> None:
    """Raises ConfigError when the options of a one-node demo do not make a job."""
    if args.ranks < 2:
        raise ConfigError("--ranks must be at least 2: a straggler needs peers")
    if args.slow_rank is not None and not 0 <= args.slow_rank < args.ranks:
        raise ConfigError(f"--slow-rank must be in 0..{args.ranks - 1}")
    if args.layout != "dp" and args.ranks % 2:
        raise ConfigError(f"--layout {args.layout} needs an even --ranks (2 stages or 2-way tensor parallel)")
    if (args.layout, args.scenario) == ("pp", "dataloader") and _default_slow_rank(args) >= args.ranks // 2:
        raise ConfigError("--layout pp: only stage 0 (ranks below --ranks / 2) reads data")


def main(args: argparse.Namespace) -> int:
    """Run the demo on one machine; returns 0 when it ran (whatever it found), 1 when a part failed,
    130 when interrupted (Ctrl-C: its temporary folder is removed)."""
    _check(args)
    console = Console(stderr=True, soft_wrap=True)
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="argus-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = _run(args, console, work, keep)
    except KeyboardInterrupt:  # Ctrl-C (or SIGINT): not a failure; the processes are stopped
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        console.print("[yellow]the demo was interrupted[/]; its server, agent and job are stopped")
        return 130
    except BaseException:
        console.print(f"[red]the demo failed[/]; its logs are in {work / 'logs'}")
        raise
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0
