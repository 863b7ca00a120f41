"""Step aside while the user's own ``torch.profiler`` traces the GPU.

CUPTI has one activity subscriber per process. When a user starts
``torch.profiler.profile`` (or ``torch.autograd.profiler.profile``) with CUDA
activities while the probe holds CUPTI, Kineto would find the slot taken. So
the probe wraps the profiler's ``_prepare_trace`` (the first thing both entry
points do) to release CUPTI first, and its ``__exit__`` to take it back after
the user's trace is complete. Kernels run while the user profiles are not in
Argus's kernel summaries; steps, phases and collectives are unaffected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install", "wants_gpu"]

log = logging.getLogger(__name__)


def wants_gpu(prof: Any) -> bool:
    """True when a profiler instance asks for CUDA activity (so it needs CUPTI)."""
    from torch.profiler import ProfilerActivity

    return ProfilerActivity.CUDA in (getattr(prof, "kineto_activities", None) or ())


def _switch(action: Callable[[], None], done: str, failed: str) -> None:
    """Run ``action`` (release or resume CUPTI), logging ``done``; a failure is logged, never raised:
    the user's profiler goes on either way."""
    try:
        action()
        log.info("argus: torch.profiler %s", done)
    except Exception:
        log.warning("argus: could not %s", failed, exc_info=True)


def install(
    release: Callable[[], None], resume: Callable[[], None], needs: Callable[[Any], bool] = wants_gpu
) -> None:
    """Call ``release`` before a CUPTI-using profiler starts and ``resume`` after the last one stops.

    Args:
        release: Gives up CUPTI (flush, disable, unsubscribe).
        resume: Takes CUPTI back.
        needs: Whether a profiler instance uses CUPTI.
    """
    import torch.autograd.profiler as autograd_profiler

    cls = autograd_profiler.profile
    orig_prepare: Callable[..., Any] = cls._prepare_trace
    orig_exit: Callable[..., Any] = cls.__exit__
    lock = threading.Lock()
    active: set[int] = set()

    def _prepare_trace(self: Any) -> Any:
        if needs(self):
            with lock:
                first = not active
                active.add(id(self))
            if first:
                _switch(release, "started: GPU kernel capture paused", "release CUPTI for torch.profiler")
        return orig_prepare(self)

    def __exit__(self: Any, *exc: Any) -> Any:  # noqa: N807  (replaces the method of that name)
        try:
            return orig_exit(self, *exc)
        finally:
            with lock:
                was = id(self) in active
                active.discard(id(self))
                last = was and not active
            if last:
                _switch(resume, "stopped: GPU kernel capture resumed", "take CUPTI back after torch.profiler")

    cls._prepare_trace = _prepare_trace  # type: ignore[method-assign]
    cls.__exit__ = __exit__  # type: ignore[method-assign]
