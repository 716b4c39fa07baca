"""Benchmarks of the live pacing layer (figures recorded in ``results/torchdist*.json``).

1. Overhead of the pacing layer with every delay zero (controller ``none``) against plain DDP:
   ``--nproc`` gloo ranks on this machine, the built-in workload (MLP), same seed, no straggler.
   One job per world size runs the variants interleaved in the same processes (the order rotates
   every repeat, so drift and position effects spread over all variants), ``--repeats`` times:

   - ``plain``: DDP with its built-in C++ all-reduce;
   - ``py_hook``: DDP with torch's own Python ``allreduce_hook`` (the floor of any Python comm hook);
   - ``piggyback``: the pacer, figures carried on bucket 0 of the next iteration (``gather=piggyback``);
   - ``collective``: the pacer, one tiny all-reduce per iteration (``gather=collective``);
   - ``no_gather``: the pacer with ``gather_every`` = never (hook, timestamps and delay logic only).

   Figure per run: the median per-iteration wall time of rank 0's training loop. Reported: the median
   over runs of each variant, the spread (min, max, IQR) of per-run medians, and the overhead both as
   a ratio of medians and as the median of per-repeat paired ratios (variant / plain of the same repeat).
2. Cost of skew measurement per iteration, per mode: the pacer's own timing (collective: the tiny
   all-reduce; piggyback: host time to encode, pack, copy back and decode), and the loop-time
   difference against ``no_gather``.
3. Delay precision of the host delay (``time.sleep`` + spin tail, and sleep only): median and p99 of
   actual minus requested for 0.1, 1 and 10 ms.

Usage: ``python experiments/bench/bench_torchdist.py --nproc 4 [--iters 150] [--repeats 8]
[--variants plain,piggyback,...] [--out results/torchdist.json]``
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

#: name -> pacing overrides of the run (see :func:`pacectl.torchdist.worker.worker_main`).
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"attach": False},
    "py_hook": {"attach": "allreduce_hook"},
    "piggyback": {"attach": True, "gather": "piggyback", "gather_every": 1},
    "collective": {"attach": True, "gather": "collective", "gather_every": 1},
    "no_gather": {"attach": True, "gather": "collective", "gather_every": 10**9},
}


def _spec(record_dir: str, runs: list[list[Any]], *, iters: int, width: int) -> dict[str, Any]:
    return {
        "runs": runs,
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
        "pacing": {"attach": True, "spin_s": 2e-4, "gather_every": 1, "control_poll_iters": 10},
        "pg_timeout_s": 120,
        "record_dir": record_dir,
        "comm_model": "live-gloo",
    }


def _spread(x: list[float]) -> dict[str, float]:
    a = np.asarray(x, dtype=np.float64)
    return {
        "median": float(np.median(a)),
        "min": float(a.min()),
        "max": float(a.max()),
        "iqr": float(np.percentile(a, 75) - np.percentile(a, 25)),
    }


def bench_overhead(nproc: int, iters: int, repeats: int, width: int, variants: list[str]) -> dict[str, Any]:
    """Interleaved runs of ``variants`` in one ``nproc``-rank job; figures from rank 0 (see module doc)."""
    from pacectl.torchdist.launch import launch_workers

    runs: list[list[Any]] = []
    for r in range(repeats):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            runs.append(["none", {}, {**VARIANTS[v], "label": f"{v}#{r}"}])
    with tempfile.TemporaryDirectory() as tmp:
        out = launch_workers(
            _spec(tmp, runs, iters=iters, width=width), nproc_per_node=nproc, start_method="fork"
        )[0]
    per_run: dict[str, list[float]] = {v: [] for v in variants}
    cost: dict[str, list[float]] = {v: [] for v in variants}
    for label, res in out.items():
        v, _ = label.split("#")
        per_run[v].append(float(np.median(res["loop_s"])))
        cost[v].extend(np.asarray(res["gather_s"], dtype=np.float64).tolist())
    base = "plain"
    p = float(np.median(per_run[base]))
    result: dict[str, Any] = {
        "world_size": nproc,
        "workload": f"mlp width {width} depth 4 batch 32, bucket_cap_mb 1",
        "iterations_per_run": iters,
        "repeats": repeats,
        "iteration_median_s": {v: float(np.median(x)) for v, x in per_run.items()},
        "per_run_median_spread_s": {v: _spread(x) for v, x in per_run.items()},
        "overhead_frac_vs_plain": {v: float(np.median(x)) / p - 1.0 for v, x in per_run.items() if v != base},
        "paired_overhead_frac_vs_plain": {
            v: _spread([a / b - 1.0 for a, b in zip(x, per_run[base], strict=True)])
            for v, x in per_run.items()
            if v != base
        },
        "plain_run_to_run_spread_frac": (max(per_run[base]) - min(per_run[base])) / p,
        "per_run_medians_s": per_run,
    }
    skew: dict[str, Any] = {}
    for v in ("collective", "piggyback"):
        if v in per_run and cost[v]:
            c = np.asarray(cost[v])
            skew[v] = {
                "pacer_timed_median_s": float(np.median(c)),
                "pacer_timed_p99_s": float(np.percentile(c, 99)),
                "pacer_timed_frac_of_iteration": float(np.median(c)) / p,
            }
            if "no_gather" in per_run:
                skew[v]["loop_median_minus_no_gather_s"] = float(
                    np.median(per_run[v]) - np.median(per_run["no_gather"])
                )
    result["skew_measurement_cost"] = skew
    return result


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
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "torchdist.json"))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "plain" not in variants:
        parser.error(f"--variants: choose among {sorted(VARIANTS)}, 'plain' included (got {unknown})")
    t0 = time.perf_counter()
    result = {
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs, {platform.python_version()}",
        "torch": __import__("torch").__version__,
        "command": f"python experiments/bench/bench_torchdist.py --nproc {args.nproc} --iters {args.iters} "
        f"--repeats {args.repeats} --variants {','.join(variants)}",
        "delay_precision": bench_delay_precision(args.reps),
        "overhead": bench_overhead(args.nproc, args.iters, args.repeats, args.width, variants),
    }
    result["wall_time_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
