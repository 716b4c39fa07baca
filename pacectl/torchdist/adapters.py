"""Pacing inside Megatron-core and DeepSpeed: their gradient collectives as a :class:`~pacectl.torchdist.pacer.Pacer`'s.

Neither framework exposes a comm hook like DDP's or FSDP2's custom reduce-scatter, so each adapter
wraps the framework's own gradient-sync calls on the objects it is given (instance attributes; the
framework's classes and the model code are not changed). The first gradient collective of each
iteration is delayed (a host sleep on CPU/gloo; on CUDA the Pacer's device-side wait on the current
stream), every one is timed, and the iteration ends where the framework's gradient sync ends: the
Pacer then exchanges the figures on its group and decides, as for DDP. Gradients are untouched.

- :func:`pace_megatron`: Megatron-core's ``DistributedDataParallel``: each bucket group's
  ``start_grad_sync`` is a collective of the iteration, the model's ``finish_grad_sync`` ends it.
- :func:`pace_deepspeed`: a DeepSpeed engine: the ``deepspeed.comm`` gradient collectives issued
  while ``engine.backward`` runs, on the Pacer's group; ``engine.backward``'s return ends the
  iteration (a backward without a gradient collective, inside a gradient-accumulation window, is
  not an iteration).

What ran (gloo ranks on CPU: megatron-core 0.16.1, DeepSpeed 0.19.8 ZeRO 0-3) and what did not (any
CUDA/NCCL path, Megatron's pipeline schedules): ``experiments/frameworks/README.md``, with recipes.

Example:
    >>> # decide = DecisionEngine("threshold", {}, {}, num_ranks=dp_size, seed=0)
    >>> # Megatron-core: ddp = DistributedDataParallel(config, ddp_config, model)
    >>> # pacer = pace_megatron(ddp, Pacer(decide, group=parallel_state.get_data_parallel_group()))
    >>> # DeepSpeed: engine, *_ = deepspeed.initialize(...)
    >>> # paced = pace_deepspeed(engine, Pacer(decide)); pacer = paced.pacer
    >>> # training loop unchanged; at the end: pacer.flush() (every rank); paced.detach()
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from pacectl.errors import ConfigError
from pacectl.torchdist.pacer import Pacer, now


def _ranks(group: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(group or dist.group.WORLD))


class _Iteration:
    """The adapters' shared bookkeeping: the first collective after an iteration's end begins the
    next one (:meth:`Pacer._begin_iteration`), :meth:`end` closes it (exchange, decision)."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.open = False

    def collective(
        self, run: Callable[[], Any], inp: torch.Tensor, *, stamp_exit: bool = True
    ) -> tuple[int, Any]:
        """Issue ``run()`` as one of the iteration's collectives (the first is paced).

        Returns:
            ``(slot, what run returned)``.
        """
        t_call = now()
        first = not self.open
        if first:
            self.open = True
            self.pacer._begin_iteration()
        out: list[Any] = []
        slot = self.pacer._paced_collective(
            lambda: out.append(run()), inp, t_call=t_call, first=first, stamp_exit=stamp_exit
        )
        return slot, out[0]

    def stamp_exit(self, slot: int) -> None:
        """The collective in ``slot`` is done (a completion callback, or a wait that returned); on
        CUDA the Pacer's events time it instead."""
        if not self.pacer._cuda_events and math.isnan(self.pacer._exit[slot]):
            self.pacer._exit[slot] = now()

    def end(self) -> None:
        """End of the framework's gradient sync: the iteration ends, if one began."""
        if self.open:
            self.open = False
            self.pacer._end_iteration()


