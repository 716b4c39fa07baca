"""A live positive control: two 2-rank gloo DDP jobs sharing one capped uplink (issue 21, item 5).

Run as root (network namespaces, ``tc tbf``)::

    python experiments/netns_fabric/two_jobs.py                       # ~15 minutes on 2 cores
    python experiments/netns_fabric/two_jobs.py --replicates 2 --arms none,phase --iters 12   # a look

Topology (``netns_fabric.build`` with two rank namespaces): ``pcf-r0`` (10.77.0.10) and ``pcf-r1``
(10.77.0.11) on a bridge; ``pcf-r0``'s link capped with ``tc tbf`` both ways. Job ``a`` and job ``b``
each have rank 0 in ``pcf-r0`` and rank 1 in ``pcf-r1``, so both jobs' all-reduces cross the one
capped link. Compute is emulated by a sleep (``workload.model: sleep``: ``compute_s`` slept per
iteration, then the forward and backward of one bias-free linear layer on a batch of one row, whose
``width^2`` float32 gradients are the all-reduce), so the two cores carry only the network stack.
Each job alone spends about a quarter of its iteration in its all-reduce (``--compute-s``,
``--width``, ``--rate-mbit``): together they load the link to about half its capacity, so it is not
saturated, and interleaved neither need slow the other. ``--period-ratio-b 2`` gives job b twice
a's compute sleep, straggler sleep and all-reduce bytes (width times sqrt(2)): the same duty,
commensurate unequal periods (as ``cluster=shared_uplink`` in the simulator), and b's random
offset is drawn over b's period.

Arms: ``none``; the per-rank controllers (both jobs run the same one, each rank 1 a persistent
straggler: ``--straggler-s`` more sleep every iteration, so that they engage); ``phase`` (both jobs,
different seeds). Every (arm, replicate) is its own run: a fresh DDP model, pacer and controller in
each job, started at a gate (``pacectl.torchdist.worker.wait_at_gate``) that the coordinator opens
for both jobs at once, job ``b`` a random offset in ``[0, period)`` later; the warm-up iterations
(unpaced; 2: DDP rebuilds its buckets after the first) and then ``--settle`` measured ones (0) are
dropped. No phase carries over: each run starts from its own offset after both jobs have idled at
the gate. The warm-up is kept short on purpose: live, two colliding jobs drift apart on their own
within about ten iterations (the TCP flow that started first keeps the larger share, so the later
job ends later and its next all-reduce starts later; the simulator's max-min fair sharing has no
such drift), so the collision a random offset makes is a transient at the start of each run, and a
long dropped warm-up would drop it. The runs are in a random order. The
ranks' processes and process groups are reused across runs (saving the 2-core machine ~10 s of
start-up per run); nothing else is.

Per arm: each job's throughput and the sum, mean over replicates with a 95 % t interval, and the
change against ``none`` (Welch interval). Mechanism: link sharing between jobs (real flows, tc tbf);
its parameters are measured or set here (rate, bytes, compute); the null for per-rank delays is
zero (a delay within earliness does not move the collective: DESIGN.md fact 2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import netns_fabric as nf  # noqa: E402
import numpy as np  # noqa: E402

JOBS = ("a", "b")
PORTS = {"a": 29611, "b": 29612}
PER_RANK = ("threshold", "pid", "ewma", "quantile", "forecast")


# --- inside a rank ------------------------------------------------------------------------------


def rank_main(spec_path: str, job: str, rank: int) -> int:
    """One rank of one job: every run of the schedule, each after the gate, its record to disk."""
    import torch.distributed as dist

    from pacectl.torchdist.worker import LiveRun, wait_at_gate

    spec = json.loads(Path(spec_path).read_text())
    os.environ.update(MASTER_ADDR=f"{nf.SUBNET}.10", MASTER_PORT=str(PORTS[job]), GLOO_SOCKET_IFNAME="pceth")
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="env://")
    work = Path(spec["work"])
    try:
        for i, (arm, params, _replicate) in enumerate(spec["schedule"]):
            run_spec = {
                **spec["run"],
                "workload": {**spec["run"]["workload"], **spec.get("workload_by_job", {}).get(job, {})},
                "straggler": {**spec["run"]["straggler"], **spec.get("straggler_by_job", {}).get(job, {})},
                "seed": int(spec["seed"]) * 1000 + i * 2 + JOBS.index(job),  # jobs never in lockstep
                "record_dir": str(work / job / f"run{i:03d}"),
            }
            run = LiveRun(run_spec, arm, params)
            wait_at_gate(work / f"gate{i:03d}.json", job)
            run.train(run.total)
            result = run.finish()
            if rank == 0:
                (work / job / f"done{i:03d}").write_text(json.dumps({"episode": result.get("episode_path")}))
            del run
    finally:
        dist.destroy_process_group()
    return 0


# --- the coordinator ------------------------------------------------------------------------------


def _schedule(args: argparse.Namespace) -> list[tuple[str, dict[str, Any], int]]:
    from omegaconf import OmegaConf

    from pacectl.config import shipped_controller

    live = OmegaConf.create({"backend": {"name": "torch", "pacing": {"gather": "auto", "gather_every": 1}}})
    arms = [a for a in args.arms.split(",") if a]
    # phase without its switch-off (rule 5 of pacectl.controllers.phase): a run of a few dozen
    # iterations is shorter than its unpaced baseline window, so the default would never shift
    no_switch_off = {"phase": {"switch_off_iters": None}}
    runs = [
        (arm, {} if arm == "none" else {**shipped_controller(arm, live), **no_switch_off.get(arm, {})}, r)
        for arm in arms
        for r in range(args.replicates)
    ]
    random.Random(args.seed).shuffle(runs)
    return runs


def _compute_b_s(args: argparse.Namespace) -> float:
    """Job b's compute sleep per iteration, s: ``--period-ratio-b`` times a's."""
    return float(args.compute_s * args.period_ratio_b)


def _width_b(args: argparse.Namespace) -> int:
    """Job b's layer width: its all-reduce ``--period-ratio-b`` times a's bytes (same duty)."""
    return int(round(args.width * args.period_ratio_b**0.5))


def _period_b_s(args: argparse.Namespace) -> float:
    """Job b's period alone, s (the range of its random offset)."""
    return float((args.compute_s + args.comm_s_estimate) * args.period_ratio_b)


