"""Energy of an episode under a power profile: pure functions, no I/O.

Each rank's time in each iteration is split into disjoint states (:data:`pacectl.fabric.power.STATES`),
rank-seconds, ``float64[num_iterations, num_ranks]`` each:

- ``compute``: the rank's compute (``Episode.compute_s``; where the backend reported none, all the
  time before its natural arrival);
- ``pacing_sleep``: the part of the pacing delay slept (``Episode.sleep_s``; else the whole delay):
  with ``backend.actuator=clock`` the rest of the delay went into running the compute slower;
- ``spin_wait`` / ``sleep_wait``: blocked in the paced collective until the last rank arrives
  (``wait_s``): spinning, as NCCL and gloo wait today, or sleeping (``controller=sleep_wait``);
- ``transfer``: the paced collective's transfer after the last arrival (``collective_time_s``);
- ``other``: the rest of the iteration (other communication, pipeline bubbles, host gaps):
  ``iteration_time_s`` minus the states above, at least 0.

Energy is each state's time times its power (:class:`~pacectl.fabric.power.PowerProfile`); compute
runs at ``P(clock)`` for the compute the clock actuator slowed (``slow_compute_s`` at ``clock_frac``)
and at the highest clock for the rest, unless the backend integrated its compute energy itself
(``compute_energy_j``: the node power cap). The total is by definition the sum of the states.

The **oracle bound** (:func:`oracle_saving`) is Perseus's extrinsic-bloat bound (Chung et al.,
"Perseus: Reducing Energy Bloat in Large Model Training", SOSP'24, sec. 3) restricted to what pacing
can reach: the energy saved if every rank's pre-arrival compute ran exactly as slowly as its slack
at the paced collective allows (its earliness there in the run without pacing), at any clock the GPU
type allows, sleeping what is left, every iteration as long as without pacing. Each rank's choice
is independent (its window ends at the collective's start, which does not move), so the bound is
the minimum over the allowed clocks, evaluated in closed form per rank and iteration: no solver.
With compute power piecewise linear in the clock (the profile's table), the energy of a window is
monotone in the clock between two table points, so the table's clocks plus the one that exactly
fills the slack contain the minimum. Slack elsewhere in a pipeline (bubbles between its stages) is
not in it: pacing at the paced collective cannot reach it either.

Example:
    >>> from pacectl.fabric.power import uniform_profile
    >>> from pacectl.testing.episodes import make_episode
    >>> ep = make_episode([[0.0, 0.5]], iteration_time_s=[1.0])
    >>> float(account(ep, uniform_profile(100.0)).total_j.sum())
    200.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl import metrics
from pacectl.errors import PacectlError
from pacectl.fabric.power import STATES, PowerProfile
from pacectl.types import EnergyTotals, Episode, EpisodeTotals

FloatArray = NDArray[np.float64]

#: How each state reads in reports.
STATE_LABELS = {
    "compute": "compute",
    "transfer": "collective transfer",
    "spin_wait": "spinning wait",
    "sleep_wait": "sleeping wait",
    "pacing_sleep": "pacing sleep",
    "other": "other (bubbles, other comm)",
}


@dataclass(frozen=True)
class EnergyAccount:
    """The time and energy of every state, per iteration and rank.

    Attributes:
        profile: the power profile's name.
        time_s: state -> ``float64[num_iterations, num_ranks]``, seconds.
        energy_j: state -> ``float64[num_iterations, num_ranks]``, joules.
    """

    profile: str
    time_s: dict[str, FloatArray]
    energy_j: dict[str, FloatArray]

    @property
    def total_j(self) -> FloatArray:
        """``float64[num_iterations, num_ranks]``: the sum of the states' energies, joules."""
        return np.sum([self.energy_j[s] for s in STATES], axis=0)

    @property
    def per_iteration_j(self) -> FloatArray:
        """``float64[num_iterations]``: energy of each iteration summed over ranks, joules."""
        return self.total_j.sum(axis=1)


def _or(value: FloatArray | None, default: FloatArray) -> FloatArray:
    return default if value is None else np.asarray(value, dtype=np.float64)


