"""Benchmark: wall time of the full what-if analysis (Lin et al., OSDI 2025) on a shipped trace.

Usage::

    python experiments/bench/bench_whatif.py   # writes results/whatif.json

The full analysis is the ideal replay, the attribution by DP rank, stage, op type and (DP rank,
stage) cell, and M_W / M_S: 31 replays on ST, 41 on AR. The published artifact needs about 4 s of
wall time for its ~20 replays of AR on this kind of machine (issue #3); the goal is 10x faster.
Figures: median of ``--repeat`` runs, with and without loading and compiling the trace.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _record import write_record

from pacectl.backends.replay import ReplayBackend
from pacectl.data import shipped_trace
from pacectl.traces.bytedance import load_bytedance
from pacectl.whatif import analyze


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median reported)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "whatif.json")
    args = parser.parse_args()
    rows = []
    for name in ("AR", "ST"):
        end_to_end, analysis_only = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            backend = ReplayBackend(load_bytedance(*shipped_trace(name)))
            t1 = time.perf_counter()
            result = analyze(backend)
            t2 = time.perf_counter()
            end_to_end.append(t2 - t0)
            analysis_only.append(t2 - t1)
        row = {
            "trace": name,
            "num_replays": result.num_replays,
            "end_to_end_s": statistics.median(end_to_end),
            "analysis_s": statistics.median(analysis_only),
            "blocking_slowdown": result.blocking_slowdown,
        }
        rows.append(row)
        print(
            f"{name}: full what-if analysis {row['end_to_end_s'] * 1e3:.0f} ms end to end "
            f"(load + compile + {row['num_replays']} replays), {row['analysis_s'] * 1e3:.0f} ms analysis only; "
            f"S = {row['blocking_slowdown']:.3f}"
        )
    write_record(args.out, rows)


if __name__ == "__main__":
    main()
