"""Does a probed, fitted live record predict the effect of pacing better than max-plus?

    python experiments/probe/probe_study.py [--seeds 0 1 2 3] [--nproc 4] [--iterations 120]
        [--probe-ranks 0 1 2 3] [--prob 0.5] [--max-delay-s 0.005] [--out experiments/probe/results]
    python experiments/probe/probe_study.py --analyse-only --out DIR     # again, from the kept records
        [--load-split 4]     # also summarise the jobs started below / at or above a load average of 4

Each job is one live gloo run, ``python -m pacectl.run backend=torch controller=threshold``, with
randomised probe delays on (``backend.probe``: on each probed rank and measured iteration, with
probability ``prob``, a sleep of U(0, max_delay_s) between forward and backward, the same schedule
in the no-pacing and the threshold run) and, for the comparison, the same job with probes off. Per
job it computes, as ``experiments/comm_fit/pacing_effect.py`` does:

- **live effect**: the threshold run's mean iteration minus the no-pacing run's (one job, interleaved
  in blocks, same straggler and probe schedule);
- **max-plus**: the threshold record replayed with its delays minus without them (fixed durations);
- **fitted (paced record)**: the same two replays under ``comm=fitted`` fitted on that record
  (:class:`pacectl.fabric.fitted.FittedComm`);
- **fitted (no-pacing record)**: the slopes fitted on the no-pacing record of the same job, whose
  only delays are the probes (variation no controller caused), applied to the threshold record.

Over the jobs it reports each predictor's mean absolute error against the live effect and the
paired difference ``|max-plus error| - |fitted error|`` with a 95 % Student-t interval (positive:
the fit predicts better), and each fit's completion-on-last-arrival slope (max-plus: 1.0), the
response of a collective's completion to a delay, which the probes randomise.

Timing figures from a shared machine: the load average is recorded with every job.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from pacectl.backends.replay import ReplayBackend
from pacectl.fabric.fitted import FittedComm, _layout
from pacectl.files import atomic_write_text, jsonable
from pacectl.traces.canonical import load_canonical

HERE = Path(__file__).resolve().parent


def run_job(out: Path, *, seed: int, nproc: int, iterations: int, probe: list[str]) -> dict[str, Any]:
    """One live job into ``out`` (skipped when its summary is already there); its wall time and the
    load average around it are kept in ``out/run.json``."""
    if (out / "summary.json").is_file():
        return {**job_run_info(out), "reused": True}
    cmd = [
        sys.executable, "-m", "pacectl.run", "backend=torch", f"backend.nproc_per_node={nproc}",
        "controller=threshold", f"seed={seed}", f"backend.num_iterations={iterations}",
        "output.plots=false", "output.report=false", f"hydra.run.dir={out}", *probe,
    ]  # fmt: skip
    t0, load = time.time(), os.getloadavg()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"job failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    info = {
        "dir": str(out),
        "wall_s": time.time() - t0,
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
    }
    atomic_write_text(out / "run.json", json.dumps(info, indent=2) + "\n")
    return info


def job_run_info(out: Path) -> dict[str, Any]:
    """What ``run_job`` kept about a job's run (wall time, load average), or only its folder."""
    path = out / "run.json"
    return {**(json.loads(path.read_text()) if path.is_file() else {}), "dir": str(out)}


def _mean_end(end: np.ndarray) -> float:
    return float(end.max(axis=(0, 2)).mean())


def _paced_delays(backend: ReplayBackend) -> np.ndarray:
    return backend.dag.delay_s[backend._paced].transpose(1, 0, 2).reshape(backend.num_iterations, -1)


def _transplant(model: FittedComm, backend: ReplayBackend) -> FittedComm:
    """``model``'s slopes on another record of the same job (same ops, same placement)."""
    meta = backend.trace.meta
    layout = _layout(
        backend.dag, model.placement, dp_size=meta.dp_size, pp_size=meta.pp_size, tp_size=meta.tp_size
    )
    return FittedComm(layout, model.beta, placement=model.placement, source=model.source)


def _arrival(model: FittedComm) -> dict[str, list[float]]:
    """Per op class: the fit's completion-on-last-arrival slope and its 95 % interval (max-plus: 1.0)."""
    if model.fit is None:
        return {}
    return {c.op_class: [c.estimate, c.ci95_low, c.ci95_high] for c in model.fit.arrival}


def analyse_job(job_dir: Path) -> dict[str, Any]:
    """The pacing-effect predictions of one job's records."""
    records = job_dir / "records"
    none, paced = load_canonical(records / "none.parquet"), load_canonical(records / "threshold.parquet")
    live = float(np.mean(paced.measured_step_time_s) - np.mean(none.measured_step_time_s))
    backend, none_backend = ReplayBackend(paced), ReplayBackend(none)
    delays = _paced_delays(backend)
    max_plus = _mean_end(backend.replayed_times(delays)[1]) - _mean_end(backend.replayed_times()[1])
    fit_paced = FittedComm.for_backend(backend)
    fitted = _mean_end(fit_paced.replay(backend, delays)[1]) - _mean_end(fit_paced.replay(backend)[1])
    fit_none = FittedComm.for_backend(none_backend)
    moved = _transplant(fit_none, backend)
    fitted_none = _mean_end(moved.replay(backend, delays)[1]) - _mean_end(moved.replay(backend)[1])
    with open(records / "none.episode.pkl", "rb") as fh:
        probe_actual = np.asarray(pickle.load(fh).get("probe_actual_s", np.zeros(0)))
    row: dict[str, Any] = {
        "job": job_dir.name,
        "live_effect_s": live,
        "max_plus_predicted_s": max_plus,
        "fitted_paced_predicted_s": fitted,
        "fitted_none_predicted_s": fitted_none,
        "fit_paced_verdict": fit_paced.fit.verdict if fit_paced.fit else None,
        "fit_none_verdict": fit_none.fit.verdict if fit_none.fit else None,
        "fit_paced_beta": fit_paced.beta.tolist(),
        "fit_none_beta": fit_none.beta.tolist(),
        "fit_classes": list(fit_paced.layout.classes),
        "arrival_slope_paced": _arrival(fit_paced),
        "arrival_slope_none": _arrival(fit_none),
        "probe_mean_s": float(probe_actual.mean()) if probe_actual.size else 0.0,
        "none_mean_iteration_s": float(np.mean(none.measured_step_time_s)),
    }
    return row


