"""The staleness study's gains as a function of the assumed interference strength ``kappa``.

Every gain in ``experiments/staleness`` rests on the simulator's early-arrival interference
(``kappa``: slowdown per spinning co-located peer, *assumed* 0.05 in the paper_like-based profiles;
see ``experiments/interference`` for what was measured): the scenarios where pacing gained are
one-node or one-leaf jobs, where the cross traffic touches no link the collective uses. This sweeps
``kappa`` over 0 to 0.2 for those scenarios at the live exchange's two lags (1: ``gather=async``, the
gloo default; 2: ``gather=piggyback``, the NCCL default), every per-rank controller and
``sleep_wait`` beside no pacing. At ``kappa = 0`` these scenarios have no timing-dependent mechanism
left, so no controller can gain there: the null model's zero, shown beside every gain.

Usage (from the repository root)::

    python experiments/staleness/kappa_sweep.py                    # writes results/kappa_sweep.*
    python experiments/staleness/kappa_sweep.py --iterations 200 --seeds 1 --out /tmp/ks
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
from hydra import initialize_config_dir

from pacectl.config import CONF_DIR
from pacectl.errors import one_line_warnings
from pacectl.files import staged_outputs
from pacectl.studies import change_text, kappa_sweep, markdown_table, plot_kappa_sweep, study_arguments

KAPPAS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
LAGS = (1, 2)
#: the staleness study's scenarios where pacing gained (name, cluster profile, ranks)
SCENARIOS = (
    ("paper_like", "paper_like", 8),
    ("contended", "contended", 32),
    ("alibaba_pai", "alibaba_pai", 8),
    ("h200_gloo4", "h200_gloo4", 4),
)


def main() -> None:
    args = study_arguments(__doc__, iterations=1000, seeds=3, out=Path(__file__).parent / "results")
    one_line_warnings()
    rows = []
    t0 = time.perf_counter()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for name, cluster, n in SCENARIOS:
            for lag in LAGS:
                for row in kappa_sweep(
                    ["comm=contention", f"exchange.lag_iters={lag}"],
                    cluster=cluster,
                    num_ranks=n,
                    kappas=KAPPAS,
                    iterations=args.iterations,
                    seeds=args.seeds,
                ):
                    rows.append(
                        {
                            "scenario": f"{name} {n}, lag {lag}",
                            "cluster": cluster,
                            "num_ranks": n,
                            "lag_iters": lag,
                            **row,
                        }
                    )
                print(f"[{time.perf_counter() - t0:6.1f} s] {name} {n} lag {lag} done", flush=True)
    frame = pd.DataFrame(rows)
    table = frame.assign(
        throughput_change=lambda f: change_text(
            f["throughput_change_frac"], f["throughput_change_ci95_frac"]
        ),
        comm=lambda f: f["comm_timing_dependent"].map({True: "timing-dep.", False: "fixed"}),
    )[["scenario", "kappa", "comm", "controller", "throughput_it_per_s", "throughput_change", "cv"]]
    legend = (
        f"comm=contention; means over {args.seeds} seed(s) of {args.iterations} iterations; throughput_change "
        "against no pacing at the same kappa and lag, +- 95 % paired half-width. kappa is assumed (swept); "
        "comm 'fixed': no timing-dependent mechanism at that kappa, so no controller can gain (the null "
        "model's zero).\n\n"
    )
    meta = {
        "iterations": args.iterations,
        "seeds": args.seeds,
        "kappas": list(KAPPAS),
        "lags": list(LAGS),
        "scenarios": [list(s) for s in SCENARIOS],
        "kappa_source": "assumed (swept)",
        "wall_time_s": time.perf_counter() - t0,
    }
    with staged_outputs(args.out) as stage:
        frame.to_csv(stage / "kappa_sweep.csv", index=False)
        (stage / "kappa_sweep.md").write_text(legend + markdown_table(table))
        plot_kappa_sweep(
            frame,
            "scenario",
            stage / "kappa_sweep.png",
            "staleness scenarios: throughput change vs kappa (assumed)",
        )
        (stage / "kappa_sweep_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"written: {args.out} ({meta['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
