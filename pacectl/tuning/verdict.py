"""The tuner's verdict, pure: dominance, the Pareto front, the choice and the judgement.

Nothing here reads a study, a file or a clock: the tuner (:mod:`pacectl.tune`) hands over the
completed trials as :class:`TrialPoint` values and no pacing's (and the paper's threshold's)
:class:`~pacectl.tuning.scenarios.Evaluation` on the same episodes.

The objectives are two or three of :data:`OBJECTIVES` (``tune.objectives``; by default
:data:`DEFAULT_OBJECTIVES`: throughput up, CV down; ``energy``, the modelled energy per iteration
summed over ranks, down). :func:`dominates` and :func:`pareto_mask` share :func:`_dominance`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pacectl.errors import PacectlError

#: :class:`pacectl.tuning.scenarios.Evaluation` (not imported: the typed tune config imports this module)
Evaluation = Any


#: objective name (``tune.objectives``) -> (its :class:`TrialPoint` attribute, +1 maximized or -1 minimized)
OBJECTIVES: dict[str, tuple[str, float]] = {
    "throughput": ("throughput_it_per_s", 1.0),
    "cv": ("cv", -1.0),
    "energy": ("energy_per_iteration_j", -1.0),
}
DEFAULT_OBJECTIVES = ("throughput", "cv")


def _dominance(a: Any, b: Any) -> Any:
    """Whether a dominates b, over the last axis (the objectives, oriented: higher is better; numpy
    broadcasting over the others): at least as good on every objective and strictly better on one.
    NaN dominates nothing and is dominated by nothing."""
    return (a >= b).all(axis=-1) & (a > b).any(axis=-1)


def _oriented(columns: Sequence[Any], objectives: Sequence[str]) -> Any:
    """``float64[..., k]``: one column per objective, each signed so that higher is better."""
    return np.stack(
        [
            OBJECTIVES[o][1] * np.asarray(c, dtype=np.float64)
            for c, o in zip(columns, objectives, strict=True)
        ],
        axis=-1,
    )


def values(point: TrialPoint | Evaluation, objectives: Sequence[str]) -> list[float]:
    """``point``'s value of each objective, in order."""
    return [float(getattr(point, OBJECTIVES[o][0])) for o in objectives]


def dominates(
    a: TrialPoint | Evaluation, b: TrialPoint | Evaluation, objectives: Sequence[str] = DEFAULT_OBJECTIVES
) -> bool:
    """Whether ``a`` dominates ``b`` on ``objectives`` (:func:`_dominance`); a trial or an evaluation."""
    return bool(
        _dominance(_oriented(values(a, objectives), objectives), _oriented(values(b, objectives), objectives))
    )


def pareto_mask(*columns: Sequence[float], objectives: Sequence[str] = DEFAULT_OBJECTIVES) -> list[bool]:
    """Non-dominated points, one column of values per objective (ties are kept).

    Example:
        >>> pareto_mask([1.0, 2.0, 1.5], [0.1, 0.2, 0.3])  # throughput up, CV down
        [True, True, False]
    """
    if not len(columns[0]):
        return []
    v = _oriented(columns, objectives)  # [n, k]
    dominated = _dominance(v[None, :, :], v[:, None, :]).any(axis=1)  # [b, a]
    return [not bool(d) for d in dominated]


@dataclass(frozen=True)
class TrialPoint:
    """A finished, completed trial as the results see it."""

    number: int
    params: dict[str, Any]
    throughput_it_per_s: float
    cv: float
    throughput_loss_frac: float
    feasible: bool
    duplicates: tuple[int, ...] = ()
    energy_per_iteration_j: float = math.nan

    def to_json(self) -> dict[str, Any]:
        """The ``pareto.json`` entry (``duplicate_trials``: later trials that drew the same parameters)."""
        return {
            "trial": self.number,
            "params": self.params,
            "throughput_it_per_s": self.throughput_it_per_s,
            "cv": self.cv,
            "throughput_loss_frac": self.throughput_loss_frac,
            "feasible": self.feasible,
            "duplicate_trials": list(self.duplicates),
            "energy_per_iteration_j": self.energy_per_iteration_j,
        }


