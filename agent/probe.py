"""The in-process probe of one rank (DESIGN §1, §2).

Training threads only append tuples of numbers to bounded
:class:`~argus.agent.buffers.RowBuffer`\\ s (through the step tracker, the
collective wrappers and CUPTI's decoder). A daemon *shipper* thread, every
:data:`FLUSH_S` seconds, takes the rows, builds Arrow batches of the wire
schemas, samples host signals (the heartbeat), notes new process groups, and
hands everything to the :class:`~argus.agent.sink.AgentLink`. At exit it
records the rank's exit status and flushes for at most a few seconds.

Nothing here may raise into training: every hook catches its own errors, and
when the node agent is absent the probe keeps a bounded amount of data, then
drops and counts (``host_samples.dropped_events``).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import sys
import threading
import time
from functools import partial
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist

from argus import config
from argus.agent import collectives, identity
from argus.agent.buffers import RowBuffer
from argus.agent.cupti import Activity, CollectiveJoin, CuptiSource, decode
from argus.agent.host import HostSampler
from argus.agent.nvml import cuda_present
from argus.agent.sink import AgentLink
from argus.agent.steps import StepTracker
from argus.agent.torch_hooks import TorchHooks
from argus.schema import PHASES, wire_schema

__all__ = ["FLUSH_S", "SAMPLE_S", "Probe"]

log = logging.getLogger(__name__)

#: Seconds between two shipments to the node agent.
FLUSH_S = 0.5
#: Seconds between two host samples (the heartbeat).
SAMPLE_S = 1.0
#: A step end held for another optimizer is closed after this long without activity.
IDLE_STEP_NS = 1_000_000_000
#: Rows each buffer holds between two shipments.
CAPACITY = {"steps": 4096, "phases": 16384, "collectives": 65536, "ranks": 1024, "host_samples": 256}
#: Kernel/memcpy/memset records held between two shipments.
KERNEL_CAPACITY = 1 << 20
#: Seconds the exit flush may take.
EXIT_FLUSH_S = 3.0
#: Collectives held as pending (issued, not complete) at most; more are dropped and counted.
MAX_PENDING = 65536


def _start_shipper(run: Any, stop: threading.Event) -> threading.Thread:
    """Start the shipper thread so that it has ended before the interpreter finalizes.

    A daemon thread still inside native code (pyarrow) when Python finalizes is
    killed on its way back to the GIL, which aborts the process ("terminate
    called without an active exception"). So the shipper is a regular thread
    and ``threading._register_atexit`` (run by ``threading._shutdown`` before it
    joins regular threads, as ``concurrent.futures`` does) tells it to stop; the
    final flush then runs from ``atexit`` in the main thread. Where that hook is
    missing the thread is a daemon and shutdown joins it.
    """
    register = getattr(threading, "_register_atexit", None)
    thread = threading.Thread(target=run, name="argus-probe", daemon=register is None)
    if register is not None:
        register(stop.set)
    thread.start()
    return thread


class _Correlator:
    """Pushes a fresh external correlation id around each GPU collective."""

    def __init__(self, source: CuptiSource) -> None:
        self._source = source
        self._ids = itertools.count(1)
        self._pushed = threading.local()

    def push(self) -> int:
        uid = next(self._ids)
        try:
            self._source.push(uid)
            self._pushed.ok = True
        except Exception:
            self._pushed.ok = False
            return 0
        return uid

    def pop(self) -> None:
        if getattr(self._pushed, "ok", False):
            self._pushed.ok = False
            with contextlib.suppress(Exception):
                self._source.pop()


#: Point-to-point ops: their rows name the partner (``peer``) and count seq per partner.
P2P_OPS = frozenset({"send", "recv"})


class _Group:
    """What the probe keeps per process group: its name, global ranks and sequence counters."""

    __slots__ = ("name", "p2p", "ranks", "seq")

    def __init__(self, name: str, ranks: tuple[int, ...]) -> None:
        self.name = name
        #: Global rank of each group rank.
        self.ranks = ranks
        self.seq = itertools.count()
        #: (op, peer global rank) -> seq counter of point-to-point transfers.
        self.p2p: dict[tuple[str, int], Any] = {}


def _global_ranks(pg: Any) -> tuple[int, ...]:
    """Global rank of each rank of ``pg`` (empty when torch cannot say)."""
    try:
        return tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:
        return ()


class Probe:
    """Records one rank's telemetry and ships it to the node agent.

    Args:
        job_id: Explicit job id (else the DESIGN §6 rule, see :func:`identity.resolve_job_id`).
        socket_path: The node agent's socket (default ``$ARGUS_SOCKET`` or the config default).
        flush_s: Seconds between shipments.
    """

    def __init__(self, job_id: str | None = None, socket_path: str | None = None, flush_s: float = FLUSH_S):
        self.pid = os.getpid()
        self.attach_ns = time.time_ns()
        self._explicit_job_id = job_id
        self.socket_path = socket_path or os.environ.get(config.ENV_SOCKET) or config.DEFAULT_SOCKET
        self.flush_s = flush_s
        self.active = True
        self.identity: identity.Identity | None = None
        self.buffers = {name: RowBuffer(cap) for name, cap in CAPACITY.items()}
        self._activity: list[Activity] = []
        self._activity_rows = 0
        self._activity_lock = threading.Lock()
        self._activity_dropped = 0
        self._cupti_dropped = 0
        self.tracker = StepTracker(self.buffers["steps"], self.buffers["phases"], self.attach_ns)
        self._hooks = TorchHooks(self.tracker, lambda: self.active)
        self._pg_info: dict[Any, _Group] = {}
        self._groups_seen: set[str] = set()
        self._ncollectives = 0
        #: Issued and not yet completed collectives, oldest first: key -> row head.
        self._pending: dict[int, tuple[Any, ...]] = {}
        self._keys = itertools.count(1)
        self._pending_dropped = 0
        self.correlate: collectives.Correlator | None = None
        self._cupti: CuptiSource | None = None
        self._correlator: _Correlator | None = None
        self._next_edge_ns = 0
        self._join: CollectiveJoin | None = None
        self._sampler: HostSampler | None = None
        self._link: AgentLink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_sample = 0.0
        self._dropped_reported = 0
        self._exit_code = 0
        self._closed = False
        self._errors = 0
        self._device = "cpu"
        self._lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Install hooks, record attach, start the shipper thread."""
        self._device = self._detect_device()
        self._hooks.install()
        collectives.install(self)
        self._wrap_destroy()
        self._start_gpu()
        self._sampler = HostSampler(self._gpu_reader())
        self.buffers["ranks"].append(("attach", self.attach_ns, 0, "", [], ""))
        self._resolve_identity()
        self._install_exit_hooks()
        self._thread = _start_shipper(self._run, self._stop)

    def mark_step(self) -> None:
        """``argus.agent.step()``: end the current step now."""
        if self.active:
            self.tracker.mark_step(time.time_ns())

    def shutdown(self, exit_code: int | None = None) -> None:
        """Record the exit, flush to the agent (bounded time), stop recording. Idempotent."""
        with self._lock:
            if self._closed or os.getpid() != self.pid:
                return
            self._closed = True
        code = self._exit_code if exit_code is None else exit_code
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
        try:
            self.tracker.finish()
            self.correlate = None
            if self._cupti is not None:
                self._cupti.stop()
            self.buffers["ranks"].append(("exit", time.time_ns(), code, "", [], ""))
            if self.identity is None:
                self._resolve_identity(final=True)
            self._ship(force_sample=True, final=True)
            if self._link is not None:
                self._link.close(code, EXIT_FLUSH_S)
        except Exception:
            log.warning("argus: probe shutdown failed", exc_info=True)
        finally:
            self.active = False
            collectives.uninstall()
            self._hooks.uninstall()
            if self._sampler is not None:
                self._sampler.close()

    # --- recording (called from training threads) -----------------------------------------------

    def collective(
        self, pg: Any, op: str, nbytes: int, issue_ns: int, work: Any, uid: int = 0, peer: int = -1
    ) -> None:
        """See :class:`argus.agent.collectives.CollectiveRecorder`."""
        key = self.open_collective(pg, op, nbytes, issue_ns, peer)
        if not key:
            return
        fut = None
        if work is not None:
            try:
                fut = work.get_future()
            except Exception:
                fut = None
        if fut is None:
            self.close_collective(key, time.time_ns(), uid)
            return
        fut.add_done_callback(partial(self._work_done, key, uid))

    def _work_done(self, key: int, uid: int, _fut: Any) -> None:
        self.close_collective(key, time.time_ns(), uid)

    def open_collective(self, pg: Any, op: str, nbytes: int, issue_ns: int, peer: int = -1) -> int:
        """Number a collective and hold it as pending until it completes; its key, 0 when not recorded.

        The pending row is ``(step, process_group, seq, op, bytes, issue_ns, peer)``. A
        point-to-point ``send``/``recv`` names its partner by group rank in ``peer``; the row
        holds the partner's global rank and a seq counted per (direction, partner), apart from
        the group's collectives (``argus.schema`` ``collectives``), so the k-th send from A to
        B pairs with B's k-th receive from A. At most :data:`MAX_PENDING` collectives are
        pending; past that a new one is counted as dropped and not recorded.
        """
        if not self.active:
            return 0
        info = self._pg_info.get(pg)
        if info is None:
            info = self._pg_info.setdefault(pg, _Group(str(pg.group_name), _global_ranks(pg)))
            self._note_group(pg, info.name)
        self._ncollectives += 1
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            self._pending_dropped += 1
            return 0
        key = next(self._keys)
        if op in P2P_OPS:
            peer = info.ranks[peer] if 0 <= peer < len(info.ranks) else -1
            counter = info.p2p.get((op, peer))
            if counter is None:
                counter = info.p2p[(op, peer)] = itertools.count()
            seq = next(counter)
        else:
            peer, seq = -1, next(info.seq)
        pending[key] = (self.tracker.event_step(), info.name, seq, op, nbytes, issue_ns, peer)
        return key

    def close_collective(self, key: int, end_ns: int, uid: int = 0) -> None:
        """Store pending collective ``key`` as completed at ``end_ns`` (GPU ones wait for their kernels)."""
        head = self._pending.pop(key, None)
        if head is None:
            return
        issue_ns = head[5]
        row = (*head[:6], issue_ns, end_ns - issue_ns, head[6])
        join = self._join
        if uid and join is not None:
            join.expect(uid, row)
        else:
            self.buffers["collectives"].append(row)

    def bucket_done(self, key: int, uid: int, fut: Any) -> Any:
        """``then`` callback of a recorded DDP bucket (:func:`argus.agent.collectives.recorded_allreduce`)."""
        self.close_collective(key, time.time_ns(), uid)
        return fut.value()[0]

    def oldest_pending(self) -> tuple[str, int, str, int]:
        """``(process_group, seq, op, issue_ns)`` of the oldest collective issued and not yet complete.

        ``("", -1, "", 0)`` when none is pending. Collectives are pending from
        their issue until their work's future completes (gloo: the transfer
        ended; NCCL: the kernels were enqueued, so a GPU rank shows a pending
        collective only while it blocks inside the issuing call).
        """
        pending = self._pending.copy()  # one C call: safe against concurrent inserts and pops
        for head in pending.values():
            return head[1], head[2], head[3], head[5]
        return "", -1, "", 0

    def collective_count(self) -> int:
        return self._ncollectives

    # --- GPU -------------------------------------------------------------------------------------

    def _detect_device(self) -> str:
        if not cuda_present() or torch.version.cuda is None:
            return "cpu"
        try:
            if not torch.cuda.is_available():
                return "cpu"
            if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                return f"cuda:{torch.cuda.current_device()}"
            local = int(os.environ.get("LOCAL_RANK", "0") or 0)
            return f"cuda:{local % max(torch.cuda.device_count(), 1)}"
        except Exception:
            return "cpu"

    def _start_gpu(self) -> None:
        if not self._device.startswith("cuda") or os.environ.get(config.ENV_CUPTI, "1") == "0":
            return
        source = CuptiSource(self._on_activity)
        if source.start():
            self._cupti, self._join = source, CollectiveJoin()
            self._correlator = _Correlator(source)
            from argus.agent import profiler_yield

            profiler_yield.install(self._release_cupti, self._resume_cupti)

    def _on_activity(self, activity: Activity) -> None:
        """A completed CUPTI buffer (CUPTI's thread): keep it for the shipper, bounded by records."""
        n = len(activity)
        with self._activity_lock:
            if self._activity_rows + n > KERNEL_CAPACITY:
                self._activity_dropped += n
                return
            self._activity.append(activity)
            self._activity_rows += n

    def _take_activity(self) -> list[Activity]:
        with self._activity_lock:
            out, self._activity = self._activity, []
            self._activity_rows = 0
        return out

    def _duty(self, now_ns: int) -> None:
        """At an edge of the CUPTI duty cycle, start or end a capture slice (shipper thread)."""
        source = self._cupti
        if source is None or not source.active or now_ns < self._next_edge_ns:
            return  # no CUPTI, given to torch.profiler or released on an error, or not yet an edge
        self._next_edge_ns = now_ns + 1_000_000_000  # should update raise: retry in a second, not in a spin
        self._next_edge_ns = source.update(now_ns)
        self.correlate = self._correlator if source.correlates and self.active else None

    def _release_cupti(self) -> None:
        """Give CUPTI to the user's torch.profiler (see :mod:`argus.agent.profiler_yield`)."""
        self.correlate = None
        if self._cupti is not None:
            self._cupti.stop()

    def _resume_cupti(self) -> None:
        source = self._cupti
        if source is not None and self.active and source.start():
            self._next_edge_ns = 0

    def _gpu_reader(self) -> Any:
        if not self._device.startswith("cuda"):
            return None
        try:
            from argus.agent.nvml import GpuReader

            index = int(self._device.split(":")[1])
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return GpuReader(uuid)
        except Exception as exc:
            log.info("argus: no NVML GPU signals (%s)", exc)
            return None

    # --- identity and exit -----------------------------------------------------------------------

    def _resolve_identity(self, final: bool = False) -> None:
        info = identity.rank_info(dist)
        if info is None:
            if not final and self.tracker.step < 1:
                return
            info = (0, 0, 1)
        rank, local_rank, world_size = info
        self.identity = identity.Identity(
            job_id=identity.resolve_job_id(self._explicit_job_id, dist),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            host=identity.hostname(),
            pid=self.pid,
            device=self._device,
            command=identity.command_line(),
            attach_ns=self.attach_ns,
        )
        self._link = AgentLink(self.socket_path, self.identity.hello())

    def _install_exit_hooks(self) -> None:
        prev_hook = sys.excepthook
        prev_exit = sys.exit

        def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            self._exit_code = 130 if issubclass(kind, KeyboardInterrupt) else 1
            prev_hook(kind, value, tb)

        def exit_(status: Any = None) -> Any:
            if status is None:
                self._exit_code = 0
            elif isinstance(status, int):
                self._exit_code = status
            else:
                self._exit_code = 1
            return prev_exit(status)

        sys.excepthook = excepthook
        sys.exit = exit_
        atexit.register(self.shutdown)
        os.register_at_fork(after_in_child=self._after_fork)

    def _wrap_destroy(self) -> None:
        """Note every process group before ``destroy_process_group`` forgets them."""
        orig = dist.distributed_c10d.destroy_process_group
        if getattr(orig, "__wrapped__", None) is not None:
            return
        probe = self

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if probe.active:
                try:
                    probe._scan_groups()
                except Exception:
                    log.debug("argus: group scan failed", exc_info=True)
            return orig(*args, **kwargs)

        destroy_process_group.__doc__ = orig.__doc__
        destroy_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
        for module in (dist, dist.distributed_c10d):
            setattr(module, "destroy_process_group", destroy_process_group)  # noqa: B010

    def _after_fork(self) -> None:
        # A forked child (DataLoader worker) is not a rank: record nothing there.
        self.active = False
        self._closed = True

    # --- shipping (shipper thread) ---------------------------------------------------------------

    def _run(self) -> None:
        next_ship = time.monotonic() + self.flush_s
        while True:
            wait = next_ship - time.monotonic()
            if self._cupti is not None and self._cupti.active:
                wait = min(wait, (self._next_edge_ns - time.time_ns()) / 1e9)
            if self._stop.wait(max(wait, 0.0)):
                return
            try:
                self._duty(time.time_ns())
                if time.monotonic() >= next_ship:
                    next_ship = time.monotonic() + self.flush_s
                    self._ship()
            except Exception:
                self._errors += 1
                if self._errors <= 3:
                    log.warning("argus: probe shipment failed", exc_info=True)

    def _ship(self, force_sample: bool = False, final: bool = False) -> None:
        if self.identity is None:
            self._resolve_identity()
            if self.identity is None:
                return
        now = time.time_ns()
        self.tracker.flush_idle(now, IDLE_STEP_NS)
        link = self._link
        assert link is not None
        kernel_rows = self._gpu_rows(now, final)
        if kernel_rows is not None:
            link.enqueue("kernel_events", kernel_rows)
        self._scan_groups()
        mono = time.monotonic()
        if (force_sample or mono >= self._next_sample) and self._sampler is not None:
            self._next_sample = mono + SAMPLE_S
            self.buffers["host_samples"].append(
                (*self._sampler.sample(), self._take_dropped(), *self.oldest_pending())
            )
        for table, buf in self.buffers.items():
            rows = buf.take()
            if rows:
                link.enqueue(table, self._batch(table, rows))
        if self._cupti is not None:
            spans = self._cupti.take_spans(now)
            if spans:
                link.enqueue_capture(spans)
        link.pump()

    def _gpu_rows(self, now_ns: int, final: bool) -> pa.Table | None:
        """Decode the CUPTI buffers taken since the last shipment; collectives whose kernels came go out."""
        source, join = self._cupti, self._join
        if source is None or join is None:
            return None
        source.flush()
        activity = self._take_activity()
        table = None
        if activity:
            decoded = decode(activity, source.offset_ns)
            self._cupti_dropped += decoded.dropped
            join.feed(decoded)
            if len(decoded):
                assert self.identity is not None
                table = decoded.table(self.identity.rank)
        for row in join.drain() if final else join.ready(now_ns):
            self.buffers["collectives"].append(row)
        return table

    def _take_dropped(self) -> int:
        total = sum(b.dropped for b in self.buffers.values()) + self._pending_dropped
        total += self._activity_dropped + self._cupti_dropped
        if self._link is not None:
            total += self._link.dropped_rows
        new = total - self._dropped_reported
        self._dropped_reported = total
        return new

    def _scan_groups(self) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            return
        names = dist.distributed_c10d._world.pg_names
        if len(names) == len(self._groups_seen):
            return
        for pg, name in list(names.items()):
            self._note_group(pg, str(name))

    def _note_group(self, pg: Any, name: str) -> None:
        """Record a ``group`` row for process group ``pg`` the first time it is seen."""
        with self._lock:
            if name in self._groups_seen:
                return
            self._groups_seen.add(name)
        try:
            ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
            backend = str(dist.get_backend(pg))
        except Exception:
            return
        self.buffers["ranks"].append(("group", time.time_ns(), 0, name, ranks, backend))

    def _batch(self, table: str, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
        ident = self.identity
        assert ident is not None
        n = len(rows)
        cols = list(zip(*rows, strict=True))
        rank = [ident.rank] * n
        if table == "steps":
            arrays: list[Any] = [rank, *cols]
        elif table == "phases":
            step, code, start, dur = cols
            arrays = [rank, step, [PHASES[c] for c in code], start, dur]
        elif table == "collectives":
            arrays = [rank, *cols]
        elif table == "ranks":
            event, time_ns, exit_code, group_name, group_ranks, backend = cols
            arrays = [
                rank,
                event,
                time_ns,
                [ident.local_rank] * n,
                [ident.world_size] * n,
                [ident.host] * n,
                [ident.pid] * n,
                [""] * n,
                [ident.device] * n,
                [0] * n,
                exit_code,
                group_name,
                group_ranks,
                backend,
            ]
        elif table == "host_samples":
            (
                t,
                interval,
                cpu,
                host_pct,
                gc_ns,
                gc_n,
                rss,
                sm,
                temp,
                power,
                util,
                throttle,
                dropped,
                *pending,
            ) = cols
            arrays = [
                rank,
                [ident.host] * n,
                t,
                interval,
                cpu,
                host_pct,
                gc_ns,
                gc_n,
                rss,
                dropped,
                sm,
                temp,
                power,
                util,
                throttle,
                *pending,
            ]
        else:
            raise KeyError(table)
        schema = wire_schema(table)
        return pa.RecordBatch.from_arrays(
            [pa.array(a, type=f.type) for a, f in zip(arrays, schema, strict=True)], schema=schema
        )
