"""``python -m pacectl.tune``: multi-objective tuning of one controller family on one cluster profile.

Two objectives, each the mean over the profile's episodes (its traces, or its sim seeds): maximize
throughput (it/s) and minimize the CV of iteration time. Optional constraint: the throughput loss
against no pacing at most ``tune.max_throughput_loss_frac`` (``trial.set_constraint``). Optuna is
driven directly (no hydra-optuna-sweeper); NSGA-II by default, ``tune.sampler=tpe`` for TPE.

Outputs in the Hydra run directory:

- ``pareto.json``: every Pareto-optimal trial (of those within the loss cap), a list of
  ``{"trial", "params", "throughput_it_per_s", "cv", "throughput_loss_frac", "feasible"}``;
- ``pareto.png``: every trial, the front, no pacing, the paper's threshold controller at its
  default parameters, and the chosen trial;
- ``controller.yaml``: the chosen trial (rule: :data:`pacectl.tuning.study.CHOICE_RULE`) as a
  controller config: ``python -m pacectl.run controller_file=DIR/controller.yaml``;
- ``tune.json``: baseline, reference, choice, study, storage and the optuna-dashboard command;
- ``optuna.journal``: the study (default storage), resumable after a crash.

Examples::

    python -m pacectl.tune cluster=st controller=threshold tune.n_trials=100
    python -m pacectl.tune cluster=ar controller=ewma tune.n_workers=2 tune.sampler=tpe
    python -m pacectl.tune cluster=contended controller=pid tune.timeout_s=60        # sim profile
    python -m pacectl.tune cluster=st controller=pid tune.storage=sqlite:///tune.db tune.study_name=st-pid
    python -m pacectl.tune cluster=st controller=threshold hydra.run.dir=DIR         # again: resumes
    python -m pacectl.run controller_file=DIR/controller.yaml trace=st               # use the choice
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import optuna
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from pacectl.config import CONF_DIR, controller_params, selected_controller
from pacectl.controllers import CONTROLLERS
from pacectl.errors import ConfigError, PacectlError
from pacectl.report import atomic_write_text, discard_run_dir, jsonable
from pacectl.tuning.scenarios import Evaluation, ScenarioSet, build_scenarios
from pacectl.tuning.space import SearchSpace, load_space
from pacectl.tuning.study import (
    CHOICE_RULE,
    DIRECTIONS,
    FINISHED,
    SAMPLERS,
    Objective,
    StorageSpec,
    TrialPoint,
    choose,
    fail_stale_trials,
    pareto_front,
    plot_pareto,
    run_workers,
    split_quota,
    storage_spec,
    trial_points,
    worker_seed,
)

#: console lines; Hydra's job logging (conf/hydra/job_logging/pacectl.yaml) also files them
log = logging.getLogger("pacectl.tune")

#: The family whose defaults (``conf/controller/threshold.yaml``) are the paper's reference point.
REFERENCE = "threshold"


@dataclass(frozen=True)
class Settings:
    """Validated ``tune.*`` settings."""

    n_trials: int
    timeout_s: float | None
    sampler: str
    population_size: int
    seed: int
    n_workers: int
    study_name: str | None
    storage: str | None
    space: str | None
    max_loss_frac: float | None
    progress: bool

    @staticmethod
    def from_cfg(tune: DictConfig) -> Settings:
        """Read and check ``cfg.tune``.

        Raises:
            ConfigError: a value out of range, with the key and value.
        """

        def integer(key: str, low: int) -> int:
            value = tune.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"tune.{key} must be an integer >= {low}, got {value!r}")
            return value

        timeout = tune.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ConfigError(f"tune.timeout_s must be null or a number > 0 (seconds), got {timeout!r}")
        sampler = str(tune.get("sampler"))
        if sampler not in SAMPLERS:
            raise ConfigError(f"tune.sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
        cap = tune.get("max_throughput_loss_frac")
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 <= cap < 1
        ):
            raise ConfigError(
                f"tune.max_throughput_loss_frac must be null or in [0, 1) (0.005 = 0.5 %), got {cap!r}"
            )
        return Settings(
            n_trials=integer("n_trials", 1),
            timeout_s=None if timeout is None else float(timeout),
            sampler=sampler,
            population_size=integer("population_size", 2),
            seed=integer("seed", 0),
            n_workers=integer("n_workers", 1),
            study_name=None if tune.get("study_name") in (None, "") else str(tune.study_name),
            storage=None if tune.get("storage") in (None, "") else str(tune.storage),
            space=None if tune.get("space") in (None, "") else str(tune.space),
            max_loss_frac=None if cap is None else float(cap),
            progress=bool(tune.get("progress", True)),
        )


@dataclass(frozen=True)
class TuneResult:
    """What one tuning run produced (also written to ``tune.json``)."""

    study_name: str
    storage: StorageSpec
    family: str
    scenarios: ScenarioSet
    baseline: Evaluation
    reference: Evaluation
    points: list[TrialPoint]
    front: list[TrialPoint]
    chosen: TrialPoint
    controller_params: dict[str, Any]
    summary: dict[str, Any]


def _abs(path: str) -> Path:
    try:
        from hydra.utils import to_absolute_path

        return Path(to_absolute_path(path))
    except ValueError:
        return Path(path).expanduser().resolve()


def tune_space(cfg: DictConfig, settings: Settings) -> SearchSpace:
    """The validated search space of the selected controller family (before anything runs).

    Raises:
        ConfigError: nothing to tune (``none``, ``all``), or a bad space file.
    """
    family, fixed = controller_params(selected_controller(cfg))
    tunable = sorted(k for k in CONTROLLERS if k != "none")
    if family not in tunable:
        raise ConfigError(f"controller must be one family to tune, one of {tunable}, got {family!r}")
    path = _abs(settings.space) if settings.space else CONF_DIR / "tune" / "space" / f"{family}.yaml"
    return load_space(family, path, fixed=fixed)


def reference_params() -> dict[str, Any]:
    """The paper's threshold controller at its shipped defaults (``conf/controller/threshold.yaml``)."""
    node = OmegaConf.load(CONF_DIR / "controller" / f"{REFERENCE}.yaml")
    assert isinstance(node, DictConfig)
    return controller_params(node)[1]


