"""The torch hooks of the probe on real modules and optimizers (no process group)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as module_globals

from argus.agent.buffers import RowBuffer
from argus.agent.steps import BACKWARD, FORWARD, OPTIMIZER, StepTracker
from argus.agent.torch_hooks import TorchHooks


def _installed(phases: RowBuffer | None = None) -> tuple[TorchHooks, nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    hooks = TorchHooks(
        StepTracker(RowBuffer(100), phases if phases is not None else RowBuffer(100), attach_ns=0),
        lambda: True,
    )
    hooks.install()
    return hooks, model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_forward_discovery_ends_when_the_model_runs_inside_the_optimizer_closure() -> None:
    """Lightning's automatic optimisation calls ``optimizer.step(closure)`` and runs forward and
    backward in the closure: the global module hooks must still go after the first step, leaving
    hooks on the top-level module only (they cost every submodule call while they stay)."""
    hooks, model, opt = _installed()
    try:
        x = torch.randn(4, 8)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        assert not hooks._global_handles
        assert not module_globals._global_forward_pre_hooks
        assert not module_globals._global_forward_hooks
        assert model in hooks._hooked
        assert not any(sub in hooks._hooked for sub in model)
    finally:
        hooks.uninstall()


def test_forward_discovery_ends_after_the_first_step_of_a_plain_loop() -> None:
    hooks, model, opt = _installed()
    try:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        assert not hooks._global_handles
        assert model in hooks._hooked
        assert not any(sub in hooks._hooked for sub in model)
    finally:
        hooks.uninstall()


def test_the_closure_of_an_optimizer_step_gives_forward_and_backward_rows() -> None:
    """Lightning's step, ``optimizer.step(closure)``: after discovery as before it, each step has
    a forward and a backward row (the end of backward is where a DDP rank waits for its
    gradients), not one optimizer row for the whole step."""
    phases = RowBuffer(100)
    hooks, model, opt = _installed(phases)
    try:
        x = torch.randn(4, 8)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        hooks._tracker.finish()
        codes = [(row[0], row[1]) for row in phases.take()]
        for step in range(3):
            assert [c for s, c in codes if s == step] == [OPTIMIZER, FORWARD, OPTIMIZER, BACKWARD, OPTIMIZER]
    finally:
        hooks.uninstall()
