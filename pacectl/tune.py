"""``python -m pacectl.tune``: multi-objective tuning of one controller family on one cluster profile.

Two objectives, each the mean over the profile's episodes (its traces, or its sim seeds): maximize
throughput (it/s) and minimize the CV of iteration time. Optional constraint: the throughput loss
against no pacing at most ``tune.max_throughput_loss_frac`` (``trial.set_constraint``). Optuna is
driven directly (no hydra-optuna-sweeper); NSGA-II by default, ``tune.sampler=tpe`` for TPE.

Outputs in the Hydra run directory:

- ``pareto.json``: every Pareto-optimal trial (of those within the loss cap), a list of
  ``{"trial", "params", "throughput_it_per_s", "cv", "throughput_loss_frac", "feasible",
  "duplicate_trials"}`` (a parameter set drawn again appears once, under its first trial);
- ``pareto.png``: every trial, the front, no pacing, the paper's threshold controller at its
  default parameters, and the chosen trial;
- ``controller.yaml``: the chosen trial (rule: :data:`pacectl.tuning.verdict.CHOICE_RULE`) as a
  controller config: ``python -m pacectl.run controller_file=DIR/controller.yaml``;
- ``tune.json``: baseline, reference, choice, study, storage and the optuna-dashboard command;
- ``optuna.journal``: the study (default storage), resumable after a crash or Ctrl-C;
- ``tune.log``: the console lines with timestamps (Hydra's job log; a resume appends).

A study resumes only with the settings that determine a trial's result (the controller family and
its fixed parameters, ``units`` included; the search space as sampled; the episodes: profile,
traces or sim scenario, comm model, guard, seed); they are recorded in the study
(:func:`trial_settings`) and a command that differs is refused, naming each difference.

When no trial improves on no pacing by more than noise (:class:`pacectl.tuning.verdict.ImprovementRule`:
``tune.min_cv_gain_frac``, ``tune.min_throughput_gain_frac``), the console, ``tune.json``
(``improves_on_no_pacing: false``, ``recommendation``) and the header of ``controller.yaml`` say so
and recommend the paper's threshold controller at its defaults if it meets the rule, else no pacing;
``controller.yaml`` still holds the best trial. When the chosen trial improves but that reference
beats it on both objectives (few trials), they say so too and recommend the reference. With fixed durations (max-plus: ``comm=null``, or a
contention model with no timing-dependent mechanism) nothing counts as an improvement: no delay
can shorten an iteration, so a lower CV there comes only from lengthening the fast iterations;
the warning says how many trials did that (``trials_lowering_cv_by_lengthening_only``).

Examples::

    python -m pacectl.tune cluster=st controller=threshold tune.n_trials=100
    python -m pacectl.tune cluster=ar controller=ewma tune.n_workers=2 tune.sampler=tpe
    python -m pacectl.tune cluster=contended controller=pid tune.timeout_s=60        # sim profile
    python -m pacectl.tune trace=RUN/records/none.parquet controller=pid              # your own trace
    python -m pacectl.tune cluster=st controller=pid tune.storage=sqlite:///tune.db tune.study_name=st-pid
    python -m pacectl.tune cluster=st controller=threshold hydra.run.dir=DIR         # again: resumes
    python -m pacectl.run controller_file=DIR/controller.yaml trace=st               # use the choice
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import optuna
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from pacectl.cli import (
    check_command_line,
    discard_run_dir,
    exit_on_bad_run_dir,
    expand_trace_file_argv,
    hydra_value,
    invoke,
    quiet_broken_pipe,
    sweep_job_prefix,
)
from pacectl.config import (
    CONF_DIR,
    controller_factory,
    controller_params,
    resolve_auto_horizon,
    selected_controller,
    user_path,
    validate_run_config,
)
from pacectl.controllers import family as controller_family
from pacectl.controllers.units import UNITS
from pacectl.errors import ConfigError, PacectlError, StorageFullError, one_line_warnings, unknown_keys_error
from pacectl.files import atomic_write_text, jsonable, staged_outputs
from pacectl.report import comm_model_note
from pacectl.tuning.scenarios import Evaluation, ScenarioSet, build_scenarios
from pacectl.tuning.space import SearchSpace, default_space, load_space, tunable_families
from pacectl.tuning.storage import disk_full_cause, full_disk_error
from pacectl.tuning.study import (
    DIRECTIONS,
    FINISHED,
    SAMPLERS,
    SETTINGS_ATTR,
    Objective,
    Progress,
    StorageSpec,
    check_interrupt,
    deferred_interrupts,
    fail_stale_trials,
    interruptible,
    plot_pareto,
    run_workers,
    settings_diff,
    split_quota,
    storage_spec,
    trial_points,
    worker_seed,
)
from pacectl.tuning.verdict import (
    CHOICE_RULE,
    ImprovementRule,
    TrialPoint,
    Verdict,
    dominates,
    judge,
    pareto_front,
)

#: console lines; Hydra's job logging (conf/hydra/job_logging/pacectl.yaml) also files them
log = logging.getLogger("pacectl.tune")

#: The family whose defaults are the paper's reference point.
REFERENCE = "threshold"


#: The keys of ``tune`` (conf/tune.yaml) and of ``tune.sim``; anything else (``+tune.bogus=1``) is refused.
TUNE_KEYS = frozenset(
    {
        "n_trials",
        "timeout_s",
        "sampler",
        "population_size",
        "seed",
        "n_workers",
        "study_name",
        "storage",
        "space",
        "max_throughput_loss_frac",
        "min_cv_gain_frac",
        "min_throughput_gain_frac",
        "progress",
        "on",
        "sim",
    }
)
SIM_KEYS = frozenset({"num_ranks", "num_iterations", "comm", "seeds", "heldout_seeds"})


def _check_keys(node: Any, allowed: frozenset[str], where: str) -> None:
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{where} must be a mapping of settings (conf/tune.yaml), got {node!r}")
    if {str(k) for k in node.keys()} - allowed:
        raise unknown_keys_error(where, node, allowed)


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
    min_cv_gain_frac: float
    min_throughput_gain_frac: float
    progress: bool

    @staticmethod
    def from_cfg(tune: DictConfig) -> Settings:
        """Read and check ``cfg.tune``.

        Raises:
            ConfigError: an unknown key (listing the valid ones), or a value out of range, with the
                key and value.
        """
        _check_keys(tune, TUNE_KEYS, "tune")
        if "sim" in tune:
            _check_keys(tune.sim, SIM_KEYS, "tune.sim")

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

        def fraction(key: str, example: str) -> float:
            value = tune.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ConfigError(f"tune.{key} must be a number in [0, 1) ({example}), got {value!r}")
            return float(value)

        progress = tune.get("progress", True)
        if not isinstance(progress, bool):
            raise ConfigError(
                f"tune.progress must be true or false (one line per finished trial), got {progress!r}"
            )
        if "sim" in tune:
            for key in ("seeds", "heldout_seeds"):
                seeds = tune.sim.get(key)
                if (
                    not isinstance(seeds, list | ListConfig)
                    or not seeds
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds)
                ):
                    raise ConfigError(
                        f"tune.sim.{key} must be a non-empty list of integer seeds such as [0,1,2], got {_plain(seeds)!r}"
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
            min_cv_gain_frac=fraction("min_cv_gain_frac", "0.01: the CV at least 1 % lower than no pacing's"),
            min_throughput_gain_frac=fraction(
                "min_throughput_gain_frac", "0.005: the throughput at least 0.5 % higher than no pacing's"
            ),
            progress=progress,
        )

    @property
    def rule(self) -> ImprovementRule:
        """When a trial improves on no pacing, with these settings."""
        return ImprovementRule(self.min_cv_gain_frac, self.min_throughput_gain_frac, self.max_loss_frac)


def _plain(value: Any) -> Any:
    """A config node as plain Python (for messages)."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


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


