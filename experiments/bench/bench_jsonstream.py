"""Benchmark: pacectl's streaming Chrome-trace reader against ijson (issue 22, item 6).

Usage::

    python experiments/bench/bench_jsonstream.py [--rounds 5] [--file F.json.gz]

``pacectl.traces.jsonstream.stream_events`` delivers every element of ``traceEvents`` and keeps the
top-level metadata (``baseTimeNanoseconds``, ``distributedInfo``: before or after the event array),
and says how a truncated file ended after delivering every complete event. ijson (yajl2_c backend)
is timed three ways on the same file, rounds interleaved:

- ``ijson_items_events_only``: ``ijson.items(f, "traceEvents.item")``, the events alone (C builds
  each event): what a replacement could be if it needed no metadata;
- ``ijson_parse_tokens``: one ``ijson.parse`` pass looping over every token in Python and building
  nothing: a lower bound for a single pass that keeps the metadata too;
- ``ijson_items_plus_meta_pass``: the events with ``items`` plus a second, token-level pass for the
  metadata (two reads of the file).

It also records what ijson does with a truncated copy (events delivered before its error, and the
error), beside ``stream_events``'s recovery. Default file: the 51 MB (decompressed) HTA trace of the
shared traces, ``df_index_resolver.json.gz``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ijson
from _record import write_record

from pacectl.traces.jsonstream import stream_events

DEFAULT = Path("/work/shared/traces/hta/tests/data/df_index_resolver/df_index_resolver.json.gz")


def _open(path: Path) -> Any:
    return gzip.open(path, "rb") if path.read_bytes()[:2] == b"\x1f\x8b" else path.open("rb")


def pacectl_stream(path: Path) -> int:
    return stream_events(path, lambda e, i: None).num_events


def ijson_items(path: Path) -> int:
    with _open(path) as f:
        return sum(1 for _ in ijson.items(f, "traceEvents.item", use_float=True))


def ijson_tokens(path: Path) -> int:
    n = 0
    with _open(path) as f:
        for prefix, _event, _value in ijson.parse(f, use_float=True):
            if not prefix.startswith("traceEvents"):
                n += 1
    return n


def ijson_items_plus_meta(path: Path) -> int:
    return ijson_items(path) + ijson_tokens(path)


def _truncation(path: Path) -> dict[str, Any]:
    """What each reader makes of the file cut at 3/4 of its decompressed text."""
    with _open(path) as f:
        text = f.read()
    with tempfile.TemporaryDirectory() as d:
        cut = Path(d) / "cut.json"
        cut.write_bytes(text[: len(text) * 3 // 4])
        res = stream_events(cut, lambda e, i: None)
        seen = 0
        error = None
        try:
            with cut.open("rb") as f:
                for _ in ijson.items(f, "traceEvents.item", use_float=True):
                    seen += 1
        except ijson.JSONError as err:
            error = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return {
        "pacectl_events": res.num_events,
        "pacectl_truncated": None if res.truncated is None else res.truncated.reason,
        "ijson_events_before_error": seen,
        "ijson_error": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--file", type=Path, default=DEFAULT)
    args = parser.parse_args()
    readers: dict[str, Callable[[Path], int]] = {
        "pacectl_stream_events": pacectl_stream,
        "ijson_items_events_only": ijson_items,
        "ijson_parse_tokens": ijson_tokens,
        "ijson_items_plus_meta_pass": ijson_items_plus_meta,
    }
    times: dict[str, list[float]] = {k: [] for k in readers}
    for _ in range(args.rounds):
        for name, fn in readers.items():  # interleaved, so load drifts hit every reader alike
            t0 = time.perf_counter()
            fn(args.file)
            times[name].append(time.perf_counter() - t0)
    with _open(args.file) as f:
        json_mb = len(f.read()) / 1e6
    record = {
        "file": str(args.file),
        "file_mb": round(args.file.stat().st_size / 1e6, 3),
        "json_mb": round(json_mb, 3),
        "rounds": args.rounds,
        "ijson_backend": ijson.backend,
        "load_average_1min": round(os.getloadavg()[0], 1),
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "min_s": {k: round(min(v), 3) for k, v in times.items()},
        "truncated_at_three_quarters": _truncation(args.file),
    }
    for name, value in record["median_s"].items():
        print(f"{name:28s} median {value:.3f} s  min {record['min_s'][name]:.3f} s")
    print(record["truncated_at_three_quarters"])
    write_record(Path(__file__).resolve().parent / "results" / "jsonstream.json", [record])


if __name__ == "__main__":
    main()
