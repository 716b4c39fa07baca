"""Shared by the benchmark scripts: write a results record with the machine it was measured on."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from pacectl.report import atomic_write_text

#: The checkout these scripts belong to: the pacectl they measure (the commands they time run with
#: ``PYTHONPATH`` set to it).
CHECKOUT = Path(__file__).resolve().parents[2]


def git_state(folder: Path) -> dict[str, Any]:
    """Which code ``folder`` holds: ``{"checkout", "commit", "dirty", "changed"}``, the commit checked
    out (``HEAD``), whether any file differs from it (``git status``: tracked files changed, or files
    git does not ignore added) and those files' paths (the first 20); ``commit`` None where
    ``folder`` is no git checkout (or git is missing)."""
    state: dict[str, Any] = {"checkout": str(folder)}
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {**state, "commit": None}
    return {**state, "commit": commit, "dirty": bool(status), "changed": [s[3:] for s in status[:20]]}


#: :func:`git_state` of :data:`CHECKOUT` when the benchmark started (this module's import): what it
#: measured, where a file is edited while it runs.
AT_START = git_state(CHECKOUT)


def write_record(
    path: Path, rows: list[dict[str, Any]], *, against: Path | None = None, **extra: Any
) -> None:
    """Write ``{"machine", "python", "pacectl", ["against", "against_git"], **extra, "results": rows}``
    as JSON, atomically, and say where.

    ``pacectl`` is :func:`git_state` of this checkout (:data:`CHECKOUT`) when the benchmark started
    (:data:`AT_START`), with ``pacectl_at_end``, its state now, where that differs; also
    ``pacectl_imported``, of the checkout this process imported pacectl from, where that is another
    one (an in-process benchmark run without ``PYTHONPATH`` measures the installed copy);
    ``against``, another checkout measured alongside, its path and its :func:`git_state`.
    """
    record: dict[str, Any] = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "pacectl": AT_START,
    }
    now = git_state(CHECKOUT)
    if now != AT_START:
        record["pacectl_at_end"] = now
    imported = sys.modules.get("pacectl")
    if imported is not None and imported.__file__ is not None:
        source = Path(imported.__file__).resolve().parents[1]
        if source != CHECKOUT:
            record["pacectl_imported"] = git_state(source)
    if against is not None:
        record.update(against=str(against), against_git=git_state(against.resolve()))
    record = {**record, **extra, "results": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    print(f"written: {path}")


def timed_command(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> dict[str, float]:
    """Run ``cmd`` to its end and measure it as a whole command.

    Returns:
        ``wall_s``; ``cpu_s``, user plus system time of the command and every process it waited
        for (its plot workers); ``peak_rss_mb``, the largest resident set among them; and
        ``load_1min`` when it started (``os.getloadavg``): on a shared machine the wall time of a
        command that runs beside others is the load's as much as its own.

    Raises:
        SystemExit: the command failed (its stderr's end in the message).
    """
    import os
    import subprocess
    import time

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"failed ({proc.returncode}): {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}"
        )
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "load_1min": load,
    }


def compile_bytecode(python: str, folder: Path) -> None:
    """Compile every module under ``folder`` to bytecode with ``python`` (``compileall``), as pip does
    when it installs a package: a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (this machine's
    sessions set it) would otherwise compile each of its modules again in every run, which no user's
    install does (about 0.05-0.1 s of pacectl's start-up here)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [python, "-m", "compileall", "-q", str(folder)], env=env, check=True, stdout=subprocess.DEVNULL
    )
