"""Importer for the ByteDance what-if op traces (parquet plus a job-meta YAML).

Format: the artifact of Lin et al., "Understanding Stragglers in Large Model Training Using What-if
Analysis" (OSDI 2025), github.com/ByteDance-Seed/StragglerAnalysis. One parquet row per recorded op;
``start_ts`` is seconds from the step start with clocks already aligned across ranks. The YAML gives
``dp_size``, ``pp_size``, ``tp_size``, ``dsp_size``, ``vpp_size``, ``world_size`` (and ``trial_name``).

Exact duplicate rows (equal in every column) are dropped with a
:class:`~pacectl.traces.model.TraceWarning` that says how many; two different rows for one op
(step, rank, optype, seq_id) are an error.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pacectl.errors import TraceError, did_you_mean, yaml_problem
from pacectl.traces.model import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_OPS,
    JobMeta,
    OpTrace,
    read_parquet_table,
    require_file,
    validate_ops,
)
from pacectl.traces.model import (
    table_to_pandas as _to_pandas,
)

META_KEYS = ("dp_size", "pp_size", "tp_size", "world_size")


def load_meta(path: str | Path) -> JobMeta:
    """Read a job-meta YAML.

    Args:
        path: YAML file with at least ``dp_size``, ``pp_size``, ``tp_size`` and ``world_size``.

    Returns:
        The job layout.

    Raises:
        TraceError: the file is missing, is not a YAML mapping, lacks a key, or holds a size that is
            not a positive integer, or ``world_size != dp * pp * tp * dsp``.
    """
    p = require_file(path, "trace meta file")
    try:
        raw = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise TraceError(
            f"trace meta must be a YAML mapping, could not parse it (in {p}): {yaml_problem(err)}; fix the file"
        ) from err
    if not isinstance(raw, dict):
        raise TraceError(f"trace meta must be a YAML mapping of sizes, got {type(raw).__name__} (in {p})")
    missing = [k for k in META_KEYS if k not in raw]
    if missing:
        near = {k: did_you_mean(str(k), missing) for k in raw if k not in META_KEYS}
        hint = "".join(f" Is {k!r} a misspelt {m!r}?" for k, m in near.items() if m)
        raise TraceError(
            f"trace meta must have keys {list(META_KEYS)}, missing {missing} (in {p}).{hint} "
            "Example: dp_size: 2, pp_size: 4, tp_size: 1, world_size: 8"
        )
    sizes: dict[str, int] = {}
    for key in ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size"):
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TraceError(f"{key} must be a positive integer, got {value!r} (in {p}:{key})")
        sizes[key] = value
    expected = sizes["dp_size"] * sizes["pp_size"] * sizes["tp_size"] * sizes["dsp_size"]
    if sizes["world_size"] != expected:
        raise TraceError(
            f"world_size must equal dp_size * pp_size * tp_size * dsp_size = {sizes['dp_size']} * "
            f"{sizes['pp_size']} * {sizes['tp_size']} * {sizes['dsp_size']} = {expected}, got "
            f"{sizes['world_size']} (in {p}:world_size): one of these five sizes is wrong"
        )
    if sizes["vpp_size"] != 1:
        raise TraceError(
            f"vpp_size must be 1 (interleaved pipelines are not supported by the replay yet), "
            f"got {sizes['vpp_size']} (in {p}:vpp_size)"
        )
    return JobMeta(name=str(raw.get("trial_name", p.stem)), **sizes)


def load_bytedance(
    path: str | Path, meta: str | Path, *, max_ops: int = DEFAULT_MAX_OPS, max_bytes: int = DEFAULT_MAX_BYTES
) -> OpTrace:
    """Load and validate a ByteDance what-if trace.

    Args:
        path: the ``trace-*.parquet`` file.
        meta: the matching ``meta-*.yaml`` file.

    Returns:
        The validated :class:`OpTrace` (``fmt="bytedance"``).

    Warns:
        TraceWarning: exact duplicate rows were dropped (how many, the first one).

    Raises:
        TraceError: the file is missing or not Parquet, or fails :func:`validate_ops` (for example
            two different rows for one op).

    Example:
        >>> from pacectl.data import shipped_trace
        >>> trace = load_bytedance(*shipped_trace("ST"))
        >>> trace.meta.world_size
        8
    """
    p = require_file(path, "trace file")
    job = load_meta(meta)
    table = read_parquet_table(
        p,
        other_formats="For other formats pick another trace= importer",
        max_rows=max_ops,
        max_bytes=max_bytes,
    )
    ops = validate_ops(_to_pandas(table), job, source=str(p), drop_exact=True)  # the frame: a temporary
    return OpTrace(ops=ops, meta=job, source=str(p), fmt="bytedance")
