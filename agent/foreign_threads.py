"""Keep the Python thread state of a C++ thread that runs the probe's callbacks (gloo's workers).

A collective's completion callback (a DDP bucket's ``then``, a wrapped collective's done-callback)
runs on the thread that completes the work: on CPU, one of gloo's worker threads, which CPython
does not know. PyTorch enters Python there through pybind11's ``gil_scoped_acquire``, which,
finding no thread state, creates one and deletes it again when the callback returns. A fresh
thread state costs more than the callback: its first Python frame maps a new 16 KiB frame stack
(``mmap``), its deletion unmaps it (``munmap``: on a multi-threaded process, a TLB shootdown of
the other cores), and everything the interpreter touches is cold. Measured on the demo job
(4 CPU ranks, one bucket a step, ``bench/overhead.py``'s worker in-process): one ``mmap`` and one
``munmap`` per bucket, and 60-80 µs of CPU per step on gloo's threads that a kept state saves.

:func:`adopt` keeps it: called from inside such a callback, it takes one more reference on the
thread state pybind11 made (``PyGILState_Ensure``, never released), so pybind11's release no
longer deletes it and every later callback on that thread reuses it. Once per thread; on the main
thread (a work that completed before its callback was attached) it does nothing; on another thread
Python started it only counts one more use of a state that lives as long as its thread; where the
C API is not what it expects it does nothing either: the callbacks then cost what they cost
before, and nothing is recorded differently. A kept state lives until the interpreter exits (a few
hundred bytes and its 16 KiB frame stack per gloo worker thread).
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["adopt"]


class _Adopted(threading.local):
    """Per thread: True once :func:`adopt` kept (or chose to leave) its thread state."""

    done = False


_adopted = _Adopted()
_MAIN_IDENT = threading.main_thread().ident
_api = ctypes.pythonapi
_this_state = _api.PyGILState_GetThisThreadState
_this_state.restype = ctypes.c_void_p
_this_state.argtypes = []
_current_state = _api.PyThreadState_Get
_current_state.restype = ctypes.c_void_p
_current_state.argtypes = []
_ensure = _api.PyGILState_Ensure
_ensure.restype = ctypes.c_int
_ensure.argtypes = []


def adopt() -> None:
    """Keep this thread's Python thread state past the running callback (see the module doc).

    Call it from a callback that C++ code runs on its own thread (the GIL is held). Idempotent
    per thread; never raises.
    """
    if _adopted.done:
        return
    _adopted.done = True  # whatever follows, once per thread
    try:
        if threading.get_ident() != _MAIN_IDENT:
            state = _current_state()
            # PyGILState_Ensure only counts one more use when this thread's GILState entry is the
            # state running now (pybind11's); anything else and it would switch states: leave it.
            if state and _this_state() == state:
                _ensure()
    except Exception:  # never harm the callback: it only costs what it did before
        return