def _cached(study: optuna.Study, key: str, compute: Callable[[], Evaluation]) -> Evaluation:
    attrs = study.user_attrs
    if key in attrs:
        return Evaluation.from_json(attrs[key])
    value = compute()
    study.set_user_attr(key, value.to_json())
    return value


def _open_study(spec: StorageSpec, name: str, scenarios: ScenarioSet, family: str) -> optuna.Study:
    storage = spec.open()
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, directions=list(DIRECTIONS), load_if_exists=True
        )
    except ValueError as err:
        raise ConfigError(f"study {name!r} in {spec.display} cannot be opened: {err}") from err
    if [d.name.lower() for d in study.directions] != list(DIRECTIONS):
        raise ConfigError(
            f"study {name!r} in {spec.display} must have directions {list(DIRECTIONS)} (throughput, cv), "
            f"got {[d.name.lower() for d in study.directions]}; choose another tune.study_name"
        )
    attrs = study.user_attrs
    expected = {"family": family, "scenario_fingerprint": scenarios.fingerprint}
    for key, value in expected.items():
        if key in attrs and attrs[key] != value:
            raise ConfigError(
                f"study {name!r} in {spec.display} was created with {key}={attrs[key]!r}, got {value!r}: "
                "a study resumes only with the same controller family, profile, episodes and guard; "
                "choose another tune.study_name"
            )
        if key not in attrs:
            study.set_user_attr(key, value)
    if "scenarios" not in attrs:
        study.set_user_attr("scenarios", jsonable(scenarios.descriptor))
    return study


def export_controller(path: Path, family: str, params: dict[str, Any], header: list[str]) -> None:
    """Write a controller config (``name`` plus parameters) that ``pacectl.run controller_file=`` loads."""
    body = yaml.safe_dump({"name": family, **jsonable(params)}, sort_keys=False)
    atomic_write_text(path, "".join(f"# {line}\n" for line in header) + body)


