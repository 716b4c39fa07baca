"""Peak memory per input MB of the importers, each in a fresh subprocess (``results/importer_memory.json``).

Each case writes a synthetic input of about the given size to a temporary folder and imports it in a
child process (``python bench_importer_memory.py --child FORMAT PATH``), which reports its peak
resident memory (``VmHWM``) beside the baseline of a child that only imports the modules. A case
that is *refused* by a cap (a 1 GB step-level file with the default ``trace.max_ops``) records the
peak until the refusal and the one-line message: the bound then comes from the cap, not the file.

Cases:

- ``steplevel_<N>mb``: an Alibaba-PAI-layout CSV (``,worker,gpu,time,batch_time_norm``, 16
  workers), N MB on disk;
- ``canonical_<N>mb``: the same trace written as pacectl's canonical Parquet;
- ``kineto_gb`` (``--cases kineto_gb``): about 1 GB of Kineto JSON, the shipped 4-rank H200 set
  with each rank's events tiled (shifted in time, steps and flow ids renumbered), 4 plain files;
- ``nccl_gb`` (``--cases nccl_gb``): about 1 GB of verbose NCCL Inspector logs, 4 ranks, written
  by ``pacectl.testing.synth_traces.nccl_inspector_logs``.

The two 1 GB cases import through the public loader (``trace_config({...}).load()``, as
``python -m pacectl.traces info`` does) with the default caps; their record is
``results/importer_memory_gb.json``. Generated data goes to a temporary folder (``TMPDIR``).

The Kineto importer's figures are ``traces.json`` (tracemalloc), the Flight Recorder's are
``flight_recorder.json`` (VmHWM) and ``flight_recorder_gb.json``.

Usage: ``python experiments/bench/bench_importer_memory.py [--sizes 25,100,1024] [--cases kineto_gb,nccl_gb] [--out FILE]``
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
    from pacectl.traces.formats import trace_config
    from pacectl.traces.steplevel import load_steplevel

    base = _vmhwm_mb()
    out: dict[str, Any] = {"baseline_rss_mb": round(base, 1)}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fmt in ("kineto", "nccl_inspector"):  # the public loader with the default caps
                trace = trace_config({"format": fmt, "path": path}).load()
            else:
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


def write_kineto_gb(folder: Path, mb: float = 1024) -> int:
    """The shipped 4-rank H200 Kineto set, each rank's events tiled to ``mb / 4`` MB of plain JSON
    (copy k shifted by k spans in time, its ProfilerStep numbers and flow ids renumbered); returns
    the events written per rank."""
    import gzip
    import re

    from pacectl.data import DATA_DIR

    folder.mkdir(parents=True, exist_ok=True)
    n_events = 0
    for rank in range(4):
        doc = json.loads(gzip.open(DATA_DIR / "h200-capture" / f"gloo4_rank{rank}.json.gz").read())
        events = doc.pop("traceEvents")
        meta = [e for e in events if e.get("ph") == "M"]
        body = [e for e in events if e.get("ph") != "M"]
        ts = [e["ts"] for e in body if "ts" in e]
        span = max(ts) - min(ts) + 1000.0
        steps = [int(m.group(1)) for e in body if (m := re.match(r"ProfilerStep#(\d+)$", e.get("name", "")))]
        n_steps = max(steps) + 1 if steps else 0
        chunk = json.dumps(body)[1:-1]
        copies = max(1, int(mb / 4 * MIB / len(chunk)))
        out = folder / f"rank{rank}.pt.trace.json"
        with out.open("w") as fh:
            fh.write('{"traceEvents": [' + json.dumps(meta)[1:-1])
            for k in range(copies):
                tiled = []
                for e in body:
                    e = dict(e)
                    if "ts" in e:
                        e["ts"] = e["ts"] + k * span
                    if "id" in e and e.get("ph") in ("s", "f", "t"):
                        e["id"] = e["id"] + k * 10_000_000 if isinstance(e["id"], int) else f"{e['id']}_{k}"
                    if (m := re.match(r"ProfilerStep#(\d+)$", e.get("name", ""))) is not None:
                        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * n_steps}"
                    tiled.append(e)
                fh.write(", " + json.dumps(tiled)[1:-1])
            fh.write("], " + json.dumps(doc)[1:])
        n_events = len(meta) + copies * len(body)
    return n_events


def write_nccl_gb(folder: Path, mb: float = 1024) -> int:
    """About ``mb`` MB of verbose NCCL Inspector logs (4 ranks, 2 buckets a step); returns the
    records per rank."""
    from pacectl.testing.synth_traces import SynthJob, nccl_inspector_logs

    line_bytes = 900  # one verbose record, about (912 MB with 1010)
    steps = int(mb * MIB / 4 / line_bytes / 2)
    nccl_inspector_logs(SynthJob(dp=4, steps=steps, buckets=2, noise_s=0.0), folder)
    return 2 * steps + 1


def _gb_case(case: str, tmp: Path) -> dict[str, Any]:
    folder = tmp / case
    t0 = time.perf_counter()
    n = write_kineto_gb(folder) if case == "kineto_gb" else write_nccl_gb(folder)
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{case}: {size / MIB:.0f} MB written in {time.perf_counter() - t0:.0f} s", flush=True)
    row = {
        "case": case,
        "files": len(list(folder.iterdir())),
        "input_mb": round(size / MIB, 1),
        "records_per_file": n,
        "loadavg_before": list(os.getloadavg()),
    }
    row |= _measure("kineto" if case == "kineto_gb" else "nccl_inspector", folder)
    row["loadavg_after"] = list(os.getloadavg())
    if "peak_rss_mb" in row:
        row["peak_above_baseline_mb"] = round(row["peak_rss_mb"] - row["baseline_rss_mb"], 1)
        row["peak_rss_mb_per_mb"] = round(row["peak_above_baseline_mb"] / (size / MIB), 3)
    print(row, flush=True)
    return row


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
    ap.add_argument("--cases", default="", help="1 GB cases instead: kineto_gb,nccl_gb")
    ap.add_argument("--out", default=None, help="record (default results/importer_memory.json, _gb.json)")
    ap.add_argument("--child", nargs=2, metavar=("FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    results = Path(__file__).parent / "results"
    if args.cases:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [_gb_case(c, Path(tmp)) for c in args.cases.split(",")]
        write_record(
            Path(args.out or results / "importer_memory_gb.json"),
            rows,
            command="nice -n 10 python experiments/bench/bench_importer_memory.py --cases " + args.cases,
            cpu_count=os.cpu_count(),
            note="the public loader (trace_config({format, path}).load()) with the default caps, in a fresh "
            "child per case; peak RSS = its VmHWM, baseline = the child after its imports; the 2-core "
            "machine was shared with other agents (loadavg per row), which changes wall times, not memory",
        )
        return
    rows_out = []
    for mb in [float(x) for x in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / "job.csv"
            t0 = time.perf_counter()
            n = write_steplevel(csv, mb)
            size = csv.stat().st_size
            print(
                f"steplevel {size / MIB:.0f} MB ({n} rows) written in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            row = {
                "case": f"steplevel_{mb:.0f}mb",
                "file_mb": round(size / MIB, 1),
                "rows": n,
                "loadavg_before": list(os.getloadavg()),
            }
            row |= _measure("steplevel", csv)
            row["loadavg_after"] = list(os.getloadavg())
            row["peak_rss_mb_per_mb"] = round(
                (row.get("peak_rss_mb", 0) - row.get("baseline_rss_mb", 0)) / (size / MIB), 3
            )
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
        Path(args.out or results / "importer_memory.json"),
        rows_out,
        command="python experiments/bench/bench_importer_memory.py --sizes " + args.sizes,
        cpu_count=os.cpu_count(),
        note="peak RSS = VmHWM of a fresh child per case; baseline = the child after its imports; "
        "peak_rss_mb_per_mb = (peak - baseline) / file MB; the 2-core machine was shared with other jobs "
        "(loadavg per row)",
    )


if __name__ == "__main__":
    main()
