"""The canonical trace model: one row per recorded operation, per rank, per step.

The schema follows the per-op what-if trace of Lin et al., "Understanding Stragglers in Large Model
Training Using What-if Analysis" (OSDI 2025), because it is the richest of the formats pacectl
reads; every importer (ByteDance parquet, Kineto JSON, step-level CSV, pacectl's own records)
produces an :class:`OpTrace`.

Columns of :attr:`OpTrace.ops` (one row = one op on one rank in one step):

=============  ========  =================================================================
column         dtype     meaning
=============  ========  =================================================================
``step``       int64     training iteration id (need not be contiguous)
``dp_rank``    int64     data-parallel rank, ``[0, dp_size)``
``stage``      int64     pipeline-parallel rank, ``[0, pp_size)``
``rank``       int64     global rank id (one TP/DSP representative per (dp_rank, stage))
``optype``     str       op type, one of :data:`OPTYPES`
``seq_id``     int64     n-th op of this type in this step on this rank, ordered by start
``mc``         int64     model chunk (virtual pipeline), -1 for comm ops
``start_ts``   float64   seconds from the step start; min over all ranks of a step is 0
``duration``   float64   seconds; for collectives it includes the wait for the last rank
``delay_s``    float64   optional: pacing delay applied right before this op (live runs), s
=============  ========  =================================================================
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pacectl.errors import TraceError, repair_rows

COMPUTE_OPTYPES = ("forward-compute", "backward-compute")
P2P_OPTYPES = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COLLECTIVES = ("params-all-gather", "grads-reduce-scatter")
LOCAL_OPTYPES = ("gc", "layernorm-grads-all-reduce", "optimizer")
OTHER_COLLECTIVES = ("embedding-grads-all-reduce", "optimizer-clip-main-grad")
#: Every op type the replay understands.
OPTYPES = COMPUTE_OPTYPES + P2P_OPTYPES + DP_COLLECTIVES + LOCAL_OPTYPES + OTHER_COLLECTIVES

CANONICAL_COLUMNS = ("step", "dp_rank", "stage", "rank", "optype", "seq_id", "mc", "start_ts", "duration")
#: Durations above this are treated as corrupt (one week, seconds).
MAX_DURATION_S = 7 * 24 * 3600.0
#: Values of :attr:`OpTrace.time_unit`.
TIME_UNITS = ("s", "normalized")
#: The columns that identify one op: at most one row per key.
OP_KEY = ("step", "dp_rank", "stage", "optype", "seq_id")


class TraceWarning(UserWarning):
    """A trace was usable, but something in it was repaired, guessed or dropped (the message says what)."""


def plain(value: Any) -> Any:
    """``value`` with numpy scalars turned into Python ones, so messages show ``-5``, not ``np.int64(-5)``."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def quantile_stats(x: Any) -> dict[str, float] | None:
    """``{"median", "p99", "max"}`` of the values in ``x`` (any shape, units kept), or None when empty."""
    x = np.asarray(x, dtype=float).ravel()
    if x.size == 0:
        return None
    return {"median": float(np.median(x)), "p99": float(np.quantile(x, 0.99)), "max": float(x.max())}


def _ids(ids: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:limit])
    more = len(ids) - limit
    return f"[{shown}{f', ... ({more} more)' if more > 0 else ''}]"


def dropped_steps_note(
    dropped: Mapping[int, str], total: int, *, source: str | None = None, rows: int | None = None
) -> str:
    """The one wording every importer uses for steps it leaves out.

    Example:
        >>> dropped_steps_note({7: "not recorded by every worker", 9: "not recorded by every worker"}, 10,
        ...                    source="job.csv", rows=3)
        'job.csv: dropped 2 of 10 steps (3 rows): not recorded by every worker: steps [7, 9]'
    """
    by_reason: dict[str, list[int]] = {}
    for step, reason in sorted(dropped.items()):
        by_reason.setdefault(reason, []).append(int(step))
    parts = "; ".join(f"{reason}: steps {_ids(ids)}" for reason, ids in by_reason.items())
    head = f"{source}: " if source else ""
    tail = f" ({rows} row{'s' if rows != 1 else ''})" if rows is not None else ""
    return f"{head}dropped {len(dropped)} of {total} steps{tail}: {parts}"


def describe_op_row(row: pd.Series) -> str:
    """``"step 23, rank 0, optype forward-compute, seq_id 3"`` for a row of an op table."""
    return ", ".join(f"{c} {plain(row[c])}" for c in ("step", "rank", "optype", "seq_id") if c in row.index)