def validate_tune_config(cfg: DictConfig) -> None:
    """Every check of ``pacectl.run``'s config that applies to the tuner, before any storage is made:
    :func:`pacectl.config.validate_run_config` on every key but ``tune`` (top-level keys, seed, output
    flags, the keys of every section, and whatever else it checks), then one guard built around no
    pacing (a value :class:`~pacectl.controllers.SafetyGuard` rejects).

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    others = frozenset({"tune"})
    validate_run_config(
        OmegaConf.masked_copy(cfg, [str(k) for k in cfg.keys() if str(k) not in others]), other_keys=others
    )
    controller_factory("none", {}, cfg.guard)()  # a guard value SafetyGuard rejects (its keys: checked above)


def tune_space(cfg: DictConfig, settings: Settings) -> SearchSpace:
    """The validated search space of the selected controller family (before anything runs).

    The default is the family's (:func:`~pacectl.tuning.space.default_space`: the shipped
    ``conf/tune/space/<family>[.iteration].yaml``, else the space it registered); the
    ``.iteration`` one with ``controller.units=iteration`` (times as fractions of the median
    iteration time); ``tune.space=FILE`` replaces either.

    Raises:
        ConfigError: nothing to tune (``none``, ``all``), a bad space file, or a command-line
            ``controller.<key>=`` on a key the space tunes (it would be ignored).
    """
    backend = cfg.get("backend")
    if isinstance(backend, DictConfig) and backend.get("name") == "torch":
        raise ConfigError(
            "pacectl.tune tunes offline (a profile's traces or its simulation), not a live job: drop "
            "backend=torch, tune at your live job's decision lag (exchange.lag_iters=1 for "
            "gather=async or collective, 2 for piggyback; gather=auto is async on gloo, piggyback on "
            "NCCL; exchange.every_iters=k for gather_every=k), then run the exported controller.yaml "
            "with python -m pacectl.run backend=torch controller_file=<run dir>/controller.yaml"
        )
    family, fixed = controller_params(selected_controller(cfg))
    resolve_auto_horizon(family, fixed, cfg)
    # the families with a default search space (none and sleep_wait have no parameters; phase acts
    # on other jobs' traffic, which the tuning scenarios do not have)
    tunable = tunable_families()
    if family not in tunable:
        raise ConfigError(f"controller must be one family to tune, one of {tunable}, got {family!r}")
    units = fixed.get("units", "s")
    if units not in UNITS:
        raise ConfigError(
            f"controller.units must be one of {list(UNITS)}, got {units!r}: 's' reads every *_s parameter "
            "in seconds, 'iteration' as a fraction of the median iteration time; set controller.units=s "
            "or controller.units=iteration"
        )
    if settings.space:
        space = load_space(family, Path(user_path(settings.space, "tune.space")), fixed=fixed)
    else:
        space = default_space(family, str(units), fixed=fixed, conf_dir=CONF_DIR)
    for override in _task_overrides():
        key = _override_key(override)
        if key.startswith("controller.") and key.removeprefix("controller.") in space.keys:
            raise ConfigError(
                f"{override} sets a key the search space {space.source} tunes, so the value would be "
                f"ignored; to fix {key} at that value, use a space without it (tune.space=FILE), or drop "
                "the override to tune it"
            )
    return space


def ignored_overrides(scenarios: ScenarioSet, overrides: list[str]) -> list[str]:
    """The command line's ``tune.sim.*`` overrides that this study does not use, each with the reason:
    all of them when the episodes are traces, ``tune.sim.heldout_seeds`` always (only
    ``experiments/tuning/run_tuning.py`` reads it)."""
    lines = []
    for override in overrides:
        key = _override_key(override)
        if key != "tune.sim" and not key.startswith("tune.sim."):
            continue
        if key == "tune.sim.heldout_seeds":
            lines.append(
                f"{override} is ignored: pacectl.tune does not use held-out seeds "
                "(experiments/tuning/run_tuning.py reads them to judge a choice)"
            )
        elif scenarios.kind == "traces":
            lines.append(
                f"{override} is ignored: this study replays recorded traces "
                f"({', '.join(scenarios.labels)}), which fix the ranks and iterations; tune.sim.* applies only "
                "to simulated episodes (a profile without traces, or tune.on=sim), and on traces the comm "
                "model is the top-level comm="
            )
    return lines


def _exchange_shown(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the default decision lag spelled out, for messages: a study's scenario
    leaves ``exchange`` out when it is the default (older studies never had it), so a difference
    reads ``exchange.lag_iters: 2 ... 1`` rather than a key set on one side only."""
    episodes = settings.get("episodes")
    if not isinstance(episodes, dict) or "exchange" in episodes:
        return settings
    return {**settings, "episodes": {**episodes, "exchange": {"lag_iters": 1, "every_iters": 1}}}


