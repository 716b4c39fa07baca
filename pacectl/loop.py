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
from dataclasses import dataclass

import numpy as np

from pacectl.types import Action, Backend, Controller, Episode, Observation


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
    make_controller: Callable[[], Controller],
    *,
    seed: int = 0,
    num_iterations: int | None = None,
    on_iteration: Callable[[], None] | None = None,
    exchange: ExchangeSchedule | None = None,
) -> Episode:
    """Run one closed-loop episode.

    Args:
        backend: any :class:`~pacectl.types.Backend`.
        make_controller: factory called once per domain (each domain gets its own state).
        seed: seeds the backend and each controller's ``rng`` (``default_rng([seed, domain])``).
        num_iterations: stop early after this many iterations (default: the backend's length).
        on_iteration: called after every iteration (e.g. a progress bar's ``update``).
        exchange: when decisions apply (default ``ExchangeSchedule()``: from the next iteration).

    Returns:
        The columnar :class:`~pacectl.types.Episode`. ``pacing_active`` and the diagnostics of
        iteration ``k`` are those of the decision that paced ``k``, whatever the lag.
    """
    schedule = ExchangeSchedule() if exchange is None else exchange
    domains = backend.domains
    controllers = [make_controller() for _ in domains]
    for d, (ctrl, dom) in enumerate(zip(controllers, domains, strict=True)):
        ctrl.reset(len(dom.ranks), np.random.default_rng([seed, d]))
    backend.reset(seed=seed)
    n_iter = backend.num_iterations if num_iterations is None else min(num_iterations, backend.num_iterations)
    num_ranks = len(backend.rank_labels)
    rec = {
        key: np.zeros((n_iter, num_ranks))
        for key in ("arrival_s", "applied_delay_s", "natural_arrival_s", "wait_s")
    }
    iteration_time = np.zeros(n_iter)
    collective_time = np.zeros((n_iter, len(domains)))
    # Row k holds the controller state that decided iteration k's delays (taken after act() on
    # the observation whose decision paces k: k-1 with lag 1), so pacing_active lines up with
    # applied_delay_s. Iteration 0 is never paced.
    diag_rows: list[list[dict[str, float]]] = []
    deciding: list[dict[str, float]] = [{"active": 0.0} for _ in domains]
    actions: Sequence[Action] = [Action.zeros(len(dom.ranks)) for dom in domains]
    # decisions taken but not applied yet: (first iteration they pace, actions, diagnostics)
    in_flight: deque[tuple[int, Sequence[Action], list[dict[str, float]]]] = deque()
    columns = [_columns(dom.ranks) for dom in domains]
    for k in range(n_iter):
        while in_flight and in_flight[0][0] <= k:
            _, actions, deciding = in_flight.popleft()
        observations: list[Observation] = backend.step(actions)
        iteration_time[k] = observations[0].iteration_time_s
        for d, (obs, idx) in enumerate(zip(observations, columns, strict=True)):
            rec["arrival_s"][k, idx] = obs.arrival_s
            rec["applied_delay_s"][k, idx] = obs.applied_delay_s
            rec["natural_arrival_s"][k, idx] = obs.natural_arrival_s
            rec["wait_s"][k, idx] = obs.wait_s
            collective_time[k, d] = obs.collective_time_s
        diag_rows.append(deciding)
        decided = [ctrl.act(obs) for ctrl, obs in zip(controllers, observations, strict=True)]
        first = schedule.applies_from(k)
        if first is not None:
            # copies: a controller may reuse its arrays while a decision waits or stays in force
            held = [Action(np.array(a.delay_s, dtype=np.float64)) for a in decided]
            in_flight.append((first, held, [ctrl.diagnostics() for ctrl in controllers]))
        if on_iteration is not None:
            on_iteration()
    keys = sorted({key for row in diag_rows for diag in row for key in diag})
    diagnostics = {
        key: np.array(
            [[diag.get(key, np.nan) for diag in row] for row in diag_rows], dtype=np.float64
        ).reshape(n_iter, len(domains))
        for key in keys
    }
    active = diagnostics.get("active", np.zeros((n_iter, len(domains)))) > 0.5
    last = [ctrl.diagnostics() for ctrl in controllers]  # every decision taken, applied or not
    final = {
        key: np.array([d.get(key, 0.0) for d in last]) for key in ("guard_interventions", "guard_clipped")
    }
    domain_of_rank = np.zeros(num_ranks, dtype=np.int64)
    for d, idx in enumerate(columns):
        domain_of_rank[idx] = d
    return Episode(
        backend=backend.name,
        comm_model=backend.comm_model,
        comm_timing_dependent=getattr(backend, "comm_timing_dependent", None),
        controller=controllers[0].name,
        rank_labels=np.asarray(backend.rank_labels, dtype=np.int64),
        domain_of_rank=domain_of_rank,
        domain_names=tuple(dom.name for dom in domains),
        step_ids=np.asarray(backend.step_ids[:n_iter], dtype=np.int64),
        iteration_time_s=iteration_time,
        collective_time_s=collective_time,
        pacing_active=active,
        diagnostics=diagnostics,
        guard_interventions=int(sum(np.nansum(c) for c in final.values())),
        **rec,
    )


def _columns(ranks: tuple[int, ...]) -> slice | np.ndarray:
    """Column index of a domain's ranks: a slice when they are contiguous (the common case)."""
    index = np.asarray(ranks, dtype=np.int64)
    if len(index) and (np.diff(index) == 1).all():
        return slice(int(index[0]), int(index[-1]) + 1)
    return index
