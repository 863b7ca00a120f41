"""Who a rank is: job id, rank, local rank, world size, host, device (job id rule: docs/design.md §8.2)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from argus import config

__all__ = ["Identity", "command_line", "hostname", "identify", "new_job_id", "rank_info", "resolve_job_id"]

log = logging.getLogger(__name__)

#: Set by ``argus run``: the command line of the job, for the ``jobs`` row.
_STORE_KEY = "argus/job_id"


@dataclass(frozen=True)
class Identity:
    """Identity of one rank, sent to the node agent in HELLO."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    device: str
    command: str
    attach_ns: int

    def hello(self) -> dict[str, Any]:
        """The HELLO document."""
        return {
            "version": 3,
            "job_id": self.job_id,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "device": self.device,
            "command": self.command,
            "attach_ns": self.attach_ns,
        }


def new_job_id() -> str:
    """A fresh job id: UTC time and random hex, e.g. ``job-20250101-120000-3fa2c1``."""
    return time.strftime("job-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def _env_job_id() -> str | None:
    explicit = os.environ.get(config.ENV_JOB_ID, "").strip()
    if explicit:
        return explicit
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic.lower() != "none":
        return elastic
    return None


def resolve_job_id(explicit: str | None, dist: Any = None) -> str:
    """Job id: ``explicit``, else ``$ARGUS_JOB_ID``, else ``$TORCHELASTIC_RUN_ID``, else agreed.

    Without any of those and with ``torch.distributed`` initialised, rank 0 makes
    one and shares it through the c10d store (other ranks wait up to 10 s);
    otherwise a new one is made locally.
    """
    if explicit:
        return explicit
    found = _env_job_id()
    if found:
        return found
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            if dist.get_rank() == 0:
                job_id = new_job_id()
                store.set(_STORE_KEY, job_id)
                return job_id
            store.wait([_STORE_KEY], timedelta(seconds=10))
            return bytes(store.get(_STORE_KEY)).decode()
        except Exception as exc:
            log.warning("argus: could not agree on a job id through the c10d store (%s)", exc)
    return new_job_id()


def rank_info(dist: Any = None) -> tuple[int, int, int] | None:
    """``(rank, local_rank, world_size)`` from torch.distributed or torchrun's env; None if unknown."""
    env = os.environ
    local = int(env.get("LOCAL_RANK", "0") or 0)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), local, dist.get_world_size()
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), local, int(env["WORLD_SIZE"])
    return None


def command_line() -> str:
    """The job's command: ``$ARGUS_COMMAND`` (set by ``argus run``) or this process's argv."""
    return os.environ.get(config.ENV_COMMAND) or " ".join([sys.executable, *sys.argv])


def hostname() -> str:
    return socket.gethostname()


def identify(
    explicit_job_id: str | None,
    *,
    pid: int,
    device: str,
    attach_ns: int,
    steps_done: int,
    final: bool = False,
    dist: Any = None,
) -> Identity | None:
    """This process's identity as a rank, or None while it cannot be known yet.

    A process in ``torch.distributed`` (or under torchrun) is its rank; one that is not
    becomes rank 0 of a world of 1 once it has done a step, or at exit (``final``): a
    single-process job. Until then, None (distributed may still be initialised).
    """
    info = rank_info(dist)
    if info is None:
        if not final and steps_done < 1:
            return None
        info = (0, 0, 1)
    rank, local_rank, world_size = info
    return Identity(
        job_id=resolve_job_id(explicit_job_id, dist),
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        host=hostname(),
        pid=pid,
        device=device,
        command=command_line(),
        attach_ns=attach_ns,
    )