def trial_settings(space: SearchSpace, scenarios: ScenarioSet) -> dict[str, Any]:
    """Everything that determines a trial's result, JSON-normalized; recorded in the study.

    ``controller``: the family and its untuned parameters (the controller group over the
    constructor's defaults, ``units`` included); ``space``: every tuned key's distribution (the
    content, not the file); ``episodes``: the scenario descriptor (profile, traces or sim cluster,
    seeds, iterations, ranks, comm model, guard, seed; a trace by its content digest, not its
    path). Not included, so free to change on resume:
    ``tune.n_trials``, ``tune.timeout_s``, sampler and its seed, workers, ``tune.progress``,
    ``tune.max_throughput_loss_frac`` (feasibility is recomputed with the current cap) and the
    improvement thresholds ``tune.min_cv_gain_frac`` and ``tune.min_throughput_gain_frac``.
    """
    import json

    episodes = dict(scenarios.descriptor)
    if episodes.get("traces"):  # a trace is its content: the same file moved (a new checkout) resumes
        episodes["traces"] = [
            {k: v for k, v in t.items() if k not in ("path", "meta")} if t.get("ops_sha256") else t
            for t in episodes["traces"]
        ]
    value = {
        "controller": {"name": space.family, **space.fixed_settings()},
        "space": space.describe(),
        "episodes": episodes,
    }
    return json.loads(json.dumps(jsonable(value), sort_keys=True, default=str))  # type: ignore[no-any-return]


def reference_params() -> dict[str, Any]:
    """The paper's threshold controller at its constructor defaults."""
    return controller_params(controller_family(REFERENCE).config())[1]


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


def _previous_study_name(out_dir: Path) -> str | None:
    """The study whose outputs ``out_dir/tune.json`` holds, or None (no readable tune.json)."""
    import json

    try:
        name = json.loads((out_dir / "tune.json").read_text()).get("study_name")
    except (OSError, ValueError, AttributeError):
        return None
    return str(name) if name is not None else None


