"""Importer for NCCL Inspector logs: the JSON lines NCCL's inspector profiler plugin writes.

Format (read from NCCL's ``plugins/profiler/inspector/README.md`` and ``inspector_json.cc``; the
shipped fixtures are written from that documentation, ``pacectl/data/nccl-inspector/README.md``):
with ``NCCL_PROFILER_PLUGIN=libnccl-profiler-inspector.so`` and ``NCCL_INSPECTOR_ENABLE=1`` each
process appends to ``<NCCL_INSPECTOR_DUMP_DIR>/<host>-pid<pid>.log`` one JSON object per line, per
completed collective per communicator:

- ``header``: ``id`` (the communicator's hash, the same on all its ranks), ``comm_name``, ``rank``
  (within the communicator), ``n_ranks``, ``nnodes``;
- ``metadata``: ``inspector_output_format_version``, ``hostname``, ``pid``, ``dump_timestamp_us``, ...;
- ``coll_perf``: ``coll`` (``AllReduce``, ``ReduceScatter``, ...), ``coll_sn`` (sequence number in
  the communicator), ``coll_msg_size_bytes``, ``coll_exec_time_us``, ``coll_timing_source``
  (``kernel_gpu``, ``kernel_cpu``, ``collective_cpu``), bandwidths, and with
  ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` ``event_trace_ts`` (``coll_start_ts``, ``coll_stop_ts`` and
  per-channel ``kernel_start_ts``/``kernel_stop_ts``, µs); or ``p2p_perf`` for point-to-point ops
  (folded into compute, like the Flight Recorder's).

Mapping: a process is one rank; its global rank is its ``rank`` in the communicator with the most
ranks (the world), else (none spans every log, or two logs claim one rank) its place in (host, pid)
order, with a warning. Communicators are process groups (``id`` plus members; ``comm_name`` is the
description that names DP, TP or PP). Timing is always clock-free: a rank's earliness is its
execution time minus the shortest in the collective (all ranks leave together); verbose logs place
each collective on the host clock at its kernels' end (median over ranks), else the collectives are
laid out back to back and compute is unknown (the replay then holds the collectives alone: a
warning says so). Steps, layout and the op table are :mod:`pacectl.traces.collectives`'. Messages
smaller than ``NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES`` (8 KiB by default) are not logged by the
plugin, so tiny collectives never appear.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pacectl.errors import TraceError
from pacectl.traces.collectives import (
    AssemblyReport,
    CollectiveSet,
    Group,
    LayoutOverrides,
    assemble,
    kind_of,
)
from pacectl.traces.model import DEFAULT_MAX_OPS, OpTrace, TraceWarning, int64_array
from pacectl.traces.paths import expand_paths

#: Default cap on one log file's size, bytes (4 GiB: the plugin appends for the job's lifetime).
DEFAULT_MAX_BYTES = 4 << 30
_HEAD_RE = re.compile(rb'"header"\s*:')
_PERF_RE = re.compile(rb'"(coll_perf|p2p_perf)"\s*:')


class NcclInspectorWarning(TraceWarning):
    """An NCCL Inspector log set was usable, but something was dropped, guessed or assumed."""


def sniff(path: Path) -> bool:
    """Whether the file's first line looks like an NCCL Inspector record."""
    try:
        with open(path, "rb") as fh:
            head = fh.readline(1 << 16)
    except OSError:
        return False
    return head.lstrip()[:1] == b"{" and bool(_HEAD_RE.search(head)) and bool(_PERF_RE.search(head))


def resolve_log_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand folders (their Inspector logs), globs and files into a sorted list.

    Raises:
        TraceError: a path does not exist, a folder holds no log, or a glob matches nothing.
    """

    def empty_folder(p: Path, files: int) -> str:
        got = "none" if not files else f"{files} file(s), none of them one"
        return (
            f"an NCCL Inspector folder must hold <host>-pid<pid>.log files of JSON lines with header and "
            f"coll_perf, got {got} in {str(p)!r}. Point trace.path at NCCL_INSPECTOR_DUMP_DIR."
        )

    return expand_paths(paths, what="NCCL Inspector log", accept=sniff, empty_folder=empty_folder)


@dataclass
class _Proc:
    """One process's log, compacted."""

    path: Path
    host: str
    pid: int
    comms: dict[str, tuple[str, int, int]]  # id -> (comm_name, rank in comm, n_ranks)
    rows: pd.DataFrame  # comm, kind, seq, numel, created_ns, duration_s, end_ns, timing_source
    p2p: int
    versions: set[str]


