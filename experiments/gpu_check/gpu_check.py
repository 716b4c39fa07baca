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
5. End to end, for each exchange mode (``piggyback``, ``async``, ``collective``): a 1-rank DDP model
   on CUDA with the :class:`~pacectl.torchdist.pacer.Pacer` attached trains 20 iterations;
   observations are recorded and finite, and the trained parameters equal plain DDP's (same seed).
6. Zero-delay overhead on the GPU (controller ``none``): plain DDP and the paced model train
   interleaved in blocks of 5 iterations, 40 rounds; the median paired difference of the block means,
   ms and fraction of plain's iteration (recorded, not a pass/fail check).

Every check runs even if an earlier one failed; the record says which failed and why.
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


def overhead(dev: object, rounds: int = 40, block: int = 5) -> dict[str, float]:
    """Zero-delay overhead of the pacer (piggyback) against plain DDP, interleaved blocks on one GPU."""
    import torch

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer

    setups = []
    for paced in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        if paced:
            Pacer(DecisionEngine("none", {}, {}, num_ranks=1, seed=0)).attach(ddp)
        setups.append((ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4), torch.randn(256, 4096, device=dev)))

    def step(ddp: object, opt: object, x: object) -> None:
        opt.zero_grad()  # type: ignore[attr-defined]
        ddp(x).pow(2).mean().backward()  # type: ignore[operator]
        opt.step()  # type: ignore[attr-defined]

    for ddp, opt, x in setups:
        for _ in range(5):
            step(ddp, opt, x)
    times = np.zeros((rounds, 2))
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            ddp, opt, x = setups[i]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(block):
                step(ddp, opt, x)
            torch.cuda.synchronize()
            times[r, i] = (time.perf_counter() - t0) / block
    diff = times[:, 1] - times[:, 0]
    plain = float(np.median(times[:, 0]))
    return {
        "plain_iteration_median_s": plain,
        "paced_minus_plain_median_s": float(np.median(diff)),
        "overhead_frac": float(np.median(diff)) / plain,
        "rounds": rounds,
        "block_iterations": block,
    }


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

        def train(gather: str | None, iters: int = 20) -> tuple[torch.Tensor, Pacer | None]:
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to(dev)
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=4)
            engine = DecisionEngine("threshold", {}, {}, num_ranks=1, seed=0)
            pacer = None if gather is None else Pacer(engine, gather=gather).attach(ddp)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
            gen = torch.Generator(device=dev).manual_seed(1)
            for _ in range(iters):
                opt.zero_grad()
                ddp(torch.randn(64, 1024, device=dev, generator=gen)).pow(2).mean().backward()
                opt.step()
            torch.cuda.synchronize()
            if pacer is not None:
                pacer.flush()  # the figures still in flight
            return torch.cat([q.detach().reshape(-1) for q in model.parameters()]), pacer

        plain_params, _ = train(None)
        for gather in ("piggyback", "async", "collective"):
            try:
                params, pacer = train(gather)
                assert pacer is not None
                it = np.array([o.iteration_time_s for o in pacer.observations])
                out[f"ddp_{gather}"] = {
                    "iterations": len(pacer.observations),
                    "iteration_median_s": float(np.median(it)),
                    "gather_median_s": float(np.median(pacer.gather_s)),
                    "max_abs_param_diff_vs_plain": float((params - plain_params).abs().max()),
                }
                checks[f"ddp_end_to_end_{gather}"] = (
                    len(pacer.observations) == 20
                    and bool(np.isfinite(it).all())
                    and bool(torch.allclose(params, plain_params, rtol=1e-5, atol=1e-6))
                )
            except Exception as err:  # noqa: BLE001 - record the failure, run the other checks
                out[f"ddp_{gather}"] = {"error": f"{type(err).__name__}: {err}"}
                checks[f"ddp_end_to_end_{gather}"] = False

        try:
            out["overhead_zero_delay"] = overhead(dev)
        except Exception as err:  # noqa: BLE001
            out["overhead_zero_delay"] = {"error": f"{type(err).__name__}: {err}"}
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