def pareto_front(
    points: Sequence[TrialPoint], objectives: Sequence[str] = DEFAULT_OBJECTIVES
) -> list[TrialPoint]:
    """The Pareto front on ``objectives`` of the feasible points (of all points when none is feasible),
    by throughput.

    Trials with the same parameters and the same results (a sampler such as NSGA-II may draw a point
    again) are one point of the front: the first trial, with the others' numbers in
    :attr:`TrialPoint.duplicates`.
    """
    pool = [p for p in points if p.feasible] or list(points)
    mask = (
        pareto_mask(*zip(*(values(p, objectives) for p in pool), strict=True), objectives=objectives)
        if pool
        else []
    )
    groups: dict[tuple[Any, ...], list[TrialPoint]] = {}
    for p, keep in zip(pool, mask, strict=True):
        if keep:
            key = (json.dumps(p.params, sort_keys=True, default=str), *values(p, objectives))
            groups.setdefault(key, []).append(p)
    front = []
    for group in groups.values():
        first, *rest = sorted(group, key=lambda p: p.number)
        front.append(replace(first, duplicates=tuple(p.number for p in rest)))
    return sorted(front, key=lambda p: (-p.throughput_it_per_s, p.cv, p.number))


CHOICE_RULE = (
    "among the Pareto-optimal trials whose throughput loss against no pacing is within "
    "tune.max_throughput_loss_frac (the whole front with no cap): the lowest mean CV among those that "
    "improve on no pacing (improvement_rule), or the lowest mean CV when none does (ties: higher "
    "throughput, then lower trial number); if no trial meets the cap, the trial with the highest "
    "throughput (flagged infeasible)"
)


def choice_rule(objectives: Sequence[str] = DEFAULT_OBJECTIVES) -> str:
    """:data:`CHOICE_RULE` for ``objectives``: the first minimized one of them (cv or energy) decides,
    the next breaks ties."""
    low = [o for o in objectives if OBJECTIVES[o][1] < 0]
    if low == ["cv"]:
        return CHOICE_RULE
    names = {"cv": "mean CV", "energy": "mean energy per iteration"}
    first, rest = names[low[0]], [names[o] for o in low[1:]]
    return CHOICE_RULE.replace("lowest mean CV", f"lowest {first}").replace(
        "(ties: higher", "(ties: " + "".join(f"lower {r}, then " for r in rest) + "higher"
    )


def choose(
    front: Sequence[TrialPoint],
    improving: Sequence[int] | None = None,
    objectives: Sequence[str] = DEFAULT_OBJECTIVES,
) -> TrialPoint:
    """Apply :func:`choice_rule` to a front from :func:`pareto_front`.

    Args:
        front: the Pareto front.
        improving: the numbers of the trials that improve on no pacing (:func:`beats_no_pacing`);
            the choice is among those of them on the front when there are any.
        objectives: the study's objectives (:data:`OBJECTIVES`).
    """
    low = [o for o in objectives if OBJECTIVES[o][1] < 0]
    if not front:
        raise PacectlError(
            "no trial completed, so there is nothing to choose; raise tune.n_trials or tune.timeout_s"
        )
    if all(p.feasible for p in front):
        better = [p for p in front if p.number in set(improving or ())]
        return min(better or front, key=lambda p: (*values(p, low), -p.throughput_it_per_s, p.number))
    return max(front, key=lambda p: (p.throughput_it_per_s, *(-v for v in values(p, low)), -p.number))


