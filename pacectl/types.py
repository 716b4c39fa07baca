"""Value types and plugin interfaces shared by controllers, backends, the loop and metrics.

Units are part of the contract: every ``*_s`` field is in seconds, every array is ``float64``.

Data flows one way::

    Backend.reset() -> Backend.step(actions) -> [Observation per domain]
        -> Controller.act(obs) -> Action -> Backend.step(...) -> ... -> Episode
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class RankCompute:
    """What each rank's GPU did in one iteration besides waiting, for energy accounting.

    All arrays are ``float64[num_ranks]`` (ranks of one domain, in domain order).

    Attributes:
        compute_s: time computing, as run (at the clock it ran at), seconds.
        pre_arrival_compute_s: of which before the arrival at the paced collective, seconds (the
            oracle bound slows it, :func:`pacectl.energy.oracle_saving`).
        clock_frac: SM clock of ``slow_compute_s`` as a fraction of the highest (1 = full speed; the
            rest of the compute runs at 1).
        sleep_s: the part of the pacing delay slept (the delay minus what running slower absorbed),
            seconds.
        slow_compute_s: the compute that ran at ``clock_frac`` (the clock actuator's), as run,
            seconds; None: none (all at the highest clock).
        compute_energy_j: energy of the compute when the backend integrated it itself (a clock that
            varied within the iteration: the node power cap), joules; None: from the power profile.
    """

    compute_s: FloatArray
    pre_arrival_compute_s: FloatArray
    clock_frac: FloatArray
    sleep_s: FloatArray
    slow_compute_s: FloatArray | None = None
    compute_energy_j: FloatArray | None = None


@dataclass(frozen=True)
class Observation:
    """What a controller sees for one iteration of one pacing domain.

    All arrays are ``float64[num_ranks]`` (ranks of this domain, in domain order), in seconds.

    Attributes:
        iteration: 0-based iteration index within the episode.
        domain: index of the pacing domain (for example the DP group of one pipeline stage).
        arrival_s: arrival at the paced collective, measured from the iteration start and aligned
            across ranks. Includes the applied pacing delay.
        applied_delay_s: pacing delay applied before entering the paced collective (>= 0).
        natural_arrival_s: ``arrival_s - applied_delay_s``: when the rank would have arrived unpaced.
        wait_s: time blocked inside the paced collective waiting for the last rank (>= 0).
        iteration_time_s: wall time of the whole iteration (all domains), seconds.
        collective_time_s: transfer time of the paced collective after the last rank arrived, seconds.
        compute: what each rank's GPU did in the iteration (compute time and clock, the part of the
            delay slept), for energy accounting (:mod:`pacectl.energy`); None where the backend does
            not know (then everything before the natural arrival counts as compute at the highest
            clock, and the whole delay as sleep). Controllers do not read it.
    """

    iteration: int
    domain: int
    arrival_s: FloatArray
    applied_delay_s: FloatArray
    natural_arrival_s: FloatArray
    wait_s: FloatArray
    iteration_time_s: float
    collective_time_s: float
    compute: RankCompute | None = None

    @property
    def num_ranks(self) -> int:
        """Number of ranks in this domain."""
        return int(self.arrival_s.shape[0])

    @property
    def spread_s(self) -> float:
        """Arrival spread: latest minus earliest arrival, seconds."""
        return float(self.arrival_s.max() - self.arrival_s.min())

    @property
    def natural_spread_s(self) -> float:
        """Spread of the unpaced arrivals, seconds (what pacing tries to absorb)."""
        return float(self.natural_arrival_s.max() - self.natural_arrival_s.min())


#: How the ranks of a domain wait inside the paced collective for its last rank (:attr:`Action.wait`):
#: ``"spin"`` busy-polls (what NCCL's kernels and proxy thread do, and today's default everywhere),
#: ``"sleep"`` blocks in the kernel (no CPU cycles, no polling traffic while waiting).
WAIT_MODES = ("spin", "sleep")


@dataclass(frozen=True)
class Action:
    """Pacing decision for one domain.

    Attributes:
        delay_s: ``float64[num_ranks]``, seconds, every entry >= 0 and finite. Each rank sleeps this
            long before entering the paced collective of the next iteration.
        wait: how the ranks then wait inside that collective for its last rank, one of
            :data:`WAIT_MODES`: ``"spin"`` (busy polling, the default) or ``"sleep"``. It is part of
            the action because it is part of what a rank does while it waits: in the simulator only
            spinning waiters cause early-arrival interference
            (:class:`~pacectl.fabric.contention.EarlyArrivalInterference`); replay (max-plus) has
            no such term; live, see :mod:`pacectl.controllers.sleep_wait` for what each transport
            lets it change.
    """

    delay_s: FloatArray
    wait: str = "spin"

    def __post_init__(self) -> None:
        if self.wait not in WAIT_MODES:
            from pacectl.errors import ControllerError

            raise ControllerError(f"Action.wait must be one of {list(WAIT_MODES)}, got {self.wait!r}")

    @staticmethod
    def zeros(num_ranks: int, *, wait: str = "spin") -> Action:
        """No pacing for ``num_ranks`` ranks (waiting as ``wait`` says)."""
        return Action(np.zeros(num_ranks, dtype=np.float64), wait)


@runtime_checkable
class Controller(Protocol):
    """A pacing controller for one domain. Pure and stateful: no clock, no I/O, no torch.

    Call order: ``reset`` once, then ``act`` once per iteration. ``diagnostics`` may be called
    any time after ``reset`` and must include ``"active"`` (1.0 while pacing, else 0.0).
    """

    name: str

    def reset(self, num_ranks: int, rng: np.random.Generator) -> None:
        """Clear all state for a new episode of ``num_ranks`` ranks."""

    def act(self, obs: Observation) -> Action:
        """Return the delays to apply at the next iteration, given this iteration's observation."""

    def diagnostics(self) -> dict[str, float]:
        """Internal state for plots and logs (for example PID terms). Keys are stable per class."""


