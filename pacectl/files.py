"""Writing outputs safely: atomic files, staged run folders, JSON-ready values, and the check that a
folder can be written.

Every writer of pacectl (run outputs, tuned controller files, converted traces, experiment records)
goes through :func:`atomic_path` or :func:`staged_outputs`, so a reader (or a crashed run) never
sees a half-written output, and a run that fails leaves no output behind. This module sits below
every layer that writes files (importers, the report, the entry points) and imports nothing of
pacectl.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` only if the block succeeds.

    The temporary file is hidden (``.<name>.<random>.tmp``) and in the same directory, so the final
    ``os.replace`` is atomic on POSIX. On an exception the temporary file is removed and the
    exception propagates; an existing ``path`` is left untouched. Missing parent directories are
    created.

    Args:
        path: final destination.

    Yields:
        The temporary path to write to (not created yet).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("done")
        >>> target.read_text()
        'done'
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as f:  # flush to disk before the rename makes it visible
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _existing_ancestor(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.is_dir())


def remove_tree(path: Path) -> None:
    """``shutil.rmtree(path)``, errors ignored, that a second Ctrl-C does not cut short: a
    ``KeyboardInterrupt`` raised while it runs (the first one is being handled) is raised again
    once the folder is gone."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            break
        except KeyboardInterrupt as err:
            interrupted = err
    if interrupted is not None:
        raise interrupted


#: The folders :func:`staged_outputs` completed in this process, in order (an entry point that is
#: interrupted says whether its outputs were written).
committed: list[Path] = []


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs (in the main thread; elsewhere nothing is
    held): one that arrives meanwhile is delivered, to the handler set before, when it ends."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, _: held.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


def _remove_stale_stages(folder: Path, name: str) -> None:
    """Remove the staging folders for ``name`` in ``folder`` that a process killed outright (``kill
    -9``, a power cut) left behind: those whose process (its pid in the folder's name) is gone. A
    staging folder of a live process, or one not named by :func:`staged_outputs`, stays."""
    for old in folder.glob(f".{name}.staging-*-*"):
        pid = old.name.removeprefix(f".{name}.staging-").split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            remove_tree(old)
        except OSError:  # alive, another user's
            continue


@contextmanager
def staged_outputs(out_dir: str | os.PathLike[str], *, append: Sequence[str] = ()) -> Iterator[Path]:
    """Yield a hidden staging folder; move its files into ``out_dir`` when the block succeeds.

    A run writes all its outputs into the staging folder (files, and folders of files such as
    ``records/``); only when the block succeeds are the folders of ``out_dir``'s path that are
    missing created and the files moved into place (each with an atomic ``os.replace``), so a
    failed run leaves none of them. The staging folder lies in the deepest folder of ``out_dir``'s
    path that exists already, so the moves stay on one file system: ``out_dir`` itself where it
    exists (``pacectl.run`` and ``pacectl.tune`` create and lock their run folder first, and remove
    it again when the job fails: :func:`pacectl.cli.run_job`). The staging folder is removed however
    the block ends (an error, ``KeyboardInterrupt``, ``SystemExit``), and so are the folders this
    call created for a move that did not complete; staging folders that a killed process left
    there (``kill -9``: no clean-up runs) are removed when the next run stages beside them, and are
    never moved into ``out_dir``.

    Args:
        out_dir: the run folder.
        append: names of staged files (logs) that are appended to a file of the same name already
            in ``out_dir`` (a rerun into the same folder) instead of replacing it.

    Raises:
        IsADirectoryError: an output file's path is taken by something that is not a file;
            NotADirectoryError: an output folder's path is taken by a file (nothing is moved then).
    """
    out = Path(out_dir).absolute()
    base = _existing_ancestor(out)
    _remove_stale_stages(base, out.name)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-{os.getpid()}-", dir=base))
    created: list[Path] = []  # the folders this call made, deepest last
    try:
        yield stage
        files = sorted(p.relative_to(stage) for p in stage.rglob("*") if p.is_file())
        for f in files:  # check every target before moving any
            for folder in (out / f).parents:
                if folder.exists() and not folder.is_dir():
                    raise NotADirectoryError(
                        f"output folder {folder} exists and is not a folder; remove it or pick another run dir"
                    )
            if (out / f).exists() and not (out / f).is_file():
                raise IsADirectoryError(
                    f"output path {out / f} exists and is not a file; remove it or pick another run dir"
                )
        with _interrupts_deferred():  # a Ctrl-C now comes after the last move: all or nothing
            for f in files:
                missing = [p for p in (out / f).parents if not p.exists()]
                (out / f).parent.mkdir(parents=True, exist_ok=True)
                created.extend(reversed(missing))
                if str(f) in append and (out / f).is_file():
                    with open(out / f, "ab") as target:
                        target.write((stage / f).read_bytes())
                else:
                    os.replace(stage / f, out / f)
            created.clear()  # every file is in place: the folders stay
            committed.append(out)
    finally:
        remove_tree(stage)
        for folder in reversed(created):  # a move that did not complete: its new folders go, when empty
            with contextlib.suppress(OSError):
                folder.rmdir()


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot become (or be) a folder to write outputs into, or None.

    Checked without leaving anything behind: no part of the path may be an existing file, and the
    deepest existing folder must accept a new folder (permissions, a read-only file system, or a
    pseudo file system such as ``/proc``; probed with a temporary folder, removed at once).
    """
    target = Path(path)
    for p in (target, *target.parents):
        if p.exists() and not p.is_dir():
            return f"{p} is a file, not a folder"
        if p.is_dir():
            if not os.access(p, os.W_OK | os.X_OK):
                return f"{p} is not writable (permission denied)"
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".pacectl-probe-", dir=p))
            except OSError as err:
                return f"{p} does not accept new folders ({err.strerror or type(err).__name__})"
            return None
    return None


def jsonable(obj: Any) -> Any:
    """Convert ``obj`` to plain JSON types: numpy scalars and arrays to Python, non-finite floats to None.

    Dicts become dicts with ``str`` keys, tuples and lists become lists, ``Path`` becomes ``str``.
    Other objects are returned unchanged (``json.dumps`` then rejects what it cannot encode).

    Args:
        obj: a nested structure of dicts, sequences, numbers, strings and numpy values.

    Returns:
        The converted structure; NaN and +-inf become ``None``.
    """
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray | np.generic):
        return jsonable(obj.tolist())  # an array to lists, a numpy scalar to the Python number
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj
