"""Collective capture: c10d ``ProcessGroup`` methods, ``_broadcast_coalesced`` and DDP's comm hook.

Every ``torch.distributed`` collective called from Python ends in a method of
the ``ProcessGroup`` object (``dist.all_reduce`` calls ``group.allreduce``), so
the probe wraps those methods on the class: a collective is seen however the
user imported ``all_reduce``. The wrapper takes the issue time, calls the
original, and hands the returned ``Work`` to the recorder, which stamps the end
from the work's future callback (CPU: the time gloo completes it).

DDP runs its bucket all-reduces from C++, outside Python. Its comm hook is the
one way in: the probe registers a delegating Python hook at a DDP model's first
forward unless the user registered one, and wraps a user's hook (registered
before or after) in the same delegate, so the user's hook still runs, exactly
once per bucket. The default inner hook, :func:`recorded_allreduce`, computes
what DDP computes without a hook (scale by the reciprocal of the group size,
then sum) with the recording fused in, so a bucket costs one Python callback
(the future's ``then``, which a Python hook needs anyway to hand DDP a tensor).
A built-in C++ hook
(``_register_builtin_comm_hook``) registered before the first forward cannot be
wrapped; its buckets are then not captured and a warning says so. A Python
comm hook costs a GIL hand-off per bucket, the callback's Python on gloo's worker
thread (whose thread state :mod:`argus.agent.foreign_threads` keeps from one bucket to
the next) and one extra pass over the bucket (DDP fuses the scaling into its
gradient copy only when it has no hook): on the demo job's 4 CPU ranks about 0.1 ms
of CPU per bucket in all, which tiny CPU steps can feel; ``ARGUS_DDP_HOOK=0`` keeps
DDP's C++ all-reduce and gives up bucket capture.

Collectives issued from C++ elsewhere (functional collectives of DTensor/TP,
DDP's construction-time parameter checks) are invisible to this layer; on GPUs
their NCCL kernels still appear in the kernel summaries.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch
import torch.distributed as dist

from argus import config
from argus.agent.foreign_threads import adopt
from argus.agent.guard import call

__all__ = ["CollectiveRecorder", "Correlator", "install", "nbytes", "recorded_allreduce", "uninstall"]

log = logging.getLogger(__name__)

#: ProcessGroup method → (op name, index of the argument holding this rank's payload).
PG_METHODS: dict[str, tuple[str, int]] = {
    "allreduce": ("allreduce", 0),
    "allreduce_coalesced": ("allreduce_coalesced", 0),
    "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0),
    "allgather": ("allgather", 1),
    "_allgather_base": ("allgather", 1),
    "allgather_coalesced": ("allgather_coalesced", 1),
    "allgather_into_tensor_coalesced": ("allgather_coalesced", 1),
    # torch 2.13: all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single (FSDP's
    # all-gathers and reduce-scatters, MoE's all-to-all) end in these, not in the *_base methods.
    "all_gather_single": ("allgather", 1),
    "all_gather_single_coalesced": ("allgather_coalesced", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_coalesced", 1),
    "all_to_all_single": ("alltoall", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", 1),
    "alltoall": ("alltoall", 1),
    "alltoall_base": ("alltoall", 1),
    "gather": ("gather", 1),
    "scatter": ("scatter", 0),
    "send": ("send", 0),
    "recv": ("recv", 0),
    "recv_anysource": ("recv", 0),
    "barrier": ("barrier", -1),
    "monitored_barrier": ("barrier", -1),
}
#: Point-to-point methods → index of the argument holding the partner's rank in the group
#: (``send(tensors, dstRank, tag)``, ``recv(tensors, srcRank, tag)``; ``recv_anysource`` has none).
PEER_ARG: dict[str, int] = {"send": 1, "recv": 1}


class Correlator(Protocol):
    """Tags the GPU work launched inside a c10d call (CUPTI external correlation)."""

    def push(self) -> int:
        """Start tagging on this thread; returns the collective's id."""

    def pop(self) -> None:
        """Stop tagging."""