def wait_sleeps(ep: Episode) -> NDArray[np.bool_]:
    """``bool[num_iterations, num_ranks]``: whether each rank slept (rather than spun) while it waited
    in the paced collective (``Episode.wait_asleep`` of its domain, :attr:`pacectl.types.Action.wait`);
    spinning where the episode does not say (today's NCCL and gloo)."""
    flag = ep.wait_asleep
    if flag is None:
        return np.zeros(ep.arrival_s.shape, dtype=bool)
    return np.asarray(flag, dtype=bool)[:, ep.domain_of_rank]


def _per_rank(ep: Episode, values: FloatArray) -> FloatArray:
    """``float64[num_iterations, num_domains]`` as each rank's column: ``[num_iterations, 1]``, which
    broadcasts, where there is one domain (the same values without gathering a copy)."""
    return values[:, :1] if ep.num_domains == 1 else values[:, ep.domain_of_rank]


def _states(ep: Episode) -> dict[str, FloatArray | None]:
    """Rank-seconds of every state of :data:`~pacectl.fabric.power.STATES` (module docstring), each
    ``float64[num_iterations, num_ranks]``; None for a state that is 0 everywhere (the sleeping wait
    when no rank slept), so that no array of zeros is built and summed."""
    if ep.domain_iteration_time_s is not None:  # domains with their own clocks: each rank's own
        iteration = np.asarray(ep.domain_iteration_time_s, dtype=np.float64)[:, ep.domain_of_rank]
    else:
        iteration = np.asarray(ep.iteration_time_s, dtype=np.float64)[:, None]
    compute = np.maximum(_or(ep.compute_s, ep.natural_arrival_s), 0.0)
    sleep = np.maximum(_or(ep.sleep_s, ep.applied_delay_s), 0.0)
    wait = np.maximum(np.asarray(ep.wait_s, dtype=np.float64), 0.0)
    # each rank's domain's transfer, in Fortran order (the layout of the gather
    # ``collective_time_s[:, domain_of_rank]``): the layout sets the order its sums add in
    transfer = np.empty(wait.shape, order="F")
    transfer[...] = _per_rank(ep, np.maximum(np.asarray(ep.collective_time_s, dtype=np.float64), 0.0))
    other = iteration - compute  # iteration - compute - sleep - wait - transfer, in that order
    other -= sleep
    other -= wait
    other -= transfer
    np.maximum(other, 0.0, out=other)
    if ep.wait_asleep is None or not np.asarray(ep.wait_asleep).any():
        spin_wait: FloatArray | None = wait
        sleep_wait: FloatArray | None = None
    else:
        sleeping = wait_sleeps(ep)
        spin_wait, sleep_wait = np.where(sleeping, 0.0, wait), np.where(sleeping, wait, 0.0)
    return {
        "compute": compute,
        "transfer": transfer,
        "spin_wait": spin_wait,
        "sleep_wait": sleep_wait,
        "pacing_sleep": sleep,
        "other": other,
    }


def _compute_energy_j(ep: Episode, compute: FloatArray, profile: PowerProfile) -> FloatArray:
    """``float64[num_iterations, num_ranks]`` joules of compute (module docstring): the backend's
    own where it integrated it; else ``P(clock)`` on the slowed compute and the highest clock's
    power on the rest (all of it where nothing was slowed: ``slow_compute_s`` None)."""
    if ep.compute_energy_j is not None:
        return np.asarray(ep.compute_energy_j, dtype=np.float64)
    full = profile.state_power_w()["compute"]
    if ep.slow_compute_s is None:  # P(clock) * 0 + full * (compute - 0): the same values
        return compute * full
    slow = np.minimum(np.asarray(ep.slow_compute_s, dtype=np.float64), compute)
    clock = _or(ep.clock_frac, np.ones_like(compute))
    return profile.compute_power_w(clock) * slow + full * (compute - slow)


