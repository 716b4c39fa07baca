"""The tuner's settings: ``tune.*`` checked, the search space of the command, and the settings a
study records so that it resumes only with the same ones.

- :class:`Settings` (:mod:`pacectl.tuning.config`): the typed ``tune.*`` keys;
- :func:`validate_tune_config`: every check of ``pacectl.run``'s config that applies to the tuner;
- :func:`tune_space`: the search space of the selected family;
- :func:`trial_settings`: everything that determines a trial's result, recorded in the study;
  :func:`settings_diff` names each difference of a resume that is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pacectl.config import (
    CONF_DIR,
    controller_params,
    resolve_auto_horizon,
    selected_controller,
    user_path,
    validate_run_config,
)
from pacectl.controllers import family as controller_family
from pacectl.controllers.units import UNITS
from pacectl.errors import ConfigError
from pacectl.files import jsonable
from pacectl.tuning.config import Settings
from pacectl.tuning.scenarios import ScenarioSet
from pacectl.tuning.space import SearchSpace, default_space, load_space, tunable_families
from pacectl.tuning.verdict import DEFAULT_OBJECTIVES

#: The family whose defaults are the paper's reference point.
REFERENCE = "threshold"


def validate_tune_config(cfg: DictConfig) -> Settings:
    """Every check of ``pacectl.run``'s config (:func:`pacectl.config.validate_run_config`: keys,
    ranges, the guard), and ``tune``'s own (:class:`Settings`), before any storage is made.

    Returns:
        The checked ``tune.*`` settings.

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    validate_run_config(cfg)
    return Settings.from_cfg(cfg.tune)


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
    for override in task_overrides():
        key = override_key(override)
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
        key = override_key(override)
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


#: Study user attribute holding :func:`trial_settings` of the command that created it.
SETTINGS_ATTR = "trial_settings"


def exchange_shown(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the default decision lag spelled out, for messages: a study's scenario
    leaves ``exchange`` out when it is the default (older studies never had it), so a difference
    reads ``exchange.lag_iters: 2 ... 1`` rather than a key set on one side only."""
    episodes = settings.get("episodes")
    if not isinstance(episodes, dict) or "exchange" in episodes:
        return settings
    return {**settings, "episodes": {**episodes, "exchange": {"lag_iters": 1, "every_iters": 1}}}


def trial_settings(
    space: SearchSpace, scenarios: ScenarioSet, objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
) -> dict[str, Any]:
    """Everything that determines a trial's result, JSON-normalized; recorded in the study.

    ``controller``: the family and its untuned parameters (the controller group over the
    constructor's defaults, ``units`` included); ``space``: every tuned key's distribution (the
    content, not the file); ``episodes``: the scenario descriptor (profile, traces or sim cluster,
    seeds, iterations, ranks, comm model, guard, seed; a trace by its content digest, not its
    path). Not included, so free to change on resume:
    ``tune.n_trials``, ``tune.timeout_s``, sampler and its seed, workers, ``tune.progress``,
    ``tune.max_throughput_loss_frac`` (feasibility is recomputed with the current cap) and the
    improvement thresholds ``tune.min_cv_gain_frac``, ``tune.min_throughput_gain_frac`` and
    ``tune.min_energy_gain_frac``. ``objectives``: ``tune.objectives`` when not the default (so that
    studies from before it resume), with the power profile among the episodes' settings when energy
    is one of them.
    """
    import json

    episodes = dict(scenarios.descriptor)
    if episodes.get("traces"):  # a trace is its content: the same file moved (a new checkout) resumes
        episodes["traces"] = [
            {k: v for k, v in t.items() if k not in ("path", "meta")} if t.get("ops_sha256") else t
            for t in episodes["traces"]
        ]
    value: dict[str, Any] = {
        "controller": {"name": space.family, **space.fixed_settings()},
        "space": space.describe(),
        "episodes": episodes,
    }
    if objectives != DEFAULT_OBJECTIVES:  # absent when default: studies from before it still resume
        value["objectives"] = list(objectives)
        if "energy" in objectives:  # the energy objective's values depend on the power profile
            episodes["power"] = scenarios.power.name
    return json.loads(json.dumps(jsonable(value), sort_keys=True, default=str))  # type: ignore[no-any-return]


def reference_params() -> dict[str, Any]:
    """The paper's threshold controller at its constructor defaults."""
    return controller_params(controller_family(REFERENCE).config())[1]


#: Section of the trial settings -> how a message names its keys, and what a missing key means there.
_SECTIONS = {
    "controller": ("controller.{}", "tuned (in the search space)"),
    "space": ("search space key {}", "not tuned"),
    "episodes": ("episodes: {}", "not set"),
    "objectives": ("tune.objectives{}", "[throughput, cv] (the default)"),
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

    # the power profile is recorded only with the energy objective: its absence on the side without
    # that objective is a consequence of the objectives line, not a second difference
    energy = ["energy" in side.get("objectives", ()) for side in (old, new)]
    for section in sorted(set(old) | set(new)):
        template, absent = _SECTIONS.get(section, (section + ".{}", "not set"))
        depth = {"controller": 1, "space": 2}.get(section, -1)
        found: list[tuple[bool, str]] = []
        a, b = old.get(section, _ABSENT), new.get(section, _ABSENT)
        if isinstance(a, dict) or isinstance(b, dict):  # a mapping section: compared key by key
            a, b = ({} if a is _ABSENT else a), ({} if b is _ABSENT else b)
            if section == "episodes" and energy[0] != energy[1]:
                a, b = (
                    {k: v for k, v in a.items() if k != "power"},
                    {k: v for k, v in b.items() if k != "power"},
                )
        walk(a, b, "", depth, template, absent, found)
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


def task_overrides() -> list[str]:
    """The command line's overrides of the job (empty outside a Hydra app)."""
    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")
