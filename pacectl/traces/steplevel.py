"""Importer for step-level traces: per-worker, per-iteration step times without timestamps.

Format: the Alibaba PAI mini-batch files (AntMan, OSDI'20; github.com/alibaba/clusterdata,
``cluster-trace-gpu-v2020/mini-batch-time/data/job_*_norm.csv``, CC BY 4.0): columns
``,worker,gpu,time,batch_time_norm`` (an unnamed index; ``worker`` id; ``gpu`` = percent of a GPU;
``time`` = iteration index, sampled every 10; ``batch_time_norm`` = the worker's mini-batch time,
normalised to 0-1000 per job). Any CSV with ``worker``, ``time`` (or ``iteration``/``step``) and
``batch_time_norm`` (or ``step_time_s``) columns is accepted.

Mapping (the replay treats a step-level trace as compute followed by one collective), per step and
worker (``rank`` = worker's index in sorted order, pure data parallel, ``pp_size = 1``):

- ``forward-compute`` = [0, t_w], where t_w = ``batch_time_norm * unit_s`` (seconds);
- ``grads-reduce-scatter`` = [t_w, max_w t_w + c]: every worker arrives when its own step work is
  done and all leave together after a transfer time c = ``collective_s``, or by default
  ``collective_frac`` (1 %) of the median step time. The recorded batch time *includes* the real
  synchronisation, which the file cannot separate, so arrival spreads here are upper bounds.

**Sampling interval.** The step column need not count every iteration: the Alibaba PAI files
record every 10th (``time`` = 1, 11, 21, ...). The trace records the interval
(:func:`sampling_interval`, :attr:`OpTrace.sample_every_iters`): consecutive steps of the trace are
that many real iterations apart, which every figure counted in steps (a lag, an autocorrelation)
has to be read with.

No absolute time is recorded, so no clock alignment is needed (or possible); the values are
normalised, so ``unit_s`` only scales the result (default: 1 unit = 1 ms, so 1000 -> 1 s), and the
trace is marked ``time_unit="normalized"`` (``norm_unit_s = unit_s``): times, step times and it/s
derived from it are not real units (a ``step_time_s`` column is real seconds, ``time_unit="s"``).

Repairs, each with a :class:`~pacectl.traces.model.TraceWarning` that says how much was dropped:
exact duplicate rows (same worker, step and values; the unnamed index column is ignored) are
dropped, and so are steps that some worker did not record. Rows that share a (worker, step) but
differ in a value are an error.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from pacectl.errors import TraceError, plural, repair_rows
from pacectl.traces.collectives import OpBlock, check_transfer, op_frame
from pacectl.traces.csvstream import columns_excerpt, read_header, read_numeric_columns
from pacectl.traces.model import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_OPS,
    MAX_DURATION_S,
    JobMeta,
    OpTrace,
    TraceWarning,
    drop_exact_duplicates,
    dropped_steps_note,
    keys_repeat,
    require_file,
    validate_ops,
)

_STEP_COLS = ("time", "iteration", "step")
_VALUE_COLS = ("batch_time_norm", "step_time_s")


def sampling_interval(
    steps: np.ndarray,
    *,
    source: str,
    column: str,
    rows: np.ndarray | None = None,
    sample_every: int | None = None,
) -> int:
    """Iterations between consecutive recorded samples of a step column.

    Args:
        steps: the step (iteration) value of every row, integers.
        source: file name for messages; column: the column's name.
        rows: the file line of every row (for the warning), or None.
        sample_every: the interval given by the user (``trace.sample_every``), or None to infer it.

    Returns:
        ``sample_every`` if given, else the most common difference between consecutive distinct
        values (1 for a single value; ties go to the smaller).

    Warns:
        TraceWarning: some consecutive values are not one interval apart (the first few are named,
            with their rows); a *shorter last* gap is not warned about (the job's final iteration,
            sampled when it ended: the shipped Alibaba job ends ``2981 -> 2988``).

    Raises:
        TraceError: ``sample_every`` is not an integer >= 1.

    Example:
        >>> sampling_interval(np.array([1, 11, 21, 31]), source="job.csv", column="time")
        10
    """
    if sample_every is not None and (
        isinstance(sample_every, bool) or not isinstance(sample_every, (int, np.integer)) or sample_every < 1
    ):
        raise TraceError(
            f"sample_every (trace.sample_every) must be an integer >= 1 or null, got {sample_every!r}; "
            "e.g. trace.sample_every=10"
        )
    values = np.unique(np.asarray(steps, dtype=np.int64))
    if len(values) < 2:
        return int(sample_every or 1)
    gaps = np.diff(values)
    kinds, counts = np.unique(gaps, return_counts=True)
    seen = int(kinds[np.argmax(counts)])
    every = int(sample_every) if sample_every is not None else seen
    odd = np.flatnonzero(gaps != every)
    if len(odd) and odd[-1] == len(gaps) - 1 and gaps[-1] < every:
        odd = odd[:-1]  # a short last gap: the job's final iteration, sampled as it ended
    if len(odd):
        shown = []
        for i in odd[:3]:
            a, b = int(values[i]), int(values[i + 1])
            where = ""
            if rows is not None:
                line_a = np.asarray(rows)[np.asarray(steps) == a]
                line_b = np.asarray(rows)[np.asarray(steps) == b]
                where = f" (rows {int(line_a.min())}-{int(line_b.max())})"
            shown.append(f"{a} -> {b}{where}")
        more = f", and {len(odd) - 3} more" if len(odd) > 3 else ""
        given = "as trace.sample_every says" if sample_every is not None else "its most common step"
        warnings.warn(
            f"{source}: column {column} is sampled every {every} iterations ({given}), but {len(odd)} of "
            f"{len(gaps)} gaps differ: {'; '.join(shown)}{more}; each recorded step still replays as one "
            f"sample {every} iterations after the last (set trace.sample_every to override)",
            TraceWarning,
            stacklevel=3,
        )
    return every


def _refuse_conflicting_rows(data: pd.DataFrame, step_col: str, p: Path) -> None:
    """Raise when two rows (exact duplicates already dropped) hold one (worker, step)."""
    worker = data["worker"].to_numpy()
    step = data[step_col].to_numpy()
    dup = pd.DataFrame({"w": worker, "s": step}).duplicated(keep=False).to_numpy()
    if dup.any():
        rows = data.index.to_numpy() + 2  # line numbers in the file (header is line 1)
        i = int(np.flatnonzero(dup)[0])
        same = np.flatnonzero((worker == worker[i]) & (step == step[i]))
        n_keys = int(pd.DataFrame({"w": worker[dup], "s": step[dup]}).drop_duplicates().shape[0])
        raise TraceError(
            f"each (worker, {step_col}) must appear once, got {len(same)} rows with different values for "
            f"worker {worker[i]} {step_col} {step[i]} (in {p}: rows {rows[same][:4].tolist()}); "
            f"{n_keys} (worker, {step_col}) pair(s) are recorded more than once with different values. "
            "Which one is right cannot be told: keep one row per worker and step."
        )


def _modelled_ops(
    t: np.ndarray, steps: np.ndarray, collective_s: float | None, collective_frac: float
) -> pd.DataFrame:
    """The op table of step times ``t`` (``[num_steps, num_workers]``, s): per step and worker its
    compute, then one modelled collective that every worker leaves together, ``collective_s`` (or
    ``collective_frac`` of the median step time) after the last arrives."""
    c = float(collective_s) if collective_s is not None else collective_frac * float(np.median(t.max(axis=1)))
    leave = t.max(axis=1, keepdims=True) + c
    blocks: list[OpBlock] = [
        ("forward-compute", 0, 0, np.zeros_like(t), t),
        ("grads-reduce-scatter", 0, -1, t, leave - t),
    ]
    return op_frame(steps, list(range(t.shape[1])), 0, blocks)


def load_steplevel(
    path: str | Path,
    *,
    unit_s: float = 1e-3,
    collective_s: float | None = None,
    collective_frac: float = 0.01,
    name: str | None = None,
    sample_every: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_ops: int = DEFAULT_MAX_OPS,
) -> OpTrace:
    """Load a step-level CSV as a canonical trace.

    Args:
        path: the CSV file.
        unit_s: seconds per unit of ``batch_time_norm`` (ignored for ``step_time_s``, which is seconds).
        collective_s: fixed collective transfer time, seconds; ``None`` uses ``collective_frac``.
        collective_frac: transfer time as a fraction of the median step time, in [0, 1].
        name: job name (default: the file stem).
        sample_every: iterations between recorded steps; None reads it from the step column
            (:func:`sampling_interval`).
        max_bytes: cap on the file's size, bytes (``trace.max_mb``).
        max_ops: cap on the operations the trace may hold, two per row (``trace.max_ops``); the
            read stops once the rows pass ``max_ops / 2``.

    Returns:
        The validated :class:`OpTrace` (``fmt="steplevel"``, ``time_unit="normalized"`` for
        ``batch_time_norm``, ``sample_every_iters`` the interval); only steps recorded by every
        worker.

    Warns:
        TraceWarning: exact duplicate rows or incomplete steps were dropped (how many, which), or
            the step column's gaps are irregular (which, on which rows).

    Raises:
        TraceError: the file is missing or not CSV, lacks a column, holds a NaN, negative or absurd
            time, two different rows for one (worker, step), or no step recorded by every worker.

    Example:
        >>> from pacectl.data import DATA_DIR
        >>> load_steplevel(DATA_DIR / "alibaba-pai" / "job_1_norm.csv").meta.dp_size
        10
    """
    p = require_file(path, "step-level trace file")
    if not (np.isfinite(unit_s) and unit_s > 0):
        raise TraceError(
            f"unit_s (trace.unit_s) must be a positive number of seconds per normalised unit, got {unit_s!r}; "
            "e.g. trace.unit_s=0.001"
        )
    check_transfer(collective_s, collective_frac)
    header = read_header(p, what="step-level trace")
    step_col = next((c for c in _STEP_COLS if c in header), None)
    value_col = next((c for c in _VALUE_COLS if c in header), None)
    if "worker" not in header or step_col is None or value_col is None:
        raise TraceError(
            f"a step-level trace must have columns worker, one of {list(_STEP_COLS)} and one of "
            f"{list(_VALUE_COLS)}, got {columns_excerpt(header)} (in {p}). Expected the Alibaba PAI "
            "job_*_norm.csv layout `,worker,gpu,time,batch_time_norm`."
        )
    wanted = {"worker", step_col, value_col, *(["gpu"] if "gpu" in header else [])}
    kept = [c for c in header if c in wanted]  # header order; other columns are not read
    got = read_numeric_columns(
        p,
        kept,
        what="step-level trace",
        header=header,
        max_bytes=max_bytes,
        max_rows=max(1, max_ops // 2),
        cap_hint="trace.max_mb",
        rows_hint=f"trace.max_ops: now {plural(max_ops, 'op')}, 2 per row",
    )
    bad_rows = got.bad_rows
    if bad_rows.count:
        last_line = got.num_rows + bad_rows.count + 1
        cut = bad_rows.count == 1 and bad_rows.last_row == last_line and bad_rows.first_fields < len(header)
        fix = (
            "1 row is like that, the last: the file looks truncated; copy it again or drop that row."
            if cut
            else f"{repair_rows(bad_rows.count)}."
        )
        raise TraceError(
            f"every row must have {len(header)} fields like the header, got {bad_rows.first_fields} in row "
            f"{bad_rows.first_row} ({bad_rows.first_text}) (in {p}); {fix}"
        )
    if got.num_rows == 0:
        raise TraceError(f"a step-level trace must hold at least one row, got none (in {p})")
    scale = 1.0 if value_col == "step_time_s" else unit_s
    for col in ("worker", step_col, value_col):
        values = got.values[col]
        limit = MAX_DURATION_S / scale if col == value_col else 2**62
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (values < 0) | (values > limit)
            if col != value_col:
                bad |= values != np.round(values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            unit = " s" if scale == 1.0 else ""
            what = (
                f"a finite number in [0, {limit:.12g}]{unit}"
                if col == value_col
                else "a non-negative integer"
            )
            odd = got.unparsed.get(col)
            v = float(values[i])
            if odd is not None and odd[0] == i:
                shown = odd[1]
            elif got.empty.get(col) == i:
                shown = "an empty field"
            elif col != value_col and np.isfinite(v) and v == round(v):
                shown = repr(int(v))
            else:
                shown = repr(v)
            # only the last row is bad, its value is missing, and so is every field after it:
            # the file was most likely cut short in that row
            tail = kept[kept.index(col) :]
            cut = (
                i == got.num_rows - 1
                and bool(bad.sum() == 1)
                and all(got.last_raw.get(c) is None for c in tail)
            )
            fix = (
                "1 row is bad. It is the last row and has empty fields: the file looks truncated; copy "
                "it again or drop that row."
                if cut
                else f"{repair_rows(int(bad.sum()))}."
            )
            raise TraceError(f"{col} must be {what}, got {shown} (in {p}:row {i + 2}); {fix}")
    ints = ("worker", step_col)  # validated integers above
    data = pd.DataFrame({c: got.values[c].astype(np.int64) if c in ints else got.values[c] for c in kept})
    del got
    if keys_repeat([data["worker"].to_numpy(), data[step_col].to_numpy()]):  # else no row repeats another
        data = drop_exact_duplicates(
            data,
            source=str(p),
            what=" and ".join([", ".join(map(str, data.columns[:-1])), str(data.columns[-1])]),
            describe=lambda r: f"worker {int(r['worker'])}, {step_col} {int(r[step_col])}",
            row_offset=2,
        )
        _refuse_conflicting_rows(data, step_col, p)
    worker = data["worker"].to_numpy()
    step = data[step_col].to_numpy()
    value = data[value_col].to_numpy(dtype=float) * scale
    rows = data.index.to_numpy() + 2  # line numbers in the file (header is line 1)
    every = sampling_interval(step, source=str(p), column=step_col, rows=rows, sample_every=sample_every)
    workers, worker_of_row = np.unique(worker, return_inverse=True)
    steps, step_of_row = np.unique(step, return_inverse=True)
    table = np.full((len(steps), len(workers)), np.nan)  # [step, worker] (a pivot), seconds
    table[step_of_row, worker_of_row] = value
    recorded = ~np.isnan(table).any(axis=1)  # by every worker
    if not recorded.any():
        raise TraceError(
            f"at least one step must be recorded by all {len(workers)} workers, got none (in {p})"
        )
    if not recorded.all():
        partial = steps[~recorded]
        reason = f"not recorded by all {len(workers)} workers"
        warnings.warn(
            dropped_steps_note(
                {int(s2): reason for s2 in partial},
                len(steps),
                source=str(p),
                rows=int(np.isin(step, partial).sum()),
            ),
            TraceWarning,
            stacklevel=2,
        )
    del data, worker, step, value, rows, step_of_row, worker_of_row  # the peak: the op table only
    meta = JobMeta(name=name or p.stem, dp_size=len(workers), pp_size=1)
    normalized = value_col != "step_time_s"
    return OpTrace(  # the frame a temporary: validate_ops releases it column by column
        ops=validate_ops(
            _modelled_ops(table[recorded], steps[recorded], collective_s, collective_frac),
            meta,
            source=str(p),
        ),
        meta=meta,
        source=str(p),
        fmt="steplevel",
        time_unit="normalized" if normalized else "s",
        norm_unit_s=float(unit_s) if normalized else 1.0,
        collective="one modelled per step: the file records none",
        sample_every_iters=every,
    )
