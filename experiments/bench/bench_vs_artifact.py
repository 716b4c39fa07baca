"""Benchmark: the what-if analysis as a user runs it, pacectl against the OSDI'25 artifact, whole commands.

Usage (the artifact is not part of pacectl: bring it and its own environment first)::

    # fetch github.com/ByteDance-Seed/StragglerAnalysis into ARTIFACT (no changes to its code), then
    python -m venv /tmp/wia-venv && /tmp/wia-venv/bin/pip install "pandas<3" scipy tqdm numpy ujson seaborn pyarrow pyyaml
    python experiments/bench/bench_vs_artifact.py --artifact ARTIFACT --artifact-python /tmp/wia-venv/bin/python

Each trace is analysed by both commands, alternating, ``--repeat`` times each:

- pacectl: ``python -m pacectl.run analysis=whatif trace=bytedance trace.path=... trace.meta=...``
  (load, the full analysis, ``whatif.json``, the heatmap and the timeline);
- the artifact: ``python analyzer/wia.py --metadata ... --trace ... --dump-dir D --root D`` (its
  ``run_all.sh`` step one: the analysis and its result JSON; its heatmap, M_S and M_W are further
  commands not timed here).

Traces: the shipped AR (DP 4 x PP 4 x TP 4, 64 GPUs) and ST (8 GPUs), and AR tiled to DP 8
(128 GPUs) and DP 16 (256 GPUs) (:func:`pacectl.testing.synthetic.tiled_bytedance`). The record
holds every run's wall time, the medians and their ratio (artifact / pacectl).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import write_record

HERE = Path(__file__).resolve().parents[2]


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--artifact", type=Path, required=True, help="checkout of ByteDance-Seed/StragglerAnalysis"
    )
    parser.add_argument("--artifact-python", type=Path, required=True, help="python of the artifact's venv")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dp", type=int, nargs="*", default=[8, 16], help="AR tiled to these DP sizes")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vs_artifact.json")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from pacectl.data import shipped_trace
    from pacectl.testing.synthetic import tiled_bytedance

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        traces = {name: tuple(map(str, shipped_trace(name))) for name in ("AR", "ST")}
        for dp in args.dp:
            traces[f"AR tiled to DP {dp}"] = tuple(
                map(str, tiled_bytedance(tmp, name="AR", dp_factor=dp // 4))
            )
        ours_env = dict(os.environ, PYTHONPATH=str(HERE))
        theirs_env = dict(os.environ, PYTHONPATH=str(args.artifact))
        for label, (trace, meta) in traces.items():
            ours, theirs = [], []
            for i in range(args.repeat):
                run_dir = Path(tmp) / f"pacectl-{len(rows)}-{i}"
                ours.append(
                    _timed(
                        [
                            sys.executable,
                            "-m",
                            "pacectl.run",
                            "analysis=whatif",
                            "trace=bytedance",
                            f"trace.path={trace}",
                            f"trace.meta={meta}",
                            f"hydra.run.dir={run_dir}",
                        ],
                        Path(tmp),
                        ours_env,
                    )
                )
                dump = Path(tmp) / f"wia-{len(rows)}-{i}"
                theirs.append(
                    _timed(
                        [
                            str(args.artifact_python),
                            "analyzer/wia.py",
                            "--metadata",
                            meta,
                            "--trace",
                            trace,
                            "--dump-dir",
                            str(dump),
                            "--root",
                            str(dump),
                        ],
                        args.artifact,
                        theirs_env,
                    )
                )
            row = {
                "trace": label,
                "pacectl_s": ours,
                "artifact_s": theirs,
                "pacectl_median_s": statistics.median(ours),
                "artifact_median_s": statistics.median(theirs),
            }
            row["artifact_over_pacectl"] = row["artifact_median_s"] / row["pacectl_median_s"]
            rows.append(row)
            print(
                f"{label}: pacectl {row['pacectl_median_s']:.2f} s, artifact {row['artifact_median_s']:.2f} s "
                f"(median of {args.repeat}, alternating): artifact / pacectl = {row['artifact_over_pacectl']:.2f}",
                flush=True,
            )
    write_record(
        args.out,
        rows,
        command="python experiments/bench/bench_vs_artifact.py " + " ".join(sys.argv[1:]),
        artifact="github.com/ByteDance-Seed/StragglerAnalysis (analyzer/wia.py, its own venv with pandas<3)",
        load_average_1_5_15=list(os.getloadavg()),
        note="2-core machine shared with other agents: whole commands, alternating, so both see the same load",
    )


if __name__ == "__main__":
    main()
