"""Torch hooks that feed the :class:`~argus.agent.steps.StepTracker`.

- ``optimizer``: PyTorch's global optimizer step pre/post hooks (through
  :mod:`argus.agent.opt_hooks`); the post hook ends the step.
- ``backward``: ``torch.autograd.backward`` wrapped (``Tensor.backward`` calls it).
- ``data``: ``__next__`` of the DataLoader iterator base class wrapped (the
  single- and multi-process iterators inherit it).
- ``forward``: the *outermost* module forward only. A Python hook on every
  submodule would cost microseconds per module per step, so global module
  hooks run only until the first step ends, to find the modules called at the
  top level (the DDP model, a loss module); then those modules get
  per-instance hooks (at most :data:`MAX_TOP_MODULES`) and the global hooks are
  removed. A top-level module is one called while no other module call is in progress,
  whatever phase is open (Lightning calls its model inside ``optimizer.step()``'s closure).

Every hook is wrapped (:mod:`argus.agent.guard`) so an error inside Argus never reaches training.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from argus.agent import opt_hooks
from argus.agent.guard import guarded
from argus.agent.steps import BACKWARD, DATA, FORWARD, OPTIMIZER, StepTracker

__all__ = ["MAX_TOP_MODULES", "TorchHooks"]

log = logging.getLogger(__name__)

#: Top-level modules given per-instance forward hooks after discovery.
MAX_TOP_MODULES = 8
#: Discovery also ends after this many top-level forwards (a loop that never ends a step).
MAX_DISCOVERY_FORWARDS = 64


class TorchHooks:
    """Installs and removes the phase hooks of one probe.

    Args:
        tracker: Receives phase begin/end events.
        active: Returns False when recording must stop (after fork, after detach).
    """

    def __init__(self, tracker: StepTracker, active: Callable[[], bool]) -> None:
        self._tracker = tracker
        self._active = active
        self._handles: list[Any] = []
        self._global_handles: list[Any] = []
        self._top: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._hooked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._discovery_step = 0
        self._orig_backward: Callable[..., Any] | None = None
        self._orig_next: Callable[..., Any] | None = None

    def install(self) -> None:
        """Install every hook (once)."""
        tracker, active, now = self._tracker, self._active, time.time_ns

        def opt_pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if active():
                tracker.begin(OPTIMIZER, now())

        def opt_post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if active():
                tracker.end(OPTIMIZER, now())

        opt_hooks.ensure_installed()
        opt_hooks.set_targets(guarded(opt_pre), guarded(opt_post))
        self._wrap_backward()
        self._wrap_dataloader()
        self._start_discovery()

    def uninstall(self) -> None:
        """Remove hooks and restore wrapped functions."""
        opt_hooks.set_targets(None, None)
        for h in self._handles + self._global_handles:
            h.remove()
        self._handles, self._global_handles = [], []
        if self._orig_backward is not None:
            torch.autograd.backward = self._orig_backward
            self._orig_backward = None
        if self._orig_next is not None:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            _BaseDataLoaderIter.__next__ = self._orig_next  # type: ignore[method-assign]
            self._orig_next = None

    # --- backward and data ----------------------------------------------------------------------

    def _guarded_calls(
        self,
    ) -> tuple[Callable[..., Any], Callable[..., Any], Callable[[], bool], Callable[[], int]]:
        """``begin``, ``end``, ``active``, ``now`` for a wrapper of a training function: never raising."""
        tracker = self._tracker
        return guarded(tracker.begin, False), guarded(tracker.end), guarded(self._active, False), time.time_ns

    def _wrap_backward(self) -> None:
        orig = torch.autograd.backward
        begin, end, active, now = self._guarded_calls()

        def backward(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return orig(*args, **kwargs)
            opened = begin(BACKWARD, now())
            try:
                return orig(*args, **kwargs)
            finally:
                if opened:
                    end(BACKWARD, now())
                else:
                    end(-1, 0)

        backward.__doc__ = orig.__doc__
        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        self._orig_backward = orig
        torch.autograd.backward = backward

    def _wrap_dataloader(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        orig = _BaseDataLoaderIter.__next__
        begin, end, active, now = self._guarded_calls()

        def __next__(self: Any) -> Any:  # noqa: N807  (replaces the method of that name)
            if not active():
                return orig(self)
            opened = begin(DATA, now())
            try:
                return orig(self)
            finally:
                if opened:
                    end(DATA, now())
                else:
                    end(-1, 0)

        self._orig_next = orig
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]

    # --- forward ---------------------------------------------------------------------------------

    def _start_discovery(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        tracker, active, now, top = self._tracker, self._active, time.time_ns, self._top
        self._discovery_step = tracker.step
        # id(module) -> (its forward phase was opened, it is a top-level call)
        calls: dict[int, tuple[bool, bool]] = {}
        # Module calls in progress; top-level is a call made while none is, whatever phase is open:
        # Lightning runs forward and backward in the optimizer's closure (inside optimizer.step()),
        # where no forward phase opens, and discovery must still end there.
        depth = [0]
        forwards = [0]

        def pre(module: torch.nn.Module, _inputs: Any) -> None:
            if not active():
                return
            top_level = depth[0] == 0
            depth[0] += 1
            opened = tracker.begin(FORWARD, now())
            calls[id(module)] = (opened, top_level)
            if top_level and len(top) < MAX_TOP_MODULES:
                top.add(module)

        def post(module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
            if not active():
                return
            call = calls.pop(id(module), None)
            if call is None:
                return
            depth[0] = max(depth[0] - 1, 0)
            opened, top_level = call
            if opened:
                tracker.end(FORWARD, now())
            else:
                tracker.end(-1, 0)
            if top_level:
                forwards[0] += 1
                done = tracker.event_step() > self._discovery_step or forwards[0] >= MAX_DISCOVERY_FORWARDS
                if done and top:
                    self._finish_discovery()

        self._global_handles = [
            register_module_forward_pre_hook(guarded(pre)),
            register_module_forward_hook(guarded(post), always_call=True),
        ]

    def _finish_discovery(self) -> None:
        for h in self._global_handles:
            h.remove()
        self._global_handles = []
        for module in list(self._top):
            self._hook_module(module)
        log.debug("argus: forward hooks on %d top-level module(s)", len(self._hooked))

    def _hook_module(self, module: torch.nn.Module) -> None:
        if module in self._hooked:
            return
        tracker, active, now = self._tracker, self._active, time.time_ns
        opened = [False]

        def pre(_module: torch.nn.Module, _inputs: Any) -> None:
            if active():
                opened.append(tracker.begin(FORWARD, now()))

        def post(_module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
            if active() and len(opened) > 1:
                if opened.pop():
                    tracker.end(FORWARD, now())
                else:
                    tracker.end(-1, 0)

        self._handles += [
            module.register_forward_pre_hook(guarded(pre)),
            module.register_forward_hook(guarded(post), always_call=True),
        ]
        self._hooked.add(module)
