"""Argus code run on training's own threads (hooks, wrapped functions) never raises into training.

:func:`guarded` wraps a hook once, where it is installed; :func:`call` runs one
Argus call inside a wrapper of a training function (a collective, a bucket).
Either way an exception inside Argus is logged (a warning with the traceback the
first time per function, then at debug level), counted in :data:`errors`, and
replaced by a default value; training goes on, and what that call would have
recorded is lost.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call", "errors", "guarded"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Exceptions raised inside Argus hooks and swallowed, per function name (monotonic).
errors: dict[str, int] = {}
_lock = threading.Lock()


def _report(fn: Callable[..., Any]) -> None:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    with _lock:
        first = name not in errors
        errors[name] = errors.get(name, 0) + 1
    if first:
        log.warning("argus: %s raised; training goes on without what it records", name, exc_info=True)
    else:
        log.debug("argus: %s raised again", name, exc_info=True)


def call(fn: Callable[..., T], *args: Any, default: T) -> T:
    """``fn(*args)``, or ``default`` when it raises (logged and counted)."""
    try:
        return fn(*args)
    except Exception:
        _report(fn)
        return default


def guarded(fn: Callable[..., Any], default: Any = None) -> Callable[..., Any]:
    """``fn`` that returns ``default`` instead of raising (logged and counted); for hooks."""

    @functools.wraps(fn)
    def hook(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            _report(fn)
            return default

    return hook
