"""CUDA-only check for h21exp's experiments/gpu_check (not run here: no GPU this session).

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
"""

from __future__ import annotations

import os
import time
from typing import Any


def check_fsdp2_delay_on_reduce_scatter_stream(delay_s: float = 0.02) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import PacedReduceScatter, Pacer

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


if __name__ == "__main__":
    print(check_fsdp2_delay_on_reduce_scatter_stream())
