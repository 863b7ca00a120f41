"""Agent side: the in-process probe (`attach`, `step`) and the node agent that streams to collectors."""

from __future__ import annotations

__all__ = ["attach", "step"]


def attach(*, job_id: str | None = None) -> None:
    """Attach the probe to this training process (one line in a training script).

    Not built yet: the probe lands with issue 3.
    """
    raise NotImplementedError("argus.agent.attach is not built yet")


def step() -> None:
    """Mark a step boundary, for training loops that have no optimizer."""
    raise NotImplementedError("argus.agent.step is not built yet")
