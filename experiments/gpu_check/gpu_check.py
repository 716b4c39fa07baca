"""Check the CUDA/NCCL pacing path on one GPU and record what it shows.

Run on a machine with one CUDA GPU (no launcher needed: a 1-rank NCCL process group on 127.0.0.1)::

    python experiments/gpu_check/gpu_check.py            # writes results/gpu_check.json
    python experiments/gpu_check/gpu_check.py --out "$OUT"   # with the device tool

Checks (each prints PASS/FAIL and is recorded):

1. ``DeviceDelay`` calibration: ``torch.cuda._sleep`` cycles per second, and how well a requested
   device delay of 0.1 / 1 / 10 ms is met (CUDA events; median and p99 error).
2. The host is not blocked: issuing a paced NCCL all-reduce with a 10 ms device-side delay returns to
   the host in far less than 10 ms (NCCL's communicator and cuBLAS are warmed up first, so their
   one-time set-up is not timed).
3. The delay really delays the collective: from an event on the current stream just before the
   pacing stream is ordered after it, the all-reduce completes >= the delay later.
4. The compute stream is not blocked: a kernel queued on the current stream after the paced
   all-reduce completes well within the delay, timed from the same event.
5. End to end, for each exchange mode (``piggyback``, ``async``, ``collective``, and piggyback with
   ``cuda_resolve="iteration_end"``): a 1-rank DDP model on CUDA with the
   :class:`~pacectl.torchdist.pacer.Pacer` attached trains 20 iterations; observations are recorded
   and finite, and the trained parameters equal plain DDP's (same seed). Then a fixed 5 ms delay in
   every iteration (:func:`delayed_run`): the collective enters that much later, the iteration
   grows by no more than the delay and no less than the max-plus bound, and the natural arrival
   (arrival - delay) is the undelayed arrival.
6. Zero-delay overhead on the GPU (controller ``none``): plain DDP, torch's Python and C++
   all-reduce hooks (the floor of any comm hook) and the pacer (exchange every iteration and every
   10; both CUDA resolutions) train interleaved in blocks of 5 iterations, 40 rounds (and 20 rounds
   at batch 4096, a 10x longer iteration); per variant the median paired
   difference of the block means against plain, seconds and fraction of plain's iteration
   (recorded, not a pass/fail check).
7. The physics behind the simulator's parameters (``device_physics.py``; recorded, not pass/fail):
   ``sleep_calibration`` (``torch.cuda._sleep``'s rate and the SM clock, idle and under a GEMM
   stream), ``kappa_on_device`` (a GEMM stream's slowdown while NCCL-like spinning kernels of 1-32
   CTAs occupy the GPU, against the pacer's 1-CTA sleep: early-arrival interference on the device)
   and ``power_states`` (mean power, NVML energy counter, in idle, compute, spinning-wait and
   sleeping-wait states).
8. ``fsdp2_reduce_scatter_stream`` (``experiments/fsdp2/cuda_stream_check.py``): FSDP2's paced
   reduce-scatter waits on its own stream; host and compute stream not blocked (pass/fail).
9. ``fsdp2_all_gather_stream`` (same file): FSDP2's default paced path, the forward's first
   all-gather, through FSDP2's own ``foreach_all_gather``: the wait is queued on FSDP2's
   ``all_gather_stream`` and delays the collective (CUDA events), host and compute stream not
   blocked, the output bit-identical to FSDP2's default all-gather's (pass/fail). With one rank
   FSDP2 skips its collectives, so a whole model cannot be paced on one GPU.

With ``--cpu`` the CUDA-only steps (1-4, 8, 9) are skipped: a ``skipped`` line each, and the
record's ``skipped`` lists them.

Every check runs even if an earlier one failed; the record says which failed and why. The record is
rewritten after every check (``"complete": false`` until the end), and a watchdog (``--watchdog-s``)
prints every thread's stack and exits 1 before an outer time limit kills the run, so a hang or a
crash still leaves the results so far.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # device_physics


#: every step :func:`main` runs, in order (``--checks`` picks some)
STEPS = (
    "device_delay_precision",
    "not_blocked",
    "ddp_plain",
    "ddp_piggyback",
    "ddp_async",
    "ddp_collective",
    "ddp_piggyback_iteration_end",
    "ddp_delay_applied",
    "ddp_delay_applied_piggyback_iteration_end",
    "ddp_delay_applied_piggyback_next_iteration_width4096_batch1024",
    "ddp_delay_applied_piggyback_next_iteration",
    "ddp_delay_in_a_loop",
    "overhead_zero_delay",
    "overhead_zero_delay_batch4096",
    "sleep_calibration",
    "kappa_on_device",
    "power_states",
    "fsdp2_reduce_scatter_stream",
    "fsdp2_all_gather_stream",
)
#: steps that need CUDA (skipped with ``--cpu``)
CUDA_ONLY = (
    "device_delay_precision",
    "not_blocked",
    "fsdp2_reduce_scatter_stream",
    "fsdp2_all_gather_stream",
)
#: steps that compare with plain DDP's parameters, which ``ddp_plain`` trains
NEEDS_PLAIN = ("ddp_piggyback", "ddp_async", "ddp_collective", "ddp_piggyback_iteration_end")
#: zero-delay variants timed against plain DDP on the GPU (see :func:`overhead`)
OVERHEAD_VARIANTS = (
    "plain",
    "py_hook",
    "cpp_hook",
    "pacer",
    "pacer_iteration_end",
    "pacer_async",
    "pacer_k10",
)


def overhead(
    dev: Any, rounds: int = 40, block: int = 5, width: int = 4096, batch: int = 256
) -> dict[str, object]:
    """Zero-delay cost against plain DDP on one GPU: interleaved blocks, order rotating every round.

    Variants: ``py_hook`` (torch's Python ``allreduce_hook``) and ``cpp_hook`` (its built-in C++
    all-reduce hook) are the floor of any comm hook: on CPU/gloo that floor is the division the hook
    must do (plain DDP fuses it into its bucket copy), +2.6-2.9 % of the iteration
    (``experiments/bench/results/torchdist_hook_floor.json``); on a GPU it should be microseconds.
    ``pacer``: the pacer at its default exchange (``gather=auto``: piggyback on NCCL, async on
    gloo) and resolution (``cuda_resolve="next_iteration"``); ``pacer_iteration_end``: the same,
    resolving each iteration's device times at its end (the host waits for the device there: the
    behaviour before 2026-12-01, whose cost the first device run measured); ``pacer_async``: the async exchange, whose decode on CUDA waits for the device before the
    next delay (is ``auto``'s piggyback on NCCL the right choice?); ``pacer_k10``: every 10.
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
            Pacer(
                engine,
                gather="async" if name == "pacer_async" else "auto",
                gather_every=10 if name == "pacer_k10" else 1,
                cuda_resolve="iteration_end" if name == "pacer_iteration_end" else "next_iteration",
            ).attach(ddp)
        setups.append(
            (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4), torch.randn(batch, width, device=dev))
        )
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
        "workload": f"mlp width {width} depth 8 batch {batch}",
    }


