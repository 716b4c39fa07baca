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
    """Hold back SIGINT and SIGTERM while the block runs, where a Python handler takes them (in the
    main thread; a signal whose default action ends the process at once is left alone): one that
    arrives meanwhile is delivered, to that handler, when the block ends."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    saved = {sig: h for sig in (signal.SIGINT, signal.SIGTERM) if callable(h := signal.getsignal(sig))}
    for sig in saved:
        signal.signal(sig, lambda signum, _: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)


def _host() -> str:
    """This machine's name as a staging folder's name holds it (letters, digits, dots)."""
    import socket

    return "".join(c if c.isalnum() or c == "." else "_" for c in socket.gethostname()) or "host"


def _remove_stale_stages(folder: Path, name: str) -> None:
    """Remove the staging folders for ``name`` in ``folder`` that a process killed outright (``kill
    -9``, a power cut) left behind: those of this machine whose process (the pid in the folder's
    name) is gone. A staging folder of a live process, of another machine (a shared file system)
    or not named by :func:`staged_outputs` stays."""
    prefix, host = f".{name}.staging-", _host()
    for old in folder.iterdir():
        pid, _, rest = old.name.removeprefix(prefix).partition("-")
        if not old.name.startswith(prefix) or not pid.isdigit() or not rest.startswith(f"{host}-"):
            continue
        if _gone(int(pid)):
            remove_tree(old)


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here: none, or a zombie (killed, its parent not yet told;
    read from ``/proc`` where there is one). Another user's live process is not gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


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
    base = next(p for p in (out, *out.parents) if p.is_dir())  # the deepest existing folder
    _remove_stale_stages(base, out.name)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-{os.getpid()}-{_host()}-", dir=base))
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
    """Convert ``obj`` (nested dicts, sequences, numbers, strings, numpy values) to plain JSON types:
    numpy scalars and arrays to Python, NaN and +-inf to None, dicts to dicts with ``str`` keys,
    tuples and lists to lists, ``Path`` to ``str``. Other objects are returned unchanged
    (``json.dumps`` then rejects what it cannot encode)."""
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
