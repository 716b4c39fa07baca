"""phase's opt-in futility stop (``controller.futility_z``), checked on seeds the study does not use.

The shipped switch-off (rule 5 of :mod:`pacectl.controllers.phase`) judges one whole window of
``switch_off_iters`` observations with shifts allowed before it commits or switches off. Where
shifts cannot pay (non-commensurate periods) that window is the whole of its loss. The futility
stop ends the window early once its running cost is clearly above the baseline's. This script
measures what that buys and costs: ``phase`` (shipped) and ``phase`` with ``futility_z=2`` on the
multi-job study's scenarios, at 500 iterations, on seeds 10-39 (held out: the study and
``switch_off_long.py`` use seeds 0-9, on which the threshold 2 was picked), with each seed's
offsets drawn as the study draws them. Per scenario: the mean over seeds of the summed throughput
change against no pacing for each arm, and the paired difference (futility minus shipped) with a
Student-t 95 % half-width over seeds. Writes ``results/futility_check.{json,md}``. Simulated time.

    nice -n 10 python experiments/multi_job/futility_check.py          # about 2 min on 2 cores
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
import switch_off_long  # noqa: E402
from hydra import initialize_config_dir  # noqa: E402

from pacectl.config import CONF_DIR  # noqa: E402
from pacectl.files import atomic_write_text  # noqa: E402

SCENARIOS = (
    "shared_uplink",
    "oversubscription 4:1",
    "jitter 1 %",
    "three jobs",
    "periods 1:1.37",
    "three jobs, periods 1:1.37:1.81",
    "comm=null (periods 1:1.37)",
)
SEEDS = range(10, 40)
ITERATIONS = 500
ARMS: dict[str, dict[str, object]] = {"phase": {}, "phase_futility_z2": {"futility_z": 2.0}}


def _half(x: np.ndarray) -> float:
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def main() -> None:
    command = "python experiments/multi_job/futility_check.py"
    t0 = time.time()
    rows = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name in SCENARIOS:
            cells = [switch_off_long.cell(name, iterations=ITERATIONS, seed=s, arms=ARMS) for s in SEEDS]
            x = {arm: 100 * np.array([c[arm] for c in cells]) for arm in ARMS}
            diff = x["phase_futility_z2"] - x["phase"]
            row = {
                "scenario": name,
                **{f"{arm}_pct": float(v.mean()) for arm, v in x.items()},
                **{f"{arm}_half_width_pct": _half(v) for arm, v in x.items()},
                "difference_pct": float(diff.mean()),
                "difference_half_width_pct": _half(diff),
                "seeds_worse": int((diff < 0).sum()),
                "seeds_better": int((diff > 0).sum()),
                "per_seed_pct": {arm: v.tolist() for arm, v in x.items()},
            }
            rows.append(row)
            print(f"{name}: phase {row['phase_pct']:+.2f}, futility {row['phase_futility_z2_pct']:+.2f}, "
                  f"difference {row['difference_pct']:+.2f} ±{row['difference_half_width_pct']:.2f}",
                  file=sys.stderr, flush=True)  # fmt: skip
    out = run_study.OUT
    record = {
        "command": command,
        "seeds": list(SEEDS),
        "iterations": ITERATIONS,
        "arms": ARMS,
        "wall_s": time.time() - t0,
        "rows": rows,
    }
    atomic_write_text(out / "futility_check.json", json.dumps(record, indent=1) + "\n")
    lines = [
        f"# phase's futility stop on held-out seeds (made by `{command}`; simulated)\n",
        f"Seeds {SEEDS.start}-{SEEDS.stop - 1}, {ITERATIONS} iterations. Summed throughput change against no "
        "pacing, mean over seeds ± Student-t 95 % over seeds; the difference is paired per seed.\n",
        "| scenario | phase (shipped) | phase, futility_z=2 | difference (pp) | seeds worse / better |",
        "|---|---|---|---|---|",
        *(
            f"| {r['scenario']} | {r['phase_pct']:+.2f} ±{r['phase_half_width_pct']:.2f} | "
            f"{r['phase_futility_z2_pct']:+.2f} ±{r['phase_futility_z2_half_width_pct']:.2f} | "
            f"{r['difference_pct']:+.2f} ±{r['difference_half_width_pct']:.2f} | "
            f"{r['seeds_worse']} / {r['seeds_better']} |"
            for r in rows
        ),
    ]
    atomic_write_text(out / "futility_check.md", "\n".join(lines) + "\n")
    print(f"wrote {out}/futility_check.{{json,md}} in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
