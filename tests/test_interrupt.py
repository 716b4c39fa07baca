"""A Ctrl-C (or SIGTERM) at any point of ``python -m pacectl.run``: one line, exit 130 (143), and
either no run folder or a complete one; never a staging folder, never a hang.

The signals are real and sent at points the run reaches (a wrapped function sends them), not after
a delay; a subprocess's ``timeout=`` is only a guard against a hang, never the assertion.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pacectl import files, report
from pacectl.files import staged_outputs
from pacectl.run import main
from pacectl.testing.commands import run_command

ROOT = Path(__file__).resolve().parents[1]
SMALL_SIM = ["backend=sim", "backend.num_ranks=8", "backend.num_iterations=30", "controller=pid"]
#: A hang shows up as a guard timeout (the test fails); the runs take seconds.
GUARD_S = 300


def _python(code: str, *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a session of its own (its process group is its own: a signal sent to
    the group reaches its plot processes, as a Ctrl-C or ``timeout`` does, and nothing else)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("PACECTL_PLOTS_INLINE", None)  # the command's own plot server, as a user's run has
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, env=full, capture_output=True, text=True, timeout=GUARD_S, start_new_session=True,
    )  # fmt: skip


# The command, with a signal sent to its whole process group when it reaches POINT (the process
# then gets a second one when it starts removing its staging folder: ``timeout -s INT`` signals
# the process and then its group, two signals at once).
HOOKED_RUN = """
import os, runpy, shutil, signal, sys
from pacectl import report

point, sig, main_pid = os.environ["HOOK_POINT"], getattr(signal, os.environ["HOOK_SIGNAL"]), os.getpid()
sent = []

def send():
    if not sent and os.getpid() == main_pid:
        sent.append(1)
        os.killpg(0, sig)

real_rmtree = shutil.rmtree
def rmtree(path, *a, **k):  # the second signal, while the staging folder is being removed
    if sent and os.getpid() == main_pid and ".staging-" in str(path):
        os.kill(main_pid, sig)
    return real_rmtree(path, *a, **k)
shutil.rmtree = rmtree

if point == "parquet":  # the plots are drawing in the plot server's processes
    real_parquet = report.write_iterations_parquet
    def parquet(*a, **k):
        real_parquet(*a, **k)
        send()
    report.write_iterations_parquet = parquet
elif point == "wait":  # waiting for the plots at the end of the output phase
    real_call = report.Pending.__call__
    def call(self):
        send()
        return real_call(self)
    report.Pending.__call__ = call
elif point == "move":  # the staged outputs are being moved into place
    real_replace = os.replace
    def replace(src, dst):
        if ".staging-" in str(src) and ".staging-" not in str(dst):
            send()
        return real_replace(src, dst)
    os.replace = replace
