"""Which importer reads a trace path: one rule for ``pacectl.traces`` and ``trace=<file>``.

- a PyTorch Flight Recorder dump (a pickle or JSON object with ``pg_config`` and ``entries``,
  whatever its name: torch's writer adds no suffix), a folder holding such dumps or a glob whose
  first match is one: ``flight_recorder``; found by the file's first bytes
  (:func:`pacectl.traces.flight_recorder.sniff`);
- an NCCL Inspector log (JSON lines with ``header`` and ``coll_perf``, ``<host>-pid<pid>.log``),
  a folder or glob of them: ``nccl_inspector`` (:func:`pacectl.traces.nccl_inspector.sniff`);
- ``.json`` or ``.json.gz``, a folder holding such files, or a glob (``*``, ``?``, ``[``) with
  another ending: Kineto (one file per rank); the ending decides first;
- ``.csv``: step-level (Alibaba PAI mini-batch CSV);
- ``.parquet``: pacectl's own (canonical) Parquet when it carries pacectl metadata; a ByteDance
  trace when its job meta sits beside it (``trace-X.parquet`` and ``meta-X.yaml``, the layout of
  the OSDI'25 artifact and of ``pacectl/data/bytedance``); else canonical, whose loader says what
  is missing (a ByteDance file elsewhere needs its meta named);
- anything else: unknown (None).
"""

from __future__ import annotations

import glob as globmod
from pathlib import Path

#: path endings and the format they name (``.json.gz`` before its ``.gz``)
SUFFIX_FORMATS = (
    (".json.gz", "kineto"),
    (".json", "kineto"),
    (".csv", "steplevel"),
    (".parquet", "canonical"),
)


def meta_beside(path: str | Path) -> Path | None:
    """The job meta YAML beside a ByteDance trace (``trace-X.parquet`` -> ``meta-X.yaml``), or None
    (no such file, or the Parquet file is pacectl's own, which carries its metadata)."""
    p = Path(path)
    if not p.name.startswith("trace-") or p.suffix.lower() != ".parquet":
        return None
    meta = p.with_name("meta-" + p.name[len("trace-") :]).with_suffix(".yaml")
    if not meta.is_file():
        return None
    try:
        import pyarrow.parquet as pq

        from pacectl.traces.canonical import META_KEY

        if META_KEY in (pq.read_schema(p).metadata or {}):
            return None
    except Exception:  # noqa: BLE001 - not readable as Parquet: its loader will say why
        return None
    return meta


def sniff_format(path: Path) -> str | None:
    """``flight_recorder`` or ``nccl_inspector`` when the file's first bytes say so, else None."""
    from pacectl.traces.flight_recorder import sniff as sniff_fr
    from pacectl.traces.nccl_inspector import sniff as sniff_inspector

    if not path.is_file():
        return None
    if sniff_fr(path):
        return "flight_recorder"
    if sniff_inspector(path):
        return "nccl_inspector"
    return None


def detect_format(path: str | Path) -> tuple[str | None, Path | None]:
    """``(format, meta)`` for a trace path (see the module docstring); ``(None, None)`` when unknown.

    Args:
        path: a file, folder or glob (it need not exist: a missing file is named by its loader).

    Returns:
        The ``trace.format`` (``flight_recorder``, ``nccl_inspector``, ``kineto``, ``steplevel``,
        ``canonical``, ``bytedance``) and, for a ByteDance trace, the meta YAML found beside it.
    """
    text = str(path)
    low = text.lower()
    sniffed = sniff_format(Path(path))
    if sniffed is None and any(c in text for c in "*?["):  # a glob: its first match's bytes
        first = next(iter(sorted(globmod.glob(str(Path(text).expanduser())))), None)
        sniffed = sniff_format(Path(first)) if first else None
    if sniffed:
        return sniffed, None
    for suffix, fmt in SUFFIX_FORMATS:  # the suffix first: "run[1]/job.csv" is a CSV file
        if low.endswith(suffix):
            if fmt == "canonical":
                meta = meta_beside(path)
                if meta is not None:
                    return "bytedance", meta
            return fmt, None
    if any(c in text for c in "*?["):  # a glob of rank files: Kineto is the other multi-file format
        return "kineto", None
    folder = Path(path)
    if folder.is_dir():  # its first file (sorted names) that sniffs as a dump or log, else Kineto JSON
        found = next((f for f in map(sniff_format, sorted(folder.iterdir())) if f), None)
        if found:
            return found, None
        if any(p.name.lower().endswith((".json", ".json.gz")) for p in folder.iterdir()):
            return "kineto", None
    return None, None  # a folder of other files (live records: .parquet) is no trace by itself


def other_traces_in(folder: str | Path) -> list[str]:
    """Names of the Parquet and CSV files in ``folder`` (traces of formats other than Kineto, or
    live records), sorted; empty when it is no folder."""
    p = Path(folder)
    if not p.is_dir():
        return []
    return sorted(f.name for f in p.iterdir() if f.suffix.lower() in (".parquet", ".csv"))
