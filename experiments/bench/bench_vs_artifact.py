"""Benchmark: the what-if analysis as a user runs it, pacectl against the OSDI'25 artifact, whole commands.

Usage (the artifact is not part of pacectl: bring it and its own environment first)::

    # fetch github.com/ByteDance-Seed/StragglerAnalysis into ARTIFACT (no changes to its code), then
    python -m venv /tmp/wia-venv && /tmp/wia-venv/bin/pip install "pandas<3" scipy tqdm numpy ujson seaborn pyarrow pyyaml
    python experiments/bench/bench_vs_artifact.py --artifact ARTIFACT --artifact-python /tmp/wia-venv/bin/python

Each trace is analysed by the three commands in turn, alternating, ``--repeat`` times each:

- pacectl: ``python -m pacectl.run analysis=whatif trace=bytedance trace.path=... trace.meta=...``
  (load, the full analysis, ``whatif.json``, the heatmap and the timeline);
- pacectl without its heatmap (``output.plots=false``): what the artifact's command writes (an
  analysis and its JSON, no plot), like for like;
- the artifact: ``python analyzer/wia.py --metadata ... --trace ... --dump-dir D --root D`` (its
  ``run_all.sh`` step one: the analysis and its result JSON; its heatmap, M_S and M_W are further
  commands not timed here).

After the traces, the start-up floor: each cumulative set of the imports the what-if command
needs (numpy and pyarrow.parquet, pandas, Hydra and OmegaConf, and matplotlib's Figure and Agg
backend, which the heatmap's plot server imports in a forked process)
as a whole ``python -c`` command, alternating, ``--repeat`` times (``import_floors`` in the record).

Each run's wall time, CPU time, peak resident set and the load when it started are recorded
(:func:`_record.timed_command`). Both programs' bytecode is compiled first (pacectl's package and the
artifact's ``analyzer/``, each with its own python), as an install would (:func:`_record.compile_bytecode`).

Traces: the shipped AR (DP 4 x PP 4 x TP 4, 64 GPUs) and ST (8 GPUs), and AR tiled to DP 8
(128 GPUs) and DP 16 (256 GPUs) (:func:`pacectl.testing.synthetic.tiled_bytedance`). The record
holds every run's figures, the medians and their ratios (artifact / pacectl).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _record import compile_bytecode, git_state, timed_command, write_record

HERE = Path(__file__).resolve().parents[2]


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
    compile_bytecode(sys.executable, HERE / "pacectl")
    compile_bytecode(str(args.artifact_python), args.artifact / "analyzer")
    with tempfile.TemporaryDirectory() as tmp:
        traces = {name: tuple(map(str, shipped_trace(name))) for name in ("AR", "ST")}
        for dp in args.dp:
            traces[f"AR tiled to DP {dp}"] = tuple(
                map(str, tiled_bytedance(tmp, name="AR", dp_factor=dp // 4))
            )
        ours_env = dict(os.environ, PYTHONPATH=str(HERE))
        theirs_env = dict(os.environ, PYTHONPATH=str(args.artifact))
        for label, (trace, meta) in traces.items():
            runs: dict[str, list[dict[str, float]]] = {"pacectl": [], "pacectl_noplots": [], "artifact": []}
            for i in range(args.repeat):
                for variant, extra in (("pacectl", []), ("pacectl_noplots", ["output.plots=false"])):
                    run_dir = Path(tmp) / f"{variant}-{len(rows)}-{i}"
                    command = [
                        sys.executable,
                        "-m",
                        "pacectl.run",
                        "analysis=whatif",
                        "trace=bytedance",
                        f"trace.path={trace}",
                        f"trace.meta={meta}",
                        *extra,
                        f"hydra.run.dir={run_dir}",
                    ]
                    runs[variant].append(timed_command(command, cwd=Path(tmp), env=ours_env))
                dump = Path(tmp) / f"wia-{len(rows)}-{i}"
                wia = [
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
                ]
                runs["artifact"].append(timed_command(wia, cwd=args.artifact, env=theirs_env))
            row: dict[str, object] = {"trace": label, **runs}
            median = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
            for k, v in runs.items():
                row[f"{k}_median_s"] = median[k]
                row[f"{k}_median_cpu_s"] = statistics.median(r["cpu_s"] for r in v)
            row["artifact_over_pacectl"] = median["artifact"] / median["pacectl"]
            row["artifact_over_pacectl_noplots"] = median["artifact"] / median["pacectl_noplots"]
            loads = [r["load_1min"] for v in runs.values() for r in v]
            row["load_1min_range"] = [min(loads), max(loads)]
            rows.append(row)
            print(
                f"{label}: pacectl {median['pacectl']:.2f} s ({median['pacectl_noplots']:.2f} s without its "
                f"heatmap), artifact {median['artifact']:.2f} s (median of {args.repeat}, alternating, load "
                f"{min(loads):.1f}-{max(loads):.1f}): artifact / pacectl = {row['artifact_over_pacectl']:.2f} "
                f"({row['artifact_over_pacectl_noplots']:.2f} without the heatmap)",
                flush=True,
            )
    floors = _import_floors(args.repeat, HERE)
    write_record(
        args.out,
        rows,
        import_floors=floors,
        command="python experiments/bench/bench_vs_artifact.py " + " ".join(sys.argv[1:]),
        artifact="github.com/ByteDance-Seed/StragglerAnalysis (analyzer/wia.py, its own venv with pandas<3)",
        artifact_git=git_state(args.artifact.resolve()),
        load_average_1_5_15=list(os.getloadavg()),
        note="whole commands, alternating, so both see the same load (read absolute times with it); "
        "load_1min per run",
    )


#: What pacectl's what-if command imports, cumulatively. The last set adds what the heatmap's plot
#: server imports (matplotlib's Figure and Agg backend; pyplot never), in a forked process beside
#: the main one: its cost is CPU, not wall time that the main process must wait for in full.
FLOORS = (
    ("python", "pass"),
    ("+ numpy, pyarrow.parquet", "import numpy, pyarrow.parquet"),
    ("+ pandas", "import numpy, pyarrow.parquet, pandas"),
    ("+ hydra, omegaconf", "import numpy, pyarrow.parquet, pandas, hydra, omegaconf"),
    (
        "+ matplotlib.figure, backend_agg",
        "import numpy, pyarrow.parquet, pandas, hydra, omegaconf, matplotlib.figure, matplotlib.backends.backend_agg",
    ),
)


def _import_floors(repeat: int, cwd: Path) -> list[dict[str, object]]:
    """The start-up floor of the stack the what-if command is built on: each cumulative import set
    (:data:`FLOORS`) as a whole ``python -c`` command, alternating, ``repeat`` times; its median and
    minimum wall time. A whole command cannot be faster than the imports it needs."""
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in FLOORS}
    for _ in range(repeat):
        for label, code in FLOORS:
            runs[label].append(timed_command([sys.executable, "-c", code], cwd=cwd, env=dict(os.environ)))
    floors = []
    for label, code in FLOORS:
        walls = [r["wall_s"] for r in runs[label]]
        floors.append(
            {"imports": label, "code": code, "median_s": statistics.median(walls), "min_s": min(walls)}
        )
        print(
            f"start-up floor {label}: median {statistics.median(walls):.3f} s, min {min(walls):.3f} s",
            flush=True,
        )
    return floors


if __name__ == "__main__":
    main()
