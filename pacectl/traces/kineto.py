"""Importer for PyTorch profiler (Kineto) Chrome-trace JSON: one file per rank, into an :class:`OpTrace`.

Format: the JSON that ``torch.profiler.profile(...).export_chrome_trace`` (or
``tensorboard_trace_handler``) writes, as described in ``shared/traces/README.md`` section 2: a top
object with ``distributedInfo``, ``traceEvents`` and, after the events, ``baseTimeNanoseconds``; or a
bare event list. ``ts``/``dur`` are microseconds (ints or floats).

What is read (everything else is skipped while streaming, so memory stays bounded):

- steps: ``ProfilerStep#N`` CPU annotations (cat ``user_annotation``); a trace without them becomes
  one step, with a warning;
- collectives, first source that exists in the file:
  1. NCCL/RCCL kernels, old ``ncclKernel_<Coll>_<ALGO>_<PROTO>_<Op>_<type>`` and new
     ``ncclDevKernel_<Coll>_<Op>_<type>_<ALGO>_<PROTO>`` names (cat ``kernel``/``Kernel``); kind,
     process group and size from the kernel's collective metadata (``Collective name``,
     ``Process Group Name``, ``In msg nelems``) when present; arrival = kernel start, end = kernel end;
  2. CPU backend spans ``gloo:<coll>`` (also ``mpi:``/``ucc:``); arrival = start of the matching
     ``c10d::<coll>_`` enqueue op when the counts pair up one to one (that is when DDP handed the
     bucket over), else the span start; end = span end;
  3. ``nccl:<coll>`` CPU annotations (world-size-1 traces, which launch no NCCL kernel): CPU enqueue
     times only;
- forward end: the ``DistributedDataParallel.forward`` (or any ``*forward*``) annotation of the step;
- GPU work (kernels, ``gpu_memcpy``, ``gpu_memset``): only to extend a step's end past its CPU end.
  GPU events are assigned to the step of their launch (``correlation`` to the ``cuda_runtime`` launch).

Mapping to the canonical op table (pure data parallel: ``dp_size`` = number of rank files,
``pp_size = 1``, ``stage = 0``), per rank and step, times relative to the earliest step start over
all ranks:

- DP gradient collectives (all-reduce or reduce-scatter; if a trace has none, every collective is a
  sync point) -> ``grads-reduce-scatter``, ``seq_id`` = bucket order (by mean arrival across ranks);
  other collectives (all_to_all, broadcast, ...) are folded into compute time;
- ``forward-compute`` = [step start, forward end]; ``backward-compute`` j = [previous boundary,
  j-th bucket arrival]: *wall-clock segments between sync points* (kernels, CPU overhead and idle
  time of the segment together); ``optimizer`` = [last bucket end, step end];
- bucket ops are serialised as the replay runs them
  (:func:`~pacectl.traces.collectives.serialise_buckets`; backends that run buckets concurrently, as
  gloo's worker threads do, would violate the replay's dependency model); the *true* arrivals give the
  arrival spreads of :class:`KinetoReport`.

Matching across ranks: by (process group, sequence number) when every collective carries a sequence
number, else by ordinal within (process group or stream) and step (``KinetoReport.matching``).
Clock alignment on the matched collectives' ends (:func:`~pacectl.traces.collectives.clock_offsets`):
``align="auto"`` removes each rank's offset only when it exceeds both 1 ms and twice the median
residual left after aligning; ``"end"`` always, ``"none"`` never. The residual (max - min end over
ranks per matched collective, after alignment if applied) is reported.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pacectl.errors import TraceError, plural
from pacectl.traces.collectives import GRAD_KINDS, clock_offsets, step_ops
from pacectl.traces.jsonstream import DEFAULT_MAX_BYTES, StreamResult, stream_events
from pacectl.traces.model import (
    MAX_DURATION_S,
    JobMeta,
    OpTrace,
    TraceWarning,
    dropped_steps_note,
    plain,
    quantile_stats,
    validate_ops,
)
from pacectl.traces.paths import expand_paths

ALIGN_MODES = ("auto", "end", "none")
_AUTO_ALIGN_US = 1000.0
_MAX_DUR_US = MAX_DURATION_S * 1e6
_MAX_PROBLEMS = 200
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_KERNEL_RE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
_CPU_COLL_RE = re.compile(r"^(gloo|mpi|ucc|nccl|xccl):(\w+)$")
_ENQUEUE_RE = re.compile(r"^c10d::(\w+?)_?$")
_RANK_RE = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
_SEQ_KEYS = ("Seq", "seq", "Sequence number", "seq_id")
_KINDS = {
    "allreduce": "all_reduce",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "sendrecv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_SUFFIXES = (".json", ".json.gz")  # of the files a folder's trace is read from


def _kind(raw: str) -> str:
    key = re.sub(r"[^a-z]", "", raw.lower())
    return _KINDS.get(key, key or "unknown")


class KinetoWarning(TraceWarning):
    """A Kineto trace was usable but something was recovered, guessed or dropped."""


@dataclass(frozen=True)
class Problem:
    """One problem found in a trace file.

    Attributes:
        file: the file.
        where: ``event #i`` (index in ``traceEvents``), ``step N`` or ``file``.
        field: the JSON field or concept at fault.
        message: what is wrong, in the ``"<what> must be <constraint>, got <value!r>"`` form.
    """

    file: str
    where: str
    field: str
    message: str

    def __str__(self) -> str:
        if self.where == self.field == "file":  # a whole-file problem: the path says where
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.where}: {self.field}: {self.message}"


def _file_problem(file: str | Path, fld: str, message: str) -> Problem:
    """A problem of a whole file (``where == "file"``), at the JSON field or concept ``fld``."""
    return Problem(str(file), "file", fld, message)


class TraceProblems(TraceError):
    """A TraceError carrying every problem found (``python -m pacectl.traces validate`` lists them)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first = self.problems[0]
        more = len(self.problems) - 1
        listed = "list them all with `python -m pacectl.traces validate`"
        tail = f"; {plural(more, 'more problem', 'more problems')}, {listed}" if more else ""
        where = (
            f"in {first.file}"
            if first.where == first.field == "file"
            else f"in {first.file}:{first.where}, field {first.field}"
        )
        located = f"({where})" in first.message  # a whole-file message from the reader names it
        head = f"{first.message}{'' if located else f' ({where})'}"
        super().__init__((head[:-1] if tail and head.endswith(".") else head) + tail)  # no ".;"


