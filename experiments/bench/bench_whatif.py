"""Benchmark: wall time of the full what-if analysis (Lin et al., OSDI 2025), and how it grows.

Usage::

    python experiments/bench/bench_whatif.py                     # writes results/whatif.json
    python experiments/bench/bench_whatif.py --full-up-to 64     # the per-scenario replays up to DP 64

The full analysis is the ideal replay, the attribution by DP rank, stage, op type and (DP rank,
stage) cell, and M_W / M_S: 31 scenarios on ST, 41 on AR, ``2 + dp + pp + groups + dp * pp + 4``
in general. Two methods, measured side by side in one run on the same backend (same process,
alternating):

- ``columns`` (the default of :func:`pacectl.whatif.analyze`): each by-DP-rank, by-cell and M_W-add
  scenario on only the DP columns it changes plus one ideal column, batched over a scenario axis;
- ``full``: one full replay per scenario (the artifact's way, and pacectl's before).

Rows:

- ``shipped``: AR and ST, median of ``--repeat`` runs, end to end (load + compile + analysis) and
  analysis alone, both methods;
- ``steplevel``: step-level CSVs (:func:`pacectl.testing.synthetic.steplevel_csv`) of 64, 256,
  1,024 and 4,096 workers x 500 iterations: load, build, analysis (one run each);
- ``bytedance``: ByteDance-schema traces tiled from AR along DP
  (:func:`pacectl.testing.synthetic.tiled_bytedance`): DP 4, 16, 64, 256 x PP 4 (16 to 1,024 ranks).

``full`` runs only up to ``--full-up-to`` workers (DP ranks x stages); it grows as dp x pp
replays of the whole trace. Every row says whether both methods gave the same ``whatif.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _record import write_record

from pacectl.backends.replay import ReplayBackend
from pacectl.data import shipped_trace
from pacectl.testing.synthetic import steplevel_csv, tiled_bytedance
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.steplevel import load_steplevel
from pacectl.whatif import analyze


def _timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _row(kind: str, label: str, workers: int, load, full_up_to: int) -> dict:  # type: ignore[no-untyped-def,type-arg]
    trace, load_s = _timed(load)
    backend, build_s = _timed(lambda: ReplayBackend(trace))
    result, analysis_s = _timed(lambda: analyze(backend))
    row = {
        "kind": kind,
        "trace": label,
        "workers": workers,
        "num_ops": len(trace.ops),
        "num_steps": backend.num_iterations,
        "num_replays": result.num_replays,
        "load_s": load_s,
        "build_s": build_s,
        "analysis_s": analysis_s,
        "blocking_slowdown": result.blocking_slowdown,
    }
    if workers <= full_up_to:
        reference, full_s = _timed(lambda: analyze(backend, method="full"))
        row["analysis_full_s"] = full_s
        row["full_over_columns"] = full_s / analysis_s
        row["identical"] = json.dumps(reference.to_json()) == json.dumps(result.to_json())
    print(
        f"{kind} {label} ({workers} workers, {row['num_ops']:,} ops, {row['num_replays']} scenarios): "
        f"load {load_s:.2f} s, build {build_s:.2f} s, analysis {analysis_s:.2f} s"
        + (
            f"; full replays {row['analysis_full_s']:.2f} s ({row['full_over_columns']:.1f}x), "
            f"identical: {row['identical']}"
            if "analysis_full_s" in row
            else ""
        ),
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per shipped-trace figure (median)")
    parser.add_argument(
        "--full-up-to", type=int, default=256, help="largest worker count run with method=full"
    )
    parser.add_argument("--steplevel", type=int, nargs="*", default=[64, 256, 1024, 4096])
    parser.add_argument("--dp", type=int, nargs="*", default=[4, 16, 64, 256], help="DP sizes tiled from AR")
    parser.add_argument(
        "--steps-factor",
        type=int,
        default=1,
        help="repeats of AR's 44 steps in the tiled traces (4: 176 steps)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "whatif.json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the synthetic traces' notes are not what is measured
    rows = []
    for name in ("AR", "ST"):
        end_to_end, analysis_only, full_only = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            backend = ReplayBackend(load_bytedance(*shipped_trace(name)))
            t1 = time.perf_counter()
            result = analyze(backend)
            t2 = time.perf_counter()
            analyze(backend, method="full")
            t3 = time.perf_counter()
            end_to_end.append(t2 - t0)
            analysis_only.append(t2 - t1)
            full_only.append(t3 - t2)
        row = {
            "kind": "shipped",
            "trace": name,
            "num_replays": result.num_replays,
            "end_to_end_s": statistics.median(end_to_end),
            "analysis_s": statistics.median(analysis_only),
            "analysis_full_s": statistics.median(full_only),
            "blocking_slowdown": result.blocking_slowdown,
        }
        rows.append(row)
        print(
            f"{name}: full what-if analysis {row['end_to_end_s'] * 1e3:.0f} ms end to end "
            f"(load + compile + {row['num_replays']} scenarios), {row['analysis_s'] * 1e3:.0f} ms analysis only "
            f"({row['analysis_full_s'] * 1e3:.0f} ms with one full replay each); S = {row['blocking_slowdown']:.3f}",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.steplevel:
            path = steplevel_csv(Path(tmp) / f"steps-{w}.csv", num_workers=w, num_iterations=500)
            rows.append(
                _row(
                    "steplevel",
                    f"{w} workers x 500 iterations",
                    w,
                    lambda p=path: load_steplevel(p, max_ops=1 << 40),
                    args.full_up_to,
                )
            )
        for dp in args.dp:
            paths = tiled_bytedance(tmp, name="AR", dp_factor=dp // 4, step_factor=args.steps_factor)
            rows.append(
                _row(
                    "bytedance",
                    f"AR tiled to DP {dp} x PP 4"
                    + (f" x {args.steps_factor} step repeats" if args.steps_factor > 1 else ""),
                    dp * 4,
                    lambda p=paths: load_bytedance(*p, max_ops=1 << 40),  # past the default cap on purpose
                    args.full_up_to,
                )
            )
    load = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    write_record(
        args.out,
        rows,
        command="python experiments/bench/bench_whatif.py " + " ".join(sys.argv[1:]),
        load_average_1_5_15=list(load),
        # the whole process's peak resident set (the largest row's load dominates it)
        peak_rss_mib=usage.ru_maxrss / 1024,
        # the whole process's CPU split (user, kernel) and its minor page faults (first touches)
        cpu_user_s=usage.ru_utime,
        cpu_system_s=usage.ru_stime,
        minor_page_faults=usage.ru_minflt,
        note="absolute times depend on the machine's load (load_average_1_5_15); the ratios full/columns "
        "are measured in one process, alternating, on the same backend",
    )


if __name__ == "__main__":
    main()
