"""Server threads named to the kernel too, so that ``top -H``, ``ps -L``, py-spy and
``bench/scale.py``'s CPU by thread tell them apart.

Python before 3.14 names a ``threading.Thread`` in Python only: the kernel calls every thread of
the process ``python`` (``/proc/PID/task/TID/comm``). :func:`start_daemon` sets the kernel's name
as the thread starts (``prctl(PR_SET_NAME)``, Linux; elsewhere the Python name alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading
from collections.abc import Callable

__all__ = ["start_daemon"]

#: ``prctl`` option that names the calling thread (linux/prctl.h).
_PR_SET_NAME = 15
#: The kernel keeps 15 bytes of a thread's name (16 with the terminating NUL).
_NAME_BYTES = 15


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The process's C library, loaded once (None off Linux or when it cannot be loaded)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` (cut to 15 bytes) in the kernel; nothing off Linux or
    when libc refuses."""
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):
            libc.prctl(_PR_SET_NAME, name.encode()[:_NAME_BYTES], 0, 0, 0)


def start_daemon(target: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread running ``target``, named ``name`` in Python and in the kernel.

    Returns:
        The started thread.
    """

    def run() -> None:
        _name_this_thread(name)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