def setup(
    dev: Any, gather: str | None, cuda_resolve: str = "next_iteration", width: int = 1024, batch: int = 64
) -> tuple[Any, Callable[[float], None], Any]:
    """A 4-layer MLP under DDP on ``dev`` (a 1-rank group), paced by a ``threshold`` pacer.

    Args:
        dev: ``torch.device`` (CUDA for the check; CPU with a gloo group for the dry run).
        gather: the pacer's exchange mode, or None for plain DDP.
        cuda_resolve: the pacer's ``cuda_resolve`` (when the host reads the device times).
        width, batch: the MLP's width and the batch size (the device time of an iteration).

    Returns:
        ``(model, step, pacer or None)``; ``step(delay_s)`` trains one iteration, with ``delay_s`` > 0
        forced as the delay bucket 0's hook applies (the controller's own decision replaced).
    """
    import torch

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index or 0] if dev.type == "cuda" else None, bucket_cap_mb=4
    )
    engine = DecisionEngine("threshold", {}, {"max_delay_frac": 1.0}, num_ranks=1, seed=0)
    pacer = None if gather is None else Pacer(engine, gather=gather, cuda_resolve=cuda_resolve).attach(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device=dev).manual_seed(1)
    forced = [0.0]
    if pacer is not None:
        # With cuda_resolve="next_iteration" the decision for an iteration is taken in its first
        # hook, after step() has run: the forced delay replaces every decision, wherever it is taken.
        decide = pacer._decide

        def decide_then_force(first_iteration: int, tables: Any) -> None:
            decide(first_iteration, tables)
            if forced[0] > 0.0:
                pacer._next_delay = forced[0]

        pacer._decide = decide_then_force  # type: ignore[method-assign]

    def step(delay_s: float = 0.0) -> None:
        forced[0] = delay_s
        if pacer is not None and delay_s > 0.0:
            pacer._next_delay = delay_s
        opt.zero_grad()
        ddp(torch.randn(batch, width, device=dev, generator=gen)).pow(2).mean().backward()
        opt.step()

    return model, step, pacer


