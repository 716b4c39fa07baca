"""Safe writing (pacectl.files): atomic files, staged run folders, the writable-folder check."""

from __future__ import annotations

from pathlib import Path

import pytest

from pacectl.files import atomic_path, atomic_write_text, folder_problem, staged_outputs


def test_atomic_path_failure_midway_leaves_no_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with pytest.raises(RuntimeError, match="boom"), atomic_path(path) as tmp:
        tmp.write_text("half written")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_failure_keeps_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("new but broken")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_write_text_replaces_and_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["out.txt"]


def test_staged_outputs_move_files_and_folders_of_files_only_on_success(tmp_path: Path) -> None:
    with staged_outputs(tmp_path) as stage:
        (stage / "summary.json").write_text("{}")
        (stage / "records").mkdir()
        (stage / "records" / "none.parquet").write_text("x")
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "records" / "none.parquet").is_file()
    with pytest.raises(RuntimeError), staged_outputs(tmp_path / "failed" / "deeper") as stage:
        (stage / "records").mkdir()
        (stage / "records" / "pid.parquet").write_text("x")
        raise RuntimeError("a writer failed")
    # nothing moved, no staging folder left, and the run folder (with its parents) never created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records", "summary.json"]
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "records").write_text("a file where the folder goes")
    with (
        pytest.raises(NotADirectoryError, match="records exists and is not a folder"),
        staged_outputs(tmp_path / "blocked") as stage,
    ):
        (stage / "records").mkdir()
        (stage / "records" / "none.parquet").write_text("x")
    assert sorted(p.name for p in (tmp_path / "blocked").iterdir()) == ["records"]


def test_staged_logs_are_appended_to_an_earlier_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for line in ("first run\n", "second run\n"):
        with staged_outputs(out, append=["run.log"]) as stage:
            (stage / "run.log").write_text(line)
            (stage / "summary.json").write_text(line)
    assert (out / "run.log").read_text() == "first run\nsecond run\n"
    assert (out / "summary.json").read_text() == "second run\n"


def test_folder_problem_names_what_stops_a_folder(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert folder_problem(afile / "out") == f"{afile} is a file, not a folder"
    assert folder_problem(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists() and not any(
        p.name.startswith(".pacectl-probe") for p in tmp_path.iterdir()
    )
    if Path("/proc/self").is_dir():  # a pseudo file system takes no folders, root included
        assert "does not accept new folders" in (folder_problem("/proc/pacectl-test") or "")
