"""A gloo DDP job one of whose ranks stalls after every step in a distinctively named function.

No Argus line in it (the tests run it under `argus run`). ``--stall-rank R`` sleeps ``--stall-s``
after each optimizer step in :func:`very_distinctive_checkpoint_stall` (a checkpoint written on
the training thread) once ``--stall-after-s`` of healthy training have passed; the job trains
until ``--stop-file`` exists (or ``--max-s``), every rank stopping at the same step.
``--stall-for-s`` ends the stall after that long (the job then trains healthily again).
``--hang`` makes the stall one that lasts until the stop file exists (in
:func:`very_distinctive_hang`): the other ranks wait in the next step's all-reduce meanwhile.
``--stall-in main`` sleeps at one line of :func:`main` (every rank runs ``main``; the line is
marked ``STALL-IN-MAIN``) instead. ``--watcher`` starts, on the stalling rank only, a thread that
polls in a sleep (as Lightning's launcher watcher does on rank 0): present there by
construction, idle throughout.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def very_distinctive_checkpoint_stall(seconds: float) -> None:
    """Stands for a checkpoint save on the training thread."""
    time.sleep(seconds)


def very_distinctive_hang(stop_file: str, max_s: float) -> None:
    """Stands for a deadlock on the training thread: blocks until ``stop_file`` exists."""
    deadline = time.monotonic() + max_s
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        time.sleep(0.05)


def very_distinctive_watcher(done: threading.Event) -> None:
    """Stands for Lightning's ``_ChildProcessObserver.run``: polls in a sleep until the job ends."""
    while not done.is_set():
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-s", type=float, default=0.1)
    p.add_argument("--stall-after-s", type=float, default=6.0)
    p.add_argument("--stall-for-s", type=float, default=float("inf"))
    p.add_argument("--hang", action="store_true", help="stall once, until the stop file exists")
    p.add_argument("--stall-in", choices=("function", "main"), default="function")
    p.add_argument("--watcher", action="store_true", help="the stalling rank alone runs a waiting thread")
    p.add_argument("--stop-file", default="")
    p.add_argument("--max-s", type=float, default=120.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
    finished = threading.Event()
    if args.watcher and rank == args.stall_rank:
        threading.Thread(
            target=very_distinctive_watcher, args=(finished,), name="watcher", daemon=True
        ).start()
    start = time.monotonic()
    stop = torch.zeros(1)
    step = 0
    while True:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        stalling = 0 < time.monotonic() - start - args.stall_after_s <= args.stall_for_s
        if rank == args.stall_rank and stalling:
            if args.hang:
                very_distinctive_hang(args.stop_file, args.max_s)
                args.stall_rank = -1
            elif args.stall_in == "main":
                time.sleep(args.stall_s)  # STALL-IN-MAIN
            else:
                very_distinctive_checkpoint_stall(args.stall_s)
        time.sleep(0.02)  # the rest of a step: logging, metrics
        step += 1
        if step % 10 == 0:
            # Every rank stops at the same step: rank 0 decides and broadcasts.
            done = time.monotonic() - start > args.max_s or (
                args.stop_file and os.path.exists(args.stop_file)
            )
            stop.fill_(1.0 if rank == 0 and done else 0.0)
            dist.broadcast(stop, 0)
            if stop.item():
                break
    finished.set()
    if rank == 0:
        print(f"stopped after {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