def train(
    dev: Any, gather: str | None, iters: int = 20, cuda_resolve: str = "next_iteration"
) -> tuple[Any, Any]:
    """Train :func:`setup`'s model ``iters`` iterations; returns ``(flattened parameters, pacer or None)``."""
    import torch

    model, step, pacer = setup(dev, gather, cuda_resolve)
    for _ in range(iters):
        step(0.0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if pacer is not None:
        pacer.flush()  # the figures still in flight
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()]), pacer


def end_to_end(
    dev: Any, gather: str, plain_params: Any, iters: int = 20, cuda_resolve: str = "next_iteration"
) -> tuple[dict[str, Any], bool]:
    """Check 5 for one exchange mode: every iteration observed, finite, parameters equal plain DDP's."""
    import torch

    params, pacer = train(dev, gather, iters, cuda_resolve)
    it = np.array([o.iteration_time_s for o in pacer.observations])
    record = {
        "iterations": len(pacer.observations),
        "iteration_median_s": float(np.median(it)),
        "gather_median_s": float(np.median(pacer.gather_s)),
        "max_abs_param_diff_vs_plain": float((params - plain_params).abs().max()),
    }
    ok = (
        len(pacer.observations) == iters
        and bool(np.isfinite(it).all())
        and bool(torch.allclose(params, plain_params, rtol=1e-5, atol=1e-6))
    )
    return record, ok


