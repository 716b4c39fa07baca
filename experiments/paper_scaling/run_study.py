"""The paper's scaling experiment, honestly: CV and throughput from 4 to 1,024 ranks, per controller,
per mechanism.

Usage (from the repository root; about 3-4 minutes on 2 cores)::

    python experiments/paper_scaling/run_study.py                  # writes experiments/paper_scaling/results/
    python experiments/paper_scaling/run_study.py --iterations 300 --seeds 1 --out /tmp/quick
    python experiments/paper_scaling/run_study.py --launcher joblib --launcher-arg hydra.launcher.n_jobs=8
    python experiments/paper_scaling/run_study.py --launcher submitit_slurm --launcher-arg hydra.launcher.partition=cpu

``--launcher`` runs every (scale, seed) as a job of a Hydra sweep of ``pacectl.run`` through that
launcher (``pacectl.studies.launched_cells``), with the same figures as the in-process loop.

Scenarios (all on the ``paper_like`` cluster profile, ``conf/cluster/paper_like.yaml``, whose
compute noise is calibrated so that no pacing gives CV ~0.22 at 64 ranks):

- ``paper_like``: comm=contention: cross traffic on oversubscribed uplinks + early-arrival interference;
- ``null_model``: the same compute noise, comm=null (fixed durations, no interference): pacing cannot gain;
- ``interference_only`` / ``cross_traffic_only``: one timing-dependent mechanism at a time;
- ``small_scale``: the paper_like scenario at 4 and 8 ranks, where the paper saw a slight loss.

Every controller runs with its constructor defaults (``controller=<family>``) behind the default
safety guard, on the same seeded compute-time draws as no pacing, beside ``sleep_wait`` (no delay,
waits asleep: the bar where early-arrival interference is the mechanism). Figures are means over
seeds. ``kappa_sweep.py`` sweeps the assumed interference strength and gives the ceilings.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pandas as pd
from hydra import initialize_config_dir

from pacectl.config import CONF_DIR
from pacectl.errors import one_line_warnings
from pacectl.files import atomic_path, staged_outputs
from pacectl.studies import (
    SWEEP_FAMILIES,
    change_text,
    comm_text,
    launched_cells,
    markdown_table,
    sim_cell,
    study_arguments,
)

SCALES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
SCENARIOS: dict[str, tuple[list[str], tuple[int, ...]]] = {
    "paper_like": (["comm=contention"], SCALES),
    "null_model": (["comm=null"], SCALES),
    "interference_only": (["comm=contention", "cluster.cross_traffic.links=[]"], SCALES),
    "cross_traffic_only": (["comm=contention", "cluster.interference.kappa=0.0"], SCALES),
    "small_scale": (["comm=contention"], (4, 8)),
}


def plot(frame: pd.DataFrame, column: str, label: str, path: Path, scale: float = 1.0) -> None:
    """One panel per scenario (shared y axis), metric x ``scale`` against ranks, one line per controller.
    ``small_scale`` is not drawn: it repeats ``paper_like`` at 4 and 8 ranks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scenarios = [s for s in SCENARIOS if s != "small_scale"]
    fig = Figure(figsize=(4.2 * len(scenarios), 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(scenarios), sharey=True)
    for ax, scenario in zip(axes, scenarios, strict=True):
        sub = frame[frame["scenario"] == scenario]
        for family, rows in sub.groupby("controller", sort=False):
            style = (
                {"color": "black", "linewidth": 2.2} if family == "none" else {"marker": "o", "markersize": 3}
            )
            ax.plot(rows["num_ranks"], scale * rows[column], label=family, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_title(scenario)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{label} vs scale (paper_like cluster; null_model = fixed durations, pacing cannot gain)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def main() -> None:
    args = study_arguments(__doc__, iterations=1500, seeds=3, out=Path(__file__).parent / "results")
    one_line_warnings()
    # the comm column says where a model is fixed-duration; each distinct warning still shows once
    rows = []
    t0 = time.perf_counter()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"), tempfile.TemporaryDirectory() as sweeps:
        for scenario, (overrides, scales) in SCENARIOS.items():
            launched = (
                launched_cells(
                    [*overrides, SWEEP_FAMILIES],
                    cluster="paper_like",
                    scales=scales,
                    iterations=args.iterations,
                    seeds=args.seeds,
                    launcher=args.launcher,
                    launcher_overrides=args.launcher_arg,
                    sweep_dir=Path(sweeps) / scenario,
                )
                if args.launcher
                else None
            )
            for n in scales:
                cell = (
                    launched[n]
                    if launched is not None
                    else sim_cell(  # every per-rank family and sleep_wait (the interference baseline)
                        [*overrides, SWEEP_FAMILIES],
                        cluster="paper_like",
                        num_ranks=n,
                        iterations=args.iterations,
                        seeds=args.seeds,
                    )
                )
                base = cell["none"]
                for family, s in cell.items():
                    rows.append(
                        {
                            "scenario": scenario,
                            "num_ranks": n,
                            "controller": family,
                            **s,
                            "throughput_change_frac": s["throughput_it_per_s"] / base["throughput_it_per_s"]
                            - 1,
                            "cv_change": s["cv"] - base["cv"],
                        }
                    )
                best = max(cell, key=lambda f: cell[f]["throughput_it_per_s"])
                model = f"{base['comm_model']}, {'timing-dependent' if base['comm_timing_dependent'] else 'fixed durations'}"
                print(
                    f"[{time.perf_counter() - t0:6.1f} s] {scenario:>18} {n:5d} ranks ({model}): no pacing CV "
                    f"{base['cv']:.3f}, best {best} ({cell[best]['throughput_it_per_s'] / base['throughput_it_per_s'] - 1:+.2%} "
                    f"±{cell[best]['throughput_change_ci95_frac']:.2%} throughput, CV {cell[best]['cv']:.3f})",
                    flush=True,
                )
    frame = pd.DataFrame(rows)
    table = frame.assign(
        throughput_change=lambda f: change_text(
            f["throughput_change_frac"], f["throughput_change_ci95_frac"]
        ),
        comm=comm_text,
    )[
        [
            "scenario",
            "num_ranks",
            "comm",
            "controller",
            "throughput_it_per_s",
            "throughput_change",
            "iteration_time_mean_s",
            "iteration_time_p99_s",
            "cv",
            "spread_median_s",
        ]
    ]
    meta = {
        "iterations": args.iterations,
        "seeds": args.seeds,
        "scales": list(SCALES),
        "wall_time_s": time.perf_counter() - t0,
    }
    legend = (
        f"Means over {args.seeds} seed(s) of {args.iterations} iterations. throughput_change: against no "
        "pacing, +- the 95 % half-width of the paired change (per seed, combined over seeds as "
        "sqrt(sum h^2) / seeds). comm: the model, and whether its durations can depend on timing at "
        "that scale (fixed: no controller can gain there).\n\n"
    )
    with staged_outputs(args.out) as stage:  # every file written, then all moved into place
        frame.to_csv(stage / "results.csv", index=False)
        (stage / "table.md").write_text(legend + markdown_table(table))
        plot(frame, "cv", "CV of iteration time", stage / "cv_vs_scale.png")
        plot(
            frame,
            "throughput_change_frac",
            "throughput change vs no pacing (%)",
            stage / "throughput_vs_scale.png",
            100.0,
        )
        (stage / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"written: {args.out} ({meta['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
