"""Synthetic :class:`~pacectl.types.Episode` factory for tests of metrics, reports and tuning.

Example:
    >>> from pacectl.testing.episodes import make_episode
    >>> ep = make_episode([[0.0, 0.2], [0.1, 0.1]])
    >>> ep.num_iterations, ep.num_ranks, ep.num_domains
    (2, 2, 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from pacectl.types import Episode


def make_episode(
    arrival_s: ArrayLike,
    *,
    applied_delay_s: ArrayLike | None = None,
    wait_s: ArrayLike | None = None,
    iteration_time_s: ArrayLike | None = None,
    domain_of_rank: Sequence[int] | None = None,
    domain_names: Sequence[str] | None = None,
    rank_labels: Sequence[int] | None = None,
    step_ids: Sequence[int] | None = None,
    collective_time_s: float = 0.01,
    pacing_active: ArrayLike | None = None,
    diagnostics: Mapping[str, ArrayLike] | None = None,
    guard_interventions: int = 0,
    comm_model: str = "null",
    controller: str = "none",
    backend: str = "synthetic",
) -> Episode:
    """Build a consistent episode from arrivals, filling every unspecified column plausibly.

    Defaults follow the max-plus model per domain: ``natural_arrival_s = arrival_s - applied_delay_s``;
    ``wait_s`` is the time until the domain's last arrival; ``iteration_time_s`` is the latest arrival
    of the iteration plus ``collective_time_s``. One domain (all ranks) unless ``domain_of_rank`` says
    otherwise; rank labels ``0..num_ranks-1``; step ids ``0..num_iterations-1``; pacing inactive.

    Args:
        arrival_s: ``float64[num_iterations, num_ranks]``, seconds.
        applied_delay_s: ``float64[num_iterations, num_ranks]``, seconds; default zeros.
        wait_s: ``float64[num_iterations, num_ranks]``, seconds; default from the arrivals.
        iteration_time_s: ``float64[num_iterations]``, seconds; default from the arrivals.
        domain_of_rank: domain index of each rank; default all 0.
        domain_names: one name per domain; default ``"d0"``, ``"d1"``, ...
        rank_labels: global rank id of each rank index.
        step_ids: source step id of each iteration.
        collective_time_s: transfer time of the paced collective, seconds (every iteration and domain).
        pacing_active: ``bool[num_iterations, num_domains]``; default all False.
        diagnostics: name -> ``float64[num_iterations, num_domains]``.
        guard_interventions: count of guard interventions.
        comm_model: communication model name.
        controller: controller name.
        backend: backend name.

    Returns:
        The episode.
    """
    arrival = np.atleast_2d(np.asarray(arrival_s, dtype=np.float64))
    num_iterations, num_ranks = arrival.shape
    delay = np.zeros_like(arrival) if applied_delay_s is None else np.asarray(applied_delay_s, np.float64)
    dom = np.zeros(num_ranks, np.int64) if domain_of_rank is None else np.asarray(domain_of_rank, np.int64)
    num_domains = int(dom.max()) + 1 if num_ranks else 1
    names = tuple(f"d{d}" for d in range(num_domains)) if domain_names is None else tuple(domain_names)
    if wait_s is None:
        latest = np.empty_like(arrival)
        for d in range(num_domains):
            mask = dom == d
            if mask.any():
                latest[:, mask] = arrival[:, mask].max(axis=1, keepdims=True)
        wait = latest - arrival
    else:
        wait = np.asarray(wait_s, np.float64)
    if iteration_time_s is None:
        it_time = (arrival.max(axis=1) if num_ranks else np.zeros(num_iterations)) + collective_time_s
    else:
        it_time = np.asarray(iteration_time_s, np.float64)
    active = (
        np.zeros((num_iterations, len(names)), np.bool_)
        if pacing_active is None
        else np.asarray(pacing_active, np.bool_).reshape(num_iterations, len(names))
    )
    return Episode(
        backend=backend,
        comm_model=comm_model,
        controller=controller,
        rank_labels=np.arange(num_ranks, dtype=np.int64)
        if rank_labels is None
        else np.asarray(rank_labels, np.int64),
        domain_of_rank=dom,
        domain_names=names,
        step_ids=np.arange(num_iterations, dtype=np.int64)
        if step_ids is None
        else np.asarray(step_ids, np.int64),
        iteration_time_s=it_time,
        arrival_s=arrival,
        applied_delay_s=delay,
        natural_arrival_s=arrival - delay,
        wait_s=wait,
        collective_time_s=np.full((num_iterations, len(names)), collective_time_s, np.float64),
        pacing_active=active,
        diagnostics={k: np.asarray(v, np.float64) for k, v in (diagnostics or {}).items()},
        guard_interventions=guard_interventions,
    )
