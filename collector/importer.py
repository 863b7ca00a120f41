"""Import of PyTorch profiler (Kineto) traces — stub. Owned by issue 7, which replaces this module."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from argus.collector.store import Store

from argus.config import DEFAULT_WINDOW_S
from argus.errors import NotBuiltYet

__all__ = ["ImportResult", "import_traces", "main"]


@dataclass(frozen=True)
class ImportResult:
    """What one import wrote: the job, its ranks, and rows per table."""

    job_id: str
    ranks: list[int]
    rows: dict[str, int] = field(default_factory=dict)


def import_traces(
    store: Store,
    sources: Sequence[Path | BinaryIO],
    *,
    job_id: str | None = None,
    rank: int | None = None,
    window_s: float = DEFAULT_WINDOW_S,
) -> ImportResult:
    """Import Kineto traces (one per rank, plain or gzipped JSON) into ``store``.

    Raises:
        TraceError: a file cannot be imported (the message names file and position);
            nothing of that import is written.
    """
    raise NotBuiltYet("trace import is not built yet")


def main(args: argparse.Namespace) -> int:
    raise NotBuiltYet("argus import is not built yet")
