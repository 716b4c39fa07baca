"""Defects a hostile pass (a new user's bad inputs and faults) found, each kept fixed here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pacectl.cli import no_room_error

ROOT = Path(__file__).resolve().parents[1]


def test_a_full_file_system_is_refused_before_hydra_writes(tmp_path: Path) -> None:
    # a disk already full when the run starts ended in Hydra's OSError traceback
    assert no_room_error([f"hydra.run.dir={tmp_path}/run"]) is None
    message = no_room_error([f"hydra.run.dir={tmp_path}/a/b"], min_free_bytes=1 << 62)
    assert message is not None and "must have room to write" in message and str(tmp_path) in message


@pytest.mark.parametrize("module", ["pacectl.run", "pacectl.tune"])
def test_help_into_a_closed_pipe_prints_no_traceback(module: str) -> None:
    # `python -m pacectl.run --help | head` printed a BrokenPipeError traceback
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away before the first byte
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err
