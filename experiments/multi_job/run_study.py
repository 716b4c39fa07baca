"""Multi-job study: what job-level phase control and per-rank pacing buy when jobs share a fabric.

On ``cluster=shared_uplink`` (two jobs whose rings cross one 2:1 oversubscribed uplink per leaf,
``conf/cluster/shared_uplink.yaml``) and ``cluster=shared_uplink3`` (three such jobs), in the
simulator (``pacectl/backends/multijob.py``):

- every controller: none, the per-rank ones (threshold, pid, ewma, quantile, forecast), sleep_wait
  and the job-level ``phase``; each job's throughput and the sum over jobs, per seed, with the paired
  95 % batch-means interval of each change against no pacing, combined over seeds;
- ``phase`` runs with its switch-off (rule 5 of :mod:`pacectl.controllers.phase`, the default:
  an unpaced baseline window, then off for good once a judged window does not beat it);
  ``phase_no_switch_off``: the same controller with ``switch_off_iters=null``, shifting whenever
  slowed for the whole run (what ``phase`` was before the switch-off);
- ``phase_probe``: ``phase`` given each job's quiet-fabric time (``controller.quiet_s``) as measured
  alone, by the solo run of the ceiling (the median of its collective times), instead of the
  window minimum, which is biased high where collisions persist;
- the ceiling: each job alone on the fabric (no pacing), summed: what no collision at all would give,
  so that the share of the collision loss each controller recovers can be read;
- sensitivities: a costlier collision (4:1 oversubscription: the uplink is the ring's bottleneck even
  alone), less compute jitter (lognormal sigma 1 % instead of 3 %: the jobs' relative phase drifts
  more slowly), the assumed early-arrival interference (``cluster.interference.kappa=0.05``), and an
  open-loop competitor (job b replaced by a square wave of greedy flows on the same uplinks, on for
  b's mean collective alone and off for the rest of b's mean iteration alone, ``cluster.cross_traffic``:
  b's mean period and duty, without its jitter and without reacting); no compute jitter at all
  (``no jitter``), and with b shaped like a as well (``identical jobs, no jitter``: two identical
  reacting jobs that overlap are slowed alike, so an overlap persists); non-commensurate periods (b's compute
  and message scaled to 1.37 x a's instead of 2 x: b's period is 1.37 x a's, same duty); three jobs
  (``cluster=shared_uplink3``, periods 1 : 2 : 2);
- ``comm=null``: the same jobs sharing nothing, where no controller may gain (the null model's zero).

Each seed draws job b's initial offset (``cluster.jobs.1.start_s``) uniformly in [0, b's quiet
period) from ``default_rng([seed, 99])`` (then, with three jobs, c's in [0, c's)), and seeds the
compute-time draws and the controllers.
A job-level shift is measured in every run as ``start_shift_s``: the sum over iterations of how much
later the job's last rank arrived than it would have unpaced (``max(arrival) - max(natural)``).
Per-rank delays within earliness give 0 there; a positive value is the collective moved, by a phase
shift or by a per-rank controller's overshoot.

Writes ``results/multi_job.json`` (everything), ``results/multi_job.csv`` (one row per scenario,
controller, seed and job, the sum being job ``sum``) and ``results/multi_job.md`` (the tables).
Every figure is modelled (simulated time), so the machine's load does not move it.

    nice -n 10 python experiments/multi_job/run_study.py            # 5 seeds x 500 iterations
    python experiments/multi_job/run_study.py --seeds 3 --iterations 200 --out /tmp/mj
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from pacectl import metrics  # noqa: E402
from pacectl.config import CONF_DIR, controller_factory, controller_families  # noqa: E402
from pacectl.experiment import make_experiment  # noqa: E402
from pacectl.files import atomic_write_text  # noqa: E402
from pacectl.loop import run_episode  # noqa: E402
from pacectl.studies import change_text, combined_half_width, markdown_table, study_arguments  # noqa: E402
from pacectl.types import Episode  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
FAMILIES = ["threshold", "pid", "ewma", "quantile", "forecast", "sleep_wait", "phase"]
PER_RANK = {"threshold", "pid", "ewma", "quantile", "forecast"}
#: b's compute and message as a multiple of a's: 2 in shared_uplink (commensurate periods)
NONCOMMENSURATE = 1.37
#: scenario -> (overrides, open-loop square wave in place of job b); a ``cluster=`` override
#: replaces ``cluster=shared_uplink``
SCENARIOS: dict[str, tuple[list[str], bool]] = {
    "shared_uplink": (["comm=contention"], False),
    "oversubscription 4:1": (["comm=contention", "cluster.topology.oversubscription=4.0"], False),
    "jitter 1 %": (
        [
            "comm=contention",
            "cluster.jobs.0.compute.noise.0.sigma=0.01",
            "cluster.jobs.1.compute.noise.0.sigma=0.01",
        ],
        False,
    ),
    "kappa 0.05": (["comm=contention", "cluster.interference.kappa=0.05"], False),
    "open-loop square wave for b": (["comm=contention"], True),
    "comm=null": (["comm=null"], False),
    "no jitter": (
        [
            "comm=contention",
            "cluster.jobs.0.compute.noise.0.sigma=0.0",
            "cluster.jobs.1.compute.noise.0.sigma=0.0",
        ],
        False,
    ),
    "identical jobs, no jitter": (
        [
            "comm=contention",
            "cluster.jobs.1.compute.compute_s=0.3",
            "cluster.jobs.1.message_bytes=4.0e9",
            "cluster.jobs.0.compute.noise.0.sigma=0.0",
            "cluster.jobs.1.compute.noise.0.sigma=0.0",
        ],
        False,
    ),
    "periods 1:1.37": (
        [
            "comm=contention",
            f"cluster.jobs.1.compute.compute_s={0.3 * NONCOMMENSURATE:.6g}",
            f"cluster.jobs.1.message_bytes={4.0e9 * NONCOMMENSURATE:.6g}",
        ],
        False,
    ),
    "comm=null (periods 1:1.37)": (
        [
            "comm=null",
            f"cluster.jobs.1.compute.compute_s={0.3 * NONCOMMENSURATE:.6g}",
            f"cluster.jobs.1.message_bytes={4.0e9 * NONCOMMENSURATE:.6g}",
        ],
        False,
    ),
    "three jobs": (["cluster=shared_uplink3", "comm=contention"], False),
    "three jobs, periods 1:1.37:1.81": (
        [
            "cluster=shared_uplink3",
            "comm=contention",
            f"cluster.jobs.1.compute.compute_s={0.3 * NONCOMMENSURATE:.6g}",
            f"cluster.jobs.1.message_bytes={4.0e9 * NONCOMMENSURATE:.6g}",
            "cluster.jobs.2.compute.compute_s=0.543",
            "cluster.jobs.2.message_bytes=7.24e9",
        ],
        False,
    ),
    "comm=null (three jobs)": (["cluster=shared_uplink3", "comm=null"], False),
}


def _cfg(
    overrides: list[str], *, iterations: int, seed: int, offsets: list[float], families: list[str]
) -> Any:
    cluster = [o for o in overrides if o.startswith("cluster=")] or ["cluster=shared_uplink"]
    return compose(
        "config",
        overrides=[
            "backend=sim",
            *cluster,
            f"backend.num_iterations={iterations}",
            f"seed={seed}",
            *(f"cluster.jobs.{j + 1}.start_s={offset}" for j, offset in enumerate(offsets)),
            "controller=all",
            f"controller.families=[{','.join(families)}]" if families else "controller.families=[]",
            *(o for o in overrides if not o.startswith("cluster=")),
        ],
    )


def _square_wave(cfg: Any, experiment: Any, b_alone: Episode) -> None:
    """Replace job b by greedy on/off flows on the uplinks its ring crosses, with b's timing alone on
    the fabric: on for its mean collective, off for the rest of its mean iteration (same mean period
    and duty as b, but no jitter and no reaction)."""
    b = experiment.backend
    fab_b = b.fabrics[1]
    links = [b.link_names[k] for k in np.flatnonzero(fab_b.weights) if b.link_names[k].startswith("leaf_up")]
    on = float(np.mean(b_alone.collective_time_s))
    assert b_alone.domain_iteration_time_s is not None
    period = float(np.mean(b_alone.domain_iteration_time_s))
    with open_dict(cfg):
        offset = float(cfg.cluster.jobs[1].start_s)  # the seed's offset: the wave starts at 0, job a then
        cfg.cluster.jobs = [cfg.cluster.jobs[0]]
        cfg.cluster.jobs[0].start_s = offset
        cfg.cluster.cross_traffic.links = links
        cfg.cluster.cross_traffic.on_s = on
        cfg.cluster.cross_traffic.off_s = period - on
        cfg.cluster.cross_traffic.stagger = 0.0
        cfg.cluster.cross_traffic.rate_frac = 1.0


def start_shift_s(ep: Episode) -> dict[str, float]:
    """Per job, the sum over iterations of how much later its last rank arrived than unpaced, s."""
    out = {}
    for d, name in enumerate(ep.domain_names):
        cols = ep.domain_of_rank == d
        out[str(name)] = float(
            np.sum(ep.arrival_s[:, cols].max(axis=1) - ep.natural_arrival_s[:, cols].max(axis=1))
        )
    return out


def _job_ci(base: Episode, other: Episode, d: int) -> float:
    assert base.domain_iteration_time_s is not None and other.domain_iteration_time_s is not None
    return metrics.paired_jobs_ci95_frac(
        base.domain_iteration_time_s[:, d], other.domain_iteration_time_s[:, d]
    )


def run_cell(name: str, overrides: list[str], square: bool, *, iterations: int, seed: int) -> dict[str, Any]:
    """Every controller and the ceiling of one scenario at one seed."""
    rng = np.random.default_rng([seed, 99])
    probe = make_experiment(_cfg(overrides, iterations=2, seed=seed, offsets=[], families=[]))
    b = probe.backend
    # each later job's offset uniformly over its quiet period (b first: the two-job draws unchanged)
    offsets = [
        float(rng.uniform(0.0, job.compute.compute_s + fab.quiet_s))
        for job, fab in zip(b.jobs[1:], b.fabrics[1:], strict=True)
    ]
    offset = offsets[0]
    cfg = _cfg(overrides, iterations=iterations, seed=seed, offsets=offsets, families=FAMILIES)
    # the ceiling: each job alone on the fabric, no pacing (with the square wave: a alone, wave off)
    alone: dict[str, float] = {}
    alone_episodes: dict[str, Episode] = {}
    for job in list(cfg.cluster.jobs):
        solo = _cfg(overrides, iterations=iterations, seed=seed, offsets=offsets, families=[])
        with open_dict(solo):
            solo.cluster.jobs = [job]
            solo.cluster.cross_traffic.links = []
        with warnings.catch_warnings():  # a job alone: "no timing-dependent mechanism" is the point
            warnings.simplefilter("ignore", UserWarning)
            ep = make_experiment(solo).run("none", {})
        alone[str(job.name)] = metrics.summarize(ep)["throughput_it_per_s"]
        alone_episodes[str(job.name)] = ep
    if square:
        first = str(cfg.cluster.jobs[0].name)
        _square_wave(cfg, probe, alone_episodes[str(cfg.cluster.jobs[1].name)])
        alone = {first: alone[first]}
    experiment = make_experiment(cfg)
    episodes = {family: experiment.run(family, params) for family, params in controller_families(cfg).items()}
    # phase with each job's quiet time measured alone (the solo run above: a solo probe)
    quiet = {name: float(np.median(ep.collective_time_s)) for name, ep in alone_episodes.items()}
    phase_params = controller_families(cfg)["phase"]
    episodes["phase_probe"] = run_episode(
        experiment.backend,
        [
            controller_factory("phase", {**phase_params, "quiet_s": quiet[job.name]}, cfg.guard)
            for job in experiment.backend.jobs
        ],
        seed=int(cfg.seed),
        exchange=experiment.exchange,
    )
    # phase without its switch-off (rule 5): shifts whenever slowed, for the whole run
    episodes["phase_no_switch_off"] = experiment.run("phase", {**phase_params, "switch_off_iters": None})
    base = episodes["none"]
    runs: dict[str, Any] = {}
    for family, ep in episodes.items():
        s = metrics.summarize(ep)
        shift = start_shift_s(ep)
        runs[family] = {
            "throughput_it_per_s": s["throughput_it_per_s"],
            "throughput_change_frac": s["throughput_it_per_s"]
            / metrics.summarize(base)["throughput_it_per_s"]
            - 1,
            "throughput_change_ci95_frac": metrics.paired_change_ci95_frac(base, ep)
            if family != "none"
            else 0.0,
            "pacing_delay_total_s": s["pacing_delay_total_s"],
            "jobs": {
                job: {
                    **fig,
                    "throughput_change_frac": fig["throughput_it_per_s"]
                    / metrics.job_summaries(base)[job]["throughput_it_per_s"]
                    - 1,
                    "throughput_change_ci95_frac": _job_ci(base, ep, d) if family != "none" else 0.0,
                    "start_shift_s": shift[job],
                    # phase's quiet time in use against the one measured alone, over the run
                    "quiet_bias_frac": float(np.nanmean(ep.diagnostics["quiet_s"][:, d]) / quiet[job] - 1)
                    if family.startswith("phase")
                    else None,
                }
                for d, (job, fig) in enumerate(s["jobs"].items())
            },
        }
    return {
        "scenario": name,
        "seed": seed,
        "offset_b_s": offset,
        "offsets_s": offsets,
        "quiet_probe_s": {j.name: quiet[j.name] for j in experiment.backend.jobs},
        "comm_model_description": experiment.comm_description,
        "mechanisms": list(experiment.backend.mechanisms),
        "runs": runs,
        "ceiling": {"jobs": alone, "throughput_it_per_s": float(sum(alone.values()))},
    }


def aggregate(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds, intervals combined over seeds, the share of the collision loss recovered."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(c["scenario"] for c in cells):
        mine = [c for c in cells if c["scenario"] == name]
        families = list(mine[0]["runs"])
        none = np.array([c["runs"]["none"]["throughput_it_per_s"] for c in mine])
        ceiling = np.array([c["ceiling"]["throughput_it_per_s"] for c in mine])
        rows = {}
        for f in families:
            tp = np.array([c["runs"][f]["throughput_it_per_s"] for c in mine])
            ch = np.array([c["runs"][f]["throughput_change_frac"] for c in mine])
            hw = [c["runs"][f]["throughput_change_ci95_frac"] for c in mine]
            loss = ceiling - none
            rows[f] = {
                "throughput_it_per_s": float(tp.mean()),
                "throughput_change_frac": float(ch.mean()),
                "throughput_change_ci95_frac": combined_half_width(hw),
                "throughput_change_min_frac": float(ch.min()),
                "throughput_change_max_frac": float(ch.max()),
                "loss_recovered_frac": float(np.mean((tp - none) / loss)) if (loss > 0).all() else None,
                "jobs": {
                    job: {
                        "throughput_it_per_s": float(
                            np.mean([c["runs"][f]["jobs"][job]["throughput_it_per_s"] for c in mine])
                        ),
                        "throughput_change_frac": float(
                            np.mean([c["runs"][f]["jobs"][job]["throughput_change_frac"] for c in mine])
                        ),
                        "throughput_change_ci95_frac": combined_half_width(
                            [c["runs"][f]["jobs"][job]["throughput_change_ci95_frac"] for c in mine]
                        ),
                        "iteration_time_p99_s": float(
                            np.mean([c["runs"][f]["jobs"][job]["iteration_time_p99_s"] for c in mine])
                        ),
                        "cv": float(np.mean([c["runs"][f]["jobs"][job]["cv"] for c in mine])),
                        "start_shift_s": float(
                            np.mean([c["runs"][f]["jobs"][job]["start_shift_s"] for c in mine])
                        ),
                        "quiet_bias_frac": float(
                            np.mean([c["runs"][f]["jobs"][job]["quiet_bias_frac"] for c in mine])
                        )
                        if f.startswith("phase")
                        else None,
                    }
                    for job in mine[0]["runs"][f]["jobs"]
                },
                "pacing_delay_total_s": float(np.mean([c["runs"][f]["pacing_delay_total_s"] for c in mine])),
            }
        out[name] = {
            "seeds": [c["seed"] for c in mine],
            "mechanisms": mine[0]["mechanisms"],
            "comm_model_description": mine[0]["comm_model_description"],
            "ceiling_it_per_s": float(ceiling.mean()),
            "ceiling_jobs_it_per_s": {
                j: float(np.mean([c["ceiling"]["jobs"][j] for c in mine])) for j in mine[0]["ceiling"]["jobs"]
            },
            "collision_loss_frac": float(np.mean(1 - none / ceiling)),
            "runs": rows,
        }
    return out


def csv_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for c in cells:
        for f, r in c["runs"].items():
            rows.append(
                {
                    "scenario": c["scenario"],
                    "seed": c["seed"],
                    "offset_b_s": c["offset_b_s"],
                    "controller": f,
                    "job": "sum",
                    "throughput_it_per_s": r["throughput_it_per_s"],
                    "throughput_change_frac": r["throughput_change_frac"],
                    "throughput_change_ci95_frac": r["throughput_change_ci95_frac"],
                    "iteration_time_mean_s": np.nan,
                    "iteration_time_p99_s": np.nan,
                    "cv": np.nan,
                    "start_shift_s": np.nan,
                    "quiet_bias_frac": np.nan,
                    "ceiling_it_per_s": c["ceiling"]["throughput_it_per_s"],
                }
            )
            for job, j in r["jobs"].items():
                rows.append(
                    {
                        "scenario": c["scenario"],
                        "seed": c["seed"],
                        "offset_b_s": c["offset_b_s"],
                        "controller": f,
                        "job": job,
                        "throughput_it_per_s": j["throughput_it_per_s"],
                        "throughput_change_frac": j["throughput_change_frac"],
                        "throughput_change_ci95_frac": j["throughput_change_ci95_frac"],
                        "iteration_time_mean_s": j["iteration_time_mean_s"],
                        "iteration_time_p99_s": j["iteration_time_p99_s"],
                        "cv": j["cv"],
                        "start_shift_s": j["start_shift_s"],
                        "quiet_bias_frac": j["quiet_bias_frac"],
                        "ceiling_it_per_s": c["ceiling"]["jobs"].get(job, np.nan),
                    }
                )
    return pd.DataFrame(rows)


def markdown(agg: dict[str, Any], *, iterations: int, seeds: int, command: str) -> str:
    parts = [
        f"# Multi-job study (simulated; {seeds} seeds x {iterations} iterations per job)\n",
        f"Made by `{command}`. Changes are against no pacing, mean over seeds, +- the combined 95 % "
        "paired batch-means half-width. `recovered` = (run - none) / (ceiling - none), the share of the "
        "collision loss won back (ceiling: each job alone on the fabric). `shift a/b` = the job's last "
        "arrival moved later than unpaced, summed over the run (s): 0 for per-rank delays within earliness. "
        "`quiet bias` = phase's quiet-fabric time in use, mean over the run, against the job's collective "
        "measured alone, per job: `phase` estimates it (window minimum), `phase_probe` is given it.\n",
    ]
    for name, sc in agg.items():
        parts.append(f"\n## {name}\n")
        parts.append(
            f"Mechanisms in force: {', '.join(sc['mechanisms']) or 'none (fixed durations)'}. "
            f"Ceiling {sc['ceiling_it_per_s']:.4g} it/s "
            f"({', '.join(f'{j} {v:.4g}' for j, v in sc['ceiling_jobs_it_per_s'].items())}); "
            f"no pacing loses {100 * sc['collision_loss_frac']:.2f} % to it.\n\n"
        )
        frame = []
        for f, r in sc["runs"].items():
            row = {
                "controller": f,
                "sum (it/s)": r["throughput_it_per_s"],
                "Δ sum": change_text(
                    pd.Series([r["throughput_change_frac"]]), pd.Series([r["throughput_change_ci95_frac"]])
                )[0]
                if f != "none"
                else "baseline",
                "recovered": ""
                if r["loss_recovered_frac"] is None or f == "none"
                else f"{100 * r['loss_recovered_frac']:.0f} %",
            }
            for job, j in r["jobs"].items():
                row[f"{job} (it/s)"] = j["throughput_it_per_s"]
                row[f"Δ {job}"] = (
                    change_text(
                        pd.Series([j["throughput_change_frac"]]),
                        pd.Series([j["throughput_change_ci95_frac"]]),
                    )[0]
                    if f != "none"
                    else ""
                )
                row[f"p99 {job} (s)"] = j["iteration_time_p99_s"]
            row["shift " + "/".join(r["jobs"])] = "/".join(
                f"{j['start_shift_s']:.3g}" for j in r["jobs"].values()
            )
            row["quiet bias"] = (
                "/".join(f"{100 * j['quiet_bias_frac']:+.1f} %" for j in r["jobs"].values())
                if f.startswith("phase")
                else ""
            )
            frame.append(row)
        parts.append(markdown_table(pd.DataFrame(frame)))
    return "".join(parts)


def main() -> None:
    args = study_arguments(__doc__, iterations=500, seeds=5, out=OUT)
    command = (
        "python experiments/multi_job/run_study.py"
        + (f" --seeds {args.seeds}" if args.seeds != 5 else "")
        + (f" --iterations {args.iterations}" if args.iterations != 500 else "")
    )
    t0 = time.time()
    cells = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name, (overrides, square) in SCENARIOS.items():
            for seed in range(args.seeds):
                cells.append(run_cell(name, overrides, square, iterations=args.iterations, seed=seed))
                print(
                    f"{name} seed {seed}: "
                    + ", ".join(
                        f"{f} {100 * r['throughput_change_frac']:+.2f} %"
                        for f, r in cells[-1]["runs"].items()
                        if f != "none"
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    agg = aggregate(cells)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": command,
        "iterations": args.iterations,
        "seeds": args.seeds,
        "wall_s": time.time() - t0,
        "scenarios": agg,
        "cells": cells,
    }
    atomic_write_text(
        args.out / "multi_job.json", json.dumps(record, indent=1, sort_keys=True, default=float) + "\n"
    )
    atomic_write_text(args.out / "multi_job.csv", csv_rows(cells).to_csv(index=False, float_format="%.6g"))
    atomic_write_text(
        args.out / "multi_job.md",
        markdown(agg, iterations=args.iterations, seeds=args.seeds, command=command),
    )
    print(f"wrote {args.out}/multi_job.{{json,csv,md}} in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
