"""Check the CUDA/NCCL pacing path on one GPU and record what it shows.

Run on a machine with one CUDA GPU (no launcher needed: a 1-rank NCCL process group on 127.0.0.1)::

    python experiments/gpu_check/gpu_check.py            # writes results/gpu_check.json
    python experiments/gpu_check/gpu_check.py --out "$OUT"   # with the device tool

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
6. Zero-delay overhead on the GPU (controller ``none``): plain DDP, torch's Python and C++
   all-reduce hooks (the floor of any comm hook) and the pacer (exchange every iteration and every
   10) train interleaved in blocks of 5 iterations, 40 rounds; per variant the median paired
   difference of the block means against plain, seconds and fraction of plain's iteration
   (recorded, not a pass/fail check).

Every check runs even if an earlier one failed; the record says which failed and why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


#: zero-delay variants timed against plain DDP on the GPU (see :func:`overhead`)
OVERHEAD_VARIANTS = ("plain", "py_hook", "cpp_hook", "pacer", "pacer_k10")


def overhead(dev: Any, rounds: int = 40, block: int = 5, width: int = 4096) -> dict[str, object]:
    """Zero-delay cost against plain DDP on one GPU: interleaved blocks, order rotating every round.

    Variants: ``py_hook`` (torch's Python ``allreduce_hook``) and ``cpp_hook`` (its built-in C++
    all-reduce hook) are the floor of any comm hook: on CPU/gloo that floor is the division the hook
    must do (plain DDP fuses it into its bucket copy), +2.6-2.9 % of the iteration
    (``experiments/bench/results/torchdist_hook_floor.json``); on a GPU it should be microseconds.
    ``pacer``: the pacer, figures exchanged every iteration (piggyback); ``pacer_k10``: every 10.
    A CPU ``dev`` (a gloo group) runs the same code, for a dry run before device time is spent.
    """
    import torch
    import torch.distributed as dist

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer

    setups = []
    for name in OVERHEAD_VARIANTS:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if dev.type == "cuda" else None)
        if name == "py_hook":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
        elif name == "cpp_hook":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif name.startswith("pacer"):
            engine = DecisionEngine("none", {}, {}, num_ranks=1, seed=0)
            Pacer(engine, gather_every=10 if name == "pacer_k10" else 1).attach(ddp)
        setups.append((ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4), torch.randn(256, width, device=dev)))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(ddp: object, opt: object, x: object) -> None:
        opt.zero_grad()  # type: ignore[attr-defined]
        ddp(x).pow(2).mean().backward()  # type: ignore[operator]
        opt.step()  # type: ignore[attr-defined]

    for ddp, opt, x in setups:
        for _ in range(5):
            step(ddp, opt, x)
    n = len(setups)
    times = np.zeros((rounds, n))
    for r in range(rounds):
        for i in [(j + r) % n for j in range(n)]:
            ddp, opt, x = setups[i]
            sync()
            t0 = time.perf_counter()
            for _ in range(block):
                step(ddp, opt, x)
            sync()
            times[r, i] = (time.perf_counter() - t0) / block
    plain = float(np.median(times[:, 0]))
    variants = {}
    for i, name in enumerate(OVERHEAD_VARIANTS[1:], start=1):
        diff = times[:, i] - times[:, 0]
        variants[name] = {
            "minus_plain_median_s": float(np.median(diff)),
            "overhead_frac": float(np.median(diff)) / plain,
            "minus_plain_p10_p90_s": [float(np.percentile(diff, 10)), float(np.percentile(diff, 90))],
        }
    return {
        "plain_iteration_median_s": plain,
        "variants": variants,
        "rounds": rounds,
        "block_iterations": block,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check the CUDA/NCCL pacing path on one GPU: device-delay precision, host and compute "
        "stream not blocked, the collective really delayed, DDP end to end in each exchange mode, and the "
        "zero-delay cost of comm hooks and the pacer against plain DDP. Exit 77 without CUDA, 1 if a check "
        "failed. About a minute.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "results"),
        help="results folder (written as gpu_check.json) or a .json file; with the device tool: $OUT",
    )
    args = parser.parse_args(argv)
    target = Path(args.out)
    target = target if target.suffix == ".json" else target / "gpu_check.json"
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
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(out, indent=2) + "\n")
    partial.replace(target)
    print(json.dumps(out, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
