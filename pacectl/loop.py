"""The one driver loop: a controller per pacing domain drives a backend for one episode.

Used by ``pacectl.run``, ``pacectl.tune``, the experiments and the tests alike::

    backend.reset(seed)                      # iteration 0 runs unpaced
    obs = backend.step([zeros] * domains)
    for each iteration k >= 1:
        actions = [controller_d.act(obs_d)]  # decided from iteration k-1
        obs = backend.step(actions)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pacectl.types import Action, Backend, Controller, Episode, Observation


def run_episode(
    backend: Backend,
    make_controller: Callable[[], Controller],
    *,
    seed: int = 0,
    num_iterations: int | None = None,
    on_iteration: Callable[[], None] | None = None,
) -> Episode:
    """Run one closed-loop episode.

    Args:
        backend: any :class:`~pacectl.types.Backend`.
        make_controller: factory called once per domain (each domain gets its own state).
        seed: seeds the backend and each controller's ``rng`` (``default_rng([seed, domain])``).
        num_iterations: stop early after this many iterations (default: the backend's length).
        on_iteration: called after every iteration (e.g. a progress bar's ``update``).

    Returns:
        The columnar :class:`~pacectl.types.Episode`.
    """
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
    # iteration k-1), so pacing_active lines up with applied_delay_s. Iteration 0 is never paced.
    diag_rows: list[list[dict[str, float]]] = []
    deciding: list[dict[str, float]] = [{"active": 0.0} for _ in domains]
    actions: Sequence[Action] = [Action.zeros(len(dom.ranks)) for dom in domains]
    columns = [_columns(dom.ranks) for dom in domains]
    for k in range(n_iter):
        observations: list[Observation] = backend.step(actions)
        iteration_time[k] = observations[0].iteration_time_s
        for d, (obs, idx) in enumerate(zip(observations, columns, strict=True)):
            rec["arrival_s"][k, idx] = obs.arrival_s
            rec["applied_delay_s"][k, idx] = obs.applied_delay_s
            rec["natural_arrival_s"][k, idx] = obs.natural_arrival_s
            rec["wait_s"][k, idx] = obs.wait_s
            collective_time[k, d] = obs.collective_time_s
        diag_rows.append(deciding)
        actions = [ctrl.act(obs) for ctrl, obs in zip(controllers, observations, strict=True)]
        deciding = [ctrl.diagnostics() for ctrl in controllers]
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
    final = {
        key: np.array([d.get(key, 0.0) for d in deciding]) for key in ("guard_interventions", "guard_clipped")
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