def _open_study(
    spec: StorageSpec, name: str, scenarios: ScenarioSet, settings: dict[str, Any]
) -> optuna.Study:
    try:
        study = optuna.create_study(
            storage=spec.open(), study_name=name, directions=list(DIRECTIONS), load_if_exists=True
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
    if [d.name.lower() for d in study.directions] != list(DIRECTIONS):
        raise ConfigError(
            f"study {name!r} in {spec.display} must have directions {list(DIRECTIONS)} (throughput, cv), "
            f"got {[d.name.lower() for d in study.directions]}; choose another tune.study_name"
        )
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
        study.set_user_attr("family", settings["controller"]["name"])
        study.set_user_attr("scenario_fingerprint", scenarios.fingerprint)
        study.set_user_attr("scenarios", jsonable(scenarios.descriptor))
    elif recorded != settings:
        diffs = settings_diff(_exchange_shown(recorded), _exchange_shown(settings))
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise ConfigError(
            f"study {name!r} in {spec.display} was run with other settings than this command's, and a "
            f"study resumes only with the settings that determine a trial's result (controller family "
            f"and fixed parameters, units, search space, episodes, comm, guard): {shown or 'see tune.json'}. "
            f"{_RESUME_FIX}"
        )
    return study


def export_controller(path: Path, family: str, params: dict[str, Any], header: list[str]) -> None:
    """Write a controller config (``name`` plus parameters) that ``pacectl.run controller_file=`` loads."""
    body = yaml.safe_dump({"name": family, **jsonable(params)}, sort_keys=False)
    atomic_write_text(path, "".join(f"# {line}\n" for line in header) + body)


def _cv_change(cv: float, base_cv: float) -> float:
    """Relative CV change against no pacing (``-0.01``: 1 % lower)."""
    return cv / base_cv - 1.0 if base_cv > 0 else 0.0


def _change(loss_frac: float) -> float:
    """Throughput change against no pacing from a loss (``0.0 - x``, so no loss prints ``+0.000%``)."""
    return 0.0 - loss_frac


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
    created. The outputs are written together (staged, then moved), so none is half written.

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
    validate_tune_config(cfg)
    settings = Settings.from_cfg(cfg.tune)
    space = tune_space(cfg, settings)  # every check that needs no episode, before anything runs
    scenarios = build_scenarios(cfg, overrides=_task_overrides())
    for line in ignored_overrides(scenarios, _task_overrides()):
        warn(f"warning: {line}")
    family = space.family
    name = settings.study_name or f"{scenarios.default_study_name}-{family}"
    spec = storage_spec(settings.storage, out_dir, cwd=Path(user_path(".")))
    if settings.storage in (None, ""):
        out_dir.mkdir(parents=True, exist_ok=True)  # the default journal lives in the run folder
    previous = _previous_study_name(out_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _open_study(spec, name, scenarios, trial_settings(space, scenarios))
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
    points = trial_points(study, space, baseline, settings.max_loss_frac)
    front = pareto_front(points)
    verdict = judge(points, front, baseline, reference, settings.rule, scenarios.comm_timing_dependent)
    chosen = verdict.chosen
    chosen_trial = study.trials[chosen.number]
    params = space.resolve(chosen_trial.params)
    chosen_episodes = chosen_trial.user_attrs.get("per_episode")
    overrides, differences = run_overrides(
        scenarios.descriptor,
        user_overrides=_task_overrides(),
        chosen_episodes=chosen_episodes,
        baseline=baseline,
    )
    commands = {
        "chosen": f"python -m pacectl.run controller_file={shlex.quote(str(out_dir / 'controller.yaml'))} "
        f"{overrides}".rstrip(),
        "reference": f"python -m pacectl.run controller={REFERENCE} {overrides}".rstrip(),
        "none": f"python -m pacectl.run controller=none {overrides}".rstrip(),
    }
    recommendation = {
        "chosen": f"the chosen {space.family} controller (controller.yaml)",
        "reference": f"the paper's threshold controller at its defaults (controller={REFERENCE})",
        "none": "no pacing (controller=none)",
    }[verdict.recommend]
    warning = _warning(
        verdict, baseline, reference, settings.rule, scenarios, commands["reference"], len(points)
    )
    trials = study.get_trials(deepcopy=False)
    summary: dict[str, Any] = {
        "study_name": name,
        "storage": spec.display,
        "dashboard": spec.dashboard_command(),
        "family": space.family,
        # a trace named on the command line is what was tuned on; the profile then only names the
        # fabric (it was recorded as "ar", the default profile, for any tune trace=<file>)
        "profile": None if scenarios.trace_from_command_line else scenarios.profile,
        "trace": scenarios.labels[0] if scenarios.trace_from_command_line else None,
        "fabric_profile": scenarios.profile,
        "run_overrides": overrides,
        "run_overrides_differences": differences,
        "scenarios": {
            "kind": scenarios.kind,
            "labels": scenarios.labels,
            "fingerprint": scenarios.fingerprint,
        },
        "comm_model": scenarios.comm_model,
        "comm_model_timing_dependent": scenarios.comm_timing_dependent,
        "space": {
            "source": space.source,
            "tuned": space.keys,
            "distributions": space.describe(),
            "fixed": dict(space.fixed),
        },
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
                optuna.trial.TrialState.RUNNING,  # in other commands sharing the study: not in these outputs
            )
        },
        "baseline_none": baseline.to_json(),
        "reference_threshold": {
            **reference.to_json(),
            "params": reference_params(),
            "throughput_loss_frac": verdict.reference.throughput_loss_frac,
        },
        "choice_rule": CHOICE_RULE,
        "chosen": {
            **chosen.to_json(),
            "controller": {"name": space.family, **params},
            "per_episode": chosen_episodes,
        },
        "improvement_rule": settings.rule.describe(),
        "min_cv_gain_frac": settings.rule.min_cv_gain_frac,
        "min_throughput_gain_frac": settings.rule.min_throughput_gain_frac,
        "improves_on_no_pacing": verdict.improves,
        "trials_improving_on_no_pacing": len(verdict.improving),
        # fixed durations: trials that meet the CV rule only by lengthening fast iterations
        "trials_lowering_cv_by_lengthening_only": len(verdict.lengthening_only),
        "reference_lowers_cv_by_lengthening_only": verdict.reference_lengthening,
        "reference_improves_on_no_pacing": verdict.reference_improves,
        "recommendation": recommendation,
        "recommendation_command": commands[verdict.recommend],
        "chosen_dominates_reference": dominates(chosen, verdict.reference),
        "reference_dominates_chosen": dominates(verdict.reference, chosen),
        "front_dominates_reference": any(dominates(p, verdict.reference) for p in front),
        "pareto_size": len(front),
        "wall_time_s": time.perf_counter() - t0,
    }
    if warning:
        summary["warning"] = warning
    if not scenarios.comm_timing_dependent:
        summary["note"] = (
            f"comm model is {scenarios.comm_model} (fixed durations, max-plus, here): no delay can shorten "
            "an iteration, so no trial can beat no pacing on throughput; gains need a timing-dependent "
            "fabric (comm=contention on a profile with bursty cross traffic or interference)."
        )
    _write_outputs(out_dir, summary, verdict, points, front, baseline, reference, params, settings, scenarios)
    return TuneResult(
        study_name=name,
        storage=spec,
        family=space.family,
        scenarios=scenarios,
        baseline=baseline,
        reference=reference,
        points=points,
        front=front,
        chosen=chosen,
        controller_params=params,
        summary=summary,
    )


