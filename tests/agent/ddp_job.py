"""A tiny gloo DDP training job with no Argus line in it (the tests run it under `argus run`).

Knobs: ``--steps``, ``--delay-rank/--delay-s/--delay-from/--delay-to`` (sleep before backward
in steps ``[delay-from, delay-to)``),
``--hook fp16`` (the user's own DDP comm hook), ``--inplace`` (a model with
in-place ops), ``--loss-out FILE`` (rank 0 writes the final loss), ``--callback-states FILE``
(after training, rank 0 writes what :func:`callback_states` saw). Deterministic:
same seeds, same data, so two runs give the same loss.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable

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


#: The op each call of :func:`every_collective` is recorded as, in order (the coalesced block is one).
EVERY_COLLECTIVE = [
    "allreduce", "allreduce", "allgather", "allgather", "reduce_scatter", "reduce_scatter", "alltoall",
    "alltoall", "broadcast", "reduce", "gather", "scatter", "barrier", "allreduce_coalesced",
    "allgather_coalesced", "reduce_scatter_coalesced",
]  # fmt: skip


def every_collective(world: int, rank: int) -> list[Callable[[], object]]:
    """One call of each public c10d collective (sync and async), as FSDP, ZeRO and MoE code issues them."""
    one, many, parts = torch.ones(8), torch.ones(8 * world), [torch.ones(8) for _ in range(world)]

    def coalesced() -> object:
        with dist._coalescing_manager(async_ops=True) as cm:  # FSDP1's and DeepSpeed's bucketing
            dist.all_gather_into_tensor(torch.empty(8 * world), one)
        with dist._coalescing_manager(async_ops=True) as cm2:
            dist.reduce_scatter_tensor(torch.empty(8), many)
        cm.wait()
        return cm2

    return [
        lambda: dist.all_reduce(one),
        lambda: dist.all_reduce(one, async_op=True),
        lambda: dist.all_gather([torch.empty(8) for _ in range(world)], one),
        lambda: dist.all_gather_into_tensor(torch.empty(8 * world), one, async_op=True),
        lambda: dist.reduce_scatter_tensor(torch.empty(8), many),
        lambda: dist.reduce_scatter(torch.empty(8), parts),
        lambda: dist.all_to_all_single(torch.empty(8 * world), many),
        lambda: dist.all_to_all([torch.empty(8) for _ in range(world)], parts),
        lambda: dist.broadcast(one, 0),
        lambda: dist.reduce(one, 0),
        lambda: dist.gather(one, [torch.empty(8) for _ in range(world)] if rank == 0 else None, 0),
        lambda: dist.scatter(torch.empty(8), parts if rank == 0 else None, 0),
        dist.barrier,
        lambda: dist.all_reduce_coalesced([one, one.clone()]),
        coalesced,
    ]


def callback_states(rank: int, rounds: int = 20) -> list[tuple[int, bool]]:
    """``rounds`` async all-reduces whose ``then`` callback notes ``(thread id, whether this thread's
    threading.local already held a mark)`` and sets the mark, when it runs on a thread other than
    the main one (rank 1 starts each all-reduce late, so rank 0's completes on gloo's worker).

    A thread whose Python thread state lives on between callbacks keeps its mark; one that gets a
    fresh state per callback (a C++ thread CPython does not know) never shows one."""
    local = threading.local()
    main_thread = threading.get_ident()
    seen: list[tuple[int, bool]] = []

    def note(fut: torch.futures.Future[list[torch.Tensor]]) -> list[torch.Tensor]:
        if threading.get_ident() != main_thread:
            seen.append((threading.get_ident(), getattr(local, "mark", False)))
            local.mark = True
        return fut.value()

    for _ in range(rounds):
        if rank == 1:
            time.sleep(0.02)
        work = dist.all_reduce(torch.ones(8), async_op=True)
        assert work is not None
        work.get_future().then(note).wait()
    return seen


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
    p.add_argument("--callback-states", default="", help="rank 0 writes callback_states() here (JSON)")
    p.add_argument("--subgroups", action="store_true", help="pairs of ranks all-reduce 3 times at the end")
    p.add_argument(
        "--p2p",
        type=int,
        default=0,
        help="at the end, N rounds of a ring exchange (send/recv, then isend/irecv) on the world group",
    )
    p.add_argument(
        "--every-collective",
        action="store_true",
        help="at the end, each public c10d collective once, in the order of EVERY_COLLECTIVE",
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
    if args.every_collective:
        for call in every_collective(dist.get_world_size(), rank):
            work = call()
            if work is not None:
                work.wait()
    if args.callback_states:
        states = callback_states(rank)
        if rank == 0:
            with open(args.callback_states, "w") as f:
                json.dump(states, f)
    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0 and args.loss_out:
        with open(args.loss_out, "w") as f:
            f.write(repr(float(final) / dist.get_world_size()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
