"""Measure early-arrival interference (the simulator's ``kappa``) on CPU: how much slower a rank
computes while co-located peers wait, by how they wait.

Four ranks share two cores (every process pinned to CPUs 0 and 1). One rank (the *computing* rank)
runs a fixed backward-like workload (single-threaded float32 GEMMs) while ``k`` of the three others
(``k = 0..3``) wait:

- ``spin``: busy-polling a shared-memory flag (how NCCL's proxy thread and spinning kernels wait);
- ``sleep``: blocked on a pipe read (how gloo's default TCP pair waits: epoll, no polling);
- ``pacer_sleep``: ``time.sleep`` for longer than the work (the pacing delay of the CPU pacer);
- ``gloo`` (``--gloo``): inside a real ``torch.distributed`` gloo all-reduce with the computing rank,
  which joins it after its work.

The slowdown of one trial is its wall time over the same replicate block's ``k = 0`` wall time
(blocks are paired: every cell of a block runs back to back, in random order). ``kappa`` of an arm
is the least-squares slope through the origin of ``slowdown - 1`` on ``k`` (the simulator's model,
:class:`pacectl.fabric.contention.EarlyArrivalInterference`: ``1 + kappa`` per waiting peer),
one slope per block; the interval is Student's t over blocks. The per-``k`` slowdowns are reported
too, because on two cores the response is not linear: one waiting spinner has a free core, two or
three take cores from the computing rank (the host is oversubscribed). The computing rank's CPU
time is recorded beside its wall time: if it stays flat while the wall time grows, the slowdown is
time slicing, not cache or memory-bandwidth interference.

This is the CPU mechanism only (host cores shared by more processes than cores). It says nothing
of a GPU's spinning NCCL kernels against compute kernels: that is ``kappa_on_device`` in
experiments/gpu_check. Other processes on the machine (the load average is recorded before and
after) add noise to every arm alike.

Usage::

    python experiments/interference/measure_kappa.py --blocks 20 --gloo
    python experiments/interference/measure_kappa.py --blocks 2 --work-ms 10 --out /tmp/k  # quick
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ARMS = ("spin", "sleep", "pacer_sleep")
CPUS = {0, 1}
NUM_PEERS = 3


def _pin() -> None:
    if hasattr(os, "sched_setaffinity"):
        available = os.sched_getaffinity(0)
        os.sched_setaffinity(0, CPUS & available or available)


def _work(a: np.ndarray, b: np.ndarray, reps: int) -> float:
    """The computing rank's fixed workload: ``reps`` GEMMs; returns a checksum so it is not elided."""
    acc = 0.0
    for _ in range(reps):
        acc += float((a @ b)[0, 0])
    return acc


def _peer(index: int, conn: Any, flag: Any, gloo_port: int | None) -> None:
    """A waiting rank: on each command it waits the named way, then acknowledges its release."""
    _pin()
    groups: dict[int, Any] = {}
    if gloo_port is not None:
        groups = _init_gloo(index + 1, gloo_port)

    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            break
        mode, k, hold_s = cmd
        if mode == "spin":
            conn.send("in")
            while flag.value == 0:  # busy poll, as a spinning collective waits
                pass
        elif mode == "sleep":
            conn.send("in")
            conn.recv()  # blocked on a pipe read (epoll-like), until released
        elif mode == "pacer_sleep":
            conn.send("in")
            time.sleep(hold_s)  # the pacing delay: longer than the computing rank's work
            conn.recv()
        elif mode == "gloo":
            import torch
            import torch.distributed as dist

            conn.send("in")
            dist.all_reduce(torch.zeros(1), group=groups[k])  # waits inside gloo for rank 0
        conn.send("out")


def _init_gloo(rank: int, port: int) -> dict[int, Any]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=NUM_PEERS + 1
    )
    # group k: the computing rank (0) and peers 1..k; every rank creates every group, in order
    return {k: dist.new_group(list(range(k + 1))) for k in range(1, NUM_PEERS + 1)}


def _computing(conn: Any, shape: int, reps: int, gloo_port: int | None) -> None:
    """The computing rank: on each command it runs the workload and reports wall and CPU time."""
    _pin()
    groups = _init_gloo(0, gloo_port) if gloo_port is not None else {}
    rng = np.random.default_rng(0)
    a = rng.standard_normal((shape, shape), dtype=np.float32)
    b = rng.standard_normal((shape, shape), dtype=np.float32)
    _work(a, b, reps)  # warm
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            break
        mode, k = cmd
        wall0, cpu0 = time.perf_counter(), time.process_time()
        _work(a, b, reps)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if mode == "gloo" and k > 0:
            import torch
            import torch.distributed as dist

            dist.all_reduce(torch.zeros(1), group=groups[k])
        conn.send((wall, cpu))


