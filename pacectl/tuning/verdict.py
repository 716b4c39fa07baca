"""The tuner's verdict, pure: dominance, the Pareto front, the choice and the judgement.

Nothing here reads a study, a file or a clock: the tuner (:mod:`pacectl.tune`) hands over the
completed trials as :class:`TrialPoint` values and no pacing's (and the paper's threshold's)
:class:`~pacectl.tuning.scenarios.Evaluation` on the same episodes. Dominance (throughput up, CV down)
is written once, :func:`_dominance`; :func:`dominates` and :func:`pareto_mask` both use it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pacectl.errors import PacectlError

if TYPE_CHECKING:
    from pacectl.tuning.scenarios import Evaluation


def _dominance(thr_a: Any, cv_a: Any, thr_b: Any, cv_b: Any) -> Any:
    """Whether a dominates b, elementwise (numpy broadcasting): at least as good on both objectives
    (throughput up, CV down) and strictly better on one. NaN dominates nothing and is dominated by nothing."""
    return (thr_a >= thr_b) & (cv_a <= cv_b) & ((thr_a > thr_b) | (cv_a < cv_b))


def dominates(a: TrialPoint, b: TrialPoint) -> bool:
    """Whether ``a`` dominates ``b`` (:func:`_dominance`)."""
    return bool(_dominance(a.throughput_it_per_s, a.cv, b.throughput_it_per_s, b.cv))


def pareto_mask(throughput: Sequence[float], cv: Sequence[float]) -> list[bool]:
    """Non-dominated points for maximizing throughput and minimizing CV (ties are kept).

    Example:
        >>> pareto_mask([1.0, 2.0, 1.5], [0.1, 0.2, 0.3])
        [True, True, False]
    """
    thr = np.asarray(throughput, dtype=np.float64)
    c = np.asarray(cv, dtype=np.float64)
    if thr.size == 0:
        return []
    dominated = _dominance(thr[None, :], c[None, :], thr[:, None], c[:, None]).any(axis=1)  # [b, a]
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
        }


def pareto_front(points: Sequence[TrialPoint]) -> list[TrialPoint]:
    """The Pareto front of the feasible points (of all points when none is feasible), by throughput.

    Trials with the same parameters and the same results (a sampler such as NSGA-II may draw a point
    again) are one point of the front: the first trial, with the others' numbers in
    :attr:`TrialPoint.duplicates`.
    """
    pool = [p for p in points if p.feasible] or list(points)
    mask = pareto_mask([p.throughput_it_per_s for p in pool], [p.cv for p in pool])
    groups: dict[tuple[str, float, float], list[TrialPoint]] = {}
    for p, keep in zip(pool, mask, strict=True):
        if keep:
            key = (json.dumps(p.params, sort_keys=True, default=str), p.throughput_it_per_s, p.cv)
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


def choose(front: Sequence[TrialPoint], improving: Sequence[int] | None = None) -> TrialPoint:
    """Apply :data:`CHOICE_RULE` to a front from :func:`pareto_front`.

    Args:
        front: the Pareto front.
        improving: the numbers of the trials that improve on no pacing (:func:`beats_no_pacing`);
            the choice is among those of them on the front when there are any.
    """
    if not front:
        raise PacectlError(
            "no trial completed, so there is nothing to choose; raise tune.n_trials or tune.timeout_s"
        )
    if all(p.feasible for p in front):
        better = [p for p in front if p.number in set(improving or ())]
        return min(better or front, key=lambda p: (p.cv, -p.throughput_it_per_s, p.number))
    return max(front, key=lambda p: (p.throughput_it_per_s, -p.cv, -p.number))


@dataclass(frozen=True)
class ImprovementRule:
    """When a controller *improves on no pacing*: a gain that is larger than noise.

    Attributes:
        min_cv_gain_frac: ``tune.min_cv_gain_frac``: the CV must be at least this fraction lower than
            no pacing's (0.01: at least 1 % lower), with the throughput loss within ``cap``.
        min_throughput_gain_frac: ``tune.min_throughput_gain_frac``: or the throughput at least this
            fraction higher, with the CV no higher.
        cap: ``tune.max_throughput_loss_frac``, or None for no cap.
    """

    min_cv_gain_frac: float
    min_throughput_gain_frac: float
    cap: float | None

    def describe(self) -> str:
        """The rule in words, with its current values (``improvement_rule`` in ``tune.json``)."""
        cap = (
            "any throughput loss (tune.max_throughput_loss_frac=null)"
            if self.cap is None
            else f"a throughput loss of at most {self.cap:.3g} (tune.max_throughput_loss_frac)"
        )
        return (
            f"a controller improves on no pacing when its mean CV is at least {self.min_cv_gain_frac:.3g} "
            f"({self.min_cv_gain_frac:.2%}) lower than no pacing's (tune.min_cv_gain_frac) with {cap}, or "
            f"when its mean throughput is at least {self.min_throughput_gain_frac:.3g} "
            f"({self.min_throughput_gain_frac:.2%}) higher (tune.min_throughput_gain_frac) with a CV no "
            "higher than no pacing's; smaller differences are treated as noise (relative differences "
            "under 1e-9 are ties)"
        )


#: relative tolerance of :func:`beats_no_pacing` (float noise of identical episodes)
TIE_RTOL = 1e-9


def beats_no_pacing(point: TrialPoint, baseline: Evaluation, rule: ImprovementRule) -> bool:
    """Whether ``point`` improves on no pacing (:class:`ImprovementRule`).

    Args:
        point: a completed trial (or the reference, as a :class:`TrialPoint`).
        baseline: no pacing on the same episodes.
        rule: the rule (gains and cap).

    Example:
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
    cv_better = cv_gain > TIE_RTOL and cv_gain >= rule.min_cv_gain_frac - TIE_RTOL
    thr_better = thr_gain > TIE_RTOL and thr_gain >= rule.min_throughput_gain_frac - TIE_RTOL
    return (cv_better and within_cap) or (thr_better and cv_gain >= -TIE_RTOL)


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
    """

    chosen: TrialPoint
    reference: TrialPoint
    improving: list[int]
    lengthening_only: list[int]
    improves: bool
    reference_improves: bool
    reference_lengthening: bool

    @property
    def reference_beats_choice(self) -> bool:
        """The choice improves, but the reference beats it on both objectives (few trials): the
        reference is the better controller to run (it meets the rule too, beating a choice that does)."""
        return self.improves and self.reference_improves and dominates(self.reference, self.chosen)

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

    With fixed durations (``timing_dependent`` False) nothing counts as an improvement: no delay
    shortens an iteration, so a lower CV comes only from lengthening the fast iterations.
    """
    improving = [p.number for p in points if beats_no_pacing(p, baseline, rule)]
    fixed = not timing_dependent
    chosen = choose(front, [] if fixed else improving)
    ref_loss = baseline.loss_frac(reference.throughput_it_per_s)
    ref_point = TrialPoint(
        -1,
        {},
        reference.throughput_it_per_s,
        reference.cv,
        ref_loss,
        rule.cap is None or ref_loss <= rule.cap,
    )
    ref_meets_rule = beats_no_pacing(ref_point, baseline, rule)
    return Verdict(
        chosen=chosen,
        reference=ref_point,
        improving=[] if fixed else improving,
        lengthening_only=improving if fixed else [],
        improves=not fixed and beats_no_pacing(chosen, baseline, rule),
        reference_improves=not fixed and ref_meets_rule,
        reference_lengthening=fixed and ref_meets_rule,
    )