def _stamp_on_completion(it: _Iteration, slot: int, works: Sequence[Any]) -> None:
    """Stamp ``slot``'s exit when every one of ``works`` has completed: in their futures' callback
    (the communication thread), or, for works without a future (gloo's coalesced reduce-scatter,
    Megatron's distributed-optimizer buckets: ``Work::getFuture not implemented``), on a thread that
    waits for them. The iteration's end waits for the stamp either way (:attr:`Pacer._futures`)."""
    try:
        futures = [w.get_future() for w in works]
    except RuntimeError:
        stamped: torch.futures.Future[None] = torch.futures.Future()

        def wait() -> None:
            try:
                for w in works:
                    w.wait()
            except Exception as err:  # a failed collective fails the iteration's end, not a hang
                stamped.set_exception(err)  # type: ignore[arg-type]  # torch types it as T
                return
            it.stamp_exit(slot)
            stamped.set_result(None)

        threading.Thread(target=wait, name="pacectl-stamp", daemon=True).start()
        it.pacer._futures.append(stamped)
        return
    it.pacer._futures.append(torch.futures.collect_all(futures).then(lambda _: it.stamp_exit(slot)))


def pace_megatron(model: Any, pacer: Pacer) -> Pacer:
    """Pace a Megatron-core ``DistributedDataParallel`` model's gradient sync.

    Wraps, on ``model`` and on each of its (dense) bucket groups, ``start_grad_sync`` (a collective
    of the iteration: the first of an iteration is delayed; an asynchronous one, with
    ``overlap_grad_reduce=True``, is timed to its completion callback on CPU), the bucket groups'
    ``finish_grad_sync`` (where an asynchronous one is waited for) and the model's
    ``finish_grad_sync`` (the iteration's end: exchange and decision). Megatron's
    ``finalize_model_grads`` (``config.finalize_model_grads_func``) calls the last once per model
    chunk, so pace a single chunk (several virtual-pipeline chunks would each end an iteration).

    Args:
        model: a ``megatron.core.distributed.DistributedDataParallel`` (one model chunk).
        pacer: a :class:`~pacectl.torchdist.pacer.Pacer` on the model's data-parallel group
            (``parallel_state.get_data_parallel_group()``, the group its bucket groups reduce on).
            ``gather="auto"`` becomes ``"async"``; ``"piggyback"`` is refused.

    Returns:
        ``pacer`` (its clock aligned: call this on every rank of the group).

    Raises:
        ConfigError: not a Megatron-core DDP model; the pacer's group is not the bucket groups';
            ``gather="piggyback"``; ``overlap_grad_reduce=True`` with CUDA gradient buffers (the
            overlapped reduce is issued on the compute stream, where a device-side delay would
            hold back the backward pass: not implemented).
    """
    groups = getattr(model, "bucket_groups", None)
    if groups is None or not hasattr(model, "finish_grad_sync"):
        raise ConfigError(
            f"pace_megatron needs a megatron.core.distributed.DistributedDataParallel model, got "
            f"{type(model).__name__}: wrap the model chunk in Megatron's DDP first"
        )
    pacer._without_piggyback("Megatron issues its gradient collectives itself")
    mine = _ranks(pacer.group)
    overlap = bool(model.ddp_config.overlap_grad_reduce)
    for g in groups:
        theirs = _ranks(
            g.intra_distributed_optimizer_instance_group
            if g.ddp_config.use_distributed_optimizer
            else g.data_parallel_group
        )
        if theirs != mine:
            raise ConfigError(
                f"pace_megatron: the Pacer's group (ranks {mine[:8]}) must be the group Megatron reduces "
                f"gradients on, got ranks {theirs[:8]}: build the Pacer with "
                "group=parallel_state.get_data_parallel_group()"
            )
        if overlap and g.buckets and g.buckets[0].grad_data.is_cuda:
            raise ConfigError(
                "pace_megatron: overlap_grad_reduce=True on CUDA is not implemented (Megatron issues the "
                "overlapped reduce on the compute stream; a device-side delay there would hold back the "
                "backward pass): use overlap_grad_reduce=False, or pace on CPU"
            )
    it = _Iteration(pacer)
    for g in groups:
        _wrap_bucket_group(g, it)
    finish = model.finish_grad_sync

    @functools.wraps(finish)
    def finish_grad_sync(*args: Any, **kwargs: Any) -> Any:
        out = finish(*args, **kwargs)
        it.end()
        return out

    model.finish_grad_sync = finish_grad_sync
    model.register_forward_hook(pacer._on_forward_end)
    pacer.align()
    return pacer


