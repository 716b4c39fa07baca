"""Job-level phase control: shift a whole job once, so that its collectives slide into the gaps of
another job's on the links they share.

Why a job-level delay: a per-rank delay within earliness never moves a collective's start, a delay
of every rank of a job does (:mod:`pacectl.fabric`). Delaying every iteration would only lengthen
the job's period; a shift is a one-time delay, after which the job holds zero again, keeping its
new phase.

Sources, and what is taken from each:

- Cassini (Rajasekaran, Ghobadi, Akella, "CASSINI: Network-Aware Job Scheduling in Machine Learning
  Clusters", NSDI 2024): the mechanism. Jobs sharing a link have periodic communication phases;
  giving a job a one-time *time shift* interleaves its phases with the other job's in the gaps,
  and with compatible (commensurate) periods the interleaving then persists on its own. Cassini
  computes the shifts centrally from profiled communication patterns; here each job finds its
  own, with no profile and no scheduler.
- MLTCP (Rajasekaran, Narang, Zabreyko, Ghobadi, "MLTCP: Congestion Control for DNN Training",
  arXiv:2402.09589, 2024; HotNets 2024): the decentralised feedback. Each job reacts only to what
  it measures of its own communication, and the reactions of competing jobs converge to an
  interleaving within a few iterations, from any start offset, without coordination. MLTCP acts
  in the congestion window (scaled by the bytes a flow has sent in the iteration, which makes
  competing jobs unequal); here the job acts by a delay, and a seeded random backoff makes
  identical jobs unequal.

Update rule, per decision on the observation of iteration ``k`` (all times in seconds):

1. ``c_k = collective_time_s``: the job's paced collective, from its last rank's arrival to its end.
2. Quiet-fabric time ``q_k``: the given ``quiet_s`` (profiled: the job's collective measured alone
   on the fabric, e.g. by a short solo probe before the run), or else ``min(c_j)`` over the last
   ``quiet_window_iters`` observations (alone on the fabric it runs fastest; no fabric knowledge).
3. Excess ``e_k = c_k - q_k``: to first order the time this collective overlapped another job's on
   a shared link. Two identical jobs whose collectives of length ``T`` overlap, the later one
   starting ``phi`` after the earlier, share the link max-min fairly: both see ``e = T - phi``, and
   the later one, shifted by ``e``, starts exactly when the earlier one ends.
4. If ``e_k > slowdown_frac * q_k`` (the collective was slowed) and no earlier shift is still on
   its way (``cooldown``), then with probability ``shift_prob`` (drawn from the controller's seeded
   ``rng``: two identical jobs do not move together, which would keep their offset) every rank
   gets ``delay = gain * e_k / hold_iters`` (the shift, spread over the ``hold_iters`` iterations a
   decision stays in force), and the next ``horizon_iters + hold_iters - 2`` observations, which
   predate the shift's full effect, are not acted on. Otherwise every rank gets zero delay.
5. Switch-off, unless ``switch_off_iters`` is None: a shift is a delay paid now for collisions
   avoided later, so it pays only where they stay avoided. The job judges that on its own cost
   ``x_k = c_k + max_r applied_delay_r`` (its iteration less its compute, which a shift does not
   change). The first ``switch_off_iters`` observations are an unpaced baseline (mean cost ``B``),
   the next ``switch_off_iters`` the judged window, rule 4 in force (mean cost ``P``). ``P < B``:
   it commits, on for the rest of the run; else it switches off (zero delay), and with
   ``reprobe_iters`` set measures a fresh baseline that many observations later and judges again.
   ``futility_z`` (opt-in) ends the judged window early, switched off, once from its
   ``switch_off_iters // 4``-th observation on its running mean cost has ``P_n - B > futility_z *
   s_B * sqrt(1/n + 1/switch_off_iters)`` (``s_B``: the baseline's standard deviation). It is not
   the default: a paying window's first shifts cost before they pay, which costs the commensurate
   gain (``experiments/multi_job/futility_check.py``, its README).

Once the jobs interleave, no collective is slowed and the delay stays zero: the controller holds
the phase it found. Compute noise makes jobs' phases drift; a drift back into overlap is corrected
the same way.

Why a profiled quiet time: the window minimum finds the quiet time only if some collective in the
window ran alone. Where collectives overlap in every iteration (no compute jitter to move their
relative phase, or enough jobs that one always overlaps) the estimate is the collided time, biased
high, ``e_k`` stays near 0 and the job never shifts, though a persistent collision is the case a
shift is for. A ``quiet_s`` measured alone removes that bias (``tests/test_multijob.py``); a value
too high hides slowdowns, one too low makes every collective look slowed (a shift at every
decision, bounded by the guard's cap).

Where it loses without the switch-off: jobs whose periods are not commensurate (1:1.37 in
``experiments/multi_job``). Their relative phase sweeps through every offset, so collisions return
at the beat period whatever a shift did. The switch-off bounds that loss to its one judged window,
after which the job runs unpaced; it cannot be zero, since a job learns that its shifts do not pay
only by trying them (the figures with and without it: ``experiments/multi_job/README.md``).

Why this switch-off, and its sources: the reference paper's coordination layer (Gopalan and Ali,
"When Scaling Fails", ``/work/shared/DESIGN.md``) switches itself off once the arrival spread is
back under its threshold; a job-level shift has no spread to watch, so here the switch-off is on
the benefit itself, against the job's own unpaced baseline. Measuring each arm for one fixed window
and committing to the better is the explore-then-commit strategy of bandit problems (Garivier,
Lattimore, Kaufmann, "On Explore-Then-Commit Strategies", NeurIPS 2016), without a confidence
bound: noise can still switch a paying job off. It judges once and commits, since every further
comparison is another chance of a false switch-off (``experiments/multi_job/README.md``, "The
switch-off"). Cassini instead does not pair jobs of incompatible periods on a link, which a job
alone cannot do.

Where it can do nothing: a job whose collectives nothing slows (alone on its links, no cross
traffic, or ``comm=null``) has ``e_k = 0`` always and never shifts (a run says so in a note); under
max-plus (``comm=null``) a shift can only lengthen an iteration.

Live (``backend=torch``): every rank runs the same guarded controller on the same exchanged
figures (:class:`~pacectl.torchdist.core.DecisionEngine`), with the same seeded ``rng``, so they
all shift together. Two live jobs that should not shift in lockstep need different seeds
(``seed=`` of each job's run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray
from pacectl.controllers.registry import register
from pacectl.types import Observation


@register(in_all=False, job_level=True)
@dataclass(kw_only=True, eq=False, repr=False)
class PhaseController(BaseController):
    """Shift every rank of the job by the same one-time delay when its collective is slowed.

    See the module docstring for the update rule and its sources (Cassini, MLTCP).

    Args:
        slowdown_frac: a collective counts as slowed when it exceeds the quiet estimate by more
            than this fraction of it, > 0 (default 0.05: above the few-percent spread of a quiet
            collective's time).
        gain: fraction of the excess to shift by, in (0, 2] (1: exactly past a two-job overlap).
        shift_prob: probability that a slowed job shifts at a decision, in (0, 1] (0.5: two
            identical jobs then move alone in half of their coincident decisions).
        quiet_window_iters: observations the quiet-fabric estimate (their minimum collective time)
            covers, >= 1 (unused when ``quiet_s`` is given).
        quiet_s: the job's collective time alone on the fabric, seconds, > 0, measured before the
            run (a solo probe, or the multi-job simulator's quiet time); None (default): estimated
            as the window minimum, which is biased high when collisions persist (module docstring).
        horizon_iters: iterations from an observation to the first one its decision paces, >= 1;
            ``auto`` in a config follows the run's exchange (its lag), as the forecast
            controller's (:func:`pacectl.controllers.fill_schedule`).
        hold_iters: iterations a decision stays in force, >= 1 (``auto``: the run's
            ``exchange.every_iters`` / live ``gather_every``); the shift is spread over them.
        switch_off_iters: observations of the unpaced baseline window and of the judged window of
            the switch-off (rule 5), >= 1 (default 100); None: never switch off, shift whenever slowed.
        reprobe_iters: observations the switch-off lasts before it measures a fresh baseline and
            tries again, >= 1; None (default): off for the rest of the run.
        futility_z: end the judged window early, switched off, once its running mean cost exceeds
            the baseline's by more than this many standard errors (rule 5), > 0; None (default):
            judge the whole window.

    Raises:
        ConfigError: a parameter is out of range.

    Diagnostics: ``active`` (1.0 when the last decision shifted), ``quiet_s`` (the quiet time in use),
    ``excess_frac`` (``e_k / q_k``), ``shifts`` (shifts so far), ``cooldown`` (observations still
    skipped), ``shifts_allowed`` (1.0 while shifts are allowed: no switch-off, the judged window, or
    committed after it), ``switch_offs`` (times rule 5 switched it off), ``baseline_cost_s`` and
    ``trial_cost_s`` (the last baseline and judged windows' mean cost ``B`` and ``P``, seconds; 0
    before the first).

    Example:
        >>> c = PhaseController()
        >>> c.reset(4, np.random.default_rng(0))
    """

    name = "phase"

    slowdown_frac: float = within(0.05, "> 0")
    gain: float = within(1.0, "(0, 2]")
    shift_prob: float = within(0.5, "(0, 1]")
    quiet_window_iters: int = within(200, ">= 1")
    horizon_iters: int = within(1, ">= 1")
    hold_iters: int = within(1, ">= 1")
    quiet_s: float | None = within(None, "> 0")
    switch_off_iters: int | None = within(100, ">= 1")
    reprobe_iters: int | None = within(None, ">= 1")
    futility_z: float | None = within(None, "> 0")

    def reset(self, num_ranks: int, rng: np.random.Generator | None = None) -> None:
        """Clear all state; keep ``rng`` (default ``default_rng(0)``) for the random backoff.

        Raises:
            ConfigError: ``num_ranks`` is not an integer >= 1.
        """
        self._rng = np.random.default_rng(0) if rng is None else rng
        super().reset(num_ranks, rng)

    def _reset_state(self, num_ranks: int) -> None:
        self._times = np.full(self.quiet_window_iters, np.inf)
        self._count = 0
        self._quiet_s = np.inf
        self._excess_frac = 0.0
        self._shifts = 0
        self._cooldown = 0
        self._active = False
        # switch-off (rule 5): "baseline" (unpaced, measuring) -> "judged" (shifting, measuring) ->
        # "on" (committed: shifting, judged no more) or "off" (zero delay; -> "baseline" on a reprobe)
        self._state = "on" if self.switch_off_iters is None else "baseline"
        self._window_cost = 0.0
        self._window_sq = 0.0
        self._window_count = 0
        self._baseline_sd_s = math.nan
        self._baseline_cost_s = math.nan
        self._trial_cost_s = math.nan
        self._off_count = 0
        self._switch_offs = 0

    def _judge(self, obs: Observation) -> None:
        """Advance the switch-off (module docstring, rule 5) on this observation's cost."""
        if self._state == "on":
            return
        if self._state == "off":
            self._off_count += 1
            if self.reprobe_iters is not None and self._off_count >= self.reprobe_iters:
                self._state, self._window_cost, self._window_sq, self._window_count = "baseline", 0.0, 0.0, 0
            return
        # the part of the iteration the job's shifts and the fabric decide: delay paid + collective
        x = float(obs.collective_time_s) + float(np.max(obs.applied_delay_s))
        self._window_cost += x
        self._window_sq += x * x
        self._window_count += 1
        n = self._window_count
        mean = self._window_cost / n
        window = self.switch_off_iters
        assert window is not None  # state "on" from the start otherwise
        if self._state == "judged" and self.futility_z is not None and n >= max(2, window // 4):
            # futility stop: the judged window so far costs clearly more than the baseline
            bound = self.futility_z * self._baseline_sd_s * math.sqrt(1.0 / n + 1.0 / window)
            if mean - self._baseline_cost_s > bound:
                self._trial_cost_s = mean
                self._switch_off()
                return
        if n < window:
            return
        sq = self._window_sq
        self._window_cost, self._window_sq, self._window_count = 0.0, 0.0, 0
        if self._state == "baseline":
            self._baseline_cost_s, self._state = mean, "judged"
            self._baseline_sd_s = math.sqrt(max(sq / n - mean * mean, 0.0) * n / max(n - 1, 1))
            return
        self._trial_cost_s = mean
        if mean < self._baseline_cost_s * (1.0 - 1e-9):  # the shifts paid (beyond rounding): commit
            self._state = "on"
        else:  # no gain against the unpaced baseline: switch off
            self._switch_off()

    def _switch_off(self) -> None:
        self._state, self._off_count = "off", 0
        self._window_cost, self._window_sq, self._window_count = 0.0, 0.0, 0
        self._switch_offs += 1
        self._cooldown = 0

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        c = float(obs.collective_time_s)
        self._times[self._count % self.quiet_window_iters] = c
        self._count += 1
        self._quiet_s = float(self._times.min()) if self.quiet_s is None else self.quiet_s
        excess = c - self._quiet_s
        self._excess_frac = excess / self._quiet_s if self._quiet_s > 0 else 0.0
        self._active = False
        delay = np.zeros_like(natural_arrival_s)
        self._judge(obs)
        if self._state not in ("on", "judged"):
            return delay
        if self._cooldown > 0:
            self._cooldown -= 1
            return delay
        if excess > self.slowdown_frac * self._quiet_s and self._rng.random() < self.shift_prob:
            delay[:] = self.gain * excess / self.hold_iters
            self._shifts += 1
            self._cooldown = self.horizon_iters + self.hold_iters - 2
            self._active = True
        return delay

    def _diagnostics(self) -> dict[str, float]:
        return {
            "active": float(self._active),
            "quiet_s": self._quiet_s if np.isfinite(self._quiet_s) else 0.0,
            "excess_frac": self._excess_frac,
            "shifts": float(self._shifts),
            "cooldown": float(self._cooldown),
            "shifts_allowed": float(self._state in ("on", "judged")),
            "switch_offs": float(self._switch_offs),
            "baseline_cost_s": 0.0 if math.isnan(self._baseline_cost_s) else self._baseline_cost_s,
            "trial_cost_s": 0.0 if math.isnan(self._trial_cost_s) else self._trial_cost_s,
        }
