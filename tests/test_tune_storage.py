"""Study journals that cannot be lost: torn tails, corrupt lines, full disks (pacectl/tuning/storage.py)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest

from pacectl.tuning.storage import JournalRepaired, StorageSpec, disk_full_cause, repair_journal

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _journal(tmp_path: Path, n: int = 5) -> Path:
    path = tmp_path / "optuna.journal"
    study = optuna.create_study(storage=StorageSpec("journal", str(path)).open(), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
    return path


def _finished(path: Path) -> int:
    study = optuna.load_study(study_name="s", storage=StorageSpec("journal", str(path)).open())
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials())


def test_a_whole_journal_is_left_alone(tmp_path: Path) -> None:
    path = _journal(tmp_path)
    before = path.read_bytes()
    assert repair_journal(path) is None and path.read_bytes() == before
    assert repair_journal(tmp_path / "missing") is None


def test_a_torn_tail_is_cut_kept_and_the_study_resumes(tmp_path: Path) -> None:
    path = _journal(tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code":5,"worker_id":"x","trial_id":3,"sta')  # a crash mid-write
    with pytest.warns(
        JournalRepaired, match=r"removed 46 byte\(s\) of 1 torn .*the last write never finished"
    ):
        storage = StorageSpec("journal", str(path)).open()
    assert path.read_bytes() == whole
    assert (tmp_path / "optuna.journal.torn-1").read_bytes().startswith(b'{"op_code":5')
    study = optuna.load_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)  # appends after whole records
    assert _finished(path) == 8


def test_a_journal_appended_after_a_torn_tail_is_recovered(tmp_path: Path) -> None:
    # what an older pacectl left: the resume appended after the torn bytes, and every later open
    # failed with JSONDecodeError ("cannot be opened"), 200 finished trials out of reach
    path = _journal(tmp_path, n=4)
    lines = path.read_bytes().splitlines(keepends=True)
    torn = b'{"op_code":5,"wor'
    path.write_bytes(b"".join(lines[:-2]) + torn + lines[-2] + lines[-1])
    with pytest.raises(json.JSONDecodeError):
        list(optuna.storages.journal.JournalFileBackend(str(path)).read_logs(0))
    with pytest.warns(JournalRepaired, match=r"1 record\(s\) recovered"):
        assert _finished(path) == 4
    assert (tmp_path / "optuna.journal.torn-1").read_bytes() == torn + b"\n"


def test_disk_full_cause_finds_the_error_behind_optunas_assertion() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        finally:
            raise AssertionError("Should not reach.")  # what Optuna's trial loop raises over it
    except AssertionError as err:
        assert disk_full_cause(err) is full
    assert disk_full_cause(ValueError("x")) is None


_FULL_CHILD = textwrap.dedent(
    """
    import resource, signal, sys, optuna
    from pacectl.errors import StorageFullError
    from pacectl.tuning.storage import disk_full_cause
    from pacectl.tuning.storage import StorageSpec
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    path = sys.argv[1]
    study = optuna.load_study(study_name="s", storage=StorageSpec("journal", path).open())
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1000)
    except BaseException as err:
        cause = disk_full_cause(err)
        print(type(cause).__name__, cause)
        sys.exit(3 if isinstance(cause, StorageFullError) else 4)
    sys.exit(5)
    """
)


def test_a_full_disk_leaves_no_torn_record_and_a_journal_that_resumes(tmp_path: Path) -> None:
    path = _journal(tmp_path, n=2)
    limit = path.stat().st_size + 3000  # room for a few more trials, then the "disk" is full
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_CHILD, str(path), str(limit)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "must have room to write" in proc.stdout and "EFBIG" in proc.stdout
    assert path.read_bytes().endswith(b"\n") and path.stat().st_size <= limit
    assert repair_journal(path) is None  # nothing torn: the failed write was cut back
    done = _finished(path)
    assert done >= 2
    study = optuna.load_study(study_name="s", storage=StorageSpec("journal", str(path)).open())
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert _finished(path) == done + 2


def test_a_file_that_is_no_journal_is_never_touched(tmp_path: Path) -> None:
    path = tmp_path / "other.jsonl"
    for text in (b'{"x": 1}\n', b'{"x": 1}\n{"y": 2', b"not json at all"):
        path.write_bytes(text)
        assert repair_journal(path) is None and path.read_bytes() == text
    assert not list(tmp_path.glob("*.torn-*"))
