"""The training job of `argus demo` and of ``bench/detection_live.py``: a small transformer on synthetic
tokens over gloo, in one of three parallel layouts, with a fault injected.

Run under torchrun (one process per rank, one thread each); it holds no Argus
line — `argus run` attaches the probe. Layouts (``--layout``):

- ``dp``: data parallel: the whole model on every rank, DDP.
- ``pp``: pipeline × data parallel: 2 pipeline stages × (world / 2) replicas;
  rank ``r`` is stage ``r // replicas``, replica ``r % replicas``. The stages are
  unequal: stage 0 holds the embedding and :data:`PP_LAYERS` ``[0]`` encoder
  layers and reads the data; stage 1 holds ``[1]`` layers, the vocabulary head
  and the loss. GPipe schedule of :data:`MICRO_BATCHES` micro-batches: stage 0
  runs every forward, sending each activation with ``isend``, then receives
  each gradient and runs its backward; stage 1 receives each activation, runs
  forward, loss and backward at once and sends the gradient back. Both
  directions use the pipeline group of the replica (``new_group``); stage 0
  sends the batch's targets first. Each stage all-reduces its flattened
  gradients in its data-parallel group (as Megatron's own DDP does), then steps.
- ``tp``: tensor × data parallel: 2-way tensor parallel × (world / 2) replicas;
  rank ``r`` is tensor-parallel position ``r % 2`` of replica ``r // 2``.
  Megatron-style blocks: attention heads and the MLP's hidden units are split
  across the tensor-parallel group (column-parallel QKV and first MLP layer,
  row-parallel output projections whose partial sums are all-reduced in that
  group in forward; the inputs' gradients are all-reduced there in backward).
  DDP over the data-parallel group (the ranks of one position) reduces the
  gradients.
- ``fsdp``: fully sharded data parallel (FSDP2, ``fully_shard``): the dp
  layout's model with each encoder layer and then the whole model sharded over
  the world group, so every layer's forward and backward all-gathers its
  parameters and backward reduce-scatters its gradients: a step meets at many
  synchronisation points, and a slow rank's lateness is absorbed at the first.

Every ``10`` steps the ranks agree whether to stop (an all-reduce of one flag
on the world group): once ``--stop-file`` exists or rank 0 has trained for
``--duration-s``. With ``--sync barrier|broadcast`` the job also meets at a
barrier, or receives a broadcast from rank 0, on the world group before every
forward (as a job that keeps its data order or dropout seed in lockstep does).

Faults (``--scenario``) start ``--fault-after-s`` seconds after training starts
(rank 0's clock, broadcast to all) on the ranks chosen by ``--slow-rank``,
``--slow-ranks`` or ``--slow-stage`` (pp: both ranks of a stage), each with a
size knob:

- ``compute``: every forward on those ranks makes ``--compute-repeat`` extra
  passes through the rank's own layers (no communication; a fraction is a pass
  over that share of the batch), as a slower device would; by default 2, more
  where 2 costs the job too little to be a fault (:data:`COMPUTE_REPEAT`);
- ``host_stall``: every ``--stall-every`` steps the host stops for
  ``--stall-s`` (a blocking sleep outside the loader and the model,
  :func:`injected_host_stall`), as when a
  process is descheduled or a Python thread blocks;
- ``spiky_stall``: a rare large stall: one stop of ``--spike-s`` every
  ``--spike-every`` steps;
- ``dataloader``: the rank's ``Dataset.__getitem__`` sleeps ``--sample-delay-s``
  per sample (:func:`injected_slow_read`), as a slow file system or decoder would (pp: stage 0 only);
- ``host_work``: before the ``--sync`` point of every step the rank computes on
  its CPU for ``--host-work-s`` (busy, not asleep), so the job absorbs its
  lateness at the barrier or broadcast, before the gradient all-reduce.

``--timeline FILE``: rank 0 writes there, as JSON at exit, the wall time (ns) of
every step end and of the fault's start, so a benchmark can measure the job's
throughput without Argus; and every rank ``r`` writes ``<FILE's stem>.rank<r>.json``
(:func:`injected_path`): ``{"rank": r, "injected_ns": [...], "injected_run_delay_ns": [...]}``, per
step the wall time it spent in the injected fault's own work (:meth:`Fault.timed`: the extra passes,
the sleeps, the host work) and, of it, the time its thread waited for a CPU
(:func:`thread_run_delay_ns`), so a benchmark can tell what the fault cost without a second run to
compare with.

Exit: the process groups are destroyed only after every object that holds one
(the model, DDP's reducer) is gone, so gloo's worker threads are joined while
the interpreter is still alive (see :func:`shutdown`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Imported before init_process_group on purpose: its functions take ``group=group.WORLD`` as a
# default argument, and imported later (DDP imports it) they would hold the default process
# group for the life of the interpreter, so it could never be destroyed (see shutdown).
import torch.distributed.nn
import torch.nn.functional as F  # noqa: N812  (PyTorch's own spelling)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "LAYOUTS",
    "MICRO_BATCHES",
    "SCENARIOS",
    "SYNC_POINTS",
    "Fault",
    "TinyLM",
    "Tokens",
    "extra_passes",
    "injected_host_stall",
    "injected_path",
    "injected_slow_read",
    "main",
    "parse_args",
    "shutdown",
    "thread_run_delay_ns",
]

SCENARIOS = ("none", "compute", "host_stall", "spiky_stall", "dataloader", "host_work")
LAYOUTS = ("dp", "pp", "tp", "fsdp")
SYNC_POINTS = ("none", "barrier", "broadcast")
#: Encoder layers of pipeline stage 0 and stage 1 (stage 1 also holds the head and the loss).
PP_LAYERS = (1, 3)
#: Micro-batches per step in the pipeline layout.
MICRO_BATCHES = 4
#: Tensor-parallel width of the tp layout.
TP_SIZE = 2
#: Extra forward passes of the compute fault by layout where 2 costs the job too little to be a fault:
#: a tensor-parallel rank repeats only its shard of each block, an FSDP rank adds one unsharded
#: encoder; on a CPU host whose ranks share the cores, the waiting ranks' cores go to the others,
#: so one rank's extra work costs the job little more than its share of all the work.
COMPUTE_REPEAT = {"tp": 6.0, "fsdp": 4.0}
#: Steps between two stop checks (an all-reduce on the world group).
STOP_CHECK_EVERY = 10
NHEAD = 4


class Fault:
    """Whether the injected fault is active on this rank now.

    Args:
        scenario: One of :data:`SCENARIOS`.
        ranks: The global ranks it hits.
        start_ns: When it starts, ns since the epoch (the same value on every rank).
    """

    def __init__(self, scenario: str, ranks: frozenset[int], start_ns: int) -> None:
        self.scenario = scenario
        self.ranks = ranks
        self.on_this_rank = int(os.environ.get("RANK", "0")) in ranks
        self.start_ns = start_ns
        #: Wall time spent in the fault's own work on this rank since the last :meth:`take`, ns.
        self.spent_ns = 0
        #: Of :attr:`spent_ns`, the time the thread waited for a CPU (:func:`thread_run_delay_ns`), ns.
        self.run_delay_ns = 0

    def active(self, scenario: str) -> bool:
        return self.scenario == scenario and self.on_this_rank and time.time_ns() >= self.start_ns

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Count the wall time of the block (the fault's own work) in :attr:`spent_ns`, and the
        calling thread's run-queue delay over it in :attr:`run_delay_ns`."""
        t0, d0 = time.perf_counter_ns(), thread_run_delay_ns()
        try:
            yield
        finally:
            self.run_delay_ns += thread_run_delay_ns() - d0
            self.spent_ns += time.perf_counter_ns() - t0

    def take(self) -> tuple[int, int]:
        """The fault's wall time and the run-queue delay within it since the last call, ns (at each
        step end: that step's)."""
        spent, delay = self.spent_ns, self.run_delay_ns
        self.spent_ns = self.run_delay_ns = 0
        return spent, delay