def _run_trials(echo: Callable[[str], None], run: _Study) -> tuple[optuna.Study, Evaluation, Evaluation]:
    """Fail the trials a killed process left running, evaluate (or read back) no pacing and the
    reference, run the missing trials in ``settings.n_workers`` workers.

    Returns:
        ``(study, no pacing, reference)``, the study reloaded with every trial finished so far.
    """
    settings, space, scenarios, spec, name, study = (
        run.settings,
        run.space,
        run.scenarios,
        run.spec,
        run.name,
        run.study,
    )
    stale = fail_stale_trials(study)
    if stale:
        echo(f"marked {len(stale)} trial(s) left running by a killed process as FAIL: {stale}")
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
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
    echo(
        f"study {name!r} ({spec.display}): {space.family} on "
        + (
            "the command line's trace ("
            + (f"profile {scenarios.profile} for the fabric; " if scenarios.comm_model != "null" else "")
            + f"{scenarios.kind}: "
            if scenarios.trace_from_command_line
            else f"{scenarios.profile} ({scenarios.kind}: "
        )
        + f"{', '.join(scenarios.labels)}; comm model {scenarios.comm_model}), {done} finished trial(s), "
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
            progress=Progress(done, settings.n_trials),
            echo=echo if settings.progress else None,
        )
    check_interrupt()  # a Ctrl-C that arrived outside an evaluation: stop before writing any output
    study = optuna.load_study(study_name=name, storage=spec.open())
    trials = study.get_trials(deepcopy=False)
    elsewhere = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    if elsewhere:
        echo(
            f"note: trial(s) {elsewhere} still running in other commands sharing the study: these outputs "
            f"use the {sum(t.state in FINISHED for t in trials)} finished trial(s); rerun this command after "
            "they end to include them"
        )
    return study, baseline, reference


