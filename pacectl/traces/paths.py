"""``trace.path`` to the list of files an importer reads: files, folders and globs.

Shared by the importers whose input is a set of per-rank files (Kineto traces, Flight Recorder
dumps, NCCL Inspector logs).
"""

from __future__ import annotations

import glob as globmod
from collections.abc import Callable, Sequence
from pathlib import Path

from pacectl.errors import TraceError


def expand_paths(
    paths: str | Path | Sequence[str | Path],
    *,
    what: str,
    accept: Callable[[Path], object],
    empty_folder: Callable[[Path, int], str],
    sort: bool = True,
) -> list[Path]:
    """Expand folders (the files in them that ``accept`` takes), globs and files into a sorted,
    de-duplicated list.

    Args:
        paths: one path or several (files, folders, globs).
        what: the kind of input, for the message when none is given ("NCCL Inspector log").
        accept: whether a file of a folder is one of these inputs (a cheap sniff).
        empty_folder: the message for a folder none of whose files is accepted, given the folder and
            how many files it holds.
        sort: sort the whole list; False keeps the order given (each folder and glob sorted).

    Raises:
        TraceError: nothing given, a path that does not exist, a folder with no accepted file, or a
            glob that matches nothing.
    """
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    if not items:
        raise TraceError(f"trace.path must name at least one {what}, folder or glob, got none")
    out: list[Path] = []
    for item in items:
        text = str(item)
        p = Path(text).expanduser()
        if p.is_dir():
            files = [f for f in p.iterdir() if f.is_file()]
            found = sorted(f for f in files if accept(f))
            if not found:
                raise TraceError(empty_folder(p, len(files)))
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif any(c in text for c in "*?["):
            found = sorted(Path(f) for f in globmod.glob(str(p)) if Path(f).is_file())
            if not found:
                raise TraceError(f"trace.path glob must match at least one file, got no match for {text!r}")
            out.extend(found)
        else:
            raise TraceError(f"trace.path must be an existing file, folder or glob, got {text!r}")
    unique: dict[Path, Path] = {}
    for f in out:
        unique.setdefault(f.resolve(), f)
    return sorted(unique.values()) if sort else list(unique.values())