sys.argv = ["pacectl.run", *sys.argv[1:]]
runpy.run_module("pacectl.run", run_name="__main__", alter_sys=True)
"""


def _hooked(tmp_path: Path, point: str, sig: str, *args: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "HOOK_POINT": point, "HOOK_SIGNAL": sig}
    full.pop("PACECTL_PLOTS_INLINE", None)
    return subprocess.run(
        [sys.executable, "-c", HOOKED_RUN, *args],
        cwd=tmp_path, env=full, capture_output=True, text=True, timeout=GUARD_S, start_new_session=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("point", "sig", "status", "word"),
    [
        ("parquet", "SIGINT", 130, "interrupted"),
        ("wait", "SIGINT", 130, "interrupted"),
        ("parquet", "SIGTERM", 143, "terminated (SIGTERM)"),
    ],
)
def test_a_signal_in_the_output_phase_leaves_no_folder(
    tmp_path: Path, point: str, sig: str, status: int, word: str
) -> None:
    """SIGINT (or SIGTERM) to the run's process group while its plots draw or while it waits for
    them, and again while it cleans up: one line, its exit status, no run folder, no staging folder
    (the bug: the folder left with some outputs staged, or a hang on a dead plot handler)."""
    out = tmp_path / "run"
    proc = _hooked(tmp_path, point, sig, *SMALL_SIM, f"hydra.run.dir={out}")
    assert proc.returncode == status, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"pacectl.run: {word}; no outputs were written", (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    assert not any(".staging-" in p.name for p in tmp_path.rglob("*"))


def test_a_signal_while_the_outputs_move_in_comes_after_the_last(tmp_path: Path) -> None:
    """A Ctrl-C while the staged outputs are moved into place is held back until every one is in
    place (all or nothing): the run says they are complete, and they are."""
    out = tmp_path / "run"
    proc = _hooked(tmp_path, "move", "SIGINT", *SMALL_SIM, f"hydra.run.dir={out}")
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"pacectl.run: interrupted after the outputs were written; they are complete: {out}"
    ), proc.stderr
    names = {p.name for p in out.iterdir()}  # the job's log and config.yaml are not written then
    assert {"summary.json", "report.md", "iterations.parquet", "spread.png", "iteration_time.png"} <= names
    assert not any(".staging-" in n for n in names)


def test_a_signal_in_process_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: SIGINT sent to itself while the summary is written, and again while the staging
    folder is removed (the second one used to cut the removal short): exit 130, no folder."""
    import shutil

    real_write, real_rmtree = report.write_summary_json, shutil.rmtree
    sent: list[int] = []

    def write(*a: Any, **k: Any) -> None:
        real_write(*a, **k)
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)

    def rmtree(path: Any, *a: Any, **k: Any) -> None:
        if sent and ".staging-" in str(path):
            os.kill(os.getpid(), signal.SIGINT)
        real_rmtree(path, *a, **k)

    monkeypatch.setattr(report, "write_summary_json", write)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job
    proc = run_command(main, [*SMALL_SIM, "output.plots=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "pacectl.run: interrupted; no outputs were written"
    assert not out.exists() and sent
    assert signal.getsignal(signal.SIGINT) is before  # the handler restored


def _plot_server_script(body: str) -> str:
    return f"""
import functools, os, pathlib, signal, time
from pacectl import report
tmp = pathlib.Path.cwd()
report.can_fork = lambda: True
with report.plot_server():
    server = report._server
{textwrap.indent(textwrap.dedent(body), "    ")}
try:
    os.waitpid(server.pid, os.WNOHANG)
    print("server not reaped")
except ChildProcessError:
    print("server gone")
"""


def test_a_plot_handler_killed_without_a_result_fails_its_wait(tmp_path: Path) -> None:
    """A batch whose handler dies (SIGKILL to its process group, from its own plot) without writing
    its result: ``wait()`` raises at once, from the server's report of the exit status (it used to
    wait forever on a pipe the server held open)."""
    proc = _python(
        _plot_server_script("""
            wait = report.draw_in_background([functools.partial(os.kill, 0, signal.SIGKILL)])
            try:
                wait()
                print("no error")
            except RuntimeError as err:
                print("raised:", err)
        """),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "raised: drawing a plot failed: the plot process" in proc.stdout, proc.stdout
    assert "ended with signal 9 without a result" in proc.stdout and "server gone" in proc.stdout


def test_a_plot_handler_outlives_a_ctrl_c_to_its_group(tmp_path: Path) -> None:
    """A Ctrl-C reaches the terminal's whole process group: a plot's handler and the plot ignore it
    (the parent decides), so the batch ends with its result (its handler used to die of it)."""
    proc = _python(
        _plot_server_script("""
            done = tmp / "done.txt"
            wait = report.draw_in_background([
                functools.partial(os.kill, 0, signal.SIGINT),
                functools.partial(report.atomic_write_text, done, "done"),
            ])
            wait()
            print("waited:", done.read_text())
        """),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "waited: done" in proc.stdout and "server gone" in proc.stdout, proc.stdout + proc.stderr


ABANDONED = """
try:
    with report.plots_in_background() as draw:
        draw(functools.partial(time.sleep, 3600))  # a plot that does not end
        raise KeyboardInterrupt
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupted_block_abandons_its_plots_on_the_server(tmp_path: Path) -> None:
    """plots_in_background ended by KeyboardInterrupt while a plot never finishes: the block stops
    it instead of waiting for it (it used to wait), and the plot server is gone too."""
    proc = _python(_plot_server_script(ABANDONED), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "interrupted" in proc.stdout and "server gone" in proc.stdout, proc.stdout + proc.stderr


def test_an_interrupted_block_abandons_its_forked_plots(tmp_path: Path) -> None:
    """The same without a plot server (the plot forked from this process): it is killed and reaped."""
    code = f"""
import functools, os, time
from pacectl import report
report.can_fork = lambda: True
{ABANDONED}
try:
    os.waitpid(-1, os.WNOHANG)
    print("a child left")
except ChildProcessError:
    print("no child left")
"""
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "interrupted" in proc.stdout and "no child left" in proc.stdout, proc.stdout + proc.stderr


def test_remove_tree_finishes_through_a_second_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """files.remove_tree: a KeyboardInterrupt during the removal (a second Ctrl-C) does not leave the
    folder; it is raised once the folder is gone."""
    import shutil

    from pacectl.files import remove_tree

    folder = tmp_path / "stage"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("a")
    real, calls = shutil.rmtree, []

    def interrupted_once(path: Any, *a: Any, **k: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        remove_tree(folder)
    assert not folder.exists() and len(calls) == 2


def test_staged_outputs_leaves_nothing_on_an_interrupt(tmp_path: Path) -> None:
    """A block ended by KeyboardInterrupt: no staging folder, and no output folder."""
    out = tmp_path / "new" / "run"
    with pytest.raises(KeyboardInterrupt), staged_outputs(out) as stage:
        (stage / "summary.json").write_text("{}")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_staging_folder_is_removed_not_moved_in(tmp_path: Path) -> None:
    """A staging folder left by a process that is gone (``kill -9``) is removed by the next run into
    the folder and none of its files is moved in; a live process's staging folder stays."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process (until the system reuses it)
    out = tmp_path / "run"
    host = files._host()
    stale = out / f".run.staging-{gone.pid}-{host}-abc123"
    live = out / f".run.staging-{os.getppid()}-{host}-def456"
    elsewhere = out / f".run.staging-{gone.pid}-another.host-ghi789"  # its pid means nothing here
    for folder in (stale, live, elsewhere):
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text("stale")
    with staged_outputs(out) as stage:
        (stage / "summary.json").write_text("fresh")
    assert (out / "summary.json").read_text() == "fresh"
    assert not stale.exists() and live.is_dir() and elsewhere.is_dir()
    assert {p.name for p in out.iterdir()} == {"summary.json", live.name, elsewhere.name}
    assert files.committed[-1] == out.absolute()
