"""Outputs of a run directory: ``summary.json``, ``iterations.parquet``, PNG plots and ``report.md``,
and the run's facts in words (:class:`RunSummary`, :func:`context_lines`), worded once for the
console and ``report.md``.

Every writer goes through :func:`pacectl.files.atomic_path`: it writes a hidden temporary file in the target's
directory and ``os.replace``-s it over the target only on success, so a reader (or a crashed run)
never sees a half-written output. Plots use matplotlib's object API (``matplotlib.figure.Figure``,
rendered by the Agg canvas) rather than ``pyplot``, so no global figure state is created or leaked and
the process-wide backend is left alone.

Example:
    >>> import tempfile, pathlib
    >>> from pacectl.metrics import summarize
    >>> from pacectl.testing.episodes import make_episode
    >>> run_dir = pathlib.Path(tempfile.mkdtemp())
    >>> write_summary_json(run_dir / "summary.json", {"none": summarize(make_episode([[0.0, 0.1]]))})
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import pickle
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pacectl.files import atomic_path, atomic_write_text, jsonable
from pacectl.types import Episode

if TYPE_CHECKING:
    import pandas as pd

NULL_MODEL_NOTE = "fixed durations: pacing cannot shorten an iteration"

COLUMNS_NOTE = """Columns: throughput = iterations / total time; Δthroughput against no pacing, ± the 95 % confidence half-width of the \
paired per-iteration difference (batch means, Student's t: its means over blocks of sqrt(n) \
iterations, live runs over the interleave blocks; a change inside it is noise, one outside it is a single run's evidence, to be repeated with other \
seeds); mean and p99 \
iteration time; CV = std / mean of iteration time (population std); spread p50 = median over \
iterations and pacing domains of the arrival spread (latest minus earliest arrival at the paced \
collective; the plot shows the worst domain per iteration); delay total = pacing delay summed over \
ranks and iterations (rank-seconds, so it can exceed the run's wall time); active % = share of \
(iteration, domain) cells whose delays came from an active controller."""

FRAME_COLUMNS = (
    "run",
    "iteration",
    "step_id",
    "rank",
    "domain",
    "arrival_s",
    "applied_delay_s",
    "natural_arrival_s",
    "wait_s",
    "iteration_time_s",
    "pacing_active",
)


# --- summary.json ---------------------------------------------------------------------------------


def write_summary_json(path: str | os.PathLike[str], summary: Mapping[str, Any]) -> None:
    """Write ``summary`` as JSON (sorted keys, indent 2, no NaN) atomically.

    Args:
        path: destination, usually ``<run dir>/summary.json``.
        summary: for example ``{run name: metrics.summarize(episode)}``; passed through :func:`jsonable`.

    Raises:
        TypeError: if the summary holds an object JSON cannot encode (nothing is written).
    """
    text = json.dumps(jsonable(summary), sort_keys=True, indent=2, allow_nan=False) + "\n"
    atomic_write_text(path, text)


# --- iterations.parquet ---------------------------------------------------------------------------


def _episode_frame(run: str, ep: Episode) -> pd.DataFrame:
    import pandas as pd

    num_iterations, num_ranks = ep.num_iterations, ep.num_ranks
    iteration = np.repeat(np.arange(num_iterations, dtype=np.int64), num_ranks)
    return pd.DataFrame(
        {
            "run": np.full(num_iterations * num_ranks, run, dtype=object),
            "iteration": iteration,
            "step_id": np.asarray(ep.step_ids, np.int64)[iteration],
            "rank": np.tile(np.asarray(ep.rank_labels, np.int64), num_iterations),
            "domain": np.tile(np.asarray(ep.domain_of_rank, np.int64), num_iterations),
            "arrival_s": np.asarray(ep.arrival_s, np.float64).reshape(-1),
            "applied_delay_s": np.asarray(ep.applied_delay_s, np.float64).reshape(-1),
            "natural_arrival_s": np.asarray(ep.natural_arrival_s, np.float64).reshape(-1),
            "wait_s": np.asarray(ep.wait_s, np.float64).reshape(-1),
            # several jobs on one fabric: each rank's own job's k-th iteration
            "iteration_time_s": (
                np.asarray(ep.iteration_time_s, np.float64)[iteration]
                if ep.domain_iteration_time_s is None
                else np.asarray(ep.domain_iteration_time_s, np.float64)[:, ep.domain_of_rank].reshape(-1)
            ),
            "pacing_active": np.asarray(ep.pacing_active, np.bool_)[:, ep.domain_of_rank].reshape(-1),
        },
        columns=list(FRAME_COLUMNS),
    )


def episodes_to_frame(episodes: Mapping[str, Episode]) -> pd.DataFrame:
    """Long table of several runs: one row per (run, iteration, rank).

    Args:
        episodes: run name (for example ``"none"``, ``"threshold"``) -> episode.

    Returns:
        A DataFrame with columns ``run`` (str), ``iteration`` (int64, 0-based), ``step_id`` (int64),
        ``rank`` (int64 global rank label), ``domain`` (int64 domain index), ``arrival_s``,
        ``applied_delay_s``, ``natural_arrival_s``, ``wait_s``, ``iteration_time_s`` (float64,
        seconds) and ``pacing_active`` (bool, the rank's domain); ``sum(num_iterations * num_ranks)``
        rows, ordered by run, then iteration, then rank index.
    """
    import pandas as pd

    if not episodes:  # the columns and their dtypes, no rows
        ints = dict.fromkeys(("iteration", "step_id", "rank", "domain"), np.int64)
        dtypes = {"run": object, "pacing_active": np.bool_, **ints}
        return pd.DataFrame({c: np.zeros(0, dtypes.get(c, np.float64)) for c in FRAME_COLUMNS})
    return pd.concat([_episode_frame(run, ep) for run, ep in episodes.items()], ignore_index=True)


def write_iterations_parquet(path: str | os.PathLike[str], episodes: Mapping[str, Episode]) -> None:
    """Write :func:`episodes_to_frame` of ``episodes`` to a Parquet file atomically (pyarrow engine).

    Args:
        path: destination, usually ``<run dir>/iterations.parquet``.
        episodes: run name -> episode.
    """
    frame = episodes_to_frame(episodes)
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, engine="pyarrow", index=False)


# --- plots ----------------------------------------------------------------------------------------


TIMING_DEPENDENT_NOTE = "timing-dependent durations: pacing can shorten or lengthen an iteration"


def comm_model_note(comm_model: str, timing_dependent: bool | None = None) -> str:
    """Human-readable line naming the communication model, e.g. for plot titles and tables.

    Fixed-duration (max-plus) models say that pacing cannot shorten an iteration; the others that
    durations depend on timing, the only way a gain can arise.

    Args:
        comm_model: the model's name.
        timing_dependent: whether durations depended on timing in the run (``comm_timing_dependent``
            of an episode or summary: ``contention`` on a profile with nothing to vary its rate is
            fixed-duration); None judges by the name (:data:`~pacectl.fabric.base.FIXED_DURATION_MODELS`).

    Example:
        >>> comm_model_note("null")
        'comm model: null (fixed durations: pacing cannot shorten an iteration)'
        >>> comm_model_note("contention")
        'comm model: contention (timing-dependent durations: pacing can shorten or lengthen an iteration)'
        >>> comm_model_note("contention", timing_dependent=False)
        'comm model: contention (fixed durations: pacing cannot shorten an iteration)'
    """
    from pacectl.fabric.base import is_timing_dependent

    if comm_model == "unknown":
        return "comm model: unknown"
    if not is_timing_dependent(comm_model, timing_dependent):
        return f"comm model: {comm_model} ({NULL_MODEL_NOTE})"
    return f"comm model: {comm_model} ({TIMING_DEPENDENT_NOTE})"