class CollectiveRecorder(Protocol):
    """What the wrappers call; implemented by the probe."""

    #: Set on GPU ranks with CUPTI capture; None on CPU.
    correlate: Correlator | None

    def collective(
        self,
        pg: object,
        op: str,
        nbytes: int,
        issue_ns: int,
        work: object,
        uid: int = 0,
        peer: int = -1,
        overlapped: bool = False,
    ) -> None:
        """Record one collective issued at ``issue_ns`` on ``pg``; ``work`` may be None.

        ``uid`` is the id returned by ``correlate.push()`` (0 without CUPTI); ``peer`` is the
        partner's rank in ``pg`` for a point-to-point ``send``/``recv`` (-1 otherwise or unknown);
        ``overlapped``: issued from a DDP comm hook, the rank goes on with backward meanwhile.
        """

    def collective_count(self) -> int:
        """How many collectives were recorded so far (monotonic)."""

    def open_collective(
        self, pg: Any, op: str, nbytes: int, issue_ns: int, peer: int = -1, overlapped: bool = False
    ) -> int:
        """Number a collective issued at ``issue_ns``, hold it as pending; its key (0: not recorded).

        ``overlapped``: the call returns at once and the rank goes on working (a DDP bucket).
        """

    def close_collective(self, key: int, end_ns: int, uid: int = 0) -> None:
        """Record the pending collective ``key`` (from :meth:`open_collective`) as completed at ``end_ns``."""

    def bucket_done(self, key: int, uid: int, fut: Any) -> Any:
        """``then`` callback of a recorded DDP bucket: close ``key`` now, return the reduced bucket."""

    def work_waited(self, work: Any, wait_ns: int = 0) -> None:
        """A recorded work without a future was waited on (or ``is_completed()`` said True): it ended now.

        ``wait_ns``: when the caller's ``wait()`` began (0 for ``is_completed``).
        """


class _HookFlag(threading.local):
    """True on a thread while it runs a user's DDP comm hook."""

    active = False


_in_comm_hook = _HookFlag()
_recorder: CollectiveRecorder | None = None
_originals: dict[tuple[Any, str], Any] = {}
_lock = threading.Lock()
_now = time.time_ns
#: The unwrapped ``ProcessGroup.allreduce`` (through the wrapper a DDP bucket would be recorded twice).
_allreduce: Callable[..., Any] = dist.ProcessGroup.allreduce