def _num(rec: dict[str, Any], key: str, where: str, *, integer: bool = True) -> Any:
    value: Any = rec.get(key)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    big = isinstance(value, int) and value >= 1 << 63  # a damaged number: past int64 (float() may overflow)
    if isinstance(value, bool) or not ok or big or not math.isfinite(float(value)) or value < 0:
        digits = len(str(value))
        shown = f"{str(value)[:20]}... ({digits} digits)" if big and digits > 20 else repr(value)
        raise TraceError(
            f"{key} must be a non-negative {'integer' if integer else 'number'}"
            f"{' below 2**63' if big else ''}, got {shown} ({where})"
        )
    return value


def _read_log(path: Path, max_bytes: int, notes: list[str], max_records: int, too_many: TraceError) -> _Proc:
    """One process's log; ``max_records``: collective records it may add to the set (``too_many`` past it)."""
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"an NCCL Inspector log must be <= {max_bytes} bytes (trace.max_mb), got {size} bytes (in {path})"
        )
    cols: dict[str, list[Any]] = {
        k: [] for k in ("comm", "kind", "seq", "numel", "created_ns", "duration_s", "end_ns", "source")
    }
    comms: dict[str, tuple[str, int, int]] = {}
    host, pid = "", -1
    versions: set[str] = set()
    p2p = 0
    with open(path, "rb") as fh:
        lines = fh.readlines() if size < (64 << 20) else fh  # a large log line by line
        last_line = None
        for i, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            last_line = i
            try:
                rec = json.loads(raw)
            except UnicodeDecodeError as err:
                raise TraceError(
                    f"each line of an NCCL Inspector log must be UTF-8 text, got an undecodable byte at "
                    f"offset {err.start} of the line (in {path}:{i}); the file is damaged: copy it again"
                ) from None
            except json.JSONDecodeError as err:
                if not raw.endswith(b"\n"):  # the last line, cut short while the plugin wrote it
                    notes.append(f"{path}: dropped its last line {i}, cut short (truncated)")
                    break
                raise TraceError(
                    f"each line of an NCCL Inspector log must be one JSON object, got invalid JSON ({err.msg}, "
                    f"column {err.colno}) (in {path}:{i})"
                ) from None
            except ValueError as err:  # an integer of more digits than Python converts (4,300)
                raise TraceError(
                    f"each line of an NCCL Inspector log must be one JSON object, got a number too long to "
                    f"read ({str(err)[:80]}) (in {path}:{i}); the file is damaged: copy it again"
                ) from None
            where = f"in {path}:{i}"
            if not isinstance(rec, dict) or not isinstance(rec.get("header"), dict):
                raise TraceError(
                    f"an NCCL Inspector record must have a header object, got {str(rec)[:80]!r} ({where})"
                )
            head = rec["header"]
            meta: dict[str, Any] = rec["metadata"] if isinstance(rec.get("metadata"), dict) else {}
            if "p2p_perf" in rec:
                p2p += 1
                continue
            perf = rec.get("coll_perf")
            if not isinstance(perf, dict):
                raise TraceError(
                    f"an NCCL Inspector record must have coll_perf or p2p_perf, got keys {sorted(rec)} ({where})"
                )
            comm = str(head.get("id", ""))
            rank = _num(head, "rank", f"{where}: header.rank")
            n_ranks = _num(head, "n_ranks", f"{where}: header.n_ranks")
            comms[comm] = (str(head.get("comm_name", "")), int(rank), int(n_ranks))
            host = str(meta.get("hostname", host))
            pid = int(meta["pid"]) if isinstance(meta.get("pid"), int) else pid
            if meta.get("inspector_output_format_version"):
                versions.add(str(meta["inspector_output_format_version"]))
            exec_us = _num(perf, "coll_exec_time_us", f"{where}: coll_perf.coll_exec_time_us", integer=False)
            trace_ts = perf.get("event_trace_ts")
            ts: dict[str, Any] = trace_ts if isinstance(trace_ts, dict) else {}
            kernels = [k for k in ts.get("kernel_events", []) if isinstance(k, dict)]
            starts, stops = (
                [k[key] for k in kernels if isinstance(k.get(key), int) and k[key] > 0]
                for key in ("kernel_start_ts", "kernel_stop_ts")
            )
            coll_start = ts.get("coll_start_ts")
            start_us = min(starts) if starts else coll_start if isinstance(coll_start, int) else -1
            if len(cols["comm"]) >= max_records:
                raise too_many
            cols["comm"].append(comm)
            cols["kind"].append(kind_of(str(perf.get("coll", ""))))
            cols["seq"].append(int(_num(perf, "coll_sn", f"{where}: coll_perf.coll_sn")))
            cols["numel"].append(int(perf.get("coll_msg_size_bytes", 0) or 0))
            cols["created_ns"].append(int(start_us) * 1000 if start_us and start_us > 0 else -1)
            cols["duration_s"].append(float(exec_us) * 1e-6)
            cols["end_ns"].append(max(stops) * 1000 if stops else -1)
            cols["source"].append(str(perf.get("coll_timing_source", "")))
    if last_line is None:
        raise TraceError(
            f"an NCCL Inspector log must hold at least one record, got an empty file (in {path})"
        )
    # periodic dumps never repeat a record; be safe
    rows = pd.DataFrame(cols).drop_duplicates(subset=["comm", "seq"], keep="last")
    if pid < 0:
        m = re.search(r"pid(\d+)", path.name)
        pid = int(m.group(1)) if m else -1
    return _Proc(path, host or path.stem, pid, comms, rows, p2p, versions)