def _warning(
    verdict: Verdict,
    baseline: Evaluation,
    reference: Evaluation,
    rule: ImprovementRule,
    scenarios: ScenarioSet,
    reference_command: str,
    completed: int,
) -> str | None:
    """The console's (and ``tune.json``'s) warning when the choice is not what to run, else None."""
    chosen, ref_loss = verdict.chosen, verdict.reference.throughput_loss_frac
    if verdict.recommend == "chosen":
        return None
    if verdict.reference_beats_choice:
        return (
            f"the paper's threshold controller at its defaults beats the chosen trial {chosen.number} on both "
            f"objectives ({_change(ref_loss):+.3%} throughput, cv {reference.cv:.4g}, against "
            f"{_change(chosen.throughput_loss_frac):+.3%} and cv {chosen.cv:.4g}): recommended, run it with: "
            f"{reference_command}. controller.yaml holds the chosen trial anyway; to search further raise "
            f"tune.n_trials ({completed} completed) or try another search space"
        )
    if verdict.reference_improves:
        advice = (
            f"The paper's threshold controller at its defaults does ({_change(ref_loss):+.3%} throughput, "
            f"cv {reference.cv:.4g}, {_cv_change(reference.cv, baseline.cv):+.3%}): recommended, "
            f"run it with: {reference_command}. "
        )
    else:
        advice = "Recommended: no pacing. "
    if verdict.lengthening_only or verdict.reference_lengthening:
        who = " and ".join(
            ([f"{len(verdict.lengthening_only)} trial(s)"] if verdict.lengthening_only else [])
            + (["the paper's threshold at its defaults"] if verdict.reference_lengthening else [])
        )
        advice = (
            f"{who} lower the CV by at least {rule.min_cv_gain_frac:.2%} within the cap, but durations "
            "are fixed here (max-plus), so only by lengthening the fast iterations (none gets shorter): "
            f"not counted as an improvement. {advice}"
        )
    return (
        f"no trial improves on no pacing ({completed} completed; rule: CV at least "
        f"{rule.min_cv_gain_frac:.2%} lower within the throughput-loss cap, or throughput at least "
        f"{rule.min_throughput_gain_frac:.2%} higher at a CV no higher; improvement_rule in tune.json): "
        "the chosen trial "
        f"{chosen.number} has {_change(chosen.throughput_loss_frac):+.3%} throughput and cv {chosen.cv:.4g} "
        f"({_cv_change(chosen.cv, baseline.cv):+.3%} against no pacing's {baseline.cv:.4g}). {advice}"
        "controller.yaml holds that trial anyway, flagged; "
        + (
            "to search further raise tune.n_trials, try another family or search space"
            if scenarios.comm_timing_dependent
            else "more trials cannot change this with fixed durations: a gain needs a timing-dependent "
            "model (cluster=contended: simulated interference; a replay needs comm=contention with "
            "bursty cross traffic on links its ring crosses)"
        )
    )


def _write_outputs(
    out_dir: Path,
    summary: dict[str, Any],
    verdict: Verdict,
    points: list[TrialPoint],
    front: list[TrialPoint],
    baseline: Evaluation,
    reference: Evaluation,
    params: dict[str, Any],
    settings: Settings,
    scenarios: ScenarioSet,
) -> None:
    """``pareto.png``, ``pareto.json``, ``controller.yaml`` (with its header) and ``tune.json``, together."""
    chosen, family = verdict.chosen, summary["family"]
    title = (
        f"{family} on {scenarios.profile} ({scenarios.kind}, {len(scenarios.labels)} episode(s)), "
        f"{len(points)} trials\n{comm_model_note(scenarios.comm_model, scenarios.comm_timing_dependent)}"
        + ("" if verdict.improves else "; no trial improves on no pacing")
    )
    header = [
        f"Tuned by pacectl.tune: study {summary['study_name']!r}, trial {chosen.number}, profile "
        f"{scenarios.profile} ({scenarios.kind}), comm model {scenarios.comm_model}",
        f"throughput {chosen.throughput_it_per_s:.6g} it/s ({_change(chosen.throughput_loss_frac):+.3%} vs no "
        f"pacing), cv {chosen.cv:.4g} (no pacing: cv {baseline.cv:.4g})"
        f"{'' if chosen.feasible else ' (over the throughput-loss cap)'}",
    ]
    if not verdict.improves:
        header += [
            "WARNING: no trial improves on no pacing on these episodes (tune.json: improvement_rule):",
            f"this is the best trial found, not an improvement; recommended: {summary['recommendation']}.",
        ]
    elif verdict.reference_beats_choice:
        header += [
            "WARNING: the paper's threshold controller at its defaults beats this trial on both objectives",
            f"(tune.json: reference_dominates_chosen); recommended: {summary['recommendation']}.",
        ]
    header.append(
        f"Use: python -m pacectl.run controller_file=<this file> {summary['run_overrides']}".rstrip()
    )
    with staged_outputs(out_dir) as stage:
        plot_pareto(
            stage / "pareto.png",
            points,
            front,
            baseline=baseline,
            reference=reference,
            chosen=chosen,
            title=title,
            max_loss_frac=settings.max_loss_frac,
        )
        atomic_write_text(stage / "pareto.json", _json([p.to_json() for p in front]))
        export_controller(stage / "controller.yaml", family, params, header)
        atomic_write_text(stage / "tune.json", _json(summary))


