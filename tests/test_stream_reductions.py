"""The streamed runs' per-block reductions and the simulator's interference term give the values of
the formulas they replaced, bit for bit: ``energy.energy_totals`` against reductions of the old
per-state arrays, ``metrics.episode_totals``' counts, ``EarlyArrivalInterference.finish_s``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from pacectl import energy, metrics
from pacectl.config import CONF_DIR, controller_factory, controller_families
from pacectl.experiment import make_experiment
from pacectl.fabric.contention import EarlyArrivalInterference
from pacectl.fabric.power import STATES, PowerProfile
from pacectl.loop import run_episode
from pacectl.types import Episode


def _or(value: Any, default: np.ndarray) -> np.ndarray:
    return default if value is None else np.asarray(value, dtype=np.float64)


def _reference_energy_totals(ep: Episode, profile: PowerProfile) -> dict[str, Any]:
    """``energy.energy_totals`` as it was computed before (main 9dc37d1): every state's arrays."""
    if ep.domain_iteration_time_s is not None:
        iteration = np.asarray(ep.domain_iteration_time_s, dtype=np.float64)[:, ep.domain_of_rank]
    else:
        iteration = np.asarray(ep.iteration_time_s, dtype=np.float64)[:, None]
    compute = np.maximum(_or(ep.compute_s, ep.natural_arrival_s), 0.0)
    sleep = np.maximum(_or(ep.sleep_s, ep.applied_delay_s), 0.0)
    wait = np.maximum(np.asarray(ep.wait_s, dtype=np.float64), 0.0)
    flag = ep.wait_asleep
    sleeping = (
        np.zeros(ep.arrival_s.shape, dtype=bool)
        if flag is None
        else np.asarray(flag, dtype=bool)[:, ep.domain_of_rank]
    )
    transfer = np.maximum(np.asarray(ep.collective_time_s, dtype=np.float64)[:, ep.domain_of_rank], 0.0)
    other = np.maximum(iteration - compute - sleep - wait - transfer, 0.0)
    times = {
        "compute": compute,
        "transfer": transfer,
        "spin_wait": np.where(sleeping, 0.0, wait),
        "sleep_wait": np.where(sleeping, wait, 0.0),
        "pacing_sleep": sleep,
        "other": other,
    }
    power = profile.state_power_w()
    e = {s: times[s] * power[s] for s in STATES if s != "compute"}
    if ep.compute_energy_j is not None:
        e["compute"] = np.asarray(ep.compute_energy_j, dtype=np.float64)
    else:
        slow = np.minimum(_or(ep.slow_compute_s, np.zeros_like(compute)), compute)
        clock = _or(ep.clock_frac, np.ones_like(compute))
        e["compute"] = profile.compute_power_w(clock) * slow + power["compute"] * (compute - slow)
    total = np.sum([e[s] for s in STATES], axis=0)
    return {
        "per_iteration_j": total.sum(axis=1).tobytes(),
        "per_rank_j": total.sum(axis=0).tobytes(),
        "energy_j": {s: float(e[s].sum()) for s in STATES},
        "time_s": {s: float(times[s].sum()) for s in STATES},
    }


CASES = {
    "paper_like": ("backend=sim", "cluster=paper_like", "comm=contention", "backend.num_ranks=40"),
    "clock": ("backend=sim", "cluster=contended", "comm=contention", "backend.actuator=clock"),
    "power_cap": ("backend=sim", "cluster=paper_like", "comm=contention", "cluster.power_cap.node_w=3600"),
    "two_jobs": ("backend=sim", "cluster=shared_uplink3", "comm=contention"),
}


def _episodes(case: str) -> dict[str, Episode]:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *CASES[case],
                "backend.num_iterations=30",
                "controller.families=[threshold,pid,sleep_wait]",
            ],
        )
    experiment = make_experiment(cfg)
    return {
        family: run_episode(experiment.backend, controller_factory(family, params, cfg.guard), seed=1)
        for family, params in controller_families(cfg).items()
    } | {"power": experiment.power}  # type: ignore[dict-item]