@dataclass(frozen=True)
class ImprovementRule:
    """When a controller *improves on no pacing*: a gain that is larger than noise.

    Attributes:
        min_cv_gain_frac: ``tune.min_cv_gain_frac``: the CV must be at least this fraction lower than
            no pacing's (0.01: at least 1 % lower), with the throughput loss within ``cap``.
        min_throughput_gain_frac: ``tune.min_throughput_gain_frac``: or the throughput at least this
            fraction higher, with the CV no higher.
        cap: ``tune.max_throughput_loss_frac``, or None for no cap.
        min_energy_gain_frac: ``tune.min_energy_gain_frac``: or the energy per iteration at least this
            fraction lower, with the loss within ``cap`` and the CV no higher.
        objectives: the study's objectives: a gain counts only on one of them.
    """

    min_cv_gain_frac: float
    min_throughput_gain_frac: float
    cap: float | None
    min_energy_gain_frac: float = 0.01
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES

    def describe(self) -> str:
        """The rule in words, with its current values (``improvement_rule`` in ``tune.json``)."""
        cap = (
            "any throughput loss (tune.max_throughput_loss_frac=null)"
            if self.cap is None
            else f"a throughput loss of at most {self.cap:.3g} (tune.max_throughput_loss_frac)"
        )
        parts = []
        if "cv" in self.objectives:
            parts.append(
                f"its mean CV is at least {self.min_cv_gain_frac:.3g} ({self.min_cv_gain_frac:.2%}) lower "
                f"than no pacing's (tune.min_cv_gain_frac) with {cap}"
            )
        if "throughput" in self.objectives:
            parts.append(
                f"its mean throughput is at least {self.min_throughput_gain_frac:.3g} "
                f"({self.min_throughput_gain_frac:.2%}) higher (tune.min_throughput_gain_frac)"
                + (" with a CV no higher than no pacing's" if "cv" in self.objectives else "")
            )
        if "energy" in self.objectives:
            parts.append(
                f"its mean energy per iteration is at least {self.min_energy_gain_frac:.3g} "
                f"({self.min_energy_gain_frac:.2%}) lower (tune.min_energy_gain_frac) with {cap}"
                + (" and a CV no higher" if "cv" in self.objectives else "")
            )
        return (
            "a controller improves on no pacing when "
            + ", or when ".join(parts)
            + "; smaller differences are treated as noise (relative differences under 1e-9 are ties)"
        )


#: relative tolerance of :func:`beats_no_pacing` (float noise of identical episodes)
TIE_RTOL = 1e-9


def beats_no_pacing(
    point: TrialPoint, baseline: Evaluation, rule: ImprovementRule, *, energy_only: bool = False
) -> bool:
    """Whether ``point`` improves on no pacing (:class:`ImprovementRule`).

    Args:
        point: a completed trial (or the reference, as a :class:`TrialPoint`).
        baseline: no pacing on the same episodes.
        rule: the rule (gains, cap and objectives).
        energy_only: count only an energy gain (fixed durations: see :func:`judge`).

    Example:
        >>> from pacectl.tuning.scenarios import Evaluation
        >>> base = Evaluation(1.0, 0.2)
        >>> rule = ImprovementRule(min_cv_gain_frac=0.01, min_throughput_gain_frac=0.005, cap=0.005)
        >>> beats_no_pacing(TrialPoint(0, {}, 0.996, 0.15, 0.004, True), base, rule)
        True
        >>> beats_no_pacing(TrialPoint(1, {}, 0.9999, 0.1999, 0.0001, True), base, rule)  # noise
        False
    """
    thr_b, cv_b = baseline.throughput_it_per_s, baseline.cv
    thr_gain = point.throughput_it_per_s / thr_b - 1.0 if thr_b > 0 else 0.0
    cv_gain = 1.0 - point.cv / cv_b if cv_b > 0 else 0.0
    within_cap = rule.cap is None or point.throughput_loss_frac <= rule.cap + TIE_RTOL
    e_b = baseline.energy_per_iteration_j
    e_gain = 1.0 - point.energy_per_iteration_j / e_b if e_b > 0 else 0.0  # NaN: no energy, no gain
    objs = rule.objectives
    cv_ok = "cv" not in objs or cv_gain >= -TIE_RTOL
    cv_better = "cv" in objs and cv_gain > TIE_RTOL and cv_gain >= rule.min_cv_gain_frac - TIE_RTOL
    thr_better = (
        "throughput" in objs and thr_gain > TIE_RTOL and thr_gain >= rule.min_throughput_gain_frac - TIE_RTOL
    )
    e_better = "energy" in objs and e_gain > TIE_RTOL and e_gain >= rule.min_energy_gain_frac - TIE_RTOL
    if energy_only:
        return e_better and within_cap and cv_ok
    return (cv_better and within_cap) or (thr_better and cv_ok) or (e_better and within_cap and cv_ok)