@dataclass
class NcclInspectorReport:
    """How an Inspector log set was imported (``python -m pacectl.traces info`` prints it)."""

    files: list[str]
    ranks: list[int]
    rank_from: str
    versions: list[str]
    timing_sources: dict[str, int]
    verbose: bool
    p2p_records: int
    groups: list[Group]
    assembly: AssemblyReport

    def summary(self) -> dict[str, Any]:
        """Plain values for ``info --json``."""
        return {
            "files": self.files,
            "ranks": self.ranks,
            "rank_from": self.rank_from,
            "versions": self.versions,
            "timing_sources": self.timing_sources,
            "verbose": self.verbose,
            "p2p_records": self.p2p_records,
            "process_groups": [g.summary() for g in self.groups],
            "assembly": self.assembly.summary(),
        }


def import_nccl_inspector(
    paths: str | Path | Sequence[str | Path],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_ops: int = DEFAULT_MAX_OPS,
    layout: LayoutOverrides | None = None,
    name: str | None = None,
) -> tuple[OpTrace, NcclInspectorReport]:
    """Import a set of NCCL Inspector logs (one per process) into a canonical :class:`OpTrace`.

    Args:
        paths: log files, a folder of them (``NCCL_INSPECTOR_DUMP_DIR``) or a glob.
        max_bytes: cap on each file's size, bytes.
        max_ops: cap on the collective records of the whole set (``trace.max_ops``), counted while
            the logs are read (about 0.4 kB of memory per record: ``experiments/bench/``).
        layout: layout overrides (:class:`~pacectl.traces.collectives.LayoutOverrides`).
        name: job name (default: the folder's name).

    Returns:
        ``(trace, report)`` with ``trace.fmt == "nccl_inspector"``.

    Raises:
        TraceError: a malformed line (file and line named), or no DP group or too few steps (see
            :func:`~pacectl.traces.collectives.assemble`).

    Example:
        >>> from pacectl.data import DATA_DIR
        >>> trace, report = import_nccl_inspector(DATA_DIR / "nccl-inspector" / "verbose")
        >>> trace.meta.dp_size, report.assembly.timing
        (4, 'duration')
    """
    files = resolve_log_paths(paths)
    notes: list[str] = []
    procs: list[_Proc] = []
    held = 0
    for i, f in enumerate(files):
        too_many = TraceError(
            f"an NCCL Inspector log set must hold <= {max_ops} collective records (trace.max_ops), got "
            f"more while reading log {i + 1} of {len(files)} (in {f}); the import holds about 0.4 kB per "
            "record. Raise the cap (trace.max_ops / --max-ops) if the machine has the memory, or "
            "import fewer logs"
        )
        procs.append(_read_log(f, max_bytes, notes, max_ops - held, too_many))
        held += len(procs[-1].rows)
    src = str(files[0].parent) if len({f.parent for f in files}) == 1 else "; ".join(map(str, files))
    world = max(n for p in procs for (_, _, n) in p.comms.values()) if any(p.comms for p in procs) else 0
    world_comms = {c for p in procs for c, (_, _, n) in p.comms.items() if n == world}
    rank_of: dict[int, int] = {}
    rank_from = "its rank in the communicator of all ranks"
    for i, p in enumerate(procs):
        mine = [p.comms[c][1] for c in p.comms if c in world_comms]
        if mine:
            rank_of[i] = mine[0]
    if len(rank_of) != len(procs) or len(set(rank_of.values())) != len(procs):
        order = sorted(range(len(procs)), key=lambda i: (procs[i].host, procs[i].pid))
        rank_of = {i: r for r, i in enumerate(order)}
        rank_from = "(host, pid) order: no communicator spans every process"
        notes.append(f"{src}: no communicator spans every log; ranks assigned in (host, pid) order")
    members: dict[str, list[int]] = {}
    for i, p in enumerate(procs):
        for c in p.comms:
            members.setdefault(c, []).append(rank_of[i])
    groups: list[Group] = []
    key_of: dict[str, int] = {}
    for c in sorted(members):
        desc = next((p.comms[c][0] for p in procs if c in p.comms), "")
        key_of[c] = len(groups)
        groups.append(
            Group(key=len(groups), name=c, desc=desc, ranks=tuple(sorted(members[c])), ranks_from="dumps")
        )
    frames = []
    for i, p in enumerate(procs):
        if not len(p.rows):
            continue

        def int64(column: str, key: str, p: _Proc = p) -> np.ndarray:  # a damaged number past int64
            return int64_array(p.rows[column], field=key, source=str(p.path))

        frames.append(
            pd.DataFrame(
                {
                    "rank": np.int64(rank_of[i]),
                    "group": p.rows["comm"].map(key_of).to_numpy(dtype=np.int64),
                    "kind": p.rows["kind"].to_numpy(),
                    "backend": "nccl",
                    "seq": int64("seq", "coll_perf.coll_sn"),
                    "numel": int64("numel", "coll_perf.coll_msg_size_bytes"),
                    "created_ns": int64(
                        "created_ns", "coll_perf.event_trace_ts (kernel_start_ts or coll_start_ts)"
                    ),
                    "duration_s": p.rows["duration_s"].to_numpy(dtype=np.float64),
                    "end_ns": int64("end_ns", "coll_perf.event_trace_ts.kernel_events[*].kernel_stop_ts"),
                    "finished": True,
                }
            )
        )
    if not frames:
        raise TraceError(
            f"an NCCL Inspector log set must record at least one collective, got none (in {src})"
        )
    table = pd.concat(frames, ignore_index=True)
    table["kind"] = table["kind"].astype("category")
    table["backend"] = table["backend"].astype("category")
    coll = CollectiveSet(table=table, ranks=tuple(sorted(rank_of.values())))
    verbose = bool((table["end_ns"] >= 0).all())
    if not verbose:
        notes.append(
            f"{src}: no event timestamps (NCCL_INSPECTOR_DUMP_VERBOSE=0): compute between collectives is unknown, "
            "so each step holds its collectives back to back; arrival spreads are right, step times are the "
            "collectives' only"
        )
    trace, assembly = assemble(
        coll,
        groups,
        source=src,
        fmt="nccl_inspector",
        name=name or files[0].parent.name or "nccl_inspector",
        layout=layout,
        timing="duration",
        warning=NcclInspectorWarning,
        duration_field="coll_exec_time_us",
    )
    for note in notes:
        warnings.warn(note, NcclInspectorWarning, stacklevel=2)
    assembly.warnings = notes + assembly.warnings
    timing_sources: dict[str, int] = {}
    for p in procs:
        for k, v in p.rows["source"].value_counts().items():
            timing_sources[str(k)] = timing_sources.get(str(k), 0) + int(v)
    report = NcclInspectorReport(
        files=[str(p.path) for p in procs],
        ranks=[rank_of[i] for i in range(len(procs))],
        rank_from=rank_from,
        versions=sorted({v for p in procs for v in p.versions}),
        timing_sources=timing_sources,
        verbose=verbose,
        p2p_records=sum(p.p2p for p in procs),
        groups=groups,
        assembly=assembly,
    )
    return trace, report


def load_nccl_inspector(paths: str | Path | Sequence[str | Path], **kwargs: Any) -> OpTrace:
    """Like :func:`import_nccl_inspector`, returning only the trace."""
    return import_nccl_inspector(paths, **kwargs)[0]