@dataclass(frozen=True)
class Domain:
    """A pacing domain: the ranks that meet at one sync point.

    Attributes:
        name: human-readable name, for example ``"stage0"``.
        ranks: indices into the backend's rank list (``Backend.rank_labels``), in domain order.
    """

    name: str
    ranks: tuple[int, ...]


@runtime_checkable
class Backend(Protocol):
    """Something that runs iterations: a trace replay, a simulator, or a live torch.distributed job.

    A backend never knows which controller drives it.

    Attributes:
        name: backend kind (``"replay"``, ``"sim"``, ``"torchdist"``).
        comm_model: name of the communication-duration model in force (``"null"`` means fixed
            durations, the max-plus model in which pacing can never shorten an iteration).
        domains: the pacing domains, one controller instance each.
        rank_labels: ``int64[num_ranks]`` global rank id of each rank index.
        step_ids: ``int64[num_iterations]`` the source step id of each iteration (trace step ids).
        comm_timing_dependent: whether durations depend on when transfers start (only then can
            pacing change an iteration).
        actuator: how the pacing delays are applied (``"delay"``: sleep; ``"clock"``: slower compute).
        independent_clocks: True for a backend whose domains keep their own clocks (several jobs
            sharing one fabric: :class:`pacectl.backends.multijob.MultiJobSimBackend`; see
            :meth:`step`). False (the default): lockstep.
    """

    name: str
    comm_model: str
    domains: tuple[Domain, ...]
    rank_labels: IntArray
    step_ids: IntArray
    comm_timing_dependent: bool
    actuator: str
    independent_clocks: bool = False

    @property
    def num_iterations(self) -> int: ...

    def reset(self, *, seed: int = 0) -> None:
        """Start a new episode at iteration 0."""

    def step(self, actions: Sequence[Action]) -> list[Observation]:
        """Run one iteration with one action per domain; return one observation per domain.

        A lockstep backend (the default) runs iteration k of every domain and returns one
        observation per domain, in domain order. A backend with ``independent_clocks`` runs until
        the next instant at which some domain ends an iteration and returns the observations of the
        domains that ended one then (at least one, in domain order, each carrying its own
        ``domain`` and ``iteration``); ``actions`` still holds one entry per domain, and only the
        entries of the domains returned by the previous call (every domain on the first call) are
        read: they pace those domains' next iteration. Such a backend keeps running a domain past
        ``num_iterations`` (so that its traffic stays on the fabric) until every domain has run
        that many; :func:`pacectl.loop.run_episode` records each domain's first ``num_iterations``.
        """


