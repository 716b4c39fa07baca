"""Rerun the staleness study's alibaba_pai scenario on the series' real time axis (2026-12-01).

The Alibaba PAI series samples every 10th iteration; until this rerun the simulator replayed
consecutive samples as consecutive iterations, so the study's lags of 1, 2 and 4 were 10, 20 and 40
real iterations. Now ``conf/cluster/alibaba_pai.yaml`` fills the 9 iterations between samples with an
AR(1) bridge matching the samples' lag-10 autocorrelation (``pacectl.fabric.noise.EmpiricalSamples``,
``fill: ar1``). This script runs that one scenario with the study's schedules, controllers, seeds and
iterations and writes ``results/alibaba_pai_real_axis.csv`` and ``.md`` (the other scenarios do not
use the series and are unchanged).

    python experiments/staleness/rerun_alibaba.py [--iterations 2000] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_study import scenario_rows, scenario_runs  # noqa: E402

from pacectl.data import DATA_DIR  # noqa: E402
from pacectl.fabric.noise import EmpiricalSamples  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    t0 = time.perf_counter()
    from hydra import initialize_config_dir

    from pacectl.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        runs = scenario_runs("alibaba_pai", 8, ["comm=contention"], args.iterations, args.seeds)
        rows = scenario_rows("alibaba_pai", "alibaba_pai", 8, runs, args.seeds)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "alibaba_pai_real_axis.csv", index=False)
    lines = [
        "| controller | "
        + " | ".join(
            f"lag {lag}, every {every}"
            for lag, every in frame.groupby(["lag_iters", "every_iters"], sort=False).groups
        )
        + " |"
    ]
    lines.append("| --- |" + " --- |" * frame.groupby(["lag_iters", "every_iters"]).ngroups)
    for family, sub in frame.groupby("controller", sort=False):
        if family == "none":
            continue
        cells = [
            f"{r.throughput_change_frac * 100:+.2f} ±{r.throughput_change_ci95_frac * 100:.2f} %"
            for r in sub.itertuples()
        ]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    noise = EmpiricalSamples(str(DATA_DIR / "alibaba-pai" / "job_1_norm.csv"))
    meta = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "iterations": args.iterations,
        "seeds": args.seeds,
        "compute_noise": noise.describe(),
        "no_pacing_cv": float(frame[frame["controller"] == "none"]["cv"].mean()),
        "wall_time_s": time.perf_counter() - t0,
        "loadavg": os.getloadavg(),
        "machine": "2 cores shared by several engineers",
    }
    (args.out / "alibaba_pai_real_axis.md").write_text(
        "\n".join(lines) + "\n\n" + f"compute noise: {meta['compute_noise']}\n"
    )
    (args.out / "alibaba_pai_real_axis.json").write_text(json.dumps(meta, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
