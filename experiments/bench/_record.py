"""Shared by the benchmark scripts: write a results record with the machine it was measured on."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from pacectl.report import atomic_write_text


def write_record(path: Path, rows: list[dict[str, Any]], **extra: Any) -> None:
    """Write ``{"machine", "python", **extra, "results": rows}`` as JSON, atomically, and say where."""
    record = {"machine": platform.platform(), "python": platform.python_version(), **extra, "results": rows}
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