@dataclass(frozen=True)
class EnergyTotals:
    """An episode's energy account reduced over its cells: what the summary's energy fields need,
    ``O(num_iterations + num_ranks)`` values, so that a streamed episode carries it in place of its
    per-rank arrays (:class:`EpisodeTotals`). :func:`pacectl.energy.energy_totals` computes it from
    an episode (or block of iterations); :meth:`concat` joins consecutive blocks.

    Attributes:
        profile: the power profile's name.
        per_iteration_j: ``float64[num_iterations]`` energy of each iteration summed over ranks, J.
        per_rank_j: ``float64[num_ranks]`` energy of each rank summed over iterations, J.
        energy_j: state -> J, summed over ranks and iterations.
        time_s: state -> rank-seconds, summed.
        oracle_saving_j: the oracle bound's saving summed (:func:`pacectl.energy.oracle_saving`), J; None where
            not computed (it is needed of the no-pacing run only).
    """

    profile: str
    per_iteration_j: FloatArray
    per_rank_j: FloatArray
    energy_j: dict[str, float]
    time_s: dict[str, float]
    oracle_saving_j: float | None = None

    @staticmethod
    def concat(parts: Sequence[EnergyTotals]) -> EnergyTotals:
        """The totals of consecutive blocks of iterations, in order, as one."""
        savings = [p.oracle_saving_j for p in parts]
        return EnergyTotals(
            profile=parts[0].profile,
            per_iteration_j=np.concatenate([p.per_iteration_j for p in parts]),
            per_rank_j=np.sum([p.per_rank_j for p in parts], axis=0),
            energy_j={s: math.fsum(p.energy_j[s] for p in parts) for s in parts[0].energy_j},
            time_s={s: math.fsum(p.time_s[s] for p in parts) for s in parts[0].time_s},
            oracle_saving_j=None if any(x is None for x in savings) else math.fsum(savings),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class EpisodeTotals:
    """What the metrics need of an episode's ``[num_iterations, num_ranks]`` arrays, reduced over
    ranks: ``O(num_iterations x num_domains + num_ranks)`` values, so that a long run with many ranks
    can be summarised as it streams (:func:`pacectl.loop.run_episode`'s ``reduce``) without keeping
    its per-rank arrays. :func:`pacectl.metrics.episode_totals` computes it from any episode (or block of
    iterations); :meth:`concat` joins consecutive blocks. Every metric here reads it
    (:func:`pacectl.metrics.totals_of`), so a streamed run and a full one give the same figures (sums to float
    rounding, maxima, minima, quantiles and counts exactly).

    Attributes:
        spread_s: ``float64[num_iterations, num_domains]`` :func:`pacectl.metrics.spread_s`, seconds.
        natural_spread_s: ``float64[num_iterations, num_domains]`` :func:`pacectl.metrics.natural_spread_s`, seconds.
        delay_s: ``float64[num_iterations, num_domains]`` the pacing delay summed over each domain's
            ranks, rank-seconds.
        wait_s: ``float64[num_iterations]`` the wait in the paced collective summed over ranks,
            rank-seconds.
        last_iters: ``int64[num_ranks]`` iterations in which each rank arrived last in its domain
            (ties: every tied rank), by ``arrival_s``.
        natural_last_iters: ``int64[num_ranks]`` the same by ``natural_arrival_s``.
        energy: the energy account's totals (:func:`pacectl.energy.energy_totals`), or None where
            no power profile was given.
    """

    spread_s: FloatArray
    natural_spread_s: FloatArray
    delay_s: FloatArray
    wait_s: FloatArray
    last_iters: IntArray
    natural_last_iters: IntArray
    energy: EnergyTotals | None = None

    @staticmethod
    def concat(parts: Sequence[EpisodeTotals]) -> EpisodeTotals:
        """The totals of consecutive blocks of iterations, in order, as one."""
        energies = [p.energy for p in parts]
        return EpisodeTotals(
            spread_s=np.concatenate([p.spread_s for p in parts]),
            natural_spread_s=np.concatenate([p.natural_spread_s for p in parts]),
            delay_s=np.concatenate([p.delay_s for p in parts]),
            wait_s=np.concatenate([p.wait_s for p in parts]),
            last_iters=np.sum([p.last_iters for p in parts], axis=0),
            natural_last_iters=np.sum([p.natural_last_iters for p in parts], axis=0),
            energy=None if any(e is None for e in energies) else EnergyTotals.concat(energies),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class Episode:
    """Columnar record of one episode: ``num_iterations`` x ``num_ranks`` (all domains together).

    Attributes:
        backend: backend name.
        comm_model: communication model name (``"null"`` = fixed durations).
        controller: controller name.
        rank_labels: ``int64[num_ranks]`` global rank ids.
        domain_of_rank: ``int64[num_ranks]`` domain index of each rank.
        domain_names: one name per domain.
        step_ids: ``int64[num_iterations]`` source step ids.
        iteration_time_s: ``float64[num_iterations]`` seconds.
        arrival_s: ``float64[num_iterations, num_ranks]`` arrival at the paced collective, seconds.
        applied_delay_s: ``float64[num_iterations, num_ranks]`` pacing delay, seconds.
        natural_arrival_s: ``float64[num_iterations, num_ranks]`` unpaced arrival, seconds.
        wait_s: ``float64[num_iterations, num_ranks]`` blocked time inside the paced collective, seconds.
        collective_time_s: ``float64[num_iterations, num_domains]`` paced collective transfer time, seconds.
        pacing_active: ``bool[num_iterations, num_domains]`` the ``active`` diagnostic of the
            controller state that decided this iteration's delays (False at iteration 0).
        diagnostics: name -> ``float64[num_iterations, num_domains]``, every controller diagnostic,
            aligned the same way (row k = state after observing iteration k-1).
        guard_interventions: number of actions the safety guard clipped or zeroed.
        comm_timing_dependent: whether the comm model's durations depended on timing in this
            episode (only then can pacing gain); None: judge by ``comm_model``'s name
            (:func:`pacectl.fabric.base.is_timing_dependent`).
        wait_asleep: ``bool[num_iterations, num_domains]``, True where the decision that paced the
            iteration had the domain's ranks wait asleep in the collective (:attr:`Action.wait`
            ``"sleep"``); None: every rank spun (the default wait).
        domain_iteration_time_s: ``float64[num_iterations, num_domains]`` seconds, the iteration
            time of each domain's own k-th iteration, set by backends whose domains keep their own
            clocks (several jobs sharing a fabric: row k of a domain is *its* k-th iteration, which
            ends at another instant than the other domains' k-th); None for lockstep backends,
            whose domains share every iteration's time (``iteration_time_s``). With it,
            ``iteration_time_s`` is the row's mean over domains, and the metrics report each domain
            as a job (:func:`pacectl.metrics.summarize`).
        compute_s, pre_arrival_compute_s, clock_frac, sleep_s, slow_compute_s, compute_energy_j:
            ``float64[num_iterations, num_ranks]`` each, the :class:`RankCompute` of every
            observation, or None where the backend reported none (:mod:`pacectl.energy` then
            assumes the defaults that class describes).
        actuator: how the pacing delays were applied: ``"delay"`` (sleep, then run at full speed)
            or ``"clock"`` (run the pre-arrival compute slower, sleep what the clock range cannot
            absorb).
        totals: the per-rank arrays' reductions (:class:`EpisodeTotals`) where the
            episode was streamed (:func:`pacectl.loop.run_episode`'s ``reduce``): then the
            ``[num_iterations, num_ranks]`` arrays above hold no rows (shape ``(0, num_ranks)``) and
            the metrics read these instead; None: the arrays are whole.
    """

    backend: str
    comm_model: str
    controller: str
    rank_labels: IntArray
    domain_of_rank: IntArray
    domain_names: tuple[str, ...]
    step_ids: IntArray
    iteration_time_s: FloatArray
    arrival_s: FloatArray
    applied_delay_s: FloatArray
    natural_arrival_s: FloatArray
    wait_s: FloatArray
    collective_time_s: FloatArray
    pacing_active: BoolArray
    diagnostics: Mapping[str, FloatArray] = field(default_factory=dict)
    guard_interventions: int = 0
    comm_timing_dependent: bool | None = None
    wait_asleep: BoolArray | None = None
    domain_iteration_time_s: FloatArray | None = None
    compute_s: FloatArray | None = None
    pre_arrival_compute_s: FloatArray | None = None
    clock_frac: FloatArray | None = None
    sleep_s: FloatArray | None = None
    slow_compute_s: FloatArray | None = None
    compute_energy_j: FloatArray | None = None
    actuator: str = "delay"
    totals: EpisodeTotals | None = None

    @property
    def num_iterations(self) -> int:
        """Number of iterations recorded."""
        return int(self.iteration_time_s.shape[0])

    @property
    def num_ranks(self) -> int:
        """Number of ranks (all domains)."""
        return int(self.rank_labels.shape[0])

    @property
    def num_domains(self) -> int:
        """Number of pacing domains."""
        return len(self.domain_names)