def delayed_run(
    dev: Any,
    delay_s: float = 0.005,
    iters: int = 20,
    gather: str = "collective",
    cuda_resolve: str = "next_iteration",
    width: int = 1024,
    batch: int = 64,
) -> tuple[dict[str, Any], bool]:
    """Check 5b: a fixed delay inside DDP's backward delays the collective's entry by itself, and
    lengthens the iteration by no more than itself and no less than the max-plus bound.

    Two copies of the model train in turn, one iteration each (so machine drift hits both; each
    pacer's iteration clock restarts at its own step, see :meth:`Pacer.align`): one with no delay,
    one with ``delay_s`` on every iteration (``gather`` exchange, ``cuda_resolve``). Per iteration pair: the arrival
    shift (delayed minus undelayed arrival at the paced collective), the iteration growth, and the
    delayed run's natural arrival (arrival minus delay) minus the undelayed arrival. Passes when
    (medians):

    - the arrival shift is within 0.2 ``delay_s`` of the wait as run (the collective entered that
      much later; :attr:`Pacer.delay_actual_s`, on CUDA from an event before the device-side wait:
      ``torch.cuda._sleep`` counts SM cycles, calibrated at the clock of the moment);
    - the growth is at most the wait as run plus 0.1 ``delay_s`` (delaying one input of a max can
      lengthen it by no more than the delay) and at least 0.8 of ``wait - slack``, where ``slack`` is the undelayed
      iteration's time after its arrival (the delayed iteration cannot end before its delayed
      arrival). On CPU the host delay blocks the training thread, so the backward after bucket 0
      waits too and the growth is the whole delay. On CUDA the delay is a device-side wait on the
      pacing stream and the compute stream goes on (checks 2-4): the rest of the backward overlaps
      it, and the growth is the delay minus that overlap (first device run, 2026-11-30: arrival
      +4.97 ms, growth +3.21 ms for a 5 ms delay, slack 2.11 ms). When the slack exceeds the wait
      the lower bound is 0 and says nothing (recorded as ``growth_lower_bound_vacuous``);
    - the natural arrival is within 0.5 ``delay_s`` of the undelayed arrival, and every
      observation records the applied delay.

    The first 2 iterations are left out (DDP rebuilds its buckets after iteration 0).
    """
    import torch

    runs = [setup(dev, gather, cuda_resolve, width, batch) for _ in range(2)]
    for _ in range(iters):
        for (_, step, pacer), delay in zip(runs, (0.0, delay_s), strict=True):
            # Restart its iteration clock here, after the device has finished the other model's
            # step: every step starts from an idle device, so neither model's step runs from work
            # queued behind the other's (what failed run 3's deferred-resolution check).
            pacer.align()
            step(delay)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    for _, _, pacer in runs:
        pacer.flush()
    obs0, obs1 = (pacer.observations[2:] for _, _, pacer in runs)
    it0 = np.array([o.iteration_time_s for o in obs0])
    it1 = np.array([o.iteration_time_s for o in obs1])
    arr0 = np.array([o.arrival_s[0] for o in obs0])
    arr1 = np.array([o.arrival_s[0] for o in obs1])
    nat1 = np.array([o.natural_arrival_s[0] for o in obs1])
    applied = [float(o.applied_delay_s[0]) for o in obs1]
    waited = np.array(runs[1][2].delay_actual_s[2:])  # the device-side wait as run (CPU: host delay)
    record: dict[str, Any] = {
        "delay_s": delay_s,
        "workload": f"mlp width {width} depth 4 batch {batch}",
        "iteration_median_s": {"undelayed": float(np.median(it0)), "delayed": float(np.median(it1))},
        "iteration_longer_by_median_s": float(np.median(it1 - it0)),
        "arrival_later_by_median_s": float(np.median(arr1 - arr0)),
        "delay_as_run_median_s": float(np.median(waited)),
        "delay_as_run_p10_p90_s": [float(np.percentile(waited, 10)), float(np.percentile(waited, 90))],
        "slack_after_arrival_median_s": float(np.median(it0 - arr0)),
        "arrival_median_s": {"undelayed": float(np.median(arr0)), "delayed": float(np.median(arr1))},
        "natural_minus_undelayed_arrival_median_s": float(np.median(nat1 - arr0)),
        "applied_delay_s": sorted(set(applied)),
        # host time of each iteration's completion (device times, decode, decision, exchange): with
        # cuda_resolve="next_iteration" it runs at the first bucket, before the delay is queued
        "complete_host_median_s": {
            "undelayed": float(np.median(runs[0][2].complete_s[2:])),
            "delayed": float(np.median(runs[1][2].complete_s[2:])),
        },
    }
    record["host_time_in_arrival_s"] = record["arrival_later_by_median_s"] - record["delay_as_run_median_s"]
    if dev.type == "cpu":  # host delay: hook call and enter are on one clock (on CUDA, enter is device time)
        paced = runs[1][2]
        record["hook_call_to_enter_min_s"] = min(
            m["enter_s"][0] - m["hook_call_s"][0] for m in paced.marks[2:]
        )
    return record, _judge(record, delay_s, applied)


def _judge(record: dict[str, Any], delay_s: float, applied: list[float]) -> bool:
    """The forced-delay criteria of :func:`delayed_run` on ``record`` (its bounds are added to it)."""
    growth = record["iteration_longer_by_median_s"]
    wait = record["delay_as_run_median_s"]
    record["growth_lower_bound_s"] = max(0.0, wait - record["slack_after_arrival_median_s"])
    record["growth_lower_bound_vacuous"] = record["growth_lower_bound_s"] == 0.0
    return (
        abs(record["arrival_later_by_median_s"] - record["delay_as_run_median_s"]) <= 0.2 * delay_s
        # (a vacuous lower bound, 0, gets the upper bound's noise margin)
        and 0.8 * record["growth_lower_bound_s"] - 0.1 * delay_s * record["growth_lower_bound_vacuous"]
        <= growth
        <= wait + 0.1 * delay_s
        # piggyback carries float32 (hi, lo) pairs: ~48 bits of the applied delay come back
        and bool(np.allclose(applied, delay_s, rtol=1e-12, atol=0.0))
        and abs(record["natural_minus_undelayed_arrival_median_s"]) < 0.5 * delay_s
    )


