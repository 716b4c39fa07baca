"""The Optuna side of ``python -m pacectl.tune``: storage, samplers, workers, the Pareto front, the choice.

Storage (``tune.storage``):

- ``null`` (default): a journal file ``<run dir>/optuna.journal`` (Optuna's ``JournalStorage`` over
  ``JournalFileBackend``). Every finished trial is one appended line, so a study killed with SIGKILL
  keeps every finished trial and resumes when the same command runs again with the same
  ``hydra.run.dir`` (or with ``tune.storage`` and ``tune.study_name`` set explicitly). The file lock
  is an ``fcntl.flock`` (:class:`FlockLock`), which the kernel releases when a process dies, so a kill
  never leaves a stale lock behind;
- a file path: a journal file there (any name; shared by every process that names it);
- an RDB URL (``sqlite:///tune.db``, ``postgresql://user:pw@host/db``): Optuna's ``RDBStorage``;
  workers on several machines share one study by running the same command against the same URL
  (PostgreSQL needs ``psycopg2``; SQLite only suits one machine).

Workers (``tune.n_workers=N``): N forked processes, each opening its own connection to the same
storage and sampling with its own seed; the trial budget is split between them so the study ends
with exactly ``tune.n_trials`` finished trials. ``tune.n_trials`` is the study's total: a resumed
study runs only the trials still missing, and commands started at the same time on one study
(several machines) each stop once the study holds ``tune.n_trials`` trials finished or running
anywhere (Optuna's ``MaxTrialsCallback``): the total is exact, give or take a trial when two commands
ask for a new trial in the same instant or a trial still running elsewhere fails. A worker dies with
the main process (``kill -KILL`` of the command ends its workers too). Trials left ``RUNNING`` by a killed process of this host are marked
``FAIL`` by every resume, whether or not it has trials left to run (their owner, ``host:pid``, is a
user attribute of every trial).

Invalid parameter combinations: the controller is built before any episode runs; if its
constructor raises :class:`~pacectl.errors.ConfigError`, the trial is marked ``PRUNED`` with the
message in its ``invalid_params`` user attribute (multi-objective trials cannot be pruned by a
pruner, but an objective may still raise ``TrialPruned``). Samplers ignore pruned trials. The
shipped spaces avoid the one known case (``off_threshold_s > on_threshold_s``) by sampling
``off_threshold_s`` as a fraction of ``on_threshold_s`` (see :mod:`pacectl.tuning.space`).
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import signal
import socket
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
from optuna.storages import BaseStorage
from optuna.storages.journal import JournalStorage
from optuna.trial import FrozenTrial, TrialState

from pacectl.controllers import make_controller
from pacectl.errors import ConfigError, PacectlError
from pacectl.tuning.scenarios import Evaluation, ScenarioSet
from pacectl.tuning.space import SearchSpace
from pacectl.tuning.storage import (
    FULL_ERRNOS,
    SafeJournalFileBackend,
    disk_full_cause,
    full_disk_error,
    journal_needs_repair,
    repair_journal,
)
from pacectl.tuning.verdict import TrialPoint

DIRECTIONS: tuple[Literal["maximize"], Literal["minimize"]] = ("maximize", "minimize")  # throughput, cv
SAMPLERS = ("nsga2", "tpe", "random")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
CONSTRAINT = "throughput_loss"


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
                    raise full_disk_error(
                        err, f"tune.storage {path}"
                    ) from err  # an unwritable folder (permissions, read-only or virtual file system)
                raise ConfigError(
                    f"tune.storage {path}: cannot create or open the journal there "
                    f"({err.strerror or type(err).__name__}); pick a path in a folder you can write to"
                ) from err
        for attempt in range(6):
            try:
                return optuna.storages.RDBStorage(self.location)
            except Exception as err:  # sqlalchemy.exc.IntegrityError, ProgrammingError
                # N hosts starting at once race to create the schema on an empty database
                # (PostgreSQL: duplicate key in pg_type); the loser finds it made on a retry
                text = str(err).lower()
                if attempt < 5 and ("duplicate key" in text or "already exists" in text):
                    time.sleep(0.2 * (attempt + 1))
                    continue
                break
        try:
            return optuna.storages.RDBStorage(self.location)
        except Exception as err:  # sqlalchemy.exc.ArgumentError, OperationalError, ImportError
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


def make_sampler(name: str, *, seed: int, population_size: int) -> optuna.samplers.BaseSampler:
    """The sampler ``tune.sampler`` names: ``nsga2`` (default), ``tpe`` (multi-objective TPE) or ``random``.

    Raises:
        ConfigError: unknown name.
    """
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=population_size, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"tune.sampler must be one of {list(SAMPLERS)}, got {name!r}")


def worker_seed(seed: int, worker: int, num_existing: int) -> int:
    """Sampler seed of one worker: distinct per worker, and per resume (so a resume does not redraw
    the trials it already has), reproducible for a fresh single-worker study."""
    return int(np.random.SeedSequence([int(seed), int(worker), int(num_existing)]).generate_state(1)[0])


#: This command's id, stored on every trial its workers run (forked workers inherit it), so that
#: the progress counter can tell the trials of other commands sharing the study.
COMMAND_ID = uuid.uuid4().hex


def owner_tag() -> str:
    """``host:pid`` of this process, stored on every trial it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark ``FAIL`` the ``RUNNING`` trials whose owner process on this host is gone (killed runs).

    Every worker registers itself (``worker:<host>:<pid>`` study user attribute) and tags each
    trial it starts (``worker`` trial user attribute).

    Returns:
        The numbers of the trials marked.
    """
    host = socket.gethostname()

    def dead_here(owner: str) -> bool:
        owner_host, _, pid = owner.rpartition(":")
        return owner_host == host and pid.isdigit() and not _pid_alive(int(pid))

    # A trial killed before its first write has no owner yet: it is stale when every worker that
    # ever joined the study ran on this host and is gone.
    workers = [key.removeprefix("worker:") for key in study.user_attrs if key.startswith("worker:")]
    all_gone = all(dead_here(w) for w in workers)
    marked = []
    storage = study._storage  # noqa: SLF001 (Optuna exposes no public setter for a dead trial)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("worker")
        if dead_here(str(owner)) if owner else all_gone:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, trial.number)  # noqa: SLF001
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            marked.append(trial.number)
    return marked


#: Study user attribute holding :func:`pacectl.tune.trial_settings` of the command that created it.
SETTINGS_ATTR = "trial_settings"

#: Section of the trial settings -> how a message names its keys, and what a missing key means there.
_SECTIONS = {
    "controller": ("controller.{}", "tuned (in the search space)"),
    "space": ("search space key {}", "not tuned"),
    "episodes": ("episodes: {}", "not set"),
}
#: field order of a distribution in messages (as a space file writes them)
_FIELD_ORDER = ("type", "low", "high", "log", "step", "choices", "fraction_of")


def settings_diff(old: Any, new: Any) -> list[str]:
    """The differences between two trial-settings mappings, one ``"<setting>: X in the study, Y in this
    command"`` per differing setting: controller parameters whole, search-space keys by field (a key
    tuned on one side only: its whole distribution), episode settings by their dotted path down to the
    values that differ (a mapping present on one side only: its key names, not its values).

    Example:
        >>> settings_diff({"controller": {"units": "s"}}, {"controller": {"units": "iteration"}})
        ["controller.units: 's' in the study, 'iteration' in this command"]
    """
    lines: list[str] = []

    def walk(
        a: Any, b: Any, path: str, depth: int, template: str, absent: str, out: list[tuple[bool, str]]
    ) -> None:
        if a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict) and depth != 0:
            for key in sorted(set(a) | set(b), key=str):
                sub = f"{path}.{key}" if path else str(key)
                walk(a.get(key, _ABSENT), b.get(key, _ABSENT), sub, depth - 1, template, absent, out)
            return
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and depth != 0:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]", depth - 1, template, absent, out)
            return
        whole = a is _ABSENT or b is _ABSENT  # a dict on the other side is shown by its keys
        line = (
            f"{template.format(path)}: {_show(a, absent, whole)} in the study, "
            f"{_show(b, absent, whole)} in this command"
        )
        out.append((whole and (_is_settings(a) or _is_settings(b)), line))

    for section in sorted(set(old) | set(new)):
        template, absent = _SECTIONS.get(section, (section + ".{}", "not set"))
        depth = {"controller": 1, "space": 2}.get(section, -1)
        found: list[tuple[bool, str]] = []
        walk(old.get(section, {}), new.get(section, {}), "", depth, template, absent, found)
        # values first; a whole mapping added or removed (usually a consequence of one of them) last
        lines += [line for _, line in sorted(found, key=lambda item: item[0])]
    return lines


_ABSENT = object()


def _is_settings(value: Any) -> bool:
    """A mapping of settings (not a search-space distribution, whose fields are :data:`_FIELD_ORDER`)."""
    return isinstance(value, dict) and not set(value) <= set(_FIELD_ORDER)


def _show(value: Any, absent: str, whole: bool = False) -> str:
    if value is _ABSENT:
        return absent
    if value is None:
        return "null"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (_FIELD_ORDER.index(k) if k in _FIELD_ORDER else 99, str(k)))
        if whole and _is_settings(value):  # a mapping of settings: its keys, not its values
            names = ", ".join(str(k) for k in keys[:6]) + (", ..." if len(keys) > 6 else "")
            return f"set ({len(keys)} key{'s' if len(keys) != 1 else ''}: {names})"
        text = "{" + ", ".join(f"{k}: {value[k]!r}" for k in keys if value[k] not in (None, False)) + "}"
    else:
        text = repr(value)
    if len(text) <= 100:
        return text
    return text[:96] + " ..." + (text[-1] if text[-1] in "]})" else "")


@dataclass
class Objective:
    """The trial objective: sample, build the controller, run every episode, average.

    Attributes:
        space: the search space.
        scenarios: the episodes of one trial.
        baseline: no pacing on the same episodes (computed once, before any trial).
        max_loss_frac: cap on the throughput loss against no pacing, or None for no constraint.
    """

    space: SearchSpace
    scenarios: ScenarioSet
    baseline: Evaluation
    max_loss_frac: float | None

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        """Returns ``(throughput_it_per_s, cv)``, both averaged over the episodes."""
        trial.set_user_attr("worker", owner_tag())
        trial.set_user_attr("command", COMMAND_ID)
        params = self.space.sample(trial)
        try:
            make_controller(self.space.family, **params)
        except ConfigError as err:
            trial.set_user_attr("invalid_params", str(err))
            raise optuna.TrialPruned(f"invalid parameters: {err}") from err
        t0 = time.perf_counter()
        with interruptible():  # Ctrl-C: Optuna records this trial as FAIL
            ev = self.scenarios.evaluate(self.space.family, params)
        loss = self.baseline.loss_frac(ev.throughput_it_per_s)
        trial.set_user_attr("objective_s", time.perf_counter() - t0)
        trial.set_user_attr("throughput_loss_frac", loss)
        trial.set_user_attr("per_episode", ev.per_episode)
        if self.max_loss_frac is not None:
            trial.set_constraint(CONSTRAINT, loss - self.max_loss_frac)
        return ev.throughput_it_per_s, ev.cv


class Progress:
    """The ``[k/N]`` counter of the progress lines, shared by the forked workers of one command.

    ``k`` counts the study's finished trials (COMPLETE or PRUNED): one per trial finished by a worker
    of this command, plus those of everyone else (``others``: earlier commands, other commands or
    machines sharing the study now; the study's finished trials at the start when not given). It
    is updated and printed under one lock, so the lines of this command's workers count up by one
    each, in the order they are printed, plus whatever other commands finished in between.

    Args:
        start: finished trials of the study when the command started.
        total: ``tune.n_trials``.
    """

    def __init__(self, start: int, total: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        self.total = total
        self.start = start
        self._lock = ctx.Lock()
        self._own = ctx.Value("q", 0, lock=False)

    def next(
        self,
        echo: Callable[[str], None],
        line: Callable[[int], str],
        *,
        finished: bool = True,
        others: Callable[[], int] | None = None,
    ) -> None:
        """Count one finished trial (unless ``finished`` is false: a FAIL) and ``echo`` ``line(count)``,
        both under the lock; ``others`` gives the finished trials of other commands in the storage."""
        with self._lock:
            self._own.value += int(finished)
            count = int(self._own.value) + (self.start if others is None else int(others()))
            echo(line(count))


def progress_callback(
    progress: Progress, baseline: Evaluation, echo: Callable[[str], None]
) -> Callable[[optuna.Study, FrozenTrial], None]:
    """One line per finished trial: count (:class:`Progress`), objectives, change against no pacing,
    parameters."""

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get("surplus"):  # never evaluated: the study was full (SurplusTrial)
            return
        params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        if trial.state == TrialState.COMPLETE and trial.values is not None:
            thr, cv = trial.values
            change = -baseline.loss_frac(thr)
            cons = trial.system_attrs.get(f"constraints:{CONSTRAINT}")
            feas = "" if cons is None else (" feasible" if cons <= 0 else " infeasible")
            body = f"{thr:.6g} it/s ({change:+.3%} vs none), cv {cv:.4g}{feas} | {params}"
        else:
            reason = trial.user_attrs.get("invalid_params", trial.state.name.lower())
            body = f"{trial.state.name.lower()} ({reason}) | {params}"
        progress.next(
            echo,
            lambda k: f"[{k}/{progress.total}] trial {trial.number}: {body}",
            finished=trial.state in FINISHED,  # a FAIL is not counted (tune.n_trials counts finished ones)
            others=lambda: sum(
                t.user_attrs.get("command") != COMMAND_ID
                for t in study.get_trials(deepcopy=False, states=FINISHED)
            ),
        )

    return callback


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# --- Ctrl-C ---------------------------------------------------------------------------------------
#
# A KeyboardInterrupt raised at an arbitrary bytecode can land inside Optuna's bookkeeping (a storage
# write in ``tell``), where Optuna itself then fails with a second traceback. So while a study runs,
# SIGINT is handled by :func:`_on_sigint`: it raises KeyboardInterrupt only inside an
# :func:`interruptible` block (an episode evaluation, a wait for workers), where Optuna catches it
# and records the trial as FAIL; anywhere else it only sets a flag, acted on at the next safe point
# (the next evaluation, the trial callback, the end of ``optimize``).


class _InterruptState:
    requested = False  # a SIGINT arrived
    interruptible = False  # inside an interruptible() block


_INTERRUPTS = _InterruptState()


def _on_sigint(signum: int, frame: Any) -> None:
    _INTERRUPTS.requested = True
    if _INTERRUPTS.interruptible:
        _INTERRUPTS.interruptible = False  # a second SIGINT while this one unwinds only sets the flag
        raise KeyboardInterrupt


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Handle SIGINT as described above for the block (main thread only; elsewhere a no-op), then
    restore the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    _INTERRUPTS.requested = _INTERRUPTS.interruptible = False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _INTERRUPTS.interruptible = False


@contextmanager
def interruptible() -> Iterator[None]:
    """A block that Ctrl-C may interrupt at once (KeyboardInterrupt), under :func:`deferred_interrupts`.

    Raises:
        KeyboardInterrupt: on entry if a SIGINT already arrived, or from inside the block.
    """
    check_interrupt()
    _INTERRUPTS.interruptible = True
    try:
        yield
    finally:
        _INTERRUPTS.interruptible = False


def check_interrupt() -> None:
    """A safe point: raise the KeyboardInterrupt a SIGINT deferred.

    Raises:
        KeyboardInterrupt: a SIGINT arrived under :func:`deferred_interrupts`.
    """
    if _INTERRUPTS.requested:
        raise KeyboardInterrupt


def _stop_if_interrupted(study: optuna.Study, trial: FrozenTrial) -> None:
    if _INTERRUPTS.requested:
        study.stop()


class SurplusTrial(Exception):
    """A trial asked for after the study already held ``tune.n_trials`` (another command's); it is
    recorded FAIL with the user attribute ``surplus`` and never evaluated."""


def _drop_interrupts(record: logging.LogRecord) -> bool:
    """Logging filter of Optuna's trial loop: once Ctrl-C was pressed, drop its "Trial N failed ..."
    warnings (with a KeyboardInterrupt traceback), since the command reports Ctrl-C once; and the
    warning of a :class:`SurplusTrial`."""
    exc = record.exc_info
    interrupted = exc and exc[0] is not None and issubclass(exc[0], KeyboardInterrupt)
    surplus = "SurplusTrial" in record.getMessage() or (
        exc and exc[0] is not None and issubclass(exc[0], SurplusTrial)
    )
    return not (interrupted or surplus or _INTERRUPTS.requested)


def run_worker(
    objective: Objective,
    spec: StorageSpec,
    study_name: str,
    *,
    sampler: str,
    seed: int,
    population_size: int,
    n_trials: int,
    timeout_s: float | None,
    progress: Progress,
    echo: Callable[[str], None] | None,
) -> None:
    """Run ``n_trials`` trials of the study in this process, against its own storage connection.

    Raises:
        KeyboardInterrupt: Ctrl-C; the trial it interrupted is FAIL in the storage.
    """
    logging.getLogger("optuna.study._optimize").addFilter(_drop_interrupts)
    storage = spec.open()
    study = optuna.load_study(
        study_name=study_name,
        storage=storage,
        sampler=make_sampler(sampler, seed=seed, population_size=population_size),
    )
    study.set_user_attr(f"worker:{owner_tag()}", True)
    callbacks = [progress_callback(progress, objective.baseline, echo)] if echo else []

    def claimed(trial: optuna.Trial) -> tuple[float, float]:
        # Several commands (machines) on one study: a trial runs only if fewer than tune.n_trials
        # trials numbered before it are finished or running anywhere, so the study never finishes
        # more than tune.n_trials (trial numbers are given out atomically by the storage).
        ahead = [
            t
            for t in study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
            if t.number < trial.number
        ]
        if len(ahead) >= progress.total:
            trial.set_user_attr("surplus", f"the study already held {len(ahead)} trials finished or running")
            study.stop()
            raise SurplusTrial(trial.number)
        return objective(trial)

    # Other commands (machines) sharing the study add trials this worker's quota does not know of:
    # stop once the study holds tune.n_trials trials finished or still running anywhere.
    callbacks.append(optuna.study.MaxTrialsCallback(progress.total, states=(*FINISHED, TrialState.RUNNING)))
    callbacks.append(_stop_if_interrupted)
    study.optimize(claimed, n_trials=n_trials, timeout=timeout_s, callbacks=callbacks, catch=(SurplusTrial,))
    check_interrupt()


#: exit status of a worker stopped by Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130


def _die_with_parent(parent: int) -> None:
    """End this worker when the main process ``parent`` dies (``kill -KILL`` of the command), so that no
    orphan goes on adding trials: the trial it was running stays RUNNING with a dead owner, which the
    next resume marks FAIL. Linux: ``PR_SET_PDEATHSIG``; elsewhere a thread that polls the parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
                if os.getppid() != parent:  # the parent died before the call
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="pacectl-parent-watch").start()


def _worker_main(index: int, parent: int, kwargs: dict[str, Any]) -> None:
    # the handler and the flag a Ctrl-C sets are inherited from the main process (requested is false
    # there when it forks), so a Ctrl-C that reaches this worker while it starts is not lost
    _INTERRUPTS.interruptible = False
    signal.signal(signal.SIGINT, _on_sigint)
    _die_with_parent(parent)
    try:
        run_worker(**kwargs)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)  # the main process reports Ctrl-C, once
    except PacectlError as err:
        print(f"pacectl.tune: error: worker {index}: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except (OSError, AssertionError) as err:  # a full disk: Optuna hides ENOSPC behind AssertionError
        full = disk_full_cause(err)
        if full is None:
            raise
        shown = full if isinstance(full, PacectlError) else full_disk_error(full, "the study storage")
        print(f"pacectl.tune: error: worker {index}: {shown}", file=sys.stderr, flush=True)
        sys.exit(2)


#: seconds the main process waits for interrupted workers to record their trials before SIGTERM
INTERRUPT_GRACE_S = 30.0


def run_workers(num_workers: int, quotas: Sequence[int], seeds: Sequence[int], **kwargs: Any) -> None:
    """Run the study in ``num_workers`` forked processes (one in-process when 1).

    Ctrl-C (under :func:`deferred_interrupts`): each worker records the trial it was running as FAIL
    and exits (a SIGINT to the process group reaches every worker; one sent to the main process only
    is forwarded to them); workers still running after :data:`INTERRUPT_GRACE_S` are terminated (their
    trials stay RUNNING until a resume marks them FAIL). Then KeyboardInterrupt propagates.

    Raises:
        ConfigError: ``fork`` is unavailable (Windows) and more than one worker was asked for.
        PacectlError: a worker failed.
        KeyboardInterrupt: Ctrl-C.
    """
    if num_workers == 1:
        run_worker(n_trials=quotas[0], seed=seeds[0], **kwargs)
        return
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods():
        raise ConfigError(
            f"tune.n_workers > 1 needs the fork start method (Linux, macOS), got n_workers={num_workers}"
        )
    ctx = mp.get_context("fork")
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(i, parent, dict(kwargs, n_trials=quotas[i], seed=seeds[i])),
            daemon=False,
        )
        for i in range(num_workers)
        if quotas[i] > 0
    ]
    for proc in procs:
        proc.start()
    try:
        with interruptible():
            for proc in procs:
                proc.join()
    except KeyboardInterrupt:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                try:
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    # already exited and reaped: Ctrl-C can land just as join() reaps a worker,
                    # before multiprocessing records its exit code
                    pass
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
        raise
    except BaseException:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        raise
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise PacectlError(f"tune workers must all finish cleanly, got exit codes {bad} (worker, code)")


