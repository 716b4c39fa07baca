"""phase's switch-off over longer runs: what is left of its loss at non-commensurate periods.

With its switch-off (rule 5 of :mod:`pacectl.controllers.phase`), a job whose shifts do not pay
shifts only in its first judged window (``switch_off_iters`` observations after an unpaced
baseline of as many), then runs unpaced. Its loss against no pacing should then shrink about as
``1 / num_iterations``, while a job whose shifts pay keeps shifting. This script runs ``none``,
``phase`` (switch-off, the default) and ``phase_no_switch_off`` (``switch_off_iters=null``) on the
multi-job study's scenarios (``run_study.SCENARIOS``, the same seeded offsets) at several run
lengths, and writes ``results/switch_off_long.{json,md}``: per scenario, length and controller, the
mean over seeds of the summed throughput change with a Student-t 95 % half-width over seeds.
Every figure is simulated time.

    nice -n 10 python experiments/multi_job/switch_off_long.py                 # 10 seeds, 500 and 2000
    python experiments/multi_job/switch_off_long.py --seeds 2 --iterations 300 --out /tmp/so
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import run_study  # noqa: E402
from hydra import initialize_config_dir  # noqa: E402

from pacectl import metrics  # noqa: E402
from pacectl.config import CONF_DIR  # noqa: E402
from pacectl.experiment import make_experiment  # noqa: E402
from pacectl.files import atomic_write_text  # noqa: E402
from pacectl.studies import study_arguments  # noqa: E402

SCENARIOS = (
    "shared_uplink",
    "periods 1:1.37",
    "three jobs",
    "three jobs, periods 1:1.37:1.81",
    "comm=null (periods 1:1.37)",
)
LENGTHS = (500, 2000)
ARMS = {"phase": {}, "phase_no_switch_off": {"switch_off_iters": None}}


def cell(
    name: str, *, iterations: int, seed: int, arms: dict[str, dict[str, object]] = ARMS
) -> dict[str, float]:
    """Summed throughput change against none of each arm (``phase`` with these parameters), one
    scenario, one length, one seed."""
    overrides, _ = run_study.SCENARIOS[name]
    rng = np.random.default_rng([seed, 99])  # the study's offsets for this seed
    probe = make_experiment(run_study._cfg(overrides, iterations=2, seed=seed, offsets=[], families=[]))
    b = probe.backend
    offsets = [
        float(rng.uniform(0.0, job.compute.compute_s + fab.quiet_s))
        for job, fab in zip(b.jobs[1:], b.fabrics[1:], strict=True)
    ]
    cfg = run_study._cfg(overrides, iterations=iterations, seed=seed, offsets=offsets, families=[])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        experiment = make_experiment(cfg)
        base = metrics.summarize(experiment.run("none", {}))["throughput_it_per_s"]
        return {
            arm: metrics.summarize(experiment.run("phase", params))["throughput_it_per_s"] / base - 1
            for arm, params in arms.items()
        }


def main() -> None:
    args = study_arguments(__doc__, iterations=0, seeds=10, out=run_study.OUT, min_iterations=0)
    lengths = LENGTHS if args.iterations == 0 else (args.iterations,)
    command = (
        "python experiments/multi_job/switch_off_long.py"
        + (f" --seeds {args.seeds}" if args.seeds != 10 else "")
        + (f" --iterations {args.iterations}" if args.iterations else "")
    )
    t0 = time.time()
    rows: list[dict[str, object]] = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in SCENARIOS:
            for n in lengths:
                per_seed = [cell(name, iterations=n, seed=s) for s in range(args.seeds)]
                for arm in ARMS:
                    x = 100 * np.array([c[arm] for c in per_seed])
                    half = (
                        float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
                        if len(x) > 1
                        else 0.0
                    )
                    rows.append(
                        {
                            "scenario": name,
                            "iterations": n,
                            "controller": arm,
                            "change_pct": float(x.mean()),
                            "half_width_pct": half,
                            "min_pct": float(x.min()),
                            "max_pct": float(x.max()),
                            "per_seed_pct": x.tolist(),
                        }
                    )
                    print(f"{name} n={n} {arm}: {x.mean():+.2f} ±{half:.2f} %", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"command": command, "seeds": args.seeds, "wall_s": time.time() - t0, "rows": rows}
    atomic_write_text(args.out / "switch_off_long.json", json.dumps(record, indent=1) + "\n")
    lines = [
        f"# phase's switch-off over run length (made by `{command}`; simulated)\n",
        "Summed throughput change against no pacing, mean over seeds ± Student-t 95 % over seeds "
        "(per-seed range).\n",
        "| scenario | iterations | controller | change (%) | per seed (%) |",
        "|---|---|---|---|---|",
        *(
            f"| {r['scenario']} | {r['iterations']} | {r['controller']} | {r['change_pct']:+.2f} "
            f"±{r['half_width_pct']:.2f} | {r['min_pct']:+.2f} to {r['max_pct']:+.2f} |"
            for r in rows
        ),
    ]
    atomic_write_text(args.out / "switch_off_long.md", "\n".join(lines) + "\n")
    print(f"wrote {args.out}/switch_off_long.{{json,md}} in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
