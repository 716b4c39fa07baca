"""Run a pacectl command line in this process, as a test would run it in a fresh one.

A fresh interpreter per command costs seconds of imports; the entry points' ``main(argv)`` return
their exit status instead (:func:`pacectl.cli.invoke`), so a test can run them here and read what
they printed::

    from pacectl.run import main
    proc = run_command(main, ["controller=pidd"], cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean" in proc.stderr.lower()

What only a fresh process shows (which modules a command imports, signals, environment variables
read at import) still needs :mod:`subprocess`.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def run_command(
    main: Callable[[Sequence[str]], int], args: Sequence[str], *, cwd: str | os.PathLike[str]
) -> subprocess.CompletedProcess[str]:
    """Run ``main(args)`` in ``cwd`` and capture what it printed.

    Args:
        main: an entry point that takes its arguments and returns its exit status.
        args: the command-line arguments (without the program name).
        cwd: the folder to run in (relative paths and Hydra's default ``outputs/`` land there).

    Returns:
        A :class:`subprocess.CompletedProcess` with ``returncode``, ``stdout`` and ``stderr``, as
        ``subprocess.run(..., capture_output=True, text=True)`` gives.
    """
    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
