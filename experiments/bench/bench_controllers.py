"""Benchmark: what one decision (``Controller.act``) costs, per controller, over 64-65,536 ranks.

Usage::

    python experiments/bench/bench_controllers.py                      # writes results/controllers.json
    python experiments/bench/bench_controllers.py --against /tmp/old   # also the checkout at /tmp/old
    python experiments/bench/bench_controllers.py --ranks 64 16384 --decisions 100

Every registered family (``none``, the families of ``controller=all``, and those outside it: ``phase``,
``sleep_wait``), each with its defaults, bare and behind the safety guard with its defaults (as every
run uses it). Each controller first decides ``window`` times on
synthetic arrivals (:func:`pacectl.testing.observations.synthetic_natural_arrivals`: every window
full), then ``--decisions`` more, each timed alone; the figure is the median of those (the machine may
be shared: a median of single calls is robust to another process's bursts, a mean is not). With
``--against DIR`` the same runs with ``PYTHONPATH=DIR`` in a child process, one size after the other
alternating with this checkout's, and its rows are labelled ``checkout: "against"``. The record holds
the command and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

RANKS = [64, 256, 1024, 4096, 16384, 65536]


def measure(num_ranks: int, decisions: int) -> list[dict[str, object]]:
    """Median microseconds per decision of every family at ``num_ranks`` ranks, bare and guarded."""
    import numpy as np

    from pacectl.controllers import make_controller
    from pacectl.controllers.guard import SafetyGuard
    from pacectl.controllers.registry import FAMILIES
    from pacectl.testing import make_observation
    from pacectl.testing.observations import synthetic_natural_arrivals

    warm = 32
    naturals = synthetic_natural_arrivals(num_ranks, warm + decisions, seed=0)
    observations = [make_observation(n, iteration=k) for k, n in enumerate(naturals)]
    rows = []
    for family in ["none", *(f for f in FAMILIES if f != "none")]:
        for guarded in (False, True):
            controller = SafetyGuard(make_controller(family)) if guarded else make_controller(family)
            controller.reset(num_ranks, np.random.default_rng(0))
            for obs in observations[:warm]:
                controller.act(obs)
            times = []
            for obs in observations[warm:]:
                t0 = time.perf_counter()
                controller.act(obs)
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "controller": family,
                    "guarded": guarded,
                    "num_ranks": num_ranks,
                    "us_per_decision": median(times) * 1e6,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="*", default=RANKS)
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--against", type=Path, default=None, help="another checkout, measured alongside")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "controllers.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one size, printed as JSON for the parent
        print(json.dumps(measure(args.ranks[0], args.decisions)))
        return
    load_before = os.getloadavg()
    rows = []
    for num_ranks in args.ranks:
        checkouts = [("this", None)] + ([("against", args.against)] if args.against else [])
        for label, path in checkouts:
            if path is None:
                found = measure(num_ranks, args.decisions)
            else:
                env = {**os.environ, "PYTHONPATH": str(path)}
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--ranks",
                    str(num_ranks),
                    "--decisions",
                    str(args.decisions),
                ]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=path)
                found = json.loads(done.stdout.strip().splitlines()[-1])
            for row in found:
                rows.append({"checkout": label, **row})
                guard = "guarded" if row["guarded"] else "bare"
                print(
                    f"{label:>7} {row['num_ranks']:>6} ranks {row['controller']:>9} {guard:>7}: "
                    f"{row['us_per_decision']:9.1f} us",
                    flush=True,
                )
    from _record import write_record

    write_record(
        args.out,
        rows,
        command=" ".join(["python", *sys.argv]),
        against=args.against,
        decisions=args.decisions,
        loadavg_before=list(load_before),
        loadavg_after=list(os.getloadavg()),
        cpu_count=os.cpu_count(),
    )


if __name__ == "__main__":
    main()