def _models_note(models: list[tuple[str, bool | None]]) -> str:
    """One note for several runs: (comm model name, timing-dependent flag or None) per run."""
    unique = list(dict.fromkeys(models))
    if len(unique) == 1:
        return comm_model_note(*unique[0])
    names = list(dict.fromkeys(name for name, _ in unique))
    return "comm models: " + ", ".join(names) if names else "comm model: unknown"


def _episode_models(episodes: Mapping[str, Episode]) -> list[tuple[str, bool | None]]:
    return [(ep.comm_model, ep.comm_timing_dependent) for ep in episodes.values()]


def _summary_models(summaries: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, bool | None]]:
    return [(str(s.get("comm_model", "unknown")), s.get("comm_timing_dependent")) for s in summaries.values()]


def save_figure(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write a matplotlib figure as PNG (110 dpi), atomically: a reader never sees half a file."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def draw_in_background(jobs: Sequence[Callable[[], Any]], *, fork: bool | None = None) -> Pending:
    """Start each plotting job in a forked child process; return ``wait()``, which blocks until all
    are done and raises if one failed.

    The plots are drawn while the caller writes its other outputs, and beside each other on a
    machine with spare cores: a run's wall time has the slowest plot in it, not their sum. Each
    child runs exactly the code the caller would (same inputs), so every file is the one it would
    have drawn itself. Where this process started a :func:`plot_server` and the jobs pickle
    (``functools.partial`` of a module-level plot function), the children are forked from that
    server, which has matplotlib imported already; otherwise from this process (copied on write),
    after importing matplotlib here. Where :func:`can_fork` is False the jobs run inline, now.

    Args:
        jobs: callables that each write their files (atomically, e.g. :func:`save_figure`).
        fork: True or False to force either way where ``os.fork`` exists; None: as above.

    Returns:
        ``wait()``, a :class:`Pending` (its ``RuntimeError`` holds the failed job's traceback).
    """
    server = _server if _server is not None and _server.owner == os.getpid() and not _server.gone else None
    inline = server is None and not can_fork()  # the server forks from its own state (no torch)
    if fork is not None and hasattr(os, "fork"):
        inline = not fork
    if inline or len(jobs) == 0:
        for job in jobs:
            job()
        return Pending(lambda: None)
    if server is not None:
        message = _job_message(jobs)
        if message is not None:
            return Pending(server.submit(message), server.abandon)
    # imported once here, not once per child (each child would pay the import on its own core)
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    children = _fork_jobs(jobs)

    def wait() -> None:
        errors = _collect(children)
        if errors:
            raise RuntimeError(f"drawing a plot failed: {errors[0]}")

    def abandon() -> None:
        while children:  # reaped: none of them writes anything any more
            _kill_and_reap(*children.pop())

    return Pending(wait, abandon)


class Pending:
    """The plots that :func:`draw_in_background` started: call it to wait for them (it raises
    ``RuntimeError`` naming the first failed plot's error); :meth:`abandon` stops them instead."""

    def __init__(self, wait: Callable[[], None], abandon: Callable[[], None] = lambda: None) -> None:
        self._wait, self._abandon = wait, abandon

    def __call__(self) -> None:
        self._wait()

    def abandon(self) -> None:
        """Stop the plots (an interrupted caller): when it returns no plot process of theirs is left
        (a plot cut short may leave its temporary file, in the staging folder the caller removes)."""
        self._abandon()


@contextmanager
def plots_in_background() -> Iterator[Callable[..., None]]:
    """Yield ``draw(*jobs)``, which starts ``jobs`` at once (:func:`draw_in_background`); at the end
    of the block wait for every plot started in it, raising if one failed. A block that raises an
    error waits for them too (so none writes into a staging folder that is being removed), ignoring
    their errors, and raises its own; a block ended by ``KeyboardInterrupt`` (or another
    ``BaseException``) abandons them instead (:meth:`Pending.abandon`: every plot process is gone
    when it returns) and raises it."""
    waits: list[Pending] = []

    def draw(*jobs: Callable[[], Any]) -> None:
        waits.append(draw_in_background(jobs))

    try:
        yield draw
    except Exception:
        for wait in waits:
            with contextlib.suppress(Exception):
                wait()
        raise
    except BaseException:  # a Ctrl-C (SIGTERM in pacectl.run): stop the plots, do not wait for them
        for wait in waits:
            wait.abandon()
        raise
    try:
        for wait in waits:
            wait()
    except BaseException:  # a Ctrl-C while waiting, or a failed plot: none of the others goes on
        for wait in waits:
            wait.abandon()
        raise


def _job_message(jobs: Sequence[Callable[[], Any]]) -> bytes | None:
    """``jobs`` pickled for the plot server, or None where they do not pickle (a lambda, a closure)
    or exceed :data:`SERVER_MAX_BYTES` (then a child forked from this process shares its memory)."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        head = pickle.dumps(list(jobs), protocol=5, buffer_callback=buffers.append)  # arrays not copied
    except Exception:  # noqa: BLE001 - pickling fails in many ways (PicklingError, AttributeError, TypeError)
        return None
    if len(head) + sum(b.raw().nbytes for b in buffers) > SERVER_MAX_BYTES:
        return None
    return pickle.dumps(list(jobs), protocol=5)


def can_fork() -> bool:
    """Whether this process may fork workers: ``os.fork`` exists, torch is not imported (its threads
    do not survive a fork) and ``PACECTL_PLOTS_INLINE=1`` is not set (no child processes at all:
    the plots and the what-if beside the runs are then computed in this process)."""
    return (
        hasattr(os, "fork") and "torch" not in sys.modules and os.environ.get("PACECTL_PLOTS_INLINE") != "1"
    )


def _fork_jobs(jobs: Sequence[Callable[[], Any]]) -> list[tuple[int, int]]:
    """Fork one child per job; each runs its job and writes its traceback (if it fails) into a
    pipe. Returns (pid, read end of its pipe) per child."""
    children: list[tuple[int, int]] = []
    for job in jobs:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: draw, report a failure through the pipe, never return
            code = 0
            try:
                os.close(read_fd)
                job()
            except BaseException:
                import traceback

                os.write(write_fd, traceback.format_exc().encode(errors="replace")[-_ERROR_BYTES:])
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        children.append((pid, read_fd))
    return children


def _collect(children: list[tuple[int, int]]) -> list[str]:
    """Wait for the children of :func:`_fork_jobs`; the error of each that failed."""
    errors = []
    while children:  # each one reaped is taken off the list (a second call, abandon, skips it)
        pid, read_fd = children[0]
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        children.pop(0)
        if status != 0:
            errors.append(message or f"plot process {pid} ended with status {status}")
    return errors


class Beside:
    """``compute()`` in a forked child, started now; :meth:`result` returns its value.

    For work that another core can do while this process goes on (``pacectl.run``'s what-if
    replays beside the runs). The value comes back pickled; it is None where the child raised,
    warned or logged (its log records are counted and dropped, not printed), or where the value
    does not pickle: the caller then computes it itself, so that what it raises, warns and logs
    comes out in this process as ever. Start it only where :func:`can_fork`.
    """

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.read, write = os.pipe()
        self.pid: int | None = os.fork()
        if self.pid == 0:  # the child: compute, send, never return
            code = 1
            try:
                os.close(self.read)
                _write_message(write, pickle.dumps(_quietly(compute)))
                code = 0
            except BaseException:  # noqa: BLE001 - the parent reads nothing and computes it itself
                pass
            finally:
                os._exit(code)
        os.close(write)

    def result(self) -> Any:
        """Wait for the child; its value, or None (see the class)."""
        if self.pid is None:
            return None
        with os.fdopen(self.read, "rb") as pipe:
            data = _read_message(pipe.fileno())
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        return pickle.loads(data) if status == 0 and data is not None else None

    def close(self) -> None:
        """Stop the child if :meth:`result` was not called (the caller failed first) and reap it."""
        if self.pid is not None:
            _kill_and_reap(self.pid, self.read)
            self.pid = None


def _kill_and_reap(pid: int, read_fd: int) -> None:
    """Kill a forked child (SIGKILL), close the read end of its pipe unread and reap it; each step
    may find it done already."""
    import signal

    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.close(read_fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _quietly(compute: Callable[[], Any]) -> Any:
    """``compute()``, or None where it warned or logged (in a child of :class:`Beside`)."""
    import logging
    import warnings

    records: list[logging.LogRecord] = []
    logging.Logger.handle = lambda self, record: records.append(record)  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = compute()
    return None if caught or records else value


#: A failed plot's traceback is cut to its last this many bytes (a batch's result message then
#: fits one atomic pipe write, ``PIPE_BUF`` >= 4,096 bytes on Linux).
_ERROR_BYTES = 3000
#: Plot jobs pickled larger than this are forked from the calling process instead of the plot
#: server (sending them would cost more than matplotlib's import).
SERVER_MAX_BYTES = 64 << 20
#: What the plot server imports before it waits for jobs: the plot functions' modules.
PLOT_MODULES = (
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "pacectl.metrics",
    "pacectl.energy",
    "pacectl.whatif",
)


@contextmanager
def plot_server(enabled: bool = True) -> Iterator[None]:
    """Within the block, :func:`draw_in_background` forks its plots from a process started now.

    The server is forked at once and imports matplotlib and the plot functions' modules
    (:data:`PLOT_MODULES`; none of them imports pandas or the replay) while this process composes
    its config and computes: a command's plots then start drawing as soon as their inputs exist,
    without matplotlib's import on the command's critical path. It receives each batch of plots as a
    pickle, forks one child per plot from its warm state and reports each batch's errors back.
    Nothing is started where :func:`can_fork` or ``enabled`` is False; a nested call keeps the outer
    server.
    The server ends with the block (or, if this process dies, when its pipe closes).
    """
    global _server
    if not enabled or not can_fork() or _server is not None:
        yield
        return
    _server = _PlotServer(PLOT_MODULES)
    try:
        yield
    finally:
        server, _server = _server, None
        server.close()


#: The plot server of :func:`plot_server`, while its block runs.
_server: _PlotServer | None = None


class _PlotServer:
    """The process of :func:`plot_server` and its two pipes (batches in, results out)."""

    def __init__(self, modules: Sequence[str]) -> None:
        cmd_r, self.cmd = os.pipe()
        self.res, res_w = os.pipe()
        self.owner = os.getpid()
        self.batches = 0
        self.results: dict[int, list[str]] = {}
        self.gone = False  # abandoned (:meth:`abandon`): the server and its plots are gone
        self.pid = os.fork()
        if self.pid == 0:
            code = 0
            try:
                os.close(self.cmd)
                os.close(self.res)
                _serve(cmd_r, res_w, modules)
            except BaseException:  # noqa: BLE001 - the parent reads a closed pipe: "plot server ended"
                code = 1
            finally:
                os._exit(code)
        os.close(cmd_r)
        os.close(res_w)
        self.outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._send, name="pacectl-plot-server", daemon=True)
        self.writer.start()

    def submit(self, message: bytes) -> Callable[[], None]:
        """Send one batch (a pickled list of jobs); return its ``wait()``."""
        batch = self.batches
        self.batches += 1
        self.outbox.put(batch.to_bytes(8, "little") + message)

        def wait() -> None:
            while batch not in self.results:
                data = None if self.gone else _read_message(self.res)
                if data is None:
                    raise RuntimeError("drawing a plot failed: the plot server process ended early")
                done, errors = pickle.loads(data)
                self.results.setdefault(done, errors)  # a handler's own word before the server's
            errors = self.results.pop(batch)
            if errors:
                raise RuntimeError(f"drawing a plot failed: {errors[0]}")

        return wait

    def abandon(self) -> None:
        """Stop every batch (an interrupted caller): the server kills each batch's processes and
        exits; this returns at the end of the results pipe, which every one of them held open, so
        that none of them is left to write a file. Later plots are forked from this process."""
        if self.gone:
            return
        self.gone = True
        self.outbox.put(_ABANDON)
        with contextlib.suppress(OSError):
            while os.read(self.res, 1 << 16):  # whatever is read (results, a message cut short) is dropped
                pass

    def _send(self) -> None:
        """The writer thread: a batch larger than the pipe's buffer waits there until the server,
        still importing, reads it, and this process computes on meanwhile."""
        while True:
            message = self.outbox.get()
            try:
                _write_message(self.cmd, message)
            except OSError:  # the server is gone: wait() says so
                return
            if not message or message == _ABANDON:
                return

    def close(self) -> None:
        """Stop the server (an explicit message: a forked copy of this process may hold the pipe
        open) and wait for it."""
        self.outbox.put(b"")
        self.writer.join()
        for fd in (self.cmd, self.res):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _serve(cmd_r: int, res_w: int, modules: Sequence[str]) -> None:
    """The plot server's loop: import ``modules`` (in order, while no batch waits), and fork one
    handler per batch received (it forks a child per plot, :func:`_fork_jobs`, and writes the
    batch's errors back).

    The server and every process it forks ignore SIGINT: a Ctrl-C goes to the terminal's whole
    process group, and the parent decides (it sends :data:`_ABANDON` when it is interrupted, and
    its block ends the server). Each handler leads its own process group, so that the abandon
    message kills it with its plots (``killpg``); the server then exits. A handler that ends
    without writing its result (killed) is reported by the server, from its exit status (reaped
    on SIGCHLD), so that the parent's ``wait()`` never waits for a result that cannot come.
    """
    import importlib
    import select
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the parent; its block ends this
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler: its wakeup byte ends select()
    signal.set_wakeup_fd(wake_w)
    pending = list(modules)
    handlers: dict[int, int] = {}  # pid -> its batch

    def reap() -> None:
        while handlers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            batch = handlers.pop(pid, None)
            if batch is not None and status != 0:  # no result from it: say so (the parent waits)
                why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {status >> 8}"
                error = f"the plot process {pid} of batch {batch} ended with {why} without a result"
                _write_message(res_w, pickle.dumps((batch, [error])))

    while True:
        ready = select.select([cmd_r, wake_r], [], [], 0 if pending else None)[0]
        if wake_r in ready:
            os.read(wake_r, 1 << 12)
            reap()
            continue
        if pending and not ready:  # imported while no batch waits
            with contextlib.suppress(ImportError):  # a job that needs it reports the error
                importlib.import_module(pending.pop(0))
            continue
        message = _read_message(cmd_r)
        if not message:  # the stop message, or the parent is gone
            break
        if message == _ABANDON:  # the parent was interrupted: its plots are not wanted
            for pid in handlers:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            break
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.setpgid(0, 0)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w, cmd_r):
                    os.close(fd)
                batch = int.from_bytes(message[:8], "little")
                try:
                    errors = _collect(_fork_jobs(pickle.loads(message[8:])))
                except BaseException:
                    import traceback

                    errors = [traceback.format_exc()[-_ERROR_BYTES:]]
                first = [
                    e.encode(errors="replace")[-_ERROR_BYTES:].decode(errors="replace") for e in errors[:1]
                ]
                _write_message(res_w, pickle.dumps((batch, first)))
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        with contextlib.suppress(OSError):  # also here: killpg must find its group at once
            os.setpgid(pid, pid)
        handlers[pid] = int.from_bytes(message[:8], "little")
    signal.set_wakeup_fd(-1)
    for pid in handlers:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


#: The message that abandons every batch (:meth:`_PlotServer.abandon`); a batch's message is longer.
_ABANDON = b"\xff" * 8


def _write_message(fd: int, data: bytes) -> None:
    """Write ``data`` length-prefixed, in one ``os.write`` where it fits a pipe's atomic write."""
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_message(fd: int) -> bytes | None:
    """Read one message of :func:`_write_message`, or None at the end of the pipe."""
    head = _read_exactly(fd, 8)
    return None if head is None else _read_exactly(fd, int.from_bytes(head, "little"))


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def plot_iteration_time(
    path: str | os.PathLike[str],
    episodes: Mapping[str, Episode],
    baseline: str = "none",
    *,
    time_unit: str = "s",
) -> Any:
    """Plot iteration time over iterations (top) and its difference to the baseline run (bottom), PNG.

    Runs often coincide on most iterations, so the bottom panel shows where pacing gained (< 0) or
    cost (> 0) time against no pacing.

    Args:
        path: destination PNG.
        episodes: run name (baseline ``"none"`` and each controller) -> episode.
        baseline: the run the bottom panel subtracts.
        time_unit: the axis unit: ``"s"``, or e.g. ``"arbitrary s"`` for a normalised trace that records
            no real time (the title then says so).

    Returns:
        The matplotlib ``Figure`` (already saved).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 6.0))
    _fixed_margins(fig, top_in=0.75, hspace=0.08)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    base = episodes.get(baseline)
    for run, ep in episodes.items():
        x = np.arange(ep.num_iterations)
        style = {"color": "black", "lw": 2.0, "zorder": 1} if run == baseline else {"lw": 1.0, "alpha": 0.85}
        top.plot(x, ep.iteration_time_s, label=run, **style)
        if base is not None and run != baseline and ep.num_iterations == base.num_iterations:
            bottom.plot(x, ep.iteration_time_s - base.iteration_time_s, lw=1.0, label=run)
    top.set_ylabel(f"iteration time ({time_unit})")
    top.set_title(f"Iteration time per run{_unit_note(time_unit)}\n{_models_note(_episode_models(episodes))}")
    if episodes:
        top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    bottom.axhline(0.0, color="black", lw=1.0)
    bottom.set_xlabel("iteration")
    bottom.set_ylabel(f"minus {baseline} ({time_unit})")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    _fit_side_margins(fig, (top, bottom))
    save_figure(fig, path)
    return fig


def _fixed_margins(fig: Any, *, top_in: float, hspace: float, bottom_in: float = 0.5) -> None:
    """Place ``fig``'s subplots with fixed top and bottom margins, in inches (room for the titles
    above and the x label below), instead of ``layout="constrained"``: that engine measures every
    panel's ticks and legends, twice, before drawing, and the plots are on the main job's critical
    path (``experiments/bench/README.md``, "Whole commands"). The left and right margins are
    set from the drawn labels by :func:`_fit_side_margins` once the panels are filled in.
    """
    height = fig.get_size_inches()[1]
    fig.subplots_adjust(
        left=0.1, right=0.8, top=1.0 - top_in / height, bottom=bottom_in / height, hspace=hspace
    )


def _fit_side_margins(fig: Any, axes: Sequence[Any], *, pad_in: float = 0.08) -> None:
    """Set ``fig``'s left and right margins so that ``axes``' tick labels, y labels and outside legends
    fit in the figure with ``pad_in`` inches to spare: each of ``axes`` is measured once (a panel
    per distinct set of y ticks and legend entries is enough; panels that share both need not be
    measured again)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    left = right = 0.0
    for ax in axes:
        inner, outer = ax.get_window_extent(renderer), ax.get_tightbbox(renderer)
        left, right = max(left, inner.x0 - outer.x0), max(right, outer.x1 - inner.x1)
    width = fig.get_size_inches()[0] * fig.dpi
    pad = pad_in * fig.dpi
    fig.subplots_adjust(left=(left + pad) / width, right=1.0 - (right + pad) / width)


def _fit_row_margins(fig: Any, row: Sequence[Any], *, top_in: float, pad_in: float = 0.08) -> None:
    """Place a row of panels (``row``, left to right, one gridspec row) so that every label, tick
    label and legend outside them fits in ``fig``, measured once each from the drawn artists (as
    :func:`_fit_side_margins`; a fixed top margin of ``top_in`` inches for the suptitle)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    boxes = [(ax.get_window_extent(renderer), ax.get_tightbbox(renderer)) for ax in row]
    width, height = fig.get_size_inches() * fig.dpi
    pad = pad_in * fig.dpi
    left = boxes[0][0].x0 - boxes[0][1].x0 + pad
    right = boxes[-1][1].x1 - boxes[-1][0].x1 + pad
    bottom = max(inner.y0 - outer.y0 for inner, outer in boxes) + pad
    gaps = [a[1].x1 - a[0].x1 + b[0].x0 - b[1].x0 + pad for a, b in zip(boxes, boxes[1:], strict=False)]
    gap = max(gaps, default=0.0)
    mean_axes = (width - left - right - gap * len(gaps)) / len(row)  # gridspec's wspace unit
    fig.subplots_adjust(
        left=left / width,
        right=1.0 - right / width,
        bottom=bottom / height,
        top=1.0 - top_in * fig.dpi / height,
        wspace=gap / mean_axes,
    )


def _unit_note(time_unit: str) -> str:
    return "" if time_unit == "s" else f" (times in {time_unit}: not real time)"


def plot_spread(
    path: str | os.PathLike[str], episodes: Mapping[str, Episode], *, time_unit: str = "s"
) -> Any:
    """Plot arrival spread over iterations, one subplot per run, with pacing activity shaded (PNG, atomic).

    Each subplot shows the spread of the paced arrivals (solid) and of the natural, unpaced arrivals
    (dashed), both taken as the maximum over domains in each iteration (the worst domain, which
    sets the iteration's pace). Iterations in which any domain's controller reported ``active``
    are shaded.

    Args:
        path: destination PNG.
        episodes: run name -> episode.
        time_unit: the axis unit (see :func:`plot_iteration_time`).

    Returns:
        The matplotlib ``Figure`` (already saved).
    """
    from matplotlib.figure import Figure

    from pacectl import metrics

    num_runs = max(len(episodes), 1)
    fig = Figure(figsize=(9.0, 2.4 * num_runs + 0.8))
    _fixed_margins(fig, top_in=0.95, hspace=0.3)
    axes = np.atleast_1d(fig.subplots(num_runs, 1, sharex=True, sharey=True, squeeze=False)[:, 0])
    top = 0.0  # the shared axis must reach every run's largest spread, not the first panel's
    for ax, (run, ep) in zip(axes, episodes.items(), strict=False):
        x = np.arange(ep.num_iterations)
        if ep.num_iterations:
            paced, natural = metrics.spread_s(ep).max(axis=1), metrics.natural_spread_s(ep).max(axis=1)
            both = np.concatenate([paced, natural])
            top = float(np.max(both, initial=top, where=np.isfinite(both)))
            ax.plot(x, paced, lw=1.0, label="spread (paced)")
            ax.plot(x, natural, lw=0.8, ls="--", label="spread (natural)")
            active = np.asarray(ep.pacing_active, np.bool_).any(axis=1)
            # one shaded band per run of active iterations, each iteration k covering [k - 0.5, k + 0.5]
            edges = np.flatnonzero(np.diff(np.concatenate(([0], active.astype(np.int8), [0]))))
            for i, (lo, hi) in enumerate(zip(edges[::2], edges[1::2], strict=True)):
                ax.axvspan(
                    lo - 0.5,
                    hi - 0.5,
                    color="tab:orange",
                    alpha=0.15,
                    lw=0,
                    label="pacing active" if i == 0 else None,
                )
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        ax.set_title(f"{run} (controller: {ep.controller})", fontsize="medium")
        ax.set_ylabel(f"worst-domain spread ({time_unit})")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0.0, top * 1.05 if top > 0 else 1.0)  # shared by every panel (sharey)
    axes[-1].set_xlabel("iteration")
    fig.suptitle(f"Arrival spread per run{_unit_note(time_unit)}\n{_models_note(_episode_models(episodes))}")
    # the panels share their y ticks and their legends' texts: the fullest legend sets the right margin
    _fit_side_margins(fig, [max(axes, key=lambda ax: len(ax.get_legend().texts) if ax.get_legend() else 0)])
    save_figure(fig, path)
    return fig


def plot_energy(
    path: str | os.PathLike[str],
    summaries: Mapping[str, Mapping[str, Any]],
    baseline: str = "none",
    *,
    bound_j: float | None = None,
) -> Any:
    """Plot each run's energy per iteration by state (left) and its energy change against its
    throughput change (right), PNG, atomically. The title names the power profile.

    Args:
        path: destination PNG.
        summaries: run name -> summary with the energy fields of :func:`pacectl.energy.summarize_energy`.
        baseline: the run the changes are measured against.
        bound_j: the oracle bound (joules over the run), drawn as the energy no pacing would need
            with it removed.

    Returns:
        The matplotlib ``Figure`` (already saved).
    """
    from matplotlib.figure import Figure

    from pacectl.energy import STATE_LABELS

    runs = [r for r, s in summaries.items() if "energy_by_state_j" in s]
    fig = Figure(figsize=(11.0, 0.45 * len(runs) + 2.6))
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    y = np.arange(len(runs))
    offset = np.zeros(len(runs))
    for state, label in STATE_LABELS.items():
        per_it = np.array(
            [
                summaries[r]["energy_by_state_j"][state] / max(int(summaries[r].get("num_iterations", 1)), 1)
                for r in runs
            ]
        )
        if not per_it.any():
            continue
        left.barh(y, per_it / 1e3, left=offset, label=label)
        offset += per_it / 1e3
    base = summaries.get(baseline)
    if base is not None and bound_j is not None and "energy_total_j" in base:
        n = max(int(base.get("num_iterations", 1)), 1)
        left.axvline(
            (base["energy_total_j"] - bound_j) / n / 1e3,
            color="black",
            ls="--",
            lw=1.0,
            label="no pacing minus the oracle bound",
        )
    left.set_yticks(y, runs)
    left.invert_yaxis()
    left.set_xlabel("energy per iteration, all ranks (kJ)")
    left.legend(
        loc="upper left", bbox_to_anchor=(0.0, -0.08 - 0.6 / max(len(runs), 1)), ncol=3, fontsize="x-small"
    )
    left.grid(alpha=0.3, axis="x")
    if base is not None and base.get("energy_total_j"):
        for r in runs:
            if r == baseline:
                continue
            s = summaries[r]
            de = 100.0 * (s["energy_total_j"] / base["energy_total_j"] - 1.0)
            dt = 100.0 * (s["throughput_it_per_s"] / base["throughput_it_per_s"] - 1.0)
            xerr = 100.0 * float(s.get("throughput_change_ci95_frac") or 0.0)
            yerr = 100.0 * float(s.get("energy_change_ci95_frac") or 0.0)
            right.errorbar(
                dt,
                de,
                xerr=xerr if math.isfinite(xerr) else 0,
                yerr=yerr if math.isfinite(yerr) else 0,
                fmt="o",
                capsize=3,
                label=r,
            )
        right.axhline(0.0, color="black", lw=0.8)
        right.axvline(0.0, color="black", lw=0.8)
        if bound_j is not None:
            right.axhline(
                -100.0 * bound_j / base["energy_total_j"],
                color="black",
                ls="--",
                lw=1.0,
                label="oracle bound",
            )
        right.set_xlabel(f"Δthroughput vs {baseline} (%)")
        right.set_ylabel(f"Δenergy vs {baseline} (%)")
        right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
        right.grid(alpha=0.3)
    profile = power_note(summaries).removeprefix("energy: ") or "no energy"
    fig.suptitle(f"Energy per run, {profile}\n{_models_note(_summary_models(summaries))}")
    _fit_row_margins(fig, (left, right), top_in=0.8)
    save_figure(fig, path)
    return fig


# --- tables and report.md -------------------------------------------------------------------------

_TABLE_HEADERS = (
    "run",
    "throughput (it/s)",
    "Δthroughput (%)",
    "mean iter (s)",
    "p99 iter (s)",
    "CV",
    "spread p50 (s)",
    "delay total (s)",
    "active %",
)


def format_value(value: Any, spec: str) -> str:
    """``format(value, spec)`` for a table cell: ``n/a`` for None, NaN and inf; no trailing ``.`` of
    the ``#`` alternate form; a tiny negative that rounds to ``-0.00`` loses its sign, except in a
    signed spec (``+``), where it shows the direction of a change (a null-model replay can only
    lose throughput: ``-0.00``, not ``+0.00``), and an exact zero has no sign (a tie, no gain)."""
    if value is None or (isinstance(value, numbers.Real) and not math.isfinite(float(value))):
        return "n/a"
    text = format(value, spec)
    if float(value) == 0.0:
        text = text.lstrip("+-")
    elif text.startswith("-") and float(text) == 0.0 and "+" not in spec:
        text = text[1:]
    return text[:-1] if text.endswith(".") else text  # "#.4g" keeps 47.00 but would print 3443.


#: the energy columns, shown when the runs carry energy (:mod:`pacectl.energy`)
_ENERGY_HEADERS = ("E/iter (kJ)", "ΔE (%)", "of bound (%)")


def _has_energy(summaries: Mapping[str, Mapping[str, Any]]) -> bool:
    return any("energy_per_iteration_j" in s for s in summaries.values())


def _headers(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    return _TABLE_HEADERS + (_ENERGY_HEADERS if _has_energy(summaries) else ())


def _energy_cells(run: str, s: Mapping[str, Any], base: Mapping[str, Any] | None, baseline: str) -> list[str]:
    """E/iter, its change against no pacing (± the paired interval) and the share of the oracle bound."""
    per_it = s.get("energy_per_iteration_j")
    if run == baseline:
        delta, bound = "baseline", ""
    elif base is None or not base.get("energy_total_j") or s.get("energy_total_j") is None:
        delta, bound = "n/a", "n/a"
    else:
        delta = _change_cell(s["energy_total_j"], base["energy_total_j"], s.get("energy_change_ci95_frac"))
        reached = s.get("oracle_bound_reached_frac")
        bound = format_value(None if reached is None else 100.0 * reached, ".1f")
    return [format_value(None if per_it is None else per_it / 1e3, "#.4g"), delta, bound]


def _change_cell(value: float, ref: float, ci: float | None) -> str:
    """The change of ``value`` against ``ref`` in %, ``+x.xx``, with `` ±y.yy`` where ``ci`` is known."""
    cell = format_value(100.0 * (value / ref - 1.0), "+.2f")
    return cell + f" ±{100.0 * ci:.2f}" if ci is not None and math.isfinite(ci) else cell


#: the cell of a run of several jobs where one figure for all the jobs would mislead (its mean
#: iteration is no job's: 1 / mean iter is not the summed throughput); each job's row has its own
NOT_ONE_JOB = "—"


def _job_rows(
    s: Mapping[str, Any], base: Mapping[str, Any] | None, *, baseline: bool, energy: bool
) -> list[list[str]]:
    """One row per job of a run of several jobs on one fabric (``s["jobs"]``,
    :func:`pacectl.metrics.job_summaries`): its own throughput, change against the same job under no
    pacing, mean and p99 iteration, CV and pacing delay; blank where the figure is the run's."""
    base_jobs = (base or {}).get("jobs", {})
    return [
        [
            f"  job {job}",
            *_throughput_cells(j, base_jobs.get(job, {}).get("throughput_it_per_s"), baseline=baseline),
            *_iteration_cells(j),
            "",
            format_value(j.get("pacing_delay_total_s"), "#.4g"),
            "",
            *(["", "", ""] if energy else []),
        ]
        for job, j in s["jobs"].items()
    ]


def _throughput_cells(s: Mapping[str, Any], ref: float | None, *, baseline: bool) -> list[str]:
    """The throughput of a run or job and its change against ``ref``, the same under no pacing
    (``baseline`` in the baseline's own row, ``n/a`` without a reference)."""
    if baseline:
        delta = "baseline"
    elif not ref:
        delta = "n/a"
    else:  # pacectl.run adds each run's and each job's interval
        delta = _change_cell(s["throughput_it_per_s"], ref, s.get("throughput_change_ci95_frac"))
    return [format_value(s.get("throughput_it_per_s"), "#.4g"), delta]


def _iteration_cells(s: Mapping[str, Any]) -> list[str]:
    """The mean and p99 iteration time and the CV of a run or job."""
    return [
        format_value(s.get("iteration_time_mean_s"), "#.4g"),
        format_value(s.get("iteration_time_p99_s"), "#.4g"),
        format_value(s.get("cv"), "#.3g"),
    ]


def _table_rows(summaries: Mapping[str, Mapping[str, Any]], baseline: str) -> list[list[str]]:
    """The table's rows: one per run; a run of several jobs on one fabric is their sum (``run
    (sum)``: throughput summed, the iteration columns ``—``) followed by a row per job."""
    base = summaries.get(baseline)
    energy = _has_energy(summaries)
    rows = []
    for run, s in summaries.items():
        active = s.get("pacing_active_frac")
        jobs = bool(s.get("jobs"))
        rows.append(
            [
                f"{run} (sum)" if jobs else run,
                *_throughput_cells(s, (base or {}).get("throughput_it_per_s"), baseline=run == baseline),
                *([NOT_ONE_JOB] * 3 if jobs else _iteration_cells(s)),
                format_value(s.get("spread_median_s"), "#.4g"),
                format_value(s.get("pacing_delay_total_s"), "#.4g"),
                format_value(None if active is None else 100.0 * active, ".1f"),
                *(_energy_cells(run, s, base, baseline) if energy else []),
            ]
        )
        if jobs:
            rows += _job_rows(s, base, baseline=run == baseline, energy=energy)
    return rows


def power_note(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The line naming the power profile(s) the runs' energy comes from ("" without energy)."""
    powered = [s for s in summaries.values() if "power_profile" in s]
    if not powered:
        return ""
    profiles = ", ".join(dict.fromkeys(str(s["power_profile"]) for s in powered))
    sources = ", ".join(dict.fromkeys(str(s.get("energy_source", "model")) for s in powered))
    return f"energy: power profile {profiles} ({sources})"


def format_console_table(summaries: Mapping[str, Mapping[str, Any]], baseline: str = "none") -> str:
    """Fixed-width text table of several runs' summaries, one row per run.

    Args:
        summaries: run name -> :func:`pacectl.metrics.summarize` output.
        baseline: run the throughput change is measured against; its row says ``baseline`` and
            every row says ``n/a`` if it is missing.

    Returns:
        A multi-line string: a line naming the comm model, the header, a rule and the rows.

    Example:
        >>> print(format_console_table({"none": {"throughput_it_per_s": 2.0, "comm_model": "null"}}))
        ... # doctest: +ELLIPSIS
        comm model: null (...)
        ...
    """
    rows = _table_rows(summaries, baseline)
    headers = _headers(summaries)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))]).rstrip()

    note = _models_note(_summary_models(summaries))
    power = power_note(summaries)
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([note, *([power] if power else []), line(headers), rule, *(line(r) for r in rows)])