def packed_key(columns: Sequence[np.ndarray]) -> np.ndarray | None:
    """One ``int64`` key per row whose order is the rows' lexicographic order over ``columns``.

    Mixed radix: each integer column, offset by its minimum, is one digit. Equal keys are equal
    rows over these columns, so sorting, grouping and duplicate checks run on one packed array
    instead of several (numpy, not pandas' multi-column hashing).

    Args:
        columns: integer arrays of one length (the first is the most significant).

    Returns:
        ``int64[n]``, or None when the digits' spans do not fit 62 bits (or a column is not integer).
    """
    if not columns:
        return None
    arrays = [np.asarray(c) for c in columns]
    if any(a.dtype.kind not in "iu" for a in arrays):
        return None
    arrays = [a.astype(np.int64) if a.dtype == np.uint64 else a for a in arrays]  # int64 += uint64 is refused
    if len(arrays[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    bounds = [(int(a.min()), int(a.max())) for a in arrays]
    spans = [hi - lo + 1 for lo, hi in bounds]
    if math.prod(spans) >= 1 << 62:
        return None
    # key = sum of (digit - lo) * weight: the digits added as read, their minima taken off once at
    # the end when the unshifted sum fits in int64 (else digit by digit)
    weights = [math.prod(spans[i + 1 :]) for i in range(len(spans))]
    shift_once = sum(max(abs(lo), abs(hi)) * w for (lo, hi), w in zip(bounds, weights, strict=True)) < 1 << 62
    key = arrays[0].astype(np.int64)
    if not shift_once:
        key -= bounds[0][0]
    for values, span, (lo, _) in zip(arrays[1:], spans[1:], bounds[1:], strict=True):
        key *= span  # in place: each digit adds no temporary of the key's size
        key += values
        if lo and not shift_once:
            key -= lo
    offset = sum(lo * w for (lo, _), w in zip(bounds, weights, strict=True))
    if shift_once and offset:
        key -= offset
    return key


def _span(values: np.ndarray) -> int:
    """``max - min + 1``: the radix of one :func:`packed_key` digit."""
    return int(values.max()) - int(values.min()) + 1


def drop_exact_duplicates(
    df: pd.DataFrame,
    *,
    source: str,
    what: str,
    describe: Any = None,
    row_offset: int = 0,
) -> pd.DataFrame:
    """Drop rows equal in every column to an earlier row, with a :class:`TraceWarning` saying how many.

    Rows that share a key but differ in a value are *not* touched here: the importer's key check
    reports them as an error, because which one is right cannot be known.

    Args:
        df: the raw table (columns as read; an unnamed CSV index column must already be removed).
        source: file name for the warning.
        what: what the columns compare, for the warning (``"worker, time and values"``).
        describe: optional ``row -> str`` naming the first duplicate (``"worker 3, time 2381"``).
        row_offset: added to the 0-based row index to name the row as the user sees it in the file.

    Returns:
        ``df`` without the duplicates (the first occurrence is kept).
    """
    dup = df.duplicated(keep="first")
    count = int(dup.sum())
    if count == 0:
        return df
    i = int(np.flatnonzero(dup.to_numpy())[0])
    row = df.iloc[i]
    same = (df.eq(row) | (df.isna() & row.isna())).all(axis=1)  # NaN equals NaN, as in duplicated()
    original = int(np.flatnonzero(same.to_numpy())[0])  # the row it repeats
    first = f"row {i + row_offset}" + (f" ({describe(df.iloc[i])})" if describe is not None else "")
    warnings.warn(
        f"{source}: dropped {count} exact duplicate row{'s' if count != 1 else ''} "
        f"(same {what} as an earlier row; the first dropped: {first}, a copy of row {original + row_offset})",
        TraceWarning,
        stacklevel=3,
    )
    return df[~dup.to_numpy()]


def keys_repeat(columns: Sequence[np.ndarray]) -> bool:
    """Whether two rows share their values over the integer ``columns`` (a key such as (worker, step)).

    Decided on one sorted :func:`packed_key`, so a table whose keys are unique skips pandas'
    whole-row comparisons (:func:`drop_exact_duplicates`, ``duplicated``).

    Args:
        columns: integer arrays of one length.

    Returns:
        False when every row's key is its own; True when some repeat, or when the columns cannot
        be packed (then the caller checks the slow way).
    """
    packed = packed_key(columns)
    if packed is None:
        return True
    packed.sort()
    return bool((packed[1:] == packed[:-1]).any())


@dataclass(frozen=True)
class JobMeta:
    """Parallel layout of the recorded job.

    Attributes:
        name: job or trial name.
        dp_size: data-parallel degree.
        pp_size: pipeline-parallel degree.
        tp_size: tensor-parallel degree (TP peers are folded into one representative rank).
        dsp_size: sequence-parallel degree (folded like TP).
        vpp_size: virtual pipeline chunks per stage.
        world_size: total ranks, ``dp * pp * tp * dsp``.
    """

    name: str
    dp_size: int
    pp_size: int
    tp_size: int = 1
    dsp_size: int = 1
    vpp_size: int = 1
    world_size: int = 0

    def __post_init__(self) -> None:
        if self.world_size == 0:
            object.__setattr__(self, "world_size", self.dp_size * self.pp_size * self.tp_size * self.dsp_size)


@dataclass(frozen=True)
class OpTrace:
    """A validated op-level trace.

    Attributes:
        ops: the op table, columns :data:`CANONICAL_COLUMNS`, sorted by
            ``(step, dp_rank, stage, optype, seq_id)``.
        meta: the job layout.
        source: where it came from (path or description), used in messages and outputs.
        fmt: importer name (``"bytedance"``, ``"kineto"``, ...).
        pacing_blocks_compute: the recorded job paced with a host sleep on the training thread
            (CPU/gloo live runs), so a pacing delay also delays the compute op that follows the paced
            collective's launch (``backward-compute`` with the next ``seq_id``); the replay then delays
            that op too. False: the delay is on the communication side only (CUDA/NCCL, the default).
        time_unit: what the times of :attr:`ops` are. ``"s"``: real seconds (every importer but
            one). ``"normalized"``: the source recorded only normalised times (the Alibaba PAI
            ``batch_time_norm``, 0-1000 per job), scaled by ``norm_unit_s`` seconds per unit so the
            replay can run; figures in seconds or it/s derived from such a trace are in arbitrary
            units and only their ratios (CV, relative throughput) mean something.
        norm_unit_s: seconds per normalised unit (``"normalized"`` only; 1.0 otherwise), so
            ``seconds / norm_unit_s`` gives back the file's normalised values.
        measured_step_time_s: the step times the source measured apart from its op stamps, one
            per step of :attr:`steps`, seconds; None: the op spans are the step times. Live records
            carry their iteration periods here (between common exits on the host clock the ranks
            share, else the mean of the ranks' own periods), because the span of jittery per-rank
            stamps can overstate them; fidelity compares against these.
        sample_every_iters: training iterations between consecutive recorded steps (1: every
            iteration recorded). A step-level series sampled every 10 iterations (the Alibaba PAI
            files) has 10: its consecutive steps are 10 real iterations apart, so a lag or an
            autocorrelation counted in its steps is 10 times as long in iterations.
        collective: what the source calls the collectives recorded under the canonical gradient op
            type ``grads-reduce-scatter`` (the schema has one type for the gradient collective,
            whatever its algorithm), e.g. ``"gloo all_reduce"`` for a Kineto capture of DDP; empty:
            the source's own name is that op type (ByteDance Megatron traces).
        timing: how the arrival times were estimated, one line, for sources without step markers
            or end times (the Flight Recorder and NCCL Inspector importers: ``"duration: clock-free
            ..."`` or ``"created: arrival = host enqueue time ..."``); empty: the source recorded them.
    """

    ops: pd.DataFrame = field(repr=False)
    meta: JobMeta
    source: str
    fmt: str
    pacing_blocks_compute: bool = False
    time_unit: str = "s"
    norm_unit_s: float = 1.0
    measured_step_time_s: tuple[float, ...] | None = None
    collective: str = ""
    sample_every_iters: int = 1
    timing: str = ""

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS:
            raise TraceError(f"time_unit must be one of {list(TIME_UNITS)}, got {self.time_unit!r}")
        if not (np.isfinite(self.norm_unit_s) and self.norm_unit_s > 0):
            raise TraceError(f"norm_unit_s must be a positive number of seconds, got {self.norm_unit_s!r}")
        every = self.sample_every_iters
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise TraceError(f"sample_every_iters must be an integer >= 1, got {every!r} (in {self.source})")
        measured = self.measured_step_time_s
        if measured is not None:
            values = np.asarray(measured, dtype=np.float64)
            if values.shape != (len(self.steps),) or not (np.isfinite(values).all() and (values > 0).all()):
                raise TraceError(
                    f"measured_step_time_s must hold one positive finite time per step ({len(self.steps)}), "
                    f"got {len(values)} values (in {self.source})"
                )
            object.__setattr__(self, "measured_step_time_s", tuple(float(v) for v in values))

    @property
    def time_normalized(self) -> bool:
        """True when the times are normalised units, not measured seconds (see ``time_unit``)."""
        return self.time_unit == "normalized"

    @property
    def steps(self) -> np.ndarray:
        """Sorted unique step ids, ``int64[num_steps]``."""
        return np.unique(self.ops["step"].to_numpy())

    @property
    def num_ranks(self) -> int:
        """Distinct (dp_rank, stage) ranks recorded."""
        return self.meta.dp_size * self.meta.pp_size

    def recorded_step_time_s(self) -> pd.Series:
        """Recorded wall time of each step: latest op end minus the step start (0), seconds."""
        end = self.ops["start_ts"] + self.ops["duration"]
        return end.groupby(self.ops["step"]).max().rename("step_time_s")

    def reference_step_time_s(self) -> pd.Series:
        """The step times a replay is judged against: :attr:`measured_step_time_s` if the source
        measured them, else :meth:`recorded_step_time_s`; seconds, indexed by step."""
        if self.measured_step_time_s is None:
            return self.recorded_step_time_s()
        return pd.Series(
            self.measured_step_time_s, index=pd.Index(self.steps, name="step"), name="step_time_s"
        )


def validate_ops(ops: pd.DataFrame, meta: JobMeta, *, source: str, drop_exact: bool = False) -> pd.DataFrame:
    """Check an op table against the canonical schema and its job layout.

    The checks run on the columns as read (an ``int8`` stage stays ``int8`` until the output), on
    one packed key (:func:`packed_key`) and on the op type's integer codes: the canonical ``int64``
    and ``float64`` columns are made once, in sorted order. Wherever a check fails, pandas code (the
    reference) words the message.

    Args:
        ops: raw op table with at least :data:`CANONICAL_COLUMNS`. Its memory is released column by
            column as the output is built when the caller holds no other reference (pass it as a
            temporary: ``validate_ops(table.to_pandas(), ...)``).
        meta: job layout the table must match.
        source: file name for messages.
        drop_exact: first drop rows equal in every column of ``ops`` to an earlier row, with a
            :class:`TraceWarning` (:func:`drop_exact_duplicates`; checked on the op key, so a table
            without repeated keys costs nothing more).

    Returns:
        A new table with canonical dtypes, sorted by ``(step, dp_rank, stage, optype, seq_id)``.

    Raises:
        TraceError: a column is missing; a time is NaN, infinite, negative or absurd; an op type is
            unknown; the ranks found do not match ``meta``; a step lacks some rank; or an op key
            appears in more than one row.
    """
    missing = [c for c in CANONICAL_COLUMNS if c not in ops.columns]
    if missing:
        raise TraceError(
            f"trace must have columns {list(CANONICAL_COLUMNS)}, missing {missing} (in {source}). "
            "Is this a ByteDance what-if op trace? The schema is in pacectl/traces/model.py."
        )
    text = _Text.of(ops["optype"])
    columns: dict[str, Any] = {"optype": text if text is not None else ops["optype"].astype(str).array}
    for col in ("step", "dp_rank", "stage", "rank", "seq_id", "mc"):
        columns[col] = _integer_column(ops, col, source)
    for col in ("start_ts", "duration") + (("delay_s",) if "delay_s" in ops.columns else ()):
        columns[col] = _float_column(ops, col, source)
    names = [c for c in (*CANONICAL_COLUMNS, "delay_s") if c in columns]

    def canonical(col: str, order: np.ndarray | None = None) -> Any:
        """Column ``col`` in its canonical dtype, in file order or taken by ``order``: a new array."""
        values = columns[col]
        if isinstance(values, _Text):
            return values.column(order)
        if not isinstance(values, np.ndarray):  # text with a missing value (no codes)
            return values if order is None else values.take(order)
        if order is None:
            return np.array(values, dtype=np.float64 if values.dtype.kind == "f" else np.int64)
        return values.take(order).astype(np.float64 if values.dtype.kind == "f" else np.int64, copy=False)

    @functools.cache
    def frame() -> pd.DataFrame:
        """The table in file order, built only where a message needs rows (or no key fits)."""
        return pd.DataFrame({c: canonical(c) for c in names}, copy=False)

    if len(columns["step"]) == 0:
        raise TraceError(f"trace must contain at least one op, got an empty table (in {source})")
    # One packed int64 key, (step, dp_rank, stage, optype, seq_id) in lexicographic order: the key
    # check, the per-step rank count and the sort run on it in numpy.
    key = None
    if text is not None:
        digits = [columns[c] for c in ("step", "dp_rank", "stage")] + [text.digit(), columns["seq_id"]]
        key = packed_key(digits)
        del digits
    keyed = key is not None
    order = pairs_per_step = None
    repeats = True  # unknown without a key
    if keyed:
        order, sorted_key = _sorting(key)
        del key
        repeats = bool((sorted_key[1:] == sorted_key[:-1]).any())
        # distinct (step, dp_rank, stage) per step, from the sorted key: its leading digits, by
        # integer division (the key's digits below stage are optype's codes and seq_id)
        sorted_key //= len(text.labels()) * _span(columns["seq_id"])
        first = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
        steps_of_pairs = sorted_key[first] // (_span(columns["dp_rank"]) * _span(columns["stage"]))
        del sorted_key, first
        starts = np.flatnonzero(np.r_[True, steps_of_pairs[1:] != steps_of_pairs[:-1]])
        pairs_per_step = np.diff(np.r_[starts, len(steps_of_pairs)])
    if drop_exact and repeats:
        deduplicated = drop_exact_duplicates(
            ops, source=source, what="values in every column", describe=describe_op_row
        )
        if len(deduplicated) < len(ops):
            return validate_ops(deduplicated, meta, source=source)
    del ops  # the caller's table: freed column by column below when this was its last reference
    for col in ("start_ts", "duration", "delay_s"):
        if col not in columns:
            continue
        values = columns[col]
        if values.min() >= 0 and values.max() <= MAX_DURATION_S:  # a NaN makes both False
            continue
        bad = ~((values >= 0) & (values <= MAX_DURATION_S))  # NaN compares False: bad, as is +-inf
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            row = frame().iloc[i]
            raise TraceError(
                f"{col} must be finite, >= 0 and <= {MAX_DURATION_S:.0f} s, got {float(values[i])!r} "
                f"(in {source}: row {i}, step {row['step']}, rank {row['rank']}, op {row['optype']}); "
                f"{repair_rows(int(bad.sum()))} before replay."
            )
    if not columns["duration"].max() > 0:  # (all are >= 0 here)
        raise TraceError(
            f"duration must be > 0 for at least one op, got 0 for all {len(columns['duration'])} ops (in {source}: "
            "column duration): a trace without time cannot be replayed or analysed. Was it recorded with timing "
            "off (e.g. TORCH_NCCL_ENABLE_TIMING unset, a profiler without durations)? Record it again with timing on"
        )
    if repeats:
        _check_unique_keys(frame(), source)  # raises where keys repeat, with the rows it finds
    optypes = set(text.labels()) if text is not None else set(frame()["optype"].unique())
    unknown = sorted(optypes - set(OPTYPES))
    if unknown:
        bad = ~frame()["optype"].isin(OPTYPES).to_numpy()
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(
            f"optype must be one of {list(OPTYPES)}, got {unknown!r} (in {source}: column optype, first "
            f"at row {i}: {describe_op_row(frame().iloc[i])}); {repair_rows(int(bad.sum()))}"
        )
    for col, size in (("dp_rank", meta.dp_size), ("stage", meta.pp_size)):
        values = columns[col]
        if values.min() < 0 or values.max() >= size:
            raise TraceError(
                f"{col} must be in [0, {size}) as the job meta says, got values in "
                f"[{values.min()}, {values.max()}] (in {source}: column {col}). "
                "Does the meta file belong to this trace?"
            )
    num_pairs = meta.dp_size * meta.pp_size
    pair = columns["dp_rank"].astype(np.int32 if num_pairs < 2**31 else np.int64)  # the one new array
    pair *= meta.pp_size
    pair += columns["stage"]  # in [0, num_pairs): both ranges were checked above
    present = np.zeros(num_pairs, dtype=bool)
    present[pair] = True
    if int(present.sum()) != num_pairs:
        raise TraceError(
            f"trace must hold dp_size x pp_size = {meta.dp_size} x {meta.pp_size} ranks as its meta says, "
            f"got {int(present.sum())} distinct (dp_rank, stage) pairs (in {source}). Does the meta belong to it?"
        )
    rank = columns["rank"]
    rank_of_pair = np.empty(num_pairs, dtype=rank.dtype)
    rank_of_pair[pair] = rank  # one of each pair's ranks (every pair is present): all must equal it
    if (rank_of_pair[pair] != rank).any():
        rank_of = frame().groupby(["dp_rank", "stage"])["rank"].nunique()
        dp, st = rank_of[rank_of > 1].index[0]
        raise TraceError(
            f"each (dp_rank, stage) must map to one global rank, got several for dp_rank {dp}, "
            f"stage {st} (in {source}: column rank)"
        )
    del pair
    if rank.max() >= meta.world_size or rank.min() < 0:
        raise TraceError(
            f"rank must be in [0, world_size={meta.world_size}), got max {rank.max()} "
            f"(in {source}: column rank). Check world_size in the meta file."
        )
    if pairs_per_step is None:  # no key: the pandas way
        pairs_per_step = frame()[["step", "dp_rank", "stage"]].drop_duplicates().groupby("step").size()
    if not bool((pairs_per_step == num_pairs).all()):
        out = frame()
        pairs = out[["dp_rank", "stage"]].drop_duplicates()
        per_step = out[["step", "dp_rank", "stage"]].drop_duplicates().groupby("step").size()
        short = per_step[per_step < len(pairs)]
        step = int(short.index[0])
        present_pairs = out.loc[out["step"] == step, ["dp_rank", "stage"]].drop_duplicates()
        have = set(map(tuple, present_pairs.to_numpy().tolist()))
        lost = sorted(set(map(tuple, pairs.to_numpy().tolist())) - have)
        raise TraceError(
            f"every step must record all {len(pairs)} ranks, got {len(have)} in step {step}: "
            f"missing (dp_rank, stage) {lost[:8]} (in {source}); {len(short)} steps are incomplete. "
            "Drop incomplete steps before replay."
        )
    if not keyed:  # sorted the pandas way
        return frame().sort_values(list(OP_KEY), kind="stable").reset_index(drop=True)
    frame.cache_clear()  # built above for a message, perhaps
    del values, rank  # no reference to a source column but ``columns``' own
    made = {}
    for c in names:  # one column at a time, each source column released as its canonical one is made
        made[c] = canonical(c, order)
        del columns[c]
    return pd.DataFrame(made, copy=False)


def _sorting(key: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The permutation that sorts ``key`` (None: it is sorted already, as pacectl's own files are)
    and the sorted key."""
    if (key[1:] > key[:-1]).all():
        return None, key
    # No two keys are equal (or the table is refused), so any sort gives this order. numpy's stable
    # sort (timsort on int64) merges the sorted runs a file holds (tiled AR: one per rank and step
    # block): on the key alone about 4x, 2.3x and 1.6x faster than its default quicksort at DP 16, 64
    # and 256, on this machine (a one-off script; experiments/bench/README.md, Loading).
    order = np.argsort(key, kind="stable")
    return order, key.take(order)


def text_codes(column: pd.Series) -> tuple[np.ndarray, Any] | None:
    """A text column as ``(codes, values)``: per row an index into ``values`` (its distinct values
    in order of first appearance, a pandas text array), so that ``values.take(codes)`` is the column
    as text. Made by pyarrow's dictionary encoding, with no Python string per row (on pandas' str
    columns, which are Arrow arrays, about 12 ns per row against about 60 for ``pd.factorize`` and 45
    for ``to_numpy``, at 7.5 M rows, in a one-off profile: experiments/bench/README.md). None when a
    value is missing (NaN or None)."""
    import pyarrow as pa

    if column.isna().any():  # (before astype: pandas 2 writes a missing value as the text 'nan')
        return None
    text = column.astype(str)  # a no-op on a str column; other values as their text
    array = pa.array(text.array)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    coded = array.dictionary_encode()
    return coded.indices.to_numpy(), pd.array(coded.dictionary.to_pylist(), dtype=text.dtype)


@dataclass(frozen=True)
class _Text:
    """A text column as integer codes into its distinct values: the op key's digit, the set of
    values and the column itself (in any row order) come from the codes, with no string hashed per
    row. A Parquet dictionary (a categorical) brings its codes; other text is factorised once."""

    values: Any  #: the distinct values, a pandas text array
    codes: np.ndarray  #: per row, an index into ``values``

    @classmethod
    def of(cls, column: pd.Series) -> _Text | None:
        """The coded column; None when a value is missing (NaN: the pandas checks word it)."""
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes = column.cat.codes.to_numpy()
            if (codes < 0).any():
                return None
            return cls(column.cat.categories.astype(str).array, codes)
        coded = text_codes(column)
        if coded is None:
            return None
        codes, values = coded
        return cls(values, codes)

    @functools.cached_property
    def _ranks(self) -> tuple[np.ndarray, list[str]]:
        """Each value's rank among the values present, in sorted (string) order (-1: absent), and
        the present values, sorted."""
        present = np.zeros(len(self.values), dtype=bool)
        present[self.codes] = True  # (no per-row temporary, unlike np.bincount's intp copy)
        used = np.flatnonzero(present)
        labels = [str(self.values[i]) for i in used]
        by_label = sorted(range(len(used)), key=labels.__getitem__)
        rank = np.full(len(self.values), -1, dtype=np.min_scalar_type(-len(used)))
        rank[used[by_label]] = np.arange(len(used))
        return rank, [labels[i] for i in by_label]

    def labels(self) -> list[str]:
        """The values present, sorted."""
        return self._ranks[1]

    def digit(self) -> np.ndarray:
        """Per row, its value's rank in :meth:`labels` (the smallest signed integer type that holds
        them): a :func:`packed_key` digit."""
        return self._ranks[0][self.codes]  # (indexing: about half the time of take on int8 codes)

    def column(self, order: np.ndarray | None = None) -> Any:
        """The text column, in file order or taken by ``order``."""
        return self.values.take(self.codes if order is None else self.codes.take(order))


def _check_unique_keys(out: pd.DataFrame, source: str) -> None:
    """At most one row per op key; exact duplicates and conflicting ones get their own messages."""
    keyed = out.duplicated(subset=list(OP_KEY), keep=False)
    if not keyed.any():
        return
    dups = out[keyed]
    exact = dups.duplicated(keep=False)
    n_keys = int(dups.drop_duplicates(subset=list(OP_KEY)).shape[0])
    conflicting = dups[~exact.to_numpy()]
    if len(conflicting):
        first = conflicting.iloc[0]
        key = {c: plain(first[c]) for c in OP_KEY}
        same = conflicting[(conflicting[list(OP_KEY)] == pd.Series(key)).all(axis=1)]
        rows = [int(i) for i in same.index[:4]]
        differ = [c for c in out.columns if c not in OP_KEY and same[c].nunique(dropna=False) > 1]
        raise TraceError(
            f"each op (step, dp_rank, stage, optype, seq_id) must appear once, got {len(same)} rows with "
            f"different {', '.join(differ)} for step {key['step']}, dp_rank {key['dp_rank']}, stage "
            f"{key['stage']}, optype {key['optype']}, seq_id {key['seq_id']} (in {source}: rows {rows}); "
            f"{n_keys} op(s) are recorded more than once. Which row is right cannot be told: keep one "
            "row per op (was the file merged from two recordings?)."
        )
    first = dups.iloc[0]
    raise TraceError(
        f"each op (step, dp_rank, stage, optype, seq_id) must appear once, got exact duplicate rows for "
        f"step {plain(first['step'])}, rank {plain(first['rank'])}, optype {first['optype']}, seq_id "
        f"{plain(first['seq_id'])} (in {source}); {n_keys} op(s) are duplicated. Drop the duplicated rows "
        "(pandas: df.drop_duplicates())."
    )


def _integer_column(ops: pd.DataFrame, col: str, source: str) -> np.ndarray:
    values = ops[col]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise TraceError(
            f"column {col} must hold integers, got dtype {values.dtype} (in {source}: column {col})"
        )
    if pd.api.types.is_integer_dtype(values):
        array = values.to_numpy()
        if array.dtype.kind == "i" or (array.dtype.kind == "u" and array.dtype.itemsize < 8):
            return array  # as read (int8 ... int64): the output's int64 copy is made once, sorted
        return array.astype(np.int64)
    array = values.to_numpy(np.float64)
    not_whole = ~(np.isfinite(array) & (array == np.round(array)))
    if not_whole.any():
        i = int(np.flatnonzero(not_whole)[0])
        raise TraceError(
            f"column {col} must hold integers, got {float(array[i])!r} (in {source}: row {i}, column {col})"
        )
    return array.astype(np.int64, copy=False)


def _float_column(ops: pd.DataFrame, col: str, source: str) -> np.ndarray:
    values = ops[col]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise TraceError(
            f"column {col} must hold numbers (seconds), got dtype {values.dtype} (in {source}: column {col}); "
            "convert it to float before import"
        )
    array = values.to_numpy()
    return array if array.dtype.kind == "f" else values.to_numpy(np.float64)  # float32 stays until the output


#: Default cap on a trace's operations (rows of an op table; ``trace.max_ops``). An import holds
#: about 0.2 kB per op at its peak (``experiments/bench/results/importer_memory.json``), so the cap
#: bounds it near 0.9 GB whatever the file's size.
DEFAULT_MAX_OPS = 4_000_000
#: Default cap on a trace file's size on disk, bytes (1 GiB; ``trace.max_mb``).
DEFAULT_MAX_BYTES = 1 << 30


def read_parquet_table(
    path: Path, *, other_formats: str, max_rows: int = DEFAULT_MAX_OPS, max_bytes: int = DEFAULT_MAX_BYTES
) -> Any:
    """Read a Parquet file as a ``pyarrow.Table``, or raise one TraceError that says what to do.

    Args:
        path: an existing file (see :func:`require_file`).
        other_formats: the hint for a file that is not Parquet at all (which importer to use).
        max_rows: cap on the table's rows, read from the footer before any data (``trace.max_ops``).
        max_bytes: cap on the file's size (``trace.max_mb``).

    Raises:
        TraceError: the file is empty, truncated (no Parquet footer), not Parquet, past a cap, or its
            pandas schema metadata is damaged.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"a Parquet trace must be <= {max_bytes} bytes, got {size} bytes (in {path}). Raise the cap "
            "(trace.max_mb) if the file is genuine"
        )
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
        if rows > max_rows:
            raise TraceError(
                f"a Parquet trace must hold <= {max_rows} ops (rows), got {rows} (in {path}); the import needs "
                "about 0.2 kB of memory per op. Raise the cap (trace.max_ops) if the machine has the memory, "
                "or cut the trace to the steps you need"
            )
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":  # a Parquet header without its footer: cut short
            why = "it starts as Parquet but its end is missing (truncated: an interrupted copy or write?)"
            fix = "Copy or write the file again (a live record: re-run the job that wrote it)"
        elif not head:
            why, fix = "it is empty", "Copy or write the file again"
        else:
            why, fix = f"it is not Parquet ({str(err).rstrip('.')})", other_formats
        raise TraceError(f"trace.path must be a Parquet file, could not read {path}: {why}. {fix}.") from err
    try:  # pyarrow reads the schema's pandas metadata (JSON) only when the table becomes a frame:
        table.schema.empty_table().to_pandas()  # the same reading, on no rows
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:  # damaged JSON or fields
        raise TraceError(
            f"the Parquet schema metadata 'pandas' must describe the columns as pandas writes it, got damaged "
            f"metadata ({type(err).__name__}: {str(err)[:80]}) (in {path}). The file is corrupt: copy or write it again."
        ) from err
    return table


def int64_array(values: Any, *, field: str, source: str) -> np.ndarray:
    """``values`` (integers) as ``int64[n]``, or a TraceError naming ``field`` and ``source`` when one
    does not fit in 64 bits (a damaged number: numpy would raise OverflowError, or wrap a uint64)."""
    arr = np.asarray(values)
    if arr.dtype == np.int64:
        return arr
    try:
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise OverflowError
        return arr.astype(np.int64)
    except OverflowError:
        big = max((int(v) for v in arr.ravel()), key=abs)
        raise TraceError(
            f"{field} must fit in a 64-bit integer, got {str(big)[:40]} (in {source}). The file is damaged: "
            "copy or write it again."
        ) from None


def table_to_pandas(table: Any) -> pd.DataFrame:
    """``table.to_pandas()`` that releases the Arrow buffers as it converts (one column block per
    column, ``self_destruct``): the same frame, without holding the table and its copy at once.
    ``table`` must not be used afterwards."""
    return table.to_pandas(split_blocks=True, self_destruct=True)


def require_file(path: str | Path, what: str) -> Path:
    """Return ``path`` as a Path, or raise TraceError if it is not an existing file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise TraceError(f"{what} must be an existing file, got {str(p)!r}. Check the path.")
    return p
