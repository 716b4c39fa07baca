"""One tuning command's study: open it (or resume it, only with the same trial settings), evaluate
no pacing and the paper's threshold once, run the missing trials, judge the front, write the outputs.

:func:`run_tuning` is the library entry point (``python -m pacectl.tune`` calls it from Hydra).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
from omegaconf import DictConfig
from optuna.trial import TrialState

from pacectl.config import user_path
from pacectl.errors import ConfigError, PacectlError
from pacectl.tuning.outputs import TuneResult, write_results
from pacectl.tuning.scenarios import Evaluation, ScenarioSet, build_scenarios
from pacectl.tuning.settings import (
    REFERENCE,
    SETTINGS_ATTR,
    Settings,
    exchange_shown,
    ignored_overrides,
    reference_params,
    settings_diff,
    task_overrides,
    trial_settings,
    tune_space,
    validate_tune_config,
)
from pacectl.tuning.space import SearchSpace
from pacectl.tuning.storage import StorageSpec, storage_spec
from pacectl.tuning.verdict import DEFAULT_OBJECTIVES, OBJECTIVES, TrialPoint, judge, pareto_front
from pacectl.tuning.workers import (
    FINISHED,
    Objective,
    Progress,
    check_interrupt,
    deferred_interrupts,
    fail_stale_trials,
    interruptible,
    run_workers,
    split_quota,
    worker_seed,
)


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C after the study was opened: its finished trials are kept in the storage.

    Attributes:
        study_name: the study.
        storage: where it lives.
        finished: its finished trials (COMPLETE or PRUNED) when interrupted, or None if unknown.
    """

    def __init__(self, study_name: str, storage: StorageSpec, finished: int | None) -> None:
        super().__init__(study_name)
        self.study_name = study_name
        self.storage = storage
        self.finished = finished


def _cached(study: optuna.Study, key: str, compute: Callable[[], Evaluation]) -> Evaluation:
    attrs = study.user_attrs
    if key in attrs:
        return Evaluation.from_json(attrs[key])
    with interruptible():  # Ctrl-C may stop the episodes, not the storage write below
        value = compute()
    study.set_user_attr(key, value.to_json())
    return value


#: how a refused resume ends: the two ways out
_RESUME_FIX = (
    "Restore the setting(s) to resume this study, or start a new one with another tune.study_name "
    "(or another hydra.run.dir when tune.storage is null, or another tune.storage)"
)


