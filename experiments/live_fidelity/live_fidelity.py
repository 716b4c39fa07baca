"""Does the replay of a live record predict the live job? Repeated live runs, one verdict with intervals.

Each run is ``python -m pacectl.run backend=torch controller=<c>`` with its own ``seed`` (model
initialisation and straggler schedule): no pacing and the controller trained in one job, both
recorded. From each run's ``summary.json`` (``fidelity.by_run``) this collects:

- **self-replay**: each record replayed with its recorded delays against the live iteration times
  (the null model's consistency check: exact by construction where the stamps respect the
  dependency model);
- **counterfactual**: the paced record replayed with zero delays against the live no-pacing run on
  the same schedule, mean iteration time (``mean_err_frac``);
- **effect of pacing**: ``predicted_pacing_effect_s`` (the record replayed with its delays minus
  without them: fixed durations, a max-plus model) against ``live_pacing_effect_s`` (the paced
  run's mean iteration minus the unpaced run's).

Over the runs it reports the mean of each with a 95 % Student-t interval (``scipy.stats``), and the
paired difference live minus predicted effect. In a max-plus replay a delay can never shorten an
iteration, so a live effect reliably below the predicted one would point at a timing-dependent
mechanism (contention, interference) the replay does not model; an interval that holds zero says
the replay and the live job agree within this machine's noise.

Usage: ``python experiments/live_fidelity/live_fidelity.py [--runs 12] [--nproc 4]
[--controller threshold] [--out results/]``. About 20 s per run on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
#: overrides the script sets itself for every job, and the option that sets each
_SET_BY_SCRIPT = {
    "backend": "the script (backend=torch)",
    "backend.nproc_per_node": "--nproc",
    "controller": "--controller",
    "seed": "--seed0",
    "hydra.run.dir": "the script (a temporary folder per job)",
}


def run_once(seed: int, nproc: int, controller: str, extra: list[str], workdir: Path) -> dict[str, Any]:
    """One live job; its summary's fidelity figures as one flat row.

    Raises:
        RuntimeError: the job failed (its last stderr lines are in the message).
    """
    out = workdir / f"seed{seed}"
    cmd = [
        sys.executable, "-m", "pacectl.run", "backend=torch", f"backend.nproc_per_node={nproc}",
        f"controller={controller}", f"seed={seed}", f"hydra.run.dir={out}", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip() and "HYDRA_FULL_ERROR" not in ln]
        raise RuntimeError(
            f"live run with seed={seed} failed (exit {proc.returncode}): " + " | ".join(lines[-3:])
        )
    summary = json.loads((out / "summary.json").read_text())
    by_run = summary["fidelity"]["by_run"]
    cf = by_run[controller]["counterfactual_vs_live_none"]
    runs = summary["runs"]
    return {
        "seed": seed,
        "throughput_none_it_per_s": runs["none"]["throughput_it_per_s"],
        "throughput_paced_it_per_s": runs[controller]["throughput_it_per_s"],
        "self_replay_median_err_frac": {k: v["step_time_median_abs_err_frac"] for k, v in by_run.items()},
        "self_replay_max_err_frac": {k: v["step_time_max_abs_err_frac"] for k, v in by_run.items()},
        "clipped": {k: v["launch_clipped"] + v["transfer_clipped"] for k, v in by_run.items()},
        "num_op_instances": by_run[controller]["num_op_instances"],
        "counterfactual_mean_err_frac": cf["mean_err_frac"],
        "counterfactual_step_median_err_frac": cf["step_time_median_abs_err_frac"],
        "predicted_pacing_effect_s": cf["predicted_pacing_effect_s"],
        "live_pacing_effect_s": cf["live_pacing_effect_s"],
        "live_iteration_mean_s": cf["live_mean_s"],
    }


def mean_ci(values: list[float] | np.ndarray) -> dict[str, float]:
    """Mean with a 95 % Student-t interval (``scipy.stats.ttest_1samp``)."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    return {"mean": float(x.mean()), "ci95": [float(ci.low), float(ci.high)], "sd": float(x.std(ddof=1))}


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdicts over runs (see the module docstring)."""
    predicted = np.array([r["predicted_pacing_effect_s"] for r in rows])
    live = np.array([r["live_pacing_effect_s"] for r in rows])
    iteration = float(np.mean([r["live_iteration_mean_s"] for r in rows]))
    return {
        "runs": len(rows),
        "live_iteration_mean_s": iteration,
        "self_replay_worst_median_err_frac": max(
            max(r["self_replay_median_err_frac"].values()) for r in rows
        ),
        "self_replay_worst_step_err_frac": max(max(r["self_replay_max_err_frac"].values()) for r in rows),
        "clipped_total": int(sum(sum(r["clipped"].values()) for r in rows)),
        "counterfactual_mean_err_frac": mean_ci([r["counterfactual_mean_err_frac"] for r in rows]),
        "predicted_pacing_effect_s": mean_ci(predicted),
        "live_pacing_effect_s": mean_ci(live),
        "live_minus_predicted_effect_s": mean_ci(live - predicted),
    }


def plot(rows: list[dict[str, Any]], path: Path, controller: str) -> None:
    """Predicted against live pacing effect per run, with the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pred = np.array([r["predicted_pacing_effect_s"] for r in rows]) * 1e3
    live = np.array([r["live_pacing_effect_s"] for r in rows]) * 1e3
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    lo, hi = min(pred.min(), live.min(), 0.0) - 0.2, max(pred.max(), live.max(), 0.0) + 0.2
    ax.plot([lo, hi], [lo, hi], color="0.6", lw=1, label="live = predicted")
    ax.axhline(0.0, color="0.85", lw=0.8)
    ax.scatter(pred, live, color="C0", zorder=3, label="one live job")
    ax.set_xlabel("predicted by the replay (ms per iteration)")
    ax.set_ylabel("measured live (ms per iteration)")
    ax.set_title(f"Effect of pacing ({controller}) on the iteration time", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Repeat a live job (no pacing + a controller, recorded) and test whether the replay of "
        "its records predicts it: self-replay, counterfactual and the effect of pacing, with 95 % intervals. "
        "About 20 s per run on 2 cores.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=12, help="live jobs, seeds --seed0 .. --seed0 + runs - 1")
    parser.add_argument("--seed0", type=int, default=0, help="seed of the first job")
    parser.add_argument("--nproc", type=int, default=4, help="gloo ranks per job")
    parser.add_argument("--controller", default="threshold", help="controller family paced against none")
    parser.add_argument(
        "--out",
        default=str(HERE / "results"),
        help="results folder (live_fidelity.json and .png, created if missing) or a .json file; the default "
        "overwrites the committed record",
    )
    parser.add_argument(
        "overrides", nargs="*", help="more pacectl.run overrides, e.g. backend.num_iterations=120"
    )
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs must be at least 2 for an interval, got {args.runs}")
    from pacectl.controllers import FAMILIES

    families = sorted(name for name in FAMILIES if name != "none")
    if args.controller not in families:
        parser.error(f"--controller must be a pacing controller, one of {families}, got {args.controller!r}")
    for override in args.overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in _SET_BY_SCRIPT:
            parser.error(
                f"the override {override!r} sets what {_SET_BY_SCRIPT[key]} sets; use that option instead"
            )
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "live_fidelity.json"
    try:  # before minutes of live jobs, not after
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=path.parent).close()
    except OSError as err:
        parser.error(f"--out: cannot write {path}: {err.strerror or err}; pick another path")
    from tqdm import tqdm

    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pacectl-live-fidelity-") as tmp:
        seeds = range(args.seed0, args.seed0 + args.runs)
        for seed in tqdm(seeds, desc="live jobs", unit="job", disable=None):
            try:
                rows.append(run_once(seed, args.nproc, args.controller, args.overrides, Path(tmp)))
            except RuntimeError as err:
                print(f"live_fidelity: error: {err}", file=sys.stderr)
                return 1
    result = {
        "command": "python experiments/live_fidelity/live_fidelity.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("overrides", "out")
        )
        + "".join(f" {o}" for o in args.overrides),
        "controller": args.controller,
        "nproc": args.nproc,
        "cpus": os.cpu_count(),
        "wall_time_s": time.perf_counter() - t0,
        "summary": aggregate(rows),
        "runs": rows,
    }
    png = path.with_suffix(".png")
    tmp_json, tmp_png = path.with_name(path.name + ".partial"), png.with_name(png.name + ".partial.png")
    try:  # both written in full before either replaces the record
        tmp_json.write_text(json.dumps(result, indent=2) + "\n")
        plot(rows, tmp_png, args.controller)
        os.replace(tmp_png, png)
        os.replace(tmp_json, path)
    except OSError as err:
        for tmp in (tmp_json, tmp_png):
            tmp.unlink(missing_ok=True)
        print(f"live_fidelity: error: cannot write {path} and {png.name}: {err}", file=sys.stderr)
        return 1
    s = result["summary"]
    ms = 1e3

    def show(x: dict[str, Any], scale: float, unit: str) -> str:
        return f"{x['mean'] * scale:+.3g} {unit} [{x['ci95'][0] * scale:+.3g}, {x['ci95'][1] * scale:+.3g}]"

    print(f"{len(rows)} live jobs, {args.nproc} ranks, {args.controller} vs none; mean live iteration "
          f"{s['live_iteration_mean_s'] * ms:.3g} ms")  # fmt: skip
    print(f"self-replay: worst median error {100 * s['self_replay_worst_median_err_frac']:.3g} %, "
          f"worst step {100 * s['self_replay_worst_step_err_frac']:.3g} %, {s['clipped_total']} clipped estimates")  # fmt: skip
    print(f"counterfactual (paced record at zero delay vs live none), mean iteration: "
          f"{show(s['counterfactual_mean_err_frac'], 100, '%')}")  # fmt: skip
    print(f"effect of pacing per iteration: predicted {show(s['predicted_pacing_effect_s'], ms, 'ms')}, "
          f"live {show(s['live_pacing_effect_s'], ms, 'ms')}, live - predicted "
          f"{show(s['live_minus_predicted_effect_s'], ms, 'ms')}")  # fmt: skip
    print(f"results: {path}, plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
