"""Bounded, streaming reads of numeric CSV columns (pyarrow's streaming CSV reader).

``pandas.read_csv`` holds the whole file, every column, as Python objects, and echoes a bad header
whole into its error. :func:`read_numeric_columns` instead

- refuses a file larger than ``max_bytes`` before reading it (``trace.max_mb``, as the Kineto importer);
- reads the header line itself, at most :data:`MAX_HEADER_BYTES`, and names at most a few columns,
  each cut to :data:`EXCERPT_CHARS`, in any message;
- streams the file in blocks of :data:`BLOCK_BYTES` with :func:`pyarrow.csv.open_csv`, keeping only the
  requested columns, each converted to ``float64`` block by block (8 bytes per value kept);
- stops as soon as the rows exceed ``max_rows`` (``trace.max_ops`` for the step-level importer);
- records rows with the wrong number of fields (a truncated last row, a stray comma) instead of
  raising pyarrow's message, which quotes the whole row.

Memory is therefore ``8 x kept columns x rows`` plus one block, whatever the file holds; the measured
figures per input MB are in ``experiments/bench/results/importer_memory.json``.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pacectl.errors import TraceError

#: The most bytes the header line may take.
MAX_HEADER_BYTES = 1 << 20
#: Bytes per streamed block (a row must fit in one block).
BLOCK_BYTES = 1 << 22
#: The most characters of a field, a column name or a row quoted in a message.
EXCERPT_CHARS = 40


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr``-like short text of ``value``: at most ``limit`` characters, then how many more.

    Example:
        >>> excerpt("x" * 100, 5)
        "'xxxxx'... (95 more characters)"
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text) - limit} more characters)"


def columns_excerpt(names: list[str], limit: int = 8) -> str:
    """At most ``limit`` column names, each cut short, and how many more there are."""
    shown = ", ".join(excerpt(n) for n in names[:limit])
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return f"[{shown}{more}]"


@dataclass
class BadRows:
    """Rows pyarrow could not split into the header's number of fields (skipped)."""

    count: int = 0
    first_row: int = 0  #: file row of the first, header = row 1 (blank lines not counted)
    first_fields: int = 0  #: how many fields it had
    first_text: str = ""  #: an excerpt of it
    last_row: int = 0  #: file row of the last such row


@dataclass
class CsvColumns:
    """What :func:`read_numeric_columns` read.

    Attributes:
        header: every column name of the file, in order.
        values: requested column -> ``float64[num_rows]`` (NaN where empty or not a number).
        unparsed: requested column -> (index of the first row whose field is not empty yet not a
            number, an excerpt of that field), or absent when there is none.
        empty: requested column -> index of the first row whose field is empty, or absent.
        last_raw: requested column -> the last row's field (None when empty).
        bad_rows: rows with the wrong number of fields (skipped; counted, the first quoted).
        num_rows: rows kept.
    """

    header: list[str]
    values: dict[str, NDArray[np.float64]]
    unparsed: dict[str, tuple[int, str]] = field(default_factory=dict)
    empty: dict[str, int] = field(default_factory=dict)
    last_raw: dict[str, str | None] = field(default_factory=dict)
    bad_rows: BadRows = field(default_factory=BadRows)
    num_rows: int = 0


def read_header(path: Path, *, what: str) -> list[str]:
    """The column names of a CSV file, from its first line (at most :data:`MAX_HEADER_BYTES`).

    Raises:
        TraceError: the file is empty, not UTF-8 text, or its first line is longer than the cap.
    """
    with path.open("rb") as fh:
        head = fh.read(MAX_HEADER_BYTES + 1)
    if not head.strip():
        raise TraceError(
            f"a {what} must start with a header line of column names, got an empty file (in {path})"
        )
    end = head.find(b"\n")
    if end < 0 and len(head) > MAX_HEADER_BYTES:
        raise TraceError(
            f"a {what}'s header line must be at most {MAX_HEADER_BYTES} bytes, got a first line longer than "
            f"that, starting {excerpt(head[:EXCERPT_CHARS].decode('utf-8', 'replace'))} (in {path}). "
            "Is it a CSV file with one header row of column names?"
        )
    line = head if end < 0 else head[:end]
    if b"\x00" in line:
        raise TraceError(
            f"a {what} must be CSV text, got binary data (NUL bytes) in its first line (in {path})"
        )
    try:
        text = line.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as err:
        raise TraceError(
            f"a {what} must be UTF-8 CSV text, got an undecodable byte at offset {err.start} of its "
            f"header line (in {path})"
        ) from err
    try:
        return next(csv.reader(io.StringIO(text)))
    except (csv.Error, StopIteration) as err:
        raise TraceError(
            f"a {what} must start with a CSV header line, could not parse it (in {path}): {err}"
        ) from err