def run_tuning(cfg: DictConfig, out_dir: Path, *, echo: Callable[[str], None] = print) -> TuneResult:
    """Tune ``cfg.controller`` on ``cfg.cluster``; write the results into ``out_dir``.

    Args:
        cfg: the composed config (``conf/tune.yaml``).
        out_dir: the run directory.
        echo: where progress lines go.

    Returns:
        The :class:`TuneResult`.

    Raises:
        PacectlError: a user mistake (bad space, profile, settings, storage) or no completed trial.
    """
    t0 = time.perf_counter()
    settings = Settings.from_cfg(cfg.tune)
    space = tune_space(cfg, settings)  # every check that needs no episode, before anything runs
    scenarios = build_scenarios(cfg)
    family = space.family
    name = settings.study_name or f"{scenarios.profile}-{family}"
    spec = storage_spec(settings.storage, out_dir, cwd=_abs("."))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _open_study(spec, name, scenarios, family)
    stale = fail_stale_trials(study)
    if stale:
        echo(f"marked {len(stale)} trial(s) left running by a killed process as FAIL: {stale}")
    baseline = _cached(study, "baseline_none", lambda: scenarios.evaluate("none", {}))
    reference = _cached(
        study, "reference_threshold", lambda: scenarios.evaluate(REFERENCE, reference_params())
    )
    existing = study.get_trials(deepcopy=False)
    done = sum(t.state in FINISHED for t in existing)
    remaining = max(0, settings.n_trials - done)
    echo(
        f"study {name!r} ({spec.display}): {family} on {scenarios.profile} ({scenarios.kind}: "
        f"{', '.join(scenarios.labels)}; comm model {scenarios.comm_model}), {done} finished trial(s), "
        f"{remaining} to run with {settings.n_workers} worker(s), sampler {settings.sampler}"
    )
    echo(
        f"no pacing: {baseline.throughput_it_per_s:.6g} it/s, cv {baseline.cv:.4g}; paper threshold: "
        f"{reference.throughput_it_per_s:.6g} it/s, cv {reference.cv:.4g}"
    )
    if hasattr(study._storage, "engine"):  # noqa: SLF001 (no pooled RDB connection may cross a fork)
        study._storage.engine.dispose()  # noqa: SLF001
    if remaining:
        objective = Objective(space, scenarios, baseline, settings.max_loss_frac)
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
            total=settings.n_trials,
            echo=echo if settings.progress else None,
        )
    study = optuna.load_study(study_name=name, storage=spec.open())
    trials = study.get_trials(deepcopy=False)
    points = trial_points(study, space, baseline, settings.max_loss_frac)
    front = pareto_front(points)
    chosen = choose(front)
    params = space.resolve(study.trials[chosen.number].params)
    ref_loss = 1.0 - reference.throughput_it_per_s / baseline.throughput_it_per_s

    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] >= b[0] and a[1] <= b[1] and a != b

    ref_xy = (reference.throughput_it_per_s, reference.cv)
    summary: dict[str, Any] = {
        "study_name": name,
        "storage": spec.display,
        "dashboard": spec.dashboard_command(),
        "family": family,
        "profile": scenarios.profile,
        "run_overrides": run_overrides(scenarios.descriptor),
        "scenarios": {
            "kind": scenarios.kind,
            "labels": scenarios.labels,
            "fingerprint": scenarios.fingerprint,
        },
        "comm_model": scenarios.comm_model,
        "comm_model_timing_dependent": scenarios.comm_timing_dependent,
        "space": {"source": space.source, "tuned": space.keys, "fixed": dict(space.fixed)},
        "sampler": settings.sampler,
        "objectives": {
            "throughput_it_per_s": "maximize (mean over episodes)",
            "cv": "minimize (mean over episodes)",
        },
        "max_throughput_loss_frac": settings.max_loss_frac,
        "num_trials": {
            state.name.lower(): sum(t.state == state for t in trials)
            for state in (
                optuna.trial.TrialState.COMPLETE,
                optuna.trial.TrialState.PRUNED,
                optuna.trial.TrialState.FAIL,
            )
        },
        "baseline_none": baseline.to_json(),
        "reference_threshold": {
            **reference.to_json(),
            "params": reference_params(),
            "throughput_loss_frac": ref_loss,
        },
        "choice_rule": CHOICE_RULE,
        "chosen": {**chosen.to_json(), "controller": {"name": family, **params}},
        "chosen_dominates_reference": dominates((chosen.throughput_it_per_s, chosen.cv), ref_xy),
        "front_dominates_reference": any(dominates((p.throughput_it_per_s, p.cv), ref_xy) for p in front),
        "pareto_size": len(front),
        "wall_time_s": time.perf_counter() - t0,
    }
    if not scenarios.comm_timing_dependent:
        summary["note"] = (
            "comm model is null (fixed durations, max-plus): no delay can shorten an iteration, so no "
            "trial can beat no pacing on throughput here; use comm=contention or a sim profile for gains."
        )
    title = (
        f"{family} on {scenarios.profile} ({scenarios.kind}, {len(scenarios.labels)} episode(s)), "
        f"{len(points)} trials\ncomm model: {scenarios.comm_model}"
    )
    plot_pareto(
        out_dir / "pareto.png",
        points,
        front,
        baseline=baseline,
        reference=reference,
        chosen=chosen,
        title=title,
        max_loss_frac=settings.max_loss_frac,
    )
    atomic_write_text(out_dir / "pareto.json", _json([p.to_json() for p in front]))
    export_controller(
        out_dir / "controller.yaml",
        family,
        params,
        [
            f"Tuned by pacectl.tune: study {name!r}, trial {chosen.number}, profile {scenarios.profile} "
            f"({scenarios.kind}), comm model {scenarios.comm_model}",
            f"throughput {chosen.throughput_it_per_s:.6g} it/s ({-chosen.throughput_loss_frac:+.3%} vs no pacing), "
            f"cv {chosen.cv:.4g}{'' if chosen.feasible else ' (over the throughput-loss cap)'}",
            "Use: python -m pacectl.run controller_file=<this file>",
        ],
    )
    atomic_write_text(out_dir / "tune.json", _json(summary))
    return TuneResult(
        study_name=name,
        storage=spec,
        family=family,
        scenarios=scenarios,
        baseline=baseline,
        reference=reference,
        points=points,
        front=front,
        chosen=chosen,
        controller_params=params,
        summary=summary,
    )


