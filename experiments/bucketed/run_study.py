"""What DDP's bucket overlap does to every controller's gain: 4 buckets against 1, across the
on-device overlap slowdown, on ``cluster=paper_like`` with ``comm=contention``.

Cells (64 ranks, each the mean over seeds; every controller family of ``controller=all`` plus
``sleep_wait``, against no pacing on the same draws):

- ``B=1``: the single all-reduce model (the slowdown cannot act: no compute overlaps a collective);
- ``B=4``, ``pacer=device``, ``noise=spread`` and ``noise=instant``, at overlap slowdowns 0, 0.1,
  0.189 (the sourced default, Lee et al., arXiv 2507.03114: mean), 0.4 (their maximum) and 0.8
  (beyond any measurement here: the "nearly doubles" of a GEMM's tail effect under an all-gather
  reported on NVIDIA's forum);
- ``B=4``, ``pacer=host`` (the CPU/gloo pacer's sleep holds back the rest of backward) at 0.189;
- the same with early-arrival interference off (``kappa=0``), so that each mechanism shows alone;
- ``comm=null`` with B=1 and B=4: fixed durations, no compute-side mechanism: max-plus, the zero.

Usage (from the repository root; about 15 minutes on 2 shared cores)::

    python experiments/bucketed/run_study.py               # writes experiments/bucketed/results/
    python experiments/bucketed/run_study.py --iterations 200 --seeds 1 --out /tmp/quick
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
from hydra import initialize_config_dir

from pacectl.config import CONF_DIR
from pacectl.errors import one_line_warnings
from pacectl.files import staged_outputs
from pacectl.studies import change_text, markdown_table, sim_cell, study_arguments

RANKS = 64
FAMILIES = ("threshold", "pid", "ewma", "quantile", "forecast", "sleep_wait")
SLOWDOWNS = (0.0, 0.1, 0.189, 0.4, 0.8)


def cells() -> list[dict[str, object]]:
    """Every cell of the study: its labels and its overrides."""
    out: list[dict[str, object]] = []

    def add(comm: str, buckets: int, slowdown: float | None, pacer: str, noise: str, kappa: str) -> None:
        overrides = [f"comm={comm}", f"cluster.buckets.count={buckets}"]
        if slowdown is not None:
            overrides.append(f"cluster.buckets.overlap_slowdown={slowdown}")
        overrides += [f"cluster.buckets.pacer={pacer}", f"cluster.buckets.noise={noise}"]
        if kappa == "0":
            overrides.append("cluster.interference.kappa=0")
        out.append(
            {
                "comm": comm,
                "buckets": buckets,
                "overlap_slowdown": slowdown if buckets > 1 and comm == "contention" else None,
                "pacer": pacer if buckets > 1 else "-",
                "noise": noise if buckets > 1 else "-",
                "kappa": "0.05 (profile)" if kappa == "profile" else "0",
                "overrides": overrides,
            }
        )

    for kappa in ("profile", "0"):
        add("contention", 1, None, "device", "spread", kappa)
        for noise in ("spread", "instant"):
            for g in SLOWDOWNS if kappa == "profile" else (0.0, 0.189):
                add("contention", 4, g, "device", noise, kappa)
            add("contention", 4, 0.189, "host", noise, kappa)
    for buckets in (1, 4):
        add("null", buckets, None, "device", "instant" if buckets > 1 else "spread", "profile")
    return out


def main() -> None:
    args = study_arguments(
        __doc__, iterations=1500, seeds=3, out=Path(__file__).parent / "results", min_iterations=20
    )
    one_line_warnings()
    load_before = os.getloadavg()
    rows: list[dict[str, object]] = []
    t0 = time.perf_counter()
    families = "[" + ",".join(FAMILIES) + "]"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for spec in cells():
            overrides = [*spec["overrides"], "controller=all", f"controller.families={families}"]  # type: ignore[misc]
            result = sim_cell(
                overrides, cluster="paper_like", num_ranks=RANKS, iterations=args.iterations, seeds=args.seeds
            )
            base = result["none"]
            for family, cell in result.items():
                rows.append(
                    {
                        **{k: v for k, v in spec.items() if k != "overrides"},
                        "controller": family,
                        "comm_timing_dependent": cell["comm_timing_dependent"],
                        "iteration_time_mean_s": cell["iteration_time_mean_s"],
                        "throughput_change_frac": cell["throughput_it_per_s"] / base["throughput_it_per_s"]
                        - 1.0,
                        "throughput_change_ci95_frac": cell["throughput_change_ci95_frac"],
                        "cv": cell["cv"],
                    }
                )
            print(f"[{time.perf_counter() - t0:6.1f} s] {' '.join(spec['overrides'])}", flush=True)  # type: ignore[arg-type]
    frame = pd.DataFrame(rows)
    paced = frame[frame["controller"] != "none"]
    wide = paced.assign(
        change=change_text(paced["throughput_change_frac"], paced["throughput_change_ci95_frac"])
    ).pivot_table(
        index=["comm", "kappa", "buckets", "pacer", "noise", "overlap_slowdown"],
        columns="controller",
        values="change",
        aggfunc="first",
        dropna=False,
        sort=False,
    )
    wide = wide.dropna(how="all")[list(FAMILIES)].reset_index()
    base = frame[frame["controller"] == "none"][
        ["comm", "kappa", "buckets", "pacer", "noise", "overlap_slowdown", "iteration_time_mean_s"]
    ].rename(columns={"iteration_time_mean_s": "none: mean iteration (s)"})
    wide = wide.merge(base, on=["comm", "kappa", "buckets", "pacer", "noise", "overlap_slowdown"], how="left")
    meta = {
        "command": "python experiments/bucketed/run_study.py"
        + (f" --iterations {args.iterations}" if args.iterations != 1500 else "")
        + (f" --seeds {args.seeds}" if args.seeds != 3 else ""),
        "cluster": "paper_like",
        "num_ranks": RANKS,
        "iterations": args.iterations,
        "seeds": args.seeds,
        "wall_s": time.perf_counter() - t0,
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "gain": "mean throughput of the controller over that of no pacing, minus 1, same draws; "
        "± the 95 % batch-means half-width combined over seeds",
    }
    with staged_outputs(args.out) as out:
        frame.to_csv(out / "bucketed.csv", index=False)
        (out / "bucketed.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
        (out / "bucketed.md").write_text(
            "Throughput change vs no pacing (%), paper_like, 64 ranks "
            f"({args.seeds} seeds x {args.iterations} iterations)\n\n" + markdown_table(wide) + "\n"
        )
    print(markdown_table(wide))


if __name__ == "__main__":
    main()
