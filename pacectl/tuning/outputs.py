"""What a tuning run writes and says: ``tune.json``, ``pareto.json``, ``pareto.png``,
``controller.yaml`` (with its header), the warning when the choice is not what to run, the
``pacectl.run`` command that reruns the tuned episodes, and the console's closing lines.

The outputs are written together (staged, then moved into place), so none is half written.
"""

from __future__ import annotations

import json
import logging
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from pacectl.cli import hydra_value
from pacectl.files import atomic_write_text, jsonable, staged_outputs
from pacectl.report import comm_model_note
from pacectl.tuning.scenarios import Evaluation, ScenarioSet
from pacectl.tuning.settings import REFERENCE, Settings, override_key, reference_params, task_overrides
from pacectl.tuning.space import SearchSpace
from pacectl.tuning.storage import StorageSpec
from pacectl.tuning.verdict import (
    DEFAULT_OBJECTIVES,
    OBJECTIVES,
    ImprovementRule,
    TrialPoint,
    Verdict,
    choice_rule,
    dominates,
)


@dataclass(frozen=True)
class TuneResult:
    """What one tuning run produced (also written to ``tune.json``); ``commands``: the ``pacectl.run``
    command of the chosen trial, the reference and no pacing (keys ``chosen``, ``reference``, ``none``)."""

    storage: StorageSpec
    scenarios: ScenarioSet
    baseline: Evaluation
    reference: Evaluation
    points: list[TrialPoint]
    front: list[TrialPoint]
    chosen: TrialPoint
    controller_params: dict[str, Any]
    summary: dict[str, Any]
    commands: dict[str, str]


def export_controller(path: Path, family: str, params: dict[str, Any], header: list[str]) -> None:
    """Write a controller config (``name`` plus parameters) that ``pacectl.run controller_file=`` loads."""
    body = yaml.safe_dump({"name": family, **jsonable(params)}, sort_keys=False)
    atomic_write_text(path, "".join(f"# {line}\n" for line in header) + body)


def _cv_change(cv: float, base_cv: float) -> float:
    """Relative CV change against no pacing (``-0.01``: 1 % lower)."""
    return cv / base_cv - 1.0 if base_cv > 0 else 0.0


def _energy_change(point: TrialPoint, baseline: Evaluation) -> float:
    """Relative energy change against no pacing (``-0.01``: 1 % less energy per iteration)."""
    return point.energy_per_iteration_j / baseline.energy_per_iteration_j - 1.0


def _change(loss_frac: float) -> float:
    """Throughput change against no pacing from a loss (``0.0 - x``, so no loss prints ``+0.000%``)."""
    return 0.0 - loss_frac


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
            f"the paper's threshold controller at its defaults beats the chosen trial {chosen.number} on every "
            f"objective ({_change(ref_loss):+.3%} throughput, cv {reference.cv:.4g}, against "
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
        f"{rule.min_throughput_gain_frac:.2%} higher at a CV no higher"
        + (
            f", or energy per iteration at least {rule.min_energy_gain_frac:.2%} lower within the cap"
            if "energy" in rule.objectives
            else ""
        )
        + "; improvement_rule in tune.json): "
        "the chosen trial "
        f"{chosen.number} has {_change(chosen.throughput_loss_frac):+.3%} throughput and cv {chosen.cv:.4g} "
        f"({_cv_change(chosen.cv, baseline.cv):+.3%} against no pacing's {baseline.cv:.4g}). {advice}"
        "controller.yaml holds that trial anyway, flagged; "
        + (
            "to search further raise tune.n_trials, try another family or search space"
            if scenarios.comm_timing_dependent or "energy" in rule.objectives
            else "more trials cannot change this with fixed durations: a gain needs a timing-dependent "
            "model (cluster=contended: simulated interference; a replay needs comm=contention with "
            "bursty cross traffic on links its ring crosses)"
        )
    )


