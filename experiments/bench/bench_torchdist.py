"""Benchmarks of the live pacing layer (figures recorded in ``results/torchdist.json``).

1. Overhead of the pacing layer with every delay zero (controller ``none``) against plain DDP, on
   the built-in workload (MLP, ``--widths``) with ``--nproc`` gloo ranks on this machine, same seed,
   no straggler. Run-to-run drift on a shared machine is larger than the effect (plain DDP's
   per-run medians spread ~10 %), so the variants run *interleaved inside one job*: every rank
   builds one DDP model per variant (same seed) and trains them in blocks of ``--block``
   iterations, round-robin, the order rotating every round. Each round gives one paired
   difference per variant (its block's mean iteration time minus plain DDP's, same round), so slow
   drift cancels. Variants:

   - ``plain``: DDP with its built-in C++ all-reduce;
   - ``py_hook``: DDP with torch's own Python ``allreduce_hook``: the floor of *any* Python DDP
     communication hook (a Python completion callback per bucket);
   - ``cpp_hook``: DDP with torch's built-in C++ all-reduce hook
     (``_register_builtin_comm_hook(ALLREDUCE)``): the floor of *any* comm hook. Without a hook
     DDP fuses the averaging into its copy of the gradients into the bucket; with one, the hook
     must divide, one more pass over the gradients;
   - ``py_hook_no_div``: torch's Python hook without that division (the gradients become sums:
     for timing only), to see what the extra pass costs;
   - ``py_hook_mul``: torch's Python hook averaging as DDP does without a hook (times 1 / world,
     not divided by world; what the pacer does): bit-identical to plain DDP's gradients. A
     multiply pass is about half a divide pass in isolation, but here both are memory-bound and
     cost the same (record ``torchdist_mul.json``);
   - ``async`` / ``piggyback`` / ``collective``: the pacer in each exchange mode (``gather=``);
   - ``piggyback_beside``: piggyback with ``piggyback_max_bytes`` 1 MiB: a larger carrier is not
     copied, the rows go in a tiny all-reduce beside it (``piggyback`` appends them, however large
     the carrier). Records made while 1 MiB was the default say so in their ``note``;
   - ``piggyback_k10``: piggyback with ``gather_every=10`` (the figures of 10 iterations at once:
     the exchange's cost amortized, decisions up to 10 iterations more stale);
   - ``no_gather``: the pacer with the exchange switched off (hook, timestamps, delay logic only).

   ``--bucket-cap-mb``, ``--batch`` and ``--model transformer`` move the workload towards real
   training: DDP's default bucket is 25 MB (fewer buckets, fewer Python hook calls per iteration),
   and a larger batch or the transformer (``--seq-len`` tokens per sample) lengthens the iteration
   the per-iteration host cost is compared with (records ``torchdist_batch512.json`` and
   ``torchdist_transformer.json``).

   Reported per configuration: plain's median iteration time; per variant the median paired
   difference in ms and as a fraction of plain's iteration (against plain, and against ``py_hook``,
   both as fractions of *plain's* iteration time), with a 95 % bootstrap interval
   (``scipy.stats.bootstrap`` over rounds); and the pacer's own timing of the exchange's host work
   (encode, pack, decode: ``Pacer.gather_s``). An exchange still in flight at the end of a block
   completes during the next variant's first iteration: its cost leaks into that block (at most one
   tiny all-reduce in ``--block`` iterations).

   The paired wall-time differences carry this machine's scheduling noise (a few % on 2 cores).
   The CPU time of the hook code itself does not: each variant's comm hook (and the pacer's
   end-of-iteration callback) is wrapped to sum its ``time.thread_time()`` on the training thread,
   and the pacer's completion callbacks sum theirs on gloo's threads. Reported per variant as
   microseconds per iteration and as a fraction of plain's iteration time (``hook_cpu``). For
   ``py_hook`` only the training-thread part is timed (its completion callback is torch's own
   lambda). The pacer's own code is the difference between a pacer variant and ``py_hook``; what
   any Python hook costs beyond that (GIL hand-offs, thread wake-ups) shows only in wall time.
2. Delay precision of the host delay (``time.sleep`` + spin tail, and sleep only): median and p99 of
   actual minus requested for 0.1, 1 and 10 ms.

Usage: ``python experiments/bench/bench_torchdist.py [--nproc 2 4] [--widths 512 1024] [--rounds 60]
[--block 5] [--variants plain,py_hook,...] [--out results/torchdist.json]``
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

#: name -> how the variant's DDP model is set up (see :func:`overhead_worker`).
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"attach": False},
    "py_hook": {"attach": "allreduce_hook"},
    "cpp_hook": {"attach": "builtin_allreduce"},
    "py_hook_no_div": {"attach": "sum_hook"},
    "py_hook_mul": {"attach": "mul_hook"},
    "async": {"attach": True, "gather": "async", "gather_every": 1},
    "piggyback": {"attach": True, "gather": "piggyback", "gather_every": 1},
    "piggyback_beside": {
        "attach": True,
        "gather": "piggyback",
        "gather_every": 1,
        "piggyback_max_bytes": 1 << 20,
    },
    "collective": {"attach": True, "gather": "collective", "gather_every": 1},
    "piggyback_k10": {"attach": True, "gather": "piggyback", "gather_every": 10},
    "no_gather": {"attach": True, "gather": "collective", "gather_every": 10**9},
}


def overhead_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of the interleaved overhead job (see the module docstring).

    Returns:
        ``times_s``: ``float64[rounds, variants]`` mean iteration time of each block on this rank;
        ``gather_s``: per pacer variant, the exchange's host time per exchange, seconds.
    """
    import torch
    import torch.distributed as dist
    from torch import nn

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer
    from pacectl.torchdist.worker import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    seed, workload, variants = int(spec["seed"]), spec["workload"], list(spec["variants"])
    # per variant: CPU seconds in the hook code, on the training thread and on gloo's threads
    cpu = {name: {"train": 0.0, "comm": 0.0} for name in variants}

    def timed(fn: Any, acc: dict[str, float], key: str) -> Any:
        @functools.wraps(fn)  # DDP reads the hook's signature
        def call(*args: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args)
            finally:
                acc[key] += time.thread_time() - t0

        return call

    setups = []
    for name in variants:
        torch.manual_seed(seed)
        model, x = build_model(workload)
        torch.manual_seed(seed * 1009 + rank + 1)
        x = torch.randn_like(x)
        ddp = nn.parallel.DistributedDataParallel(
            model,
            bucket_cap_mb=float(workload["bucket_cap_mb"]),
            gradient_as_bucket_view=bool(spec.get("grad_as_bucket_view", False)),
        )
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        how = VARIANTS[name]
        pacer = None
        if how["attach"] == "builtin_allreduce":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif how["attach"] == "sum_hook":

            def sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads real annotations only
                work = dist.all_reduce(bucket.buffer(), async_op=True)
                return work.get_future().then(lambda fut: fut.value()[0])

            ddp.register_comm_hook(None, timed(sum_hook, cpu[name], "train"))
        elif how["attach"] == "mul_hook":

            def mul_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads real annotations only
                work = dist.all_reduce(bucket.buffer().mul_(1.0 / world), async_op=True)
                return work.get_future().then(lambda fut: fut.value()[0])

            ddp.register_comm_hook(None, timed(mul_hook, cpu[name], "train"))
        elif how["attach"] == "allreduce_hook":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            ddp.register_comm_hook(dist.group.WORLD, timed(allreduce_hook, cpu[name], "train"))
        elif how["attach"]:
            engine = DecisionEngine("none", {}, {"max_delay_frac": 0.5}, num_ranks=world, seed=seed)
            pacer = Pacer(
                engine,
                gather=how["gather"],
                gather_every=how["gather_every"],
                piggyback_max_bytes=how.get("piggyback_max_bytes"),
            )
            # instance attributes: looked up at each call by the hook lambda and the queued callback
            for attr, thread in (
                ("_comm_hook", "train"),
                ("_end_iteration", "train"),
                ("_on_exit", "comm"),
                ("_on_piggyback_exit", "comm"),
                ("_on_async_exchange", "comm"),
                ("_on_rows_beside_exit", "comm"),
            ):
                setattr(pacer, attr, timed(getattr(pacer, attr), cpu[name], thread))
            pacer.attach(ddp)
        setups.append((ddp, opt, x, pacer))

    # gradient_as_bucket_view keeps the gradients as views of DDP's buckets only if they are kept
    # between iterations (zeroed, not set to None); then plain DDP divides in place, as a hook does
    set_to_none = not spec.get("grad_as_bucket_view", False)

    def step(ddp: Any, opt: Any, x: Any) -> None:
        opt.zero_grad(set_to_none=set_to_none)
        ddp(x).float().pow(2).mean().backward()
        opt.step()

    for ddp, opt, x, _ in setups:  # warm-up: DDP rebuilds its buckets after iteration 0
        for _ in range(3):
            step(ddp, opt, x)
    rounds, block = int(spec["rounds"]), int(spec["block"])
    for acc in cpu.values():
        acc.update(train=0.0, comm=0.0)
    times = np.zeros((rounds, len(setups)))
    for r in range(rounds):
        shift = r % len(setups)
        for i in list(range(shift, len(setups))) + list(range(shift)):
            ddp, opt, x, _ = setups[i]
            t0 = time.perf_counter()
            for _ in range(block):
                step(ddp, opt, x)
            times[r, i] = (time.perf_counter() - t0) / block
    gather = {}
    for name, (_, _, _, pacer) in zip(variants, setups, strict=True):
        if pacer is not None:
            pacer.flush()
            gather[name] = np.asarray(pacer.gather_s, dtype=np.float64)
    dist.barrier()
    setups.clear()  # the DDP models go before their group (pacectl/torchdist/worker.py says why)
    del ddp, opt, x, pacer
    gc.collect()
    dist.destroy_process_group()
    per_iter = {name: {k: v / (rounds * block) for k, v in acc.items()} for name, acc in cpu.items()}
    return {"times_s": times, "gather_s": gather, "hook_cpu_s": per_iter}