def _wrap_bucket_group(group: Any, it: _Iteration) -> None:
    """One bucket group's ``start_grad_sync`` and ``finish_grad_sync``, as collectives of ``it``."""
    start, finish = group.start_grad_sync, group.finish_grad_sync
    slot: list[int] = []  # this group's slot in the open iteration

    @functools.wraps(start)
    def start_grad_sync(*args: Any, **kwargs: Any) -> Any:
        if group.is_first_batch and group.grad_reduce_handle is not None:
            return start(*args, **kwargs)  # Megatron's own no-op: already issued
        inp = group.buckets[0].grad_data
        s, out = it.collective(lambda: start(*args, **kwargs), inp, stamp_exit=False)
        slot[:] = [s]
        handle = group.grad_reduce_handle
        works = getattr(handle, "works", None)
        if handle is None:  # synchronous (overlap off): done
            it.stamp_exit(s)
        elif works:  # asynchronous (CPU): stamped when the last work completes
            _stamp_on_completion(it, s, works)
        return out

    @functools.wraps(finish)
    def finish_grad_sync(*args: Any, **kwargs: Any) -> Any:
        out = finish(*args, **kwargs)
        if slot and it.open:  # a handle without futures: done once Megatron waited for it
            it.stamp_exit(slot.pop())
        return out

    group.start_grad_sync = start_grad_sync
    group.finish_grad_sync = finish_grad_sync


#: the ``deepspeed.comm`` collectives that reduce gradients (ZeRO 0-2), with the positions of their
#: (input tensor, group, async_op) arguments in DeepSpeed 0.19.8 (its ``timed_op`` wrapper hides the
#: signatures). ``reduce_scatter_fn`` calls ``reduce_scatter_tensor`` itself: a call inside a paced
#: one passes through.
DEEPSPEED_COLLECTIVES: dict[str, tuple[tuple[str, int], tuple[str, int], tuple[str, int]]] = {
    "all_reduce": (("tensor", 0), ("group", 2), ("async_op", 3)),
    "all_reduce_coalesced": (("tensors", 0), ("group", 2), ("async_op", 3)),
    "reduce_scatter_tensor": (("tensor", 1), ("group", 3), ("async_op", 4)),
    "reduce_scatter_fn": (("tensor", 1), ("group", 3), ("async_op", 4)),
}


def _argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[str, int], default: Any = None
) -> Any:
    name, index = where
    return kwargs[name] if name in kwargs else args[index] if index < len(args) else default