def account(ep: Episode, profile: PowerProfile) -> EnergyAccount:
    """The time and energy of every state of ``ep`` under ``profile``.

    Args:
        ep: the episode.
        profile: the power profile.

    Returns:
        The :class:`EnergyAccount`.
    """
    times = {s: np.zeros(ep.arrival_s.shape) if t is None else t for s, t in _states(ep).items()}
    power = profile.state_power_w()
    energy = {s: times[s] * power[s] for s in STATES if s != "compute"}
    energy["compute"] = _compute_energy_j(ep, times["compute"], profile)
    return EnergyAccount(profile=profile.name, time_s=times, energy_j=energy)


def energy_totals(ep: Episode, profile: PowerProfile, *, oracle: bool = False) -> EnergyTotals:
    """Reduce the energy account of ``ep`` (whole, or one block of its iterations) under ``profile``.

    The reductions of :func:`account`'s arrays, bit for bit (``tests/test_energy.py``), made
    without keeping every state's energy array: each is summed and added to the total as it is
    made, and a state that is 0 everywhere is not built.

    Args:
        ep: an episode with its per-rank arrays.
        profile: the power profile.
        oracle: also sum :func:`oracle_saving` (``ep`` then being the run without pacing).

    Returns:
        The :class:`EnergyTotals`.
    """
    times = _states(ep)
    power = profile.state_power_w()
    compute = times["compute"]
    assert compute is not None
    total = _compute_energy_j(ep, compute, profile)
    energy_j = {"compute": float(total.sum())}
    if total is ep.compute_energy_j:
        total = total.copy()
    for state in STATES[1:]:  # in order: the total is their sum in STATES' order
        t = times[state]
        if t is None:  # 0 everywhere: adds nothing (and sums to 0.0)
            energy_j[state] = 0.0
            continue
        e = t * power[state]  # in t's layout, which sets the order of its sum
        energy_j[state] = float(e.sum())
        total += e
    return EnergyTotals(
        profile=profile.name,
        per_iteration_j=total.sum(axis=1),
        per_rank_j=total.sum(axis=0),
        energy_j=energy_j,
        time_s={s: 0.0 if t is None else float(t.sum()) for s, t in times.items()},
        oracle_saving_j=float(oracle_saving(ep, profile).sum()) if oracle else None,
    )


def total_j_at(e: EnergyTotals, profile: PowerProfile) -> float:
    """The total energy of ``e`` under ``profile``, a profile that differs from its account's in its
    non-compute state powers only (the ``spin_w`` sweep): each state's time at its power, and
    the compute energy as accounted, J."""
    power = profile.state_power_w()
    return e.energy_j["compute"] + math.fsum(e.time_s[s] * power[s] for s in STATES if s != "compute")


def episode_totals(ep: Episode, profile: PowerProfile, *, oracle: bool = False) -> EpisodeTotals:
    """:func:`pacectl.metrics.episode_totals` with the energy under ``profile`` (:func:`energy_totals`):
    the ``reduce`` of a streamed run whose energy is modelled (``oracle``: of the no-pacing run)."""
    return replace(metrics.episode_totals(ep), energy=energy_totals(ep, profile, oracle=oracle))


def totals_of(ep: Episode, profile: PowerProfile, *, oracle: bool = False) -> EnergyTotals:
    """The energy totals of ``ep``: those it streamed with (``ep.totals.energy``), else computed.

    Raises:
        PacectlError: a streamed episode without energy totals for ``profile`` (or without the
            oracle bound's saving where ``oracle`` asks for it).
    """
    if ep.totals is None:
        return energy_totals(ep, profile, oracle=oracle)
    e = ep.totals.energy
    if e is None or e.profile != profile.name or (oracle and e.oracle_saving_j is None):
        raise PacectlError(
            f"the {ep.controller!r} episode was streamed without the energy totals asked for (power profile "
            f"{profile.name!r}{', oracle bound' if oracle else ''}); stream it with "
            "energy.episode_totals(profile=..., oracle=...) as its reduce, or keep its per-rank arrays"
        )
    return e