def thread_run_delay_ns() -> int:
    """The calling thread's run-queue delay so far, ns: the time it was runnable but waited for
    a CPU (another thread held it, or a CPU quota throttled its group), the 2nd field of
    ``/proc/thread-self/schedstat``; 0 where the kernel does not keep it (no file).

    A benchmark subtracts its growth over an injected block from the block's wall time: the
    block's own work or sleep (what a rank with a device of its own would lose), without the
    wait for a core that the host's other ranks held (see ``bench/detection_live.py``).
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def injected_path(timeline: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its injected time per step beside ``--timeline FILE``."""
    path = Path(timeline)
    return path.with_name(f"{path.stem}.rank{rank}.json")


def extra_passes(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, repeat: float) -> None:
    """Run ``fn`` ``repeat`` more times on ``x`` (batch-first) without autograd: the compute fault.

    A fractional part is one pass over that share of the batch's rows, so the extra work
    grows smoothly with ``repeat``.
    """
    whole, part = int(repeat), repeat - int(repeat)
    with torch.no_grad():
        for _ in range(whole):
            fn(x)
        rows = round(part * x.shape[0])
        if rows > 0:
            fn(x[:rows])


def injected_slow_read(seconds: float) -> None:
    """The ``dataloader`` fault: one sample's slow read (a sleep of ``seconds``), under its own
    name so that the rank's stacks (L5) name it."""
    time.sleep(seconds)


