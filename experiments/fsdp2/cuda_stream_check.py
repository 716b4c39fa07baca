"""CUDA checks of FSDP2's paced streams, steps of experiments/gpu_check (none has run on a GPU yet).

``check_fsdp2_delay_on_reduce_scatter_stream()``: on one CUDA device and a 1-rank NCCL group, call
:class:`~pacectl.torchdist.pacer.PacedReduceScatter` the way FSDP2 does (keyword arguments, inside
``torch.cuda.stream(rs_stream)``) with a forced 20 ms pacing delay, and check that

1. the host is not blocked (the call returns in well under the delay);
2. the delay is on the reduce-scatter stream (its enter event is >= the delay after an event
   recorded on that stream before the call);
3. the compute (default) stream is not delayed (an event queued on it right after the call completes
   long before the reduce-scatter stream's exit event);
4. the pacer's measured delay (``delay_actual_s``) is within 10 % of the request.

Returns a dict of the figures and ``ok``; call it from gpu_check's script and record it.

``check_fsdp2_delay_on_all_gather_stream()``: the default paced path, the forward's first
all-gather, through FSDP2's own ``foreach_all_gather`` (see its docstring).
"""

from __future__ import annotations

import os
import time
from typing import Any


def check_fsdp2_delay_on_reduce_scatter_stream(delay_s: float = 0.02) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import DeviceDelay, PacedReduceScatter, Pacer

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        dev = torch.device("cuda", torch.cuda.current_device())
        engine = DecisionEngine("none", {}, {"max_delay_frac": 0.5}, num_ranks=1, seed=0)
        pacer = Pacer(engine, gather="collective")
        pacer._next_delay = delay_s  # forced, as gpu_check's delay checks do
        comm = PacedReduceScatter(pacer)
        inp = torch.ones(1 << 20, device=dev)
        out = comm.allocate((1 << 20,), dtype=inp.dtype, device=dev)
        rs_stream = torch.cuda.Stream(device=dev)
        # outside the timed call: NCCL's communicator (created at its first collective) and the
        # device delay's calibration (the first paced collective of a run does it, once)
        dist.reduce_scatter_tensor(out, inp, group=dist.group.WORLD)
        pacer._device_delay = DeviceDelay(dev)
        before = torch.cuda.Event(enable_timing=True)
        compute_done = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        with torch.cuda.stream(rs_stream):
            before.record(rs_stream)
            t0 = time.perf_counter()
            # the first collective of an iteration, its end-of-backward callback taken as queued (no
            # autograd engine runs here to queue it)
            pacer._fsdp2_open, pacer._fsdp2_end_queued = False, True
            comm(output_tensor=out, input_tensor=inp, group=dist.group.WORLD, op=dist.ReduceOp.SUM)
            host_s = time.perf_counter() - t0
        compute_done.record(torch.cuda.current_stream(dev))
        pacer._end_fsdp2_backward()  # no autograd engine here: close the iteration by hand
        torch.cuda.synchronize(dev)
        enter_ev, exit_ev = pacer._cuda_events[0] if pacer._cuda_events else (None, None)
        delay_on_rs_s = before.elapsed_time(enter_ev) / 1e3 if enter_ev is not None else float("nan")
        compute_lag_s = before.elapsed_time(compute_done) / 1e3
        actual = pacer.delay_actual_s[-1] if pacer.delay_actual_s else float("nan")
        ok = (
            host_s < 0.5 * delay_s
            and delay_on_rs_s >= 0.9 * delay_s
            and compute_lag_s < 0.5 * delay_s
            and abs(actual - delay_s) <= 0.1 * delay_s
        )
        return {
            "delay_s": delay_s,
            "host_call_s": host_s,
            "delay_on_reduce_scatter_stream_s": delay_on_rs_s,
            "compute_stream_lag_s": compute_lag_s,
            "delay_actual_s": actual,
            "ok": bool(ok),
        }
    finally:
        if own:
            dist.destroy_process_group()