def _within(old: Any, new: Any) -> bool:
    """Whether every setting of ``old`` is in ``new`` with the same value (``new`` may hold more)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _within(v, new[k]) for k, v in old.items())
    return bool(old == new)


def _previous_study_name(out_dir: Path) -> str | None:
    """The study whose outputs ``out_dir/tune.json`` holds, or None (no readable tune.json)."""
    try:
        name = json.loads((out_dir / "tune.json").read_text()).get("study_name")
    except (OSError, ValueError, AttributeError):
        return None
    return str(name) if name is not None else None


def _open_study(
    spec: StorageSpec, name: str, settings: dict[str, Any], directions: list[Literal["maximize", "minimize"]]
) -> optuna.Study:
    try:
        study = optuna.create_study(
            storage=spec.open(), study_name=name, directions=directions, load_if_exists=True
        )
    except PacectlError:
        raise
    except ValueError as err:
        raise ConfigError(f"study {name!r} in {spec.display} cannot be opened: {err}") from err
    except (KeyError, TypeError, AssertionError) as err:  # a file whose lines are JSON but no journal's
        raise ConfigError(
            f"study {name!r} in {spec.display} cannot be opened: not an Optuna journal "
            f"({type(err).__name__}: {err}); pick a new tune.storage, or an earlier study's journal to resume it"
        ) from err
    attrs = study.user_attrs
    recorded = attrs.get(SETTINGS_ATTR)
    if recorded is None and (attrs or study.get_trials(deepcopy=False)):
        raise ConfigError(
            f"study {name!r} in {spec.display} was made by an older pacectl.tune that did not record the "
            "settings that determine a trial's result (controller parameters, search space), so it cannot "
            f"be resumed safely. {_RESUME_FIX}"
        )
    if recorded is None:
        study.set_user_attr(SETTINGS_ATTR, settings)  # first, so a concurrent opener sees it
    elif recorded != settings:
        diffs = settings_diff(exchange_shown(recorded), exchange_shown(settings))
        if "objectives" not in settings and _within(recorded, settings):
            # the study's pacectl recorded less: this one's trials are not comparable
            added = "; ".join(d.partition(": not set in")[0] for d in diffs[:4])
            raise ConfigError(
                f"study {name!r} in {spec.display} cannot resume: it was made by an older pacectl.tune, which "
                f"did not record settings this one does ({added}{'; ...' if len(diffs) > 4 else ''}), so its "
                "trials cannot be checked against this command's. Start a new study: "
                f"tune.study_name={name}-2 (or another hydra.run.dir when tune.storage is null)"
            )
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise ConfigError(
            f"study {name!r} in {spec.display} was run with other settings than this command's, and a "
            f"study resumes only with the settings that determine a trial's result (controller family "
            f"and fixed parameters, units, search space, episodes, comm, guard): {shown or 'see tune.json'}. "
            f"{_RESUME_FIX}"
        )
    if [d.name.lower() for d in study.directions] != directions:  # a study another program made
        raise ConfigError(
            f"study {name!r} in {spec.display} must have directions {directions} (tune.objectives), "
            f"got {[d.name.lower() for d in study.directions]}; choose another tune.study_name"
        )
    return study


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run_tuning(
    cfg: DictConfig,
    out_dir: Path,
    *,
    echo: Callable[[str], None] = print,
    warn: Callable[[str], None] = _to_stderr,
) -> TuneResult:
    """Tune ``cfg.controller`` on ``cfg.cluster``; write the results into ``out_dir``.

    A trace named on the command line (``trace=...``, Hydra's task overrides) replaces the
    profile's traces (:func:`pacectl.tuning.scenarios.trace_from_command_line`); a library caller,
    which has no command line, sets ``cfg.cluster.traces`` instead.

    Every check that needs no trial (config keys, guard, space, episodes) runs before the storage is
    created; the outputs are written together (:mod:`pacectl.tuning.outputs`).

    Args:
        cfg: the composed config (``conf/tune.yaml``).
        out_dir: the run directory.
        echo: where progress lines go.
        warn: where warnings go (overrides the tuning ignores).

    Returns:
        The :class:`TuneResult`.

    Raises:
        PacectlError: a user mistake (bad space, profile, settings, storage, a resume with other
            settings) or no completed trial.
        TuneInterrupted: Ctrl-C once the study exists (its finished trials are kept; no output written).
        KeyboardInterrupt: Ctrl-C before that.
    """
    t0 = time.perf_counter()
    settings = validate_tune_config(cfg)
    space = tune_space(cfg, settings)  # every check that needs no episode, before anything runs
    scenarios = build_scenarios(cfg, overrides=task_overrides())
    for line in ignored_overrides(scenarios, task_overrides()):
        warn(f"warning: {line}")
    family = space.family
    name = settings.study_name or f"{scenarios.default_study_name}-{family}"
    spec = storage_spec(settings.storage, out_dir, cwd=Path(user_path(".")))
    if settings.storage is None:  # Settings reads an empty tune.storage as null
        out_dir.mkdir(parents=True, exist_ok=True)  # the default journal lives in the run folder
    previous = _previous_study_name(out_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _open_study(
        spec, name, trial_settings(space, scenarios, settings.objectives), settings.directions
    )
    if previous not in (None, name):  # said once the study opened: a refused resume replaces nothing
        warn(
            f"warning: {out_dir} holds the outputs of study {previous!r}: this study ({name!r}) replaces its "
            "controller.yaml, tune.json and pareto files (its trials stay in their storage); use another "
            "hydra.run.dir to keep both"
        )
    try:
        with deferred_interrupts():
            return _tune_study(out_dir, echo, t0, _Study(settings, space, scenarios, spec, name, study))
    except KeyboardInterrupt:
        finished: int | None = None
        with deferred_interrupts():  # another Ctrl-C now is the same request
            try:
                reopened = optuna.load_study(study_name=name, storage=spec.open())
                finished = len(reopened.get_trials(deepcopy=False, states=FINISHED))
            except Exception:  # noqa: BLE001 (the count is a courtesy; the interrupt is what matters)
                finished = None
        raise TuneInterrupted(name, spec, finished) from None


@dataclass(frozen=True)
class _Study:
    """What one tuning command works on: its settings, search space, scenarios and opened study."""

    settings: Settings
    space: SearchSpace
    scenarios: ScenarioSet
    spec: StorageSpec
    name: str
    study: optuna.Study


def _tune_study(out_dir: Path, echo: Callable[[str], None], t0: float, run: _Study) -> TuneResult:
    """Run the study's missing trials, judge the result, write the outputs (see :func:`run_tuning`)."""
    settings, space, scenarios, spec, name = run.settings, run.space, run.scenarios, run.spec, run.name
    study, baseline, reference = _run_trials(echo, run)
    points = trial_points(study, space, baseline, settings.max_throughput_loss_frac, settings.objectives)
    front = pareto_front(points, settings.objectives)
    verdict = judge(points, front, baseline, reference, settings.rule, scenarios.comm_timing_dependent)
    return write_results(
        out_dir,
        name=name,
        spec=spec,
        space=space,
        settings=settings,
        scenarios=scenarios,
        study=study,
        points=points,
        front=front,
        verdict=verdict,
        baseline=baseline,
        reference=reference,
        wall_time_s=time.perf_counter() - t0,
    )


def _run_trials(echo: Callable[[str], None], run: _Study) -> tuple[optuna.Study, Evaluation, Evaluation]:
    """Fail the trials a killed process left running, evaluate (or read back) no pacing and the
    reference, run the missing trials in ``settings.n_workers`` workers.

    Returns:
        ``(study, no pacing, reference)``, the study reloaded with every trial finished so far.
    """
    settings, space, scenarios = run.settings, run.space, run.scenarios
    spec, name, study = run.spec, run.name, run.study
    stale = fail_stale_trials(study)
    if stale:
        echo(f"marked {len(stale)} trial(s) left running by a killed process as FAIL: {stale}")
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if running:
        owners = sorted({str(t.user_attrs.get("worker", "owner unknown")) for t in running})
        echo(
            f"note: {len(running)} trial(s) of the study are running in other live processes "
            f"({', '.join(owners)}): {[t.number for t in running]}; this command's results count only "
            "finished trials"
        )
    baseline = _cached(study, "baseline_none", lambda: scenarios.evaluate("none", {}))
    reference = _cached(
        study, "reference_threshold", lambda: scenarios.evaluate(REFERENCE, reference_params())
    )
    existing = study.get_trials(deepcopy=False)
    done = sum(t.state in FINISHED for t in existing)
    remaining = max(0, settings.n_trials - done)
    if scenarios.trace_from_command_line:
        fabric = f"profile {scenarios.profile} for the fabric; " if scenarios.comm_model != "null" else ""
        where = f"the command line's trace ({fabric}{scenarios.kind}: "
    else:
        where = f"{scenarios.profile} ({scenarios.kind}: "
    echo(
        f"study {name!r} ({spec.display}): {space.family} on {where}{', '.join(scenarios.labels)}; comm model "
        f"{scenarios.comm_model}), {done} finished trial(s), {remaining} to run with {settings.n_workers} "
        f"worker(s), sampler {settings.sampler}"
    )
    echo(
        f"no pacing: {baseline.throughput_it_per_s:.6g} it/s, cv {baseline.cv:.4g}; paper threshold: "
        f"{reference.throughput_it_per_s:.6g} it/s, cv {reference.cv:.4g}"
    )
    if hasattr(study._storage, "engine"):  # noqa: SLF001 (no pooled RDB connection may cross a fork)
        study._storage.engine.dispose()  # noqa: SLF001
    if remaining:
        objective = Objective(
            space, scenarios, baseline, settings.max_throughput_loss_frac, settings.objectives
        )
        workers = min(settings.n_workers, remaining)
        run_workers(
            workers,
            split_quota(remaining, workers),
            [worker_seed(settings.seed, i, len(existing)) for i in range(workers)],
            objective=objective,
            spec=spec,
            study_name=name,
            sampler=settings.sampler,
            population_size=settings.population_size,
            timeout_s=settings.timeout_s,
            progress=Progress(done, settings.n_trials),
            echo=echo if settings.progress else None,
        )
    check_interrupt()  # a Ctrl-C that arrived outside an evaluation: stop before writing any output
    study = optuna.load_study(study_name=name, storage=spec.open())
    trials = study.get_trials(deepcopy=False)
    elsewhere = [t.number for t in trials if t.state == TrialState.RUNNING]
    if elsewhere:
        echo(
            f"note: trial(s) {elsewhere} still running in other commands sharing the study: these outputs "
            f"use the {sum(t.state in FINISHED for t in trials)} finished trial(s); rerun this command after "
            "they end to include them"
        )
    return study, baseline, reference


def trial_points(
    study: optuna.Study,
    space: SearchSpace,
    baseline: Evaluation,
    cap: float | None,
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES,
) -> list[TrialPoint]:
    """Every completed trial with its resolved (tuned) controller parameters; the values of the
    objectives the study does not optimize are the means of its ``per_episode`` figures."""
    points = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.values is None or not all(math.isfinite(v) for v in t.values):
            continue
        rows = t.user_attrs.get("per_episode") or [{}]
        value = {
            attr: sum(float(r.get(attr, math.nan)) for r in rows) / len(rows)
            for attr, _ in OBJECTIVES.values()
        }
        value.update({OBJECTIVES[o][0]: float(v) for o, v in zip(objectives, t.values, strict=True)})
        loss = baseline.loss_frac(value["throughput_it_per_s"])
        points.append(
            TrialPoint(
                number=t.number,
                params=space.tuned(space.resolve(t.params)),
                throughput_it_per_s=value["throughput_it_per_s"],
                cv=value["cv"],
                throughput_loss_frac=loss,
                feasible=cap is None or loss <= cap,
                energy_per_iteration_j=value["energy_per_iteration_j"],
            )
        )
    return points