def read_numeric_columns(
    path: Path,
    columns: list[str],
    *,
    what: str,
    header: list[str],
    max_bytes: int,
    max_rows: int,
    cap_hint: str,
    rows_hint: str | None = None,
) -> CsvColumns:
    """Stream ``columns`` of a CSV file as ``float64`` arrays, within ``max_bytes`` and ``max_rows``.

    Args:
        path: the file; columns: names present in ``header`` (:func:`read_header`).
        what: the file's kind, for messages ("step-level trace").
        max_bytes: cap on the file's size on disk, bytes.
        max_rows: cap on data rows; reading stops past it.
        cap_hint: how the user raises the caps, e.g. "trace.max_mb / trace.max_ops".
        rows_hint: how the user raises ``max_rows`` alone, if not ``cap_hint``.

    Returns:
        The columns read (:class:`CsvColumns`).

    Raises:
        TraceError: the file is too large or has too many rows, or pyarrow cannot parse it (its
            message cut to a short excerpt).
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"a {what} must be <= {max_bytes} bytes, got {size} bytes (in {path}). Raise the cap ({cap_hint}) "
            "if the file is genuine, or cut it to the steps you need"
        )
    out = CsvColumns(header=header, values={})
    bad = out.bad_rows
    # pyarrow decodes a bad row's text before it calls on_bad; a row that is not UTF-8 fails there
    # and Python would print "Exception ignored ... Traceback": count it as a bad row instead
    previous_hook = sys.unraisablehook

    def on_unraisable(info: Any) -> None:
        if isinstance(info.exc_value, UnicodeDecodeError):
            if bad.count == 0:
                bad.first_text = "a row that is not UTF-8 text"
            bad.count += 1
            return
        previous_hook(info)

    sys.unraisablehook = on_unraisable
    try:
        return _stream(path, columns, out, what=what, max_rows=max_rows, cap_hint=rows_hint or cap_hint)
    finally:
        sys.unraisablehook = previous_hook


def _stream(
    path: Path, columns: list[str], out: CsvColumns, *, what: str, max_rows: int, cap_hint: str
) -> CsvColumns:
    """Fill ``out`` (:func:`read_numeric_columns`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    bad = out.bad_rows

    def on_bad(row: pacsv.InvalidRow) -> str:
        if bad.count == 0:
            bad.first_row = int(row.number or 0)
            bad.first_fields = int(row.actual_columns)
            bad.first_text = excerpt(row.text, 80)
        bad.count += 1
        bad.last_row = int(row.number or 0)
        return "skip"

    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_bad),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns,
                column_types={c: pa.string() for c in columns},
                strings_can_be_null=True,
                # only an empty field is missing: a written "nan" or "NA" is a value, shown as written
                null_values=[""],
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, UnicodeDecodeError) as err:
        raise TraceError(
            f"a {what} must be a CSV file, could not parse it (in {path}): {excerpt(err, 160)}"
        ) from err
    parts: dict[str, list[NDArray[np.float64]]] = {c: [] for c in columns}
    try:
        for batch in reader:
            n = batch.num_rows
            if n == 0:
                continue
            if out.num_rows + n > max_rows:
                raise TraceError(
                    f"a {what} must hold <= {max_rows} rows, got at least {out.num_rows + n} (in {path}). "
                    f"Raise the cap ({cap_hint}) if the file is genuine, or cut it to the steps you need"
                )
            for c in columns:
                col = batch.column(c)
                try:
                    num = pc.cast(col, pa.float64())
                    vals = num.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raw = col.to_pandas()
                    vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
                    if c not in out.unparsed:
                        odd = np.flatnonzero(np.isnan(vals) & raw.notna().to_numpy())
                        if len(odd):
                            out.unparsed[c] = (out.num_rows + int(odd[0]), excerpt(raw.iloc[int(odd[0])]))
                if c not in out.empty and col.null_count:
                    out.empty[c] = out.num_rows + pc.index(pc.is_null(col), True).as_py()
                parts[c].append(vals)
                last = col[n - 1].as_py()
                out.last_raw[c] = None if last is None else str(last)[:EXCERPT_CHARS]
            out.num_rows += n
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, UnicodeDecodeError) as err:
        raise TraceError(
            f"a {what} must be a CSV file, could not parse it after {out.num_rows} rows (in {path}): "
            f"{excerpt(err, 160)}"
        ) from err
    out.values = {c: np.concatenate(v) if v else np.empty(0, dtype=np.float64) for c, v in parts.items()}
    return out
