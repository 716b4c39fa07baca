"""Seeded simulation cells for the study scripts under ``experiments/`` (scaling, staleness).

A *cell* is one scenario at one scale: every controller family of ``controller=all``
with its shipped parameters, behind the default safety guard, on the same seeded compute-time
draws as no pacing (``backend=sim``). The caller composes inside Hydra's
``initialize_config_dir(CONF_DIR)`` context; nothing here imports torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra import compose

from pacectl import metrics
from pacectl.config import controller_families
from pacectl.experiment import SimExperiment
from pacectl.files import folder_problem
from pacectl.types import Episode

#: Summary figures a cell averages over seeds (see :func:`pacectl.metrics.summarize`).
CELL_KEYS = (
    "throughput_it_per_s",
    "iteration_time_mean_s",
    "iteration_time_p99_s",
    "cv",
    "spread_median_s",
    "pacing_delay_total_s",
)


def sim_episodes(
    overrides: list[str], *, cluster: str, num_ranks: int, iterations: int, seed: int
) -> dict[str, Episode]:
    """One seeded episode per controller family (``none`` first) on ``backend=sim``.

    Args:
        overrides: further ``pacectl.run`` overrides (``comm=contention``, ``exchange.lag_iters=2``).
        cluster: the cluster profile (``conf/cluster/<cluster>.yaml``).
        num_ranks: world size.
        iterations: iterations per episode.
        seed: the compute-time draws' and controllers' seed.

    Returns:
        ``{family: Episode}``.

    Raises:
        ConfigError: a bad override value.
    """
    cfg = compose(
        "config",
        overrides=[
            "backend=sim",
            f"cluster={cluster}",
            f"backend.num_ranks={num_ranks}",
            f"backend.num_iterations={iterations}",
            f"seed={seed}",
            *overrides,
        ],
    )
    experiment = SimExperiment(cfg)
    return {family: experiment.run(family, params) for family, params in controller_families(cfg).items()}


def sim_cell(
    overrides: list[str], *, cluster: str, num_ranks: int, iterations: int, seeds: int
) -> dict[str, dict[str, Any]]:
    """Mean summary per controller family over seeds ``0 .. seeds - 1`` (:func:`sim_episodes`).

    Besides the means of :data:`CELL_KEYS`: ``comm_model`` and ``comm_timing_dependent`` (whether
    the model's durations can depend on timing at this scale: only then can pacing gain), and
    ``throughput_change_ci95_frac``, the 95 % half-width of the mean paired change against no
    pacing (:func:`pacectl.metrics.paired_change_ci95_frac` per seed, combined over independent
    seeds as ``sqrt(sum h_i^2) / seeds``).
    """
    per_family: dict[str, list[dict[str, Any]]] = {}
    half_widths: dict[str, list[float]] = {}
    for seed in range(seeds):
        episodes = sim_episodes(
            overrides, cluster=cluster, num_ranks=num_ranks, iterations=iterations, seed=seed
        )
        for family, episode in episodes.items():
            per_family.setdefault(family, []).append(metrics.summarize(episode))
            half_widths.setdefault(family, []).append(
                metrics.paired_change_ci95_frac(episodes["none"], episode)
            )
    return _cell(per_family, half_widths)


def _cell(
    per_family: dict[str, list[dict[str, Any]]], half_widths: dict[str, list[float]]
) -> dict[str, dict[str, Any]]:
    """The figures of :func:`sim_cell` from each family's summaries and half-widths, one per seed."""
    return {
        f: {
            **{k: float(np.mean([s[k] for s in runs])) for k in CELL_KEYS},
            "comm_model": runs[0]["comm_model"],
            "comm_timing_dependent": bool(runs[0]["comm_timing_dependent"]),
            "throughput_change_ci95_frac": combined_half_width(half_widths[f]),
        }
        for f, runs in per_family.items()
    }


#: Hydra launchers a study may run its cells through (``--launcher``; extra ``.[launchers]``).
LAUNCHERS = ("joblib", "submitit_local", "submitit_slurm")


def launch_sweep(
    module: str,
    overrides: list[str],
    sweep: dict[str, list[Any]],
    *,
    launcher: str,
    launcher_overrides: list[str] | tuple[str, ...] = (),
    sweep_dir: Path,
) -> list[tuple[dict[str, str], Path]]:
    """Run one Hydra sweep of ``python -m <module>`` through ``launcher``; each job's values and folder.

    The command is ``python -m <module> -m hydra/launcher=<launcher> <launcher_overrides> <overrides>
    key=v1,v2,... hydra.sweep.dir=<sweep_dir>``: one job per combination of the ``sweep`` values (a
    process with joblib, a submitit job on this machine or a SLURM cluster).

    Args:
        module: ``pacectl.run`` or ``pacectl.tune``.
        overrides: the overrides every job shares.
        sweep: swept key -> its values (a Hydra sweep is the product of them).
        launcher: one of :data:`LAUNCHERS`.
        launcher_overrides: further ``hydra.launcher.*`` settings (``hydra.launcher.n_jobs=2``).
        sweep_dir: the sweep's folder (``hydra.sweep.dir``); one sub-folder per job.

    Returns:
        ``[(swept key -> this job's value as written on its command line, job folder)]``, one per job.

    Raises:
        ConfigError: an unknown launcher.
        RuntimeError: the sweep failed (its stderr's tail), or a job left no folder.
    """
    import subprocess
    import sys

    from pacectl.cli import job_overrides
    from pacectl.errors import ConfigError

    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher must be one of {list(LAUNCHERS)}, got {launcher!r}")
    swept = [f"{key}={','.join(str(v) for v in values)}" for key, values in sweep.items()]
    command = [
        sys.executable, "-m", module, "-m", f"hydra/launcher={launcher}", *launcher_overrides,
        *overrides, *swept, f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the sweep through {launcher} failed: {proc.stderr[-1500:]}")
    jobs = []
    for job in sorted(p for p in sweep_dir.iterdir() if (p / "config.yaml").is_file()):
        given = dict(o.partition("=")[::2] for o in job_overrides(job))
        jobs.append(({key: given[key] for key in sweep}, job))
    expected = int(np.prod([len(values) for values in sweep.values()]))
    if len(jobs) != expected:
        raise RuntimeError(
            f"the sweep through {launcher} left {len(jobs)} job folders of {expected} in {sweep_dir}"
        )
    return jobs


def launched_cells(
    overrides: list[str],
    *,
    cluster: str,
    scales: tuple[int, ...] | list[int],
    iterations: int,
    seeds: int,
    launcher: str,
    launcher_overrides: list[str] | tuple[str, ...] = (),
    sweep_dir: Path,
) -> dict[int, dict[str, dict[str, Any]]]:
    """:func:`sim_cell` at every scale, its seeds run as the jobs of one Hydra sweep through ``launcher``.

    One ``pacectl.run`` sweep over ``backend.num_ranks`` and ``seed`` (:func:`launch_sweep`): every
    (scale, seed) is a job of its own, whose ``summary.json`` holds what :func:`sim_cell` computes in
    process; the cells are the same figures (``tests/test_launchers.py``).

    Args:
        overrides, cluster, iterations, seeds: as :func:`sim_cell`.
        scales: world sizes, one cell each.
        launcher, launcher_overrides, sweep_dir: as :func:`launch_sweep`.

    Returns:
        ``{num_ranks: {family: figures}}``.

    Raises:
        ConfigError: an unknown launcher.
        RuntimeError: the sweep failed (its stderr's tail).
    """
    import json

    jobs = launch_sweep(
        "pacectl.run",
        [
            "backend=sim",
            f"cluster={cluster}",
            f"backend.num_iterations={iterations}",
            *overrides,
            "output.plots=false",
        ],
        {"backend.num_ranks": list(scales), "seed": list(range(seeds))},
        launcher=launcher,
        launcher_overrides=launcher_overrides,
        sweep_dir=sweep_dir,
    )
    per_cell: dict[int, dict[int, dict[str, Any]]] = {}
    for given, job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        per_cell.setdefault(int(given["backend.num_ranks"]), {})[int(given["seed"])] = summary["runs"]
    cells: dict[int, dict[str, dict[str, Any]]] = {}
    for n in scales:
        runs = [per_cell[int(n)][i] for i in range(seeds)]
        cells[int(n)] = _cell(
            {f: [r[f] for r in runs] for f in runs[0]},
            {f: [float(r[f].get("throughput_change_ci95_frac") or 0.0) for r in runs] for f in runs[0]},
        )
    return cells


def combined_half_width(half_widths: list[float]) -> float:
    """95 % half-width of the mean of independent per-seed estimates: ``sqrt(sum h_i^2) / n``."""
    return float(np.sqrt(np.sum(np.square(half_widths))) / len(half_widths))


def change_text(change_frac: pd.Series, half_width_frac: pd.Series) -> pd.Series:
    """Table cells ``+1.23 ±0.45 %`` from a change and its 95 % half-width, both fractions."""
    return (100 * change_frac).map("{:+.2f}".format) + (100 * half_width_frac).map(" ±{:.2f} %".format)


def comm_text(frame: pd.DataFrame) -> pd.Series:
    """Table cells naming each row's comm model and whether its durations depend on timing."""
    return frame["comm_model"] + frame["comm_timing_dependent"].map(
        {True: " (timing-dep.)", False: " (fixed)"}
    )


def markdown_table(frame: pd.DataFrame) -> str:
    """A Markdown table of ``frame`` (4 significant digits for floats)."""
    cells = [
        [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)
    ]
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"


def add_launcher_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--launcher`` and ``--launcher-arg`` on a study script's parser: run ``what`` (e.g. "the cells'
    jobs") as jobs of a Hydra sweep through that launcher instead of in process."""
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=None,
        help=f"run {what} through this Hydra launcher (pip install -e '.[launchers]'), not in process",
    )
    parser.add_argument(
        "--launcher-arg",
        action="append",
        default=[],
        metavar="OVERRIDE",
        help="a hydra.launcher.* setting for --launcher (repeatable), e.g. hydra.launcher.n_jobs=2",
    )


def study_arguments(
    doc: str | None, *, iterations: int, seeds: int, out: Path, min_iterations: int = 2
) -> argparse.Namespace:
    """A study script's command line: ``--iterations``, ``--seeds`` and ``--out`` (checked first:
    one line and exit 2 for a bad value or an unwritable folder, before minutes of simulation).

    Args:
        doc: the script's module docstring (its ``--help``).
        iterations: default iterations per run.
        seeds: default seeds per cell.
        out: default output folder.
        min_iterations: fewest iterations the study can use.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--iterations", type=int, default=iterations, help=f"iterations per run, >= {min_iterations}"
    )
    parser.add_argument("--seeds", type=int, default=seeds, help="seeds per cell (results are means), >= 1")
    parser.add_argument("--out", type=Path, default=out)
    add_launcher_arguments(parser, "the cells' jobs")
    args = parser.parse_args()
    if args.seeds < 1 or args.iterations < min_iterations:
        parser.error(
            f"--seeds must be >= 1 and --iterations >= {min_iterations}, got {args.seeds} and {args.iterations}"
        )
    problem = folder_problem(args.out)
    if problem:
        parser.error(f"--out {args.out}: {problem}; pick a folder you can write to")
    return args


#: every per-rank family and the zero-delay interference baseline (``sleep_wait``), for sweeps
SWEEP_FAMILIES = "controller.families=[threshold,pid,ewma,quantile,forecast,sleep_wait]"


def kappa_sweep(
    overrides: list[str],
    *,
    cluster: str,
    num_ranks: int,
    kappas: tuple[float, ...],
    iterations: int,
    seeds: int,
) -> list[dict[str, Any]]:
    """One :func:`sim_cell` per early-arrival interference strength ``kappa`` (dimensionless, per
    spinning co-located peer): every per-rank family and ``sleep_wait`` beside no pacing.

    Rows: ``kappa``, ``controller``, the cell's figures, and ``throughput_change_frac`` against no
    pacing at the same ``kappa`` (the null model's zero: at ``kappa = 0`` with no other
    timing-dependent mechanism no controller can gain).
    """
    rows = []
    for kappa in kappas:
        cell = sim_cell(
            [*overrides, SWEEP_FAMILIES, f"cluster.interference.kappa={kappa}"],
            cluster=cluster,
            num_ranks=num_ranks,
            iterations=iterations,
            seeds=seeds,
        )
        base = cell["none"]["throughput_it_per_s"]
        for family, s in cell.items():
            change = s["throughput_it_per_s"] / base - 1
            rows.append({"kappa": kappa, "controller": family, **s, "throughput_change_frac": change})
    return rows


def panel_grid(n: int, *, max_columns: int, width: float, height: float = 3.6) -> tuple[Any, Any]:
    """A study figure of ``n`` panels sharing their y-axis, at most ``max_columns`` a row (inches per
    panel: ``width`` x ``height``); the unused panels of the last row hidden. Returns (figure, the
    2-D array of axes, rows x columns)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(max_columns, n)
    rows = -(-n // columns)
    fig = Figure(figsize=(width * columns, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, columns, sharey=True, squeeze=False)
    for ax in list(grid.flat)[n:]:
        ax.set_visible(False)
    return fig, grid


def plot_kappa_sweep(frame: pd.DataFrame, panel: str, path: Path, title: str) -> None:
    """Throughput change against no pacing (%) vs ``kappa``, one panel per value of ``panel``, one
    line per controller (``sleep_wait`` bold), error bars the 95 % half-widths, zero marked."""
    from pacectl.report import save_figure

    panels = list(dict.fromkeys(frame[panel]))
    fig, grid = panel_grid(len(panels), max_columns=4, width=4.2)
    axes = list(grid.flat)
    for ax, value in zip(axes, panels, strict=False):
        sub = frame[(frame[panel] == value) & (frame["controller"] != "none")]
        for family, rows in sub.groupby("controller", sort=False):
            style = (
                {"color": "black", "linewidth": 2.2}
                if family == "sleep_wait"
                else {"marker": "o", "markersize": 3}
            )
            ax.errorbar(
                rows["kappa"],
                100 * rows["throughput_change_frac"],
                yerr=100 * rows["throughput_change_ci95_frac"],
                label=family,
                capsize=2,
                **style,
            )
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel("kappa (slowdown per spinning co-located peer)")
        ax.set_title(f"{value} ranks" if panel == "num_ranks" else str(value))
        ax.grid(alpha=0.3)
    for ax in grid[:, 0]:
        ax.set_ylabel("throughput change vs no pacing (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)
