"""Benchmark: loading cost per op (time and peak memory), over trace sizes; optionally against another checkout.

Usage::

    python experiments/bench/bench_load.py                          # writes results/load.json
    python experiments/bench/bench_load.py --against /tmp/old-checkout

Each figure is the second of two loads in a fresh child process (the first, ``first_load_s``, also
imports what the importer needs; its peak memory is not the load's): the
ByteDance-schema traces tiled from AR along DP (:func:`pacectl.testing.synthetic.tiled_bytedance`;
DP 4, 16, 64, 256 x PP 4, 117 k to 7.5 M ops) and step-level CSVs of 1,024 and 4,096 workers x
500 iterations (two ops per row). ``ns_per_op`` is the load's wall time per canonical op;
``peak_bytes_per_op`` is the child's peak RSS during the second load (``VmHWM``, reset through
``/proc/self/clear_refs`` just before it) above its RSS before it, per op;
``table_bytes_per_op`` is the loaded op table's own size (``memory_usage(deep=True)``);
``user_s``/``system_s`` the load's CPU time (``getrusage``; system time is mostly the kernel
zeroing fresh pages); ``read_s`` the file's read alone after it (``pyarrow.parquet.read_table``, or
the importer's CSV stream of every column), the floor under the load.

With ``--against DIR`` (a checkout of another commit), each case also runs with ``PYTHONPATH=DIR``,
alternating with this checkout, and every row says whether both gave identical op tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _record import write_record

CHILD = r"""
import json, sys, time, warnings, hashlib, resource
from pathlib import Path
warnings.simplefilter("ignore")
import pandas as pd
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.steplevel import load_steplevel
kind, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import inspect
def uncapped(fn):  # the bench sizes past the default trace.max_ops; older checkouts have no cap
    return {"max_ops": 1 << 40} if "max_ops" in inspect.signature(fn).parameters else {}
def load():
    if kind == "bytedance":
        return load_bytedance(a, b, **uncapped(load_bytedance))
    return load_steplevel(a, **uncapped(load_steplevel))
def read_only():  # the file's read alone, as the importer does it: the floor under the load
    if kind == "bytedance":
        import pyarrow.parquet as pq
        return pq.read_table(a)
    from pacectl.traces.csvstream import read_header, read_numeric_columns
    header = read_header(Path(a), what="step-level trace")
    return read_numeric_columns(Path(a), [c for c in header if c], what="step-level trace", header=header,
                                max_bytes=1 << 40, max_rows=1 << 40, cap_hint="")
def measured():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak (VmHWM) to the current RSS: what came before does not count
    base = status("VmRSS")
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    trace = load()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime)
    return trace, time.perf_counter() - t0, status("VmHWM") - base, cpu
trace, cold_s, _, _ = measured()  # the first load also imports what the importer needs
del trace
trace, dt, peak, (user_s, system_s) = measured()
t0 = time.perf_counter()
read_only()
read_s = time.perf_counter() - t0
ops = trace.ops
digest = hashlib.sha256(pd.util.hash_pandas_object(ops, index=True).to_numpy().tobytes()
                        + str(list(map(str, ops.dtypes))).encode()).hexdigest()
print(json.dumps({"num_ops": len(ops), "first_load_s": cold_s, "load_s": dt, "ns_per_op": dt / len(ops) * 1e9,
                  "user_s": user_s, "system_s": system_s, "read_s": read_s,
                  "peak_bytes_per_op": peak / len(ops),
                  "table_bytes_per_op": float(ops.memory_usage(deep=True).sum()) / len(ops),
                  "digest": digest}))
"""


def _run(code: Path, kind: str, a: str, b: str) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, PYTHONPATH=str(code))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, a, b],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=code,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dp", type=int, nargs="*", default=[4, 16, 64, 256])
    parser.add_argument("--steplevel", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run alternating")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "load.json")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(here))
    from pacectl.testing.synthetic import steplevel_csv, tiled_bytedance

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for dp in args.dp:
            trace, meta = tiled_bytedance(tmp, name="AR", dp_factor=dp // 4)
            cases.append(("bytedance", f"AR tiled to DP {dp} x PP 4", str(trace), str(meta)))
        for w in args.steplevel:
            path = steplevel_csv(Path(tmp) / f"steps-{w}.csv", num_workers=w, num_iterations=500)
            cases.append(("steplevel", f"step-level {w} workers x 500 iterations", str(path), ""))
        for kind, label, a, b in cases:
            row = {"kind": kind, "trace": label, **_run(here, kind, a, b)}
            if args.against is not None:
                other = _run(args.against, kind, a, b)
                row["against"] = {
                    k: other[k]
                    for k in (
                        "first_load_s",
                        "load_s",
                        "ns_per_op",
                        "user_s",
                        "system_s",
                        "peak_bytes_per_op",
                        "table_bytes_per_op",
                    )
                }
                row["identical"] = other["digest"] == row["digest"]
            rows.append(row)
            print(
                f"{label}: {row['num_ops']:,} ops, {row['ns_per_op']:.0f} ns/op, peak {row['peak_bytes_per_op']:.0f} B/op, "
                f"table {row['table_bytes_per_op']:.0f} B/op"
                + (
                    f"; against: {row['against']['ns_per_op']:.0f} ns/op, peak {row['against']['peak_bytes_per_op']:.0f} B/op, "
                    f"identical: {row['identical']}"
                    if "against" in row
                    else ""
                ),
                flush=True,
            )
    write_record(
        args.out,
        rows,
        command="python experiments/bench/bench_load.py " + " ".join(sys.argv[1:]),
        against=args.against,
        load_average_1_5_15=list(os.getloadavg()),
        note="absolute times depend on the machine's load (load_average_1_5_15); the two checkouts "
        "ran alternating, case by case",
    )


if __name__ == "__main__":
    main()