def summarize_energy(ep: Episode, profile: PowerProfile) -> dict[str, Any]:
    """The energy fields of a run's summary (JSON-ready).

    Returns:
        ``energy_total_j`` (summed over ranks and iterations), ``energy_per_iteration_j`` (mean over
        iterations of the energy summed over ranks), ``energy_per_rank_j`` (global rank label ->
        total), ``energy_by_state_j`` and ``state_time_s`` (state -> joules / rank-seconds, summed),
        ``mean_power_w`` (per rank: total energy over rank-time), ``power_profile``,
        ``energy_source`` (``"model"``) and ``actuator``.
    """
    return _summary_fields(ep, totals_of(ep, profile), profile)


def _summary_fields(ep: Episode, e: EnergyTotals, profile: PowerProfile) -> dict[str, Any]:
    total = float(e.per_iteration_j.sum())
    rank_time = math.fsum(e.time_s.values())
    return {
        "energy_total_j": total,
        "energy_per_iteration_j": float(e.per_iteration_j.mean()),
        "energy_per_rank_j": {
            str(int(r)): float(x) for r, x in zip(ep.rank_labels, e.per_rank_j, strict=True)
        },
        "energy_by_state_j": dict(e.energy_j),
        "state_time_s": dict(e.time_s),
        "mean_power_w": total / rank_time if rank_time > 0 else math.nan,
        "power_profile": profile.name,
        "energy_source": "model",
        "actuator": str(ep.actuator),
    }


def oracle_saving(baseline: Episode, profile: PowerProfile) -> FloatArray:
    """The oracle bound: the energy each rank could save in each iteration of ``baseline`` (the run
    without pacing) by running its pre-arrival compute as slowly as its slack allows (module
    docstring), joules, ``float64[num_iterations, num_ranks]``, every entry >= 0.

    Per rank and iteration, with ``W`` its pre-arrival compute at the highest clock and ``e`` its
    wait in the paced collective (its slack): the window ``W + e`` costs ``P(1) W + P_wait e``
    without pacing and ``P(c) W / c + P_sleep (W + e - W / c)`` at clock fraction ``c``, for every
    allowed ``c >= W / (W + e)``; the saving is the first minus the least of the second. That is
    ``W (P(c) - P_sleep) / c + P_sleep (W + e)``, so among the table's clocks the least is at the one
    of least ``(P(c) - P_sleep) / c`` at or above ``W / (W + e)`` (a suffix minimum over the table,
    looked up per cell); it is compared with the clock that exactly fills the slack. Both
    candidates are evaluated by the first form, so each cell's figure is the least over every
    allowed clock to float rounding.
    """
    w = np.maximum(
        _or(baseline.pre_arrival_compute_s, _or(baseline.compute_s, baseline.natural_arrival_s)), 0.0
    )
    e = np.maximum(np.asarray(baseline.wait_s, dtype=np.float64), 0.0)
    sleeping = wait_sleeps(baseline)
    p_sleep = float(profile.sleep_w)
    p_wait = np.where(sleeping, p_sleep, float(profile.spin_w))
    p_full = float(profile.compute_power_w(1.0))
    window = w + e
    base = p_full * w + p_wait * e
    with np.errstate(divide="ignore", invalid="ignore"):
        feasible = np.where(window > 0, w / window, 1.0)  # the slowest clock that fits the slack
    fracs = profile.clock_fracs
    # the table clock of least (P(c) - P_sleep) / c among those at or above each index (suffix argmin)
    g = (profile.compute_power_w(fracs) - p_sleep) / fracs
    best_from = np.array([i + np.argmin(g[i:]) for i in range(len(fracs))])  # ties: the slowest
    first = np.searchsorted(fracs, feasible - 1e-12, side="left")
    table = fracs[best_from[np.minimum(first, len(fracs) - 1)]]
    table_ok = first < len(fracs)
    best = np.full(w.shape, np.inf)
    for clock, ok in (
        (table, table_ok),
        (c_fill := np.clip(feasible, profile.min_clock_frac, 1.0), c_fill >= feasible - 1e-12),
    ):
        stretched = np.where(w > 0, w / clock, 0.0)
        energy = profile.compute_power_w(clock) * stretched + p_sleep * np.maximum(window - stretched, 0.0)
        best = np.where(ok, np.minimum(best, energy), best)
    return np.maximum(base - best, 0.0)