def _markdown_table(summaries: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    headers = _headers(summaries)
    head = "| " + " | ".join(headers) + " |"
    align = "| --- |" + " ---: |" * (len(headers) - 1)
    body = [
        "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in _table_rows(summaries, baseline)
    ]
    return "\n".join([head, align, *body])


#: the plots a run writes beside its report (pacectl.run), linked from report.md when present
PLOT_FILES = {"iteration_time": "iteration_time.png", "spread": "spread.png", "energy": "energy.png"}

ENERGY_NOTE = """Energy columns: E/iter = energy per iteration summed over ranks (kJ), from the power profile named above (the time of every state times its power: compute at its clock, collective transfer, spinning or sleeping wait, pacing sleep, the rest of the iteration); ΔE = the change of total energy against no pacing, ± the same paired batch-means interval as Δthroughput; of bound = the energy saved as a share of the oracle bound (every rank's compute before the paced collective as slow as its slack without pacing allows, the rest slept, at no throughput cost; Perseus's extrinsic bloat at the paced collective). A timing-dependent mechanism (the node power cap) can exceed it."""


def write_report_md(
    path: str | os.PathLike[str],
    *,
    title: str,
    summaries: Mapping[str, Mapping[str, Any]],
    context: Mapping[str, Any] | Sequence[Sequence[Any]],
    baseline: str = "none",
    plots: Sequence[str] | None = None,
) -> None:
    """Write a short Markdown report atomically: title, comm model note, context lines and the table.

    Args:
        path: destination, usually ``<run dir>/report.md``.
        title: first heading.
        summaries: run name -> :func:`pacectl.metrics.summarize` output.
        context: facts shown as a bullet list: ``(label, line)`` pairs (:func:`context_lines`) or a
            mapping, e.g. ``{"trace": ..., "fidelity_mape": ...}``.
        baseline: run the throughput change is measured against.
        plots: the PNG files that will lie beside the report (linked in :data:`PLOT_FILES` order);
            None: those that are there now (plots drawn in the background are not there yet).
    """
    note = _models_note(_summary_models(summaries))
    parts = [f"# {title}", "", f"_{note}_", ""]
    if context:
        pairs = context.items() if isinstance(context, Mapping) else context
        parts += [f"- **{k}**: {jsonable(v)}" for k, v in pairs] + [""]
    power = power_note(summaries)
    if power:
        parts += [f"_{power}_", ""]
    parts += [_markdown_table(summaries, baseline), "", COLUMNS_NOTE, ""]
    if power:
        parts += [ENERGY_NOTE, ""]
    beside = (
        set(plots)
        if plots is not None
        else {n for n in PLOT_FILES.values() if (Path(path).parent / n).exists()}
    )
    plots = [name for name in PLOT_FILES.values() if name in beside]
    if plots:
        parts += [f"![{name.removesuffix('.png')}]({name})" for name in plots] + [""]
    atomic_write_text(path, "\n".join(parts))


#: Context lines the console prints as they happen (during the run), not again at its end.
PRINTED_LIVE = frozenset({"warnings", "notes", "never paced"})


@dataclass(frozen=True)
class RunSummary:
    """What one ``pacectl.run`` experiment found, built once (:func:`pacectl.run.run_experiment`).

    :meth:`to_json` is ``summary.json``. Its ``context`` is :func:`context_lines`: every fact of
    the run in words, once, as ``[label, line]`` pairs, which ``report.md`` lists and the console
    prints (but for :data:`PRINTED_LIVE`, printed as they happened).

    Attributes:
        described: :meth:`pacectl.experiment.Experiment.describe`: ``trace``, the paced collective,
            ``fidelity``, ``whatif`` and the backend's own fields.
        runs: :func:`pacectl.metrics.summarize` per run, the baseline's under ``baseline``.
        vs_baseline: each other run's changes against the baseline, with their intervals.
        energy: the energy fields (``power``, ``energy_bound``, ``energy_measured``, ...).
        exchange: when decisions reached the ranks (``lag_iters``, ``every_iters``, ``source``).
    """

    described: Mapping[str, Any]
    backend: str
    comm_model: str
    comm_description: str
    comm_timing_dependent: bool
    exchange: Mapping[str, Any]
    runs: Mapping[str, Mapping[str, Any]]
    vs_baseline: Mapping[str, Mapping[str, Any]]
    energy: Mapping[str, Any]
    actuators: Sequence[str]
    controller_params: Mapping[str, Any]
    controller_file: str | None
    cluster: str | None
    seed: int
    warnings: Sequence[str] = ()
    notes: Sequence[str] = ()
    never_paced: str = ""
    wall_time_s: float = 0.0
    records_dir: str | None = None
    baseline: str = "none"

    def to_json(self) -> dict[str, Any]:
        """The fields of ``summary.json``, its ``context`` lines last."""
        out: dict[str, Any] = {**self.described, "warnings": list(self.warnings)}
        if self.notes:
            out["notes"] = list(self.notes)
        if self.never_paced:
            out["never_paced"] = self.never_paced
        out.update(
            backend=self.backend,
            comm_model=self.comm_model,
            comm_model_description=self.comm_description,
            comm_model_timing_dependent=self.comm_timing_dependent,
            exchange=dict(self.exchange),
            baseline=self.baseline,
            runs=dict(self.runs),
            vs_baseline=dict(self.vs_baseline),
            **self.energy,
            actuators=list(self.actuators),
            controller_params=dict(self.controller_params),
            controller_file=self.controller_file,
            cluster=self.cluster,
            seed=self.seed,
        )
        if not self.comm_timing_dependent:
            out["note"] = (
                f"comm model is {self.comm_model} (fixed durations, max-plus): delaying a rank can never "
                "shorten an iteration, so no controller can beat no pacing here; gains need a timing-dependent model."
            )
        if normalized_time(out):
            out["time_unit_note"] = (
                "this trace's times are normalised per job (not real time), scaled by trace.unit_s to "
                "'seconds': every time, throughput and second-based threshold here is on that arbitrary "
                "scale; compare the runs with each other, not with other jobs"
            )
        out["wall_time_s"] = self.wall_time_s
        if self.records_dir is not None:
            out["records_dir"] = self.records_dir
        out["context"] = [list(pair) for pair in context_lines(out)]
        return out


def normalized_time(described: Mapping[str, Any]) -> bool:
    """Whether a run's trace (``described["trace"]``, :meth:`RunSummary.described`) records
    normalised times rather than seconds (the plots then say ``arbitrary s``)."""
    return bool(described.get("trace", {}).get("time_unit") == "normalized")


def context_lines(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every fact of a run's summary in words, once: ``(label, line)`` pairs in reading order.

    Args:
        summary: the fields of ``summary.json`` (:meth:`RunSummary.to_json`, before ``context``).
    """
    trace = summary["trace"]
    if trace.get("format") == "torch-live":  # its path is this run's own record, an output
        lines = [("workload", f"{trace['name']} (record of the no-pacing run: {trace.get('path')})")]
    else:
        lines = [("input", f"{trace['name']} ({trace.get('path') or 'synthetic'})")]
        if trace.get("timing"):
            lines.append(("arrival timing", trace["timing"]))
    lines.append(("comm model", summary["comm_model_description"]))
    if "paced_optype" in summary:
        lines.append(("paced collective", summary.get("paced_collective", summary["paced_optype"])))
    fid = summary.get("fidelity") or {}
    for name, f in (fid.get("by_run", {"": fid}) if fid else {}).items():
        lines.append(
            (
                f"replay fidelity{f' of {name}' if name else ''} (null model)",
                f"{fidelity_figures(f)} of step time: {fid.get('compares', 'replay vs recorded step times')}",
            )
        )
    lines += [(f"replay counterfactual of {name}", line) for name, line in counterfactual_lines(fid).items()]
    if "time_unit_note" in summary:
        lines.append(("time unit", summary["time_unit_note"]))
    if "pacing" in summary:
        lines.append(("live pacing", live_exchange_line(summary["pacing"], summary.get("exchange"))))
    for family, measured in summary.get("measured", {}).items():
        for c in measured.get("runtime_controls", []):
            state = "applied" if c["applied"] else "ignored"
            lines.append(
                (
                    f"runtime control v{c['version']} ({family})",
                    f"{json.dumps(c['control'])} {state} from the decision on iteration {c['observation']}",
                )
            )
        for c in measured.get("runtime_controls_rejected", []):
            lines.append((f"runtime control file ignored ({family}, iteration {c['iteration']})", c["error"]))
    if lag := exchange_line(summary):
        lines.append(("decision lag", lag))
    if summary.get("warnings"):
        lines.append(("warnings", "; ".join(summary["warnings"])))
    if summary.get("never_paced"):
        lines.append(("never paced", summary["never_paced"]))
    if summary.get("notes"):
        lines.append(("notes", "; ".join(summary["notes"])))
    wi = summary.get("whatif")
    if wi:
        lines.append(
            (
                "stragglers' cost (what-if, Lin et al. OSDI'25, null model)",
                f"blocking slowdown S = {wi['blocking_slowdown']:.3f}, ideal mean iteration "
                f"{wi['ideal_iteration_time_mean_s']:.4g} s, M_W = {format_value(wi['m_w'], '.3f')}, "
                f"M_S = {format_value(wi['m_s'], '.3f')}",
            )
        )
    if "energy_bound" in summary:
        lines.append(("energy", energy_line(summary)))
    if "energy_measured" in summary:
        lines.append(("energy (measured)", measured_energy_line(summary)))
    if "note" in summary:
        lines.append(("note", summary["note"]))
    return lines


def fidelity_figures(f: Mapping[str, Any]) -> str:
    """``median x %, p90 y % abs. rel. error``, plus the clipped estimates when there are any.

    A clipped launch or transfer estimate (:func:`pacectl.backends.dag.estimate_intrinsic`) is an op
    whose recorded timing could not be explained by its inputs; a few of them can move the replay
    of their step by tens of %, so the line names them where the error comes from.
    """
    text = (
        f"median {100 * f['step_time_median_abs_err_frac']:.3g} %, "
        f"p90 {100 * f['step_time_p90_abs_err_frac']:.3g} % abs. rel. error"
    )
    clipped = int(f.get("launch_clipped", 0)) + int(f.get("transfer_clipped", 0))
    if clipped:
        text += f" ({clipped} of {f.get('num_op_instances', '?')} op timing estimates clipped)"
    return text


def counterfactual_lines(fidelity: Mapping[str, Any] | None) -> dict[str, str]:
    """Per paced live run, its counterfactual check as one line (empty for replay and simulation).

    See :func:`pacectl.torchdist.core.counterfactual_error` for the fields.
    """
    out = {}
    for name, f in (fidelity or {}).get("by_run", {}).items():
        c = f.get("counterfactual_vs_live_none")
        if not c:
            continue
        line = (
            f"its record replayed with zero delays vs the live no-pacing run: mean iteration "
            f"{100 * c['mean_err_frac']:+.3g} %"
        )
        if "predicted_pacing_effect_s" in c:
            line += (
                f"; pacing effect per iteration predicted {1e3 * c['predicted_pacing_effect_s']:+.3g} ms, "
                f"live {1e3 * c['live_pacing_effect_s']:+.3g} ms (one job, no interval: single jobs "
                "scatter by a few ms, experiments/live_fidelity)"
            )
        out[name] = line
    return out


def exchange_line(summary: Mapping[str, Any]) -> str:
    """When decisions reached the ranks, in words; empty for the default (the next iteration)."""
    ex = summary.get("exchange") or {}
    lag, every = int(ex.get("lag_iters", 1)), int(ex.get("every_iters", 1))
    if (lag, every) == (1, 1):
        return ""
    batch = f", figures exchanged {every} iterations at a time" if every > 1 else ""
    return f"a decision on iteration k paces from iteration k + {lag}{batch} ({ex.get('source', '')})"


def live_exchange_line(pacing: Mapping[str, Any], exchange: Mapping[str, Any] | None) -> str:
    """How a live run exchanged its figures and when decisions paced, in words."""
    limit = pacing.get("piggyback_max_bytes")
    gather = pacing.get("gather_resolved", pacing.get("gather"))
    beside = (
        f" (beside carrier buckets over {limit} bytes)" if limit is not None and gather == "piggyback" else ""
    )
    chosen = " (gather=auto)" if pacing.get("gather") == "auto" else ""
    lag = f"; a decision on iteration k paces k + {exchange['lag_iters']}" if exchange else ""
    return f"figures exchanged by {gather!r}{chosen}{beside}{lag}"


def measured_energy_line(summary: Mapping[str, Any]) -> str:
    """A live run's measured energy (or its CPU-time proxy) per iteration, per run, in words."""
    from pacectl.energy import MEASURED_SOURCES

    source = summary["energy_measured"]["source"]
    quantity, unit, what = MEASURED_SOURCES[source]
    parts = []
    for name, s in summary["runs"].items():
        value = s.get(f"{quantity}_per_iteration_{unit}")
        if value is None:
            continue
        text = f"{name} {value:.4g} {'J' if unit == 'j' else 'CPU-s'}"
        vs = summary["vs_baseline"].get(name, {})
        change = vs.get(f"{quantity}_change_frac")
        if change is not None:
            ci = vs.get(f"{quantity}_change_ci95_frac")
            interval = f" ±{100 * ci:.2f}" if ci is not None and ci == ci else ""
            text += f" ({100 * change:+.2f} %{interval})"
        parts.append(text)
    return f"per iteration, all ranks: {', '.join(parts)}; {what}"


def energy_line(summary: Mapping[str, Any]) -> str:
    """The energy context in words: the power profile, the oracle bound and the assumed spin power."""
    power, bound = summary.get("power") or {}, summary["energy_bound"]
    return (
        f"power profile {power.get('name')} ({power.get('gpu')}: compute {power.get('compute_w_at_max_clock'):g} W "
        f"at {power.get('max_clock_mhz'):g} MHz, spinning wait {power.get('spin_w'):g} W, sleep "
        f"{power.get('sleep_w'):g} W, idle {power.get('idle_w'):g} W; assumed values and every source in "
        f"summary.json power.sources); oracle bound {bound['oracle_saving_j'] / 1e3:.4g} kJ = "
        f"{100 * bound['oracle_saving_frac']:.2f} % of no pacing's energy; actuator(s) "
        f"{', '.join(summary.get('actuators', ['delay']))}; energy_vs_spin_w in summary.json reports every "
        "run's change at other spinning powers"
    )
