"""A plain DistributedDataParallel training script: no Argus line in it.

Run it under torchrun, with Argus attached from the outside:

    argus run -- torchrun --nproc_per_node 2 examples/train_ddp.py --steps 3000

(3,000 steps take about 30 s on two CPU cores: three analysis windows. Argus judges a fault over
10 s of a job's steps, so the default 200 steps, about 2 s, only show that the probe attaches.)
It trains a small MLP classifier on synthetic data over gloo (CPU) or NCCL (GPU).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)
    torch.manual_seed(0)

    features = torch.randn(4096, 64)
    labels = (features[:, :8].sum(dim=1) > 0).long()
    data = TensorDataset(features, labels)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    ddp = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