#: Exchange variants compared head to head when both run (``<a>_vs_<b>`` in the record): rows beside a
#: large carrier vs appended to it; the tiny async all-reduce (the default on gloo) vs appending.
PAIRED_EXCHANGES = (("piggyback_beside", "piggyback"), ("async", "piggyback"))


def _paired(diff: np.ndarray, scale: float) -> dict[str, float]:
    """Median paired difference (ms and fraction of ``scale``) with a 95 % bootstrap interval."""
    from scipy import stats

    ci = stats.bootstrap((diff,), np.median, confidence_level=0.95, n_resamples=2000, random_state=0)
    low, high = ci.confidence_interval
    return {
        "median_ms": float(np.median(diff)) * 1e3,
        "ci95_ms": [float(low) * 1e3, float(high) * 1e3],
        "frac": float(np.median(diff)) / scale,
        "ci95_frac": [float(low) / scale, float(high) / scale],
    }


def bench_overhead(
    nproc: int,
    width: int,
    rounds: int,
    block: int,
    variants: list[str],
    *,
    batch: int = 32,
    bucket_cap_mb: float = 1.0,
    grad_as_bucket_view: bool = False,
    model: str = "mlp",
    seq_len: int = 32,
) -> dict[str, Any]:
    """One interleaved ``nproc``-rank job at ``width``; figures from rank 0 (see the module docstring)."""
    from pacectl.torchdist.launch import launch_workers

    spec = {
        "seed": 0,
        "variants": variants,
        "rounds": rounds,
        "block": block,
        "workload": {
            "model": model,
            "width": width,
            "depth": 4,
            "batch_size": batch,
            "seq_len": seq_len,
            "bucket_cap_mb": bucket_cap_mb,
        },
        "grad_as_bucket_view": grad_as_bucket_view,
    }
    out = launch_workers(spec, nproc_per_node=nproc, start_method="fork", entrypoint=overhead_worker)[0]
    times = out["times_s"]
    plain = times[:, variants.index("plain")]
    scale = float(np.median(plain))
    result: dict[str, Any] = {
        "world_size": nproc,
        "workload": f"{model} width {width} depth 4 batch {batch}"
        + (f" seq_len {seq_len}" if model == "transformer" else "")
        + f", bucket_cap_mb {bucket_cap_mb:g}"
        + (", gradient_as_bucket_view (grads kept between iterations)" if grad_as_bucket_view else ""),
        "rounds": rounds,
        "block_iterations": block,
        "plain_iteration_median_ms": scale * 1e3,
        "iteration_median_ms": {v: float(np.median(times[:, i])) * 1e3 for i, v in enumerate(variants)},
        "overhead_vs_plain": {
            v: _paired(times[:, i] - plain, scale) for i, v in enumerate(variants) if v != "plain"
        },
    }
    if "py_hook" in variants:
        hook = times[:, variants.index("py_hook")]
        result["overhead_vs_py_hook"] = {
            v: _paired(times[:, i] - hook, scale)
            for i, v in enumerate(variants)
            if v not in ("plain", "py_hook")
        }
    for a, b in PAIRED_EXCHANGES:
        if {a, b} <= set(variants):
            result[f"{a}_vs_{b}"] = _paired(times[:, variants.index(a)] - times[:, variants.index(b)], scale)
    # every round's block means, so that any other pairing can be computed from the record
    result["block_mean_ms"] = {v: (times[:, i] * 1e3).round(4).tolist() for i, v in enumerate(variants)}
    result["hook_cpu"] = {
        v: {
            "train_us_per_iter": c["train"] * 1e6,
            "comm_us_per_iter": c["comm"] * 1e6,
            "frac_of_plain_iter": (c["train"] + c["comm"]) / scale,
        }
        for v, c in out["hook_cpu_s"].items()
        if v not in ("plain", "cpp_hook")  # nothing to time in Python
    }
    result["exchange_host_time_us"] = {
        v: {
            "median": float(np.median(g)) * 1e6 if len(g) else float("nan"),
            "p99": float(np.percentile(g, 99)) * 1e6 if len(g) else float("nan"),
        }
        for v, g in out["gather_s"].items()
        if v != "no_gather"
    }
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


