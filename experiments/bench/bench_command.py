"""Benchmark: time to first result, the commands a user types, this checkout against another.

Usage::

    python experiments/bench/bench_command.py --against /tmp/old-checkout   # writes results/command.json

Runs each command with ``PYTHONPATH`` set to this checkout and to ``--against`` (a checkout of an
earlier commit), alternating, ``--repeat`` times each, in fresh processes started in an empty
folder, and records every run's wall time, CPU time (the command and the workers it waits for),
peak resident set and the 1-minute load average when it started (:func:`_record.timed_command`),
the medians and their ratio. Both checkouts' bytecode is compiled first, as an install would
(:func:`_record.compile_bytecode`). The commands:

- ``python -m pacectl.run`` (the main job: AR replayed under no pacing and every controller, the
  what-if's straggler cost, every output and plot), and the same with ``trace=st``;
- ``python -m pacectl.run analysis=whatif`` (the what-if analysis of AR, its heatmap and
  timeline), and the same with ``trace=st``;
- ``python -c "import pacectl.run"`` (the import alone).

On a 2-core machine shared with other work, the wall time of a command whose parts run beside each
other (the plots, the what-if) depends on the load: read ``load_1min`` with it.

``--profile`` adds where one command's time goes, each phase timed in a fresh process of this
checkout one after the other, nothing beside it (:func:`profile`): the imports (``pacectl.run``
with numpy; Hydra and OmegaConf; pandas and pyarrow; the rest of ``pacectl.config``; matplotlib,
which the plot server imports), the composition, the checks, the trace's load, the episodes, the
what-if's replays and each plot, and the interpreter's teardown after a run (a normal exit's time
against ``os._exit``). These are CPU and wall seconds of the work itself; the command overlaps
the plots, the what-if beside the runs and matplotlib's import with the rest.

The run folders of both checkouts are compared file by file afterwards (``summary.json`` without
its ``wall_time_s``, ``whatif.json``, ``report.md``, the PNGs; each checkout's own path written as
``<root>``): ``identical_outputs`` lists what matched, ``outputs`` what there was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _record import compile_bytecode, timed_command, write_record

HERE = Path(__file__).resolve().parents[2]
COMMANDS = {
    "main job": ["-m", "pacectl.run"],
    "main job, trace=st": ["-m", "pacectl.run", "trace=st"],
    "analysis=whatif": ["-m", "pacectl.run", "analysis=whatif"],
    "analysis=whatif trace=st": ["-m", "pacectl.run", "analysis=whatif", "trace=st"],
    "import pacectl.run": ["-c", "import pacectl.run"],
}


PROFILE_PHASES = r"""
import json, os, sys, time
marks = [("start", time.process_time(), time.perf_counter())]
def mark(name):
    marks.append((name, time.process_time(), time.perf_counter()))
import pacectl.run; mark("import pacectl.run (numpy, the standard library)")
import hydra, omegaconf, hydra.core.config_store; mark("import hydra, omegaconf")
import pandas, pyarrow.parquet; mark("import pandas, pyarrow.parquet")
import pacectl.config as C, pacectl.cli, pacectl.experiment; mark("import pacectl.config, cli, experiment (the rest)")
from omegaconf import open_dict
cfg = pacectl.cli._compose(C.CONF_DIR, "config", sys.argv[1:] + ["hydra.run.dir=" + os.getcwd()], hydra=True)
task = cfg.copy()
with open_dict(task):
    del task["hydra"]
mark("compose (Hydra, once)")
C.validate_run_config(task); mark("validate_run_config (once)")
from pathlib import Path
from pacectl import report, metrics
if task.analysis.name == "whatif":
    from pacectl import whatif
    from pacectl.backends.replay import ReplayBackend
    backend = ReplayBackend(C.load_trace(task.trace), paced_optype=str(task.backend.paced_optype)); mark("load the trace, build the replay")
    result = whatif.analyze(backend); mark("the what-if analysis")
    whatif.write_timeline(Path("timeline.json"), backend, step_index=0); mark("timeline.json")
    import matplotlib.figure, matplotlib.backends.backend_agg; mark("import matplotlib (the plot server's)")
    whatif.plot_heatmap(Path("heatmap.png"), result); mark("plot: whatif_heatmap.png")
else:
    from pacectl.experiment import make_experiment
    from pacectl.run import run_names
    families = C.controller_families(task)
    experiment = make_experiment(task); mark("load the trace, build the experiment")
    episodes = {n: experiment.run(f, families[f]) for n, (f, _) in run_names(families, experiment.actuators).items()}
    mark("the episodes (%d runs)" % len(episodes))
    experiment.describe(); mark("the what-if replays of the stragglers' cost (beside the runs)")
    summaries = {n: metrics.summarize(e) for n, e in episodes.items()}
    for n, e in episodes.items():
        if n != "none":
            metrics.paired_change_ci95_frac(episodes["none"], e)
    mark("summaries and intervals")
    report.write_iterations_parquet(Path("iterations.parquet"), episodes); mark("iterations.parquet")
    import matplotlib.figure, matplotlib.backends.backend_agg; mark("import matplotlib (the plot server's)")
    report.plot_spread(Path("spread.png"), episodes); mark("plot: spread.png")
    report.plot_iteration_time(Path("iteration_time.png"), episodes); mark("plot: iteration_time.png")
