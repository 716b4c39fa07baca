"""The trials of a study: the objective, the samplers, the worker processes, Ctrl-C and the progress lines.

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
shipped spaces avoid the one known case (``fraction_of`` in :mod:`pacectl.tuning.space`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from pacectl.controllers import make_controller
from pacectl.errors import ConfigError, PacectlError
from pacectl.tuning.config import SAMPLERS
from pacectl.tuning.scenarios import Evaluation, ScenarioSet
from pacectl.tuning.space import SearchSpace
from pacectl.tuning.storage import StorageSpec, disk_full_cause, full_disk_error
from pacectl.tuning.verdict import DEFAULT_OBJECTIVES, OBJECTIVES

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


CONSTRAINT = "throughput_loss"


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


@dataclass
class Objective:
    """The trial objective: sample, build the controller, run every episode, average.

    Attributes:
        space: the search space.
        scenarios: the episodes of one trial.
        baseline: no pacing on the same episodes (computed once, before any trial).
        max_loss_frac: cap on the throughput loss against no pacing, or None for no constraint.
        objectives: ``tune.objectives`` (:data:`~pacectl.tuning.verdict.OBJECTIVES`).
    """

    space: SearchSpace
    scenarios: ScenarioSet
    baseline: Evaluation
    max_loss_frac: float | None
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        """Returns the value of each objective (by default ``(throughput_it_per_s, cv)``), each
        averaged over the episodes."""
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
        return tuple(getattr(ev, OBJECTIVES[o][0]) for o in self.objectives)


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
    progress: Progress,
    baseline: Evaluation,
    echo: Callable[[str], None],
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES,
) -> Callable[[optuna.Study, FrozenTrial], None]:
    """One line per finished trial: count (:class:`Progress`), objectives, change against no pacing,
    parameters."""

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get("surplus"):  # never evaluated: the study was full (SurplusTrial)
            return
        params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        if trial.state == TrialState.COMPLETE and trial.values is not None:
            value = dict(zip(objectives, trial.values, strict=True))
            shown = []
            if "throughput" in value:
                shown.append(
                    f"{value['throughput']:.6g} it/s ({-baseline.loss_frac(value['throughput']):+.3%} vs none)"
                )
            if "cv" in value:
                shown.append(f"cv {value['cv']:.4g}")
            if "energy" in value:
                change = value["energy"] / baseline.energy_per_iteration_j - 1.0
                shown.append(f"{value['energy']:.6g} J/it ({change:+.3%} vs none)")
            cons = trial.system_attrs.get(f"constraints:{CONSTRAINT}")
            feas = "" if cons is None else (" feasible" if cons <= 0 else " infeasible")
            body = f"{', '.join(shown)}{feas} | {params}"
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
    kind = record.exc_info[0] if record.exc_info else None
    raised = kind is not None and issubclass(kind, KeyboardInterrupt | SurplusTrial)
    return not (raised or "SurplusTrial" in record.getMessage() or _INTERRUPTS.requested)


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
    callbacks = [progress_callback(progress, objective.baseline, echo, objective.objectives)] if echo else []

    def claimed(trial: optuna.Trial) -> tuple[float, ...]:
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
    except (PacectlError, OSError, AssertionError) as err:  # Optuna hides ENOSPC behind AssertionError
        shown = err if isinstance(err, PacectlError) else disk_full_cause(err)
        if shown is None:  # not a full disk
            raise
        if not isinstance(shown, PacectlError):
            shown = full_disk_error(shown, "the study storage")
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
                # a worker may be gone already: Ctrl-C can land just as join() reaps it, before
                # multiprocessing records its exit code
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)
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