@dataclass
class _RankFile:
    """What one file contributed, before cross-rank matching (times in µs, relative to the file base)."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    base_us: float | None
    truncated: bool
    truncated_how: str  # "" when complete, else where and why the JSON ended early
    steps: pd.DataFrame  # step, start, end
    colls: pd.DataFrame  # step, kind, pg, seq, arrival, end, nelems
    fwd_end: pd.Series  # step -> forward end
    gpu_end: pd.Series  # step -> last GPU event end
    coll_source: str
    arrival_source: str
    num_events: int


@dataclass
class KinetoReport:
    """How a Kineto set was imported, with the figures ``python -m pacectl.traces info`` prints.

    Times are seconds unless named otherwise.
    """

    files: list[str]
    ranks: list[int]
    world_size: int
    backend: str
    steps: list[int]
    dropped_steps: dict[int, str]
    buckets_per_step: int
    kinds: dict[str, float]
    folded_per_step: dict[str, float]
    collective_source: str
    arrival_source: str
    matching: str
    align: str
    align_applied: bool
    clock_offsets_s: dict[int, float]
    residual_median_s: float
    residual_max_s: float
    spread_first_s: NDArray[np.float64]  # [num_steps] arrival spread at bucket 0
    spread_all_s: NDArray[np.float64]  # [num_steps, num_buckets]
    step_time_s: NDArray[np.float64]  # [num_steps]
    num_events: int
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary (seconds)."""
        return {
            "files": self.files,
            "ranks": self.ranks,
            "world_size": self.world_size,
            "backend": self.backend,
            "steps": self.steps,
            "dropped_steps": {str(k): v for k, v in self.dropped_steps.items()},
            "buckets_per_step": self.buckets_per_step,
            "collective_kinds": self.kinds,
            "folded_collectives_per_step": self.folded_per_step,
            "collective_source": self.collective_source,
            "arrival_source": self.arrival_source,
            "matching": self.matching,
            "clock_alignment": {
                "mode": self.align,
                "applied": self.align_applied,
                "offsets_s": {str(k): v for k, v in self.clock_offsets_s.items()},
                "residual_median_s": self.residual_median_s,
                "residual_max_s": self.residual_max_s,
            },
            "arrival_spread_first_bucket_s": quantile_stats(self.spread_first_s) or {},
            "arrival_spread_all_buckets_s": quantile_stats(self.spread_all_s) or {},
            "step_time_s": {
                **(quantile_stats(self.step_time_s) or {}),
                "mean": float(self.step_time_s.mean()) if self.step_time_s.size else math.nan,
            },
            "num_events": self.num_events,
            "warnings": self.warnings,
        }


# ----------------------------------------------------------------------------------------------- paths
def resolve_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand files, directories (their ``*.json``/``*.json.gz`` files) and globs into a sorted file list.

    Raises:
        TraceError: a path does not exist, a directory holds no trace file, or a glob matches nothing.
    """

    def empty_folder(p: Path, files: int) -> str:
        return (
            f"a trace directory must hold files ending in {list(_SUFFIXES)}, got "
            f"{'an empty directory' if not files else 'none of them'} ({str(p)!r}). "
            "Point trace.path at the folder of the rank files."
        )

    return expand_paths(
        paths,
        what="trace file",
        accept=lambda f: f.name.endswith(_SUFFIXES),
        empty_folder=empty_folder,
        sort=False,
    )


# -------------------------------------------------------------------------------------------- per file
def _args(ev: dict[str, Any]) -> dict[str, Any]:
    """The event's ``args`` object ({} when absent or not an object)."""
    raw = ev.get("args")
    return raw if isinstance(raw, dict) else {}


