"""Benchmark: what ``python -m pacectl.tune`` costs besides the episodes themselves.

Usage::

    python experiments/bench/bench_tune.py            # writes results/tune.json
    python experiments/bench/bench_tune.py --trials 100 --skip-ar

Measures:

- ``overhead_ms_per_trial``: sampler plus storage cost of one trial, with a trivial objective that
  makes the same storage writes as the real one (4 float parameters, 3 user attributes, one
  constraint, two objectives), NSGA-II (population 20), for an in-memory study, the default journal
  file (``JournalFileBackend``, fsync on every append) and SQLite;
- ``ar_200_trials_2_workers``: wall time of ``python -m pacectl.tune cluster=ar controller=threshold
  tune.n_trials=200 tune.n_workers=2`` (the whole command: start-up, AR load, baseline, 200 trials,
  outputs), plus the mean episode time (``objective_s``) per trial from the study.

The machine's load average is recorded next to the figures: these machines are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from pacectl.report import atomic_write_text
from pacectl.tuning.storage import StorageSpec

HERE = Path(__file__).resolve().parent


def _objective(trial: optuna.Trial) -> tuple[float, float]:
    trial.set_user_attr("worker", "bench:0")
    x = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(4)]
    trial.set_user_attr("objective_s", 0.0)
    trial.set_user_attr("throughput_loss_frac", x[0] * 0.01)
    trial.set_constraint("throughput_loss", x[0] * 0.01 - 0.005)
    return 1.0 - 0.01 * x[0] + 0.001 * x[1], 0.1 * x[0] + x[2] * x[3] * 0.01


def overhead(kind: str, trials: int, tmp: Path) -> float:
    """Milliseconds per trial of a trivial objective on storage ``kind``."""
    storage: Any = None
    if kind == "journal":
        storage = StorageSpec("journal", str(tmp / f"bench-{trials}.journal")).open()
    elif kind == "sqlite":
        storage = StorageSpec("rdb", f"sqlite:///{tmp / f'bench-{trials}.db'}").open()
    study = optuna.create_study(
        storage=storage,
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.NSGAIISampler(population_size=20, seed=0),
    )
    t0 = time.perf_counter()
    study.optimize(_objective, n_trials=trials)
    return (time.perf_counter() - t0) / trials * 1e3


def ar_study(tmp: Path, trials: int, workers: int) -> dict[str, Any]:
    """Run the tuner on AR in a subprocess; wall time and per-trial episode time."""
    out = tmp / "ar"
    cmd = [
        sys.executable,
        "-m",
        "pacectl.tune",
        "cluster=ar",
        "controller=threshold",
        f"tune.n_trials={trials}",
        f"tune.n_workers={workers}",
        "tune.progress=false",
        f"hydra.run.dir={out}",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    summary = json.loads((out / "tune.json").read_text())
    study = optuna.load_study(
        study_name="ar-threshold", storage=StorageSpec("journal", str(out / "optuna.journal")).open()
    )
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    episode = [float(t.user_attrs["objective_s"]) for t in done]
    spans = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done]  # type: ignore[operator]
    return {
        "command": " ".join(cmd[1:]).replace(str(out), "DIR"),
        "wall_s": wall,
        "tune_wall_time_s": summary["wall_time_s"],
        "num_complete": len(done),
        "objective_s_median": statistics.median(episode),
        "trial_span_s_median": statistics.median(spans),
        "goal_s": 60.0,
    }


def main() -> None:
    """Run the benchmark and write ``--out`` (default ``results/tune.json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--skip-ar", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tune.json", help="results JSON")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "optuna": optuna.__version__,
        "load_average_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        result["overhead_ms_per_trial"] = {
            kind: overhead(kind, args.trials, tmp) for kind in ("inmemory", "journal", "sqlite")
        }
        result["overhead_trials"] = args.trials
        if not args.skip_ar:
            result["ar_200_trials_2_workers"] = ar_study(tmp, 200, 2)
    result["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2) + "\n"
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
