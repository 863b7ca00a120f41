"""The clock tests' libfaketime set-up (:mod:`tests.cluster.faketime`) shifts the wall clock and
nothing else: sleeps work, and Python threads hand the GIL over as they do without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.faketime import faketime_env

#: Two Python threads spinning for 0.5 s (each wants the GIL the other holds), after a sleep;
#: prints iterations per second and the wall clock's lead over the machine's.
_PROBE = """
import json, threading, time
time.sleep(0.05)
n, stop = [0, 0], []
def spin(i):
    while not stop:
        n[i] += 1
threads = [threading.Thread(target=spin, args=(i,)) for i in (0, 1)]
t0 = time.monotonic()
for t in threads:
    t.start()
time.sleep(0.5)
stop.append(1)
for t in threads:
    t.join()
print(json.dumps({"rate": sum(n) / (time.monotonic() - t0), "wall_s": time.time()}))
"""


def _run(env: dict[str, str]) -> tuple[float, float]:
    """``(iterations per second, lead of its wall clock over ours when it ended, s)``."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        check=False,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    now = time.time()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out["rate"], out["wall_s"] - now


def test_a_steppable_node_clock_leads_by_its_offset_and_threads_share_the_gil_as_usual(
    tmp_path: Path,
) -> None:
    """libfaketime 0.9.10 alone turns CPython's 5 ms GIL wait into a spin (its monotonic deadline
    is rewritten as a faked time): two busy threads ran ~12x slower here and a rank on a node
    under it burnt extra CPU, enough to be named a straggler. The shim sends such waits past it."""
    env, _ = faketime_env(tmp_path, "+3", steppable=True)
    runs = [(_run({}), _run(env)) for _ in range(3)]  # interleaved: the machine is shared
    for plain, faked in runs:
        assert -1 < plain[1] <= 0 and 2 < faked[1] <= 3, runs
    ratios = sorted(faked[0] / plain[0] for plain, faked in runs)
    assert ratios[1] > 0.4, ratios
