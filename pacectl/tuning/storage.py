"""Where a study lives, and storage that cannot be lost: torn-journal repair and full-disk handling.

Storage (``tune.storage``):

- ``null`` (default): a journal file ``<run dir>/optuna.journal`` (Optuna's ``JournalStorage`` over
  ``JournalFileBackend``, locked by :class:`FlockLock`). Every finished trial is one appended line,
  so a study killed with SIGKILL keeps every finished trial and resumes;
- a file path: a journal file there (any name; shared by every process that names it);
- an RDB URL (``sqlite:///tune.db``, ``postgresql://user:pw@host/db``): Optuna's ``RDBStorage``;
  workers on several machines share one study by running the same command against the same URL
  (PostgreSQL needs ``psycopg2``; SQLite only suits one machine).

A journal file (``JournalFileBackend``) is one JSON record per line. A crash or a full disk in the
middle of a write leaves a *torn* last record: bytes without their closing newline, or a line that is
not JSON. Optuna reads past a torn tail, but its next append lands after the torn bytes, the line
they make is not JSON, and every later open fails with ``JSONDecodeError``: the study is out of reach.

:func:`repair_journal` runs before a journal is opened (under the journal's lock):

- a torn tail (the last line without its newline, or not JSON) is cut off;
- a line that is not JSON in the middle (a journal that an older pacectl already appended to after a
  torn tail) is replaced by the whole record it ends with, when there is one, else dropped;
- a file without one whole journal record is not a journal and is left untouched (Optuna's open
  then refuses it), and so is every line that is JSON;
- every byte removed is kept beside the journal, in ``<journal>.torn-<n>``, and a
  :class:`JournalRepaired` warning says what was done.

:class:`SafeJournalFileBackend` keeps a full disk from tearing the journal in the first place: a write
that fails (``ENOSPC``, ``EDQUOT``, ``EFBIG``) is cut back to the journal's length before it, and the
error is raised as :class:`~pacectl.errors.StorageFullError`, one line that the commands print.
Optuna hides that error behind ``AssertionError("Should not reach.")`` when it fails inside a trial's
``tell``; :func:`disk_full_cause` finds it again in the exception chain.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages.journal import JournalFileBackend, JournalStorage

from pacectl.errors import ConfigError, StorageFullError

#: errno values that mean "no room to write": a full disk, a quota, a file-size limit.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class JournalRepaired(UserWarning):
    """A torn or corrupt record was removed from a study journal (a copy is kept beside it)."""


def _json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _record(line: bytes) -> bool:
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(value, dict) and "op_code" in value


def _salvage(line: bytes) -> bytes | None:
    """The last whole journal record that ``line`` ends with (torn bytes followed by a record)."""
    start = line.rfind(b'{"op_code"')
    while start > 0:
        if _record(line[start:]):
            return line[start:]
        start = line.rfind(b'{"op_code"', 0, start)
    return None


def _keep_copy(path: Path, data: bytes) -> Path:
    n = 1
    while (path.parent / f"{path.name}.torn-{n}").exists():
        n += 1
    copy = path.parent / f"{path.name}.torn-{n}"
    copy.write_bytes(data)
    return copy


def _journal_lines(path: Path) -> list[bytes] | None:
    """The lines of the journal ``path``, or None for a missing or empty file, or one without a whole
    journal record (not a journal: Optuna's open says so; it is left untouched)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    lines = path.read_bytes().splitlines(keepends=True)
    return lines if any(line.endswith(b"\n") and _record(line) for line in lines) else None


def journal_needs_repair(path: str | Path) -> bool:
    """Whether :func:`repair_journal` would change ``path`` (read only, no lock taken)."""
    lines = _journal_lines(Path(path))
    return lines is not None and not all(line.endswith(b"\n") and _json(line) for line in lines)


def repair_journal(path: str | Path) -> str | None:
    """Cut a torn tail off a study journal and repair lines that are not records (module docstring).

    The caller holds the journal's lock (no other process may write meanwhile).

    Args:
        path: the journal file; a missing or empty file is left alone.

    Returns:
        What was done (also warned as :class:`JournalRepaired`), or None when the journal was whole.

    Raises:
        OSError: the journal or the copy cannot be written (a read-only folder, a full disk).
    """
    p = Path(path)
    lines = _journal_lines(p)
    if lines is None:
        return None
    kept: list[bytes] = []
    removed: list[bytes] = []
    salvaged = 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if line.endswith(b"\n") and _json(line):
            kept.append(line)  # JSON that is no record is Optuna's to judge, never dropped here
            continue
        if last and not line.endswith(b"\n"):
            removed.append(line)  # a torn tail: the write that never finished
            continue
        whole = _salvage(line.rstrip(b"\r\n"))
        if whole is not None:
            kept.append(whole + b"\n")
            removed.append(line[: len(line.rstrip(b"\r\n")) - len(whole)] + b"\n")
            salvaged += 1
        else:
            removed.append(line)
    if not removed:
        return None
    copy = _keep_copy(p, b"".join(removed))
    torn_tail = bool(lines) and not lines[-1].endswith(b"\n")
    if salvaged == 0 and len(removed) == 1 and torn_tail:
        with p.open("r+b") as fh:  # the common case: cut the tail in place
            fh.truncate(sum(len(line) for line in lines[:-1]))
            fh.flush()
            os.fsync(fh.fileno())
    else:
        tmp = p.parent / f".{p.name}.repair"
        with tmp.open("wb") as fh:
            fh.write(b"".join(kept))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    note = (
        f"study journal {p}: removed {sum(len(r) for r in removed)} byte(s) of {len(removed)} torn or corrupt "
        f"record(s) ({'the last write never finished: a crash or a full disk' if torn_tail else 'not JSON'}"
        f"{f'; {salvaged} record(s) recovered from them' if salvaged else ''}); kept a copy in {copy}; "
        f"{len(kept)} record(s) remain and the study resumes from them"
    )
    warnings.warn(note, JournalRepaired, stacklevel=2)
    return note


def full_disk_error(err: OSError, where: str) -> StorageFullError:
    """The one-line error for a write that found no room (``err.errno`` in :data:`FULL_ERRNOS`)."""
    reason = os.strerror(err.errno) if err.errno else type(err).__name__
    return StorageFullError(
        f"{where} must have room to write, got {reason} (errno {errno.errorcode.get(err.errno or 0, '?')}); "
        "nothing half-written was kept: free some space (or raise the quota / file-size limit) and run the "
        "same command again to resume"
    )


class SafeJournalFileBackend(JournalFileBackend):
    """A journal file backend whose failed writes leave no torn record (module docstring)."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append ``logs``; a write that fails is cut back to the journal's length before it.

        Raises:
            StorageFullError: no room (full disk, quota, file-size limit); the journal is unchanged.
            OSError: any other write error (the journal is cut back all the same).
        """
        from optuna.storages.journal._file import get_lock_file

        with get_lock_file(self._lock):
            text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
            data = text.encode("utf-8")
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                before = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:  # unbuffered: nothing is left to flush (and fail again) at close
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError as err:
                    try:
                        os.ftruncate(fd, before)
                    except OSError:
                        pass  # the next open repairs the torn tail (repair_journal)
                    if err.errno in FULL_ERRNOS:
                        raise full_disk_error(err, f"the study journal {self._file_path}") from err
                    raise
            finally:
                os.close(fd)


def disk_full_cause(err: BaseException) -> StorageFullError | OSError | None:
    """The full-disk error behind ``err`` (itself, its cause or context, at any depth), or None."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StorageFullError):
            return cur
        if isinstance(cur, OSError) and cur.errno in FULL_ERRNOS:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


class FlockLock:
    """Journal file lock on ``fcntl.flock``: released by the kernel when its process dies.

    Implements the ``acquire``/``release`` interface of Optuna's journal file locks (its base class
    lives in a private module, so this class does not subclass it).

    Optuna's default symlink lock survives a SIGKILL of the holder and is broken only after a grace
    period; a kernel lock never goes stale. Works on local file systems (and NFS via POSIX locks on
    Linux).

    Args:
        journal_path: the journal file; the lock file is ``<journal_path>.flock``.
    """

    def __init__(self, journal_path: str) -> None:
        self._lock_path = journal_path + ".flock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Block until this process holds the lock."""
        fd = os.open(self._lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd
        return True

    def release(self) -> None:
        """Release the lock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@dataclass(frozen=True)
class StorageSpec:
    """Where a study lives.

    Attributes:
        kind: ``"journal"`` (a journal file) or ``"rdb"`` (an SQLAlchemy URL).
        location: absolute file path, or the URL.
    """

    kind: str
    location: str

    def open(self) -> BaseStorage:
        """A new storage object (every process opens its own).

        Raises:
            ConfigError: the URL cannot be opened (bad scheme, missing driver, unreachable server).
        """
        if self.kind == "journal":
            path = Path(self.location)
            if path.exists() and not path.is_file():
                raise ConfigError(f"tune.storage must be a journal file, got a folder: {path}")
            if not path.parent.is_dir():
                raise ConfigError(
                    f"tune.storage {path}: its folder {path.parent} does not exist; create it first or pick "
                    "another path"
                )
            try:
                lock = FlockLock(self.location)
                if journal_needs_repair(path):  # a torn last record (a crash, a full disk) is cut
                    lock.acquire()  # off before anything appends, under the writers' lock
                    try:
                        repair_journal(path)
                    finally:
                        lock.release()
                return JournalStorage(SafeJournalFileBackend(self.location, lock_obj=lock))  # type: ignore[arg-type]
            except OSError as err:
                if err.errno in FULL_ERRNOS:
                    raise full_disk_error(err, f"tune.storage {path}") from err
                # an unwritable folder (permissions, read-only or virtual file system)
                raise ConfigError(
                    f"tune.storage {path}: cannot create or open the journal there "
                    f"({err.strerror or type(err).__name__}); pick a path in a folder you can write to"
                ) from err
        attempt = 0
        while True:
            try:
                return optuna.storages.RDBStorage(self.location)
            except Exception as err:  # sqlalchemy.exc.ArgumentError, OperationalError, ImportError
                # N hosts starting at once race to create the schema on an empty database (PostgreSQL:
                # an IntegrityError, duplicate key in pg_type); the loser finds it made on a retry
                text = str(err).lower()
                if attempt < 5 and ("duplicate key" in text or "already exists" in text):
                    attempt += 1
                    time.sleep(0.2 * attempt)
                    continue
                raise ConfigError(
                    f"tune.storage must be a journal file path or a reachable RDB URL such as sqlite:///tune.db, "
                    f"got {self.location!r}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                ) from err  # SQLAlchemy appends a "(Background on this error at: ...)" line

    @property
    def display(self) -> str:
        """The storage as a user would type it (credentials of an URL hidden)."""
        if self.kind == "rdb" and "@" in self.location:
            scheme, rest = self.location.split("://", 1)
            return f"{scheme}://***@{rest.split('@', 1)[1]}"
        return self.location

    def dashboard_command(self) -> str:
        """The optuna-dashboard command that opens this storage (``pip install optuna-dashboard``)."""
        return f"optuna-dashboard {self.display}"


def storage_spec(value: str | None, run_dir: Path, cwd: Path | None = None) -> StorageSpec:
    """Interpret ``tune.storage``: null -> ``<run_dir>/optuna.journal``; ``x://...`` -> RDB; else a path."""
    if value is None or str(value) == "":
        return StorageSpec("journal", str((run_dir / "optuna.journal").resolve()))
    text = str(value)
    if "://" in text:
        return StorageSpec("rdb", text)
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    return StorageSpec("journal", str(path.resolve()))
