"""Automatic attach for processes started under `argus run` (no change to the training script).

``argus run`` puts :mod:`argus.agent._bootstrap` on ``PYTHONPATH``; its
``sitecustomize`` calls :func:`install` in every Python process of the job
(torchrun's launcher, each rank, DataLoader workers). :func:`install` imports
nothing heavy: it adds an import hook that acts only if the process imports
``torch.distributed`` or ``torch.optim``:

- right after ``torch.distributed.distributed_c10d`` executes, its
  ``init_process_group`` is wrapped so that the probe attaches when it returns
  (rank, world size and the store are known then);
- right after ``torch.optim.optimizer`` executes, the first optimizer step
  attaches the probe of a single-process job that never calls
  ``init_process_group`` (through :mod:`argus.agent.opt_hooks`, whose hooks
  may change targets while PyTorch iterates them).

A launcher that never does either (torchrun itself, a data worker) never attaches.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["install"]

log = logging.getLogger(__name__)

_C10D = "torch.distributed.distributed_c10d"
_OPTIM = "torch.optim.optimizer"


def _attach() -> None:
    try:
        import argus.agent

        argus.agent.attach()
    except Exception:  # never harm the job
        log.warning("argus: automatic attach failed", exc_info=True)


def _patch_c10d(module: ModuleType) -> None:
    orig = module.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        _attach()
        return out

    init_process_group.__doc__ = orig.__doc__
    init_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(module, "init_process_group", init_process_group)  # noqa: B010


def _patch_optim(_module: ModuleType) -> None:
    from argus.agent import opt_hooks

    def first_step(*_args: Any) -> None:
        opt_hooks.set_targets(None, None)
        _attach()

    opt_hooks.ensure_installed()
    opt_hooks.set_targets(first_step, None)


_PATCHES: dict[str, Callable[[ModuleType], None]] = {_C10D: _patch_c10d, _OPTIM: _patch_optim}


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then patches the module."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except Exception:
            log.warning("argus: could not prepare %s for automatic attach", module.__name__, exc_info=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the watched modules through the other finders and wraps their loaders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """Add the import hook (idempotent); patch modules already imported."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
