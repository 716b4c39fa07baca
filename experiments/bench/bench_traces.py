"""Benchmark: Kineto import time and peak memory per MB of trace (streaming reader vs ``json.load``).

Usage::

    python experiments/bench/bench_traces.py                  # shipped files, writes results/traces.json
    python experiments/bench/bench_traces.py --extra /path/to/big.json.gz ...

For each file (and for the shipped 4-rank H200 set as a whole) it reports:

- ``import_s``: median wall time of ``import_kineto`` (without tracemalloc);
- ``peak_mib``: peak Python heap during the import, measured with ``tracemalloc``;
- ``json_load_peak_mib``: the same for a plain ``json.load`` of the decompressed text (what a
  naive reader holds before it can drop anything), for comparison;
- per MB: ``s_per_mb`` and ``peak_mib_per_mb``, relative to the *decompressed* JSON size (and to the
  file size on disk, ``*_per_file_mb``).

Bounded memory comes from :mod:`pacectl.traces.jsonstream`: events are decoded one at a time from a
sliding window and reduced to a few fields; only the events the import uses are kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

from _record import write_record

from pacectl.data import DATA_DIR
from pacectl.traces.kineto import import_kineto

MIB = 2**20


def _text_bytes(path: Path) -> int:
    data = path.read_bytes()
    return len(gzip.decompress(data)) if data[:2] == b"\x1f\x8b" else len(data)


def _peak(fn: Any) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / MIB


def _json_load(paths: list[Path]) -> None:
    for p in paths:
        with gzip.open(p, "rt") if p.read_bytes()[:2] == b"\x1f\x8b" else p.open() as f:
            json.load(f)


def bench(label: str, target: Path | list[Path], repeat: int) -> dict[str, Any]:
    files = (
        sorted(target.glob("*.json.gz"))
        if isinstance(target, Path) and target.is_dir()
        else (target if isinstance(target, list) else [target])
    )
    text_mb = sum(_text_bytes(f) for f in files) / MIB
    file_mb = sum(f.stat().st_size for f in files) / MIB
    arg = target if isinstance(target, Path) else files

    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_kineto(arg)

    run()  # warm-up (imports, caches)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    t = statistics.median(samples)
    peak = _peak(run)
    naive = _peak(lambda: _json_load(files))
    return {
        "trace": label,
        "files": len(files),
        "file_mb": round(file_mb, 3),
        "json_mb": round(text_mb, 3),
        "import_s": round(t, 4),
        "s_per_mb": round(t / text_mb, 4),
        "s_per_file_mb": round(t / file_mb, 4),
        "peak_mib": round(peak, 2),
        "peak_mib_per_mb": round(peak / text_mb, 3),
        "peak_mib_per_file_mb": round(peak / file_mb, 3),
        "json_load_peak_mib": round(naive, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per file (median reported)")
    parser.add_argument("--extra", type=Path, nargs="*", default=[], help="more trace files to measure")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "traces.json")
    args = parser.parse_args()
    h200 = DATA_DIR / "h200-capture"
    targets: list[tuple[str, Path | list[Path]]] = [
        ("h200 gloo4_rank2 (largest shipped file)", h200 / "gloo4_rank2.json.gz"),
        ("h200 gloo4 set (4 ranks)", h200),
        ("hta trace_filter pair", DATA_DIR / "hta" / "trace_filter"),
    ] + [(str(p), p) for p in args.extra]
    rows = [bench(label, target, args.repeat) for label, target in targets]
    for r in rows:
        print(
            f"{r['trace']}: {r['json_mb']:.2f} MB JSON ({r['file_mb']:.2f} MB on disk) | import {r['import_s'] * 1e3:.0f} ms "
            f"({r['s_per_mb'] * 1e3:.0f} ms/MB) | peak {r['peak_mib']:.1f} MiB ({r['peak_mib_per_mb']:.2f} MiB/MB; "
            f"json.load alone {r['json_load_peak_mib']:.1f} MiB)"
        )
    write_record(args.out, rows)


if __name__ == "__main__":
    main()
