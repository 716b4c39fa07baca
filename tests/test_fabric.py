"""Fabric models: closed forms, max-min fairness, contention timing, interference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.errors import ConfigError
from pacectl.fabric.collectives import (
    allreduce_s,
    hierarchical_allreduce_s,
    ring_allreduce_s,
    tree_allreduce_s,
)
from pacectl.fabric.contention import ContentionComm, CrossTraffic, EarlyArrivalInterference
from pacectl.fabric.topology import FatTree, max_min_fair


@pytest.mark.parametrize("p", [1, 2, 8, 64, 1024])
def test_ring_allreduce_closed_form(p: int) -> None:
    n, alpha, bw = 1e9, 5e-6, 50e9
    # reduce-scatter then all-gather: p-1 steps each, every step sends n/p bytes per rank
    steps = 2 * (p - 1)
    assert ring_allreduce_s(n, p, alpha, bw) == pytest.approx(steps * (alpha + n / p / bw))


def test_tree_and_hierarchical_forms() -> None:
    assert tree_allreduce_s(1e9, 8, 1e-5, 1e10) == pytest.approx(2 * 3 * 1e-5 + 2 * 1e9 / 1e10)
    assert tree_allreduce_s(1e9, 1, 1e-5, 1e10) == 0.0
    h = hierarchical_allreduce_s(
        8e9, 8, 4, alpha_intra_s=0.0, bandwidth_intra_Bps=4e11, alpha_inter_s=0.0, bandwidth_inter_Bps=5e10
    )
    assert h == pytest.approx(2 * 7 / 8 * 8e9 / 4e11 + 2 * 3 / 4 * 1e9 / 5e10)
    with pytest.raises(ConfigError, match="collective.algorithm must be one of"):
        allreduce_s(
            "butterfly",
            1.0,
            2,
            1,
            alpha_intra_s=0,
            bandwidth_intra_Bps=1,
            alpha_inter_s=0,
            bandwidth_inter_Bps=1,
        )


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_max_min_conserves_capacity(data: st.DataObject) -> None:
    num_links = data.draw(st.integers(1, 6))
    num_flows = data.draw(st.integers(1, 8))
    caps = np.array(data.draw(st.lists(st.floats(0.5, 100.0), min_size=num_links, max_size=num_links)))
    inc = np.array(
        data.draw(
            st.lists(
                st.lists(st.booleans(), min_size=num_links, max_size=num_links),
                min_size=num_flows,
                max_size=num_flows,
            )
        )
    )
    rates = max_min_fair(caps, inc)
    load = rates[inc.any(axis=1)] @ inc[inc.any(axis=1)].astype(float)
    assert (load <= caps * (1 + 1e-9)).all()  # feasible: no link over capacity
    for f in np.flatnonzero(inc.any(axis=1)):
        # max-min: every flow crosses a saturated link on which it has a maximal rate
        links = np.flatnonzero(inc[f])
        bottlenecks = [
            link
            for link in links
            if load[link] >= caps[link] * (1 - 1e-9) and rates[f] >= rates[inc[:, link]].max() * (1 - 1e-9)
        ]
        assert bottlenecks, (f, rates, load, caps)


def test_max_min_respects_demands() -> None:
    caps = np.array([10.0])
    inc = np.ones((3, 1), dtype=bool)
    rates = max_min_fair(caps, inc, np.array([1.0, np.inf, np.inf]))
    np.testing.assert_allclose(rates, [1.0, 4.5, 4.5])


def test_ring_is_contention_free_on_full_bisection_and_slows_under_cross_traffic() -> None:
    topo = FatTree(ranks_per_node=8, nodes_per_leaf=2, oversubscription=2.0)  # uplink = one NIC
    quiet = ContentionComm(topo, 64, message_bytes=1e9)
    # ring over 8 nodes, one 50 GB/s NIC each: 2 (N-1)/N * n over the NIC plus NVLink phase
    expected = 2 * 7 / 8 * 1e9 / 50e9 + 2 * 7 / 8 * 1e9 / 450e9 + 2 * 7 * 2e-6 + 2 * 7 * 5e-6
    assert quiet.free_time_s == pytest.approx(expected)
    busy = ContentionComm(
        topo,
        64,
        message_bytes=1e9,
        cross_traffic=CrossTraffic(links=("leaf_up:*",), on_s=1.0, off_s=1.0, stagger=0.0),
    )
    # uplink = 2 * 50 / 2 = 50 GB/s shared with a greedy cross flow: the ring gets 25 GB/s when on
    on, off = busy.time_s(0.0), busy.time_s(1.0)
    assert off == pytest.approx(busy.free_time_s)
    assert on - off == pytest.approx(2 * 7 / 8 * 1e9 / 25e9 - 2 * 7 / 8 * 1e9 / 50e9)
    # timing-dependent: a collective that straddles the switch takes an intermediate time
    assert off < busy.time_s(0.95) < on


def test_cross_traffic_link_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="must name links of this topology"):
        ContentionComm(FatTree(), 64, message_bytes=1.0, cross_traffic=CrossTraffic(links=("spine:9",)))


def test_interference_hits_only_co_located_late_ranks_and_pacing_removes_it() -> None:
    interference = EarlyArrivalInterference(kappa=0.1, ranks_per_node=4)
    work = np.array([1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    finish = interference.finish_s(work, np.zeros(8))
    # rank 3 computes 1 s longer than its three node peers, which wait (poll) all that second
    assert finish[3] == pytest.approx(2.0 + 0.1 * 3 * 1.0)
    np.testing.assert_allclose(finish[[0, 1, 2, 4, 5, 6, 7]], 1.0)
    paced = interference.finish_s(work, np.array([1.0, 1.0, 1.0, 0.0, 0, 0, 0, 0]))
    assert paced[3] == pytest.approx(2.0)  # peers sleep instead of polling
    assert (EarlyArrivalInterference(0.0, 4).finish_s(work, np.zeros(8)) == work).all()


def test_interference_is_permutation_symmetric_within_a_node() -> None:
    rng = np.random.default_rng(3)
    interference = EarlyArrivalInterference(kappa=0.05, ranks_per_node=8)
    work, delay = rng.uniform(0.5, 1.0, 16), rng.uniform(0, 0.1, 16)
    perm = np.concatenate([rng.permutation(8), 8 + rng.permutation(8)])
    np.testing.assert_allclose(
        interference.finish_s(work[perm], delay[perm]), interference.finish_s(work, delay)[perm]
    )


def test_topology_validation() -> None:
    with pytest.raises(ConfigError, match="oversubscription must be >= 1, got 0.5"):
        FatTree(oversubscription=0.5)
    assert FatTree(ranks_per_node=8).num_nodes(1024) == 128
    assert math.isinf(ContentionComm(FatTree(), 8, message_bytes=1e9).ring_rate_Bps(()))
