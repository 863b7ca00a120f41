from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from argus.analyzer.causes import SPIKY_SHARE, _spiky_share


def _share(excess: list[float]) -> float:
    l2: Any = SimpleNamespace(excess_matrix=np.array([excess], dtype=np.float64))
    return _spiky_share(l2, 0)


@pytest.mark.parametrize("onset", [0, 10, 25, 33])
def test_a_steady_slowdown_that_begins_mid_window_is_not_spiky(onset: int) -> None:
    rng = np.random.default_rng(onset)
    excess = np.where(np.arange(37) >= onset, 40.0 + rng.normal(0, 8, 37), rng.normal(0, 1, 37))
    assert _share(excess.tolist()) < SPIKY_SHARE


@pytest.mark.parametrize("onset", [0, 13, 26])
def test_a_pause_every_few_steps_is_spiky_wherever_it_begins(onset: int) -> None:
    excess = [150.0 if i >= onset and i % 4 == 0 else 0.5 for i in range(37)]
    assert _share(excess) > SPIKY_SHARE


def test_no_excess_has_no_share() -> None:
    assert np.isnan(_share([0.0, -1.0, float("nan")]))
