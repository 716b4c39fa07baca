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
- the replay's dependency model (``pacectl/backends/dag.py``) runs gradient buckets one after another.
  Backends that run buckets concurrently (gloo's worker threads) would violate it, so a bucket's op
  starts at ``max(its arrival, previous bucket's end)``; the *true* arrivals still give the arrival
  spreads of :class:`KinetoReport`. The first bucket (the one pacing delays) is never shifted.

Matching across ranks: by (process group, sequence number) when every collective carries a sequence
number, else by ordinal within (process group or stream) and step (``KinetoReport.matching``).
Clock alignment: all ranks leave a collective together, so the median difference of matched end
times estimates each rank's clock offset against the first rank. ``align="auto"`` applies it only
when it exceeds both 1 ms and twice the median residual left after aligning (ranks on one host
share a clock, and there the small estimates are exit skew, not clock offsets); ``"end"`` always
applies it, ``"none"`` never. The residual (max - min end over ranks per matched collective, after
alignment if applied) is reported.
"""

from __future__ import annotations

import glob as globmod
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pacectl.errors import TraceError
from pacectl.traces.jsonstream import DEFAULT_MAX_BYTES, stream_events
from pacectl.traces.model import (
    MAX_DURATION_S,
    JobMeta,
    OpTrace,
    TraceWarning,
    dropped_steps_note,
    plain,
    validate_ops,
)

ALIGN_MODES = ("auto", "end", "none")
GRAD_KINDS = ("all_reduce", "reduce_scatter")
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


class TraceProblems(TraceError):
    """A TraceError carrying every problem found (``python -m pacectl.traces validate`` lists them)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first = self.problems[0]
        more = len(self.problems) - 1
        tail = (
            f"; {more} more problem(s), list them all with `python -m pacectl.traces validate`"
            if more
            else ""
        )
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
    rank_from: str
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

        def stats(x: NDArray[np.float64]) -> dict[str, float]:
            x = np.asarray(x, dtype=float).ravel()
            if x.size == 0:
                return {}
            return {
                "median": float(np.median(x)),
                "p99": float(np.quantile(x, 0.99)),
                "max": float(x.max()),
            }

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
            "arrival_spread_first_bucket_s": stats(self.spread_first_s),
            "arrival_spread_all_buckets_s": stats(self.spread_all_s),
            "step_time_s": {
                **stats(self.step_time_s),
                "mean": float(self.step_time_s.mean()) if self.step_time_s.size else math.nan,
            },
            "num_events": self.num_events,
            "warnings": self.warnings,
        }


# ----------------------------------------------------------------------------------------------- paths
def resolve_paths(
    paths: str | Path | Sequence[str | Path], *, suffixes: tuple[str, ...] = (".json", ".json.gz")
) -> list[Path]:
    """Expand files, directories (their ``*.json``/``*.json.gz`` files) and globs into a sorted file list.

    Raises:
        TraceError: a path does not exist, a directory holds no trace file, or a glob matches nothing.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise TraceError("trace path must name at least one file, directory or glob, got none")
    out: list[Path] = []
    for item in items:
        text = str(item)
        p = Path(text).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(suffixes))
            if not found:
                raise TraceError(
                    f"a trace directory must hold files ending in {list(suffixes)}, got "
                    f"{'an empty directory' if not any(p.iterdir()) else 'none of them'} ({str(p)!r}). "
                    "Point trace.path at the folder of the rank files."
                )
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif any(c in text for c in "*?["):
            found = sorted(Path(f) for f in globmod.glob(str(p)) if Path(f).is_file())
            if not found:
                raise TraceError(f"trace glob must match at least one file, got no match for {text!r}")
            out.extend(found)
        else:
            raise TraceError(f"trace path must be an existing file, directory or glob, got {text!r}")
    seen: set[Path] = set()
    unique = []
    for f in out:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


# -------------------------------------------------------------------------------------------- per file
def _args(ev: dict[str, Any]) -> dict[str, Any]:
    raw = ev.get("args")
    return raw if isinstance(raw, dict) else {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _read_rank_file(
    path: Path,
    *,
    rank_override: int | None,
    single: bool,
    max_bytes: int,
    problems: list[Problem],
    notes: list[str],
) -> _RankFile | None:
    """Stream one file; keep only the events the import needs, as compact columns."""
    fname = str(path)
    cols: dict[str, list[Any]] = {k: [] for k in ("kind", "name", "ts", "dur", "corr", "aux", "idx", "loc")}
    launches: dict[int, float] = {}
    # kind codes: S step, F forward marker, K collective kernel, G other GPU work, B CPU backend coll,
    # N nccl:* annotation, E c10d enqueue

    def problem(idx: int, fld: str, msg: str) -> None:
        if len(problems) < _MAX_PROBLEMS:
            problems.append(Problem(fname, f"event #{idx}", fld, msg))

    def on_event(ev: Any, idx: int) -> None:
        if not isinstance(ev, dict):
            problem(idx, "event", f"each trace event must be a JSON object, got {type(ev).__name__}")
            return
        if ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        name = ev.get("name")
        if not isinstance(cat, str) or not isinstance(name, str):
            return
        cat_l = cat.lower()
        code = ""
        aux: Any = None
        if cat_l == "user_annotation":
            if _STEP_RE.match(name):
                code = "S"
            elif "forward" in name.lower():
                code = "F"
            elif _CPU_COLL_RE.match(name):
                code = "N" if name.startswith("nccl:") else "B"
        elif cat_l == "gpu_user_annotation":
            if "forward" in name.lower():
                code = "F"
        elif cat_l in _GPU_CATS:
            args = _args(ev)
            if cat_l == "kernel" and _KERNEL_RE.match(name):
                code = "K"
                aux = {
                    "coll": args.get("Collective name"),
                    "pg": args.get("Process Group Name"),
                    "stream": args.get("stream", ev.get("tid")),
                    "nelems": args.get("In msg nelems"),
                    "seq": next((args[k] for k in _SEQ_KEYS if k in args), None),
                }
            else:
                code = "G"
            corr = _num(args.get("correlation"))
            cols["corr"].append(corr)
        elif cat_l == "cuda_runtime":
            args = _args(ev)
            corr = _num(args.get("correlation"))
            ts = _num(ev.get("ts"))
            if corr is not None and ts is not None and math.isfinite(ts):
                launches[int(corr)] = ts
            return
        elif cat_l == "cpu_op":
            if _ENQUEUE_RE.match(name):
                code = "E"
            elif _CPU_COLL_RE.match(name):
                code = "N" if name.startswith("nccl:") else "B"
        if not code:
            return
        if code not in ("K", "G"):
            cols["corr"].append(None)
        if code in ("B", "N", "E"):
            args = _args(ev)
            aux = {
                "pg": args.get("Process Group Name"),
                "seq": next((args[k] for k in _SEQ_KEYS if k in args), None),
            }
        ts = _num(ev.get("ts"))
        dur = _num(ev.get("dur"))
        ok = True
        if ts is None or not math.isfinite(ts):
            problem(idx, "ts", f"ts of {name[:60]!r} must be a finite number (µs), got {ev.get('ts')!r}")
            ok = False
        if dur is None or not math.isfinite(dur) or dur < 0 or dur > _MAX_DUR_US:
            problem(
                idx,
                "dur",
                f"dur of {name[:60]!r} must be a finite number in [0, {_MAX_DUR_US:.0f}] µs, got {ev.get('dur')!r}",
            )
            ok = False
        if not ok:
            cols["corr"].pop()
            return
        cols["kind"].append(code)
        cols["name"].append(name if code != "G" else "")
        cols["loc"].append(hash((name, str(ev.get("pid")), str(ev.get("tid")))))
        cols["ts"].append(ts)
        cols["dur"].append(dur)
        cols["aux"].append(aux)
        cols["idx"].append(idx)

    res = stream_events(path, on_event, max_bytes=max_bytes)
    meta = res.meta
    truncated_how = ""
    if res.truncated is not None:
        truncated_how = (
            f"its JSON ended early ({res.truncated.reason}) at character {res.truncated.offset}, "
            f"after {res.num_events} complete events"
        )
        lost = (
            "the rest of traceEvents and all metadata after it"
            if res.truncated.in_events
            else "trailing metadata"
        )
        notes.append(
            f"{fname}: truncated ({res.truncated.reason}) at character {res.truncated.offset}; recovered "
            f"{res.num_events} complete events, lost {lost}"
        )
    ev = pd.DataFrame(cols)
    ev["ts"] = ev["ts"].astype(float)
    ev["dur"] = ev["dur"].astype(float)
    # exact duplicates of the events used (same name, pid, tid, ts, dur) are a recording/merge error
    dup = ev.duplicated(subset=["kind", "loc", "ts", "dur"], keep="first")
    if dup.any():
        for _, row in ev[dup].head(20).iterrows():
            problems.append(
                Problem(
                    fname,
                    f"event #{int(row['idx'])}",
                    "event",
                    f"each event must appear once, got a duplicate of {row['name'][:60] or 'a GPU event'!r} at ts {plain(row['ts'])!r}",
                )
            )
    # --- rank and world size
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    rank: int | None = None
    rank_from = ""
    if dist is not None and isinstance(dist.get("rank"), int) and not isinstance(dist.get("rank"), bool):
        rank, rank_from = int(dist["rank"]), "distributedInfo"
    if rank_override is not None:
        if rank is not None and rank != rank_override:
            notes.append(f"{fname}: rank override {rank_override} replaces distributedInfo.rank {rank}")
        rank, rank_from = rank_override, "override"
    if rank is None:
        m = _RANK_RE.findall(path.name)
        if m:
            rank, rank_from = int(m[-1]), "file name"
        elif single:
            rank, rank_from = 0, "default (single file)"
        else:
            problems.append(
                Problem(
                    fname,
                    "file",
                    "distributedInfo.rank",
                    "the rank of each file must be known, got no distributedInfo.rank and no 'rank<N>' "
                    "in the file name; rename the file or pass ranks (--rank / trace.ranks)",
                )
            )
            return None
        notes.append(f"{fname}: distributedInfo.rank missing, rank {rank} taken from the {rank_from}")
    if rank < 0:
        problems.append(Problem(fname, "file", "rank", f"rank must be >= 0, got {rank!r}"))
        return None
    world: int | None = None
    if dist is not None:
        ws = dist.get("world_size")
        if isinstance(ws, int) and not isinstance(ws, bool) and ws >= 1:
            world = ws
        elif ws is not None:
            problems.append(
                Problem(
                    fname,
                    "file",
                    "distributedInfo.world_size",
                    f"world_size must be a positive integer, got {ws!r}",
                )
            )
    backend = str(dist.get("backend")) if dist is not None and dist.get("backend") is not None else None
    base = meta.get("baseTimeNanoseconds")
    base_num = _num(base)
    base_us = base_num / 1000.0 if base_num is not None and math.isfinite(base_num) else None
    # --- steps
    st = ev[ev["kind"] == "S"]
    if len(st):
        step_ids = st["name"].str.slice(len("ProfilerStep#")).astype(np.int64)
        steps = pd.DataFrame(
            {
                "step": step_ids.to_numpy(),
                "start": st["ts"].to_numpy(),
                "end": (st["ts"] + st["dur"]).to_numpy(),
            }
        )
        dups = steps["step"].duplicated()
        if dups.any():
            for i in np.flatnonzero(dups.to_numpy())[:5]:
                problems.append(
                    Problem(
                        fname,
                        f"event #{int(st['idx'].iloc[i])}",
                        "name",
                        f"each ProfilerStep#N must appear once, got step {int(steps['step'].iloc[i])} again",
                    )
                )
            steps = steps[~dups]
        steps = steps.sort_values("start").reset_index(drop=True)
    else:
        if len(ev) == 0:
            problems.append(
                Problem(
                    fname,
                    "file",
                    "traceEvents",
                    "a trace must hold ProfilerStep, collective or GPU events, got none",
                )
            )
            return None
        if res.truncated is not None:
            notes.append(
                f"{fname}: no ProfilerStep#N annotation survived the truncation; the recovered part is one step (0)"
            )
        else:
            notes.append(f"{fname}: no ProfilerStep#N annotation; the whole trace is one step (0)")
        steps = pd.DataFrame({"step": [0], "start": [ev["ts"].min()], "end": [(ev["ts"] + ev["dur"]).max()]})
    # --- anchor time (CPU launch of GPU events), then step of every event
    anchor = ev["ts"].to_numpy().copy()
    corr = ev["corr"].to_numpy()
    if launches:
        for i in np.flatnonzero(pd.notna(corr)):
            t = launches.get(int(corr[i]))
            if t is not None:
                anchor[i] = t
    starts = steps["start"].to_numpy()
    ends = steps["end"].to_numpy()
    pos = np.searchsorted(starts, anchor, side="right") - 1
    valid = pos >= 0
    last = len(starts) - 1
    valid &= ~((pos == last) & (anchor > ends[last] if last >= 0 else False))
    ev["step"] = np.where(valid, steps["step"].to_numpy()[np.clip(pos, 0, None)], -1)
    ev = ev[valid]
    # --- forward end and GPU end per step
    end_t = ev["ts"] + ev["dur"]
    fwd_end = end_t[ev["kind"] == "F"].groupby(ev["step"][ev["kind"] == "F"]).max()
    gpu_mask = ev["kind"].isin(["G", "K"])
    gpu_end = end_t[gpu_mask].groupby(ev["step"][gpu_mask]).max()
    # --- collectives, first source that exists
    colls: list[dict[str, Any]] = []
    kern = ev[ev["kind"] == "K"]
    back = ev[ev["kind"] == "B"]
    ann = ev[ev["kind"] == "N"]
    arrival_source = "collective start"
    if len(kern):
        source = "gpu kernels (NCCL/RCCL)"
        for (_, row), aux in zip(kern.iterrows(), kern["aux"], strict=True):
            km = _KERNEL_RE.match(row["name"])
            raw_kind = aux["coll"] if isinstance(aux.get("coll"), str) else (km.group(1) if km else "unknown")
            pg = aux["pg"] if isinstance(aux.get("pg"), str) else f"stream {aux['stream']}"
            colls.append(
                {
                    "step": row["step"],
                    "kind": _kind(str(raw_kind)),
                    "pg": pg,
                    "seq": _num(aux.get("seq")),
                    "arrival": row["ts"],
                    "end": row["ts"] + row["dur"],
                    "nelems": _num(aux.get("nelems")),
                }
            )
        arrival_source = "kernel start"
    elif len(back):
        source = "CPU backend spans (" + ", ".join(sorted({n.split(":")[0] for n in back["name"]})) + ")"
        arrival = back["ts"].to_numpy().copy()
        kinds = back["name"].map(lambda n: _kind(n.split(":", 1)[1])).to_numpy()
        enq = ev[ev["kind"] == "E"]
        enq_kind = enq["name"].map(lambda n: _kind(_ENQUEUE_RE.match(n).group(1))).to_numpy()  # type: ignore[union-attr]
        paired = len(enq) > 0
        for k in np.unique(kinds):
            bi = np.flatnonzero(kinds == k)
            ei = np.flatnonzero(enq_kind == k)
            if len(bi) != len(ei):
                paired = False
                break
            b_order = bi[np.argsort(back["ts"].to_numpy()[bi], kind="stable")]
            e_ts = np.sort(enq["ts"].to_numpy()[ei])
            if not (e_ts <= back["ts"].to_numpy()[b_order] + 1.0).all():
                paired = False
                break
            arrival[b_order] = e_ts
        if not paired:
            arrival = back["ts"].to_numpy()
        arrival_source = "c10d enqueue (paired with the backend span)" if paired else "backend span start"
        for i, ((_, row), aux) in enumerate(zip(back.iterrows(), back["aux"], strict=True)):
            colls.append(
                {
                    "step": row["step"],
                    "kind": kinds[i],
                    "pg": aux["pg"] if isinstance(aux.get("pg"), str) else "default",
                    "seq": _num(aux.get("seq")),
                    "arrival": float(arrival[i]),
                    "end": row["ts"] + row["dur"],
                    "nelems": math.nan,
                }
            )
    elif len(ann):
        source = "nccl:* CPU annotations (no device timing)"
        arrival_source = "CPU enqueue"
        for (_, row), aux in zip(ann.iterrows(), ann["aux"], strict=True):
            colls.append(
                {
                    "step": row["step"],
                    "kind": _kind(row["name"].split(":", 1)[1]),
                    "pg": aux["pg"] if isinstance(aux.get("pg"), str) else "default",
                    "seq": _num(aux.get("seq")),
                    "arrival": row["ts"],
                    "end": row["ts"] + row["dur"],
                    "nelems": math.nan,
                }
            )
    else:
        source = "none"
    coll_df = pd.DataFrame(colls, columns=["step", "kind", "pg", "seq", "arrival", "end", "nelems"])
    return _RankFile(
        path=path,
        rank=rank,
        rank_from=rank_from,
        world_size=world,
        backend=backend,
        base_us=base_us,
        truncated=res.truncated is not None,
        truncated_how=truncated_how,
        steps=steps,
        colls=coll_df,
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
            problems.append(Problem(str(f), "file", "file", str(err)))
            continue
        if rec is not None:
            recs.append(rec)
    if strict:
        for r in recs:
            if r.truncated:
                problems.append(
                    Problem(
                        str(r.path),
                        "file",
                        "file",
                        "a trace file must be complete in strict mode, got a truncated file",
                    )
                )
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
    return Problem(
        where,
        "file",
        "file",
        f"a trace must be the rank files of one job, got files of {len(groups)} jobs "
        f"({'; '.join(describe(k, v) for k, v in groups.items())})"
        + (" in this folder" if where != "<set>" else "")
        + f". Pick one job's files with a quoted glob, e.g. '{best}'",
    )


def _check_ranks(
    recs: list[_RankFile], world_size: int | None, strict: bool, problems: list[Problem], notes: list[str]
) -> None:
    ranks_seen = [r.rank for r in recs]
    declared_all = {r.world_size for r in recs if r.world_size is not None}
    if len(set(ranks_seen)) < len(ranks_seen) or (world_size is None and len(declared_all) > 1):
        several = _several_jobs(recs)
        if several is not None:
            problems.append(several)
            return
    by_rank: dict[int, Path] = {}
    for r in recs:
        if r.rank in by_rank:
            problems.append(
                Problem(
                    str(r.path),
                    "file",
                    "distributedInfo.rank",
                    f"each rank must come from one file, got rank {r.rank} also in {by_rank[r.rank]}",
                )
            )
        by_rank[r.rank] = r.path
    declared = {r.world_size for r in recs if r.world_size is not None}
    if world_size is None and len(declared) > 1:
        problems.append(
            Problem(
                str(recs[0].path),
                "file",
                "distributedInfo.world_size",
                f"all files must declare one world_size, got {sorted(declared)!r}",
            )
        )
        return
    world = world_size if world_size is not None else (declared.pop() if declared else None)
    if world is None:
        return
    for r in recs:
        if r.rank >= world:
            problems.append(
                Problem(
                    str(r.path), "file", "rank", f"rank must be in [0, world_size={world}), got {r.rank!r}"
                )
            )
    if len(recs) > world:
        problems.append(
            Problem(
                "<set>",
                "file",
                "world_size",
                f"the number of rank files must be <= world_size={world}, got {len(recs)}",
            )
        )
    elif len(recs) < world:
        msg = (
            f"the number of rank files must equal world_size={world}, got {len(recs)} "
            f"(ranks {sorted(by_rank)[:16]})"
        )
        if strict:
            problems.append(
                Problem("<set>", "file", "world_size", msg + "; pass all rank files, or drop --strict")
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
    if len(recs) < 2:
        return []
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
            Problem(
                str(r.path),
                "file",
                "file",
                f"{failure}, and this file looks truncated: {why}. Re-export this rank's trace (the "
                "profiler's export or the copy was cut short), or pass only the complete ranks' files "
                f"({', '.join(complete[:8])}{' ...' if len(complete) > 8 else ''}), which are then "
                "replayed as their own data-parallel group",
            )
        )
    return out


def _fail_across_ranks(recs: list[_RankFile], message: str, failure: str) -> NoReturn:
    """Raise ``message``, or the truncated-file problems when a file looks truncated."""
    suspects = _truncated_suspects(recs, failure)
    if suspects:
        raise TraceProblems(suspects)
    raise TraceError(message)


def _assemble(
    recs: list[_RankFile],
    files: list[Path],
    world_size: int | None,
    align: str,
    drop_unmatched: bool,
    notes: list[str],
    name: str | None,
) -> tuple[OpTrace, KinetoReport]:
    n = len(recs)
    src = "; ".join(sorted({str(r.path) for r in recs}))
    # relative ts + baseTimeNanoseconds: shift by the base *difference* to the smallest base, so
    # times stay small (float64 keeps their ns digits; absolute epoch µs would round to 0.25 µs)
    known = [r.base_us for r in recs if r.base_us is not None]
    ref_base = min(known) if known else 0.0
    for r in recs:
        if r.base_us is not None:
            r.base_us -= ref_base
    for r in recs:
        if r.coll_source == "none":
            raise TraceError(
                "a trace must record at least one collective (NCCL/RCCL kernel, gloo:*/nccl:* annotation), "
                f"got none (in {r.path}). Profile with activities=[CPU, CUDA] around a distributed step."
            )
        if r.base_us is not None:
            r.steps[["start", "end"]] += r.base_us
            r.colls[["arrival", "end"]] += r.base_us
            r.fwd_end = r.fwd_end + r.base_us
            r.gpu_end = r.gpu_end + r.base_us
    dropped: dict[int, str] = {}
    # --- collectives used as sync points: gradient ones if any rank has them, else all
    all_kinds = pd.concat([r.colls["kind"] for r in recs]).value_counts()
    grad = [k for k in GRAD_KINDS if k in all_kinds.index]
    if grad:
        use = set(grad)
    else:
        use = set(all_kinds.index)
        notes.append(
            f"no all-reduce/reduce-scatter collective found; every collective ({sorted(use)}) is a sync point"
        )
    folded_kinds = sorted(set(all_kinds.index) - use)
    # --- steps common to every rank
    common = set(recs[0].steps["step"])
    for r in recs[1:]:
        common &= set(r.steps["step"])
    all_steps = set().union(*(set(r.steps["step"]) for r in recs))
    for s in sorted(all_steps - common):
        lacking = [o for o in recs if s not in set(o.steps["step"])]
        cut = [o.path.name for o in lacking if o.truncated]
        dropped[int(s)] = "not recorded by every rank" + (
            f" (missing from truncated {', '.join(cut)})" if cut else ""
        )
    if not common:
        _fail_across_ranks(
            recs,
            f"the rank files must share at least one ProfilerStep#N, got disjoint step sets (in {src}). "
            "Were they recorded in the same run with the same profiler schedule?",
            "the rank files must share at least one ProfilerStep#N, got disjoint step sets",
        )
    # --- match collectives per step across ranks
    use_seq = all(r.colls["seq"].notna().all() for r in recs if len(r.colls))
    matching = (
        "process group + sequence number" if use_seq else "ordinal within (process group or stream) per step"
    )
    keyed: list[pd.DataFrame] = []
    for r in recs:
        c = r.colls[r.colls["kind"].isin(use) & r.colls["step"].isin(common)].copy()
        c = c.sort_values(["step", "pg", "arrival"], kind="stable")
        c["ord"] = c["seq"] if use_seq else c.groupby(["step", "pg"]).cumcount()
        c["rank"] = r.rank
        keyed.append(c)
    allc = pd.concat(keyed, ignore_index=True)
    counts = (
        allc.groupby(["step", "rank"])
        .size()
        .unstack("rank")
        .reindex(index=sorted(common), columns=[r.rank for r in recs])
        .fillna(0)
        .astype(int)
    )
    bad_steps = counts.index[(counts.nunique(axis=1) > 1).to_numpy()]
    if len(bad_steps):
        s = int(bad_steps[0])
        row = counts.loc[s]
        per_rank = {int(k): int(v) for k, v in row.items()}
        msg = (
            f"every rank must record the same collectives in a step, got {per_rank} "
            f"(collectives per rank) in step {s} (in {src}); {len(bad_steps)} step(s) unmatched"
        )
        if not drop_unmatched:
            _fail_across_ranks(
                recs,
                msg + ". Pass drop_unmatched (--drop-unmatched) to drop those steps.",
                f"every rank must record the same collectives in a step, got {per_rank} (collectives per rank) in step {s}",
            )
        for s2 in bad_steps:
            dropped[int(s2)] = "unmatched collectives across ranks"
        notes.append(msg + "; dropped")
    keys = allc.groupby(["step", "pg", "ord"])["rank"].nunique()
    part = keys[keys < n]
    if len(part):
        for s2 in part.index.get_level_values("step").unique():
            if int(s2) not in dropped:
                if not drop_unmatched:
                    where = tuple(plain(x) for x in part.index[0])
                    what = (
                        f"every collective must be matched on all {n} ranks, got {int(part.iloc[0])} rank(s) for "
                        f"(step, group, {'seq' if use_seq else 'ordinal'}) = {where}"
                    )
                    _fail_across_ranks(
                        recs,
                        f"{what} (in {src}). Pass drop_unmatched (--drop-unmatched) to drop those steps.",
                        what,
                    )
                dropped[int(s2)] = "unmatched collectives across ranks"
    good = sorted(set(common) - set(dropped))
    per_step = counts.loc[good].iloc[:, 0] if good else pd.Series(dtype=int)
    if len(per_step) == 0:
        _fail_across_ranks(
            recs,
            f"at least one step must survive matching, got none (in {src}); "
            + dropped_steps_note(dropped, len(all_steps)),
            "at least one step must survive matching, got none",
        )
    # uniform structure for the replay: keep the most common bucket count
    mode = int(per_step.mode().iloc[0])
    for s2, k in per_step.items():
        if k != mode:
            dropped[int(s2)] = f"{k} collectives instead of the usual {mode}"
    good = [s2 for s2 in good if int(s2) not in dropped]
    if mode == 0:
        raise TraceError(
            f"steps must contain at least one collective, got none in the common steps (in {src})"
        )
    if dropped:
        notes.append(dropped_steps_note(dropped, len(all_steps)))
    allc = allc[allc["step"].isin(good)]
    # bucket order: by mean arrival across ranks within the step
    order = allc.groupby(["step", "pg", "ord"])["arrival"].mean().rename("mean_arrival").reset_index()
    order["bucket"] = order.sort_values(["step", "mean_arrival"], kind="stable").groupby("step").cumcount()
    allc = allc.merge(order[["step", "pg", "ord", "bucket"]], on=["step", "pg", "ord"])
    rank_ids = [r.rank for r in recs]
    ri = {rk: i for i, rk in enumerate(rank_ids)}
    si = {s2: i for i, s2 in enumerate(good)}
    S, K = len(good), mode
    A = np.full((S, n, K), np.nan)
    E = np.full((S, n, K), np.nan)
    sidx = allc["step"].map(si).to_numpy()
    ridx = allc["rank"].map(ri).to_numpy()
    bidx = allc["bucket"].to_numpy()
    A[sidx, ridx, bidx] = allc["arrival"].to_numpy()
    E[sidx, ridx, bidx] = allc["end"].to_numpy()
    S0 = np.empty((S, n))
    SE = np.empty((S, n))
    FE = np.full((S, n), np.nan)
    GE = np.full((S, n), np.nan)
    for j, r in enumerate(recs):
        st = r.steps.set_index("step").loc[good]
        S0[:, j] = st["start"].to_numpy()
        SE[:, j] = st["end"].to_numpy()
        FE[:, j] = r.fwd_end.reindex(good).to_numpy(dtype=float)
        GE[:, j] = r.gpu_end.reindex(good).to_numpy(dtype=float)
    # --- clock alignment on collective ends
    offsets = np.zeros(n)
    if n > 1 and align != "none":
        diff = (E - E[:, :1, :]).transpose(1, 0, 2).reshape(n, -1)
        est = np.nanmedian(diff, axis=1)
        after = E - est[None, :, None]
        resid_after = float(np.nanmedian(np.nanmax(after, axis=1) - np.nanmin(after, axis=1)))
        # auto: ranks on one host share a clock, and their exit skew (not a clock offset) makes small
        # estimates; only an offset well above the post-alignment residual is a clock difference
        apply = align == "end" or bool(np.nanmax(np.abs(est)) > max(_AUTO_ALIGN_US, 2.0 * resid_after))
        if apply:
            offsets = est
    applied = bool(np.any(offsets != 0))
    shift = offsets[None, :]
    A, E = A - shift[..., None], E - shift[..., None]
    S0, SE, FE, GE = S0 - shift, SE - shift, FE - shift, GE - shift
    resid = (np.nanmax(E, axis=1) - np.nanmin(E, axis=1)) if n > 1 else np.zeros((S, K))
    # --- ops, µs; arrivals clamped into the step
    A = np.maximum(A, S0[..., None])
    E = np.maximum(E, A)
    A_sorted = np.sort(A, axis=2)
    fe = np.where(np.isnan(FE), A_sorted[..., 0], FE)
    fe = np.clip(fe, S0, A_sorted[..., 0])
    starts_b = A.copy()
    for k in range(1, K):  # the replay serialises buckets (see module docstring)
        starts_b[..., k] = np.maximum(A[..., k], E[..., k - 1])
    E = np.maximum(E, starts_b)
    last_end = E.max(axis=2)
    step_end = np.fmax(np.fmax(SE, GE), last_end)
    bounds = np.concatenate([fe[..., None], A_sorted], axis=2)
    t0 = S0.min(axis=1)[:, None]
    rows: list[pd.DataFrame] = []
    step_arr = np.asarray(good, dtype=np.int64)

    def block(optype: str, seq: int, start: NDArray[np.float64], end: NDArray[np.float64], mc: int) -> None:
        rows.append(
            pd.DataFrame(
                {
                    "step": np.repeat(step_arr, n),
                    "dp_rank": np.tile(np.arange(n), S),
                    "stage": 0,
                    "rank": np.tile(np.asarray(rank_ids, dtype=np.int64), S),
                    "optype": optype,
                    "seq_id": seq,
                    "mc": mc,
                    "start_ts": ((start - t0) * 1e-6).ravel(),
                    "duration": (np.maximum(end - start, 0.0) * 1e-6).ravel(),
                }
            )
        )

    block("forward-compute", 0, S0, fe, 0)
    for k in range(K):
        block("backward-compute", k, bounds[..., k], bounds[..., k + 1], 0)
        block("grads-reduce-scatter", k, starts_b[..., k], E[..., k], -1)
    block("optimizer", 0, last_end, step_end, -1)
    ops = pd.concat(rows, ignore_index=True)
    declared = (
        world_size if world_size is not None else next((r.world_size for r in recs if r.world_size), None)
    )
    world = max(declared or n, max(rank_ids) + 1)
    job = name or _job_name(files)
    meta = JobMeta(name=job, dp_size=n, pp_size=1, world_size=world)
    ops = validate_ops(ops, meta, source=src)
    spread = (A.max(axis=1) - A.min(axis=1)) * 1e-6  # true arrivals, [S, K]
    kinds_count = allc.groupby("kind").size() / max(n * S, 1)
    folded: dict[str, float] = {}
    for k2 in folded_kinds:
        tot = sum(int((r.colls["kind"] == k2).sum()) for r in recs)
        folded[k2] = tot / max(n * len(common), 1)
    backends = sorted({r.backend for r in recs if r.backend})
    srcs = sorted({r.coll_source for r in recs})
    arr_srcs = sorted({r.arrival_source for r in recs})
    kinds_label = ", ".join(sorted(str(k2) for k2 in kinds_count.index)) or "none"
    trace = OpTrace(
        ops=ops,
        meta=meta,
        source=src,
        fmt="kineto",
        collective=f"{','.join(backends)} {kinds_label}" if backends else kinds_label,
    )
    report = KinetoReport(
        files=[str(r.path) for r in recs],
        ranks=rank_ids,
        world_size=world,
        backend=",".join(backends) or "unknown",
        steps=[int(s2) for s2 in good],
        dropped_steps=dict(sorted(dropped.items())),
        buckets_per_step=K,
        kinds={str(k2): float(v) for k2, v in kinds_count.items()},
        folded_per_step=folded,
        collective_source="; ".join(srcs),
        arrival_source="; ".join(arr_srcs),
        matching=matching if n > 1 else "single rank (nothing to match)",
        align=align,
        align_applied=applied,
        clock_offsets_s={rk: float(o) * 1e-6 for rk, o in zip(rank_ids, offsets, strict=True)},
        residual_median_s=float(np.median(resid)) * 1e-6,
        residual_max_s=float(np.max(resid)) * 1e-6,
        spread_first_s=spread[:, 0],
        spread_all_s=spread,
        step_time_s=((step_end.max(axis=1) - S0.min(axis=1)) * 1e-6),
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
