"""Energy study: what pacing saves when it cannot speed a job up, and the power-coupled straggler.

Runs ``pacectl.run`` in-process (the package API, Hydra's compose) on:

1. the shipped real traces AR and ST (replay, comm=null: max-plus), every controller with both
   actuators (``backend.actuator=both``), energy under ``cluster.power=h100_sxm``;
2. the simulator (``cluster=paper_like``, 64 ranks, 8 per node, comm=null so that any gain is the
   power cap's), with the node power cap off and at 8 x 450 W per node (``cluster.power_cap.node_w=3600``),
   controllers none, sleep_wait, threshold and forecast in iteration units, both actuators.

Writes ``results/energy.json`` (each run's throughput and energy changes with their paired
intervals, the oracle bound and the share of it each controller reaches, the energy change at every
spinning power of ``energy_vs_spin_w``, the machine's load) and ``results/energy.md`` (the tables).
The machine is shared by other engineers: nothing here is a timing measurement, every figure is
modelled, so the load does not move it (it is recorded anyway).

    python experiments/energy/run_energy.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hydra import compose, initialize_config_dir  # noqa: E402

from pacectl import run  # noqa: E402
from pacectl.config import CONF_DIR  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"

SCENARIOS = {
    "AR replay": [
        "trace=ar",
        "backend.actuator=both",
        "analysis.whatif=false",
        "controller.families=[threshold,pid,ewma,quantile,forecast,sleep_wait]",
    ],
    "ST replay": [
        "trace=st",
        "backend.actuator=both",
        "analysis.whatif=false",
        "controller.families=[threshold,pid,ewma,quantile,forecast,sleep_wait]",
    ],
    "sim, no cap": [
        "backend=sim",
        "cluster=paper_like",
        "backend.num_ranks=64",
        "backend.num_iterations=300",
        "backend.actuator=both",
        "controller.units=iteration",
        "controller.families=[threshold,forecast,sleep_wait]",
    ],
    "sim, cap 3600 W/node": [
        "backend=sim",
        "cluster=paper_like",
        "cluster.power_cap.node_w=3600",
        "backend.num_ranks=64",
        "backend.num_iterations=300",
        "backend.actuator=both",
        "controller.units=iteration",
        "controller.families=[threshold,forecast,sleep_wait]",
    ],
}


def one(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[*overrides, "output.iterations=false", "output.plots=false"]
        )
    with tempfile.TemporaryDirectory() as tmp:
        return run.run_experiment(cfg, Path(tmp))


def main() -> None:
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": "shared 2-core development machine (other engineers' jobs running); modelled figures",
        "loadavg": os.getloadavg(),
        "scenarios": {},
    }
    lines = []
    for name, overrides in SCENARIOS.items():
        s = one(overrides)
        runs = {}
        for run_name, r in s["runs"].items():
            vs = s["vs_baseline"].get(run_name, {})
            runs[run_name] = {
                "throughput_change_frac": vs.get("throughput_change_frac", 0.0),
                "throughput_change_ci95_frac": vs.get("throughput_change_ci95_frac"),
                "energy_change_frac": vs.get("energy_change_frac", 0.0),
                "energy_change_ci95_frac": vs.get("energy_change_ci95_frac"),
                "oracle_bound_reached_frac": vs.get("oracle_bound_reached_frac"),
                "energy_per_iteration_j": r["energy_per_iteration_j"],
                "iteration_time_mean_s": r["iteration_time_mean_s"],
            }
        record["scenarios"][name] = {
            "overrides": overrides,
            "comm_model": s["comm_model_description"],
            "power_profile": s["power"]["name"],
            "energy_bound": s["energy_bound"],
            "energy_vs_spin_w": s["energy_vs_spin_w"]["by_spin_w"],
            "mechanisms": s.get("sim", {}).get("mechanisms"),
            "runs": runs,
        }
        lines += [
            f"### {name}",
            "",
            f"`{' '.join(overrides)}`; {s['comm_model_description']}; power profile {s['power']['name']}; "
            f"oracle bound {100 * s['energy_bound']['oracle_saving_frac']:.2f} % of no pacing's energy",
            "",
            "| run | Δthroughput (%) | ΔE (%) | of bound (%) | ΔE at spin = sleep power (%) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        null_spin = min(s["energy_vs_spin_w"]["by_spin_w"], key=float)
        for run_name, r in runs.items():
            if run_name == "none":
                continue

            def pm(v, ci):
                return f"{100 * v:+.2f} ±{100 * ci:.2f}" if ci is not None else f"{100 * v:+.2f}"

            bound = r["oracle_bound_reached_frac"]
            lines.append(
                f"| {run_name} | {pm(r['throughput_change_frac'], r['throughput_change_ci95_frac'])} | "
                f"{pm(r['energy_change_frac'], r['energy_change_ci95_frac'])} | "
                f"{'n/a' if bound is None else f'{100 * bound:.1f}'} | "
                f"{100 * s['energy_vs_spin_w']['by_spin_w'][null_spin][run_name]:+.2f} |"
            )
        lines.append("")
        print(f"done: {name}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "energy.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    (OUT / "energy.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
