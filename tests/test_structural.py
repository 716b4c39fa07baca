"""The structural fact (pacectl/fabric/__init__.py): per-rank delays within earliness never change a
contention-model duration, because the collective's start is unchanged; the same delay on every rank
of a job can change them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.backends.sim import SimBackend
from pacectl.fabric.contention import ContentionComm, CrossTraffic
from pacectl.fabric.noise import ComputeModel, LognormalJitter, SlowRanks
from pacectl.fabric.topology import FatTree
from pacectl.types import Action

# a ring that crosses bursty cross traffic: its duration depends on when it starts
_BURSTY = ContentionComm(
    FatTree(ranks_per_node=4, nodes_per_leaf=2, oversubscription=2.0),
    32,
    message_bytes=4e8,
    cross_traffic=CrossTraffic(links=("leaf_up:*",), on_s=0.05, off_s=0.11),
)


def _within_earliness(natural: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Delays of at most each rank's earliness (``fractions`` in [0, 1] of it)."""
    return fractions * (natural.max() - natural)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_delays_within_earliness_leave_contention_durations_unchanged(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 16))
    natural = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    fractions = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    t0 = data.draw(st.floats(0.0, 100.0))
    delay = _within_earliness(natural, fractions)
    start_unpaced = t0 + natural.max()
    start_paced = t0 + (natural + delay).max()
    assert start_paced == pytest.approx(start_unpaced, rel=1e-15, abs=1e-15)  # the last arrival
    for duration in (_BURSTY.time_s, lambda t: _BURSTY.scaled_time_s(t, 0.03)):
        assert duration(start_paced) == pytest.approx(duration(start_unpaced), rel=1e-12)


def _sim() -> SimBackend:
    compute = ComputeModel(0.2, (LognormalJitter(0.05), SlowRanks(fraction=0.125, factor=1.2)))
    return SimBackend(num_ranks=32, num_iterations=30, compute=compute, comm=_BURSTY)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), fractions_seed=st.integers(0, 2**16))
def test_sim_per_rank_delays_within_earliness_change_no_duration(seed: int, fractions_seed: int) -> None:
    """In the simulator (no interference: the waiting rank's own mechanism is excluded), delays
    within every rank's earliness give the same collective starts, durations and iteration times."""
    sim = _sim()
    sim.reset(seed=seed)
    base = [sim.step([Action.zeros(32)])[0] for _ in range(sim.num_iterations)]
    rng = np.random.default_rng(fractions_seed)
    sim.reset(seed=seed)
    for b in base:
        delay = _within_earliness(b.natural_arrival_s, rng.uniform(0.0, 1.0, 32))
        paced = sim.step([Action(delay)])[0]
        assert paced.collective_time_s == pytest.approx(b.collective_time_s, rel=1e-9)
        assert paced.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)
        np.testing.assert_array_equal(paced.natural_arrival_s, b.natural_arrival_s)


def test_a_job_level_delay_changes_a_duration() -> None:
    """The same delay on every rank moves the collective's start, and the duration with it: a ring
    that starts inside a burst is slower than one shifted past it."""
    in_burst, after = _BURSTY.time_s(0.01), _BURSTY.time_s(0.01 + 0.08)
    assert in_burst > after * 1.2
    sim = _sim()
    sim.reset(seed=0)
    base = [sim.step([Action.zeros(32)])[0] for _ in range(5)]
    sim.reset(seed=0)
    shifted = [sim.step([Action(np.full(32, 0.08))])[0] for _ in range(5)]
    assert any(
        abs(s.collective_time_s - b.collective_time_s) > 1e-3 * b.collective_time_s
        for s, b in zip(shifted, base, strict=True)
    )