def delayed_loop(
    dev: Any,
    delay_s: float = 0.005,
    rounds: int = 6,
    block: int = 5,
    gather: str = "piggyback",
    cuda_resolve: str = "next_iteration",
    width: int = 4096,
    batch: int = 1024,
) -> tuple[dict[str, Any], bool]:
    """Check 5c: :func:`delayed_run`'s criteria on one model trained as a real loop trains it.

    No :meth:`Pacer.align` between steps: the host runs ahead of the device as it would in
    training, and with ``cuda_resolve="next_iteration"`` each first bucket waits for the previous
    iteration's end on the device, behind a delay that may still be running. Blocks of ``block``
    undelayed and ``block`` delayed iterations alternate for ``rounds`` rounds; an iteration is
    compared only when the one before it had the same delay (the first of each block is a
    transition), undelayed against delayed, by medians. Arrival and iteration time come from the
    pacer's device marks (one chain on device time).
    """
    import torch

    _, step, pacer = setup(dev, gather, cuda_resolve, width, batch)
    for _ in range(3):  # DDP rebuilds its buckets after iteration 0
        step(0.0)
    pacer.flush()  # the warm-up's figures stay in the warm-up's log
    pacer.align()
    pacer.reset_log()
    for _ in range(rounds):
        for delay in (0.0, delay_s):
            for _ in range(block):
                pacer._next_delay = delay  # step() forces only a delay, not its end
                step(delay)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    pacer.flush()
    obs = pacer.observations
    if not len(obs) == len(pacer.delay_actual_s) == len(pacer.complete_s) == rounds * 2 * block:
        raise RuntimeError(
            f"{len(obs)} observations, {len(pacer.delay_actual_s)} delays as run and "
            f"{len(pacer.complete_s)} completions for {rounds * 2 * block} iterations"
        )
    applied = np.array([float(o.applied_delay_s[0]) for o in obs])
    same = np.r_[False, applied[1:] == applied[:-1]]  # not the first of a block
    slow, fast = same & (applied > 0), same & (applied == 0)
    it = np.array([o.iteration_time_s for o in obs])
    arr = np.array([o.arrival_s[0] for o in obs])
    waited = np.array(pacer.delay_actual_s)
    record: dict[str, Any] = {
        "delay_s": delay_s,
        "workload": f"mlp width {width} depth 4 batch {batch}, one model, no align() between steps",
        "iterations_compared": {"undelayed": int(fast.sum()), "delayed": int(slow.sum())},
        "iteration_median_s": {
            "undelayed": float(np.median(it[fast])),
            "delayed": float(np.median(it[slow])),
        },
        "iteration_longer_by_median_s": float(np.median(it[slow]) - np.median(it[fast])),
        "arrival_later_by_median_s": float(np.median(arr[slow]) - np.median(arr[fast])),
        "delay_as_run_median_s": float(np.median(waited[slow])),
        "slack_after_arrival_median_s": float(np.median(it[fast] - arr[fast])),
        "arrival_median_s": {
            "undelayed": float(np.median(arr[fast])),
            "delayed": float(np.median(arr[slow])),
        },
        "natural_minus_undelayed_arrival_median_s": float(
            np.median(arr[slow] - applied[slow]) - np.median(arr[fast])
        ),
        "applied_delay_s": sorted(set(applied[slow].tolist())),
        "complete_host_median_s": {
            "undelayed": float(np.median(np.array(pacer.complete_s)[fast])),
            "delayed": float(np.median(np.array(pacer.complete_s)[slow])),
        },
    }
    record["host_time_in_arrival_s"] = record["arrival_later_by_median_s"] - record["delay_as_run_median_s"]
    return record, _judge(record, delay_s, record["applied_delay_s"])