def split_quota(total: int, num_workers: int) -> list[int]:
    """Split ``total`` trials as evenly as possible between ``num_workers`` workers."""
    return [total // num_workers + (1 if i < total % num_workers else 0) for i in range(num_workers)]


# --- results --------------------------------------------------------------------------------------


def trial_points(
    study: optuna.Study, space: SearchSpace, baseline: Evaluation, cap: float | None
) -> list[TrialPoint]:
    """Every completed trial with its resolved (tuned) controller parameters."""
    points = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.values is None or not all(math.isfinite(v) for v in t.values):
            continue
        loss = baseline.loss_frac(t.values[0])
        points.append(
            TrialPoint(
                number=t.number,
                params=space.tuned(space.resolve(t.params)),
                throughput_it_per_s=float(t.values[0]),
                cv=float(t.values[1]),
                throughput_loss_frac=loss,
                feasible=cap is None or loss <= cap,
            )
        )
    return points


def plot_pareto(
    path: Path,
    points: Sequence[TrialPoint],
    front: Sequence[TrialPoint],
    *,
    baseline: Evaluation,
    reference: Evaluation,
    chosen: TrialPoint,
    title: str,
    max_loss_frac: float | None = None,
) -> None:
    """Pareto-front PNG (atomic): every trial, the front, no pacing, the paper's threshold, the choice,
    and the throughput-loss cap (a vertical line; trials left of it break the constraint)."""
    from matplotlib.figure import Figure

    from pacectl.report import save_figure

    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    ax = fig.subplots()
    feas = [p for p in points if p.feasible]
    infeas = [p for p in points if not p.feasible]
    if infeas:
        ax.scatter(
            [p.throughput_it_per_s for p in infeas],
            [p.cv for p in infeas],
            s=10,
            c="0.8",
            label="trial (over the loss cap)",
        )
    if feas:
        ax.scatter([p.throughput_it_per_s for p in feas], [p.cv for p in feas], s=12, c="0.5", label="trial")
    ordered = sorted(front, key=lambda p: p.throughput_it_per_s)
    ax.plot(
        [p.throughput_it_per_s for p in ordered],
        [p.cv for p in ordered],
        "o-",
        c="tab:blue",
        ms=5,
        lw=1,
        label="Pareto front",
    )
    ax.scatter(
        [baseline.throughput_it_per_s],
        [baseline.cv],
        marker="X",
        s=110,
        c="black",
        label="no pacing",
        zorder=5,
    )
    ax.scatter(
        [reference.throughput_it_per_s],
        [reference.cv],
        marker="D",
        s=70,
        c="tab:red",
        label="paper threshold (defaults)",
        zorder=5,
    )
    ax.scatter(
        [chosen.throughput_it_per_s],
        [chosen.cv],
        marker="*",
        s=260,
        c="tab:orange",
        label=f"chosen (trial {chosen.number})",
        zorder=6,
    )
    if max_loss_frac is not None:
        ax.axvline(
            baseline.throughput_it_per_s * (1.0 - max_loss_frac),
            color="grey",
            ls=":",
            lw=1.2,
            label=f"throughput-loss cap ({max_loss_frac:.1%})",
        )
    ax.set_xlabel("throughput, it/s (mean over episodes; higher is better)")
    ax.set_ylabel("CV of iteration time\n(mean over episodes; lower is better)")
    # long lines (the comm model's note) wrapped to the figure's width, which constrained layout
    # does not shrink a title to
    ax.set_title("\n".join(textwrap.fill(line, 85) for line in title.splitlines()), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3, frameon=False)
    save_figure(fig, path)
