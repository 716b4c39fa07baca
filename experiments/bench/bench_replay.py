"""Benchmark: wall time of one closed-loop replay of a shipped trace (controller in the loop).

Usage::

    python experiments/bench/bench_replay.py            # AR and ST, writes results/replay.json
    python experiments/bench/bench_replay.py --repeat 50

Reports the median over ``--repeat`` runs of:

- ``load_s``: reading and validating the parquet;
- ``build_s``: compiling the dependency DAG, estimating intrinsic durations, the delay-free pass;
- ``episode_s``: one closed-loop episode (every step, one guarded threshold controller per stage);
- ``open_loop_s``: one open-loop replay of every step with fixed delays (the what-if primitive).

For scale: the what-if paper's open-loop simulator takes about 52 ms per replay of AR (117k ops)
on this kind of machine (issue #2).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from _record import write_record

from pacectl.backends.replay import ReplayBackend
from pacectl.controllers import SafetyGuard, make_controller
from pacectl.data import shipped_trace
from pacectl.loop import run_episode
from pacectl.traces.bytedance import load_bytedance


def _time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def bench(name: str, repeat: int) -> dict[str, float | int | str]:
    paths = shipped_trace(name)
    trace = load_bytedance(*paths)
    backend = ReplayBackend(trace)
    delays = np.random.default_rng(0).uniform(0, 0.01, (backend.num_iterations, len(backend.rank_labels)))

    def factory():  # type: ignore[no-untyped-def]
        return SafetyGuard(make_controller("threshold"))

    return {
        "trace": name,
        "num_ops": len(trace.ops),
        "num_steps": backend.num_iterations,
        "load_s": _time(lambda: load_bytedance(*paths), max(3, repeat // 5)),
        "build_s": _time(lambda: ReplayBackend(trace), repeat),
        "episode_s": _time(lambda: run_episode(backend, factory), repeat),
        "open_loop_s": _time(lambda: backend.replayed_times(delays), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=20, help="runs per figure (median reported)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "replay.json")
    args = parser.parse_args()
    rows = [bench(name, args.repeat) for name in ("AR", "ST")]
    for row in rows:
        print(
            f"{row['trace']}: {row['num_ops']} ops, {row['num_steps']} steps | load {row['load_s'] * 1e3:.1f} ms | "
            f"build {row['build_s'] * 1e3:.1f} ms | closed-loop episode {row['episode_s'] * 1e3:.1f} ms | "
            f"open-loop replay {row['open_loop_s'] * 1e3:.2f} ms"
        )
    write_record(args.out, rows)


if __name__ == "__main__":
    main()