def write_results(
    out_dir: Path,
    *,
    name: str,
    spec: StorageSpec,
    space: SearchSpace,
    settings: Settings,
    scenarios: ScenarioSet,
    study: optuna.Study,
    points: list[TrialPoint],
    front: list[TrialPoint],
    verdict: Verdict,
    baseline: Evaluation,
    reference: Evaluation,
    wall_time_s: float,
) -> TuneResult:
    """Build ``tune.json``'s summary of a judged study (:func:`pacectl.tuning.verdict.judge`), write every
    output together (:func:`write_outputs`) and return the :class:`TuneResult`."""
    chosen, objs = verdict.chosen, settings.objectives
    chosen_trial = study.trials[chosen.number]
    params = space.resolve(chosen_trial.params)
    chosen_episodes = chosen_trial.user_attrs.get("per_episode")
    overrides, differences = run_overrides(
        scenarios.descriptor,
        user_overrides=task_overrides(),
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
            OBJECTIVES[o][0]: f"{direction} (mean over episodes)"
            for o, direction in zip(objs, settings.directions, strict=True)
        },
        "max_throughput_loss_frac": settings.max_throughput_loss_frac,
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
        "choice_rule": choice_rule(objs),
        "chosen": {
            **chosen.to_json(),
            "controller": {"name": space.family, **params},
            "per_episode": chosen_episodes,
        },
        "improvement_rule": settings.rule.describe(),
        "min_cv_gain_frac": settings.rule.min_cv_gain_frac,
        "min_throughput_gain_frac": settings.rule.min_throughput_gain_frac,
        **({"min_energy_gain_frac": settings.rule.min_energy_gain_frac} if "energy" in objs else {}),
        "improves_on_no_pacing": verdict.improves,
        "trials_improving_on_no_pacing": len(verdict.improving),
        # fixed durations: trials that meet the CV rule only by lengthening fast iterations
        "trials_lowering_cv_by_lengthening_only": len(verdict.lengthening_only),
        "reference_lowers_cv_by_lengthening_only": verdict.reference_lengthening,
        "reference_improves_on_no_pacing": verdict.reference_improves,
        "recommendation": recommendation,
        "recommendation_command": commands[verdict.recommend],
        "chosen_dominates_reference": dominates(chosen, verdict.reference, objs),
        "reference_dominates_chosen": dominates(verdict.reference, chosen, objs),
        "front_dominates_reference": any(dominates(p, verdict.reference, objs) for p in front),
        "pareto_size": len(front),
        "wall_time_s": wall_time_s,
    }
    if "energy" in objs:
        power = scenarios.power
        summary["power_profile"] = power.describe()
        summary["energy_note"] = (
            f"energy is modelled (pacectl/energy.py) under the power profile {power.name!r}: a controller "
            f"saves energy by turning spinning waits ({power.spin_w:g} W) into pacing sleep ({power.sleep_w:g} W) "
            f"(spin_w: {power.sources.get('spin_w', 'no source given')}; sleep_w: "
            f"{power.sources.get('sleep_w', 'no source given')}); with all states at one power (the null "
            "model) it saves nothing beyond its time ratio"
        )
    if warning:
        summary["warning"] = warning
    if not scenarios.comm_timing_dependent:
        summary["note"] = (
            f"comm model is {scenarios.comm_model} (fixed durations, max-plus, here): no delay can shorten "
            "an iteration, so no trial can beat no pacing on throughput; gains need a timing-dependent "
            "fabric (comm=contention on a profile with bursty cross traffic or interference)."
            + (
                " An energy saving still counts: it needs no shorter iteration, only waits that draw less power."
                if "energy" in objs
                else ""
            )
        )
    result = TuneResult(
        storage=spec,
        scenarios=scenarios,
        baseline=baseline,
        reference=reference,
        points=points,
        front=front,
        chosen=chosen,
        controller_params=params,
        summary=summary,
        commands=commands,
    )
    write_outputs(out_dir, result, verdict, settings)
    return result


