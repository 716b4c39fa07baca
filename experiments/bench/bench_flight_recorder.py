"""Import time and peak memory of Flight Recorder dump sets (figures in ``results/flight_recorder.json``).

Sets synthesised by :mod:`pacectl.testing.synth_traces` (format 2.10 pickles, NCCL entries with
``duration_ms``, a DP job of ``ranks`` ranks with 4 gradient reduce-scatters per step), each
written to a temporary folder and imported by ``python -m pacectl.traces info`` in a fresh
subprocess, so that its peak resident memory (``VmHWM`` of the child) is the import's alone.
``frames`` stack frames per entry pad the files towards real dumps' size (the importer skips them;
real pickles share their frame dicts through the pickle memo, as these do).

- ``16 x 20000``: 16 ranks with torchtitan's default ring buffer (20,000 entries each);
- ``1024 x 2000``: 1,024 ranks x 2,000 entries, the issue's large case;
- ``1024 x 2000, frames``: the same padded with 48 frames per entry (which adds little: the pickle
  memo shares the frame dicts, 374 MB against 365 MB);
- ``gb``: 1,024 ranks x 5,601 entries, about 1 GiB on disk (about 187 B per entry).

Reported per set: bytes on disk, entries, import wall time, peak RSS, and both per MB of dump
(``s_per_mb``, ``peak_rss_mb_per_mb``) beside the baseline RSS of a child that only imports the
modules (``baseline_rss_mb``); and the same for the input side alone (``read_only_*``: every dump
read, one file at a time, into compact columns and matched into one collective table), since the
full import's peak also holds the canonical op table it builds (``canonical_ops`` rows: steps x
ranks x 10 ops), which grows with steps x ranks, not with the dumps' bytes. Both sides run with
``trace.max_ops`` raised past every case (:data:`RAISED_MAX_OPS`); the outcome under the default
cap is recorded beside them (``default_caps_*``: imported, or refused in one line, with the peak
until then). The machine is shared with other engineers' jobs: wall times carry their load
(``loadavg`` is recorded before and after each case).

Usage: ``python experiments/bench/bench_flight_recorder.py [--cases small,large,large_frames,gb] [--skip-full]
[--out results/flight_recorder.json]``
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write_record  # noqa: E402

from pacectl.traces.model import DEFAULT_MAX_OPS  # noqa: E402

CASES = {
    "small": {"ranks": 16, "steps": 5000, "frames": 0},  # 16 x 20,001 entries
    "large": {"ranks": 1024, "steps": 500, "frames": 0},  # 1,024 x 2,001 entries
    "large_frames": {"ranks": 1024, "steps": 500, "frames": 48},  # frames shared: 374 MB
    "gb": {"ranks": 1024, "steps": 1400, "frames": 0},  # 1,024 x 5,601 entries, ~1 GiB
}
_CHILD = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
from pacectl.errors import TraceError
from pacectl.traces.flight_recorder import collective_set, import_flight_recorder, read_dumps
def hwm_kb():  # the process's own peak RSS (VmHWM restarts at exec; ru_maxrss may count the parent's)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
path, mode, max_ops = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "baseline":
    print("RESULT", 0.0, hwm_kb(), 0, "imported")
    sys.exit(0)
t0 = time.perf_counter()
try:
    if mode == "read":  # the input side only: every dump read and matched into one collective table
        coll, _ = collective_set(read_dumps(path, max_bytes=1 << 32, max_ops=max_ops), source=path)
        n = len(coll.table)
    else:
        trace, report = import_flight_recorder(path, max_bytes=1 << 32, max_ops=max_ops)
        n = len(trace.steps)
    outcome = "imported"
except TraceError as err:
    n, outcome = 0, "refused: " + str(err).replace(chr(10), " ")
print("RESULT", time.perf_counter() - t0, hwm_kb(), n, outcome)
"""
#: trace.max_ops raised past every case (the default's outcome is recorded beside it)
RAISED_MAX_OPS = 1 << 26


