"""The in-process probe of one rank (docs/design.md §1, §2): its lifecycle.

A :class:`Probe` puts the parts together and takes them down again:

- recording — :class:`~argus.agent.recorder.Recorder`, fed by the torch hooks
  (:mod:`argus.agent.torch_hooks`) and the collective wrappers (:mod:`argus.agent.collectives`);
- GPU capture — :class:`~argus.agent.gpu.GpuCapture` (CUPTI, on CUDA ranks);
- identity — :func:`argus.agent.identity.identify`, asked until this process knows its rank;
- shipping — :class:`~argus.agent.shipper.Shipper`, a thread that turns rows into batches for
  the node agent;
- lifecycle, here: install everything at :meth:`Probe.start`, record the rank's attach and exit,
  note process groups before ``destroy_process_group`` forgets them, record nothing in a forked
  child (a DataLoader worker), flush for at most :data:`EXIT_FLUSH_S` at exit.

Nothing here may raise into training: every hook catches its own errors, and when the node
agent is absent the probe keeps a bounded amount of data, then drops and counts
(``host_samples.dropped_events``).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from argus import config
from argus.agent import collectives, identity
from argus.agent.gpu import GpuCapture, detect_device, gpu_reader
from argus.agent.host import HostSampler
from argus.agent.recorder import Recorder
from argus.agent.rows import RankEvent
from argus.agent.shipper import FLUSH_S, Shipper
from argus.agent.torch_hooks import TorchHooks

__all__ = ["EXIT_FLUSH_S", "Probe"]

log = logging.getLogger(__name__)

#: Seconds the exit flush may take.
EXIT_FLUSH_S = 3.0


class Probe:
    """Records one rank's telemetry and ships it to the node agent.

    Args:
        job_id: Explicit job id (else the docs/design.md §8.2 rule, see :func:`identity.resolve_job_id`).
        socket_path: The node agent's socket (default ``$ARGUS_SOCKET`` or the config default).
        flush_s: Seconds between shipments.
    """

    def __init__(self, job_id: str | None = None, socket_path: str | None = None, flush_s: float = FLUSH_S):
        self.pid = os.getpid()
        self.attach_ns = time.time_ns()
        self.socket_path = socket_path or config.find_socket()
        self.flush_s = flush_s
        self.recorder = Recorder(self.attach_ns)
        self.gpu: GpuCapture | None = None
        self.shipper: Shipper | None = None
        self._explicit_job_id = job_id
        self._hooks = TorchHooks(self.recorder.tracker, lambda: self.recorder.active)
        self._sampler: HostSampler | None = None
        self._device = "cpu"
        self._exit_code = 0
        self._closed = False
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """True while the probe records (False after fork or shutdown; a benchmark may switch it)."""
        return self.recorder.active

    @active.setter
    def active(self, value: bool) -> None:
        self.recorder.active = value

    def start(self) -> None:
        """Install hooks, record attach, start the shipper thread."""
        recorder = self.recorder
        self._device = detect_device()
        self._hooks.install()
        collectives.install(recorder)
        self._wrap_destroy()
        self.gpu = GpuCapture.start(recorder, self._device)
        self._sampler = HostSampler(gpu_reader(self._device))
        recorder.buffers["ranks"].append(RankEvent("attach", self.attach_ns, 0, "", [], ""))
        self.shipper = Shipper(
            recorder, self.gpu, self._sampler, self.socket_path, self._identify, self.flush_s
        )
        self.shipper.connect()
        self._install_exit_hooks()
        self.shipper.start()

    def mark_step(self) -> None:
        """``argus.agent.step()``: end the current step now."""
        if self.active:
            self.recorder.tracker.mark_step(time.time_ns())

    def shutdown(self, exit_code: int | None = None) -> None:
        """Record the exit, flush to the agent (bounded time), stop recording. Idempotent."""
        with self._lock:
            if self._closed or os.getpid() != self.pid:
                return
            self._closed = True
        code = self._exit_code if exit_code is None else exit_code
        try:
            if self.shipper is not None:
                self.shipper.stop()
            self.recorder.tracker.finish()
            if self.gpu is not None:
                self.gpu.stop()
            self.recorder.buffers["ranks"].append(RankEvent("exit", time.time_ns(), code, "", [], ""))
            if self.shipper is not None:
                self.shipper.close(code, EXIT_FLUSH_S)
        except Exception:
            log.warning("argus: probe shutdown failed", exc_info=True)
        finally:
            self.active = False
            collectives.uninstall()
            self._hooks.uninstall()
            if self._sampler is not None:
                self._sampler.close()

    def _identify(self, final: bool) -> identity.Identity | None:
        return identity.identify(
            self._explicit_job_id,
            pid=self.pid,
            device=self._device,
            attach_ns=self.attach_ns,
            steps_done=self.recorder.tracker.step,
            final=final,
            dist=dist,
        )

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
        recorder = self.recorder

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if recorder.active:
                try:
                    recorder.scan_groups()
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