@dataclass(frozen=True)
class Verdict:
    """How a study's choice compares with no pacing and with the paper's threshold at its defaults.

    Attributes:
        chosen: the chosen trial (:func:`choose`).
        reference: the paper's threshold at its defaults, as a trial point (number -1).
        improving: trials that improve on no pacing (none with fixed durations).
        lengthening_only: with fixed durations (max-plus), trials that meet the CV rule, which there
            can only come from lengthening the fast iterations: reported, never an improvement.
        improves: the chosen trial improves on no pacing.
        reference_improves: the reference improves on no pacing.
        reference_lengthening: fixed durations, and the reference meets the CV rule (so by lengthening).
        objectives: the study's objectives (for :attr:`reference_beats_choice`).
    """

    chosen: TrialPoint
    reference: TrialPoint
    improving: list[int]
    lengthening_only: list[int]
    improves: bool
    reference_improves: bool
    reference_lengthening: bool
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES

    @property
    def reference_beats_choice(self) -> bool:
        """The choice improves, but the reference beats it on every objective (few trials): the
        reference is the better controller to run (it meets the rule too, beating a choice that does)."""
        return (
            self.improves
            and self.reference_improves
            and dominates(self.reference, self.chosen, self.objectives)
        )

    @property
    def recommend(self) -> str:
        """``"chosen"``, ``"reference"`` or ``"none"``: what to run."""
        if self.improves and not self.reference_beats_choice:
            return "chosen"
        return "reference" if self.reference_improves else "none"


def judge(
    points: list[TrialPoint],
    front: list[TrialPoint],
    baseline: Evaluation,
    reference: Evaluation,
    rule: ImprovementRule,
    timing_dependent: bool,
) -> Verdict:
    """Choose among the front and judge the choice and the reference against no pacing (``rule``).

    With fixed durations (``timing_dependent`` False) a throughput or CV gain does not count: no
    delay shortens an iteration, so a lower CV comes only from lengthening the fast iterations. An
    energy gain (an objective only with ``energy`` in ``rule.objectives``) still counts: waiting
    asleep instead of spinning saves energy under any duration model, by as much as the power
    profile's spinning and sleeping powers differ (zero when they are equal).
    """
    fixed = not timing_dependent
    meets = {p.number for p in points if beats_no_pacing(p, baseline, rule)}
    improving = [p.number for p in points if beats_no_pacing(p, baseline, rule, energy_only=fixed)]
    chosen = choose(front, improving, rule.objectives)
    ref_loss = baseline.loss_frac(reference.throughput_it_per_s)
    ref_point = TrialPoint(
        -1,
        {},
        reference.throughput_it_per_s,
        reference.cv,
        ref_loss,
        rule.cap is None or ref_loss <= rule.cap,
        energy_per_iteration_j=reference.energy_per_iteration_j,
    )
    ref_improves = beats_no_pacing(ref_point, baseline, rule, energy_only=fixed)
    return Verdict(
        chosen=chosen,
        reference=ref_point,
        improving=improving,
        lengthening_only=sorted(meets - set(improving)) if fixed else [],
        improves=beats_no_pacing(chosen, baseline, rule, energy_only=fixed),
        reference_improves=ref_improves,
        reference_lengthening=fixed and not ref_improves and beats_no_pacing(ref_point, baseline, rule),
        objectives=rule.objectives,
    )
