"""Fit the communication-timing model (comm=fitted, pacectl/fabric/fitted.py) to every shipped trace
with real timing, plus any live records named on the command line, and record the fits.

    python experiments/comm_fit/run_fits.py [--records RUN_DIR/records/none.parquet ...] [--out DIR]

Traces: ByteDance AR and ST (Megatron, NCCL), the H200 gloo capture as Kineto JSON (4 profiler
steps) and as its DDP-hook CSVs (170 iterations, converted here with the live backend's own
marks-to-ops rule), and live gloo records. Writes ``fits.json`` (every fit's ``to_dict()``) and
``table.md`` into ``--out`` (default: results/ beside this file).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pacectl.backends.replay import ReplayBackend
from pacectl.data import shipped_trace
from pacectl.fabric.fitted import CommFit, fit_backend
from pacectl.torchdist.core import marks_to_ops, rows_to_trace
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.canonical import load_canonical
from pacectl.traces.kineto import import_kineto
from pacectl.traces.model import OpTrace

H200 = Path(__file__).resolve().parents[2] / "pacectl" / "data" / "h200-capture"
#: Backward after the last bucket's hand-off, s: not recorded by the capture; 0.1 ms, so the replay's
#: DAG sees the last bucket posted during backward (as DDP posts it) rather than after it.
TAIL_S = 1e-4


def h200_csv_trace(first_iteration: int = 30) -> OpTrace:
    """The H200 capture's DDP-hook CSVs as a canonical trace (the live backend's marks_to_ops rule).

    Per rank and iteration: forward-compute ``[start, forward_end)`` (from the iteration's earliest
    start over the ranks: one host, one clock), backward segment j up to bucket j's hand-off, bucket
    j's all-reduce ``[enter_j, exit_j)``, backward ending :data:`TAIL_S` after the last hand-off (DDP
    hands the last bucket off when backward ends), then the rank's own step end (a local ``optimizer`` op up to the
    iteration's end: the capture has no end-of-step collective).
    Iterations before ``first_iteration`` (DDP's bucket rebuild, the profiler's steps 20-26) are
    left out.
    """
    iters = pd.read_csv(H200 / "gloo4_iters.csv")
    buckets = pd.read_csv(H200 / "gloo4_buckets.csv")
    iters = iters[iters["iteration"] >= first_iteration]
    t0 = iters.groupby("iteration")["start_ns"].min()
    rows = []
    for (rank, it), b in buckets[buckets["iteration"] >= first_iteration].groupby(["rank", "iteration"]):
        row = iters[(iters["rank"] == rank) & (iters["iteration"] == it)].iloc[0]
        base = t0[it]
        b = b.sort_values("bucket")
        enter = ((b["enter_ns"] - base) / 1e9).tolist()
        exit_ = ((b["exit_ns"] - base) / 1e9).tolist()
        rows += marks_to_ops(
            step=int(it),
            rank=int(rank),
            forward_end_s=(row["forward_end_ns"] - base) / 1e9,
            hook_call_s=enter,
            hook_return_s=enter,
            enter_s=enter,
            exit_s=exit_,
            backward_end_s=max(max(exit_), (row["end_ns"] - base) / 1e9 - 1e-6),
            sync_exit_s=(row["end_ns"] - base) / 1e9,
            applied_delay_s=0.0,
            backward_compute_end_s=enter[-1] + TAIL_S,
        )
    # each rank's own iteration end closes its step (the capture has no end-of-step collective): a
    # local op, not the DP-synchronised bookkeeping marks_to_ops writes for a live run
    rows = [(*r[:4], "optimizer", *r[5:]) if r[4] == "optimizer-clip-main-grad" else r for r in rows]
    return rows_to_trace(rows, world_size=4, name="gloo4-csv", source=str(H200 / "gloo4_{iters,buckets}.csv"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", nargs="*", default=[], help="live records (canonical parquet)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--skip-shipped", action="store_true", help="fit only --records")
    args = parser.parse_args()
    traces: list[tuple[str, OpTrace]] = []
    if not args.skip_shipped:
        traces += [("AR", load_bytedance(*shipped_trace("AR"))), ("ST", load_bytedance(*shipped_trace("ST")))]
        kin, _ = import_kineto(sorted(glob.glob(str(H200 / "gloo4_rank*.json.gz"))))
        traces += [
            ("H200 gloo, Kineto (4 steps)", kin),
            ("H200 gloo, hook CSVs (170 iterations)", h200_csv_trace()),
        ]
    traces += [(f"live record {Path(p).parent.name}/{Path(p).name}", load_canonical(p)) for p in args.records]
    fits: dict[str, dict] = {}
    lines = [
        "| trace | op instances | slopes (class/feature: estimate [95 % CI]) | joint p | placebo p | held-out R² | completion on last arrival | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, trace in traces:
        t = time.perf_counter()
        fit: CommFit = fit_backend(ReplayBackend(trace))
        took = time.perf_counter() - t
        record = fit.to_dict()
        record["fit_seconds"] = took
        fits[name] = record
        slopes = "; ".join(
            f"{c.op_class}/{c.feature} {c.estimate:+.3f} [{c.ci95_low:+.3f}, {c.ci95_high:+.3f}]"
            for c in fit.fit.coefficients
            if c.identified
        )
        arrival = "; ".join(
            f"{c.op_class} {c.estimate:.2f} [{c.ci95_low:.2f}, {c.ci95_high:.2f}]"
            for c in fit.arrival
            if c.identified
        )
        lines.append(
            f"| {name} | {fit.fit.num_obs} | {slopes or 'none identified'} | {fit.fit.wald_p_value:.2g} | "
            f"{fit.placebo.wald_p_value:.2g} | {fit.heldout_r2:.3f} | {arrival} | {fit.verdict} |"
        )
        print(f"{name}: {fit.verdict} ({took:.1f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, shared by several engineers)",
        "loadavg": os.getloadavg(),
        "numpy": np.__version__,
    }
    (args.out / "fits.json").write_text(json.dumps({"meta": meta, "fits": fits}, indent=2, default=str))
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
