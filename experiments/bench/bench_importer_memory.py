"""Peak memory per input MB of the importers, each in a fresh subprocess (``results/importer_memory.json``).

Each case writes a synthetic input of about the given size to a temporary folder and imports it in a
child process (``python bench_importer_memory.py --child FORMAT PATH``), which reports its peak
resident memory (``VmHWM``) beside the baseline of a child that only imports the modules. A case
that is *refused* by a cap (a 1 GB step-level file with the default ``trace.max_ops``) records the
peak until the refusal and the one-line message: the bound then comes from the cap, not the file.

Cases:

- ``steplevel_<N>mb``: an Alibaba-PAI-layout CSV (``,worker,gpu,time,batch_time_norm``, 16
  workers), N MB on disk;
- ``canonical_<N>mb``: the same trace written as pacectl's canonical Parquet.

The Kineto importer's figures are ``traces.json`` (tracemalloc), the Flight Recorder's are
``flight_recorder.json`` (VmHWM); NCCL Inspector logs are read line by line (one record at a time).

Usage: ``python experiments/bench/bench_importer_memory.py [--sizes 25,100,1024] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write_record  # noqa: E402

MIB = 2**20


def _vmhwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _child(fmt: str, path: str) -> None:
    from pacectl.errors import PacectlError
    from pacectl.traces.canonical import load_canonical
    from pacectl.traces.steplevel import load_steplevel

    base = _vmhwm_mb()
    out: dict[str, Any] = {"baseline_rss_mb": round(base, 1)}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = load_steplevel(path) if fmt == "steplevel" else load_canonical(path)
        out["ops"] = len(trace.ops)
        out["outcome"] = "imported"
    except PacectlError as err:
        out["outcome"] = "refused"
        out["message"] = str(err)[:300]
    out["import_s"] = round(time.perf_counter() - t0, 2)
    out["peak_rss_mb"] = round(_vmhwm_mb(), 1)
    print(json.dumps(out))


def write_steplevel(path: Path, mb: float, workers: int = 16) -> int:
    """An Alibaba-PAI-layout CSV of about ``mb`` MB; returns the rows written."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = 0
    step = 1
    with path.open("w") as fh:
        fh.write(",worker,gpu,time,batch_time_norm\n")
        while fh.tell() < mb * MIB:
            n_steps = 20_000
            s = np.repeat(np.arange(step, step + n_steps * 10, 10), workers)
            w = np.tile(np.arange(workers), n_steps)
            v = np.round(rng.uniform(300, 700, len(s)), 3)
            idx = np.arange(rows, rows + len(s))
            fh.write("".join(f"{i},{a},25,{b},{c}\n" for i, a, b, c in zip(idx, w, s, v, strict=True)))
            rows += len(s)
            step += n_steps * 10
    return rows


def _measure(fmt: str, path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", fmt, str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if proc.returncode != 0:
        return {"outcome": "crashed", "rc": proc.returncode, "stderr": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="25,100,1024", help="step-level CSV sizes, MB")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "importer_memory.json"))
    ap.add_argument("--child", nargs=2, metavar=("FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    rows_out = []
    for mb in [float(x) for x in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / "job.csv"
            t0 = time.perf_counter()
            n = write_steplevel(csv, mb)
            size = csv.stat().st_size
            print(f"steplevel {size / MIB:.0f} MB ({n} rows) written in {time.perf_counter() - t0:.0f} s", flush=True)
            row = {
                "case": f"steplevel_{mb:.0f}mb",
                "file_mb": round(size / MIB, 1),
                "rows": n,
                "loadavg_before": list(os.getloadavg()),
            }
            row |= _measure("steplevel", csv)
            row["loadavg_after"] = list(os.getloadavg())
            row["peak_rss_mb_per_mb"] = round((row.get("peak_rss_mb", 0) - row.get("baseline_rss_mb", 0)) / (size / MIB), 3)
            print(row, flush=True)
            rows_out.append(row)
            if row.get("outcome") == "imported":
                from pacectl.traces.canonical import write_canonical
                from pacectl.traces.steplevel import load_steplevel

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    pq = Path(tmp) / "job.parquet"
                    write_canonical(load_steplevel(csv), pq)
                psize = pq.stat().st_size
                crow = {"case": f"canonical_from_steplevel_{mb:.0f}mb", "file_mb": round(psize / MIB, 1)}
                crow |= _measure("canonical", pq)
                crow["peak_rss_mb_per_mb"] = round(
                    (crow.get("peak_rss_mb", 0) - crow.get("baseline_rss_mb", 0)) / (psize / MIB), 3
                )
                print(crow, flush=True)
                rows_out.append(crow)
    write_record(
        Path(args.out),
        rows_out,
        command="python experiments/bench/bench_importer_memory.py --sizes " + args.sizes,
        cpu_count=os.cpu_count(),
        note="peak RSS = VmHWM of a fresh child per case; baseline = the child after its imports; "
        "peak_rss_mb_per_mb = (peak - baseline) / file MB; the 2-core machine was shared with other jobs "
        "(loadavg per row)",
    )


if __name__ == "__main__":
    main()