def _num(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# Kind codes of the events a file contributes (column ``kind`` of the per-file event table):
#   S  ProfilerStep#N annotation            F  forward marker (CPU or GPU annotation)
#   K  NCCL/RCCL collective kernel          G  other GPU work (kernel, memcpy, memset)
#   B  CPU backend span (gloo:*, mpi:*...)  N  nccl:* CPU annotation
#   E  c10d::<coll>_ enqueue op
#   L  cuda_runtime call: not a row, only its launch time is kept (to anchor the GPU work it launched)
class _Event(NamedTuple):
    """One kept event: a row of the per-file event table (times in µs)."""

    kind: str  # kind code (see above)
    name: str  # event name; "" for G (plain GPU work)
    ts: float
    dur: float
    corr: int | None  # K and G: correlation id, to find the launching cuda_runtime call
    idx: int  # index in traceEvents
    loc: int  # hash of (name, pid, tid): exact duplicates share (kind, loc, ts, dur)
    # JSON values as recorded, not yet checked (None where the kind has no such field):
    coll: Any  # K: args["Collective name"]
    pg: Any  # K, B, N, E: args["Process Group Name"]
    stream: Any  # K: args["stream"], else the event's tid
    nelems: Any  # K: args["In msg nelems"]
    seq: Any  # K, B, N, E: the first of args[_SEQ_KEYS]


_RAW_FIELDS = ("coll", "pg", "stream", "nelems", "seq")  # object columns: values kept as recorded
_COLL_COLUMNS = ["step", "kind", "pg", "seq", "arrival", "end", "nelems"]  # _RankFile.colls


def _cpu_coll_code(name: str) -> str | None:
    """``N`` for an ``nccl:<coll>`` CPU span, ``B`` for another backend's (``gloo:``, ``mpi:``...), else None."""
    if _CPU_COLL_RE.match(name):
        return "N" if name.startswith("nccl:") else "B"
    return None


def _classify(ev: dict[str, Any]) -> str | None:
    """The kind code of one trace event (see ``_Event``), or None when the import does not use it.

    Only complete events (``ph == "X"``) with a string ``cat`` and ``name`` are used; ``cat`` is
    compared case-insensitively.
    """
    if ev.get("ph") != "X":
        return None
    cat = ev.get("cat")
    name = ev.get("name")
    if not isinstance(cat, str) or not isinstance(name, str):
        return None
    cat_l = cat.lower()
    if cat_l == "user_annotation":
        if _STEP_RE.match(name):
            return "S"
        if "forward" in name.lower():
            return "F"
        return _cpu_coll_code(name)
    if cat_l == "gpu_user_annotation":
        return "F" if "forward" in name.lower() else None
    if cat_l in _GPU_CATS:
        return "K" if cat_l == "kernel" and _KERNEL_RE.match(name) else "G"
    if cat_l == "cuda_runtime":
        return "L"
    if cat_l == "cpu_op":
        return "E" if _ENQUEUE_RE.match(name) else _cpu_coll_code(name)
    return None


def _time_problems(ev: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for each invalid time of a kept event: ``ts`` (finite, µs) and ``dur``
    (finite, in [0, MAX_DURATION_S] in µs); [] when both are valid."""
    name = ev["name"]
    ts = _num(ev.get("ts"))
    dur = _num(ev.get("dur"))
    out: list[tuple[str, str]] = []
    if ts is None or not math.isfinite(ts):
        out.append(("ts", f"ts of {name[:60]!r} must be a finite number (µs), got {ev.get('ts')!r}"))
    if dur is None or not math.isfinite(dur) or dur < 0 or dur > _MAX_DUR_US:
        bound = f"a finite number in [0, {_MAX_DUR_US:.0f}] µs"
        out.append(("dur", f"dur of {name[:60]!r} must be {bound}, got {ev.get('dur')!r}"))
    return out


def _event_row(code: str, ev: dict[str, Any], idx: int) -> _Event:
    """The row kept for event #``idx`` of kind ``code`` (not ``L``), whose ``ts``/``dur`` are valid."""
    name = ev["name"]
    args = _args(ev)
    kernel = code == "K"
    collective = code in ("K", "B", "N", "E")
    return _Event(
        kind=code,
        name="" if code == "G" else name,
        ts=float(ev["ts"]),
        dur=float(ev["dur"]),
        corr=_correlation(args) if code in ("K", "G") else None,
        idx=idx,
        loc=hash((name, str(ev.get("pid")), str(ev.get("tid")))),
        coll=args.get("Collective name") if kernel else None,
        pg=args.get("Process Group Name") if collective else None,
        stream=args.get("stream", ev.get("tid")) if kernel else None,
        nelems=args.get("In msg nelems") if kernel else None,
        seq=next((args[k] for k in _SEQ_KEYS if k in args), None) if collective else None,
    )


def _correlation(args: dict[str, Any]) -> int | None:
    """An event's ``correlation`` id, or None unless it is a finite integral number (a NaN, an
    infinity or a fraction links nothing: the event then belongs to the step of its own start)."""
    corr = _num(args.get("correlation"))
    return int(corr) if corr is not None and math.isfinite(corr) and corr == int(corr) else None


def _events_frame(rows: list[_Event]) -> pd.DataFrame:
    """The kept events as a table, columns ``_Event._fields`` (``ts``/``dur`` float µs; the raw
    argument columns of object dtype, so each value stays as the JSON held it)."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_Event._fields)
    ev = pd.DataFrame(
        {
            f: pd.Series(list(values), dtype=object) if f in _RAW_FIELDS else list(values)
            for f, values in zip(_Event._fields, columns, strict=True)
        }
    )
    ev["ts"] = ev["ts"].astype(float)
    ev["dur"] = ev["dur"].astype(float)
    return ev


def _stream_file(
    path: Path, max_bytes: int, problems: list[Problem]
) -> tuple[pd.DataFrame, dict[int, float], StreamResult]:
    """Stream one file: ``(kept events, cuda_runtime call start (µs) by correlation id, result)``.

    Events that are not objects or have invalid times are skipped, each a problem (at most
    ``_MAX_PROBLEMS`` in all).
    """
    fname = str(path)
    rows: list[_Event] = []
    launches: dict[int, float] = {}

    def problem(idx: int, fld: str, msg: str) -> None:
        if len(problems) < _MAX_PROBLEMS:
            problems.append(Problem(fname, f"event #{idx}", fld, msg))

    def on_event(ev: Any, idx: int) -> None:
        if not isinstance(ev, dict):
            problem(idx, "event", f"each trace event must be a JSON object, got {type(ev).__name__}")
            return
        code = _classify(ev)
        if code is None:
            return
        if code == "L":  # a cuda_runtime call: its start, when it has one and a correlation id
            corr, ts = _correlation(_args(ev)), _num(ev.get("ts"))
            if corr is not None and ts is not None and math.isfinite(ts):
                launches[corr] = ts
            return
        bad = _time_problems(ev)
        for fld, msg in bad:
            problem(idx, fld, msg)
        if not bad:
            rows.append(_event_row(code, ev, idx))

    res = stream_events(path, on_event, max_bytes=max_bytes)
    return _events_frame(rows), launches, res


def _truncation(fname: str, res: StreamResult, notes: list[str]) -> str:
    """Where and why the file's JSON ended early ("" when complete); notes what was lost."""
    if res.truncated is None:
        return ""
    lost = (
        "the rest of traceEvents and all metadata after it"
        if res.truncated.in_events
        else "trailing metadata"
    )
    notes.append(
        f"{fname}: truncated ({res.truncated.reason}) at character {res.truncated.offset}; recovered "
        f"{res.num_events} complete events, lost {lost}"
    )
    return (
        f"its JSON ended early ({res.truncated.reason}) at character {res.truncated.offset}, "
        f"after {res.num_events} complete events"
    )


def _report_duplicates(ev: pd.DataFrame, fname: str, problems: list[Problem]) -> None:
    """A problem for each of the first 20 exact duplicates (same kind, name, pid, tid, ts, dur) among
    the kept events: a recording or merge error."""
    first = ev[ev.duplicated(subset=["kind", "loc", "ts", "dur"], keep="first")].head(20)
    for idx, name, ts in zip(first["idx"], first["name"], first["ts"], strict=True):
        msg = f"each event must appear once, got a duplicate of {name[:60] or 'a GPU event'!r} at ts {plain(ts)!r}"
        problems.append(Problem(fname, f"event #{int(idx)}", "event", msg))


def _rank_of(
    path: Path,
    dist: dict[str, Any] | None,
    rank_override: int | None,
    single: bool,
    problems: list[Problem],
    notes: list[str],
) -> int | None:
    """The file's rank: the override, else ``distributedInfo.rank``, else a ``rank<N>`` in the file
    name, else 0 for a single file. None (with a problem) when unknown or < 0."""
    fname = str(path)
    rank: int | None = None
    if dist is not None and isinstance(dist.get("rank"), int) and not isinstance(dist.get("rank"), bool):
        rank = int(dist["rank"])
    if rank_override is not None:
        if rank is not None and rank != rank_override:
            notes.append(f"{fname}: rank override {rank_override} replaces distributedInfo.rank {rank}")
        rank = rank_override
    if rank is None:
        m = _RANK_RE.findall(path.name)
        if m:
            rank, rank_from = int(m[-1]), "file name"
        elif single:
            rank, rank_from = 0, "default (single file)"
        else:
            msg = (
                "the rank of each file must be known, got no distributedInfo.rank and no 'rank<N>' "
                "in the file name; rename the file or pass ranks (--rank / trace.ranks)"
            )
            problems.append(_file_problem(fname, "distributedInfo.rank", msg))
            return None
        notes.append(f"{fname}: distributedInfo.rank missing, rank {rank} taken from the {rank_from}")
    if rank < 0:
        problems.append(_file_problem(fname, "rank", f"rank must be >= 0, got {rank!r}"))
        return None
    return rank


def _world_size_of(dist: dict[str, Any] | None, fname: str, problems: list[Problem]) -> int | None:
    """``distributedInfo.world_size`` when a positive integer; None when absent or invalid (a problem)."""
    if dist is None:
        return None
    ws = dist.get("world_size")
    if isinstance(ws, int) and not isinstance(ws, bool) and ws >= 1:
        return ws
    if ws is not None:
        msg = f"world_size must be a positive integer, got {ws!r}"
        problems.append(_file_problem(fname, "distributedInfo.world_size", msg))
    return None


def _steps_table(
    ev: pd.DataFrame, fname: str, truncated: bool, problems: list[Problem], notes: list[str]
) -> pd.DataFrame | None:
    """The file's steps (columns step, start, end; µs; sorted by start) from its ProfilerStep#N spans.

    A repeated step number is a problem (the first one is kept). Without any step span the whole
    trace is one step 0, with a note; None (with a problem) when the file kept no event at all.
    """
    st = ev[ev["kind"] == "S"]
    if len(st) == 0:
        if len(ev) == 0:
            problems.append(
                _file_problem(
                    fname, "traceEvents", "a trace must hold ProfilerStep, collective or GPU events, got none"
                )
            )
            return None
        notes.append(
            f"{fname}: no ProfilerStep#N annotation survived the truncation; the recovered part is one step (0)"
            if truncated
            else f"{fname}: no ProfilerStep#N annotation; the whole trace is one step (0)"
        )
        return pd.DataFrame({"step": [0], "start": [ev["ts"].min()], "end": [(ev["ts"] + ev["dur"]).max()]})
    step_ids = st["name"].str.slice(len("ProfilerStep#")).astype(np.int64)
    steps = pd.DataFrame(
        {
            "step": step_ids.to_numpy(),
            "start": st["ts"].to_numpy(),
            "end": (st["ts"] + st["dur"]).to_numpy(),
        }
    )
    dups = steps["step"].duplicated()
    for i in np.flatnonzero(dups.to_numpy())[:5]:
        msg = f"each ProfilerStep#N must appear once, got step {int(steps['step'].iloc[i])} again"
        problems.append(Problem(fname, f"event #{int(st['idx'].iloc[i])}", "name", msg))
    return steps[~dups].sort_values("start").reset_index(drop=True)


def _anchor_times(ev: pd.DataFrame, launches: dict[int, float]) -> NDArray[np.float64]:
    """When each event belongs to a step (µs): its start, or for GPU work its CPU launch's start."""
    anchor = ev["ts"].to_numpy().copy()
    corr = ev["corr"].to_numpy()
    if launches:
        for i in np.flatnonzero(pd.notna(corr)):
            t = launches.get(int(corr[i]))
            if t is not None:
                anchor[i] = t
    return anchor


def _assign_steps(ev: pd.DataFrame, steps: pd.DataFrame, launches: dict[int, float]) -> pd.DataFrame:
    """``ev`` with a ``step`` column: the last step starting at or before the event's anchor time
    (:func:`_anchor_times`); events before the first step or after the last one's end are dropped."""
    anchor = _anchor_times(ev, launches)
    starts = steps["start"].to_numpy()
    ends = steps["end"].to_numpy()
    pos = np.searchsorted(starts, anchor, side="right") - 1
    valid = pos >= 0
    last = len(starts) - 1
    valid &= ~((pos == last) & (anchor > ends[last] if last >= 0 else False))
    step = np.where(valid, steps["step"].to_numpy()[np.clip(pos, 0, None)], -1)
    return ev.assign(step=step)[valid]


def _step_ends(ev: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per step (index), the latest end (µs) of a forward marker and of GPU work (K or G)."""
    end_t = ev["ts"] + ev["dur"]
    fwd = ev["kind"] == "F"
    fwd_end = end_t[fwd].groupby(ev["step"][fwd]).max()
    gpu = ev["kind"].isin(["G", "K"])
    gpu_end = end_t[gpu].groupby(ev["step"][gpu]).max()
    return fwd_end, gpu_end


def _matched_kind(pattern: re.Pattern[str], name: str) -> str:
    """Canonical kind of the collective that ``pattern``'s first group names in ``name``."""
    m = pattern.match(name)
    return _kind(m.group(1) if m else "unknown")


def _kernel_collectives(kern: pd.DataFrame) -> pd.DataFrame:
    """Collectives from NCCL/RCCL kernels (columns ``_COLL_COLUMNS``; arrival = kernel start, µs).

    Kind: from the ``Collective name`` when a string, else the kernel name. Process group:
    ``Process Group Name`` when a string, else ``stream <stream>``.
    """
    return pd.DataFrame(
        {
            "step": kern["step"].to_numpy(),
            "kind": [
                _kind(c) if isinstance(c, str) else _matched_kind(_KERNEL_RE, n)
                for c, n in zip(kern["coll"], kern["name"], strict=True)
            ],
            "pg": [
                pg if isinstance(pg, str) else f"stream {stream}"
                for pg, stream in zip(kern["pg"], kern["stream"], strict=True)
            ],
            "seq": [_num(s) for s in kern["seq"]],
            "arrival": kern["ts"].to_numpy(),
            "end": (kern["ts"] + kern["dur"]).to_numpy(),
            "nelems": [_num(x) for x in kern["nelems"]],
        }
    )


def _paired_arrivals(
    back: pd.DataFrame, kinds: NDArray[Any], enq: pd.DataFrame
) -> NDArray[np.float64] | None:
    """Arrival of each backend span (µs): the start of its ``c10d::`` enqueue op, or None if they do not pair.

    They pair when, for every kind, spans and enqueue ops are equally many and the i-th enqueue op
    (by time) starts no later than 1 µs after the i-th span; then the i-th span arrives at the i-th
    enqueue op's start.
    """
    if len(enq) == 0:
        return None
    back_ts = back["ts"].to_numpy()
    enq_ts = enq["ts"].to_numpy()
    enq_kind = np.array([_matched_kind(_ENQUEUE_RE, n) for n in enq["name"]], dtype=object)
    arrival = back_ts.copy()
    for k in np.unique(kinds):
        bi = np.flatnonzero(kinds == k)
        ei = np.flatnonzero(enq_kind == k)
        if len(bi) != len(ei):
            return None
        b_order = bi[np.argsort(back_ts[bi], kind="stable")]
        e_ts = np.sort(enq_ts[ei])
        if not (e_ts <= back_ts[b_order] + 1.0).all():
            return None
        arrival[b_order] = e_ts
    return arrival


def _span_collectives(spans: pd.DataFrame, enq: pd.DataFrame | None = None) -> tuple[pd.DataFrame, bool]:
    """Collectives (``_COLL_COLUMNS``, CPU µs) from spans named ``<prefix>:<coll>`` (``gloo:<coll>``...,
    ``nccl:<coll>``), and ``paired``: their arrival is the start of the enqueue ops ``enq`` when they
    pair (:func:`_paired_arrivals`), else the span start."""
    kinds = spans["name"].map(lambda n: _kind(n.split(":", 1)[1])).to_numpy()
    arrival = None if enq is None else _paired_arrivals(spans, kinds, enq)
    colls = pd.DataFrame(
        {
            "step": spans["step"].to_numpy(),
            "kind": kinds,
            "pg": [pg if isinstance(pg, str) else "default" for pg in spans["pg"]],
            "seq": [_num(s) for s in spans["seq"]],
            "arrival": spans["ts"].to_numpy() if arrival is None else arrival,
            "end": (spans["ts"] + spans["dur"]).to_numpy(),
            "nelems": np.full(len(spans), math.nan),
        }
    )
    return colls, arrival is not None


def _collectives(ev: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    """The file's collectives (``_COLL_COLUMNS``, µs) from the first source it has (kernels, backend
    spans, nccl:* annotations), and :class:`_RankFile`'s two labels (``"none"`` when it has none)."""
    kern = ev[ev["kind"] == "K"]
    if len(kern):
        return _kernel_collectives(kern), "gpu kernels (NCCL/RCCL)", "kernel start"
    back = ev[ev["kind"] == "B"]
    if len(back):
        colls, paired = _span_collectives(back, ev[ev["kind"] == "E"])
        backends = ", ".join(sorted({n.split(":")[0] for n in back["name"]}))
        how = "c10d enqueue (paired with the backend span)" if paired else "backend span start"
        return colls, f"CPU backend spans ({backends})", how
    ann = ev[ev["kind"] == "N"]
    if len(ann):
        return _span_collectives(ann)[0], "nccl:* CPU annotations (no device timing)", "CPU enqueue"
    return pd.DataFrame([], columns=_COLL_COLUMNS), "none", "collective start"


def _read_rank_file(
    path: Path,
    *,
    rank_override: int | None,
    single: bool,
    max_bytes: int,
    problems: list[Problem],
    notes: list[str],
) -> _RankFile | None:
    """Read one rank's file into a :class:`_RankFile`, or None when a problem makes it unusable.

    ``rank_override`` replaces ``distributedInfo.rank``; ``single``: it is the only file (an unknown
    rank is then 0).
    """
    fname = str(path)
    ev, launches, res = _stream_file(path, max_bytes, problems)
    truncated_how = _truncation(fname, res, notes)
    _report_duplicates(ev, fname, problems)
    meta = res.meta
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    rank = _rank_of(path, dist, rank_override, single, problems, notes)
    if rank is None:
        return None
    world = _world_size_of(dist, fname, problems)
    backend = str(dist.get("backend")) if dist is not None and dist.get("backend") is not None else None
    base_ns = _num(meta.get("baseTimeNanoseconds"))  # the epoch of the relative ts
    steps = _steps_table(ev, fname, res.truncated is not None, problems, notes)
    if steps is None:
        return None
    ev = _assign_steps(ev, steps, launches)
    fwd_end, gpu_end = _step_ends(ev)
    colls, source, arrival_source = _collectives(ev)
    return _RankFile(
        path=path,
        rank=rank,
        world_size=world,
        backend=backend,
        base_us=base_ns / 1000.0 if base_ns is not None and math.isfinite(base_ns) else None,
        truncated=res.truncated is not None,
        truncated_how=truncated_how,
        steps=steps,
        colls=colls,
        fwd_end=fwd_end,
        gpu_end=gpu_end,
        coll_source=source,
        arrival_source=arrival_source,
        num_events=res.num_events,
    )


# ------------------------------------------------------------------------------------------ the import
def import_kineto(
    paths: str | Path | Sequence[str | Path],
    *,
    ranks: Sequence[int] | None = None,
    world_size: int | None = None,
    strict: bool = False,
    align: str = "auto",
    drop_unmatched: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    name: str | None = None,
) -> tuple[OpTrace, KinetoReport]:
    """Import a set of Kineto trace files (one per rank) into a canonical :class:`OpTrace`.

    Args:
        paths: files, directories or globs (see :func:`resolve_paths`).
        ranks: rank of each file, in sorted-path order; overrides ``distributedInfo.rank``.
        world_size: expected world size; overrides ``distributedInfo.world_size``.
        strict: make recoverable conditions errors: a truncated file, a subset of the world's ranks.
        align: clock alignment across ranks, one of :data:`ALIGN_MODES` (see module docstring).
        drop_unmatched: drop steps whose collectives do not match across ranks instead of failing.
        max_bytes: cap on each file's size and decompressed text, bytes.
        name: job name (default: the common file-name prefix or the folder name).

    Returns:
        ``(trace, report)``: the validated trace (``fmt="kineto"``) and how it was built.

    Raises:
        TraceError: any malformed input (a :class:`TraceProblems` lists every per-event problem).

    Example:
        >>> from pacectl.data import DATA_DIR
        >>> trace, report = import_kineto(DATA_DIR / "h200-capture")
        >>> trace.meta.dp_size, report.buckets_per_step
        (4, 3)
    """
    if align not in ALIGN_MODES:
        raise TraceError(f"align must be one of {list(ALIGN_MODES)}, got {align!r}")
    files = resolve_paths(paths)
    if ranks is not None and len(ranks) != len(files):
        raise TraceError(
            f"ranks must give one rank per file ({len(files)} files: {[f.name for f in files]}), got {list(ranks)!r}"
        )
    problems: list[Problem] = []
    notes: list[str] = []
    recs: list[_RankFile] = []
    for i, f in enumerate(files):
        try:
            rec = _read_rank_file(
                f,
                rank_override=None if ranks is None else int(ranks[i]),
                single=len(files) == 1,
                max_bytes=max_bytes,
                problems=problems,
                notes=notes,
            )
        except TraceProblems:
            raise
        except TraceError as err:
            problems.append(_file_problem(f, "file", str(err)))
            continue
        if rec is not None:
            recs.append(rec)
    whole = "a trace file must be complete in strict mode, got a truncated file"
    problems += [_file_problem(r.path, "file", whole) for r in recs if strict and r.truncated]
    if problems:
        raise TraceProblems(problems)
    _check_ranks(recs, world_size, strict, problems, notes)
    if problems:
        raise TraceProblems(problems)
    recs.sort(key=lambda r: r.rank)
    # one base per file: adopt the others' base for a truncated file that lost it (same profiler run)
    bases = {r.base_us for r in recs if r.base_us is not None}
    for r in recs:
        if r.base_us is None and r.truncated and len(bases) == 1:
            r.base_us = next(iter(bases))
            notes.append(f"{r.path}: baseTimeNanoseconds lost by truncation, taken from the other ranks")
    trace, report = _assemble(recs, files, world_size, align, drop_unmatched, notes, name)
    for note in report.warnings:
        warnings.warn(note, KinetoWarning, stacklevel=2)
    return trace, report


def load_kineto(paths: str | Path | Sequence[str | Path], **kwargs: Any) -> OpTrace:
    """Like :func:`import_kineto`, returning only the trace."""
    return import_kineto(paths, **kwargs)[0]


def _job_groups(recs: list[_RankFile]) -> dict[str, list[_RankFile]]:
    """Files grouped by their name up to the rank number (``gloo4_rank*.json.gz``); {} if a name has none."""
    groups: dict[str, list[_RankFile]] = {}
    for r in recs:
        m = _RANK_RE.search(r.path.name)
        if m is None:
            return {}
        name = r.path.name
        ext = ".json.gz" if name.endswith(".json.gz") else ".json" if name.endswith(".json") else "*"
        key = str(r.path.parent / f"{name[: m.start()]}{name[m.start() : m.start() + 4]}*{ext}")
        groups.setdefault(key, []).append(r)
    return groups


def _several_jobs(recs: list[_RankFile]) -> Problem | None:
    """One problem when the files are several jobs' (names differ before the rank number), else None."""
    groups = _job_groups(recs)
    if len(groups) < 2:
        return None

    def describe(pattern: str, members: list[_RankFile]) -> str:
        worlds = sorted({m.world_size for m in members if m.world_size is not None})
        ranks = sorted(m.rank for m in members)
        return (
            f"{Path(pattern).name} ({len(members)} file(s), ranks {ranks[:8]}"
            + (f", world_size {worlds[0] if len(worlds) == 1 else worlds}" if worlds else "")
            + ")"
        )

    parents = sorted({str(r.path.parent) for r in recs})
    where = parents[0] if len(parents) == 1 else "<set>"
    best = max(groups, key=lambda k: len(groups[k]))
    return _file_problem(
        where,
        "file",
        f"a trace must be the rank files of one job, got files of {len(groups)} jobs "
        f"({'; '.join(describe(k, v) for k, v in groups.items())})"
        + (" in this folder" if where != "<set>" else "")
        + f". Pick one job's files with a quoted glob, e.g. '{best}'",
    )


def _check_ranks(
    recs: list[_RankFile], world_size: int | None, strict: bool, problems: list[Problem], notes: list[str]
) -> None:
    """Check the files' ranks and world sizes against each other (problems) and note a subset of the world."""
    ranks_seen = [r.rank for r in recs]
    declared = {r.world_size for r in recs if r.world_size is not None}
    if len(set(ranks_seen)) < len(ranks_seen) or (world_size is None and len(declared) > 1):
        several = _several_jobs(recs)
        if several is not None:
            problems.append(several)
            return
    by_rank: dict[int, Path] = {}
    for r in recs:
        if r.rank in by_rank:
            msg = f"each rank must come from one file, got rank {r.rank} also in {by_rank[r.rank]}"
            problems.append(_file_problem(r.path, "distributedInfo.rank", msg))
        by_rank[r.rank] = r.path
    if world_size is None and len(declared) > 1:
        msg = f"all files must declare one world_size, got {sorted(declared)!r}"
        problems.append(_file_problem(recs[0].path, "distributedInfo.world_size", msg))
        return
    world = world_size if world_size is not None else next(iter(declared), None)
    if world is None:
        return
    for r in recs:
        if r.rank >= world:
            msg = f"rank must be in [0, world_size={world}), got {r.rank!r}"
            problems.append(_file_problem(r.path, "rank", msg))
    if len(recs) > world:
        msg = f"the number of rank files must be <= world_size={world}, got {len(recs)}"
        problems.append(_file_problem("<set>", "world_size", msg))
    elif len(recs) < world:
        msg = (
            f"the number of rank files must equal world_size={world}, got {len(recs)} "
            f"(ranks {sorted(by_rank)[:16]})"
        )
        if strict:
            problems.append(
                _file_problem("<set>", "world_size", f"{msg}; pass all rank files, or drop --strict")
            )
        else:
            notes.append(msg + ": replaying the present ranks as their own data-parallel group")


def _span_ms(r: _RankFile) -> float:
    return float(r.steps["end"].max() - r.steps["start"].min()) * 1e-3 if len(r.steps) else 0.0


def _truncated_suspects(recs: list[_RankFile], failure: str) -> list[Problem]:
    """When ranks disagree, the files that look truncated, each as a problem naming it (else none).

    A file looks truncated when its JSON ended early, or when it holds fewer steps, or a step range
    less than half as long, as the other files (median).
    """
    if len(recs) < 2:  # one file: nothing to compare with, only its own JSON can say it was cut
        return [
            _file_problem(
                r.path,
                "file",
                f"{failure}, and this file looks truncated: {r.truncated_how}. Re-export the trace (the "
                "profiler's export or the copy was cut short)",
            )
            for r in recs
            if r.truncated
        ]
    out: list[Problem] = []
    for r in recs:
        rest = [o for o in recs if o is not r]
        n_rest = float(np.median([len(o.steps) for o in rest]))
        span_rest = float(np.median([_span_ms(o) for o in rest]))
        short = len(r.steps) < n_rest or _span_ms(r) < 0.5 * span_rest
        if not (r.truncated or short):
            continue
        rest_steps = sorted({int(s) for o in rest for s in o.steps["step"]})
        held = (
            f"it holds {len(r.steps)} step(s) {[int(s) for s in r.steps['step']][:10]} with {len(r.colls)} "
            f"collective(s) over {_span_ms(r):.1f} ms, while the other files hold {n_rest:g} step(s) "
            f"{rest_steps[:10]} with {float(np.median([len(o.colls) for o in rest])):g} collective(s) "
            f"over {span_rest:.1f} ms (median)"
        )
        why = f"{r.truncated_how}; {held}" if r.truncated else held
        complete = [str(o.path) for o in rest if not o.truncated]
        out.append(
            _file_problem(
                r.path,
                "file",
                f"{failure}, and this file looks truncated: {why}. Re-export this rank's trace (the "
                "profiler's export or the copy was cut short), or pass only the complete ranks' files "
                f"({', '.join(complete[:8])}{' ...' if len(complete) > 8 else ''}), which are then "
                "replayed as their own data-parallel group",
            )
        )
    return out


_DROP_FIX = "Pass drop_unmatched (--drop-unmatched) to drop those steps."


@dataclass
class _Matching:
    """The rank files being matched across ranks (sorted by rank), and what matching drops or notes."""

    recs: list[_RankFile]
    src: str  # the files, for messages
    drop_unmatched: bool
    notes: list[str]
    dropped: dict[int, str] = field(default_factory=dict)  # step -> why

    def fail(self, failure: str, then: str = "") -> NoReturn:
        """Raise ``"<failure> (in <src>)<then>"``, or the truncated-file problems when a file looks truncated."""
        suspects = _truncated_suspects(self.recs, failure)
        if suspects:
            raise TraceProblems(suspects)
        raise TraceError(f"{failure} (in {self.src}){then}")


def _require_collectives(recs: list[_RankFile]) -> None:
    """Fail on the first file (in rank order) that recorded no collective."""
    for r in recs:
        if r.coll_source == "none":
            raise TraceError(
                "a trace must record at least one collective (NCCL/RCCL kernel, gloo:*/nccl:* annotation), "
                f"got none (in {r.path}). Profile with activities=[CPU, CUDA] around a distributed step."
            )


def _rebase(recs: list[_RankFile]) -> None:
    """Put every file with a ``baseTimeNanoseconds`` on one time axis (µs, in place).

    Times are shifted by the base's *difference* to the smallest base, so they stay small (float64
    keeps their ns digits; absolute epoch µs would round to 0.25 µs).
    """
    known = [r.base_us for r in recs if r.base_us is not None]
    ref_base = min(known) if known else 0.0
    for r in recs:
        if r.base_us is None:
            continue
        r.base_us -= ref_base
        r.steps[["start", "end"]] += r.base_us
        r.colls[["arrival", "end"]] += r.base_us
        r.fwd_end = r.fwd_end + r.base_us
        r.gpu_end = r.gpu_end + r.base_us


def _sync_kinds(recs: list[_RankFile], notes: list[str]) -> tuple[set[str], list[str]]:
    """``(use, folded)``: the sync kinds (the :data:`GRAD_KINDS` any rank has, else every kind, with a
    note) and the sorted others (folded into compute)."""
    all_kinds = pd.concat([r.colls["kind"] for r in recs]).value_counts()
    grad = [k for k in GRAD_KINDS if k in all_kinds.index]
    if grad:
        use = set(grad)
    else:
        use = set(all_kinds.index)
        notes.append(
            f"no all-reduce/reduce-scatter collective found; every collective ({sorted(use)}) is a sync point"
        )
    return use, sorted(set(all_kinds.index) - use)


def _common_steps(m: _Matching) -> tuple[set[Any], set[Any]]:
    """The steps every rank recorded and all steps any rank recorded.

    Steps missing from some rank go into ``m.dropped``. Fails when no step is common.
    """
    held = [set(r.steps["step"]) for r in m.recs]
    common, all_steps = set.intersection(*held), set.union(*held)
    for s in sorted(all_steps - common):
        cut = [o.path.name for o, steps in zip(m.recs, held, strict=True) if s not in steps and o.truncated]
        m.dropped[int(s)] = "not recorded by every rank" + (
            f" (missing from truncated {', '.join(cut)})" if cut else ""
        )
    if not common:
        m.fail(
            "the rank files must share at least one ProfilerStep#N, got disjoint step sets",
            ". Were they recorded in the same run with the same profiler schedule?",
        )
    return common, all_steps


def _keyed_collectives(recs: list[_RankFile], use: set[str], common: set[Any]) -> tuple[pd.DataFrame, bool]:
    """Every rank's sync collectives in the common steps (``_COLL_COLUMNS``, ``ord``, ``rank``), and
    ``use_seq``. ``(step, pg, ord)`` identifies one collective across ranks: ``ord`` is the sequence
    number when every collective has one (``use_seq``), else the ordinal by arrival within (step, pg).
    """
    use_seq = all(r.colls["seq"].notna().all() for r in recs if len(r.colls))
    keyed: list[pd.DataFrame] = []
    for r in recs:
        c = r.colls[r.colls["kind"].isin(use) & r.colls["step"].isin(common)].copy()
        c = c.sort_values(["step", "pg", "arrival"], kind="stable")
        c["ord"] = c["seq"] if use_seq else c.groupby(["step", "pg"]).cumcount()
        c["rank"] = r.rank
        keyed.append(c)
    return pd.concat(keyed, ignore_index=True), use_seq


def _drop_uneven_steps(m: _Matching, counts: pd.DataFrame) -> None:
    """Steps where the ranks' numbers of sync collectives (``counts``: step x rank) differ: fail, or
    with ``drop_unmatched`` add them to ``dropped`` with a note."""
    bad_steps = counts.index[(counts.nunique(axis=1) > 1).to_numpy()]
    if not len(bad_steps):
        return
    s = int(bad_steps[0])
    per_rank = {int(k): int(v) for k, v in counts.loc[s].items()}
    what = f"every rank must record the same collectives in a step, got {per_rank} (collectives per rank) in step {s}"
    unmatched = f"; {len(bad_steps)} step(s) unmatched"
    if not m.drop_unmatched:
        m.fail(what, f"{unmatched}. {_DROP_FIX}")
    for s2 in bad_steps:
        m.dropped[int(s2)] = "unmatched collectives across ranks"
    m.notes.append(f"{what} (in {m.src}){unmatched}; dropped")


def _drop_partial_collectives(m: _Matching, allc: pd.DataFrame, use_seq: bool) -> None:
    """Steps holding a collective key (step, pg, ord) that not every rank has: fail, or with
    ``drop_unmatched`` add them to ``dropped``."""
    n = len(m.recs)
    keys = allc.groupby(["step", "pg", "ord"])["rank"].nunique()
    part = keys[keys < n]
    if not len(part):
        return
    for s2 in part.index.get_level_values("step").unique():
        if int(s2) in m.dropped:
            continue
        if not m.drop_unmatched:
            where = tuple(plain(x) for x in part.index[0])
            what = (
                f"every collective must be matched on all {n} ranks, got {int(part.iloc[0])} rank(s) for "
                f"(step, group, {'seq' if use_seq else 'ordinal'}) = {where}"
            )
            m.fail(what, f". {_DROP_FIX}")
        m.dropped[int(s2)] = "unmatched collectives across ranks"


def _uniform_steps(
    m: _Matching, counts: pd.DataFrame, common: set[Any], all_steps: set[Any]
) -> tuple[list[Any], int]:
    """``(good, buckets)``: the steps kept for the replay (sorted; common, not dropped, with the most
    common number of buckets) and that number. Steps with another go into ``dropped``; a note lists
    every dropped step."""
    dropped = m.dropped
    good = sorted(set(common) - set(dropped))
    per_step = counts.loc[good].iloc[:, 0] if good else pd.Series(dtype=int)
    if len(per_step) == 0:
        m.fail(
            "at least one step must survive matching, got none",
            "; " + dropped_steps_note(dropped, len(all_steps)),
        )
    mode = int(per_step.mode().iloc[0])
    for s2, k in per_step.items():
        if k != mode:
            dropped[int(s2)] = f"{k} collectives instead of the usual {mode}"
    good = [s2 for s2 in good if int(s2) not in dropped]
    if mode == 0:
        m.fail("steps must contain at least one collective, got none in the common steps")
    if dropped:
        m.notes.append(dropped_steps_note(dropped, len(all_steps)))
    return good, mode


def _bucket_order(allc: pd.DataFrame) -> pd.DataFrame:
    """``allc`` with a ``bucket`` column: the collective's index in its step by mean arrival across ranks."""
    order = allc.groupby(["step", "pg", "ord"])["arrival"].mean().rename("mean_arrival").reset_index()
    order["bucket"] = order.sort_values(["step", "mean_arrival"], kind="stable").groupby("step").cumcount()
    return allc.merge(order[["step", "pg", "ord", "bucket"]], on=["step", "pg", "ord"])


def _match_collectives(
    m: _Matching, use: set[str], common: set[Any], all_steps: set[Any]
) -> tuple[pd.DataFrame, list[Any], int, bool]:
    """Match the sync collectives across ranks, dropping (or failing on) steps that do not match:
    ``(allc, good, buckets, use_seq)``, the matched collectives of the kept steps (with ``rank`` and
    ``bucket``), the kept steps, the buckets per step, and whether sequence numbers matched."""
    allc, use_seq = _keyed_collectives(m.recs, use, common)
    counts = (
        allc.groupby(["step", "rank"])
        .size()
        .unstack("rank")
        .reindex(index=sorted(common), columns=[r.rank for r in m.recs])
        .fillna(0)
        .astype(int)
    )
    _drop_uneven_steps(m, counts)
    _drop_partial_collectives(m, allc, use_seq)
    good, buckets = _uniform_steps(m, counts, common, all_steps)
    return _bucket_order(allc[allc["step"].isin(good)]), good, buckets, use_seq


@dataclass
class _Times:
    """Per kept step s, rank j (in rank order) and bucket k: the recorded times, µs."""

    arrival: NDArray[np.float64]  # [S, n, K] collective arrival
    end: NDArray[np.float64]  # [S, n, K] collective end
    step_start: NDArray[np.float64]  # [S, n]
    step_end: NDArray[np.float64]  # [S, n] CPU step end
    fwd_end: NDArray[np.float64]  # [S, n] forward end, NaN when not recorded
    gpu_end: NDArray[np.float64]  # [S, n] last GPU event end, NaN when none

    def shifted(self, offsets: NDArray[np.float64]) -> _Times:
        """These times minus each rank's clock offset (``offsets``: [n], µs)."""
        times = (getattr(self, f.name) for f in fields(self))
        return _Times(*(t - (offsets[None, :, None] if t.ndim == 3 else offsets[None, :]) for t in times))


def _time_arrays(recs: list[_RankFile], allc: pd.DataFrame, good: list[Any], buckets: int) -> _Times:
    """The matched collectives ``allc`` and the ranks' step times as [step, rank(, bucket)] arrays."""
    n = len(recs)
    ri = {r.rank: i for i, r in enumerate(recs)}
    si = {s: i for i, s in enumerate(good)}
    shape = (len(good), n, buckets)
    arrival = np.full(shape, np.nan)
    end = np.full(shape, np.nan)
    sidx = allc["step"].map(si).to_numpy()
    ridx = allc["rank"].map(ri).to_numpy()
    bidx = allc["bucket"].to_numpy()
    arrival[sidx, ridx, bidx] = allc["arrival"].to_numpy()
    end[sidx, ridx, bidx] = allc["end"].to_numpy()
    step_start = np.empty((len(good), n))
    step_end = np.empty((len(good), n))
    fwd_end = np.full((len(good), n), np.nan)
    gpu_end = np.full((len(good), n), np.nan)
    for j, r in enumerate(recs):
        st = r.steps.set_index("step").loc[good]
        step_start[:, j] = st["start"].to_numpy()
        step_end[:, j] = st["end"].to_numpy()
        fwd_end[:, j] = r.fwd_end.reindex(good).to_numpy(dtype=float)
        gpu_end[:, j] = r.gpu_end.reindex(good).to_numpy(dtype=float)
    return _Times(arrival, end, step_start, step_end, fwd_end, gpu_end)


def _align_clocks(t: _Times, align: str) -> tuple[_Times, NDArray[np.float64], NDArray[np.float64]]:
    """Estimate and remove each rank's clock offset against the first rank (see module docstring).

    Returns ``(times, offsets, residual)``: the times after alignment, the offsets applied ([n], µs;
    zeros when not applied) and max - min end over ranks per matched collective ([S, K], µs).
    """
    S, n, K = t.end.shape
    offsets = np.zeros(n) if align == "none" else clock_offsets(t.end, _AUTO_ALIGN_US, force=align == "end")
    t = t.shifted(offsets)
    resid = (np.nanmax(t.end, axis=1) - np.nanmin(t.end, axis=1)) if n > 1 else np.zeros((S, K))
    return t, offsets, resid


def _job_meta(recs: list[_RankFile], files: list[Path], world_size: int | None, name: str | None) -> JobMeta:
    """The job layout: pure data parallel over the files; world size from the argument, else the
    first declared one, at least the number of files and the highest rank + 1."""
    n = len(recs)
    declared = (
        world_size if world_size is not None else next((r.world_size for r in recs if r.world_size), None)
    )
    world = max(declared or n, max(r.rank for r in recs) + 1)
    return JobMeta(name=name or _job_name(files), dp_size=n, pp_size=1, world_size=world)


def _folded_per_step(recs: list[_RankFile], folded_kinds: list[str], common: set[Any]) -> dict[str, float]:
    """Mean count per rank and common step of each collective kind folded into compute."""
    n = len(recs)
    folded: dict[str, float] = {}
    for k in folded_kinds:
        tot = sum(int(((r.colls["kind"] == k) & r.colls["step"].isin(common)).sum()) for r in recs)
        folded[k] = tot / max(n * len(common), 1)
    return folded


def _assemble(
    recs: list[_RankFile],
    files: list[Path],
    world_size: int | None,
    align: str,
    drop_unmatched: bool,
    notes: list[str],
    name: str | None,
) -> tuple[OpTrace, KinetoReport]:
    """Build the trace and report from the ranks' files (``recs``, sorted by rank).

    Puts the files on one time axis, chooses the sync collectives, matches them across ranks
    (dropping or failing on steps that do not match), aligns the clocks and maps the times to ops.
    ``notes`` collects what was dropped or guessed (it becomes ``report.warnings``).
    """
    n = len(recs)
    src = "; ".join(sorted({str(r.path) for r in recs}))
    _require_collectives(recs)
    _rebase(recs)
    use, folded_kinds = _sync_kinds(recs, notes)
    m = _Matching(recs, src, drop_unmatched, notes)
    common, all_steps = _common_steps(m)
    allc, good, K, use_seq = _match_collectives(m, use, common, all_steps)
    times, offsets, resid = _align_clocks(_time_arrays(recs, allc, good, K), align)
    rank_ids = [r.rank for r in recs]
    table, spread, step_time_s = step_ops(
        times.arrival,
        times.end,
        times.step_start,
        steps=np.asarray(good, dtype=np.int64),
        ranks=rank_ids,
        fwd_end=times.fwd_end,
        step_end=np.fmax(times.step_end, times.gpu_end),
        scale=1e-6,
    )
    meta = _job_meta(recs, files, world_size, name)
    ops = validate_ops(table, meta, source=src)
    S = len(good)
    kinds_count = allc.groupby("kind").size() / max(n * S, 1)
    backends = sorted({r.backend for r in recs if r.backend})
    kinds_label = ", ".join(sorted(str(k) for k in kinds_count.index)) or "none"
    trace = OpTrace(
        ops=ops,
        meta=meta,
        source=src,
        fmt="kineto",
        collective=f"{','.join(backends)} {kinds_label}" if backends else kinds_label,
    )
    matching = (
        "process group + sequence number" if use_seq else "ordinal within (process group or stream) per step"
    )
    report = KinetoReport(
        files=[str(r.path) for r in recs],
        ranks=rank_ids,
        world_size=meta.world_size,
        backend=",".join(backends) or "unknown",
        steps=[int(s) for s in good],
        dropped_steps=dict(sorted(m.dropped.items())),
        buckets_per_step=K,
        kinds={str(k): float(v) for k, v in kinds_count.items()},
        folded_per_step=_folded_per_step(recs, folded_kinds, common),
        collective_source="; ".join(sorted({r.coll_source for r in recs})),
        arrival_source="; ".join(sorted({r.arrival_source for r in recs})),
        matching=matching if n > 1 else "single rank (nothing to match)",
        align=align,
        align_applied=bool(np.any(offsets != 0)),
        clock_offsets_s={rk: float(o) * 1e-6 for rk, o in zip(rank_ids, offsets, strict=True)},
        residual_median_s=float(np.median(resid)) * 1e-6,
        residual_max_s=float(np.max(resid)) * 1e-6,
        spread_first_s=spread[:, 0],
        spread_all_s=spread,
        step_time_s=step_time_s,
        num_events=sum(r.num_events for r in recs),
        warnings=notes,
    )
    return trace, report


def _job_name(files: list[Path]) -> str:
    stems = [f.name.split(".")[0] for f in files]
    prefix = stems[0]
    for s in stems[1:]:
        while not s.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix.rstrip("-_.")
    prefix = re.sub(r"[-_.]?rank$", "", prefix, flags=re.IGNORECASE)
    return prefix or files[0].parent.name or "kineto"