def energy_comparison(
    baseline: Episode,
    episodes: dict[str, Episode],
    profile: PowerProfile,
    *,
    block: int | None = None,
    offset: int = 0,
) -> dict[str, dict[str, float]]:
    """Per run other than the baseline: its energy change against no pacing and the oracle bound.

    Returns:
        run -> ``energy_change_frac`` (``E_run / E_none - 1``; < 0 saves), ``energy_change_ci95_frac``
        (paired batch means, as throughput's), ``energy_saved_j``, ``oracle_bound_reached_frac``
        (``energy_saved_j`` over the oracle bound; NaN when the bound is 0).
    """
    base = totals_of(baseline, profile, oracle=True)
    return _comparison(base, {name: totals_of(ep, profile) for name, ep in episodes.items()}, block, offset)


def _comparison(
    base: EnergyTotals, runs: dict[str, EnergyTotals], block: int | None, offset: int
) -> dict[str, dict[str, float]]:
    base_it = base.per_iteration_j
    base_total = float(base_it.sum())
    bound = float(base.oracle_saving_j or 0.0)
    out = {}
    for name, acc in runs.items():
        run_it = acc.per_iteration_j
        saved = base_total - float(run_it.sum())
        out[name] = {
            "energy_change_frac": float(run_it.sum()) / base_total - 1.0 if base_total > 0 else math.nan,
            # the per-iteration energies' batch-means interval; NaN where the runs differ in length
            "energy_change_ci95_frac": metrics.paired_ci95_frac(base_it, run_it, block=block, offset=offset),
            "energy_saved_j": saved,
            "oracle_bound_reached_frac": saved / bound if bound > 0 else math.nan,
        }
    return out


def bound_summary(baseline: Episode, profile: PowerProfile) -> dict[str, Any]:
    """The summary's ``energy_bound`` block: the oracle bound in joules and as a fraction of the
    no-pacing run's energy, with what it means."""
    return _bound(totals_of(baseline, profile, oracle=True), profile)


def _bound(base: EnergyTotals, profile: PowerProfile) -> dict[str, Any]:
    saving = float(base.oracle_saving_j or 0.0)
    total = float(base.per_iteration_j.sum())
    return {
        "oracle_saving_j": saving,
        "oracle_saving_frac": saving / total if total > 0 else math.nan,
        "power_profile": profile.name,
        "method": "Perseus's extrinsic-bloat bound at the paced collective: each rank's pre-arrival compute "
        "as slow as its earliness without pacing allows (any allowed clock), the rest slept, iteration "
        "times as without pacing (closed form per rank and iteration; pacectl.energy.oracle_saving)",
    }


def spin_power_range(profile: PowerProfile) -> tuple[float, ...]:
    """The spinning powers an energy result is reported across (``spin_w`` is assumed): the null
    (spinning costs what sleeping does: then no wait-to-sleep conversion saves anything), the
    profile's value, and twice it."""
    return tuple(dict.fromkeys((float(profile.sleep_w), float(profile.spin_w), 2.0 * float(profile.spin_w))))