def _interval(x: np.ndarray) -> list[float]:
    if len(x) < 2:
        return [float("nan"), float("nan")]
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return [float(x.mean() - half), float(x.mean() + half)]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean absolute errors and paired differences over jobs; live minus max-plus, also as a fraction
    of the no-pacing mean iteration (jobs on a loaded and an idle machine differ in iteration time)."""
    live = np.array([r["live_effect_s"] for r in rows])
    out: dict[str, Any] = {"jobs": len(rows), "live_effect_s": float(live.mean()), "live_ci": _interval(live)}
    max_plus = np.array([r["max_plus_predicted_s"] for r in rows])
    base = np.array([r["none_mean_iteration_s"] for r in rows])
    gap = live - max_plus
    out["live_minus_max_plus_s"] = float(gap.mean())
    out["live_minus_max_plus_ci"] = _interval(gap)
    out["live_minus_max_plus_p"] = float(stats.ttest_1samp(gap, 0.0).pvalue) if len(gap) > 1 else float("nan")
    out["live_below_max_plus_in_jobs"] = int((gap < 0).sum())
    out["live_minus_max_plus_frac"] = float((gap / base).mean())
    out["live_minus_max_plus_frac_ci"] = _interval(gap / base)
    mp_err = np.abs(max_plus - live)
    out["max_plus_mae_s"] = float(mp_err.mean())
    for key in ("fitted_paced", "fitted_none"):
        err = np.abs(np.array([r[f"{key}_predicted_s"] for r in rows]) - live)
        gain = mp_err - err
        out[f"{key}_mae_s"] = float(err.mean())
        out[f"{key}_better_by_s"] = float(gain.mean())
        out[f"{key}_better_by_ci"] = _interval(gain)
        out[f"{key}_better_in_jobs"] = int((gain > 0).sum())
    return out


def _load_split(jobs: dict[str, list[dict[str, Any]]], split: float) -> dict[str, Any]:
    """Summaries of the jobs that started below / at or above ``split`` (1-minute load average)."""
    out: dict[str, Any] = {}
    for side, keep in ((f"load<{split:g}", lambda x: x < split), (f"load>={split:g}", lambda x: x >= split)):
        for cond, rows in {**jobs, "pooled": [r for job_rows in jobs.values() for r in job_rows]}.items():
            picked = [r for r in rows if "loadavg_before" in r and keep(r["loadavg_before"][0])]
            if picked:
                out[f"{cond} {side}"] = summarise(picked)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--probe-ranks", type=int, nargs="+", default=None, help="default: every rank")
    parser.add_argument("--prob", type=float, default=0.5)
    parser.add_argument("--max-delay-s", type=float, default=0.005)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--analyse-only", action="store_true")
    parser.add_argument(
        "--load-split",
        type=float,
        default=None,
        help="also summarise the jobs that started below / at or above this 1-minute load average",
    )
    args = parser.parse_args()
    ranks = args.probe_ranks if args.probe_ranks is not None else list(range(args.nproc))
    probe_on = [
        f"backend.probe.ranks=[{','.join(map(str, ranks))}]",
        f"backend.probe.prob={args.prob}",
        f"backend.probe.max_delay_s={args.max_delay_s}",
    ]
    conditions = {"probed": probe_on, "unprobed": []}
    jobs: dict[str, list[dict[str, Any]]] = {c: [] for c in conditions}
    for seed in args.seeds:
        for cond, probe in conditions.items():  # alternate, so that machine drift hits both alike
            job_dir = args.out / "jobs" / f"{cond}-seed{seed}"
            run = (
                job_run_info(job_dir)
                if args.analyse_only
                else run_job(job_dir, seed=seed, nproc=args.nproc, iterations=args.iterations, probe=probe)
            )
            row = {**analyse_job(job_dir), **run, "seed": seed}
            jobs[cond].append(row)
            print(json.dumps({k: row[k] for k in row if not k.startswith("fit_")}), flush=True)
    result = {
        "command": " ".join(sys.argv),
        "probe": {"ranks": ranks, "prob": args.prob, "max_delay_s": args.max_delay_s},
        "nproc": args.nproc,
        "iterations": args.iterations,
        "summary": {
            **{c: summarise(rows) for c, rows in jobs.items()},
            "pooled": summarise([r for rows in jobs.values() for r in rows]),
            **(_load_split(jobs, args.load_split) if args.load_split is not None else {}),
        },
        "jobs": jobs,
        "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "note": "live timing on a 2-core machine shared by several engineers (loaded)",
    }
    atomic_write_text(args.out / "probe_study.json", json.dumps(jsonable(result), indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
