"""The training job of `argus demo`: a small transformer on synthetic tokens, DDP over gloo, a fault injected.

Run under torchrun (one process per rank); it holds no Argus line — `argus run`
attaches the probe. After ``--fault-after-s`` seconds of healthy training, the
rank ``--slow-rank`` is slowed for real:

- ``compute``: every forward runs ``--compute-repeat`` extra passes through the
  encoder on that rank (more CPU work; its gradients are unchanged);
- ``host_stall``: every few steps that rank's host stops (a blocking sleep
  outside the data loader and the model), as when a process is descheduled or
  a Python thread blocks;
- ``dataloader``: that rank's ``Dataset.__getitem__`` sleeps per sample, as a
  slow file system or decoder would.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

__all__ = ["SCENARIOS", "Fault", "TinyLM", "Tokens", "main", "parse_args"]

SCENARIOS = ("none", "compute", "host_stall", "dataloader")


class Fault:
    """Whether the injected fault is active on this rank now."""

    def __init__(self, scenario: str, slow_rank: int | None, after_s: float) -> None:
        self.scenario = scenario
        self.on_this_rank = slow_rank is not None and slow_rank == int(os.environ.get("RANK", "0"))
        self.start = time.monotonic() + after_s

    def active(self, scenario: str) -> bool:
        return self.scenario == scenario and self.on_this_rank and time.monotonic() >= self.start


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic next-token data: ``(seq_len,)`` int64 inputs and targets."""

    def __init__(self, size: int, seq_len: int, vocab: int, fault: Fault, sample_delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (size, seq_len + 1), generator=generator)
        self.fault = fault
        self.sample_delay_s = sample_delay_s

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fault.active("dataloader"):
            time.sleep(self.sample_delay_s)
        row = self.data[i]
        return row[:-1], row[1:]


class TinyLM(nn.Module):
    """Embedding, a 2-layer transformer encoder and a vocabulary head."""

    def __init__(self, vocab: int, dim: int, fault: Fault, compute_repeat: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(dim, vocab)
        self.fault = fault
        self.compute_repeat = compute_repeat

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.embed(tokens))
        if self.fault.active("compute"):
            # Extra work that changes no result: the same activations, recomputed.
            with torch.no_grad():
                for _ in range(self.compute_repeat):
                    self.encoder(x)
        logits: torch.Tensor = self.head(x)
        return logits


def _stop_requested(stop_file: str | None) -> bool:
    """True on every rank once any rank sees ``stop_file`` (an all-reduce, so all stop together)."""
    if stop_file is None:
        return False
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", choices=SCENARIOS, default="none")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--steps", type=int, default=100_000, help="stop after this many steps")
    p.add_argument(
        "--stop-file",
        default=None,
        help="stop (on every rank at the same step) once this file exists; checked every 10 steps",
    )
    p.add_argument("--fault-after-s", type=float, default=8.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--compute-repeat", type=int, default=2, help="compute: extra encoder passes")
    p.add_argument("--stall-every", type=int, default=4, help="host_stall: pause every N steps")
    p.add_argument("--stall-s", type=float, default=0.15, help="host_stall: pause length, s")
    p.add_argument("--sample-delay-s", type=float, default=0.004, help="dataloader: per-sample delay, s")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    random.seed(rank)
    fault = Fault(args.scenario, args.slow_rank, args.fault_after_s)
    model = DistributedDataParallel(TinyLM(args.vocab, args.dim, fault, args.compute_repeat))
    data = Tokens(args.batch_size * 64, args.seq_len, args.vocab, fault, args.sample_delay_s)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for tokens, targets in loader:
            if fault.active("host_stall") and step % args.stall_every == 0:
                time.sleep(args.stall_s)
            logits = model(tokens)
            loss = loss_fn(logits.reshape(-1, args.vocab), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step >= args.steps or (step % 10 == 0 and _stop_requested(args.stop_file)):
                step = args.steps
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
