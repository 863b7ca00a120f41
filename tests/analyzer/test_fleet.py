"""The simulated fleet of bench/scale.py (synthetic/fleet.py) stamps its events as a probe does: a
synchronous call that the next event follows at once blocked its rank, on every rank of 10,000."""

from __future__ import annotations

import numpy as np

from argus.analyzer.collectives import decompose
from argus.analyzer.store_io import Liveness, read_liveness, read_window
from argus.analyzer.waits import blocking_rows
from argus.store import open_store
from tests.analyzer.test_store_layout import JOB, WINDOW_NS, _fill


def test_every_all_reduce_of_the_fleet_blocks_its_rank(tmp_path):
    """Each all-reduce of the fleet is synchronous (the rank does nothing until it ends), so every
    row blocks. Rounding a duration apart from its start put a row's end a nanosecond past the
    rank's next event on about half the rows; one such rank made a whole instance asynchronous
    (on 10,000 ranks, 8 of a window's 19 job-wide all-reduces): the waits for a straggler became
    every rank's own time, and the straggler was charged a fraction of them."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        t0, _ = _fill(store, agents=16, windows=2)
        w0 = t0 + WINDOW_NS
        live = Liveness().merge(read_liveness(store, JOB, t0, w0 + WINDOW_NS))
        w = read_window(store, JOB, w0, w0 + WINDOW_NS, live)
    finally:
        store.close()
    c = w.collectives
    d = decompose(c, group_sizes={name: int(m.size) for name, m in w.status.groups.items()})
    blocking = blocking_rows(w, np.unique(c.rank), d.instance)
    whole = np.isin(c.step, np.unique(w.phases.step))  # steps whose phases the window holds
    assert whole.sum() > 1000
    assert bool(np.all(blocking[whole]))
