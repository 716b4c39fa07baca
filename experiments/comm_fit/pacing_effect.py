"""Does a live record fitted with comm=fitted predict the measured effect of pacing better than max-plus?

    python experiments/comm_fit/pacing_effect.py RUN_DIR/records [--controller threshold]

A live run (``python -m pacectl.run backend=torch controller=threshold``) trains no pacing and the
controller in one job, interleaved; its records hold both. The controller's record is replayed with
its own delays (the recording) and with none (the counterfactual), under max-plus and under the model
fitted from that record; each predicts the pacing effect (mean iteration with delays minus without).
The measured effect is the live difference of the two runs' mean iteration times (one job: no
interval; experiments/live_fidelity has the repeated-job machinery). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from pacectl.backends.replay import ReplayBackend
from pacectl.fabric.fitted import FittedComm
from pacectl.traces.canonical import load_canonical


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("records", type=Path)
    parser.add_argument("--controller", default="threshold")
    args = parser.parse_args()
    none = load_canonical(args.records / "none.parquet")
    paced = load_canonical(args.records / f"{args.controller}.parquet")
    live = float(np.mean(paced.measured_step_time_s) - np.mean(none.measured_step_time_s))
    backend = ReplayBackend(paced)
    recorded = backend.dag.delay_s[backend._paced].transpose(1, 0, 2).reshape(backend.num_iterations, -1)

    def mean(end: np.ndarray) -> float:
        return float(end.max(axis=(0, 2)).mean())

    max_plus = mean(backend.replayed_times(recorded)[1]) - mean(backend.replayed_times()[1])
    model = FittedComm.for_backend(backend)
    fitted = mean(model.replay(backend, recorded)[1]) - mean(model.replay(backend)[1])
    out = {
        "records": str(args.records),
        "controller": args.controller,
        "live_effect_s": live,
        "max_plus_predicted_s": max_plus,
        "fitted_predicted_s": fitted,
        "max_plus_abs_error_s": abs(max_plus - live),
        "fitted_abs_error_s": abs(fitted - live),
        "fit_verdict": model.fit.verdict if model.fit else None,
        "loadavg": os.getloadavg(),
        "note": "one live job, no interval; the machine was shared by several engineers",
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
