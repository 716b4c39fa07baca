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

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pacectl.errors import TraceError

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
    """

    ops: pd.DataFrame = field(repr=False)
    meta: JobMeta
    source: str
    fmt: str
    pacing_blocks_compute: bool = False

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


def validate_ops(ops: pd.DataFrame, meta: JobMeta, *, source: str) -> pd.DataFrame:
    """Check an op table against the canonical schema and its job layout.

    Args:
        ops: raw op table with at least :data:`CANONICAL_COLUMNS`.
        meta: job layout the table must match.
        source: file name for messages.

    Returns:
        A copy with canonical dtypes, sorted by ``(step, dp_rank, stage, optype, seq_id)``.

    Raises:
        TraceError: a column is missing; a time is NaN, infinite, negative or absurd; an op type is
            unknown; the ranks found do not match ``meta``; or a step lacks some rank.
    """
    missing = [c for c in CANONICAL_COLUMNS if c not in ops.columns]
    if missing:
        raise TraceError(
            f"trace must have columns {list(CANONICAL_COLUMNS)}, missing {missing} (in {source}). "
            "Is this a ByteDance what-if op trace? The schema is in pacectl/traces/model.py."
        )
    columns = {"optype": ops["optype"].astype(str).to_numpy()}
    for col in ("step", "dp_rank", "stage", "rank", "seq_id", "mc"):
        columns[col] = _integer_column(ops, col, source)
    for col in ("start_ts", "duration") + (("delay_s",) if "delay_s" in ops.columns else ()):
        columns[col] = _float_column(ops, col, source)
    out = pd.DataFrame({c: columns[c] for c in (*CANONICAL_COLUMNS, "delay_s") if c in columns})
    if len(out) == 0:
        raise TraceError(f"trace must contain at least one op, got an empty table (in {source})")
    for col in ("start_ts", "duration", "delay_s"):
        if col not in out.columns:
            continue
        values = out[col].to_numpy()
        bad = ~np.isfinite(values) | (values < 0) | (values > MAX_DURATION_S)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            row = out.iloc[i]
            raise TraceError(
                f"{col} must be finite, >= 0 and <= {MAX_DURATION_S:.0f} s, got {float(values[i])!r} "
                f"(in {source}: row {i}, step {row['step']}, rank {row['rank']}, op {row['optype']}); "
                f"{int(bad.sum())} rows are bad. Drop or repair them before replay."
            )
    unknown = sorted(set(out["optype"].unique()) - set(OPTYPES))
    if unknown:
        raise TraceError(
            f"optype must be one of {list(OPTYPES)}, got {unknown!r} (in {source}: column optype)"
        )
    for col, size in (("dp_rank", meta.dp_size), ("stage", meta.pp_size)):
        values = out[col].to_numpy()
        if values.min() < 0 or values.max() >= size:
            raise TraceError(
                f"{col} must be in [0, {size}) as the job meta says, got values in "
                f"[{values.min()}, {values.max()}] (in {source}: column {col}). "
                "Does the meta file belong to this trace?"
            )
    pairs = out[["dp_rank", "stage"]].drop_duplicates()
    if len(pairs) != meta.dp_size * meta.pp_size:
        raise TraceError(
            f"trace must hold dp_size x pp_size = {meta.dp_size} x {meta.pp_size} ranks as its meta says, "
            f"got {len(pairs)} distinct (dp_rank, stage) pairs (in {source}). Does the meta belong to it?"
        )
    rank_of = out.groupby(["dp_rank", "stage"])["rank"].nunique()
    if (rank_of > 1).any():
        dp, st = rank_of[rank_of > 1].index[0]
        raise TraceError(
            f"each (dp_rank, stage) must map to one global rank, got several for dp_rank {dp}, "
            f"stage {st} (in {source}: column rank)"
        )
    if out["rank"].max() >= meta.world_size or out["rank"].min() < 0:
        raise TraceError(
            f"rank must be in [0, world_size={meta.world_size}), got max {out['rank'].max()} "
            f"(in {source}: column rank). Check world_size in the meta file."
        )
    per_step = out.groupby("step")[["dp_rank", "stage"]].apply(lambda g: len(g.drop_duplicates()))
    short = per_step[per_step < len(pairs)]
    if len(short):
        step = int(short.index[0])
        present = out.loc[out["step"] == step, ["dp_rank", "stage"]].drop_duplicates()
        have = set(map(tuple, present.to_numpy().tolist()))
        lost = sorted(set(map(tuple, pairs.to_numpy().tolist())) - have)
        raise TraceError(
            f"every step must record all {len(pairs)} ranks, got {len(have)} in step {step}: "
            f"missing (dp_rank, stage) {lost[:8]} (in {source}); {len(short)} steps are incomplete. "
            "Drop incomplete steps before replay."
        )
    return out.sort_values(["step", "dp_rank", "stage", "optype", "seq_id"], kind="stable").reset_index(
        drop=True
    )


def _integer_column(ops: pd.DataFrame, col: str, source: str) -> np.ndarray:
    values = ops[col]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise TraceError(
            f"column {col} must hold integers, got dtype {values.dtype} (in {source}: column {col})"
        )
    array = values.to_numpy(np.float64) if not pd.api.types.is_integer_dtype(values) else values.to_numpy()
    if (
        not pd.api.types.is_integer_dtype(values)
        and not (np.isfinite(array) & (array == np.round(array))).all()
    ):
        i = int(np.flatnonzero(~(np.isfinite(array) & (array == np.round(array))))[0])
        raise TraceError(
            f"column {col} must hold integers, got {float(array[i])!r} (in {source}: row {i}, column {col})"
        )
    return array.astype(np.int64)


def _float_column(ops: pd.DataFrame, col: str, source: str) -> np.ndarray:
    values = ops[col]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise TraceError(
            f"column {col} must hold numbers (seconds), got dtype {values.dtype} (in {source}: column {col}); "
            "convert it to float before import"
        )
    return values.to_numpy(np.float64)


def require_file(path: str | Path, what: str) -> Path:
    """Return ``path`` as a Path, or raise TraceError if it is not an existing file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise TraceError(f"{what} must be an existing file, got {str(p)!r}. Check the path.")
    return p
