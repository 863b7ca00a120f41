"""Issue 39 item 14: `argus diagnose` and `argus jobs` print no terminal control sequence a job's
processes put in the store (host names, kernel names, frames), over real HTTP against a live API.

Every store value a terminal shows goes through :func:`argus.render.printable`; the ``--json``
output keeps the values as stored (JSON escapes the control characters).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from argus.render import printable
from argus.store import Store
from synthetic.wire import diagnosis_row, insert_direct, synthetic_job
from tests.collector.api.conftest import LiveApp

#: A window title (OSC), a clear screen and cursor home (CSI), a hyperlink (OSC 8), a bell, an
#: 8-bit CSI, a carriage return that would overwrite the line.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x07\x9b31m\rX"


def test_printable_removes_every_sequence_and_keeps_the_text() -> None:
    assert printable(HOSTILE) == "link X"
    assert printable("node-1 ampere_sgemm_128x64 (train.py:25)") == "node-1 ampere_sgemm_128x64 (train.py:25)"
    assert printable("a\tb\nc") == "a b c"
    assert printable("\x1b[31;1mred\x1b[0m µs 5 %") == "red µs 5 %"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_diagnose_and_jobs_print_no_control_sequence(store: Store, live_app: LiveApp) -> None:
    now = time.time_ns()
    job = "job-hostile"
    insert_direct(store, job, synthetic_job(world_size=4, steps=4, host_prefix=f"node{HOSTILE}"))
    frame = {"function": f"stall{HOSTILE}", "file": f"train{HOSTILE}.py", "line": 25}
    evidence = {
        "lost_s": 3.0,
        "top_frames": [{**frame, "share": 0.7, "peer_share": 0.0}],
        "stacks": {"rank": 2, "peer": 1, "sampler": "py-spy", "capture_id": "c1"},
    }
    store.insert(
        "diagnoses",
        diagnosis_row(
            job,
            "d-hostile",
            state="open",
            updated_ns=now,
            first_ns=now - 10**10,
            kernel=f"sgemm{HOSTILE}",
            evidence=json.dumps(evidence),
        ),
    )
    diagnose = _cli("diagnose", "--job", job, "--server", live_app.url)
    jobs = _cli("jobs", "--server", live_app.url)
    for done in (diagnose, jobs):
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in "\x1b\x07\x9b\r"), repr(done.stdout)
    # What the sequences surrounded is still there: the host, the kernel, the frame.
    assert "node" in diagnose.stdout and "sgemm" in diagnose.stdout and "stall" in diagnose.stdout
    assert "train" in diagnose.stdout.partition("top frames")[2]
    assert job in jobs.stdout
    # --json keeps the stored values (escaped by JSON).
    raw = _cli("diagnose", "--job", job, "--server", live_app.url, "--json")
    assert json.loads(raw.stdout)[0]["kernel"] == f"sgemm{HOSTILE}"