def _episode(path: Path) -> Any:
    import pickle

    with open(path, "rb") as fh:
        return pickle.load(fh)["episode"]


def _throughput(episode: Any, settle: int) -> float:
    """Iterations per second over the measured iterations after the first ``settle``."""
    import numpy as np

    it = np.asarray(episode.iteration_time_s, dtype=float)[settle:]
    return float(len(it) / it.sum())


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: each job's and the sum's throughput, mean with a 95 % t interval over replicates,
    and the change against ``none`` (difference of means over none's mean, Welch interval)."""
    import numpy as np
    from scipy import stats

    out: dict[str, Any] = {}
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for arm in arms:
        sub = [r for r in rows if r["arm"] == arm]
        out[arm] = {}
        for key in ("a", "b", "sum"):
            x = np.array([r[key] for r in sub])
            half = (
                float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
                if len(x) > 1
                else float("nan")
            )
            cell: dict[str, Any] = {
                "mean_it_per_s": float(x.mean()),
                "ci95": [float(x.mean()) - half, float(x.mean()) + half],
                "n": len(x),
            }
            if arm != "none" and "none" in arms:
                y = np.array([r[key] for r in rows if r["arm"] == "none"])
                if len(x) > 1 and len(y) > 1:
                    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
                    cell["change_frac"] = float(x.mean() / y.mean() - 1)
                    cell["change_ci95_frac"] = [float(ci.low / y.mean()), float(ci.high / y.mean())]
            out[arm][key] = cell
    return out


def coordinate(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Start the four ranks, open each run's gate for both jobs, collect each run's throughput."""
    import dataclasses

    from pacectl.torchdist.core import TorchConfig

    torch_cfg = dataclasses.asdict(TorchConfig())  # backend=torch's defaults
    schedule = _schedule(args)
    period_s = _period_b_s(args)
    rng = random.Random(args.seed + 1)
    offsets = [rng.uniform(0.0, period_s) if args.offset_s is None else args.offset_s for _ in schedule]
    run_spec = {
        "workload": {
            "model": "sleep",
            "width": args.width,
            "depth": 1,
            "batch_size": 1,
            "compute_s": args.compute_s,
            "bucket_cap_mb": 64.0,  # one bucket: the all-reduce is one flow per direction
            "num_iterations": args.iters,
            "warmup_iterations": args.warmup,
        },
        "straggler": {
            **torch_cfg["straggler"],
            "rank": 1,
            "prob": 1.0,
            "duration_s": args.straggler_s,
            "jitter_frac": 0.2,
        },
        "guard": {"max_delay_frac": 0.5, "window_iters": 32, "max_delay_s": None},
        "pacing": {**torch_cfg["pacing"]},
        "pg_timeout_s": 120.0,
        "comm_model": f"live-gloo-netns-two-jobs-tbf{args.rate_mbit:g}mbit",
        "threads": 1,
    }
    spec = {
        "schedule": schedule,
        "run": run_spec,
        "workload_by_job": {"b": {"compute_s": _compute_b_s(args), "width": _width_b(args)}},
        "straggler_by_job": {"b": {"duration_s": args.straggler_s * args.period_ratio_b}},
        "seed": args.seed,
        "work": str(work),
    }
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    for job in JOBS:
        (work / job).mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    procs = []
    for job in JOBS:
        for rank in (0, 1):
            cmd = ["ip", "netns", "exec", f"{nf.PREFIX}r{rank}", sys.executable, str(Path(__file__).resolve()),
                   "--rank-main", str(spec_path), job, str(rank)]  # fmt: skip
            log = open(work / f"{job}{rank}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        for i, (arm, _, replicate) in enumerate(schedule):
            start = time.time() + args.gate_lead_s
            gate = {"start_unix_s": {"a": start, "b": start + offsets[i]}, "offset_s": offsets[i]}
            tmp = work / f"gate{i:03d}.json.tmp"
            tmp.write_text(json.dumps(gate))
            tmp.replace(work / f"gate{i:03d}.json")
            deadline = time.time() + args.run_timeout_s
            while not all((work / job / f"done{i:03d}").exists() for job in JOBS):
                # a rank that exited non-zero is a failure; one that exited cleanly has finished its
                # schedule (on the last run the job that finishes first exits while the other still
                # runs), and a clean exit without its done file is caught by the deadline
                failed = [p.poll() not in (None, 0) for p in procs]
                if any(failed) or time.time() > deadline:
                    tails = "\n".join(
                        (work / f"{j}{r}.log").read_text(errors="replace")[-1200:]
                        for j in JOBS
                        for r in (0, 1)
                    )
                    raise RuntimeError(
                        f"run {i} ({arm}) did not finish: exit codes {[p.poll() for p in procs]}\n{tails}"
                    )
                time.sleep(0.2)
            row: dict[str, Any] = {"run": i, "arm": arm, "replicate": replicate, "offset_s": offsets[i]}
            for job in JOBS:
                episode = _episode(work / job / f"run{i:03d}" / f"{arm}.episode.pkl")
                row[job] = _throughput(episode, args.settle)
                # every measured iteration (settle included), so the record shows the phases move
                row[f"{job}_iteration_s"] = [round(float(x), 5) for x in episode.iteration_time_s]
                row[f"{job}_collective_s"] = [round(float(x), 5) for x in np.ravel(episode.collective_time_s)]
                row[f"{job}_delay_total_s"] = float(np.sum(episode.applied_delay_s))
            row["sum"] = row["a"] + row["b"]
            rows.append(row)
            print(f"[{time.time() - t0:6.0f} s] run {i + 1}/{len(schedule)} {arm:>9} (replicate {replicate}, "
                  f"offset {offsets[i] * 1e3:.0f} ms): a {row['a']:.3f} b {row['b']:.3f} sum {row['sum']:.3f} it/s",
                  flush=True)  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)
    return rows


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    """The simulator's prediction for the same parameters (``conf/cluster/netns_two_jobs.yaml``,
    :mod:`pacectl.backends.multijob`): the same arms, replicates, seeds and random offsets, each
    replicate a seeded episode of ``warmup + iters`` iterations whose first ``warmup + settle``
    are dropped (the warm-up unpaced, as live: pacing from the warm-up's end is not modelled, so
    the simulated controllers act from the first iteration)."""
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, controller_families
    from pacectl.experiment import make_experiment

    schedule = _schedule(args)
    period_s = _period_b_s(args)
    rng = random.Random(args.seed + 1)
    offsets = [rng.uniform(0.0, period_s) if args.offset_s is None else args.offset_s for _ in schedule]
    compute = {0: args.compute_s, 1: _compute_b_s(args)}  # b's straggler scales with it: factor alike
    rows = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for i, (arm, _, replicate) in enumerate(schedule):
            overrides = [
                "backend=sim",
                "cluster=netns_two_jobs",
                "comm=contention",
                "backend.num_ranks=4",
                f"backend.num_iterations={args.warmup + args.iters}",
                f"seed={args.seed * 1000 + i}",
                f"controller={arm}",
                f"cluster.topology.nic_bandwidth_Bps={args.rate_mbit * 1e6 / 8}",
                f"cluster.collective.message_bytes={4 * args.width**2}",
                f"+cluster.jobs.1.message_bytes={4 * _width_b(args) ** 2}",
                f"cluster.jobs.1.start_s={offsets[i]}",
                *[f"cluster.jobs.{j}.compute.compute_s={compute[j]}" for j in (0, 1)],
                *[
                    f"cluster.jobs.{j}.compute.noise.1.factor={(args.compute_s + args.straggler_s) / args.compute_s}"
                    for j in (0, 1)
                ],
            ]
            cfg = compose("config", overrides=overrides)
            experiment = make_experiment(cfg)
            families = controller_families(cfg)
            episode = experiment.run(arm, families[arm])
            per_job = np.asarray(episode.domain_iteration_time_s)[args.warmup + args.settle :]
            row: dict[str, Any] = {"run": i, "arm": arm, "replicate": replicate, "offset_s": offsets[i]}
            for j, job in enumerate(JOBS):
                row[job] = float(len(per_job) / per_job[:, j].sum())
            row["sum"] = row["a"] + row["b"]
            rows.append(row)
    return {
        "what": "the simulator's prediction (pacectl.backends.multijob, conf/cluster/netns_two_jobs.yaml) for the "
        "live two-job run with the same parameters",
        "command": "python experiments/netns_fabric/two_jobs.py --simulate",
        "arms": analyse(rows),
        "runs": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rank-main", nargs=3, metavar=("SPEC", "JOB", "RANK"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--arms", default="none," + ",".join(PER_RANK) + ",phase", help="comma-separated controller families"
    )
    parser.add_argument("--replicates", type=int, default=10, help="runs per arm (random order)")
    parser.add_argument(
        "--iters", type=int, default=30, help="measured iterations per run (after the warm-up)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="unpaced warm-up iterations per run (dropped)")
    parser.add_argument(
        "--settle", type=int, default=0, help="first measured iterations dropped from every arm"
    )
    parser.add_argument(
        "--compute-s", type=float, default=0.25, help="compute emulated by a sleep, s per iteration"
    )
    parser.add_argument(
        "--width", type=int, default=512, help="linear layer width: width^2 float32 gradients"
    )
    parser.add_argument(
        "--rate-mbit", type=float, default=100.0, help="tc tbf cap of the shared link, Mbit/s"
    )
    parser.add_argument(
        "--comm-s-estimate", type=float, default=0.09, help="one job's all-reduce alone, s (offsets)"
    )
    parser.add_argument(
        "--straggler-s", type=float, default=0.03, help="rank 1's extra sleep every iteration, s"
    )
    parser.add_argument(
        "--period-ratio-b",
        type=float,
        default=1.0,
        help="job b's compute, straggler sleep and all-reduce bytes as a multiple of a's (2: commensurate "
        "unequal periods)",
    )
    parser.add_argument(
        "--offset-s",
        type=float,
        default=None,
        help="a fixed offset of job b instead of random ones (diagnostics)",
    )
    parser.add_argument(
        "--gate-lead-s", type=float, default=1.0, help="seconds from opening a gate to the start"
    )
    parser.add_argument("--run-timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--simulate", action="store_true", help="the simulator's prediction instead (no root needed)"
    )
    parser.add_argument("--out", default=None, help="the record (.json); default results/two_jobs[_sim].json")
    args = parser.parse_args(argv)
    if args.rank_main:
        spec, job, rank = args.rank_main
        return rank_main(spec, job, int(rank))
    if args.replicates < 2 or args.iters <= args.settle:
        parser.error(
            f"--replicates must be >= 2 and --iters > --settle, got {args.replicates} and {args.iters}"
        )
    from pacectl.files import atomic_write_text

    if args.simulate:
        out = Path(args.out or HERE / "results" / "two_jobs_sim.json")
        result = simulate(args)
        result["parameters"] = {k: v for k, v in vars(args).items() if k not in ("rank_main", "out")}
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(result, indent=2) + "\n")
        _print(result, out)
        return 0
    reason = nf.preflight()
    if reason:
        print(f"two_jobs: skipped: {reason}", file=sys.stderr)
        return 77

    def on_signal(signum: int, frame: Any) -> None:
        nf.cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    nf.cleanup()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.time()
    try:
        nf.build(2, args.rate_mbit)
        with tempfile.TemporaryDirectory(prefix="pcf-2j-") as tmp:
            rows = coordinate(args, Path(tmp))
    except RuntimeError as err:
        print(f"two_jobs: {err}", file=sys.stderr)
        return 1
    finally:
        nf.cleanup()
    result = {
        "what": "two 2-rank gloo DDP jobs (compute = sleep) sharing one tc-tbf-capped link; per arm, each job's "
        "throughput and the sum over replicates",
        "command": " ".join(
            ["python experiments/netns_fabric/two_jobs.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "parameters": {k: v for k, v in vars(args).items() if k not in ("rank_main", "out")},
        "gradient_bytes": 4 * args.width**2,
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "wall_time_s": time.time() - t0,
        "arms": analyse(rows),
        "runs": rows,
    }
    out = Path(args.out or HERE / "results" / "two_jobs.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    _print(result, out)
    return 0


def _print(result: dict[str, Any], out: Path) -> None:
    print(f"results: {out}")
    for arm, r in result["arms"].items():
        parts = []
        for key in ("a", "b", "sum"):
            c = r[key]
            ch = (
                f" ({100 * c['change_frac']:+.1f} % [{100 * c['change_ci95_frac'][0]:+.1f}, {100 * c['change_ci95_frac'][1]:+.1f}])"
                if "change_frac" in c
                else ""
            )
            parts.append(f"{key} {c['mean_it_per_s']:.3f}{ch}")
        print(f"{arm:>10}: " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
