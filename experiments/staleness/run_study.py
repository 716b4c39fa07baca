"""What staler decisions cost the controllers: the live exchange's lag, measured in simulation.

A live job decides on figures its ranks exchanged first (``pacectl/torchdist/pacer.py``): with a
tiny all-reduce (``gather=async``, the default on gloo) a decision on iteration k paces k + 1;
piggybacked on the next iteration's gradient bucket (``gather=piggyback``, the default on NCCL) it
paces k + 2; with ``gather_every=10`` the figures travel ten iterations at a time. Replay and
simulation model that with ``exchange.lag_iters`` / ``exchange.every_iters``
(:class:`pacectl.loop.ExchangeSchedule`). This study runs every controller under each schedule on
the simulator's timing-dependent scenarios, where pacing can gain, and reports the change against
no pacing and against the instant schedule (lag 1), paired on the same seeded draws.

Usage (from the repository root; about 3 minutes on 2 cores)::

    python experiments/staleness/run_study.py                       # writes experiments/staleness/results/
    python experiments/staleness/run_study.py --iterations 300 --seeds 1 --out /tmp/quick
    python experiments/staleness/run_study.py --launcher joblib --launcher-arg hydra.launcher.n_jobs=8
    python experiments/staleness/run_study.py --launcher submitit_slurm --launcher-arg hydra.launcher.partition=cpu

``--launcher`` runs every (schedule, seed) of a scenario as a job of a Hydra sweep of ``pacectl.run``
through that launcher (:func:`pacectl.studies.launch_sweep`; two sweeps per scenario, one per
``exchange.every_iters``) and pairs the runs of different jobs on the iteration times of their
``iterations.parquet``: the same figures as in process (``tests/test_launchers.py``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra import initialize_config_dir

from pacectl import metrics
from pacectl.config import CONF_DIR
from pacectl.errors import one_line_warnings
from pacectl.files import atomic_path, staged_outputs
from pacectl.studies import (
    change_text,
    combined_half_width,
    comm_text,
    launch_sweep,
    markdown_table,
    panel_grid,
    sim_episodes,
    study_arguments,
)

#: (name, cluster profile, ranks, overrides): the timing-dependent scenarios of the scaling study
#: where pacing gains (paper_like at 8 and 16 ranks), the paper's scale (64), the tuning profile,
#: real per-worker step times (Alibaba PAI; the H200 capture), and the max-plus control (comm=null: delaying a rank can never shorten an iteration).
SCENARIOS = (
    ("paper_like", "paper_like", 8, ["comm=contention"]),
    ("paper_like", "paper_like", 16, ["comm=contention"]),
    ("paper_like", "paper_like", 64, ["comm=contention"]),
    ("contended", "contended", 32, ["comm=contention"]),
    # real step times: each rank replays one worker of the shipped Alibaba PAI job (its own series,
    # correlated over ~10 iterations: autocorrelation 0.57-0.89 at lag 1) on the paper_like fabric
    ("alibaba_pai", "alibaba_pai", 8, ["comm=contention"]),
    # real step times from the H200 capture recorded for this project: 4 gloo ranks sharing one GPU (CV 0.13-0.23,
    # autocorrelation 0.30-0.77 at lag 1)
    ("h200_gloo4", "h200_gloo4", 4, ["comm=contention"]),
    ("null_model", "paper_like", 64, ["comm=null"]),  # control: fixed durations, pacing cannot gain
)
#: (lag, every) -> the live exchange it models.
SCHEDULES = {
    (1, 1): "gather=async (live default on gloo) or collective",
    (2, 1): "gather=piggyback (live default on NCCL)",
    (4, 1): "(no live mode: the trend)",
    (1, 10): "async, gather_every=10",
    (2, 10): "piggyback, gather_every=10",
}


#: One seeded run of a scenario: family -> (its summary, ``float64[num_iterations]`` iteration times, s).
Runs = dict[str, tuple[dict[str, Any], np.ndarray]]


def scenario_runs(
    cluster: str, num_ranks: int, overrides: list[str], iterations: int, seeds: int
) -> dict[tuple[int, int, int], Runs]:
    """Every schedule x seed of one scenario, in this process: ``{(lag, every, seed): runs}``."""
    runs: dict[tuple[int, int, int], Runs] = {}
    for lag, every in SCHEDULES:
        for seed in range(seeds):
            episodes = sim_episodes(
                [*overrides, f"exchange.lag_iters={lag}", f"exchange.every_iters={every}"],
                cluster=cluster,
                num_ranks=num_ranks,
                iterations=iterations,
                seed=seed,
            )
            runs[(lag, every, seed)] = {
                f: (metrics.summarize(ep), np.asarray(ep.iteration_time_s)) for f, ep in episodes.items()
            }
    return runs


def launched_scenario_runs(
    cluster: str,
    num_ranks: int,
    overrides: list[str],
    iterations: int,
    seeds: int,
    *,
    launcher: str,
    launcher_overrides: list[str],
    sweep_dir: Path,
) -> dict[tuple[int, int, int], Runs]:
    """:func:`scenario_runs` as the jobs of Hydra sweeps of ``pacectl.run`` through ``launcher``: one
    sweep per ``exchange.every_iters`` over its lags and the seeds; each job's summary and the iteration
    times of its ``iterations.parquet`` (every rank of a lockstep job has its iteration's time)."""
    runs: dict[tuple[int, int, int], Runs] = {}
    for every in dict.fromkeys(e for _, e in SCHEDULES):
        jobs = launch_sweep(
            "pacectl.run",
            [
                "backend=sim",
                f"cluster={cluster}",
                f"backend.num_ranks={num_ranks}",
                f"backend.num_iterations={iterations}",
                *overrides,
                f"exchange.every_iters={every}",
                "output.plots=false",
                "output.report=false",
            ],  # fmt: skip
            {"exchange.lag_iters": [lag for lag, e in SCHEDULES if e == every], "seed": list(range(seeds))},
            launcher=launcher,
            launcher_overrides=launcher_overrides,
            sweep_dir=sweep_dir / f"every_{every}",
        )
        for given, job in jobs:
            summaries = json.loads((job / "summary.json").read_text())["runs"]
            frame = pd.read_parquet(job / "iterations.parquet", columns=["run", "rank", "iteration_time_s"])
            frame = frame[frame["rank"] == frame["rank"].iloc[0]]  # ordered by run, then iteration
            times = {run: g["iteration_time_s"].to_numpy() for run, g in frame.groupby("run", sort=False)}
            key = (int(given["exchange.lag_iters"]), every, int(given["seed"]))
            runs[key] = {f: (summaries[f], t) for f, t in times.items()}  # the run's order (none first)
    return runs


def scenario_rows(
    name: str, cluster: str, num_ranks: int, runs: dict[tuple[int, int, int], Runs], seeds: int
) -> list[dict[str, object]]:
    """Rows for one scenario: every schedule x controller, means over seeds with paired 95 % CIs."""
    rows: list[dict[str, object]] = []
    for (lag, every), live in SCHEDULES.items():
        for family in runs[(lag, every, 0)]:
            mine = [runs[(lag, every, s)][family] for s in range(seeds)]
            base = [runs[(lag, every, s)]["none"] for s in range(seeds)]
            instant = [runs[(1, 1, s)][family] for s in range(seeds)]
            summaries = [summary for summary, _ in mine]
            throughput = float(np.mean([s["throughput_it_per_s"] for s in summaries]))
            base_tp = float(np.mean([s["throughput_it_per_s"] for s, _ in base]))
            instant_tp = float(np.mean([s["throughput_it_per_s"] for s, _ in instant]))
            rows.append(
                {
                    "scenario": name,
                    "cluster": cluster,
                    "num_ranks": num_ranks,
                    "lag_iters": lag,
                    "every_iters": every,
                    "live_equivalent": live,
                    "controller": family,
                    "throughput_it_per_s": throughput,
                    "cv": float(np.mean([s["cv"] for s in summaries])),
                    "pacing_delay_total_s": float(np.mean([s["pacing_delay_total_s"] for s in summaries])),
                    "throughput_change_frac": throughput / base_tp - 1.0,
                    "throughput_change_ci95_frac": combined_half_width(
                        [metrics.paired_ci95_frac(b, r) for (_, b), (_, r) in zip(base, mine, strict=True)]
                    ),
                    "vs_instant_frac": throughput / instant_tp - 1.0,
                    "vs_instant_ci95_frac": combined_half_width(
                        [metrics.paired_ci95_frac(i, r) for (_, i), (_, r) in zip(instant, mine, strict=True)]
                    ),
                    "comm_model": summaries[0]["comm_model"],
                    "comm_timing_dependent": bool(summaries[0]["comm_timing_dependent"]),
                }
            )
    return rows


def plot(frame: pd.DataFrame, path: Path) -> None:
    """One panel per scenario: throughput change vs no pacing (%, 95 % CI) per schedule, per controller."""
    cells = list(frame.groupby(["scenario", "num_ranks"], sort=False))
    fig, grid = panel_grid(len(cells), max_columns=3, width=4.4)
    axes = list(grid.flat)
    labels = [f"lag {lag}\nevery {every}" for lag, every in SCHEDULES]
    x = np.arange(len(SCHEDULES))
    for ax, ((scenario, ranks), sub) in zip(axes, cells, strict=False):
        families = [f for f in sub["controller"].unique() if f != "none"]
        for i, family in enumerate(families):
            rows = (
                sub[sub["controller"] == family].set_index(["lag_iters", "every_iters"]).loc[list(SCHEDULES)]
            )
            ax.errorbar(
                x + 0.08 * (i - (len(families) - 1) / 2),
                100 * rows["throughput_change_frac"],
                yerr=100 * rows["throughput_change_ci95_frac"],
                marker="o",
                markersize=3,
                capsize=2,
                label=family,
            )
        ax.axhline(0.0, color="black", linewidth=1.0)
        ax.set_xticks(x, labels, fontsize=7)
        fixed = "" if sub["comm_timing_dependent"].iloc[0] else "\n(fixed durations: pacing cannot gain)"
        ax.set_title(f"{scenario}, {ranks} ranks{fixed}", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in grid[:, 0]:
        ax.set_ylabel("throughput change vs no pacing (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "Decision lag (iterations from observation to pacing) and exchange batching; "
        "live default: lag 1 on gloo, lag 2 on NCCL"
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def main() -> None:
    longest = max(lag + every for lag, every in SCHEDULES)  # iterations before every schedule paces
    args = study_arguments(
        __doc__,
        iterations=2000,
        seeds=5,
        out=Path(__file__).parent / "results",
        min_iterations=2 * longest,  # every schedule pacing for most of the run
    )
    one_line_warnings()
    rows: list[dict[str, object]] = []
    t0 = time.perf_counter()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"), tempfile.TemporaryDirectory() as sweeps:
        for k, (name, cluster, ranks, overrides) in enumerate(SCENARIOS):
            if args.launcher:
                runs = launched_scenario_runs(
                    cluster,
                    ranks,
                    overrides,
                    args.iterations,
                    args.seeds,
                    launcher=args.launcher,
                    launcher_overrides=args.launcher_arg,
                    sweep_dir=Path(sweeps) / str(k),
                )
                shutil.rmtree(Path(sweeps) / str(k))  # the jobs' iterations.parquet, read
            else:
                runs = scenario_runs(cluster, ranks, overrides, args.iterations, args.seeds)
            cell = scenario_rows(name, cluster, ranks, runs, args.seeds)
            rows += cell
            worst = min(
                (
                    r
                    for r in cell
                    if r["controller"] != "none" and (r["lag_iters"], r["every_iters"]) != (1, 1)
                ),
                key=lambda r: float(r["vs_instant_frac"]),
            )
            print(
                f"[{time.perf_counter() - t0:6.1f} s] {name} {ranks} ranks: largest loss against lag 1: "
                f"{worst['controller']} at lag {worst['lag_iters']} every {worst['every_iters']}: "
                f"{float(worst['vs_instant_frac']):+.2%} ±{float(worst['vs_instant_ci95_frac']):.2%}",
                flush=True,
            )
    frame = pd.DataFrame(rows)
    table = frame[frame["controller"] != "none"].assign(
        schedule=lambda f: "lag " + f["lag_iters"].astype(str) + ", every " + f["every_iters"].astype(str),
        throughput_change=lambda f: change_text(
            f["throughput_change_frac"], f["throughput_change_ci95_frac"]
        ),
        vs_lag_1=lambda f: change_text(f["vs_instant_frac"], f["vs_instant_ci95_frac"]).where(
            (f["lag_iters"] != 1) | (f["every_iters"] != 1), "reference"
        ),
        comm=comm_text,
    )[
        [
            "scenario",
            "num_ranks",
            "comm",
            "schedule",
            "live_equivalent",
            "controller",
            "throughput_change",
            "vs_lag_1",
            "cv",
        ]
    ]
    none_cv = frame[(frame["controller"] == "none") & (frame["lag_iters"] == 1) & (frame["every_iters"] == 1)]
    meta = {
        "iterations": args.iterations,
        "seeds": args.seeds,
        "schedules": {f"lag {lag}, every {every}": live for (lag, every), live in SCHEDULES.items()},
        "no_pacing_cv": {f"{r.scenario} {r.num_ranks}": r.cv for r in none_cv.itertuples()},
        "wall_time_s": time.perf_counter() - t0,
    }
    legend = (
        f"Means over {args.seeds} seed(s) of {args.iterations} iterations. comm: contention is "
        "timing-dependent (cross traffic, early-arrival interference); null is the max-plus control "
        "(fixed durations: no controller can gain, whatever the lag). throughput_change: against "
        "no pacing; vs_lag_1: against the same controller deciding for the next iteration (lag 1, "
        "every 1); each +- the 95 % half-width of the paired change (per seed, combined as "
        "sqrt(sum h^2) / seeds). No pacing's CV: "
        + ", ".join(f"{k} ranks {v:.3f}" for k, v in meta["no_pacing_cv"].items())
        + ".\n\n"
    )
    with staged_outputs(args.out) as stage:  # every file written, then all moved into place
        frame.to_csv(stage / "results.csv", index=False)
        (stage / "table.md").write_text(legend + markdown_table(table))
        plot(frame, stage / "throughput_vs_lag.png")
        (stage / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"written: {args.out} ({meta['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
