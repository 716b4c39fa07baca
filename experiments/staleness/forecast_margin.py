"""How the forecast controller's safety margin trades gain against harm, at each decision lag.

``controller=forecast`` (``pacectl/controllers/forecast.py``) delays each rank by its AR(1)
earliness forecast for the iteration the delay lands on, less ``margin_sigmas`` forecast-error
standard deviations. This sweep shows the whole curve behind the shipped default (1.0): the margin
values x the decision lags of ``run_study.py`` (lag 1, 2, 4) on the real step-time profiles
(``alibaba_pai``, ``h200_gloo4``), the synthetic timing-dependent one (``paper_like``, 8 ranks) and
the max-plus control (``comm=null``, 64 ranks: no margin can make pacing gain there; a larger one
only loses less). The default was chosen by an exploratory sweep like this one (3 seeds x 1,000
iterations of the same profiles); this one, on seeds 0-4, confirms it, so the forecast rows of
``run_study.py`` are in-sample for the margin. ``experiments/tuning`` judges the family on held-out
seeds.

Usage (from the repository root; about 2.5 minutes on 2 cores)::

    python experiments/staleness/forecast_margin.py     # writes experiments/staleness/results/forecast_margin.*
    python experiments/staleness/forecast_margin.py --iterations 300 --seeds 1 --out /tmp/quick
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import initialize_config_dir

from pacectl import metrics
from pacectl.config import CONF_DIR
from pacectl.errors import one_line_warnings
from pacectl.files import atomic_path, staged_outputs
from pacectl.studies import change_text, combined_half_width, markdown_table, sim_episodes, study_arguments

#: (name, cluster profile, ranks, comm)
SCENARIOS = (
    ("alibaba_pai", "alibaba_pai", 8, "contention"),
    ("h200_gloo4", "h200_gloo4", 4, "contention"),
    ("paper_like", "paper_like", 8, "contention"),
    ("null_model", "paper_like", 64, "null"),
)
MARGINS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
LAGS = (1, 2, 4)


def cell(
    cluster: str, num_ranks: int, comm: str, lag: int, margin: float, iterations: int, seeds: int
) -> dict[str, float | bool]:
    """Throughput change of ``forecast`` against no pacing over seeds (the ratio of the mean throughputs,
    as ``run_study.py``'s), with its 95 % half-width, and the mean CV."""
    paced_tp, base_tp, half_widths, cvs = [], [], [], []
    for seed in range(seeds):
        episodes = sim_episodes(
            [
                f"comm={comm}",
                f"exchange.lag_iters={lag}",
                "controller=forecast",
                f"controller.margin_sigmas={margin}",
            ],
            cluster=cluster,
            num_ranks=num_ranks,
            iterations=iterations,
            seed=seed,
        )
        base, paced = metrics.summarize(episodes["none"]), metrics.summarize(episodes["forecast"])
        paced_tp.append(paced["throughput_it_per_s"])
        base_tp.append(base["throughput_it_per_s"])
        half_widths.append(metrics.paired_change_ci95_frac(episodes["none"], episodes["forecast"]))
        cvs.append(paced["cv"])
    return {
        "comm_timing_dependent": bool(base["comm_timing_dependent"]),
        "throughput_change_frac": float(np.mean(paced_tp) / np.mean(base_tp) - 1.0),
        "throughput_change_ci95_frac": combined_half_width(half_widths),
        "cv": float(np.mean(cvs)),
    }


def plot(frame: pd.DataFrame, path: Path) -> None:
    """One panel per scenario: throughput change vs margin, one line per lag."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(SCENARIOS), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(SCENARIOS), sharey=True)
    for ax, (name, _, ranks, comm) in zip(axes, SCENARIOS, strict=True):
        sub = frame[frame["scenario"] == name]
        for lag in LAGS:
            rows = sub[sub["lag_iters"] == lag]
            ax.errorbar(
                rows["margin_sigmas"],
                100 * rows["throughput_change_frac"],
                yerr=100 * rows["throughput_change_ci95_frac"],
                marker="o",
                markersize=3,
                capsize=2,
                label=f"lag {lag}",
            )
        ax.axhline(0.0, color="black", linewidth=1.0)
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=1.0)
        fixed = "\n(fixed durations: pacing cannot gain)" if comm == "null" else ""
        ax.set_title(f"{name}, {ranks} ranks{fixed}", fontsize=9)
        ax.set_xlabel("margin_sigmas (default 1.0, dotted)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("throughput change vs no pacing (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle("controller=forecast: the safety margin, at each decision lag (horizon_iters = lag)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def main() -> None:
    args = study_arguments(
        __doc__, iterations=2000, seeds=5, out=Path(__file__).parent / "results", min_iterations=20
    )
    one_line_warnings()
    rows: list[dict[str, object]] = []
    t0 = time.perf_counter()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for name, cluster, ranks, comm in SCENARIOS:
            for lag in LAGS:
                for margin in MARGINS:
                    result = cell(cluster, ranks, comm, lag, margin, args.iterations, args.seeds)
                    rows.append(
                        {
                            "scenario": name,
                            "num_ranks": ranks,
                            "comm": comm,
                            "lag_iters": lag,
                            "margin_sigmas": margin,
                            **result,
                        }
                    )
            print(f"[{time.perf_counter() - t0:6.1f} s] {name} {ranks} ranks done", flush=True)
    frame = pd.DataFrame(rows)
    wide = frame.assign(
        change=change_text(frame["throughput_change_frac"], frame["throughput_change_ci95_frac"])
    ).pivot(index=["scenario", "num_ranks", "comm", "lag_iters"], columns="margin_sigmas", values="change")
    wide.columns = [f"margin {m:g}" for m in wide.columns]
    wide = wide.reindex([(n, r, c, lag) for n, _, r, c in SCENARIOS for lag in LAGS]).reset_index()
    legend = (
        f"Throughput change of controller=forecast against no pacing (horizon_iters = lag), means over "
        f"{args.seeds} seed(s) of {args.iterations} iterations, +- the 95 % half-width of the paired "
        "change. comm null is the max-plus control (fixed durations: no margin can make pacing gain). "
        "The shipped default is margin 1.\n\n"
    )
    with staged_outputs(args.out) as stage:
        frame.to_csv(stage / "forecast_margin.csv", index=False)
        (stage / "forecast_margin.md").write_text(legend + markdown_table(wide))
        plot(frame, stage / "forecast_margin.png")
    print(f"written: {args.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