def _task_overrides() -> list[str]:
    """The command line's overrides of the job (empty outside a Hydra app)."""
    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def _override_value(value: Any) -> str:
    """A value as a Hydra override writes it (``null``, ``[0,1]``, ``0.5``, ``name``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def run_overrides(
    descriptor: dict[str, Any],
    *,
    user_overrides: list[str] | None = None,
    chosen_episodes: list[dict[str, Any]] | None = None,
    baseline: Evaluation | None = None,
) -> tuple[str, list[str]]:
    """``python -m pacectl.run`` overrides that rerun the episodes a study tuned on, and what differs.

    Sim profiles: ``backend=sim cluster= comm= backend.num_ranks= backend.num_iterations=`` and the
    first of ``tune.sim.seeds`` as ``seed=``; traces: the first trace (``trace=`` or its format, path,
    meta), ``comm=``/``cluster=`` when comm is not null, ``seed=`` when not 0. Both: ``guard.*`` that
    differ from ``conf/config.yaml``, ``exchange.*`` when the study modelled a decision lag, and the command line's ``cluster.*`` and (traces) ``backend.*``
    overrides. ``pacectl.run`` runs one episode, so with several (seeds, traces) the run reproduces
    the first: each difference is listed, with the chosen trial's own figures on that episode.

    Args:
        descriptor: the scenario descriptor of the study.
        user_overrides: the tune command's overrides (``cluster.*``, ``backend.*`` are passed on).
        chosen_episodes: the chosen trial's ``per_episode`` figures, if recorded.
        baseline: no pacing on the same episodes (its ``per_episode`` figures).

    Returns:
        ``(overrides, differences)``: the overrides as one string, the differences as sentences.
    """
    comm = descriptor.get("comm") or "null"
    profile = descriptor.get("profile", "generic")
    differences: list[str] = []
    labels: list[str]
    if descriptor.get("kind") == "sim":
        backend = descriptor.get("backend", {})
        seeds = list(descriptor.get("seeds") or [0])
        labels = [f"seed={s}" for s in seeds]
        parts = [
            "backend=sim",
            f"cluster={profile}",
            f"comm={comm}",
            f"backend.num_ranks={backend.get('num_ranks')}",
            f"backend.num_iterations={backend.get('num_iterations')}",
            f"seed={seeds[0]}",
        ]
    else:
        traces = descriptor.get("traces") or [{}]
        labels = [str(t.get("name") or f"trace{i}") for i, t in enumerate(traces)]
        trace = traces[0]
        name = str(trace.get("name") or "")
        if (
            trace.get("format") == "bytedance"
            and name.upper() in ("AR", "ST")
            and "pacectl/data" in str(trace.get("path"))
        ):
            parts = [f"trace={name.lower()}"]
        else:
            path = trace.get("path")
            shown = (
                "[" + ",".join(hydra_value(str(p)) for p in path) + "]"
                if isinstance(path, list)
                else hydra_value(str(path))
            )
            parts = [
                f"trace={trace.get('format')}",
                f"trace.path={shown}",
            ]  # Hydra's grammar, then the shell's
            if trace.get("meta"):
                parts.append(f"trace.meta={hydra_value(str(trace.get('meta')))}")
        if comm != "null":
            parts += [f"comm={comm}", f"cluster={profile}"]
        if descriptor.get("seed") not in (None, 0):
            parts.append(f"seed={descriptor['seed']}")
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").guard, resolve=True)
    assert isinstance(defaults, dict)
    for key, value in (descriptor.get("guard") or {}).items():
        if key not in defaults:
            parts.append(f"+guard.{key}={_override_value(value)}")
        elif defaults[key] != value:
            parts.append(f"guard.{key}={_override_value(value)}")
    for key, value in (descriptor.get("exchange") or {}).items():
        parts.append(f"exchange.{key}={value}")
    passed = ("cluster.",) if descriptor.get("kind") == "sim" else ("cluster.", "backend.")
    for override in user_overrides or []:
        key = _override_key(override)
        if key.startswith(passed) and not key.startswith("cluster.tune_sim"):
            parts.append(override)
    if len(labels) > 1:
        what = "seeds" if descriptor.get("kind") == "sim" else "traces"
        own = ""
        if chosen_episodes and baseline is not None and baseline.per_episode:
            ep, base = chosen_episodes[0], baseline.per_episode[0]
            own = (
                f" (the chosen trial on {ep['label']}: "
                f"{ep['throughput_it_per_s'] / base['throughput_it_per_s'] - 1.0:+.3%} throughput, "
                f"cv {ep['cv']:.4g}; no pacing cv {base['cv']:.4g})"
            )
        differences.append(
            f"the tuned figures are means over the {what} {', '.join(labels)}; this runs {labels[0]} only{own}"
        )
    return " ".join(shlex.quote(p) for p in parts), differences


def resume_command(out_dir: Path, storage: str | None) -> str:
    """The command that resumes this study: this command's overrides, plus ``hydra.run.dir=`` when the
    study is the default journal of the run directory and the command did not name one."""
    if not HydraConfig.initialized():
        return "the same run_tuning call (same storage and study name)"
    hc = HydraConfig.get()
    parts = ["python", "-m", "pacectl.tune", *[str(o) for o in hc.overrides.task]]
    parts += [str(o) for o in hc.overrides.hydra if _override_key(str(o)) != "hydra.mode"]  # Hydra adds it
    named_dir = any(_override_key(str(o)) == "hydra.run.dir" for o in hc.overrides.hydra)
    if storage in (None, "") and not named_dir:
        parts.append(f"hydra.run.dir={out_dir}")
    return " ".join(shlex.quote(p) for p in parts)


def _json(value: Any) -> str:
    import json

    return json.dumps(jsonable(value), indent=2, sort_keys=False) + "\n"


def _ties_note(result: TuneResult) -> str:
    """`` (k of them tie exactly with no pacing)`` when some front points never paced, else ``""``.

    A trial whose controller never engaged reproduces no pacing's objectives bit for bit; several
    such trials all sit on the front (none dominates another), which would overstate its size.
    """
    base = result.baseline
    ties = sum(p.throughput_it_per_s == base.throughput_it_per_s and p.cv == base.cv for p in result.front)
    return f" ({ties} of them tie exactly with no pacing)" if ties > 1 else ""


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="tune")
def _hydra_main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    one_line_warnings(newline=False)  # Python warnings (the episodes' set-up) as pacectl.run shows them
    logging.captureWarnings(True)
    try:
        result = run_tuning(cfg, out_dir, echo=log.info, warn=log.warning)
    except MissingMandatoryValue as err:
        _fail(f"config value {err.full_key} must be set, got '???'")
    except OmegaConfBaseException as err:
        _fail(f"bad config: {err}")
    except PacectlError as err:
        _fail(str(err))
    except TuneInterrupted as err:
        _interrupted(
            keep_logs=True,
            message=f"interrupted; the study's {'' if err.finished is None else f'{err.finished} '}finished trial(s) "
            f"are kept in {err.storage.display} (study {err.study_name!r}) and this run wrote no outputs; "
            f"resume with the same command: {resume_command(out_dir, cfg.tune.get('storage'))}",
        )
    except KeyboardInterrupt:
        _interrupted("interrupted before the study was created; nothing was written")
    except (OSError, AssertionError) as err:  # a full disk: Optuna hides ENOSPC behind AssertionError
        full = disk_full_cause(err)
        if full is None:
            discard_run_dir(out_dir)
            raise
        _fail(
            str(full)
            if isinstance(full, StorageFullError)
            else str(full_disk_error(full, f"the run folder {out_dir}"))
        )
    except BaseException:  # a bug, not a user mistake: its traceback follows, but no half run folder
        discard_run_dir(out_dir)
        raise
    s = result.summary
    c = result.chosen
    log.info(
        f"pareto front: {len(result.front)} of {len(result.points)} completed trials{_ties_note(result)}; "
        f"chosen trial {c.number}: "
        f"{c.throughput_it_per_s:.6g} it/s ({_change(c.throughput_loss_frac):+.3%} vs no pacing), cv {c.cv:.4g} "
        f"({_cv_change(c.cv, result.baseline.cv):+.3%} vs no pacing's {result.baseline.cv:.4g}; paper threshold "
        f"{result.reference.cv:.4g})" + ("" if c.feasible else " [no trial met the throughput-loss cap]")
    )
    log.info(f"chosen params: {c.params}")
    if "warning" in s:
        log.warning(f"warning: {s['warning']}")
    if "note" in s:
        log.info(f"note: {s['note']}")
    log.info(f"outputs: {out_dir} (pareto.json, pareto.png, controller.yaml, tune.json, tune.log)")
    chosen_command = f"python -m pacectl.run controller_file={shlex.quote(str(out_dir / 'controller.yaml'))} {s['run_overrides']}"
    if s["recommendation_command"] == chosen_command.rstrip():
        log.info(f"use it:  {chosen_command}")
    else:  # the warning above says why
        log.info(f"recommended:  {s['recommendation_command']}")
        log.info(f"the chosen trial (not recommended):  {chosen_command}")
    for line in s["run_overrides_differences"]:
        log.info(f"         note: {line}")
    log.info(f"inspect: {result.storage.dashboard_command()}   (pip install optuna-dashboard)")


def _interrupted(message: str, *, keep_logs: bool = False) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not print a traceback
    print(f"pacectl.tune: {message}", file=sys.stderr, flush=True)
    discard_run_dir(Path(HydraConfig.get().runtime.output_dir), keep_logs=keep_logs)
    sys.exit(130)


def _fail(message: str) -> None:
    print(f"pacectl.tune: error: {sweep_job_prefix()}{message}", file=sys.stderr)
    discard_run_dir(Path(HydraConfig.get().runtime.output_dir))
    sys.exit(2)


def _check_config(cfg: DictConfig) -> None:
    """What the tuner would refuse at once (keys, guard, settings, search space), checked before Hydra
    creates the run folder; the episodes are built (and checked) by the job."""
    validate_tune_config(cfg)
    tune_space(cfg, Settings.from_cfg(cfg.tune))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``pacectl-tune``): runs the command line ``argv`` (default: this
    process's) and returns the exit status: 0, 2 for a user mistake, 130 for Ctrl-C."""
    return invoke("pacectl.tune", argv, _main)


def _main() -> None:
    expand_trace_file_argv("pacectl.tune", CONF_DIR)
    exit_on_bad_run_dir("pacectl.tune")
    check_command_line("pacectl.tune", CONF_DIR, "tune", validate=_check_config)
    try:
        _hydra_main()
    except BrokenPipeError:  # --help | head
        quiet_broken_pipe()
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
