"""A PyTorch Lightning ``Trainer(strategy="ddp")`` job on CPU: no Argus line in it.

Lightning's own launcher starts the ranks (this process is rank 0; it runs this script again
for ranks 1..N-1), so Argus attaches from the outside::

    pip install -e '.[frameworks]'
    argus run -- python examples/frameworks/lightning_job.py
    JOB_FAULT=callback JOB_FAULT_RANK=2 JOB_DURATION_S=40 \\
        argus run -- python examples/frameworks/lightning_job.py

The model: token embedding, a 2-layer ``nn.TransformerEncoder`` (width ``JOB_DIM``, 4 heads, no
dropout) and a vocabulary head, trained on random tokens with AdamW; ``self.log`` of the loss
every step (Lightning's CSV logger writes every 50), no checkpoints, no progress bar.
``Trainer(accelerator="cpu", devices=JOB_DEVICES (default 4), strategy="ddp")``: gloo, DDP's
default buckets.

Knobs (environment, see ``jobkit``): ``JOB_STEPS``, ``JOB_DURATION_S``, ``JOB_TIMELINE``,
``JOB_OUT_DIR``, ``JOB_THREADS``, ``JOB_BATCH``, ``JOB_SEQ``, ``JOB_DIM``, ``JOB_VOCAB``, and the
faults, in Lightning's own hooks:

- ``JOB_FAULT=callback``: :class:`JobCallback`'s ``on_train_batch_end`` sleeps ``JOB_FAULT_S``
  (default 0.2 s) on rank ``JOB_FAULT_RANK`` (default 2) after every ``JOB_FAULT_EVERY``-th step;
- ``JOB_FAULT=dataset``: the dataset's ``__getitem__`` sleeps ``JOB_FAULT_S`` (default 0.01 s)
  per sample on that rank;
- either from ``JOB_FAULT_AFTER_S`` (default 0) seconds after training starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812  (PyTorch's own spelling)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning as L  # noqa: N812  (Lightning's own spelling)
from jobkit import Job, TokenData, shutdown
from lightning.pytorch.loggers import CSVLogger

__all__ = ["Encoder", "JobCallback", "main"]


class Encoder(L.LightningModule):
    """Embedding, a 2-layer transformer encoder and a vocabulary head; next-token loss."""

    def __init__(self, job: Job) -> None:
        super().__init__()
        self.vocab = job.vocab
        self.embed = nn.Embedding(job.vocab, job.dim)
        self.pos = nn.Parameter(torch.zeros(job.seq, job.dim))
        layer = nn.TransformerEncoderLayer(job.dim, 4, 4 * job.dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(job.dim, job.vocab)

    def training_step(self, batch: Any, _index: int) -> torch.Tensor:
        x, y = batch
        logits = self.head(self.encoder(self.embed(x) + self.pos))
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class JobCallback(L.Callback):
    """Starts the job's fault clock, injects the ``callback`` fault, records steps, stops on time."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.job.start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.job.step_end():
            trainer.should_stop = True


def main() -> None:
    job = Job("lightning")
    torch.set_num_threads(int(os.environ.get("JOB_THREADS", "") or 1))
    torch.manual_seed(0)
    data = TokenData(job, 64 * job.batch * 4)
    loader = torch.utils.data.DataLoader(data, batch_size=job.batch, shuffle=True, drop_last=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("JOB_DEVICES", "") or 4),
        strategy="ddp",
        max_steps=job.steps,
        max_epochs=-1,
        callbacks=[JobCallback(job)],
        logger=CSVLogger(job.out_dir, name="lightning_logs", version="run"),
        log_every_n_steps=50,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=job.out_dir,
    )
    trainer.fit(Encoder(job), loader)
    job.write_timeline()
    del trainer  # DDP's reducer holds the process group: gone before the group is destroyed
    shutdown()


if __name__ == "__main__":
    main()