def _table(configs: list[dict[str, Any]]) -> str:
    """The overhead figures as a plain-text table (also in the JSON record)."""
    lines = [
        "ranks  width  plain (ms)  variant        vs plain (% [95 % CI])  minus py_hook (% of plain)"
        "  hook CPU (us/iter: train + comm, % of plain)"
    ]
    for c in configs:
        width = c["workload"].split()[2]
        for v, x in c["overhead_vs_plain"].items():
            hook = c.get("overhead_vs_py_hook", {}).get(v)
            vs_hook = "" if hook is None else f"{100 * hook['frac']:+14.1f}"
            h = c.get("hook_cpu", {}).get(v)
            cpu = (
                ""
                if h is None
                else (
                    f"{h['train_us_per_iter']:8.0f} + {h['comm_us_per_iter']:4.0f}  {100 * h['frac_of_plain_iter']:5.2f}"
                )
            )
            lines.append(
                f"{c['world_size']:>5}  {width:>5}  {c['plain_iteration_median_ms']:>10.2f}  {v:<13}"
                f"  {100 * x['frac']:+6.1f} [{100 * x['ci95_frac'][0]:+6.1f}, {100 * x['ci95_frac'][1]:+6.1f}]"
                f"  {vs_hook:<26}  {cpu}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Overhead of the live pacing layer against plain DDP (gloo, zero delays), the cost "
        "of the skew exchange, and host-delay precision. See the module docstring for the method. "
        "The defaults take about 5 minutes on 2 cores.",
        epilog="variants: plain = DDP without a comm hook; py_hook / cpp_hook = torch's own Python / C++ "
        "all-reduce hook; py_hook_no_div = the Python hook without its division (timing only); "
        "py_hook_mul = the Python hook averaging as DDP does (times 1/world, as the pacer does); "
        "async / piggyback / collective = the pacer exchanging its figures every iteration that way; "
        "piggyback_k10 = the pacer exchanging every 10 iterations; no_gather = the pacer without the "
        "exchange.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4], help="world sizes (gloo ranks)")
    parser.add_argument(
        "--model", choices=("mlp", "transformer"), default="mlp", help="the built-in workload's model"
    )
    parser.add_argument(
        "--widths", type=int, nargs="+", default=[512, 1024], help="MLP widths (transformer: d_model)"
    )
    parser.add_argument("--seq-len", type=int, default=32, help="transformer sequence length")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds per configuration")
    parser.add_argument("--block", type=int, default=5, help="iterations per variant per round")
    parser.add_argument("--batch", type=int, default=32, help="workload batch size")
    parser.add_argument(
        "--bucket-cap-mb", type=float, default=1.0, help="DDP bucket size, MB (DDP's own default: 25)"
    )
    parser.add_argument(
        "--grad-as-bucket-view",
        action="store_true",
        help="DDP gradient_as_bucket_view=True with gradients zeroed, not set to None, between "
        "iterations: plain DDP then divides in place as a comm hook does, so the hook's extra pass is gone",
    )
    parser.add_argument("--reps", type=int, default=300, help="delay-precision samples per delay")
    parser.add_argument(
        "--variants",
        default=",".join(v for v in VARIANTS if v not in ("cpp_hook", "py_hook_no_div", "py_hook_mul")),
        help=f"comma-separated, 'plain' included; among {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--out",
        default=str(Path(__file__).parent / "results" / "torchdist.json"),
        help="JSON record to write (the default overwrites the committed record: use another path for trials)",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "plain" not in variants:
        parser.error(f"--variants: choose among {sorted(VARIANTS)}, 'plain' included (got {unknown})")
    from _record import write_record

    t0 = time.perf_counter()
    configs = []
    for nproc in args.nproc:
        for width in args.widths:
            t1 = time.perf_counter()
            print(
                f"{nproc} ranks, width {width}: {args.rounds} rounds of {args.block} iterations ...",
                flush=True,
            )
            configs.append(
                bench_overhead(
                    nproc,
                    width,
                    args.rounds,
                    args.block,
                    variants,
                    batch=args.batch,
                    bucket_cap_mb=args.bucket_cap_mb,
                    grad_as_bucket_view=args.grad_as_bucket_view,
                    model=args.model,
                    seq_len=args.seq_len,
                )
            )
            configs[-1]["wall_time_s"] = time.perf_counter() - t1
    precision = bench_delay_precision(args.reps)
    command = (
        f"python experiments/bench/bench_torchdist.py --nproc {' '.join(map(str, args.nproc))} "
        + (f"--model transformer --seq-len {args.seq_len} " if args.model == "transformer" else "")
        + f"--widths {' '.join(map(str, args.widths))} --rounds {args.rounds} --block {args.block} "
        f"--batch {args.batch} --bucket-cap-mb {args.bucket_cap_mb:g} "
        + ("--grad-as-bucket-view " if args.grad_as_bucket_view else "")
        + f"--reps {args.reps} --variants {','.join(variants)} --out {args.out}"
    )
    write_record(
        Path(args.out),
        configs,
        cpus=os.cpu_count(),
        torch=__import__("torch").__version__,
        command=command,
        delay_precision=precision,
        wall_time_s=time.perf_counter() - t0,
    )
    print(_table(configs))
    print("host delay error (sleep + 0.2 ms spin), median / p99:")
    for req, x in precision["spin_0.2ms"].items():
        print(f"  {req:>6}: {x['median_error_s'] * 1e6:.2f} us / {x['p99_error_s'] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
