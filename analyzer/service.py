"""The analyzer as a service — stub. Owned by issue 4, which replaces this module.

`argus server` runs :class:`Analyzer` in a thread; `argus analyze` runs it alone.
"""

from __future__ import annotations

import argparse
import threading

from argus.collector.metrics import Metrics
from argus.collector.store import Store

from argus.diagnosis import Diagnosis
from argus.errors import NotBuiltYet

__all__ = ["Analyzer", "main"]


class Analyzer:
    """Windowed, incremental analysis of every job in ``store``.

    Args:
        store: Where timings are read and diagnoses written.
        window_s: Analysis window, seconds.
        metrics: Gauges to update (straggler scores, active diagnoses, lag).
    """

    def __init__(self, store: Store, *, window_s: float, metrics: Metrics | None = None) -> None:
        self.store = store
        self.window_s = window_s
        self.metrics = metrics
        self._stop = threading.Event()

    def run_once(self, now_ns: int | None = None) -> list[Diagnosis]:
        """Analyze every complete window not analyzed yet; return the diagnoses written."""
        return []

    def run_forever(self) -> None:
        """Call :meth:`run_once` every window until :meth:`stop`."""
        while not self._stop.wait(self.window_s):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()


def main(args: argparse.Namespace) -> int:
    raise NotBuiltYet("argus analyze is not built yet")