@pytest.mark.parametrize("case", sorted(CASES))
def test_energy_totals_are_the_old_reductions_bit_for_bit(case: str) -> None:
    episodes = _episodes(case)
    profile = episodes.pop("power")
    assert "sleep_wait" in episodes
    rng = np.random.default_rng(0)
    for family, ep in episodes.items():
        variants = [ep]
        if ep.wait_asleep is not None:  # some domains and iterations asleep, others spinning
            variants.append(replace(ep, wait_asleep=rng.random(ep.wait_asleep.shape) < 0.5))
        for v in variants:
            got = energy.energy_totals(v, profile)
            want = _reference_energy_totals(v, profile)
            assert got.per_iteration_j.tobytes() == want["per_iteration_j"], family
            assert got.per_rank_j.tobytes() == want["per_rank_j"], family
            assert got.energy_j == want["energy_j"], family
            assert got.time_s == want["time_s"], family
            acc = energy.account(v, profile)  # the per-state arrays are the old ones too
            assert {s: float(acc.time_s[s].sum()) for s in STATES} == want["time_s"]
            assert {s: float(acc.energy_j[s].sum()) for s in STATES} == want["energy_j"]


@pytest.mark.parametrize("case", ["paper_like", "two_jobs"])
def test_last_arrival_counts_are_the_old_ones(case: str) -> None:
    episodes = _episodes(case)
    episodes.pop("power")
    for ep in episodes.values():
        got = metrics.episode_totals(ep)
        for arrivals, counts in (
            (ep.arrival_s, got.last_iters),
            (ep.natural_arrival_s, got.natural_last_iters),
        ):
            latest = np.stack(
                [arrivals[:, ep.domain_of_rank == d].max(axis=1) for d in range(ep.num_domains)], 1
            )
            want = np.sum(arrivals == latest[:, ep.domain_of_rank], axis=0, dtype=np.int64)
            assert counts.dtype == np.int64 and np.array_equal(counts, want)


def _reference_finish_s(
    kappa: float, g: int, work: np.ndarray, delay: np.ndarray, spin: np.ndarray
) -> np.ndarray:
    n = work.shape[0]
    pad = (-n) % g
    w = np.concatenate([work, np.full(pad, -np.inf)]).reshape(-1, g)
    e = np.concatenate([np.where(spin, work + delay, np.inf), np.full(pad, np.inf)]).reshape(-1, g)
    overlap = np.maximum(0.0, w[:, :, None] - e[:, None, :])
    idx = np.arange(g)
    overlap[:, idx, idx] = 0.0
    out: np.ndarray = work + kappa * overlap.sum(axis=2).reshape(-1)[:n]
    return out


@pytest.mark.parametrize("g", [2, 3, 8, 9, 16])
@pytest.mark.parametrize("num_ranks", [1, 37, 256])
def test_interference_finish_times_are_the_old_ones(g: int, num_ranks: int) -> None:
    rng = np.random.default_rng(g * 1000 + num_ranks)
    model = EarlyArrivalInterference(kappa=0.05, ranks_per_node=g)
    for trial in range(4):
        work = 0.5 + 0.1 * rng.random(num_ranks)
        work[rng.random(num_ranks) < 0.2] = 0.5  # ties
        delay = np.where(rng.random(num_ranks) < 0.5, 0.0, 0.02 * rng.random(num_ranks))
        if trial == 3:  # negative delays (a backend refuses them): still no rank is its own peer
            delay = delay - 0.01
        for spin in (True, rng.random(num_ranks) < 0.7):
            spinning = np.broadcast_to(np.asarray(spin), (num_ranks,))
            got = model.finish_s(work, delay, spinning=spin)
            assert got.tobytes() == _reference_finish_s(0.05, g, work, delay, spinning).tobytes()
