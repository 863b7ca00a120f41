"""Agent side: the in-process probe (`attach`, `step`) and the node agent that streams to collectors.

``import argus.agent`` loads neither torch nor any CUDA library; :func:`attach`
does (torch only, plus CUPTI/NVML on machines with an NVIDIA driver).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from argus import config
from argus.agent import guard

if TYPE_CHECKING:
    from argus.agent.probe import Probe

__all__ = ["attach", "step"]

log = logging.getLogger(__name__)

_probe: Probe | None = None
_lock = threading.Lock()


def attach(*, job_id: str | None = None, socket_path: str | None = None) -> None:
    """Attach the probe to this training process (one line in a training script).

    Records steps, phases, collectives, rank lifecycle and host signals (and
    GPU kernels through CUPTI on CUDA machines) and ships them to the node
    agent at ``socket_path`` (default ``$ARGUS_SOCKET``, else the node agent's
    default, :func:`argus.config.find_socket`). Idempotent; safe to call before or after
    ``torch.distributed.init_process_group``. With ``ARGUS_DISABLE=1`` it does
    nothing. It never raises: a probe that cannot start logs a warning and
    training goes on without it.

    Args:
        job_id: The job id; default ``$ARGUS_JOB_ID``, else ``$TORCHELASTIC_RUN_ID``,
            else one agreed by the ranks through the c10d store.
        socket_path: The node agent's unix socket.
    """
    global _probe  # noqa: PLW0603  (the process-wide probe)
    if config.env_flag(config.ENV_DISABLE):
        return
    with _lock:
        if _probe is not None and _probe.pid == os.getpid():
            return
        try:
            from argus.agent.probe import Probe

            probe = Probe(job_id=job_id, socket_path=socket_path)
            probe.start()
        except Exception:
            log.warning("argus: the probe could not attach; training continues without it", exc_info=True)
            return
        _probe = probe


def step() -> None:
    """Mark a step boundary now, for training loops that have no optimizer (no-op when not attached)."""
    probe = _probe
    if probe is not None:
        guard.call(probe.mark_step, default=None)


def _detach() -> None:
    """Flush and stop the probe of this process (tests; at exit this happens by itself)."""
    global _probe
    with _lock:
        probe, _probe = _probe, None
    if probe is not None:
        probe.shutdown()
