"""Across-seed intervals for the multi-job study, from its committed record.

The study's ``±`` (``combined_half_width`` in :mod:`pacectl.studies`) combines each run's own paired
batch-means half-width: it counts the noise inside a run, not the spread between seeds, and each seed
also draws job b's initial offset, which drives the outcome. This script reads
``results/multi_job.csv`` and gives, per scenario and controller, the mean over seeds of the
throughput change with a Student-t 95 % interval over the per-seed values, the per-seed range, and
how many seeds each job lost in.

    python experiments/multi_job/seed_intervals.py        # writes results/seed_intervals.md
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).resolve().parent


def main() -> None:
    df = pd.read_csv(HERE / "results" / "multi_job.csv", keep_default_na=False, na_values=[""])
    df = df[df["controller"] != "none"]
    rows = []
    for (scenario, controller), g in df.groupby(["scenario", "controller"], sort=False):
        s = g[g["job"] == "sum"].sort_values("seed")["throughput_change_frac"].to_numpy() * 100
        n = len(s)
        half = float(stats.t.ppf(0.975, n - 1) * s.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        jobs = [job for job in dict.fromkeys(g["job"]) if job != "sum"]
        losses = [int((g[g["job"] == job]["throughput_change_frac"] < 0).sum()) for job in jobs]
        rows.append(
            f"| {scenario} | {controller} | {s.mean():+.2f} ±{half:.2f} | {s.min():+.2f} to {s.max():+.2f} "
            f"| {' / '.join(map(str, losses))} of {n} ({'/'.join(jobs)}) |"
        )
    head = (
        "# Across-seed intervals (from results/multi_job.csv; `python experiments/multi_job/seed_intervals.py`)\n\n"
        "Sum over jobs: mean over seeds of the throughput change, ± the Student-t 95 % half-width over the\n"
        "per-seed values (each seed draws the later jobs' initial offsets too), the per-seed range, and the\n"
        "seeds in which each job lost throughput.\n\n"
        "| scenario | controller | change (%) | per seed (%) | seeds lost, per job |\n|---|---|---|---|---|\n"
    )
    out = HERE / "results" / "seed_intervals.md"
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text(head + "\n".join(rows) + "\n")
    tmp.replace(out)
    print(out.read_text())


if __name__ == "__main__":
    main()
