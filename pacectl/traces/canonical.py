"""pacectl's own trace files: the canonical op table as Parquet, with the job layout inside.

One file holds everything replay needs: the columns of :data:`~pacectl.traces.model.CANONICAL_COLUMNS`
(plus the optional ``delay_s``, the pacing delay a live run applied before that op) and, in the
Parquet schema metadata under the key ``pacectl``, a JSON object with the :class:`JobMeta` fields,
the source format, the time unit (``time_unit``: ``"s"`` or ``"normalized"``, with ``norm_unit_s``;
absent in older files, which are seconds) and a format version. Live runs (``backend=torch``), the simulator and
``python -m pacectl.traces convert`` write it; ``trace=canonical trace.path=<file>`` replays it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pacectl.errors import TraceError
from pacectl.files import atomic_path
from pacectl.traces.model import (
    CANONICAL_COLUMNS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_OPS,
    TIME_UNITS,
    JobMeta,
    OpTrace,
    read_parquet_table,
    require_file,
    validate_ops,
)
from pacectl.traces.model import (
    table_to_pandas as _to_pandas,
)

FORMAT_VERSION = 1
META_KEY = b"pacectl"


def write_canonical(trace: OpTrace, path: str | Path) -> None:
    """Write ``trace`` as a canonical Parquet file, atomically (no partial file on failure).

    Args:
        trace: a validated trace.
        path: destination ``.parquet`` path.
    """
    columns = list(CANONICAL_COLUMNS) + (["delay_s"] if "delay_s" in trace.ops.columns else [])
    table = pa.Table.from_pandas(trace.ops[columns], preserve_index=False)
    meta = {
        "version": FORMAT_VERSION,
        "source_format": trace.fmt,
        "source": trace.source,
        "job": asdict(trace.meta),
        "pacing_blocks_compute": bool(trace.pacing_blocks_compute),
        "time_unit": trace.time_unit,
        "norm_unit_s": float(trace.norm_unit_s),
        "measured_step_time_s": None
        if trace.measured_step_time_s is None
        else [float(v) for v in trace.measured_step_time_s],
        "collective": trace.collective,
        "timing": trace.timing,
    }
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()}
    )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def load_canonical(
    path: str | Path, *, max_ops: int = DEFAULT_MAX_OPS, max_bytes: int = DEFAULT_MAX_BYTES
) -> OpTrace:
    """Read a canonical Parquet file written by :func:`write_canonical`.

    ``max_ops`` / ``max_bytes`` cap the rows and the file size (``trace.max_ops``, ``trace.max_mb``).

    Raises:
        TraceError: the file is missing, not Parquet, lacks the ``pacectl`` metadata, has a newer
            format version, or fails validation.
    """
    p = require_file(path, "trace file")
    table = read_parquet_table(
        p,
        other_formats="For other formats pick their importer: trace=bytedance, trace=kineto, trace=steplevel",
        max_rows=max_ops,
        max_bytes=max_bytes,
    )
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        if {"run", "iteration", "rank", "arrival_s"} <= set(table.column_names):
            raise TraceError(
                f"{p} is a run's per-iteration output (iterations.parquet), not a trace: it holds "
                "arrivals, not the operations a replay needs. Replay a live run's record instead "
                "(<run dir>/records/<run>.parquet) or a recorded trace"
            )
        raise TraceError(
            f"a canonical trace must carry 'pacectl' metadata, got a Parquet file without it (in {p}). "
            "Is it a ByteDance trace? Use trace=bytedance trace.path=... trace.meta=..."
        )
    try:
        meta = json.loads(raw)
        version = int(meta["version"])
        job = JobMeta(**meta["job"])
    except (ValueError, KeyError, TypeError) as err:
        raise TraceError(
            f"the 'pacectl' metadata must hold version and job fields, got {raw[:200]!r} (in {p})"
        ) from err
    if version > FORMAT_VERSION:
        raise TraceError(
            f"canonical format version must be <= {FORMAT_VERSION}, got {version} (in {p}); upgrade pacectl"
        )
    columns = list(table.schema.empty_table().to_pandas().columns)  # as the file holds them
    ops = validate_ops(_to_pandas(table), job, source=str(p), drop_exact=True)
    fmt = str(meta.get("source_format", "canonical"))
    if (fmt == "torch-live" or meta.get("pacing_blocks_compute")) and "delay_s" not in ops.columns:
        # without it a paced record would replay as unpaced, and its fidelity would hide that
        raise TraceError(
            f"a live record must have the column delay_s (the pacing delay applied before each op), "
            f"got columns {columns} (in {p}). Use the record as the live run wrote it, "
            "or re-run the job"
        )
    time_unit = meta.get("time_unit", "s")
    norm_unit_s = meta.get("norm_unit_s", 1.0)
    number = isinstance(norm_unit_s, (int, float)) and not isinstance(norm_unit_s, bool)
    unit_ok = number and math.isfinite(norm_unit_s) and norm_unit_s > 0
    if time_unit not in TIME_UNITS or not unit_ok:
        raise TraceError(
            f"the 'pacectl' metadata must hold time_unit in {list(TIME_UNITS)} and a positive norm_unit_s, "
            f"got {time_unit!r} and {norm_unit_s!r} (in {p}). Write the file again with pacectl."
        )
    return OpTrace(
        ops=ops,
        meta=job,
        source=str(p),
        fmt=fmt,
        pacing_blocks_compute=bool(meta.get("pacing_blocks_compute", False)),
        time_unit=str(time_unit),
        norm_unit_s=float(norm_unit_s),
        measured_step_time_s=_measured(meta.get("measured_step_time_s"), p),
        collective=str(meta.get("collective") or ""),
        timing=str(meta.get("timing") or ""),
    )


def _measured(value: object, path: Path) -> tuple[float, ...] | None:
    """The ``measured_step_time_s`` metadata list, or None (older files have none)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise TraceError(
            f"the 'pacectl' metadata field measured_step_time_s must be a list of seconds or null, "
            f"got {str(value)[:80]} (in {path}). Write the file again with pacectl."
        )
    return tuple(float(v) for v in value)
