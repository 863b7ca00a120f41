"""Issue 42 item 5: `argus demo` shows its progress, and ends cleanly when interrupted.

A real `argus demo` (server, agent and a 4-rank job) with its temporary files in a folder of the
test's own (``TMPDIR``): while the job trains, stderr (not a terminal) gets a line per analysed
window with the steps seen; SIGINT then (what Ctrl-C sends) ends it with status 130 and says it
was interrupted, not that it failed; it leaves no ``argus-demo-*`` folder, no ``torchelastic_*``
folder and no process behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in words:
            found.append(words)
    return found


def test_an_interrupted_demo_says_so_and_leaves_nothing_behind(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    err = tmp_path / "stderr.txt"
    env = {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"}
    with err.open("wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "argus.cli", "demo", "--scenario", "compute"],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=env,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 240
            while not re.search(r"[1-9]\d* window\(s\) analysed, [1-9]\d* steps seen", err.read_text()):
                assert demo.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
                time.sleep(0.5)
            assert list(tmp.glob("argus-demo-*")), "the demo's folder is where the test looks"
            os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground group
            status = demo.wait(timeout=120)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
    said = err.read_text()
    assert status == 130, said[-3000:]
    assert "interrupted" in said and "failed" not in said, said[-3000:]
    assert not list(tmp.glob("argus-demo-*")) and not list(tmp.glob("torchelastic_*")), list(tmp.iterdir())
    assert not _processes_mentioning(str(tmp)), _processes_mentioning(str(tmp))