class PacedDeepSpeed:
    """Pace a DeepSpeed engine's gradient collectives: built by :func:`pace_deepspeed`.

    While ``engine.backward`` runs, each call of one of ``names`` in ``deepspeed.comm`` on the
    pacer's group is a collective of the iteration (the first is delayed; synchronous calls are
    timed to their return, ``async_op=True`` ones on CPU to their completion callback; on CUDA
    those pass through unpaced). Other calls, other groups and calls outside ``engine.backward``
    (the optimizer step's gradient-norm all-reduce, ZeRO's parameter all-gathers) pass through.
    The wrappers are module attributes of ``deepspeed.comm`` (DeepSpeed's modules call
    ``dist.all_reduce`` through it); :meth:`detach` puts the originals back. Arguments and errors:
    :func:`pace_deepspeed`.
    """

    def __init__(
        self, engine: Any, pacer: Pacer, *, names: Sequence[str] = tuple(DEEPSPEED_COLLECTIVES)
    ) -> None:
        import deepspeed.comm as ds_comm

        if not callable(getattr(engine, "backward", None)) or not hasattr(engine, "register_forward_hook"):
            raise ConfigError(
                f"pace_deepspeed needs the engine deepspeed.initialize returns, got {type(engine).__name__}"
            )
        if getattr(ds_comm, "_pacectl_paced", None) is not None:
            raise ConfigError("pace_deepspeed: deepspeed.comm is already paced; detach() the other one first")
        unknown = [n for n in names if not callable(getattr(ds_comm, n, None))]
        if unknown:
            raise ConfigError(
                f"pace_deepspeed: deepspeed.comm has no {unknown}; pick from {DEEPSPEED_COLLECTIVES}"
            )
        pacer._without_piggyback("DeepSpeed issues its gradient collectives itself")
        self.pacer, self.engine, self._comm = pacer, engine, ds_comm
        self._mine = _ranks(pacer.group)
        self._ours: dict[int, tuple[Any, bool]] = {}
        self._it = _Iteration(pacer)
        self._in_backward = False
        self._depth = 0
        self._originals = {n: getattr(ds_comm, n) for n in names}
        for n, f in self._originals.items():
            setattr(ds_comm, n, self._wrap(f, DEEPSPEED_COLLECTIVES[n]))
        backward = engine.backward

        @functools.wraps(backward)
        def paced_backward(*args: Any, **kwargs: Any) -> Any:
            self._in_backward = True
            try:
                out = backward(*args, **kwargs)
            finally:
                self._in_backward = False
            self._it.end()  # not after an error: the end exchanges on the group
            return out

        self._backward = backward
        engine.backward = paced_backward
        ds_comm._pacectl_paced = self
        engine.register_forward_hook(pacer._on_forward_end)
        pacer.align()

    def _is_ours(self, group: Any) -> bool:
        """Whether ``group`` (a torch process group, None for the world) has the pacer's ranks; cached."""
        key = id(group)
        if key not in self._ours:  # the group is kept with its answer, so that its id is not reused
            self._ours[key] = (group, _ranks(group) == self._mine)
        return bool(self._ours[key][1])

    def _wrap(self, f: Callable[..., Any], where: tuple[tuple[str, int], ...]) -> Callable[..., Any]:
        at_tensor, at_group, at_async = where

        @functools.wraps(f)
        def paced(*args: Any, **kwargs: Any) -> Any:
            if not self._in_backward or self._depth:
                return f(*args, **kwargs)
            tensor = _argument(args, kwargs, at_tensor)
            if isinstance(tensor, (list, tuple)):
                tensor = tensor[0] if tensor else None
            if not isinstance(tensor, torch.Tensor) or not self._is_ours(_argument(args, kwargs, at_group)):
                return f(*args, **kwargs)
            asynchronous = bool(_argument(args, kwargs, at_async, False))
            if asynchronous and tensor.is_cuda:
                return f(*args, **kwargs)
            self._depth += 1
            try:
                slot, work = self._it.collective(
                    lambda: f(*args, **kwargs), tensor, stamp_exit=not asynchronous
                )
            finally:
                self._depth -= 1
            if asynchronous:
                self.pacer._futures.append(work.get_future().then(lambda _: self._it.stamp_exit(slot)))
            return work

        return paced

    def detach(self) -> None:
        """Put ``deepspeed.comm``'s functions and ``engine.backward`` back (every rank, between iterations)."""
        for n, f in self._originals.items():
            setattr(self._comm, n, f)
        self.engine.backward = self._backward
        self._comm._pacectl_paced = None


def pace_deepspeed(
    engine: Any, pacer: Pacer, *, names: Sequence[str] = tuple(DEEPSPEED_COLLECTIVES)
) -> PacedDeepSpeed:
    """Pace a DeepSpeed engine: see :class:`PacedDeepSpeed`. Call it on every rank (it aligns the clock).

    Args:
        engine: the engine ``deepspeed.initialize`` returns.
        pacer: a Pacer on the engine's data-parallel group (``deepspeed.utils.groups._get_data_parallel_group()``;
            the world for pure data parallelism). ``gather="auto"`` becomes ``"async"``; ``"piggyback"`` is refused.
        names: the ``deepspeed.comm`` collectives to wrap (default :data:`DEEPSPEED_COLLECTIVES`).

    Returns:
        The :class:`PacedDeepSpeed` (``detach()`` undoes it).

    Raises:
        ConfigError: not an engine; ``deepspeed.comm`` already paced; an unknown name; ``gather="piggyback"``.
    """
    return PacedDeepSpeed(engine, pacer, names=names)
