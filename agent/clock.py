"""Clock offset between a node and its collector, NTP-style (RFC 5905's offset estimate).

For one round trip with the agent's send time ``t0``, the collector's time ``ts``
and the agent's receive time ``t1``, the offset is ``ts - (t0 + t1) / 2`` with
error at most half the round trip. Of a few round trips the one with the
shortest round trip wins. The agent *adds* the offset to every timestamp it
forwards, so all nodes share the collector's clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ClockEstimate", "estimate_offset"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClockEstimate:
    """One estimate: offset to add (ns), its round trip (ns) and when it was made."""

    offset_ns: int
    rtt_ns: int
    at_ns: int


def estimate_offset(
    ask: Callable[[int], int], samples: int = 8, now: Callable[[], int] = time.time_ns
) -> ClockEstimate:
    """Estimate the offset from ``samples`` round trips of ``ask``.

    Args:
        ask: Sends the agent's time and returns the collector's time, ns since the epoch.
        samples: Round trips to make; the shortest wins.
        now: The agent's clock.

    Raises:
        Exception: whatever ``ask`` raises (the caller keeps its previous estimate).
    """
    best: ClockEstimate | None = None
    for _ in range(samples):
        t0 = now()
        server = ask(t0)
        t1 = now()
        est = ClockEstimate(server - (t0 + t1) // 2, t1 - t0, t1)
        if best is None or est.rtt_ns < best.rtt_ns:
            best = est
    assert best is not None
    return best