def check_fsdp2_delay_on_all_gather_stream(delay_s: float = 0.02, device: Any = None) -> dict[str, Any]:
    """FSDP2's default paced path (``fsdp2_paced="forward"``): the forward's first all-gather.

    With one rank FSDP2 issues no collective at all (torch 2.13, ``FSDPParamGroup.unshard`` and
    ``foreach_reduce`` skip them at world size 1; checked on CPU: a 1-rank model called neither
    custom comm in two steps), so a 1-GPU machine cannot pace a whole model. This check instead
    calls FSDP2's own ``foreach_all_gather`` for a real ``fully_shard`` module's parameter group, with
    the streams FSDP2 picks for a forward (``FSDPCommContext.get_all_gather_streams(False,
    TrainingState.FORWARD)``: ``all_gather_copy_in_stream``, ``all_gather_stream``) and the
    :class:`~pacectl.torchdist.pacer.PacedAllGather` that :meth:`Pacer.attach` installs, as in a
    forward under grad mode with a forced pacing delay; then once more with FSDP2's default comm.
    Judged (CUDA):

    1. the host is not blocked (the call returns in well under the delay);
    2. the pacer's device wait is queued on FSDP2's ``all_gather_stream`` (the stream passed to
       ``DeviceDelay.sleep_on`` is that very stream);
    3. the delay delays the collective: the collective's enter event and an event recorded on that
       stream after the call (where FSDP2 records its ``all_gather_event``) are >= 0.9 x the delay after an event recorded on it
       before the call;
    4. the compute (current) stream is not delayed;
    5. the gathered output is bit-identical to FSDP2's default all-gather's (the unsharded
       parameters FSDP2 copies out of it are then identical too);
    6. the pacer's measured delay (``delay_actual_s``) is within 10 % of the request.

    On CPU (``device="cpu"``, a 1-rank gloo group) the same calls run with the host delay: only
    5 and 6 mean anything there (``tests/test_fsdp2_cuda_check_harness.py`` runs it so).

    Returns a dict of the figures and ``ok``.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, foreach_all_gather
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import DeviceDelay, PacedAllGather, Pacer

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29733")
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    cuda = dev.type == "cuda"
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    streams_seen: list[Any] = []
    original_sleep_on = DeviceDelay.sleep_on

    def sleep_on(self: Any, stream: Any, delay: float) -> Any:
        streams_seen.append(stream)
        return original_sleep_on(self, stream, delay)

    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).to(dev)
        mesh = init_device_mesh(dev.type, (1,), mesh_dim_names=("dp",))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        engine = DecisionEngine("none", {}, {"max_delay_frac": 0.5}, num_ranks=1, seed=0)
        pacer = Pacer(engine, gather="collective", group=mesh.get_group()).attach(model)
        model(torch.randn(8, 1024, device=dev)).sum().backward()  # FSDP2's lazy init (no collective)
        state = model[0]._get_fsdp_state()
        param_group = state._fsdp_param_groups[0]
        comm_ctx = param_group.comm_ctx
        copy_in_stream, ag_stream = comm_ctx.get_all_gather_streams(False, TrainingState.FORWARD)
        sync = torch.cuda.synchronize if cuda else (lambda *_: None)

        def gather(comm: Any) -> Any:
            return foreach_all_gather(
                param_group.fsdp_params,
                param_group._all_gather_process_group,
                False,
                copy_in_stream,
                ag_stream,
                dev,
                comm,
            )

        plain = gather(DefaultAllGather())
        sync()
        plain_out = plain.all_gather_output.detach().cpu().clone()
        event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else (lambda: None)
        before, compute_done = event(), event()
        DeviceDelay.sleep_on = sleep_on  # type: ignore[method-assign]
        pacer._next_delay = delay_s  # forced, as gpu_check's delay checks do
        pacer._grad_forward = True  # as Pacer's forward pre-hook sets it under grad mode
        pacer._fsdp2_open = pacer._fsdp2_end_queued = False
        after = event()
        if cuda:
            # calibrated before the timed call, as a run's first delay finds it (the first paced
            # collective of a run calibrates, about 0.1 s of host time, once)
            pacer._device_delay = DeviceDelay(dev)
            sync()
            before.record(ag_stream)
        t0 = time.perf_counter()
        paced = gather(PacedAllGather(pacer))
        host_s = time.perf_counter() - t0
        if cuda:
            # FSDP2's all_gather_event is not a timing event: this one sits where it does
            after.record(ag_stream)
            compute_done.record(torch.cuda.current_stream(dev))
        pacer._end_fsdp2_backward()  # no backward follows here: close the iteration by hand
        sync()
        DeviceDelay.sleep_on = original_sleep_on  # type: ignore[method-assign]
        identical = bool(torch.equal(paced.all_gather_output.detach().cpu(), plain_out))
        collectives = len(pacer._enter)
        actual = pacer.delay_actual_s[-1] if pacer.delay_actual_s else float("nan")
        result: dict[str, Any] = {
            "device": str(dev),
            "delay_s": delay_s,
            "host_call_s": host_s,
            "collectives_paced": collectives,
            "output_bit_identical_to_default_all_gather": identical,
            "delay_actual_s": actual,
            "all_gather_output_numel": int(plain.all_gather_output.numel()),
        }
        ok = identical and collectives == 1 and abs(actual - delay_s) <= 0.1 * delay_s
        if cuda:
            enter_ev = pacer._cuda_events[0][0] if pacer._cuda_events else None
            on_ag_stream = len(streams_seen) == 1 and streams_seen[0] == ag_stream
            delay_on_ag_s = before.elapsed_time(enter_ev) / 1e3 if enter_ev is not None else float("nan")
            ag_done_s = before.elapsed_time(after) / 1e3
            compute_lag_s = before.elapsed_time(compute_done) / 1e3
            result.update(
                wait_on_fsdp2_all_gather_stream=on_ag_stream,
                delay_on_all_gather_stream_s=delay_on_ag_s,
                all_gather_done_after_before_s=ag_done_s,
                compute_stream_lag_s=compute_lag_s,
            )
            ok = ok and (
                host_s < 0.5 * delay_s
                and on_ag_stream
                and delay_on_ag_s >= 0.9 * delay_s
                and ag_done_s >= 0.9 * delay_s
                and compute_lag_s < 0.5 * delay_s
            )
        result["ok"] = bool(ok)
        return result
    finally:
        DeviceDelay.sleep_on = original_sleep_on  # type: ignore[method-assign]
        if own:
            dist.destroy_process_group()


if __name__ == "__main__":
    print(check_fsdp2_delay_on_reduce_scatter_stream())
    print(check_fsdp2_delay_on_all_gather_stream())
