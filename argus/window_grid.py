"""The analysis window: one length in integer ns, and how a time maps to its window.

Every part that cuts time into windows (the node agent's kernel summaries, `argus run`, the
trace importer, the REST upload path, the analyzer) takes one :class:`WindowGrid`, built once
from the ``--window-s`` flag by :meth:`WindowGrid.from_seconds`; nothing else turns seconds into
a window length. Windows start at epoch multiples of the length, so two processes with equal
grids cut the same time into the same windows.

Across processes there is no handshake: each row of ``kernel_summaries`` carries the
``window_ns`` it was summarised in, and the analyzer reads only rows of its own length (the
others are counted and logged, never read into a window they do not summarise).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np
from numpy.typing import NDArray

from argus.errors import ConfigError

__all__ = ["NS_PER_S", "WindowGrid"]

#: Nanoseconds in a second.
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class WindowGrid:
    """Epoch-aligned windows of one length.

    Attributes:
        length_ns: Window length, ns (>= 1). Window ``k`` is ``[k * length_ns, (k + 1) * length_ns)``
            in ns since the epoch.

    Raises:
        ConfigError: ``length_ns`` is not an integer >= 1.
    """

    length_ns: int

    def __post_init__(self) -> None:
        if isinstance(self.length_ns, bool) or not isinstance(self.length_ns, int) or self.length_ns < 1:
            raise ConfigError(f"a window must be a whole number of ns >= 1, got {self.length_ns!r}")

    @classmethod
    def from_seconds(cls, window_s: float | str, flag: str = "--window-s") -> WindowGrid:
        """The grid of ``window_s`` seconds: the decimal value as written, rounded to the nearest ns.

        ``4.1`` is 4,100,000,000 ns (not the float's 4,099,999,999.9999995 truncated), and a string
        ``"4.1"`` gives the same grid as the float ``4.1``: the one rounding rule of the project.

        Args:
            window_s: Window length, seconds (finite, > 0, at least 1 ns once rounded).
            flag: The option named in the error message.

        Raises:
            ConfigError: ``window_s`` is not a number, not finite, or rounds to less than 1 ns.
        """
        try:
            seconds = Decimal(repr(window_s) if isinstance(window_s, float) else str(window_s).strip())
        except InvalidOperation:
            raise ConfigError(f"{flag} must be a number of seconds, got {window_s!r}") from None
        if not seconds.is_finite():
            raise ConfigError(f"{flag} must be finite, got {window_s!r}")
        length_ns = int((seconds * NS_PER_S).to_integral_value())
        if length_ns < 1:
            raise ConfigError(f"{flag} must be > 0 (at least 1 ns), got {window_s!r}")
        return cls(length_ns)

    @property
    def seconds(self) -> float:
        """The length in seconds (for waits and display; never converted back into ns)."""
        return self.length_ns / NS_PER_S

    def flag_value(self) -> str:
        """The exact ``--window-s`` value of this grid (``"4.1"``), for a process started with it."""
        text = format(Decimal(self.length_ns) / NS_PER_S, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text

    def start_ns(self, time_ns: int) -> int:
        """Start of the window holding ``time_ns`` (ns since the epoch), ns."""
        return int(time_ns) // self.length_ns * self.length_ns

    def bounds_ns(self, time_ns: int) -> tuple[int, int]:
        """``(start, end)`` of the window holding ``time_ns``, ns; ``end`` is excluded."""
        start = self.start_ns(time_ns)
        return start, start + self.length_ns

    def starts_ns(self, times_ns: NDArray[np.int64]) -> NDArray[np.int64]:
        """:meth:`start_ns` of every element of an int64 array (same shape), ns."""
        return times_ns // self.length_ns * self.length_ns

    def __str__(self) -> str:
        return f"{self.flag_value()} s"
