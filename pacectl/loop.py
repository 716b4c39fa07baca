"""The one driver loop: a controller per pacing domain drives a backend for one episode.

Used by ``pacectl.run``, ``pacectl.tune``, the experiments and the tests alike::

    backend.reset(seed)                      # iteration 0 runs unpaced
    obs = backend.step([zeros] * domains)
    for each iteration k >= 1:
        actions = [controller_d.act(obs_d)]  # decided from iteration k-1 (lag 1, the default)
        obs = backend.step(actions)

A live job cannot act that fast everywhere: its ranks first exchange their figures
(:mod:`pacectl.torchdist.pacer`), which delays decisions by ``lag`` iterations (1 with a tiny
all-reduce, 2 when the figures ride on the next iteration's gradient bucket) and batches them by
``every`` iterations (``gather_every``). :class:`ExchangeSchedule` models exactly that, so replay and
simulation can measure what staler decisions cost a controller (``experiments/staleness``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from pacectl.types import Action, Backend, Controller, Episode, EpisodeTotals, Observation, RankCompute

#: (iteration, rank) cells a streamed episode holds at once before reducing them (8 MiB per array)
STREAM_CELLS = 1 << 20


@dataclass(frozen=True)
class ExchangeSchedule:
    """When a controller's decisions reach the ranks, in iterations.

    The figures of iterations are exchanged in groups of ``every``: ``[0, every)``, ``[every,
    2 every)``, ... The controller acts on every observation, in order (its state evolves as in a
    live job, which runs the engine on each exchanged row), and the decision taken on the last
    observation of a group ending at iteration ``e`` applies from iteration ``e + lag`` until the
    next group's decision applies. Iterations before the first decision run unpaced.

    Live equivalents (:mod:`pacectl.torchdist.pacer`): ``gather=async`` (the default on gloo) or
    ``collective`` is ``lag=1``; ``gather=piggyback`` (the default on NCCL) is ``lag=2``;
    ``gather_every`` is ``every`` (:func:`pacectl.torchdist.core.exchange_lag`).

    Attributes:
        lag: iterations from the last exchanged observation to the first iteration its decision
            paces, >= 1 (1: the next iteration, as if the figures were known at once).
        every: iterations exchanged at once, >= 1.

    Raises:
        ValueError: ``lag`` or ``every`` not an integer >= 1.
    """

    lag: int = 1
    every: int = 1

    def __post_init__(self) -> None:
        for name in ("lag", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ExchangeSchedule.{name} must be an integer >= 1, got {value!r}")

    def applies_from(self, k: int) -> int | None:
        """The first iteration paced by the decision taken on observation ``k``; None when that
        decision is superseded within its group (only a group's last observation counts)."""
        if (k + 1) % self.every:
            return None
        return k + self.lag


def run_episode(
    backend: Backend,
    make_controller: Callable[[], Controller] | Sequence[Callable[[], Controller]],
    *,
    seed: int = 0,
    num_iterations: int | None = None,
    on_iteration: Callable[[], None] | None = None,
    exchange: ExchangeSchedule | None = None,
    reduce: Callable[[Episode], EpisodeTotals] | None = None,
) -> Episode:
    """Run one closed-loop episode.

    Lockstep backends (replay, sim) run iteration k of every domain in one ``step``. A backend
    whose domains keep their own clocks (``Backend.independent_clocks``: several jobs on one fabric, see
    :meth:`pacectl.types.Backend.step`) returns from each ``step`` the domains whose iteration ended
    then; each domain's controller acts at that domain's own iteration boundaries, its decisions
    travel by its own :class:`ExchangeSchedule`, and the episode records each domain's first
    ``num_iterations`` iterations (row k of a domain is its own k-th iteration). The episode ends
    when every domain has recorded that many; a domain that got there first keeps running (its
    controller acting, its traffic on the fabric) meanwhile. For a lockstep backend this is exactly
    the one-step-per-iteration loop of the module docstring.

    Args:
        backend: any :class:`~pacectl.types.Backend`.
        make_controller: factory called once per domain (each domain gets its own state), or one
            factory per domain, in domain order (a job pinned to its own controller).
        seed: seeds the backend and each controller's ``rng`` (``default_rng([seed, domain])``).
        num_iterations: stop early after this many iterations (default: the backend's length).
        on_iteration: called each time every domain has recorded one more iteration (e.g. a
            progress bar's ``update``): once per iteration of a lockstep backend.
        exchange: when decisions apply (default ``ExchangeSchedule()``: from the next iteration).
        reduce: stream the episode: its per-rank arrays are kept for blocks of about
            :data:`STREAM_CELLS` cells only, each block (an :class:`Episode` of those iterations)
            reduced by ``reduce`` (:func:`pacectl.metrics.episode_totals`, or
            :func:`pacectl.energy.episode_totals` with the energy) as soon as it is full, so that memory grows with ranks, not ranks x
            iterations. The episode then holds ``totals`` (the blocks' reductions joined) and
            per-rank arrays without rows. None (the default): keep every per-rank array.
            Lockstep backends only.

    Returns:
        The columnar :class:`~pacectl.types.Episode`. ``pacing_active``, ``wait_asleep`` and the
        diagnostics of iteration ``k`` are those of the decision that paced ``k``, whatever the lag.
        With independent clocks it also holds ``domain_iteration_time_s``, and its
        ``iteration_time_s`` is the row's mean over domains.

    Raises:
        ValueError: a sequence of factories whose length is not the number of domains, or
            ``reduce`` with a backend whose domains keep their own clocks.
    """
    schedule = ExchangeSchedule() if exchange is None else exchange
    domains = backend.domains
    if isinstance(make_controller, Sequence):
        factories = list(make_controller)
        if len(factories) != len(domains):
            raise ValueError(
                f"make_controller must give one factory per domain ({len(domains)}), got {len(factories)}"
            )
    else:
        factories = [make_controller] * len(domains)
    controllers = [factory() for factory in factories]
    for d, (ctrl, dom) in enumerate(zip(controllers, domains, strict=True)):
        ctrl.reset(len(dom.ranks), np.random.default_rng([seed, d]))
    backend.reset(seed=seed)
    n_iter = backend.num_iterations if num_iterations is None else min(num_iterations, backend.num_iterations)
    independent = backend.independent_clocks
    num_ranks = len(backend.rank_labels)
    num_domains = len(domains)
    if reduce is not None and independent:
        raise ValueError("run_episode(reduce=...) streams lockstep backends only, not independent clocks")
    # rows kept at once: every iteration, or a block of them when streaming (row k % block)
    block = n_iter if reduce is None else max(1, min(n_iter, STREAM_CELLS // max(num_ranks, 1)))
    reduced: list[EpisodeTotals] = []
    rec: dict[str, Any] = {  # the per-rank columns, as Episode names them
        key: np.zeros((block, num_ranks))
        for key in ("arrival_s", "applied_delay_s", "natural_arrival_s", "wait_s")
    }
    iteration_time = np.zeros(n_iter)
    domain_time = np.zeros((n_iter, num_domains))
    collective_time = np.zeros((n_iter, num_domains))
    asleep = np.zeros((n_iter, num_domains), dtype=np.bool_)
    # what each rank's GPU did (energy accounting), when the backend reports it
    compute_rec: dict[str, np.ndarray] = {}
    # Row k holds the controller state that decided iteration k's delays (taken after act() on
    # the observation whose decision paces k: k-1 with lag 1), so pacing_active lines up with
    # applied_delay_s. Iteration 0 is never paced.
    diag_rows: list[list[dict[str, float]]] = [[{} for _ in domains] for _ in range(n_iter)]
    deciding: list[dict[str, float]] = [{"active": 0.0} for _ in domains]
    actions: list[Action] = [Action.zeros(len(dom.ranks)) for dom in domains]
    # per domain, decisions taken but not applied yet: (first iteration they pace, action, diagnostics)
    in_flight: list[deque[tuple[int, Action, dict[str, float]]]] = [deque() for _ in domains]
    columns = [_columns(dom.ranks) for dom in domains]
    domain_of_rank = np.zeros(num_ranks, dtype=np.int64)
    for d, idx in enumerate(columns):
        domain_of_rank[idx] = d
    # what every block of a streamed episode shares (the metrics need the labels and domains)
    shell = Episode(
        backend=backend.name,
        comm_model=backend.comm_model,
        comm_timing_dependent=backend.comm_timing_dependent,
        controller=controllers[0].name,
        rank_labels=np.asarray(backend.rank_labels, dtype=np.int64),
        domain_of_rank=domain_of_rank,
        domain_names=tuple(dom.name for dom in domains),
        step_ids=np.asarray(backend.step_ids[:n_iter], dtype=np.int64),
        iteration_time_s=iteration_time,
        collective_time_s=collective_time,
        pacing_active=np.zeros((n_iter, num_domains), dtype=np.bool_),
        **rec,
    )
    counts = [0] * num_domains  # iterations each domain has run
    ready: list[int] = list(range(num_domains))  # domains whose next iteration starts now
    progressed = 0
    while min(counts) < n_iter:
        for d in ready:
            pending = in_flight[d]
            while pending and pending[0][0] <= counts[d]:
                _, actions[d], deciding[d] = pending.popleft()
        observations: list[Observation] = backend.step(actions)
        if not independent:
            iteration_time[counts[0]] = observations[0].iteration_time_s
        ready = []
        for position, obs in enumerate(observations):
            d = int(obs.domain) if independent else position
            k = counts[d]
            if k < n_iter:
                idx = columns[d]
                row = k % block
                for key, column in rec.items():
                    column[row, idx] = getattr(obs, key)
                collective_time[k, d] = obs.collective_time_s
                domain_time[k, d] = obs.iteration_time_s
                asleep[k, d] = actions[d].wait == "sleep"
                if obs.compute is not None:
                    _record_compute(compute_rec, obs.compute, row, idx, (block, num_ranks))
                diag_rows[k][d] = deciding[d]
            ctrl = controllers[d]
            decided = ctrl.act(obs)
            first = schedule.applies_from(k)
            if first is not None:
                # a copy: a controller may reuse its arrays while a decision waits or stays in force
                held = Action(np.array(decided.delay_s, dtype=np.float64), decided.wait)
                in_flight[d].append((first, held, ctrl.diagnostics()))
            counts[d] += 1
            ready.append(d)
        done = counts[0]
        if reduce is not None and done <= n_iter and (done % block == 0 or done == n_iter):
            rows = slice(0, done - (done - 1) // block * block)  # the block's rows filled so far
            iters = slice(done - rows.stop, done)
            reduced.append(
                reduce(
                    replace(
                        shell,
                        step_ids=shell.step_ids[iters],
                        iteration_time_s=iteration_time[iters],
                        collective_time_s=collective_time[iters],
                        pacing_active=np.zeros((rows.stop, num_domains), dtype=np.bool_),
                        wait_asleep=asleep[iters],
                        **_rows(rec, compute_rec, rows=rows),
                    )
                )
            )
            for key, value in compute_rec.items():  # a field an observation leaves out keeps its default
                value.fill(1.0 if key == "clock_frac" else 0.0)
            if len(reduced) >= 64:  # the blocks' per-rank sums, joined now and then: O(ranks) held
                reduced = [EpisodeTotals.concat(reduced)]
        while on_iteration is not None and progressed < min(min(counts), n_iter):
            on_iteration()
            progressed += 1
    if independent:
        iteration_time = domain_time.mean(axis=1)
    keys = sorted({key for row in diag_rows for diag in row for key in diag})
    diagnostics = {
        key: np.array(
            [[diag.get(key, np.nan) for diag in row] for row in diag_rows], dtype=np.float64
        ).reshape(n_iter, num_domains)
        for key in keys
    }
    active = diagnostics.get("active", np.zeros((n_iter, num_domains))) > 0.5
    last = [ctrl.diagnostics() for ctrl in controllers]  # every decision taken, applied or not
    guards = [d.get(key, 0.0) for d in last for key in ("guard_interventions", "guard_clipped")]
    # the run's controller: a job pinned to no pacing does not name a run of another controller
    name = next((c.name for c in controllers if c.name != "none"), controllers[0].name)
    return replace(
        shell,
        controller=name,
        totals=EpisodeTotals.concat(reduced) if reduce is not None else None,
        iteration_time_s=iteration_time,
        collective_time_s=collective_time,
        pacing_active=active,
        diagnostics=diagnostics,
        guard_interventions=int(np.nansum(guards)),
        wait_asleep=asleep,
        domain_iteration_time_s=domain_time if independent else None,
        actuator=backend.actuator,
        **_rows(rec, compute_rec, rows=slice(0, 0) if reduce is not None else slice(None)),
    )


def _rows(*columns: dict[str, np.ndarray], rows: slice) -> dict[str, Any]:
    """The per-rank columns' ``rows`` (a block's filled rows; none for a streamed episode's end)."""
    return {key: value[rows] for column in columns for key, value in column.items()}


def _record_compute(
    out: dict[str, np.ndarray], compute: RankCompute, k: int, idx: slice | np.ndarray, shape: tuple[int, int]
) -> None:
    """Copy one observation's :class:`RankCompute` into the episode's columns (created on first use)."""
    for key in (f.name for f in fields(RankCompute)):
        value = getattr(compute, key)
        if value is None:
            continue
        if key not in out:
            out[key] = np.ones(shape) if key == "clock_frac" else np.zeros(shape)
        out[key][k, idx] = value


def _columns(ranks: tuple[int, ...]) -> slice | np.ndarray:
    """Column index of a domain's ranks: a slice when they are contiguous (the common case)."""
    index = np.asarray(ranks, dtype=np.int64)
    if len(index) and (np.diff(index) == 1).all():
        return slice(int(index[0]), int(index[-1]) + 1)
    return index
