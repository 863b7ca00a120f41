"""A node's processes on a shifted or stepped wall clock: Debian's libfaketime, preloaded.

``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps durations true. A fixed offset is ``FAKETIME``
(e.g. ``+3``); a clock that is to step reads its offset from a file
(``FAKETIME_TIMESTAMP_FILE``) on every clock read (``FAKETIME_NO_CACHE=1``, a few µs a
read), so writing a new offset into it steps the clock of every process of the node at once.
libfaketime 0.9.10 rewrites absolute monotonic deadlines as if they were faked times, which
breaks Python 3.11's ``time.sleep`` and turns CPython's GIL wait into a spin (a rank under it
burnt extra CPU and was named a straggler); the small shim ``faketime_fix.c``, compiled here
with the system C compiler and preloaded first, routes monotonic sleeps and condition-variable
waits around it (:mod:`tests.cluster.test_faketime`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.cluster.harness import require

#: The thread-safe build: the agent, torchrun and the ranks are multi-threaded, and the plain
#: build's cached offset, read by many threads at once, now and then gave a thread the real time
#: (a step of -3 s and back within 20 ms in a node 3 s ahead, seen on a loaded machine).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
_FIX = Path(__file__).with_name("faketime_fix.c")


def faketime_env(work: Path, offset: str, *, steppable: bool = False) -> tuple[dict[str, str], Path]:
    """Environment running a process at wall-clock ``offset`` (libfaketime syntax, e.g. ``+3``).

    Returns the environment and the offset file; with ``steppable``, write a new offset into
    that file to step the clock (without it the file is not read).
    Skips (fails under ``ARGUS_REQUIRE_NETNS=1``) when libfaketime or a C compiler is missing.
    """
    lib = LIBFAKETIME if LIBFAKETIME.exists() else None
    if lib is None:
        found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
        lib = found[0] if found else None
    require(None if lib is not None else "libfaketime is not installed (Debian package faketime)")
    cc = shutil.which("cc") or shutil.which("gcc")
    require(None if cc is not None else "no C compiler for the libfaketime sleep fix")
    assert lib is not None and cc is not None
    work.mkdir(parents=True, exist_ok=True)
    fix = work / "faketime_fix.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(fix), str(_FIX), "-ldl"], check=True)
    spec = work / "faketime"
    spec.write_text(offset + "\n")
    env = {"LD_PRELOAD": f"{fix} {lib}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    if steppable:
        env |= {"FAKETIME_TIMESTAMP_FILE": str(spec), "FAKETIME_NO_CACHE": "1"}
    else:
        env["FAKETIME"] = offset
    return env, spec
