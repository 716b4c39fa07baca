"""Benchmark: one simulated episode of 1,024 ranks over 10,000 iterations (goal: under 5 s on 2 cores).

Usage::

    python experiments/bench/bench_sim.py                 # writes results/sim.json
    python experiments/bench/bench_sim.py --ranks 64 --iterations 1000
    python experiments/bench/bench_sim.py --buckets 1 4 --out experiments/bench/results/sim_buckets.json
    python experiments/bench/bench_sim.py --command --ranks 4096 16384 65536 --iterations 1000 \
        --against /tmp/old --against-ranks 4096 --out experiments/bench/results/sim_streamed.json
    python experiments/bench/bench_sim.py --command --ranks 1024 4096 16384 --iterations 250 1000 4000 \
        --out experiments/bench/results/sim_memory.json     # peak RSS over ranks and iterations

Scenario: the ``paper_like`` cluster profile with ``comm=contention`` (max-min fair fat-tree with
staggered cross traffic on every leaf uplink, plus early-arrival interference), the heaviest model.
Each controller family runs behind the safety guard through the one driver loop, recording every
per-rank observation; the figure is the wall time of ``SimExperiment.run`` (draws included).
``--buckets`` runs the same with ``cluster.buckets.count`` set to each value (bucketed backward,
:mod:`pacectl.fabric.overlap`, with its default overlap slowdown), one after the other in one process.
``--command`` instead runs the whole command a user types, ``python -m pacectl.run backend=sim
... comm=contention cluster=paper_like output.iterations=false`` (no pacing and every controller of
``controller=all``; the runs stream, :func:`pacectl.loop.run_episode`'s ``reduce``), once per
``--ranks`` value (for each ``--iterations`` value, where several are given), and records its wall time, CPU time, the child's peak RSS (``ru_maxrss`` from
``os.wait4``, :func:`_record.timed_command`), its bytes per rank-iteration, and the 1-minute
load when it started; with ``--against DIR`` the same command with ``PYTHONPATH=DIR`` (another
checkout) at the ``--against-ranks`` sizes, after each of this checkout's at that size, and both
summaries compared: ``summary_identical_to_this`` (every number within ``1e-9`` relative) and
``summary_bit_identical`` (every value equal).
The record holds the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _record import timed_command, write_record
from hydra import compose, initialize_config_dir

from pacectl.config import CONF_DIR, controller_families
from pacectl.experiment import SimExperiment


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024])
    parser.add_argument(
        "--iterations", type=int, nargs="+", default=[10_000], help="with --command: each with each --ranks"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim.json")
    parser.add_argument(
        "--buckets",
        type=int,
        nargs="*",
        default=None,
        help="cluster.buckets.count values (default: the profile's)",
    )
    parser.add_argument("--command", action="store_true", help="whole pacectl.run commands, streamed")
    parser.add_argument("--against", type=Path, default=None, help="another checkout (with --command)")
    parser.add_argument("--against-ranks", type=int, nargs="*", default=[])
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.command:
        rows = [
            row
            for iterations in args.iterations
            for row in whole_commands(args.ranks, iterations, args.against, set(args.against_ranks))
        ]
        write_record(
            args.out,
            rows,
            iterations=args.iterations[0] if len(args.iterations) == 1 else args.iterations,
            scenario="python -m pacectl.run backend=sim comm=contention cluster=paper_like output.iterations=false",
            command=" ".join(["python", *sys.argv]),
            against=args.against,
            loadavg_before=list(load_before),
            loadavg_after=list(os.getloadavg()),
            cpu_count=os.cpu_count(),
        )
        return
    args.ranks, args.iterations = args.ranks[0], args.iterations[0]
    rows = []
    for buckets in args.buckets or [None]:
        extra = [] if buckets is None else [f"cluster.buckets.count={buckets}"]
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    "backend=sim",
                    "cluster=paper_like",
                    "comm=contention",
                    f"backend.num_ranks={args.ranks}",
                    f"backend.num_iterations={args.iterations}",
                    *extra,
                ],
            )
        experiment = SimExperiment(cfg)
        for family, params in controller_families(cfg).items():
            t0 = time.perf_counter()
            experiment.run(family, params)
            wall = time.perf_counter() - t0
            row = {"controller": family, "wall_s": wall, "us_per_iteration": wall / args.iterations * 1e6}
            if buckets is not None:
                row = {"buckets": buckets, **row}
            rows.append(row)
            print(
                f"{'' if buckets is None else f'{buckets} bucket(s) '}{family:>10}: {args.ranks} ranks x "
                f"{args.iterations} iterations in {wall:.2f} s ({wall / args.iterations * 1e6:.0f} us/iteration)",
                flush=True,
            )
    write_record(
        args.out,
        rows,
        ranks=args.ranks,
        iterations=args.iterations,
        scenario="cluster=paper_like comm=contention",
        command=" ".join(["python", *sys.argv]),
        loadavg_before=list(load_before),
        loadavg_after=list(os.getloadavg()),
        cpu_count=os.cpu_count(),
    )


def _command(ranks: int, iterations: int, out: Path, pythonpath: Path) -> dict[str, Any]:
    """One whole streamed command in a child (:func:`_record.timed_command`): its wall time, CPU
    time, peak RSS and the load when it started."""
    cmd = [
        sys.executable,
        "-m",
        "pacectl.run",
        "backend=sim",
        f"backend.num_ranks={ranks}",
        f"backend.num_iterations={iterations}",
        "comm=contention",
        "cluster=paper_like",
        "output.iterations=false",
        f"hydra.run.dir={out}",
    ]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return {**timed_command(cmd, cwd=pythonpath, env=env), "summary": out / "summary.json"}


def _same(a: Any, b: Any) -> bool:
    """Two summary.json values equal, floats within 1e-9 relative (the wall time is not compared)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a if k != "wall_time_s")
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def whole_commands(
    ranks: list[int], iterations: int, against: Path | None, against_ranks: set[int]
) -> list[dict[str, Any]]:
    """``--command``: each size with this checkout, and with ``against`` at ``against_ranks``."""
    here = Path(__file__).resolve().parents[2]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            checkouts = [("this", here)] + ([("against", against)] if against and n in against_ranks else [])
            done = {}
            for label, path in checkouts:
                done[label] = _command(n, iterations, Path(tmp) / f"{label}-{n}", path)
                row = {"checkout": label, "ranks": n, "iterations": iterations}
                row.update({k: v for k, v in done[label].items() if k != "summary"})
                row["rank_iterations_per_s"] = 6 * n * iterations / row["wall_s"]  # none + five families
                rows.append(row)
                row["bytes_per_rank_iteration"] = row["peak_rss_mb"] * 2**20 / (n * iterations)
                print(
                    f"{label:>7} {n:>6} ranks x {iterations} iterations: {row['wall_s']:.1f} s "
                    f"(CPU {row['cpu_s']:.1f} s, load {row['load_1min']:.1f}), peak {row['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
            if len(done) == 2:
                a, b = (json.loads(d["summary"].read_text()) for d in done.values())
                same = _same(a["runs"], b["runs"])
                a.pop("wall_time_s", None)
                b.pop("wall_time_s", None)
                rows[-1]["summary_identical_to_this"] = same
                rows[-1]["summary_bit_identical"] = a == b
                print(f"        summaries identical (1e-9): {same}, bit for bit: {a == b}", flush=True)
    return rows


if __name__ == "__main__":
    main()