def energy_summary(
    episodes: dict[str, Episode],
    profile: PowerProfile,
    *,
    baseline: str = "none",
    block: int | None = None,
    offset: int = 0,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]], dict[str, Any]]:
    """Every energy field of a run's ``summary.json``.

    Args:
        episodes: run name -> episode, the baseline (no pacing) among them.
        profile: the power profile.
        baseline: the baseline's run name.
        block, offset: the paired interval's blocks (as throughput's).

    Returns:
        ``(per_run, vs_baseline, top)``: per run the fields of :func:`summarize_energy`; per run but
        the baseline, those of :func:`energy_comparison`; and the top-level ``power`` (the profile,
        with every number's source), ``energy_bound`` (:func:`bound_summary`) and
        ``energy_vs_spin_w`` (each run's energy change at every spinning power of
        :func:`spin_power_range`: the assumed parameter, reported across a range).
    """
    totals = {name: totals_of(ep, profile, oracle=name == baseline) for name, ep in episodes.items()}
    per_run = {name: _summary_fields(ep, totals[name], profile) for name, ep in episodes.items()}
    others = {name: t for name, t in totals.items() if name != baseline}
    vs = _comparison(totals[baseline], others, block, offset)
    sweep: dict[str, dict[str, float]] = {}
    for spin in spin_power_range(profile):
        varied = profile if spin == profile.spin_w else profile.with_powers(spin_w=spin)
        total = total_j_at(totals[baseline], varied)
        sweep[f"{spin:g}"] = {
            name: total_j_at(t, varied) / total - 1.0 if total > 0 else math.nan for name, t in others.items()
        }
    top = {
        "power": profile.describe(),
        "energy_bound": _bound(totals[baseline], profile),
        "energy_vs_spin_w": {
            "note": "energy_change_frac of each run at each spinning power (W; spin_w is assumed): at "
            f"{profile.sleep_w:g} W spinning costs what sleeping does, the null of the wait-to-sleep mechanism",
            "by_spin_w": sweep,
        },
    }
    return per_run, vs, top


#: What a live run's meter measures, by its source (:mod:`pacectl.torchdist.meters`).
MEASURED_SOURCES = {
    "nvml": ("energy", "j", "GPU energy read from NVML (nvmlDeviceGetTotalEnergyConsumption, read-only)"),
    "cpu_time_proxy": (
        "cpu_time",
        "s",
        "no energy counter on CPU/gloo: each rank's process CPU time per iteration, the closest proxy "
        "(compute and waits both burn CPU here; a busy-polling wait costs CPU time, a blocking or sleeping "
        "one does not), not joules",
    ),
}


def measured_summary(
    source: str,
    per_iteration: dict[str, FloatArray],
    *,
    baseline: str = "none",
    block: int | None = None,
    offset: int = 0,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]], dict[str, Any]]:
    """The energy fields of a live run's summary from what its ranks measured.

    Args:
        source: ``"nvml"`` (joules) or ``"cpu_time_proxy"`` (CPU seconds), :data:`MEASURED_SOURCES`.
        per_iteration: run -> ``float64[num_iterations, num_ranks]`` measured per iteration and rank.
        baseline: the no-pacing run.
        block, offset: the paired interval's blocks (the live interleave blocks).

    Returns:
        ``(per_run, vs_baseline, top)`` as :func:`energy_summary`: per run ``<q>_total_<u>``,
        ``<q>_per_iteration_<u>``, ``<q>_per_rank_<u>`` and ``energy_source`` (``q`` is ``energy``
        with NVML, ``cpu_time`` for the proxy; ``u`` its unit); per run but the baseline
        ``<q>_change_frac`` and ``<q>_change_ci95_frac``; top-level ``energy_measured`` saying what
        was measured.
    """
    quantity, unit, what = MEASURED_SOURCES[source]
    measured = {name: np.asarray(values, dtype=np.float64) for name, values in per_iteration.items()}
    per_run: dict[str, dict[str, Any]] = {
        name: {
            f"{quantity}_total_{unit}": float(v.sum()),
            f"{quantity}_per_iteration_{unit}": float(v.sum(axis=1).mean()) if len(v) else math.nan,
            f"{quantity}_per_rank_{unit}": {str(r): float(x) for r, x in enumerate(v.sum(axis=0))},
            "energy_source": source,
        }
        for name, v in measured.items()
    }
    vs: dict[str, dict[str, float]] = {}
    if baseline in measured:
        b = measured[baseline].sum(axis=1)
        for name, v in measured.items():
            if name == baseline:
                continue
            o = v.sum(axis=1)
            vs[name] = {
                f"{quantity}_change_frac": float(o.sum() / b.sum() - 1.0) if b.sum() > 0 else math.nan,
                f"{quantity}_change_ci95_frac": metrics.paired_ci95_frac(b, o, block=block, offset=offset),
            }
    return per_run, vs, {"energy_measured": {"source": source, "what": what}}