def write_outputs(out_dir: Path, result: TuneResult, verdict: Verdict, settings: Settings) -> None:
    """``pareto.png``, ``pareto.json``, ``controller.yaml`` (with its header) and ``tune.json``, together."""
    summary, scenarios, baseline, points = result.summary, result.scenarios, result.baseline, result.points
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
    if "energy" in settings.objectives:
        header.append(
            f"energy {chosen.energy_per_iteration_j:.6g} J per iteration summed over ranks "
            f"({_energy_change(chosen, baseline):+.3%} vs no pacing; power profile {scenarios.power.name})"
        )
    if not verdict.improves:
        header += [
            "WARNING: no trial improves on no pacing on these episodes (tune.json: improvement_rule):",
            f"this is the best trial found, not an improvement; recommended: {summary['recommendation']}.",
        ]
    elif verdict.reference_beats_choice:
        header += [
            "WARNING: the paper's threshold controller at its defaults beats this trial on every objective",
            f"(tune.json: reference_dominates_chosen); recommended: {summary['recommendation']}.",
        ]
    header.append(
        f"Use: python -m pacectl.run controller_file=<this file> {summary['run_overrides']}".rstrip()
    )
    with staged_outputs(out_dir) as stage:
        plot_pareto(
            stage / "pareto.png",
            points,
            result.front,
            baseline=baseline,
            reference=result.reference,
            chosen=chosen,
            title=title,
            max_loss_frac=settings.max_throughput_loss_frac,
            objectives=settings.objectives,
        )
        atomic_write_text(stage / "pareto.json", _json([p.to_json() for p in result.front]))
        export_controller(stage / "controller.yaml", family, result.controller_params, header)
        atomic_write_text(stage / "tune.json", _json(summary))


