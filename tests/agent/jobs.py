"""Helpers for tests that run real multi-process training jobs under `argus run`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from argus.schema import wire_schema

DDP_JOB = str(Path(__file__).with_name("ddp_job.py"))


@contextmanager
def short_dir() -> Iterator[Path]:
    """A short temporary folder (unix socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="argus-t-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def job_env(work: Path, **extra: str) -> dict[str, str]:
    """Environment of a job: its own state folder (spool) and agent log under ``work``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGUS_", "TORCHELASTIC_"))}
    env.update(XDG_STATE_HOME=str(work / "state"), ARGUS_AGENT_LOG=str(work / "agent.log"), **extra)
    return env


def torchrun(nproc: int, *job_args: str) -> list[str]:
    """The torchrun command of the test DDP job."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        DDP_JOB,
        *job_args,
    ]


def argus_run(
    work: Path, collector: str, job_id: str, command: list[str], window_s: float = 1.0
) -> list[str]:
    """`argus run` of ``command`` with a node agent on a socket under ``work``."""
    return [
        sys.executable,
        "-m",
        "argus.cli",
        "run",
        "--collector",
        collector,
        "--socket",
        str(work / "agent.sock"),
        "--window-s",
        str(window_s),
        "--job-id",
        job_id,
        "--",
        *command,
    ]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def read_tables(store_url: str, job_id: str, tables: list[str]) -> dict[str, pa.Table]:
    """Rows of ``tables`` for ``job_id`` from a stopped server's store."""
    from argus.store import open_store

    store = open_store(store_url, create=False)
    try:
        out = {}
        for table in tables:
            names = ", ".join(f"`{n}`" for n in wire_schema(table).names)
            got = store.query(f"SELECT {names} FROM {table} WHERE job_id = {{job:String}}", {"job": job_id})
            out[table] = got.cast(wire_schema(table))
        return out
    finally:
        store.close()