def _commit() -> str | None:
    """The checked-out commit (with ``+dirty`` when the tree has changes), or None outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check the CUDA/NCCL pacing path on one GPU: device-delay precision, host and compute "
        "stream not blocked, the collective really delayed, DDP end to end in each exchange mode, a "
        "forced delay inside DDP, and the zero-delay cost of comm hooks and the pacer against plain DDP. "
        "Exit 77 without CUDA, 1 if a check failed (or the watchdog fired), 2 if the set-up failed. About "
        "a minute.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "results"),
        help="results folder (written as gpu_check.json) or a .json file; with the device tool: $OUT",
    )
    parser.add_argument(
        "--watchdog-s",
        type=float,
        default=270.0,
        help="after this many seconds print every thread's stack and exit 1 (the record so far is kept)",
    )
    parser.add_argument(
        "--checks",
        default="all",
        help="comma-separated steps to run (e.g. device_delay_precision,ddp_delay_applied), or all",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="dry run of this script on a 1-rank gloo group on CPU (host delay, no CUDA-only steps): "
        "checks the harness before device time is spent; its figures mean nothing for the GPU",
    )
    args = parser.parse_args(argv)
    wanted = None if args.checks == "all" else set(args.checks.split(","))
    if wanted is not None:
        unknown = sorted(wanted - set(STEPS))
        if unknown:
            print(
                f"gpu_check: error: unknown --checks {unknown}; the steps are {list(STEPS)}", file=sys.stderr
            )
            return 2
        if wanted & set(NEEDS_PLAIN):
            wanted.add("ddp_plain")
    target = Path(args.out)
    target = target if target.suffix == ".json" else target / "gpu_check.json"
    import torch
    import torch.distributed as dist

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: skipped: CUDA is not available", file=sys.stderr)
        return 77
    faulthandler.dump_traceback_later(args.watchdog_s, exit=True)
    t_start = time.perf_counter()
    out: dict[str, Any] = {"torch": torch.__version__, "commit": _commit(), "complete": False}
    checks: dict[str, bool] = {}

    def save() -> None:
        out["checks"] = checks
        out["elapsed_s"] = time.perf_counter() - t_start
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(out, indent=2) + "\n")
        partial.replace(target)

    def step(name: str, fn: Callable[[], None]) -> None:
        """Run one check; an exception fails it (recorded) and the next one runs."""
        assert name in STEPS, name
        if wanted is not None and name not in wanted:
            return
        if args.cpu and name in CUDA_ONLY:
            out.setdefault("skipped", []).append(name)
            print(f"gpu_check: {name}: skipped (CUDA only)", flush=True)
            return
        print(f"gpu_check: {name} ...", flush=True)
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - record the failure, run the other checks
            out[name] = {"error": f"{type(err).__name__}: {err}"}
            checks[name] = False
        print(f"gpu_check: {name}: {'error' if 'error' in out.get(name, {}) else 'done'}", flush=True)
        save()

    os.environ.setdefault("NCCL_DEBUG", "WARN")
    try:
        from pacectl.torchdist.launch import free_port
        from pacectl.torchdist.pacer import DeviceDelay

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        if args.cpu:
            from pacectl.torchdist.pacer import Pacer

            out["device"] = "cpu (dry run: --cpu; CUDA's deferred resolution forced on)"
            dev = torch.device("cpu")
            # the bookkeeping of cuda_resolve="next_iteration" is device-agnostic: run it here too
            Pacer._on_device = staticmethod(lambda closed: True)  # type: ignore[method-assign]
            dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=60))
        else:
            out["device"] = torch.cuda.get_device_name(0)
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            torch.cuda.set_device(0)
            dev = torch.device("cuda", 0)
            dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=60))
            dd = DeviceDelay(dev)
            out["cycles_per_s"] = dd.cycles_per_s
            out["calibration_rates"] = dd.calibration_rates
    except Exception as err:  # noqa: BLE001 - the record says why nothing ran
        out["setup_error"] = f"{type(err).__name__}: {err}"
        save()
        print(f"gpu_check: set-up failed: {out['setup_error']}", file=sys.stderr)
        return 2
    save()

    def precision() -> None:
        """Check 1: device-delay error; the stream is kept busy first, so both events are device-timed."""
        result = {}
        for req in (1e-4, 1e-3, 1e-2):
            errs = []
            for _ in range(50):
                with torch.cuda.stream(dd.stream):
                    torch.cuda._sleep(int(1e-3 * dd.cycles_per_s))  # covers the host time below
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(dd.stream)
                dd.paced_stream(req)
                b.record(dd.stream)
                b.synchronize()
                errs.append(a.elapsed_time(b) / 1e3 - req)
            result[f"{req * 1e3:g}ms"] = {
                "median_error_s": float(np.median(errs)),
                "p99_error_s": float(np.percentile(errs, 99)),
            }
        out["device_delay_precision"] = result
        checks["precision_1ms_within_5pct"] = abs(result["1ms"]["median_error_s"]) < 5e-5

    def not_blocked() -> None:
        """Checks 2-4: a paced all-reduce with a 10 ms device delay, timed from the current stream."""
        delay = 0.010
        buf = torch.ones(1 << 20, device=dev)
        x = torch.randn(2048, 2048, device=dev)
        dist.all_reduce(buf)  # NCCL's communicator is created at the first collective: not timed
        (x @ x).sum().item()  # cuBLAS set-up: not timed
        torch.cuda.synchronize()
        start_ev, enter_ev, compute_ev, exit_ev = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        t0 = time.perf_counter()
        start_ev.record()  # the pacing stream is ordered after this point
        stream = dd.paced_stream(delay)
        with torch.cuda.stream(stream):
            enter_ev.record(stream)  # after the delay
            work = dist.all_reduce(buf, async_op=True)
        host_s = time.perf_counter() - t0
        y = x @ x  # compute on the current stream, queued after the paced collective
        compute_ev.record()
        work.wait()  # the current stream waits for the collective
        exit_ev.record()
        torch.cuda.synchronize()
        del y
        out["host_issue_s"] = host_s
        out["delay_applied_s"] = start_ev.elapsed_time(enter_ev) / 1e3
        out["collective_done_after_start_s"] = start_ev.elapsed_time(exit_ev) / 1e3
        out["compute_done_after_start_s"] = start_ev.elapsed_time(compute_ev) / 1e3
        checks["host_not_blocked"] = host_s < 0.002
        checks["collective_delayed"] = out["collective_done_after_start_s"] >= 0.95 * delay
        checks["compute_not_blocked"] = out["compute_done_after_start_s"] < 0.5 * delay

    plain: dict[str, Any] = {}

    def plain_ddp() -> None:
        plain["params"], _ = train(dev, None)

    def e2e(gather: str, cuda_resolve: str = "next_iteration") -> Callable[[], None]:
        suffix = gather if cuda_resolve == "next_iteration" else f"{gather}_{cuda_resolve}"

        def run() -> None:
            checks[f"ddp_end_to_end_{suffix}"] = False  # until it has run
            out[f"ddp_{suffix}"], checks[f"ddp_end_to_end_{suffix}"] = end_to_end(
                dev, gather, plain["params"], cuda_resolve=cuda_resolve
            )

        return run

    def delayed(
        gather: str, cuda_resolve: str, width: int = 1024, batch: int = 64
    ) -> tuple[str, Callable[[], None]]:
        name = "ddp_delay_applied" + (
            "" if (gather, cuda_resolve) == ("collective", "next_iteration") else f"_{gather}_{cuda_resolve}"
        )
        name += "" if (width, batch) == (1024, 64) else f"_width{width}_batch{batch}"

        def run() -> None:
            checks[name] = False  # until it has run
            w, b = (min(width, 1024), min(batch, 64)) if args.cpu else (width, batch)  # --cpu: small
            out[name], checks[name] = delayed_run(
                dev, gather=gather, cuda_resolve=cuda_resolve, width=w, batch=b
            )

        return name, run

    # --cpu: the same steps on a tiny model, for the harness only (the record's "workload" says so)
    tiny = {"rounds": 2, "block": 1, "width": 64} if args.cpu else {}

    def delay_in_a_loop() -> None:
        # the default exchange and resolution on a device-bound model, as training runs them
        checks["ddp_delay_in_a_loop"] = False  # until it has run
        size = {"width": 64, "batch": 64} if args.cpu else {}
        out["ddp_delay_in_a_loop"], checks["ddp_delay_in_a_loop"] = delayed_loop(dev, **size)

    def overhead_on_gpu() -> None:
        out["overhead_zero_delay"] = overhead(dev, **tiny)

    def overhead_longer_iteration() -> None:
        out["overhead_zero_delay_batch4096"] = overhead(dev, **{"rounds": 20, **tiny, "batch": 4096})

    import device_physics  # this folder (sys.path[0] when run as a script; the test adds it too)

    def sleep_calibration() -> None:
        out["sleep_calibration"] = device_physics.sleep_calibration(dev, quick=args.cpu)

    def kappa_on_device() -> None:
        out["kappa_on_device"] = device_physics.kappa_on_device(
            dev, **({"rounds": 2, "reps": 3, "quick": True} if args.cpu else {})
        )

    def power_states() -> None:
        out["power_states"] = device_physics.power_states(dev, seconds=0.3 if args.cpu else 2.0)

    def fsdp2_stream() -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2"))
        from cuda_stream_check import check_fsdp2_delay_on_reduce_scatter_stream

        checks["fsdp2_reduce_scatter_stream"] = False  # until it has run
        result = check_fsdp2_delay_on_reduce_scatter_stream()
        out["fsdp2_reduce_scatter_stream"] = result
        checks["fsdp2_reduce_scatter_stream"] = bool(result.get("ok"))

    def fsdp2_all_gather_stream() -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2"))
        from cuda_stream_check import check_fsdp2_delay_on_all_gather_stream

        checks["fsdp2_all_gather_stream"] = False  # until it has run
        result = check_fsdp2_delay_on_all_gather_stream(device=dev)
        out["fsdp2_all_gather_stream"] = result
        checks["fsdp2_all_gather_stream"] = bool(result.get("ok"))

    try:
        step("device_delay_precision", precision)  # CUDA only: with --cpu a "skipped" line
        step("not_blocked", not_blocked)
        step("ddp_plain", plain_ddp)
        for gather in ("piggyback", "async", "collective"):
            step(f"ddp_{gather}", e2e(gather))
        step("ddp_piggyback_iteration_end", e2e("piggyback", "iteration_end"))
        delayed_mode: tuple[Any, ...]
        for delayed_mode in (
            ("collective", "next_iteration"),  # collective always resolves at the iteration's end
            ("piggyback", "iteration_end"),
            # The default resolution: no host sync at the end of a step, so the two models' steps
            # compare like for like only because align() now waits for the device (run 3's did
            # not: its undelayed steps ran from a queue filled behind the delayed model's 5 ms wait,
            # device time only, and the check failed; see the README). Judged on the 1024-wide
            # model (host-bound: the host's decision sits inside both arrivals) and on a 4096-wide
            # one (device-bound: ~4 ms of device work queued after the previous iteration's end).
            ("piggyback", "next_iteration", 4096, 1024),
            ("piggyback", "next_iteration"),
        ):
            step(*delayed(*delayed_mode))
        step("ddp_delay_in_a_loop", delay_in_a_loop)
        step("overhead_zero_delay", overhead_on_gpu)
        step("overhead_zero_delay_batch4096", overhead_longer_iteration)
        step("sleep_calibration", sleep_calibration)
        step("kappa_on_device", kappa_on_device)
        step("power_states", power_states)
        step("fsdp2_reduce_scatter_stream", fsdp2_stream)
        step("fsdp2_all_gather_stream", fsdp2_all_gather_stream)
    finally:
        save()  # before the process group is destroyed, which may wait on NCCL work
        try:
            dist.destroy_process_group()
        except Exception as err:  # noqa: BLE001
            print(f"gpu_check: destroy_process_group: {type(err).__name__}: {err}", file=sys.stderr)
    faulthandler.cancel_dump_traceback_later()
    out["complete"] = True
    save()
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    print(json.dumps(out, indent=2))
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
