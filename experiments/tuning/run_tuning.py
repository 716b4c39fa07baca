"""Tune every controller family on every profile, then judge the winners on held-out episodes.

Usage::

    python experiments/tuning/run_tuning.py                   # overwrites the committed results/ record
    python experiments/tuning/run_tuning.py --trials 30 --profiles st paper_like --out /tmp/tuning
    python experiments/tuning/run_tuning.py --trials 4 --profiles st --families threshold --out /tmp/tuning-quick
    python experiments/tuning/run_tuning.py --launcher joblib --launcher-arg hydra.launcher.n_jobs=4
    python experiments/tuning/run_tuning.py --launcher submitit_slurm --launcher-arg hydra.launcher.partition=cpu

``--out DIR`` (default: ``experiments/tuning/results``, the committed record, which a run
overwrites) receives ``results.json`` and ``results.md``.

For each profile (``ar`` and ``st``: replay of the shipped ByteDance traces, comm model null;
``paper_like``: the scaling study's sim scenario, comm model contention, or ``contended`` when
``conf/cluster/paper_like.yaml`` is missing) and each family (threshold, pid, ewma, quantile), it
runs :func:`pacectl.tuning.study.run_tuning` (NSGA-II, the throughput-loss cap of ``conf/tune.yaml``, one
worker by default, so that a rerun reproduces the record) and takes the exported choice. Then it evaluates, on episodes that tuning never saw:

- sim profiles: the held-out seeds ``tune.sim.heldout_seeds``;
- trace profiles: the other shipped trace (tuned on AR -> judged on ST, and the reverse).

On the same held-out episodes it runs no pacing and the paper's threshold controller at its
defaults, and reports whether the tuned controller dominates the paper's controller (throughput at
least as high and CV at least as low, one of them strictly).

``--launcher`` runs each profile's studies (one per family) as the jobs of a Hydra sweep of
``pacectl.tune`` through that launcher (:func:`pacectl.studies.launch_sweep`); this process then
judges each job's choice (its ``tune.json``) on the held-out episodes, as it judges an in-process
study's: the same record either way (``tests/test_launchers.py``). ``wall_s`` is the tuning's own
time (``tune.json``'s ``wall_time_s``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from pacectl.config import CONF_DIR, shipped_controller
from pacectl.files import folder_problem, staged_outputs
from pacectl.report import jsonable
from pacectl.studies import add_launcher_arguments, launch_sweep
from pacectl.tuning.scenarios import Evaluation, build_scenarios
from pacectl.tuning.settings import reference_params
from pacectl.tuning.study import run_tuning
from pacectl.tuning.verdict import dominates

HERE = Path(__file__).resolve().parent
FAMILIES = ("threshold", "pid", "ewma", "quantile", "forecast")
HELDOUT_TRACES = {"ar": "st", "st": "ar"}


def _cfg(overrides: list[str]) -> Any:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("tune", overrides=overrides)


def _row(ev: Evaluation, base: Evaluation) -> dict[str, float]:
    return {
        "throughput_it_per_s": ev.throughput_it_per_s,
        "throughput_change_frac": ev.throughput_it_per_s / base.throughput_it_per_s - 1.0,
        "cv": ev.cv,
    }


def run(
    profiles: list[str],
    trials: int,
    workers: int,
    out_root: Path,
    families: tuple[str, ...] | list[str] = FAMILIES,
    exchange_lag: int = 1,
    launcher: str | None = None,
    launcher_overrides: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """Tune and evaluate; return the results dict. ``exchange_lag``: the decision lag of tuning and
    evaluation alike (``exchange.lag_iters``; 2 is a live job's piggyback exchange). ``launcher``:
    run the studies as sweep jobs through this Hydra launcher (``launcher_overrides``: its
    ``hydra.launcher.*`` settings), else in this process."""
    results: dict[str, Any] = {
        "trials_per_study": trials,
        "workers": workers,
        "exchange_lag_iters": exchange_lag,
        "profiles": {},
    }
    lag = [f"exchange.lag_iters={exchange_lag}"]
    for profile in profiles:
        if profile in HELDOUT_TRACES:
            heldout_cfg = _cfg([f"cluster={HELDOUT_TRACES[profile]}", *lag])
            heldout = build_scenarios(heldout_cfg)
            heldout_what = f"trace {', '.join(heldout.labels)} (profile {HELDOUT_TRACES[profile]})"
        else:
            heldout_cfg = _cfg([f"cluster={profile}", *lag])
            heldout = build_scenarios(heldout_cfg, seeds=list(heldout_cfg.tune.sim.heldout_seeds))
            heldout_what = f"seeds {list(heldout_cfg.tune.sim.heldout_seeds)}"
        none = heldout.evaluate("none", {})
        paper = heldout.evaluate("threshold", reference_params())
        # the forecast family's shipped defaults (its margin was picked on seeds 0-4 of the staleness
        # study's profiles): judged here on episodes nobody picked anything on
        forecast = heldout.evaluate("forecast", shipped_controller("forecast", heldout_cfg))
        entry: dict[str, Any] = {
            "heldout": heldout_what,
            "heldout_comm_model": heldout.comm_model,
            "heldout_none": _row(none, none),
            "heldout_paper_threshold": _row(paper, none),
            "heldout_forecast_defaults": _row(forecast, none),
            "families": {},
        }
        settings = [
            f"cluster={profile}",
            f"tune.n_trials={trials}",
            f"tune.n_workers={workers}",
            "tune.population_size=10",
            "tune.progress=false",
            *lag,
        ]
        if launcher:  # one sweep of pacectl.tune per profile, one job per family
            jobs = launch_sweep(
                "pacectl.tune",
                settings,
                {"controller": list(families)},
                launcher=launcher,
                launcher_overrides=launcher_overrides,
                sweep_dir=out_root / profile,
            )
            tune_json = {given["controller"]: job / "tune.json" for given, job in jobs}
        else:
            tune_json = {}
            for family in families:
                out_dir = out_root / f"{profile}-{family}"
                run_tuning(_cfg([*settings, f"controller={family}"]), out_dir, echo=lambda _line: None)
                tune_json[family] = out_dir / "tune.json"
        for family in families:
            s = json.loads(tune_json[family].read_text())
            params = {k: v for k, v in s["chosen"]["controller"].items() if k != "name"}
            tuned = heldout.evaluate(family, params)
            entry["tuned_on"] = f"{s['scenarios']['kind']}: {', '.join(s['scenarios']['labels'])}"
            entry["comm_model"] = s["comm_model"]
            chosen = s["chosen"]
            entry["families"][family] = {
                "chosen_params": params,
                "tune_set": {
                    "throughput_change_frac": -chosen["throughput_loss_frac"],
                    "cv": chosen["cv"],
                    "feasible": chosen["feasible"],
                    "improves_on_no_pacing": s["improves_on_no_pacing"],
                    "paper_threshold_cv": s["reference_threshold"]["cv"],
                    "none_cv": s["baseline_none"]["cv"],
                    "pareto_size": s["pareto_size"],
                    "front_dominates_paper": s["front_dominates_reference"],
                    "chosen_dominates_paper": s["chosen_dominates_reference"],
                },
                "heldout": _row(tuned, none),
                "heldout_dominates_paper": dominates(tuned, paper),
                "heldout_dominates_none": dominates(tuned, none),
                "wall_s": s["wall_time_s"],
            }
            print(
                f"{profile:10s} {family:9s} tune cv {chosen['cv']:.4g} ({-chosen['throughput_loss_frac']:+.3%}) | "
                f"held-out cv {tuned.cv:.4g} ({tuned.throughput_it_per_s / none.throughput_it_per_s - 1:+.3%}) "
                f"vs paper cv {paper.cv:.4g} ({paper.throughput_it_per_s / none.throughput_it_per_s - 1:+.3%}), "
                f"none cv {none.cv:.4g}; dominates paper: {dominates(tuned, paper)}",
                flush=True,
            )
        results["profiles"][profile] = entry
    return results


def markdown(results: dict[str, Any]) -> str:
    """A Markdown table of the held-out comparison (and the decision lag, when not 1)."""
    lag = int(results.get("exchange_lag_iters", 1))
    lines = [
        f"Decision lag {lag} iterations (exchange.lag_iters={lag}), in tuning and held-out evaluation.",
        "",
    ] * (lag != 1)
    lines += [
        "| profile (tuned on -> held out) | family | tune set: Δthroughput, CV | held out: Δthroughput, CV | "
        "paper threshold held out: Δthroughput, CV | no pacing CV | dominates paper? |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for profile, entry in results["profiles"].items():
        paper = entry["heldout_paper_threshold"]
        for family, f in entry["families"].items():
            t, h = f["tune_set"], f["heldout"]
            lines.append(
                f"| {profile} ({entry['tuned_on']} -> {entry['heldout']}; comm {entry['comm_model']}) | {family} | "
                f"{t['throughput_change_frac']:+.3%}, {t['cv']:.4f} | {h['throughput_change_frac']:+.3%}, {h['cv']:.4f} | "
                f"{paper['throughput_change_frac']:+.3%}, {paper['cv']:.4f} | {entry['heldout_none']['cv']:.4f} | "
                f"{'yes' if f['heldout_dominates_paper'] else 'no'} |"
            )
    lines += [
        "",
        "Shipped defaults on the held-out episodes (no tuning): the paper's threshold controller and the forecast "
        "controller (their constructor defaults).",
        "",
        "| profile (held out) | no pacing CV | paper threshold: Δthroughput, CV | forecast: Δthroughput, CV |",
        "| --- | --- | --- | --- |",
    ]
    for profile, entry in results["profiles"].items():
        paper, forecast = entry["heldout_paper_threshold"], entry.get("heldout_forecast_defaults")
        if forecast is None:  # records made before the forecast family
            continue
        lines.append(
            f"| {profile} ({entry['heldout']}; comm {entry['heldout_comm_model']}) | "
            f"{entry['heldout_none']['cv']:.4f} | {paper['throughput_change_frac']:+.3%}, {paper['cv']:.4f} | "
            f"{forecast['throughput_change_frac']:+.3%}, {forecast['cv']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=60, help="trials per study (default: 60)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes per study (default: 1, so that a rerun reproduces the record: workers "
        "interleave their trials differently every time)",
    )
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=["ar", "st", "paper_like", "contended", "alibaba_pai"],
        help="cluster profiles (default: ar st paper_like contended alibaba_pai, the committed record's)",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        default=list(FAMILIES),
        choices=FAMILIES,
        help=f"controller families (default: {' '.join(FAMILIES)})",
    )
    parser.add_argument(
        "--exchange-lag",
        type=int,
        default=1,
        help="decision lag in iterations for tuning and held-out evaluation (exchange.lag_iters; "
        "default 1, a live gloo job's; 2 is NCCL's piggyback exchange)",
    )
    add_launcher_arguments(parser, "the studies as jobs of a pacectl.tune sweep")
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "results",
        help="folder for results.json and results.md (default: experiments/tuning/results, the "
        "committed record, which this run then overwrites)",
    )
    args = parser.parse_args(argv)
    if args.exchange_lag < 1:
        parser.error(f"--exchange-lag must be an integer >= 1, got {args.exchange_lag}")
    problem = folder_problem(args.out)
    if problem:  # before the studies run, not after
        parser.error(f"--out {args.out}: {problem}; pick a folder you can write to")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run(
            args.profiles,
            args.trials,
            args.workers,
            Path(tmp),
            families=args.families,
            exchange_lag=args.exchange_lag,
            launcher=args.launcher,
            launcher_overrides=args.launcher_arg,
        )
    results["wall_s"] = time.perf_counter() - t0
    out = args.out
    with staged_outputs(out) as stage:  # both files, or neither
        (stage / "results.json").write_text(json.dumps(jsonable(results), indent=2) + "\n")
        (stage / "results.md").write_text(markdown(results))
    print(markdown(results))
    print(f"total {results['wall_s']:.0f} s; results in {out}")


if __name__ == "__main__":
    main()