def run_overrides(descriptor: dict[str, Any]) -> str:
    """``python -m pacectl.run`` overrides that evaluate the episodes a study tuned on (its first trace,
    or its simulated cluster), so the exported controller is tried where it was tuned."""
    comm = descriptor.get("comm") or "null"
    profile = descriptor.get("profile", "generic")
    if descriptor.get("kind") == "sim":
        backend = descriptor.get("backend", {})
        return f"backend=sim cluster={profile} comm={comm} backend.num_ranks={backend.get('num_ranks')}"
    trace = (descriptor.get("traces") or [{}])[0]
    name = str(trace.get("name") or "")
    if (
        trace.get("format") == "bytedance"
        and name.upper() in ("AR", "ST")
        and "pacectl/data" in str(trace.get("path"))
    ):
        parts = [f"trace={name.lower()}"]
    else:
        parts = [f"trace={trace.get('format')}", f"trace.path={trace.get('path')}"]
        if trace.get("meta"):
            parts.append(f"trace.meta={trace.get('meta')}")
    if comm != "null":
        parts += [f"comm={comm}", f"cluster={profile}"]
    return " ".join(parts)


def _json(value: Any) -> str:
    import json

    return json.dumps(jsonable(value), indent=2, sort_keys=False) + "\n"


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="tune")
def _hydra_main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run_tuning(cfg, out_dir, echo=log.info)
    except MissingMandatoryValue as err:
        _fail(f"config value {err.full_key} must be set, got '???'")
    except OmegaConfBaseException as err:
        _fail(f"bad config: {err}")
    except PacectlError as err:
        _fail(str(err))
    s = result.summary
    c = result.chosen
    log.info(
        f"pareto front: {len(result.front)} of {len(result.points)} completed trials; chosen trial {c.number}: "
        f"{c.throughput_it_per_s:.6g} it/s ({-c.throughput_loss_frac:+.3%} vs no pacing), cv {c.cv:.4g} "
        f"(no pacing {result.baseline.cv:.4g}, paper threshold {result.reference.cv:.4g})"
        + ("" if c.feasible else " [no trial met the throughput-loss cap]")
    )
    log.info(f"chosen params: {c.params}")
    if "note" in s:
        log.info(f"note: {s['note']}")
    log.info(f"outputs: {out_dir} (pareto.json, pareto.png, controller.yaml, tune.json)")
    log.info(
        f"use it:  python -m pacectl.run controller_file={out_dir / 'controller.yaml'} {s['run_overrides']}"
    )
    log.info(f"inspect: {result.storage.dashboard_command()}   (pip install optuna-dashboard)")


def _fail(message: str) -> None:
    print(f"pacectl.tune: error: {message}", file=sys.stderr)
    discard_run_dir(Path(HydraConfig.get().runtime.output_dir))
    sys.exit(2)


def main() -> None:
    """Console entry point (``pacectl-tune``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
