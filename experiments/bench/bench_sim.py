"""Benchmark: one simulated episode of 1,024 ranks over 10,000 iterations (goal: under 5 s on 2 cores).

Usage::

    python experiments/bench/bench_sim.py                 # writes results/sim.json
    python experiments/bench/bench_sim.py --ranks 64 --iterations 1000
    python experiments/bench/bench_sim.py --buckets 1 4 --out experiments/bench/results/sim_buckets.json

Scenario: the ``paper_like`` cluster profile with ``comm=contention`` (max-min fair fat-tree with
staggered cross traffic on every leaf uplink, plus early-arrival interference), the heaviest model.
Each controller family runs behind the safety guard through the one driver loop, recording every
per-rank observation; the figure is the wall time of ``SimExperiment.run`` (draws included).
``--buckets`` runs the same with ``cluster.buckets.count`` set to each value (bucketed backward,
:mod:`pacectl.fabric.overlap`, with its default overlap slowdown), one after the other in one process.
The record holds the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from _record import write_record
from hydra import compose, initialize_config_dir

from pacectl.config import CONF_DIR, controller_families
from pacectl.experiment import SimExperiment


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim.json")
    parser.add_argument(
        "--buckets",
        type=int,
        nargs="*",
        default=None,
        help="cluster.buckets.count values (default: the profile's)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
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


if __name__ == "__main__":
    main()