def _override_value(value: Any) -> str:
    """A value as a Hydra override writes it (``null``, ``[0,1]``, ``0.5``, ``name``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)


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
    profile = descriptor.get("profile", "cost_optimized")  # studies before it was named: generic
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
            # Hydra's grammar here, then the shell's (shlex.quote below)
            parts = [f"trace={trace.get('format')}", f"trace.path={shown}"]
            if trace.get("meta"):
                parts.append(f"trace.meta={hydra_value(str(trace.get('meta')))}")
        if comm != "null":
            parts += [f"comm={comm}", f"cluster={profile}"]
        if descriptor.get("seed") not in (None, 0):
            parts.append(f"seed={descriptor['seed']}")
    from pacectl.controllers.guard import GuardConfig

    defaults = vars(GuardConfig())  # the guard's defaults live in its typed config
    for key, value in (descriptor.get("guard") or {}).items():
        if key not in defaults:
            parts.append(f"+guard.{key}={_override_value(value)}")
        elif defaults[key] != value:
            parts.append(f"guard.{key}={_override_value(value)}")
    for key, value in (descriptor.get("exchange") or {}).items():
        parts.append(f"exchange.{key}={value}")
    passed = ("cluster.",) if descriptor.get("kind") == "sim" else ("cluster.", "backend.")
    for override in user_overrides or []:
        key = override_key(override)
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


def _json(value: Any) -> str:
    return json.dumps(jsonable(value), indent=2, sort_keys=False) + "\n"


def _ties_note(result: TuneResult) -> str:
    """`` (k of them tie exactly with no pacing)`` when some front points never paced, else ``""``.

    A trial whose controller never engaged reproduces no pacing's objectives bit for bit; several
    such trials all sit on the front (none dominates another), which would overstate its size.
    """
    base = result.baseline
    ties = sum(p.throughput_it_per_s == base.throughput_it_per_s and p.cv == base.cv for p in result.front)
    return f" ({ties} of them tie exactly with no pacing)" if ties > 1 else ""


#: axis label of each objective in ``pareto.png``
_AXIS = {
    "throughput": "throughput, it/s (mean over episodes; higher is better)",
    "cv": "CV of iteration time\n(mean over episodes; lower is better)",
    "energy": "energy per iteration, J, summed over ranks\n(mean over episodes; lower is better)",
}


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
    objectives: Sequence[str] = DEFAULT_OBJECTIVES,
) -> None:
    """Pareto-front PNG (atomic): every trial, the front, no pacing, the paper's threshold, the choice,
    and the throughput-loss cap (a vertical line; trials left of it break the constraint). One panel
    per pair of objectives (three panels for three objectives); the front is the front on all of them."""
    from itertools import combinations

    from matplotlib.figure import Figure

    from pacectl.report import save_figure

    pairs = list(combinations(objectives, 2))
    fig = Figure(figsize=(7.5 if len(pairs) == 1 else 15.0, 5.0), layout="constrained")
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]
    feas = [p for p in points if p.feasible]
    infeas = [p for p in points if not p.feasible]
    for ax, (xo, yo) in zip(axes, pairs, strict=True):

        def xy(items: Sequence[Any], xo: str = xo, yo: str = yo) -> tuple[list[float], list[float]]:
            attr_x, attr_y = OBJECTIVES[xo][0], OBJECTIVES[yo][0]
            return [getattr(p, attr_x) for p in items], [getattr(p, attr_y) for p in items]

        if infeas:
            ax.scatter(*xy(infeas), s=10, c="0.8", label="trial (over the loss cap)")
        if feas:
            ax.scatter(*xy(feas), s=12, c="0.5", label="trial")
        ordered = sorted(front, key=lambda p: getattr(p, OBJECTIVES[xo][0]))
        ax.plot(
            *xy(ordered), "o-" if len(pairs) == 1 else "o", c="tab:blue", ms=5, lw=1, label="Pareto front"
        )
        for point, marker, size, color, label, zorder in (
            (baseline, "X", 110, "black", "no pacing", 5),
            (reference, "D", 70, "tab:red", "paper threshold (defaults)", 5),
            (chosen, "*", 260, "tab:orange", f"chosen (trial {chosen.number})", 6),
        ):
            ax.scatter(*xy([point]), marker=marker, s=size, c=color, label=label, zorder=zorder)
        if max_loss_frac is not None and xo == "throughput":
            ax.axvline(
                baseline.throughput_it_per_s * (1.0 - max_loss_frac),
                color="grey",
                ls=":",
                lw=1.2,
                label=f"throughput-loss cap ({max_loss_frac:.1%})",
            )
        ax.set_xlabel(_AXIS[xo].replace("\n", " "))
        ax.set_ylabel(_AXIS[yo])
        ax.grid(alpha=0.3)
    # long lines (the comm model's note) wrapped to the figure's width, which constrained layout
    # does not shrink a title to
    fig.suptitle("\n".join(textwrap.fill(line, 85 * len(pairs)) for line in title.splitlines()), fontsize=9)
    axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3, frameon=False)
    save_figure(fig, path)


def closing_lines(result: TuneResult, out_dir: Path) -> list[tuple[int, str]]:
    """The console's closing lines of a finished tuning run, each with its logging level: the front,
    the choice, the warning, the outputs, the command to run (or the recommended one) and the dashboard."""
    lines: list[tuple[int, str]] = []
    s = result.summary
    c = result.chosen
    lines.append(
        (
            logging.INFO,
            f"pareto front: {len(result.front)} of {len(result.points)} completed trials{_ties_note(result)}; "
            f"chosen trial {c.number}: "
            f"{c.throughput_it_per_s:.6g} it/s ({_change(c.throughput_loss_frac):+.3%} vs no pacing), cv {c.cv:.4g} "
            f"({_cv_change(c.cv, result.baseline.cv):+.3%} vs no pacing's {result.baseline.cv:.4g}; paper threshold "
            f"{result.reference.cv:.4g})"
            + (
                f", {c.energy_per_iteration_j:.6g} J/it ({_energy_change(c, result.baseline):+.3%} vs no pacing)"
                if "energy_note" in s
                else ""
            )
            + ("" if c.feasible else " [no trial met the throughput-loss cap]"),
        )
    )
    lines.append((logging.INFO, f"chosen params: {c.params}"))
    if "warning" in s:
        lines.append((logging.WARNING, f"warning: {s['warning']}"))
    if "note" in s:
        lines.append((logging.INFO, f"note: {s['note']}"))
    if "energy_note" in s:
        lines.append((logging.INFO, f"note: {s['energy_note']}"))
    lines.append(
        (logging.INFO, f"outputs: {out_dir} (pareto.json, pareto.png, controller.yaml, tune.json, tune.log)")
    )
    chosen_command = result.commands["chosen"]
    if s["recommendation_command"] == chosen_command:
        lines.append((logging.INFO, f"use it:  {chosen_command}"))
    else:  # the warning above says why
        lines.append((logging.INFO, f"recommended:  {s['recommendation_command']}"))
        lines.append((logging.INFO, f"the chosen trial (not recommended):  {chosen_command}"))
    for line in s["run_overrides_differences"]:
        lines.append((logging.INFO, f"         note: {line}"))
    lines.append(
        (logging.INFO, f"inspect: {result.storage.dashboard_command()}   (pip install optuna-dashboard)")
    )
    return lines
