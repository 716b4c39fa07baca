"""Check the CUDA/NCCL pacing path on one GPU and record what it shows.

Run on a machine with one CUDA GPU (no launcher needed: a 1-rank NCCL process group on 127.0.0.1)::

    python experiments/gpu_check/gpu_check.py            # writes results/gpu_check.json

Checks (each prints PASS/FAIL and is recorded):

1. ``DeviceDelay`` calibration: ``torch.cuda._sleep`` cycles per second, and how well a requested
   device delay of 0.1 / 1 / 10 ms is met (CUDA events; median and p99 error).
2. The host is not blocked: issuing a paced NCCL all-reduce with a 10 ms device-side delay returns to
   the host in far less than 10 ms.
3. The delay really delays the collective: the all-reduce's completion event comes >= the delay after
   the enter event on the pacing stream.
4. The compute stream is not blocked: a kernel queued on the current stream after the paced
   all-reduce finishes before the collective does.
5. End to end: a 1-rank DDP model on CUDA with the :class:`~pacectl.torchdist.pacer.Pacer` attached
   trains 20 iterations; marks and observations are recorded and finite.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    import torch
    import torch.distributed as dist

    out: dict[str, object] = {"torch": torch.__version__}
    if not torch.cuda.is_available():
        print("gpu_check: skipped: CUDA is not available", file=sys.stderr)
        return 77
    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.launch import free_port
    from pacectl.torchdist.pacer import DeviceDelay, Pacer

    out["device"] = torch.cuda.get_device_name(0)
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=60))
    checks: dict[str, bool] = {}
    try:
        dev = torch.device("cuda", 0)
        dd = DeviceDelay(dev)
        out["cycles_per_s"] = dd.cycles_per_s
        precision = {}
        for req in (1e-4, 1e-3, 1e-2):
            errs = []
            for _ in range(50):
                s = dd.paced_stream(0.0)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                dd.paced_stream(req)
                b.record(s)
                b.synchronize()
                errs.append(a.elapsed_time(b) / 1e3 - req)
            precision[f"{req * 1e3:g}ms"] = {
                "median_error_s": float(np.median(errs)),
                "p99_error_s": float(np.percentile(errs, 99)),
            }
        out["device_delay_precision"] = precision
        checks["precision_1ms_within_5pct"] = abs(precision["1ms"]["median_error_s"]) < 5e-5

        buf = torch.ones(1 << 20, device=dev)
        x = torch.randn(2048, 2048, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stream = dd.paced_stream(0.010)
        enter_ev, exit_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            enter_ev.record(stream)
            work = dist.all_reduce(buf, async_op=True)
        host_s = time.perf_counter() - t0
        y = x @ x  # compute on the current stream, queued after the paced collective
        compute_ev = torch.cuda.Event(enable_timing=True)
        compute_ev.record()
        work.wait()  # current stream waits for the collective
        exit_ev.record()
        torch.cuda.synchronize()
        del y
        out["host_issue_s"] = host_s
        out["collective_after_enter_s"] = enter_ev.elapsed_time(exit_ev) / 1e3
        out["compute_done_after_enter_s"] = enter_ev.elapsed_time(compute_ev) / 1e3
        checks["host_not_blocked"] = host_s < 0.002
        checks["collective_delayed"] = out["collective_after_enter_s"] >= 0.0095  # type: ignore[operator]
        checks["compute_not_blocked"] = out["compute_done_after_enter_s"] < out["collective_after_enter_s"]  # type: ignore[operator]

        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=4)
        pacer = Pacer(DecisionEngine("threshold", {}, {}, num_ranks=1, seed=0)).attach(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        inp = torch.randn(64, 1024, device=dev)
        for _ in range(20):
            opt.zero_grad()
            ddp(inp).pow(2).mean().backward()
            opt.step()
        torch.cuda.synchronize()
        pacer.flush()  # piggyback mode (the default) exchanges the last iteration's figures here
        it = np.array([o.iteration_time_s for o in pacer.observations])
        out["ddp_iterations"] = len(pacer.observations)
        out["ddp_iteration_median_s"] = float(np.median(it))
        out["ddp_gather_median_s"] = float(np.median(pacer.gather_s))
        checks["ddp_end_to_end"] = len(pacer.observations) == 20 and bool(np.isfinite(it).all())
    finally:
        dist.destroy_process_group()
    out["checks"] = checks
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    res = Path(__file__).resolve().parent / "results"
    res.mkdir(exist_ok=True)
    (res / "gpu_check.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