def injected_host_stall(seconds: float) -> None:
    """The ``host_stall`` fault: the host stops for ``seconds`` (a blocking sleep), under its own
    name so that the rank's stacks (L5) name it."""
    time.sleep(seconds)


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
            with self.fault.timed():
                injected_slow_read(self.sample_delay_s)
        row = self.data[i]
        return row[:-1], row[1:]


def _encoder(dim: int, layers: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(dim, nhead=NHEAD, dim_feedforward=4 * dim, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


class TinyLM(nn.Module):
    """Embedding, a 2-layer transformer encoder and a vocabulary head (the dp layout's model)."""

    def __init__(
        self,
        vocab: int,
        dim: int,
        fault: Fault,
        compute_repeat: float,
        extra: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = _encoder(dim, 2)
        self.head = nn.Linear(dim, vocab)
        self.fault = fault
        self.compute_repeat = compute_repeat
        #: What the compute fault's extra passes run (default the encoder): a sharded encoder
        #: all-gathers its parameters in every call, which the healthy ranks would not join.
        self.extra = extra

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.embed(tokens))
        if self.fault.active("compute"):
            # Extra work that changes no result: the same activations, recomputed.
            with self.fault.timed():
                extra_passes(self.extra or self.encoder, x, self.compute_repeat)
        logits: torch.Tensor = self.head(x)
        return logits


# --- pipeline stages ------------------------------------------------------------------------------


class FirstStage(nn.Module):
    """Pipeline stage 0: tokens ``(B, L)`` → activations ``(B, L, dim)``."""

    def __init__(self, vocab: int, dim: int, fault: Fault, compute_repeat: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = _encoder(dim, PP_LAYERS[0])
        self.fault = fault
        self.compute_repeat = compute_repeat

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.encoder(self.embed(tokens))
        if self.fault.active("compute"):
            with self.fault.timed():
                extra_passes(self.encoder, x, self.compute_repeat)
        return x


class LastStage(nn.Module):
    """Pipeline stage 1: activations ``(B, L, dim)`` → logits ``(B, L, vocab)``."""

    def __init__(self, vocab: int, dim: int, fault: Fault, compute_repeat: float) -> None:
        super().__init__()
        self.encoder = _encoder(dim, PP_LAYERS[1])
        self.head = nn.Linear(dim, vocab)
        self.fault = fault
        self.compute_repeat = compute_repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fault.active("compute"):
            with self.fault.timed():
                extra_passes(self.encoder, x, self.compute_repeat)
        logits: torch.Tensor = self.head(self.encoder(x))
        return logits


# --- tensor-parallel layers (Megatron-LM's f and g operators) -------------------------------------


class _CopyToTP(torch.autograd.Function):
    """Identity in forward; all-reduce of the gradient over the tensor-parallel group in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce of the partial sums over the tensor-parallel group in forward; identity in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    out: torch.Tensor = _CopyToTP.apply(x, group)  # type: ignore[no-untyped-call]  # torch: untyped
    return out


def _reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    out: torch.Tensor = _ReduceFromTP.apply(x, group)  # type: ignore[no-untyped-call]  # torch: untyped
    return out


def _shard(in_features: int, out_features: int, seed: int, bias: bool = True) -> nn.Linear:
    """A linear layer holding one tensor-parallel shard, initialised from its own seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Linear(in_features, out_features, bias=bias)


class TPBlock(nn.Module):
    """A pre-norm transformer block split over ``tp`` ranks (Shoeybi et al. 2019, Megatron-LM §3).

    Attention: QKV column-parallel (``NHEAD / tp`` heads per rank), output projection
    row-parallel; MLP: first layer column-parallel, second row-parallel. Each row-parallel
    output is all-reduced in ``group``; the biases after it are replicated.
    """

    def __init__(self, dim: int, tp: int, position: int, group: Any, seed: int) -> None:
        super().__init__()
        self.group = group
        self.heads = NHEAD // tp
        self.head_dim = dim // NHEAD
        local = self.heads * self.head_dim
        self.ln1 = nn.LayerNorm(dim)
        self.ln2 = nn.LayerNorm(dim)
        s = 1000 * seed + 10 * position
        self.qkv = _shard(dim, 3 * local, s)
        self.proj = _shard(local, dim, s + 1, bias=False)
        self.fc1 = _shard(dim, 4 * dim // tp, s + 2)
        self.fc2 = _shard(4 * dim // tp, dim, s + 3, bias=False)
        self.proj_bias = nn.Parameter(torch.zeros(dim))
        self.fc2_bias = nn.Parameter(torch.zeros(dim))

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's heads: ``(B, L, dim)`` → partial output ``(B, L, dim)``."""
        b, n, _ = h.shape
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(a.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))
        return out

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's hidden units: ``(B, L, dim)`` → partial output ``(B, L, dim)``."""
        out: torch.Tensor = self.fc2(F.gelu(self.fc1(h)))
        return out

    def local(self, x: torch.Tensor) -> None:
        """The block's own compute without its all-reduces (the compute fault's extra pass)."""
        self.mlp(self.ln2(x + self.attention(self.ln1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _copy_to_tp(self.ln1(x), self.group)
        x = x + _reduce_from_tp(self.attention(h), self.group) + self.proj_bias
        h = _copy_to_tp(self.ln2(x), self.group)
        return x + _reduce_from_tp(self.mlp(h), self.group) + self.fc2_bias


class TPLM(nn.Module):
    """Replicated embedding and head around two :class:`TPBlock` (the tp layout's model)."""

    def __init__(
        self, vocab: int, dim: int, position: int, group: Any, fault: Fault, compute_repeat: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(TPBlock(dim, TP_SIZE, position, group, seed=i + 1) for i in range(2))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.fault = fault
        self.compute_repeat = compute_repeat

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            assert isinstance(block, TPBlock)
            if self.fault.active("compute"):
                with self.fault.timed():
                    extra_passes(block.local, x, self.compute_repeat)
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


# --- the layouts' training steps ------------------------------------------------------------------


@dataclass
class Job:
    """One rank's part of the job: its batches (None on a rank without data) and its step."""

    batches: Iterator[tuple[torch.Tensor, torch.Tensor] | None]
    step: Callable[[tuple[torch.Tensor, torch.Tensor] | None], float]


def _forever(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def _loader(args: argparse.Namespace, fault: Fault, replica: int) -> DataLoader[Any]:
    data = Tokens(args.batch_size * 64, args.seq_len, args.vocab, fault, args.sample_delay_s)
    order = torch.Generator().manual_seed(replica)
    return DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True, generator=order)


def _groups(blocks: list[list[int]]) -> list[Any]:
    """Every rank creates every group, in the same order (``new_group`` is collective)."""
    return [dist.new_group(ranks) for ranks in blocks]


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def dp_job(args: argparse.Namespace, fault: Fault) -> Job:
    model = DistributedDataParallel(TinyLM(args.vocab, args.dim, fault, args.compute_repeat))
    return Job(_forever(_loader(args, fault, 0)), _whole_model_step(model))


def _whole_model_step(model: nn.Module) -> Callable[[tuple[torch.Tensor, torch.Tensor] | None], float]:
    """The training step of a layout whose every rank runs its model end to end, tokens to loss
    (dp, fsdp, and tp, whose model holds the rank's shard of each layer): AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: tuple[torch.Tensor, torch.Tensor] | None) -> float:
        assert batch is not None
        tokens, targets = batch
        loss = _ce(model(tokens), targets)
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        optimizer.step()
        return float(loss.detach())

    return step


def fsdp_job(args: argparse.Namespace, fault: Fault) -> Job:
    from torch.distributed.fsdp import fully_shard  # FSDP2: only this layout needs it

    # The compute fault's passes run through an unsharded copy of the encoder, held as a bound
    # method so that fully_shard does not take it for a submodule to shard.
    model = TinyLM(args.vocab, args.dim, fault, args.compute_repeat, extra=_encoder(args.dim, 2).forward)
    for layer in model.encoder.layers:
        fully_shard(layer)
    fully_shard(model)
    return Job(_forever(_loader(args, fault, dist.get_rank())), _whole_model_step(model))


def _allreduce_grads(params: list[nn.Parameter], group: Any, size: int) -> None:
    """Average gradients over ``group`` with one all-reduce of their flattened concatenation."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _isend(tensor: torch.Tensor, peer: int, group: Any) -> dist.Work:
    work = dist.isend(tensor, peer, group=group)
    assert work is not None, "this rank is in the pipeline group"
    return work


def pp_job(args: argparse.Namespace, fault: Fault) -> Job:
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // 2
    stage, replica = divmod(rank, replicas)
    dp_groups = _groups([[s * replicas + d for d in range(replicas)] for s in range(2)])
    pp_groups = _groups([[d, replicas + d] for d in range(replicas)])
    dp_group, pp_group = dp_groups[stage], pp_groups[replica]
    peer = replica + (1 - stage) * replicas  # the other stage's rank of this replica
    model: nn.Module
    if stage == 0:
        model = FirstStage(args.vocab, args.dim, fault, args.compute_repeat)
    else:
        model = LastStage(args.vocab, args.dim, fault, args.compute_repeat)
    params = list(model.parameters())
    for p in params:  # the replicas of a stage start equal
        dist.broadcast(p.data, src=stage * replicas, group=dp_group)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    mb = args.batch_size // MICRO_BATCHES
    shape = (mb, args.seq_len, args.dim)

    def first(batch: tuple[torch.Tensor, torch.Tensor] | None) -> float:
        assert batch is not None
        tokens, targets = batch
        sends = [_isend(targets.contiguous(), peer, group=pp_group)]
        outputs = []
        for chunk in torch.split(tokens, mb):
            out = model(chunk)
            sends.append(_isend(out.detach(), peer, group=pp_group))
            outputs.append(out)
        for out in outputs:
            grad = torch.empty(shape)
            dist.recv(grad, peer, group=pp_group)
            out.backward(grad)
        for work in sends:
            work.wait()
        _allreduce_grads(params, dp_group, replicas)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float("nan")

    def last(batch: tuple[torch.Tensor, torch.Tensor] | None) -> float:
        targets = torch.empty((args.batch_size, args.seq_len), dtype=torch.int64)
        dist.recv(targets, peer, group=pp_group)
        sends = []
        total = 0.0
        for chunk_targets in torch.split(targets, mb):
            x = torch.empty(shape)
            dist.recv(x, peer, group=pp_group)
            x.requires_grad_()
            loss = _ce(model(x), chunk_targets) / MICRO_BATCHES
            torch.autograd.backward(loss)
            assert x.grad is not None
            sends.append(_isend(x.grad, peer, group=pp_group))
            total += float(loss.detach())
        for work in sends:
            work.wait()
        _allreduce_grads(params, dp_group, replicas)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    batches = _forever(_loader(args, fault, replica)) if stage == 0 else itertools.repeat(None)
    return Job(batches, first if stage == 0 else last)


def tp_job(args: argparse.Namespace, fault: Fault) -> Job:
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // TP_SIZE
    replica, position = divmod(rank, TP_SIZE)
    tp_groups = _groups([[d * TP_SIZE + i for i in range(TP_SIZE)] for d in range(replicas)])
    dp_groups = _groups([[d * TP_SIZE + i for d in range(replicas)] for i in range(TP_SIZE)])
    tp_group, dp_group = tp_groups[replica], dp_groups[position]
    lm = TPLM(args.vocab, args.dim, position, tp_group, fault, args.compute_repeat)
    model = DistributedDataParallel(lm, process_group=dp_group)
    # Both positions of a replica read the same batches (the order is seeded by the replica).
    batches = _forever(_loader(args, fault, replica))
    return Job(batches, _whole_model_step(model))


# --- the loop -------------------------------------------------------------------------------------


def _stop_requested(args: argparse.Namespace, started_s: float) -> bool:
    """True on every rank once rank 0 sees ``--stop-file`` or has trained ``--duration-s`` (an all-reduce)."""
    if args.stop_file is None and args.duration_s is None:
        return False
    stop = args.stop_file is not None and os.path.exists(args.stop_file)
    stop |= args.duration_s is not None and time.monotonic() - started_s >= args.duration_s
    flag = torch.tensor([1.0 if stop and dist.get_rank() == 0 else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def _host_work(seconds: float) -> int:
    """Busy CPU work on the host for ``seconds`` (hashing bytes in Python, as host-side bookkeeping)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += hash(bytes(range(256)) * 4) & 1
    return n


def _sync(kind: str, tensor: torch.Tensor) -> None:
    if kind == "barrier":
        dist.barrier()
    elif kind == "broadcast":
        dist.broadcast(tensor, src=0)


def _slow_ranks(args: argparse.Namespace, world: int) -> frozenset[int]:
    if args.scenario == "none":
        return frozenset()
    if args.slow_ranks is not None:
        ranks = frozenset(int(r) for r in args.slow_ranks.split(","))
    elif args.slow_stage is not None:
        replicas = world // 2
        ranks = frozenset(range(args.slow_stage * replicas, (args.slow_stage + 1) * replicas))
    else:
        ranks = frozenset({args.slow_rank if args.slow_rank is not None else world - 1})
    return ranks


def _check(args: argparse.Namespace, world: int, ranks: frozenset[int]) -> None:
    """Reject a job that cannot run as asked (argparse-style exit with a message)."""
    problems = []
    if args.layout in ("pp", "tp") and world % 2:
        problems.append(f"--layout {args.layout} needs an even world size, got {world}")
    if args.slow_stage is not None and (args.layout != "pp" or args.slow_stage not in (0, 1)):
        problems.append("--slow-stage needs --layout pp and a stage 0 or 1")
    if any(not 0 <= r < world for r in ranks):
        problems.append(f"slow ranks {sorted(ranks)} must be in 0..{world - 1}")
    if args.layout == "pp" and args.scenario == "dataloader" and any(r >= world // 2 for r in ranks):
        problems.append("--layout pp: only stage 0 (ranks below world/2) reads data")
    if args.layout == "pp" and args.batch_size % MICRO_BATCHES:
        problems.append(f"--layout pp: --batch-size must be a multiple of {MICRO_BATCHES}")
    if args.scenario == "host_work" and args.sync == "none":
        problems.append("--scenario host_work needs --sync barrier or broadcast")
    if problems:
        raise SystemExit("demo_job: " + "; ".join(problems))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--layout", choices=LAYOUTS, default="dp")
    p.add_argument("--scenario", choices=SCENARIOS, default="none")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--slow-rank", type=int, default=None, help="the rank to slow (default: the last)")
    who.add_argument("--slow-ranks", default=None, metavar="R,R,...", help="several ranks to slow")
    who.add_argument("--slow-stage", type=int, default=None, help="pp: slow both ranks of this stage")
    p.add_argument("--steps", type=int, default=100_000, help="stop after this many steps")
    p.add_argument(
        "--stop-file",
        default=None,
        help=f"stop (on every rank at the same step) once this file exists; checked every "
        f"{STOP_CHECK_EVERY} steps",
    )
    p.add_argument("--duration-s", type=float, default=None, help="stop after training this long")
    p.add_argument("--fault-after-s", type=float, default=8.0)
    p.add_argument("--sync", choices=SYNC_POINTS, default="none", help="an extra sync point before forward")
    p.add_argument("--timeline", default=None, metavar="FILE", help="rank 0 writes step end times here")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument(
        "--compute-repeat",
        type=float,
        default=None,
        help="compute: extra passes per forward (default by layout: dp and pp 2, tp 6, fsdp 4)",
    )
    p.add_argument("--stall-every", type=int, default=4, help="host_stall: pause every N steps")
    p.add_argument("--stall-s", type=float, default=0.15, help="host_stall: pause length, s")
    p.add_argument("--spike-every", type=int, default=40, help="spiky_stall: one stop every N steps")
    p.add_argument("--spike-s", type=float, default=2.0, help="spiky_stall: stop length, s")
    p.add_argument("--sample-delay-s", type=float, default=0.004, help="dataloader: per-sample delay, s")
    p.add_argument("--host-work-s", type=float, default=0.03, help="host_work: CPU work per step, s")
    args = p.parse_args(argv)
    if args.compute_repeat is None:
        args.compute_repeat = COMPUTE_REPEAT.get(args.layout, 2.0)
    return args


def shutdown() -> list[str]:
    """Destroy every process group and wait for gloo's threads; returns the threads left (names).

    Call it once nothing of the job holds a group (DDP's reducer holds its group): then
    ``destroy_process_group`` drops the last references and gloo joins its worker threads
    while the interpreter is alive. A group that outlives this into interpreter
    finalization takes its threads with it, and a worker that then touches a tensor
    owned by Python aborts the process (SIGABRT, "terminate called without an active
    exception"; pytorch/pytorch#190489, #179291).
    """
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return []
    return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train until told to stop; returns the timeline (see ``--timeline``) without ``threads_at_exit``,
    with this rank's ``injected_ns`` and ``injected_run_delay_ns`` (per step, ns: :meth:`Fault.take`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = _slow_ranks(args, world)
    _check(args, world, ranks)
    torch.manual_seed(0)
    random.seed(rank)
    fault = Fault(args.scenario, ranks, 0)
    job = {"dp": dp_job, "pp": pp_job, "tp": tp_job, "fsdp": fsdp_job}[args.layout](args, fault)
    # Rank 0's clock starts the warm-up for everyone.
    start = torch.tensor([time.time_ns() + round(args.fault_after_s * 1e9)], dtype=torch.int64)
    dist.broadcast(start, src=0)
    fault.start_ns = int(start.item())
    seed = torch.zeros(1, dtype=torch.int64)
    step_end_ns: list[int] = []
    injected_ns: list[int] = []
    run_delay_ns: list[int] = []
    started_s = time.monotonic()
    step = 0
    while step < args.steps:
        batch = next(job.batches)
        if fault.active("host_stall") and step % args.stall_every == 0:
            with fault.timed():
                injected_host_stall(args.stall_s)
        if fault.active("spiky_stall") and step % args.spike_every == 0:
            with fault.timed():
                time.sleep(args.spike_s)
        if args.sync != "none":
            if fault.active("host_work"):
                with fault.timed():
                    _host_work(args.host_work_s)
            _sync(args.sync, seed)
        loss = job.step(batch)
        step += 1
        step_end_ns.append(time.time_ns())
        spent_ns, delay_ns = fault.take()
        injected_ns.append(spent_ns)
        run_delay_ns.append(delay_ns)
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss:.3f}", flush=True)
        if step % STOP_CHECK_EVERY == 0 and _stop_requested(args, started_s):
            break
    return {
        "layout": args.layout,
        "scenario": args.scenario,
        "slow_ranks": sorted(ranks),
        "fault_start_ns": fault.start_ns,
        "step_end_ns": step_end_ns,
        "injected_ns": injected_ns,
        "injected_run_delay_ns": run_delay_ns,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    timeline = train(args)  # the model and DDP's reducer, which hold process groups, end with it
    threads = shutdown()
    if args.timeline is not None:
        mine = {"rank": rank, "injected_ns": timeline.pop("injected_ns")}
        mine["injected_run_delay_ns"] = timeline.pop("injected_run_delay_ns")
        injected_path(args.timeline, rank).write_text(json.dumps(mine))
        if rank == 0:
            Path(args.timeline).write_text(json.dumps({**timeline, "threads_at_exit": threads}))


if __name__ == "__main__":
    main()
