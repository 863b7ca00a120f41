"""A Hugging Face ``Trainer`` job on CPU under torchrun: no Argus line in it, nothing downloaded.

A small GPT-2 is built from a config (2 layers, width ``JOB_DIM``, 4 heads, vocabulary
``JOB_VOCAB``, context ``JOB_SEQ``) and trained on random tokens by ``transformers.Trainer``
(DDP over gloo through accelerate; no checkpoints, no reporting, logs every 50 steps)::

    pip install -e '.[frameworks]'
    argus run -- torchrun --standalone --nproc-per-node 4 examples/frameworks/hf_job.py
    JOB_FAULT=dataset JOB_FAULT_RANK=1 argus run -- torchrun --standalone --nproc-per-node 4 \\
        examples/frameworks/hf_job.py

Knobs (environment, see ``jobkit``): ``JOB_STEPS``, ``JOB_DURATION_S``, ``JOB_TIMELINE``,
``JOB_OUT_DIR``, ``JOB_THREADS``, ``JOB_BATCH`` (per device), ``JOB_SEQ``, ``JOB_DIM``,
``JOB_VOCAB``, and the faults, in the Trainer's own hooks:

- ``JOB_FAULT=callback``: :class:`JobCallback`'s ``on_step_end`` sleeps ``JOB_FAULT_S`` (default
  0.2 s) on rank ``JOB_FAULT_RANK`` (default 2) after every ``JOB_FAULT_EVERY``-th step;
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobkit import Job, TokenData, shutdown
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

__all__ = ["JobCallback", "main"]


class JobCallback(TrainerCallback):
    """Starts the job's fault clock, injects the ``callback`` fault, records steps, stops on time."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.job.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.job.step_end():
            control.should_training_stop = True


def main() -> None:
    job = Job("hf")
    torch.set_num_threads(int(os.environ.get("JOB_THREADS", "") or 1))
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=job.vocab, n_positions=job.seq, n_embd=job.dim, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(job.out_dir),
        per_device_train_batch_size=job.batch,
        max_steps=job.steps,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=50,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=TokenData(job, 64 * job.batch * 4, as_dict=True),
        callbacks=[JobCallback(job)],
    )
    trainer.train()
    job.write_timeline()
    del trainer  # DDP's reducer holds the process group: gone before the group is destroyed
    shutdown()


if __name__ == "__main__":
    main()
