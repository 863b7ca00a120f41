"""A tiny gloo DDP training job with no Argus line in it (the tests run it under `argus run`).

Knobs: ``--steps``, ``--delay-rank/--delay-s/--delay-from/--delay-to`` (sleep before backward
in steps ``[delay-from, delay-to)``),
``--hook fp16`` (the user's own DDP comm hook), ``--inplace`` (a model with
in-place ops), ``--loss-out FILE`` (rank 0 writes the final loss). Deterministic:
same seeds, same data, so two runs give the same loss.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


class InPlaceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        out = self.fc2(h)
        out += h  # in-place residual
        return self.fc3(self.act(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--delay-rank", type=int, default=-1)
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--delay-from", type=int, default=0)
    p.add_argument("--delay-to", type=int, default=1 << 30)
    p.add_argument("--step-sleep-s", type=float, default=0.0)
    p.add_argument("--hook", choices=["none", "fp16"], default="none")
    p.add_argument("--inplace", action="store_true")
    p.add_argument("--loss-out", default="")
    p.add_argument("--subgroups", action="store_true", help="pairs of ranks all-reduce 3 times at the end")
    p.add_argument(
        "--p2p",
        type=int,
        default=0,
        help="at the end, N rounds of a ring exchange (send/recv, then isend/irecv) on the world group",
    )
    p.add_argument(
        "--p2p-delay-s", type=float, default=0.0, help="even ranks wait this long before each blocking send"
    )
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    if args.inplace:
        model: nn.Module = InPlaceNet()
    else:
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    if args.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(512, 32, generator=g)
    y = torch.randint(0, 4, (512,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    loss = torch.tensor(0.0)
    while step < args.steps:
        for xb, yb in loader:
            if step >= args.steps:
                break
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            if rank == args.delay_rank and args.delay_from <= step < args.delay_to:
                time.sleep(args.delay_s)
            loss.backward()
            opt.step()
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
            step += 1
    if args.subgroups:
        world = dist.get_world_size()
        pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]
        mine = pairs[rank // 2]
        for _ in range(3):
            dist.all_reduce(torch.ones(8), group=mine)
    if args.p2p:
        world = dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        buf = torch.zeros(16)
        for _ in range(args.p2p):
            # Even ranks send first, odd ranks receive first: blocking calls that cannot deadlock.
            if rank % 2 == 0:
                time.sleep(args.p2p_delay_s)
                dist.send(torch.ones(16), right)
                dist.recv(buf, left)
            else:
                dist.recv(buf, left)
                dist.send(torch.ones(16), right)
            for work in (dist.isend(torch.ones(16), left), dist.irecv(buf, right)):
                work.wait()
    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0 and args.loss_out:
        with open(args.loss_out, "w") as f:
            f.write(repr(float(final) / dist.get_world_size()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
