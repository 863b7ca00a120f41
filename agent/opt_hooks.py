"""Two global optimizer step hooks registered once per process, forwarding to swappable targets.

PyTorch iterates its global optimizer hook dicts while it calls them, so a hook
that registers or removes a hook during ``optimizer.step()`` breaks the step
("OrderedDict mutated during iteration"). Argus therefore registers one pre and
one post hook once (:func:`ensure_installed`) and only ever swaps the functions
they forward to (:func:`set_targets`), which is safe at any time, including
when the automatic attach happens inside the first optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Hook", "ensure_installed", "set_targets"]

Hook = Callable[[Any, Any, Any], None]

_targets: list[Hook | None] = [None, None]
_installed: list[bool] = [False]


def _pre(opt: Any, args: Any, kwargs: Any) -> None:
    target = _targets[0]
    if target is not None:
        target(opt, args, kwargs)


def _post(opt: Any, args: Any, kwargs: Any) -> None:
    target = _targets[1]
    if target is not None:
        target(opt, args, kwargs)


def ensure_installed() -> None:
    """Register the two forwarding hooks with PyTorch (once per process)."""
    if _installed[0]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_pre)
    register_optimizer_step_post_hook(_post)
    _installed[0] = True


def set_targets(pre: Hook | None, post: Hook | None) -> None:
    """Forward optimizer pre/post step events to ``pre``/``post`` (None: ignore them)."""
    _targets[0], _targets[1] = pre, post
