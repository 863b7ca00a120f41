"""The one window rule (argus.window_grid): seconds to ns, validation, time to window."""

from __future__ import annotations

import numpy as np
import pytest

from argus.errors import ConfigError
from argus.window_grid import WindowGrid

#: 2026-12-06 in ns: at late-2026 timestamps a 1 ns error in the length moves window starts by seconds.
LATE_2026_NS = 1_796_515_200_000_000_000


def test_seconds_round_to_the_nearest_ns_as_written() -> None:
    assert WindowGrid.from_seconds(4.1).length_ns == 4_100_000_000  # int(4.1 * 1e9) is 4_099_999_999
    assert WindowGrid.from_seconds("4.1") == WindowGrid.from_seconds(4.1)
    assert WindowGrid.from_seconds(0.3).length_ns == 300_000_000
    assert WindowGrid.from_seconds(10).length_ns == 10_000_000_000
    assert WindowGrid.from_seconds(1e-9).length_ns == 1


@pytest.mark.parametrize("bad", [0.0, -1.0, 4e-10, float("nan"), float("inf"), "x"])
def test_a_bad_length_is_a_config_error_naming_the_flag(bad: float | str) -> None:
    with pytest.raises(ConfigError, match="--window-s"):
        WindowGrid.from_seconds(bad)
    with pytest.raises(ConfigError):
        WindowGrid(0)


@pytest.mark.parametrize("seconds", ["4.1", "0.25", "10", "2.000000001"])
def test_the_flag_value_gives_back_the_same_grid(seconds: str) -> None:
    grid = WindowGrid.from_seconds(seconds)
    assert WindowGrid.from_seconds(grid.flag_value()) == grid
    assert grid.flag_value() == seconds


def test_a_time_maps_to_its_window() -> None:
    grid = WindowGrid.from_seconds(4.1)
    t = LATE_2026_NS + 123
    start, end = grid.bounds_ns(t)
    assert start % 4_100_000_000 == 0 and start <= t < end == start + 4_100_000_000
    times = np.array([t, start, end, end - 1], np.int64)
    assert grid.starts_ns(times).tolist() == [start, start, end, start]
    # The truncating rule the node agent had: its windows started elsewhere (up to 4.1 s away).
    assert t // 4_099_999_999 * 4_099_999_999 != start
