"""Benchmarks of the live pacing layer (figures recorded in ``results/torchdist.json``).

1. Overhead of the pacing layer with every delay zero (controller ``none``) against plain DDP: 4 gloo
   ranks on this machine, the built-in workload (MLP), same seed, no straggler; runs alternate
   plain/paced ``--repeats`` times; median per-iteration wall time of rank 0's training loop.
2. Cost of skew measurement per iteration: the tiny exact all-gather's median time (measured inside
   the pacer), and the loop time with gathering every iteration vs (almost) never.
3. Delay precision of the host delay (``time.sleep`` + spin tail, and sleep only): median and p99 of
   actual minus requested for 0.1, 1 and 10 ms.

Usage: ``python experiments/bench/bench_torchdist.py [--iters 150] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _spec(record_dir: str, *, attach: bool, gather_every: int, iters: int, width: int) -> dict[str, Any]:
    return {
        "runs": [["none", {}]],
        "seed": 0,
        "name": "bench",
        "workload": {
            "model": "mlp",
            "width": width,
            "depth": 4,
            "batch_size": 32,
            "bucket_cap_mb": 1.0,
            "lr": 1e-3,
            "num_iterations": iters,
            "warmup_iterations": 10,
        },
        "straggler": {"rank": None},
        "guard": {"max_delay_frac": 0.5},
        "pacing": {"attach": attach, "spin_s": 2e-4, "gather_every": gather_every, "control_poll_iters": 10},
        "pg_timeout_s": 60,
        "record_dir": record_dir,
        "comm_model": "live-gloo",
    }


NPROC = 4


def _loop(spec: dict[str, Any]) -> dict[str, Any]:
    from pacectl.torchdist.launch import launch_workers

    out = launch_workers(spec, nproc_per_node=NPROC, start_method="fork")
    return out[0]["none"]


def bench_overhead(iters: int, repeats: int, width: int) -> dict[str, Any]:
    plain, paced, sparse, gather = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            plain.append(
                float(
                    np.median(
                        _loop(_spec(tmp, attach=False, gather_every=1, iters=iters, width=width))["loop_s"]
                    )
                )
            )
            r = _loop(_spec(tmp, attach=True, gather_every=1, iters=iters, width=width))
            paced.append(float(np.median(r["loop_s"])))
            gather.extend(r["gather_s"].tolist())
            sparse.append(
                float(
                    np.median(
                        _loop(_spec(tmp, attach=True, gather_every=10**6, iters=iters, width=width))["loop_s"]
                    )
                )
            )
    p, q, s = float(np.median(plain)), float(np.median(paced)), float(np.median(sparse))
    return {
        "world_size": NPROC,
        "workload": f"mlp width {width} depth 4 batch 32, bucket_cap_mb 1",
        "iterations_per_run": iters,
        "repeats": repeats,
        "plain_ddp_iteration_median_s": p,
        "paced_zero_delay_iteration_median_s": q,
        "paced_no_gather_iteration_median_s": s,
        "overhead_frac": (q - p) / p,
        "overhead_without_gather_frac": (s - p) / p,
        "per_run_medians_s": {"plain": plain, "paced": paced, "paced_no_gather": sparse},
        "gather_median_s": float(np.median(gather)),
        "gather_p99_s": float(np.percentile(gather, 99)),
        "gather_frac_of_iteration": float(np.median(gather)) / p,
    }


def bench_delay_precision(reps: int) -> dict[str, Any]:
    from pacectl.torchdist.pacer import host_delay

    out: dict[str, Any] = {}
    for spin in (2e-4, 0.0):
        rows = {}
        for req in (1e-4, 1e-3, 1e-2):
            err = np.array([host_delay(req, spin_s=spin) - req for _ in range(reps)])
            rows[f"{req * 1e3:g}ms"] = {
                "median_error_s": float(np.median(err)),
                "p99_error_s": float(np.percentile(err, 99)),
                "min_error_s": float(err.min()),
            }
        out[f"spin_{spin * 1e3:g}ms"] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "torchdist.json"))
    args = parser.parse_args()
    global NPROC
    NPROC = args.nproc
    t0 = time.perf_counter()
    result = {
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs, {platform.python_version()}",
        "torch": __import__("torch").__version__,
        "delay_precision": bench_delay_precision(args.reps),
        "overhead": bench_overhead(args.iters, args.repeats, args.width),
    }
    result["wall_time_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
