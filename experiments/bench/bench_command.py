"""Benchmark: time to first result, the commands a user types, this checkout against another.

Usage::

    python experiments/bench/bench_command.py --against /tmp/old-checkout   # writes results/command.json

Runs each command with ``PYTHONPATH`` set to this checkout and to ``--against`` (a checkout of an
earlier commit), alternating, ``--repeat`` times each, in fresh processes started in an empty
folder, and records every run's wall time, CPU time (the command and the workers it waits for),
peak resident set and the 1-minute load average when it started (:func:`_record.timed_command`),
the medians and their ratio:

- ``python -m pacectl.run`` (the main job: AR replayed under no pacing and every controller, the
  what-if's straggler cost, every output and plot), and the same with ``trace=st``;
- ``python -m pacectl.run analysis=whatif`` (the what-if analysis of AR, its heatmap and
  timeline), and the same with ``trace=st``;
- ``python -c "import pacectl.run"`` (the import alone).

On a 2-core machine shared with other work, the wall time of a command whose parts run beside each
other (the plots, the what-if) depends on the load: read ``load_1min`` with it.

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

from _record import timed_command, write_record

HERE = Path(__file__).resolve().parents[2]
COMMANDS = {
    "main job": ["-m", "pacectl.run"],
    "main job, trace=st": ["-m", "pacectl.run", "trace=st"],
    "analysis=whatif": ["-m", "pacectl.run", "analysis=whatif"],
    "analysis=whatif trace=st": ["-m", "pacectl.run", "analysis=whatif", "trace=st"],
    "import pacectl.run": ["-c", "import pacectl.run"],
}


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
    args = parser.parse_args()
    rows = []
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
    write_record(
        args.out,
        rows,
        command="python experiments/bench/bench_command.py " + " ".join(sys.argv[1:]),
        load_average_1_5_15=list(os.getloadavg()),
        note="2-core machine shared with other agents: whole commands, alternating, so both see the same load; "
        "load_1min per run",
    )


if __name__ == "__main__":
    main()