print(json.dumps([{"phase": n, "cpu_s": c - c0, "wall_s": w - w0} for (n, c, w), (_, c0, w0) in zip(marks[1:], marks[:-1])]))
"""


def profile(args: list[str], cwd: Path, repeat: int) -> list[dict[str, object]]:
    """Each phase of ``python -m pacectl.run ARGS``, run one after the other in a fresh process
    (:data:`PROFILE_PHASES`), medians over ``repeat`` processes, and the interpreter's teardown:
    ``python -c 'import pacectl.config, pandas'`` exiting normally against by ``os._exit``."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(HERE))
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", PROFILE_PHASES, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows: list[dict[str, object]] = [
        {
            "phase": phase["phase"],
            "cpu_s": statistics.median(r[i]["cpu_s"] for r in runs),
            "wall_s": statistics.median(r[i]["wall_s"] for r in runs),
        }
        for i, phase in enumerate(runs[0])
    ]
    load = "import pacectl.config, pacectl.experiment, pandas, pyarrow.parquet, matplotlib.figure"
    normal = [timed_command([sys.executable, "-c", load], cwd=cwd, env=env) for _ in range(repeat)]
    fast = [
        timed_command([sys.executable, "-c", load + "; import os; os._exit(0)"], cwd=cwd, env=env)
        for _ in range(repeat)
    ]
    rows.append(
        {
            "phase": "interpreter teardown at exit (normal exit against os._exit, after the imports)",
            "cpu_s": statistics.median(r["cpu_s"] for r in normal)
            - statistics.median(r["cpu_s"] for r in fast),
            "wall_s": statistics.median(r["wall_s"] for r in normal)
            - statistics.median(r["wall_s"] for r in fast),
        }
    )
    return rows


def _run(code: Path, args: list[str], run_dir: Path | None, cwd: Path) -> dict[str, float]:
    cmd = [sys.executable, *args] + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    return timed_command(cmd, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(code)))


def _same(a: Path, b: Path, root_a: Path, root_b: Path) -> list[str]:
    """Files of run folder ``a`` equal to ``b``'s, each checkout's path written as ``<root>``."""
    same = []
    for f in sorted(p.name for p in a.iterdir() if p.is_file()):
        if not (b / f).is_file() or f.endswith(".log"):
            continue
        x, y = (a / f).read_bytes(), (b / f).read_bytes()
        if not f.endswith((".png", ".parquet")):
            x = x.replace(str(root_a).encode(), b"<root>")
            y = y.replace(str(root_b).encode(), b"<root>")
        if f == "summary.json":
            xs, ys = json.loads(x), json.loads(y)
            xs.pop("wall_time_s", None)
            ys.pop("wall_time_s", None)
            if xs == ys:
                same.append(f)
        elif x == y:
            same.append(f)
    return same


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", type=Path, required=True, help="a checkout of another commit")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--commands", nargs="*", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "command.json")
    parser.add_argument(
        "--profile", action="store_true", help="also each phase of the main job and the what-if"
    )
    args = parser.parse_args()
    rows = []
    for code in (HERE, args.against):
        compile_bytecode(sys.executable, code / "pacectl")
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "cwd"  # the commands start in an empty folder, as a user's would
        empty.mkdir()
        for c, (label, cmd) in enumerate(COMMANDS.items()):
            if label not in args.commands:
                continue
            ours, theirs = [], []
            for i in range(args.repeat):
                hydra = cmd[0] == "-m"
                mine = Path(tmp) / f"ours-{c}-{i}" if hydra else None
                other = Path(tmp) / f"theirs-{c}-{i}" if hydra else None
                ours.append(_run(HERE, cmd, mine, empty))
                theirs.append(_run(args.against, cmd, other, empty))
            row = {
                "command": label,
                "this": ours,
                "against": theirs,
                "this_median_s": statistics.median(r["wall_s"] for r in ours),
                "against_median_s": statistics.median(r["wall_s"] for r in theirs),
                "this_median_cpu_s": statistics.median(r["cpu_s"] for r in ours),
                "against_median_cpu_s": statistics.median(r["cpu_s"] for r in theirs),
                "load_1min_range": [
                    min(r["load_1min"] for r in ours + theirs),
                    max(r["load_1min"] for r in ours + theirs),
                ],
            }
            row["against_over_this"] = row["against_median_s"] / row["this_median_s"]
            if cmd[0] == "-m":
                row["identical_outputs"] = _same(
                    Path(tmp) / f"ours-{c}-0", Path(tmp) / f"theirs-{c}-0", HERE, args.against.resolve()
                )
                row["outputs"] = sorted(p.name for p in (Path(tmp) / f"ours-{c}-0").iterdir() if p.is_file())
            rows.append(row)
            print(
                f"{label}: {row['this_median_s']:.2f} s against {row['against_median_s']:.2f} s "
                f"({row['against_over_this']:.2f}x; CPU {row['this_median_cpu_s']:.2f} s against "
                f"{row['against_median_cpu_s']:.2f} s; load {row['load_1min_range'][0]:.1f}-"
                f"{row['load_1min_range'][1]:.1f})"
                + (f"; identical: {row['identical_outputs']}" if "identical_outputs" in row else ""),
                flush=True,
            )
    profiles = {}
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            for label, extra in (
                ("main job", []),
                ("analysis=whatif", ["analysis=whatif"]),
                ("analysis=whatif trace=st", ["analysis=whatif", "trace=st"]),
            ):
                profiles[label] = {
                    "load_1min_before": os.getloadavg()[0],
                    "phases": profile(extra, Path(tmp), args.repeat),
                }
                for p in profiles[label]["phases"]:
                    print(
                        f"{label}: {p['phase']}: CPU {p['cpu_s']:.3f} s, wall {p['wall_s']:.3f} s", flush=True
                    )
    write_record(
        args.out,
        rows,
        profile=profiles,
        against=args.against,
        command="python experiments/bench/bench_command.py " + " ".join(sys.argv[1:]),
        load_average_1_5_15=list(os.getloadavg()),
        note="whole commands, alternating, so both see the same load (read absolute times with it); "
        "load_1min per run",
    )


if __name__ == "__main__":
    main()
