"""Synthetic observations for tests: one iteration, or a seeded sequence with stragglers."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pacectl.errors import ConfigError
from pacectl.types import Controller, Observation

FloatArray = NDArray[np.float64]


def make_observation(
    natural_arrival_s: ArrayLike,
    applied_delay_s: ArrayLike | None = None,
    *,
    iteration: int = 0,
    domain: int = 0,
    iteration_time_s: float = 1.0,
    collective_time_s: float = 0.01,
) -> Observation:
    """Build a consistent :class:`Observation` from natural arrivals and applied delays.

    ``arrival = natural + delay`` and ``wait = max(arrival) - arrival`` (everyone waits for the last
    rank, as in :mod:`pacectl.types`). Non-finite values are kept, so guard tests can use them.

    Args:
        natural_arrival_s: ``float64[num_ranks]`` unpaced arrivals, seconds.
        applied_delay_s: ``float64[num_ranks]`` pacing delays, seconds, >= 0; zeros if ``None``.
        iteration: iteration index.
        domain: pacing domain index.
        iteration_time_s: iteration wall time, seconds.
        collective_time_s: paced collective transfer time, seconds.

    Returns:
        A new observation; its arrays are fresh copies.

    Raises:
        ConfigError: the arrays are not 1-D, their shapes differ, or a delay is negative.

    Example:
        >>> obs = make_observation([0.50, 0.52, 0.61])
        >>> round(obs.spread_s, 2)
        0.11
    """
    natural = np.array(natural_arrival_s, dtype=np.float64)
    if natural.ndim != 1:
        raise ConfigError(f"natural_arrival_s must be 1-D (num_ranks,), got shape {natural.shape}")
    delay = np.zeros_like(natural) if applied_delay_s is None else np.array(applied_delay_s, dtype=np.float64)
    if delay.shape != natural.shape:
        raise ConfigError(
            f"applied_delay_s must have the shape of natural_arrival_s {natural.shape}, got {delay.shape}"
        )
    if (delay < 0.0).any():
        raise ConfigError(f"applied_delay_s must be >= 0, got {delay!r}")
    arrival = natural + delay
    return Observation(
        iteration=iteration,
        domain=domain,
        arrival_s=arrival,
        applied_delay_s=delay,
        natural_arrival_s=natural,
        wait_s=arrival.max() - arrival,
        iteration_time_s=float(iteration_time_s),
        collective_time_s=float(collective_time_s),
    )


def synthetic_collective_times(num_iterations: int, *, seed: int = 0) -> FloatArray:
    """Seeded collective times of a job that shares a link with another now and then, seconds.

    Model: 0.1 s alone on the fabric (plus Gaussian noise, std 0.5 ms); in iterations ``[10, 25)``
    and ``[40, 50)`` another job's collective overlaps it, and it takes up to twice as long (the
    overlap drawn uniformly from 20 % to 100 % of it). For job-level controllers (``phase``).

    Returns:
        ``float64[num_iterations]``, seconds, all > 0.
    """
    rng = np.random.default_rng(seed)
    times = 0.1 + rng.normal(0.0, 0.0005, num_iterations)
    k = np.arange(num_iterations)
    overlapped = ((k >= 10) & (k < 25)) | ((k >= 40) & (k < 50))
    times[overlapped] += 0.1 * rng.uniform(0.2, 1.0, int(overlapped.sum()))
    return times


def synthetic_natural_arrivals(num_ranks: int, num_iterations: int, *, seed: int = 0) -> FloatArray:
    """Seeded natural arrivals with noise, a persistent straggler, transient stragglers and a quiet phase.

    Model (seconds): compute time 0.5 plus Gaussian noise (std 2 ms) for every rank; the last rank is a
    persistent straggler (+50 ms, locality-driven variance); each rank is independently a transient
    straggler with probability 0.08 (+ exponential, mean 100 ms). Iterations in ``[20, 32)`` carry the
    noise only (spread well under 10 ms), so hysteresis controllers also switch off.

    Args:
        num_ranks: ranks, >= 1.
        num_iterations: iterations, >= 0.
        seed: seed of the local ``numpy.random.Generator``.

    Returns:
        ``float64[num_iterations, num_ranks]``, seconds.
    """
    rng = np.random.default_rng(seed)
    natural = 0.5 + rng.normal(0.0, 0.002, size=(num_iterations, num_ranks))
    stragglers = np.zeros((num_iterations, num_ranks))
    stragglers[:, -1] += 0.05
    stragglers += (rng.random((num_iterations, num_ranks)) < 0.08) * rng.exponential(0.1, stragglers.shape)
    stragglers[20:32] = 0.0
    return natural + stragglers


def run_closed_loop(
    controller: Controller,
    natural_arrival_s: FloatArray,
    *,
    read_only: bool = False,
    collective_time_s: FloatArray | None = None,
) -> list[FloatArray]:
    """Drive a (reset) controller over a sequence, feeding each action back as the next applied delay.

    The iteration time is the latest (paced) arrival plus 0.5 s of other work.

    Args:
        controller: a controller already reset to ``natural_arrival_s.shape[1]`` ranks.
        natural_arrival_s: ``float64[num_iterations, num_ranks]``, seconds.
        read_only: mark the observation arrays read-only, to catch in-place writes.
        collective_time_s: ``float64[num_iterations]`` the paced collective's time per iteration,
            seconds (default 0.01 throughout: a quiet fabric).

    Returns:
        A copy of each action's ``delay_s``.
    """
    delays: list[FloatArray] = []
    applied = np.zeros(natural_arrival_s.shape[1])
    for k, natural in enumerate(natural_arrival_s):
        iteration_time_s = float((natural + applied).max()) + 0.5
        coll = 0.01 if collective_time_s is None else float(collective_time_s[k])
        obs = make_observation(
            natural, applied, iteration=k, iteration_time_s=iteration_time_s, collective_time_s=coll
        )
        if read_only:
            for arr in (obs.arrival_s, obs.applied_delay_s, obs.natural_arrival_s, obs.wait_s):
                arr.flags.writeable = False
        delay = np.array(controller.act(obs).delay_s, dtype=np.float64)
        delays.append(delay)
        applied = delay.copy()
    return delays