def _write_set(folder: Path, ranks: int, steps: int, frames: int) -> tuple[int, int]:
    """Write the synthetic set in chunks of ranks (bounded memory here too); ``(bytes, entries)``."""
    from pacectl.testing.synth_traces import SynthJob, flight_recorder_dumps, simulate, write_flight_recorder

    job = SynthJob(dp=ranks, steps=steps, buckets=4, straggler_s={3: 0.01}, noise_s=1e-4, seed=0)
    truth = simulate(job)
    entries = 0
    for lo in range(0, ranks, 64):
        dumps = flight_recorder_dumps(job, truth=truth, frames=frames, ranks=range(lo, min(lo + 64, ranks)))
        entries += sum(len(d["entries"]) for d in dumps.values())
        write_flight_recorder(dumps, folder)
        del dumps
    size = sum(p.stat().st_size for p in folder.iterdir())
    return size, entries


def _child(path: str, mode: str, max_ops: int = RAISED_MAX_OPS) -> tuple[float, float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, path, mode, str(max_ops)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    _, dt, rss_kb, n, outcome = line.split(maxsplit=4)
    return float(dt), float(rss_kb) / 1024.0, int(n), outcome


def bench(case: str, *, full: bool = True) -> dict[str, Any]:
    c = CASES[case]
    with tempfile.TemporaryDirectory(prefix="pacectl-frbench-") as tmp:
        t0 = time.perf_counter()
        size, entries = _write_set(Path(tmp), c["ranks"], c["steps"], c["frames"])
        written_s = time.perf_counter() - t0
        load_before = os.getloadavg()
        _, base_mb, _, _ = _child("-", "baseline")
        read_s, read_mb, _, _ = _child(tmp, "read")
        # the full import with the cap raised (skipped with --skip-full: its op table is the time)
        dt, rss_mb, steps, _ = _child(tmp, "import") if full else (math.nan, math.nan, c["steps"], "")
        default_s, default_mb, _, default_outcome = _child(tmp, "import", DEFAULT_MAX_OPS)
        load_after = os.getloadavg()
    mb = size / 2**20
    row = {
        "case": case,
        "ranks": c["ranks"],
        "entries_per_rank": entries // c["ranks"],
        "frames_per_entry": c["frames"],
        "bytes": size,
        "mb": round(mb, 1),
        "steps_found": steps if full else None,  # canonical_ops then counts the steps written
        "write_s": round(written_s, 1),
        "import_s": round(dt, 2),
        "s_per_mb": round(dt / mb, 4),
        "peak_rss_mb": round(rss_mb, 1),
        "baseline_rss_mb": round(base_mb, 1),
        "peak_rss_mb_per_mb": round((rss_mb - base_mb) / mb, 3),
        "read_only_s": round(read_s, 2),
        "read_only_peak_rss_mb": round(read_mb, 1),
        "read_only_peak_rss_mb_per_mb": round((read_mb - base_mb) / mb, 3),
        "canonical_ops": steps * c["ranks"] * (2 + 2 * 4),
        "full_import_run": full,
        "default_max_ops": DEFAULT_MAX_OPS,
        "default_caps_outcome": default_outcome,
        "default_caps_s": round(default_s, 2),
        "default_caps_peak_rss_mb": round(default_mb, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}  # not run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="small,large,large_frames", help=f"comma list of {list(CASES)}")
    parser.add_argument("--skip-full", action="store_true", help="skip the full import with the cap raised")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "flight_recorder.json"
    )
    args = parser.parse_args()
    rows = []
    for case in args.cases.split(","):
        row = bench(case, full=not args.skip_full)
        print(row, flush=True)
        rows.append(row)
    write_record(
        args.out,
        rows,
        note=(
            "synthetic Flight Recorder pickles (pacectl/testing/synth_traces.py), imported by "
            "import_flight_recorder in a fresh subprocess; peak RSS = VmHWM of that child; the machine "
            "(2 cores) was shared with other jobs while measured (loadavg per row)"
        ),
        cpu_count=os.cpu_count(),
        rss_unit="MiB (VmHWM of /proc/self/status)",
        command="nice -n 10 python " + " ".join(sys.argv),
    )


if __name__ == "__main__":
    main()