def nbytes(obj: Any, depth: int = 0) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list or tuple; 0 for anything else."""
    if isinstance(obj, torch.Tensor):
        return int(obj.numel() * obj.element_size())
    if depth < 2 and isinstance(obj, list | tuple):
        return sum(nbytes(x, depth + 1) for x in obj)
    return 0


def _wrap_method(method: str, op: str, arg: int, orig: Callable[..., Any]) -> Callable[..., Any]:
    peer_arg = PEER_ARG.get(method, -1)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = _recorder
        if rec is None:
            return orig(self, *args, **kwargs)
        corr = rec.correlate
        uid = call(corr.push, default=0) if corr is not None else 0
        issue_ns = _now()
        try:
            work = orig(self, *args, **kwargs)
        finally:
            if corr is not None:
                call(corr.pop, default=None)
        try:
            size = nbytes(args[arg]) if 0 <= arg < len(args) else 0
            peer = int(args[peer_arg]) if 0 <= peer_arg < len(args) else -1
            rec.collective(self, op, size, issue_ns, work, uid, peer, _in_comm_hook.active)
        except Exception:  # never let capture break a collective
            log.debug("argus: recording %s failed", method, exc_info=True)
        return work

    wrapper.__name__ = method
    wrapper.__qualname__ = f"ProcessGroup.{method}"
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


def _wrap_broadcast_coalesced(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _broadcast_coalesced(pg: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        rec = _recorder
        if rec is None:
            return orig(pg, tensors, *args, **kwargs)
        issue_ns = _now()
        out = orig(pg, tensors, *args, **kwargs)
        try:
            rec.collective(pg, "broadcast_coalesced", nbytes(tensors), issue_ns, None)
        except Exception:
            log.debug("argus: recording _broadcast_coalesced failed", exc_info=True)
        return out

    return _broadcast_coalesced


def _wrap_work_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = _now()
        done = orig(self, *args, **kwargs)
        rec = _recorder
        if rec is not None:
            try:
                rec.work_waited(self, began)
            except Exception:
                log.debug("argus: recording a wait failed", exc_info=True)
        return done

    return wait


def _wrap_work_is_completed(orig: Callable[..., Any]) -> Callable[..., Any]:
    def is_completed(self: Any) -> Any:
        done = orig(self)
        rec = _recorder
        if done and rec is not None:
            try:
                rec.work_waited(self)
            except Exception:
                log.debug("argus: recording a completion failed", exc_info=True)
        return done

    return is_completed


# --- DDP comm hook -------------------------------------------------------------------------------


class _HookSlot:
    """State of the delegating comm hook: the inner hook and its own state, swappable."""

    __slots__ = ("hook", "process_group", "state")

    def __init__(self, hook: Callable[..., Any], state: Any, process_group: Any) -> None:
        self.hook = hook
        self.state = state
        self.process_group = process_group


def _delegate(slot, bucket):  # type: ignore[no-untyped-def]  # DDP inspects the annotations
    """Run the inner comm hook; record the bucket itself if the hook issued no visible collective."""
    hook = slot.hook
    if hook is recorded_allreduce:
        return recorded_allreduce(slot.state, bucket)
    rec = _recorder
    if rec is None:
        return hook(slot.state, bucket)
    before = call(rec.collective_count, default=-1)
    issue_ns = _now()
    _in_comm_hook.active = True  # what the user's hook issues overlaps backward, as DDP's buckets do
    try:
        fut = hook(slot.state, bucket)
    finally:
        _in_comm_hook.active = False
    if before >= 0 and call(rec.collective_count, default=-1) == before:
        try:
            pg = slot.process_group or dist.distributed_c10d._get_default_group()
            rec.collective(
                pg, "allreduce", nbytes(bucket.buffer()), issue_ns, _FutureWork(fut), overlapped=True
            )
        except Exception:
            log.debug("argus: recording a DDP bucket failed", exc_info=True)
    return fut


def _first(fut: Any) -> Any:
    return fut.value()[0]


def recorded_allreduce(process_group: Any, bucket: Any) -> Any:
    """DDP's all-reduce as a comm hook (scale by 1 / group size, sum), recording the bucket.

    The same arithmetic as DDP without a hook (which multiplies by the
    reciprocal while copying gradients into the bucket), so training with and
    without the probe gives the same numbers. It calls the process group
    directly and stamps the end in the ``then`` callback that unwraps the
    result, so a bucket costs one Python callback and no closure.
    """
    group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    buf = bucket.buffer()
    size = group.size()
    if size > 1:
        buf.mul_(1.0 / size)
    rec = _recorder
    if rec is None:
        return _allreduce(group, [buf]).get_future().then(_first)
    corr = rec.correlate
    uid = call(corr.push, default=0) if corr is not None else 0
    issue_ns = _now()
    try:
        work = _allreduce(group, [buf])
    finally:
        if corr is not None:
            call(corr.pop, default=None)
    key = call(rec.open_collective, group, "allreduce", buf.nbytes, issue_ns, -1, True, default=0)
    if not key:
        return work.get_future().then(_first)
    return work.get_future().then(partial(_bucket_done, rec, key, uid))


def _bucket_done(rec: Any, key: int, uid: int, fut: Any) -> Any:
    """The bucket's result, its collective closed by ``rec`` (an error in Argus only loses the record).

    Runs on the thread that completed the all-reduce (gloo's worker on CPU), whose Python thread
    state :func:`argus.agent.foreign_threads.adopt` keeps for the next bucket.
    """
    adopt()
    try:
        return rec.bucket_done(key, uid, fut)
    except Exception:
        log.debug("argus: recording a DDP bucket's end failed", exc_info=True)
        return _first(fut)


class _FutureWork:
    """Adapts a future to the ``Work.get_future()`` the recorder expects."""

    __slots__ = ("_fut",)

    def __init__(self, fut: Any) -> None:
        self._fut = fut

    def get_future(self) -> Any:
        return self._fut


def _ddp_class() -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _install_ddp() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp = _ddp_class()
    orig_register = ddp.register_comm_hook
    orig_builtin = ddp._register_builtin_comm_hook
    orig_forward = ddp.forward
    # ARGUS_DDP_HOOK=0: leave DDP on its built-in C++ all-reduce (its buckets are then not captured).
    hook_on = os.environ.get(config.ENV_DDP_HOOK, "1") != "0"  # read once: forward runs every step

    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        slot: _HookSlot | None = self.__dict__.get("_argus_hook_slot")
        if slot is not None:
            # Ours is registered (the default, at the first forward): swap the inner hook.
            self._check_comm_hook(hook)
            slot.hook, slot.state = hook, state
            return
        self._check_comm_hook(hook)
        slot = _HookSlot(hook, state, getattr(self, "process_group", None))
        orig_register(self, slot, _make_delegate(hook))
        self.__dict__["_argus_hook_slot"] = slot

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        slot: _HookSlot | None = self.__dict__.get("_argus_hook_slot")
        builtin = dist.BuiltinCommHookType  # type: ignore[attr-defined]  # torch exports it untyped
        python_equivalent = {
            builtin.ALLREDUCE: recorded_allreduce,
            builtin.FP16_COMPRESS: default_hooks.fp16_compress_hook,
        }.get(comm_hook_type)
        if slot is not None and python_equivalent is not None:
            slot.hook, slot.state = python_equivalent, getattr(self, "process_group", None)
            return
        self.__dict__["_argus_builtin_hook"] = True
        log.warning(
            "argus: DDP built-in comm hook %s runs in C++: its bucket all-reduces are not captured",
            comm_hook_type,
        )
        orig_builtin(self, comm_hook_type)

    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        d = self.__dict__
        if (
            _recorder is not None
            and "_argus_hook_slot" not in d
            and "_argus_builtin_hook" not in d
            and hook_on
        ):
            _install_default_hook(self, orig_register, recorded_allreduce)
        return orig_forward(self, *inputs, **kwargs)

    for name, fn in (
        ("register_comm_hook", register_comm_hook),
        ("_register_builtin_comm_hook", _register_builtin_comm_hook),
        ("forward", forward),
    ):
        original = getattr(ddp, name)
        fn.__doc__ = original.__doc__
        fn.__qualname__ = original.__qualname__
        _originals[(ddp, name)] = original
        setattr(ddp, name, fn)


def _install_default_hook(model: Any, orig_register: Callable[..., Any], hook: Callable[..., Any]) -> None:
    d = model.__dict__
    if getattr(model, "_comm_hooks", None) or getattr(model, "_use_python_reducer", False):
        # A hook registered before attach (or the python reducer) owns the buckets.
        d["_argus_builtin_hook"] = True
        return
    pg = getattr(model, "process_group", None)
    slot = _HookSlot(hook, pg, pg)
    hooks_before = list(getattr(model, "_comm_hooks", []))
    try:
        orig_register(model, slot, _make_delegate(hook))
    except Exception:
        # A built-in hook registered before attach: DDP refuses a second one. Undo our bookkeeping.
        model._comm_hooks[:] = hooks_before
        d["_argus_builtin_hook"] = True
        log.warning("argus: could not register the DDP comm hook; buckets not captured", exc_info=True)
        return
    d["_argus_hook_slot"] = slot


def _make_delegate(inner: Callable[..., Any]) -> Callable[..., Any]:
    def argus_comm_hook(slot, bucket):  # type: ignore[no-untyped-def]  # DDP inspects the annotations
        return _delegate(slot, bucket)  # type: ignore[no-untyped-call]

    argus_comm_hook.__qualname__ = getattr(inner, "__qualname__", "argus_comm_hook")
    return argus_comm_hook


# --- install / uninstall -------------------------------------------------------------------------


def install(recorder: CollectiveRecorder) -> None:
    """Wrap ProcessGroup methods, ``_broadcast_coalesced`` and DDP; idempotent (the recorder is replaced)."""
    global _recorder, _allreduce  # noqa: PLW0603  (read on the hot path: plain globals)
    with _lock:
        _recorder = recorder
        if _originals:
            return
        pg_class = dist.ProcessGroup
        for method, (op, arg) in PG_METHODS.items():
            orig = pg_class.__dict__.get(method)
            if orig is None:
                continue
            _originals[(pg_class, method)] = orig
            setattr(pg_class, method, _wrap_method(method, op, arg, orig))
        _allreduce = _originals.get((pg_class, "allreduce"), _allreduce)
        # gloo's send/recv works have no future: their end is when the caller's wait returns.
        work_class = dist.Work
        for method, wrap in (("wait", _wrap_work_wait), ("is_completed", _wrap_work_is_completed)):
            orig = work_class.__dict__.get(method)
            if orig is not None:
                _originals[(work_class, method)] = orig
                fn = wrap(orig)
                fn.__doc__ = getattr(orig, "__doc__", None)
                setattr(work_class, method, fn)
        for module in (dist, dist.distributed_c10d):
            orig = module.__dict__.get("_broadcast_coalesced")
            if orig is not None:
                _originals[(module, "_broadcast_coalesced")] = orig
                setattr(module, "_broadcast_coalesced", _wrap_broadcast_coalesced(orig))  # noqa: B010  (not in the stubs)
        try:
            _install_ddp()
        except Exception:
            log.warning("argus: DDP capture unavailable", exc_info=True)


def uninstall() -> None:
    """Stop recording; wrappers stay in place as pass-throughs (DDP keeps its delegate hook)."""
    global _recorder  # noqa: PLW0603  (read on the hot path: a plain global)
    with _lock:
        _recorder = None