def _calibrate(shape: int, work_ms: float) -> int:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((shape, shape), dtype=np.float32)
    b = rng.standard_normal((shape, shape), dtype=np.float32)
    _work(a, b, 3)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        _work(a, b, 20)
        best = min(best, (time.perf_counter() - t0) / 20)
    return max(1, round(work_ms / 1e3 / best))


#: the worker processes, so that a reply that never comes is noticed (a child that died)
_PROCS: list[Any] = []


def _recv(conn: Any, timeout_s: float = 60.0) -> Any:
    """A reply from a worker, or RuntimeError if a worker died or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.5):
        dead = [p for p in _PROCS if not p.is_alive()]
        if dead or time.monotonic() > deadline:
            what = f"worker exited with code {dead[0].exitcode}" if dead else f"no reply in {timeout_s:g} s"
            raise RuntimeError(f"measure_kappa: {what}")
    return conn.recv()


def _trial(mode: str, k: int, comp: Any, peers: list[Any], flag: Any, hold_s: float) -> tuple[float, float]:
    active = peers[:k]
    flag.value = 0
    for conn in active:
        conn.send((mode, k, hold_s))
    for conn in active:
        assert _recv(conn) == "in"
    time.sleep(0.01)  # let the waiters reach their waiting loop
    comp.send((mode, k))
    wall, cpu = _recv(comp)
    if mode == "spin":
        flag.value = 1
    elif mode in ("sleep", "pacer_sleep"):
        for conn in active:
            conn.send("go")
    for conn in active:
        assert _recv(conn) == "out"
    return wall, cpu


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def _t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    from scipy import stats

    mean = float(values.mean())
    if values.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size))
    return mean, mean - half, mean + half


def analyse(rows: list[dict[str, Any]], arms: tuple[str, ...]) -> dict[str, Any]:
    """Per arm: slowdown per ``k`` and the fitted ``kappa`` (slope through the origin), with 95 % t
    intervals over blocks. ``rows`` hold ``block, arm, k, wall_s, cpu_s``.

    At ``k = 0`` every arm is the same condition (no waiter), so a block's baseline is the median of
    its arms' ``k = 0`` trials: less noisy than one trial, and free of the ratio bias a single
    shared denominator gives every arm alike (E[X/Y] > E[X]/E[Y]). The ``sleep`` arm's kappa is
    then the null model's zero as this machine measures it (other processes' load)."""
    by = {(r["block"], r["arm"], r["k"]): r for r in rows}
    blocks = sorted({r["block"] for r in rows})
    base_wall = {b: float(np.median([by[(b, a, 0)]["wall_s"] for a in arms])) for b in blocks}
    base_cpu = {b: float(np.median([by[(b, a, 0)]["cpu_s"] for a in arms])) for b in blocks}
    ks = np.arange(1, NUM_PEERS + 1, dtype=float)
    out: dict[str, Any] = {}
    slopes_by_arm: dict[str, np.ndarray] = {}
    for arm in arms:
        slow = np.array(
            [[by[(b, arm, k)]["wall_s"] / base_wall[b] for k in range(1, NUM_PEERS + 1)] for b in blocks]
        )
        cpu = np.array(
            [[by[(b, arm, k)]["cpu_s"] / base_cpu[b] for k in range(1, NUM_PEERS + 1)] for b in blocks]
        )
        slopes = ((slow - 1.0) @ ks) / (ks @ ks)
        slopes_by_arm[arm] = slopes
        kappa, lo, hi = _t_interval(slopes)
        per_k = {}
        for k in range(1, NUM_PEERS + 1):
            m, klo, khi = _t_interval(slow[:, k - 1])
            per_k[str(k)] = {
                "slowdown": m,
                "ci95": [klo, khi],
                "cpu_time_ratio": float(cpu[:, k - 1].mean()),
                "kappa_at_k": (m - 1.0) / k,
            }
        out[arm] = {"kappa": kappa, "kappa_ci95": [lo, hi], "per_k": per_k, "num_blocks": len(blocks)}
    if "sleep" in slopes_by_arm:  # the null: a sleeping waiter; paired per block, other load cancels
        for arm in arms:
            d, dlo, dhi = _t_interval(slopes_by_arm[arm] - slopes_by_arm["sleep"])
            out[arm]["kappa_minus_sleep"] = d
            out[arm]["kappa_minus_sleep_ci95"] = [dlo, dhi]
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# CPU early-arrival interference (kappa), measured",
        "",
        f"4 ranks pinned to 2 cores; computing rank: {result['work']['reps']} GEMMs of "
        f"{result['work']['shape']}x{result['work']['shape']} float32, single-threaded "
        f"(~{result['work']['k0_wall_ms']:.1f} ms alone); {result['num_blocks']} paired blocks in random order; "
        f"load average before/after {result['loadavg_before']} / {result['loadavg_after']} "
        "(the machine is shared with other agents' processes).",
        "",
        "kappa = slope through the origin of (slowdown - 1) on the number k of waiting peers; slowdown = wall time "
        "over the block's median k = 0 wall time; 95 % t interval over blocks.",
        "",
        "The `sleep` arm (a waiter blocked on a pipe read) is the null model: its kappa is 0 by the mechanism, and "
        "what it measures is the other load on the machine. `minus sleep` is the paired difference per block.",
        "",
        "| arm | kappa | 95 % CI | minus sleep | 95 % CI | slowdown k=1 | k=2 | k=3 | CPU-time ratio k=3 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, r in result["arms"].items():
        pk = r["per_k"]
        lines.append(
            f"| {arm} | {r['kappa']:+.3f} | [{r['kappa_ci95'][0]:+.3f}, {r['kappa_ci95'][1]:+.3f}] | "
            + (
                f"{r['kappa_minus_sleep']:+.3f} | [{r['kappa_minus_sleep_ci95'][0]:+.3f}, "
                f"{r['kappa_minus_sleep_ci95'][1]:+.3f}] | "
                if "kappa_minus_sleep" in r
                else "- | - | "
            )
            + " | ".join(f"{pk[str(k)]['slowdown']:.3f}" for k in (1, 2, 3))
            + f" | {pk['3']['cpu_time_ratio']:.3f} |"
        )
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=20, help="paired replicate blocks (default 20)")
    parser.add_argument("--work-ms", type=float, default=60.0, help="computing rank's work alone, ms")
    parser.add_argument("--shape", type=int, default=192, help="GEMM size (default 192)")
    parser.add_argument("--gloo", action="store_true", help="add the real gloo all-reduce waiting arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    parser.add_argument("--reanalyse", type=Path, help="recompute the figures of a kappa_cpu.json's trials")
    args = parser.parse_args(argv)
    if args.reanalyse is not None:
        from pacectl.files import atomic_write_text

        result = json.loads(args.reanalyse.read_text())
        result["arms"] = analyse(result["trials"], tuple(result["arms"]))
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "kappa_cpu.json", json.dumps(result, indent=2) + "\n")
        atomic_write_text(args.out / "kappa_cpu.md", markdown(result))
        print(markdown(result))
        return 0
    if args.blocks < 2 or args.work_ms <= 0:
        print("measure_kappa: --blocks must be >= 2 and --work-ms > 0", file=sys.stderr)
        return 2
    from pacectl.files import atomic_write_text

    _pin()
    arms = ARMS + (("gloo",) if args.gloo else ())
    reps = _calibrate(args.shape, args.work_ms)
    port = random.Random(args.seed).randrange(20000, 40000) if args.gloo else None
    ctx = mp.get_context("spawn")
    flag = ctx.Value("i", 0, lock=False)
    comp_conn, comp_child = ctx.Pipe()
    procs = [ctx.Process(target=_computing, args=(comp_child, args.shape, reps, port), daemon=True)]
    peer_conns = []
    for i in range(NUM_PEERS):
        parent, child = ctx.Pipe()
        peer_conns.append(parent)
        procs.append(ctx.Process(target=_peer, args=(i, child, flag, port), daemon=True))
    load_before = _loadavg()
    _PROCS[:] = procs
    for p in procs:
        p.start()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    hold_s = 0.0
    failed = None
    try:
        # warm-up block (dropped), which also sizes the pacer's sleep
        for arm in arms:
            for k in range(NUM_PEERS + 1):
                wall, _ = _trial(arm, k, comp_conn, peer_conns, flag, hold_s=1.0)
                hold_s = max(hold_s, 3.0 * wall)
        for block in range(args.blocks):
            cells = [(arm, k) for arm in arms for k in range(NUM_PEERS + 1)]
            rng.shuffle(cells)
            for arm, k in cells:
                wall, cpu = _trial(arm, k, comp_conn, peer_conns, flag, hold_s)
                rows.append({"block": block, "arm": arm, "k": k, "wall_s": wall, "cpu_s": cpu})
    except RuntimeError as err:
        failed = str(err)
    finally:
        for conn in [comp_conn, *peer_conns]:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    if failed is not None:
        print(f"{failed}; nothing written", file=sys.stderr)
        return 1
    k0 = np.median([r["wall_s"] for r in rows if r["k"] == 0])
    result = {
        "what": "CPU early-arrival interference: computing-rank slowdown per waiting co-located peer",
        "command": " ".join(["python experiments/interference/measure_kappa.py", *(argv or sys.argv[1:])]),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "pinned_cpus": sorted(CPUS),
        "num_ranks": NUM_PEERS + 1,
        "work": {"shape": args.shape, "reps": reps, "k0_wall_ms": float(k0) * 1e3},
        "pacer_sleep_s": hold_s,
        "num_blocks": args.blocks,
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "arms": analyse(rows, arms),
        "trials": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "kappa_cpu.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(args.out / "kappa_cpu.md", markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
