"""Fabric models: closed forms, max-min fairness, contention timing, interference."""

from __future__ import annotations

import math
from pathlib import Path

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
from pacectl.fabric.contention import AlphaBetaComm, ContentionComm, CrossTraffic, EarlyArrivalInterference
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
    # the 8 ranks' inter-node rings share the node's 50 GB/s: all 8e9 bytes cross it, 2 (N-1)/N times
    assert h == pytest.approx(2 * 7 / 8 * 8e9 / 4e11 + 2 * 3 / 4 * 8e9 / 5e10)
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


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_sparse_max_min_is_bit_identical_to_dense(data: st.DataObject) -> None:
    """The scipy.sparse path gives exactly the dense rates, for 0/1 and for integer weights."""
    import scipy.sparse

    num_links = data.draw(st.integers(1, 7))
    num_flows = data.draw(st.integers(1, 9))
    caps = np.array(data.draw(st.lists(st.floats(0.5, 100.0), min_size=num_links, max_size=num_links)))
    weights = np.array(
        data.draw(
            st.lists(st.integers(0, 3), min_size=num_links * num_flows, max_size=num_links * num_flows)
        ),
        dtype=np.float64,
    ).reshape(num_flows, num_links)
    demand = np.array(
        data.draw(st.lists(st.sampled_from([np.inf, 1.0, 7.5]), min_size=num_flows, max_size=num_flows))
    )
    for inc in (weights > 0, weights):
        dense = max_min_fair(caps, inc, demand)
        sparse = max_min_fair(caps, scipy.sparse.csr_array(inc), demand)
        assert np.array_equal(dense, sparse)


def _ring_flows_by_name(topo: FatTree, nodes: list[int], num_ranks: int) -> np.ndarray:
    """The ring's incidence built link by link from the link names (the former construction)."""
    names, _ = topo.links(num_ranks)
    index = {name: i for i, name in enumerate(names)}
    rows = []
    for r in range(topo.rails()):
        suffix = f":rail{r}" if topo.rails() > 1 else ""
        for pos, i in enumerate(nodes):
            j = nodes[(pos + 1) % len(nodes)]
            row = np.zeros(len(names), dtype=bool)
            row[index[f"nic_up:{i}{suffix}"]] = True
            row[index[f"nic_down:{j}{suffix}"]] = True
            if i // topo.nodes_per_leaf != j // topo.nodes_per_leaf:
                row[index[f"leaf_up:{i // topo.nodes_per_leaf}{suffix}"]] = True
                row[index[f"leaf_down:{j // topo.nodes_per_leaf}{suffix}"]] = True
            rows.append(row)
    return np.array(rows)


@pytest.mark.parametrize(
    "topo",
    [
        FatTree(),
        FatTree(ranks_per_node=4, nodes_per_leaf=3, oversubscription=2.0),
        FatTree(rail_optimized=True),
    ],
)
@pytest.mark.parametrize("num_ranks", [8, 40, 256])
def test_ring_incidence_dense_and_sparse_match_the_link_names(topo: FatTree, num_ranks: int) -> None:
    nodes = list(range(topo.num_nodes(num_ranks)))
    for order in (nodes, nodes[::-1][: max(0, len(nodes) - 1)]):
        dense = topo.ring_flows_on(order, num_ranks)
        sparse = topo.ring_flows_on(order, num_ranks, sparse=True)
        assert dense.shape == sparse.shape and np.array_equal(dense, sparse.toarray())
        if len(order) > 1:
            assert np.array_equal(dense, _ring_flows_by_name(topo, order, num_ranks))
        else:
            assert dense.shape[0] == 0


@pytest.mark.parametrize("rail_optimized", [False, True])
def test_contention_rates_from_sparse_incidence_equal_the_dense_solve(rail_optimized: bool) -> None:
    """Every cross-traffic state's ring rate is bit-identical to the dense flows x links solve."""
    topo = FatTree(ranks_per_node=8, nodes_per_leaf=2, oversubscription=2.0, rail_optimized=rail_optimized)
    cross = CrossTraffic(links=("leaf_up:*",), rate_frac=0.7, on_s=0.3, off_s=0.5)
    model = ContentionComm(topo, 128, message_bytes=1e9, cross_traffic=cross)
    names, caps = topo.links(128)
    ring = topo.ring_flows(128)
    cross_links = [i for i, n in enumerate(names) if n.startswith("leaf_up:")]
    states = model._states_in_period()
    assert len(states) > 2
    for state in states:
        active = [link for link, on in zip(cross_links, state, strict=True) if on]
        extra = np.zeros((len(active), len(caps)), dtype=bool)
        extra[np.arange(len(active)), active] = True
        demand = np.concatenate([np.full(len(ring), np.inf), 0.7 * caps[active]])
        dense = max_min_fair(caps, np.vstack([ring, extra]), demand)
        assert model.ring_rate_Bps(state) == float(dense[: len(ring)].min())


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


# --- cluster profiles: typed configs (pacectl.fabric.profile.ClusterConfig) ------------------------

PROFILES = tuple(
    sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "cluster").glob("*.yaml"))
)
GOLDEN_PROFILES = Path(__file__).resolve().parent / "golden" / "cluster_profiles.json"
#: keys the typed profile adds where a shipped profile left them out: each the model's own default
ADDED_DEFAULTS = {
    ("cross_traffic", "stagger"): 0.37,
    ("jobs",): None,
    ("per_job",): {},
    ("tune_sim",): {
        "num_ranks": 32,
        "num_iterations": 150,
        "comm": "contention",
        "seeds": [0, 1, 2],
        "heldout_seeds": [100, 101, 102],
    },
}
#: keys a typed ``cluster.jobs`` entry (pacectl.fabric.profile.JobEntry) adds where a shipped one left them out
ADDED_JOB_DEFAULTS = {"message_bytes": None, "start_s": 0.0, "controller": None, "controller_params": {}}


def _profile(name: str = "dgx_superpod", overrides: tuple[str, ...] = ()) -> dict[str, object]:
    """A shipped profile as the run sees it (composed by Hydra, interpolations resolved)."""
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, as_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"cluster={name}", *overrides])
    return as_dict(cfg.cluster)


@pytest.mark.parametrize("name", PROFILES)
def test_shipped_profiles_resolve_to_the_values_recorded_before_they_were_typed(name: str) -> None:
    """tests/golden/cluster_profiles.json was written from the private schema's code: every shipped
    profile composes to the same values (plus the model defaults it left out) and builds the same models."""
    import json
    import sys

    sys.path.insert(0, str(GOLDEN_PROFILES.parent))
    from cluster_profiles_regen import profile_values

    golden = json.loads(GOLDEN_PROFILES.read_text())[name]
    now = profile_values(name)
    assert now["models"] == golden["models"]
    assert now["tune_sim"] == golden["tune_sim"]
    composed = now["composed"]
    for path, default in ADDED_DEFAULTS.items():
        *parents, leaf = path
        node = composed
        for key in parents:
            node = node[key]
        expected = golden["composed"]
        for key in parents:
            expected = expected[key]
        if leaf not in expected:
            assert node.pop(leaf) == default, path
    for job, was in zip(composed.get("jobs") or [], golden["composed"].get("jobs") or [], strict=True):
        for key, default in ADDED_JOB_DEFAULTS.items():
            if key not in was:
                assert job.pop(key) == default, ("jobs", key)
    assert composed == golden["composed"]


def test_profile_configs_match_the_model_classes() -> None:
    """The fat-tree, cross traffic, buckets and noise components are their own typed configs; the
    other sections mirror the parameters of the class they configure."""
    import dataclasses

    from pacectl.fabric import profile as P
    from pacectl.fabric.noise import NOISE_COMPONENTS, EmpiricalSamples

    def init_fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.init}

    assert init_fields(P.Interference) == init_fields(EarlyArrivalInterference) - {"ranks_per_node"}
    assert init_fields(P.Empirical) == init_fields(EmpiricalSamples)
    assert set(P.NOISE_CONFIGS) == set(NOISE_COMPONENTS)
    for kind, cls in NOISE_COMPONENTS.items():
        assert P.NOISE_CONFIGS[kind] is cls or kind == "empirical", kind


BAD_VALUES = [
    (
        "cluster.interference.kappa_source=guessed",
        "cluster.interference.kappa_source must be a string starting with 'assumed' or 'measured: <record>', "
        "got 'guessed'",
    ),
    ("cluster.topology.ranks_per_node=0", "cluster.topology.ranks_per_node must be an integer >= 1, got 0"),
    (
        "cluster.topology.nic_bandwidth_Bps=inf",
        "cluster.topology.nic_bandwidth_Bps must be a finite number > 0, got inf",
    ),
    ("cluster.topology.nvlink_bandwidth_Bps=0", "cluster.topology.nvlink_bandwidth_Bps must be > 0"),
    ("cluster.topology.oversubscription=0.5", "cluster.topology.oversubscription must be >= 1"),
    (
        "cluster.topology.oversubscription=nan",
        "cluster.topology.oversubscription must be a finite number >= 1, got nan",
    ),
    (
        "cluster.topology.rail_optimized=maybe",
        "cluster.topology.rail_optimized must be true or false, got 'maybe'",
    ),
    (
        "cluster.collective.algorithm=foo",
        "cluster.collective.algorithm must be one of ring, tree, hierarchical, got 'foo'",
    ),
    ("cluster.collective.algorithm=rign", "got 'rign' (did you mean 'ring'?)"),
    (
        "cluster.collective.message_bytes=nan",
        "cluster.collective.message_bytes must be a finite number >= 0, got nan",
    ),
    ("cluster.collective.message_bytes=-1", "cluster.collective.message_bytes must be >= 0, got -1"),
    ("cluster.cross_traffic.rate_frac=0", "cluster.cross_traffic.rate_frac must be in (0, 1], got 0"),
    ("cluster.cross_traffic.on_s=-inf", "cluster.cross_traffic.on_s must be a finite number >= 0, got -inf"),
    ("cluster.cross_traffic.stagger=1.5", "cluster.cross_traffic.stagger must be in [0, 1]"),
    ("cluster.interference.kappa=inf", "cluster.interference.kappa must be a finite number >= 0, got inf"),
    ("cluster.compute.compute_s=0", "cluster.compute.compute_s must be > 0, got 0"),
    (
        "cluster.compute.noise.0.sigma=abc",
        "cluster.compute.noise.0.sigma must be a finite number >= 0, got 'abc'",
    ),
    ("cluster.compute.noise.0.kind=lognormall", "cluster.compute.noise.0.kind must be one of"),
    ("cluster.tune_sim.seeds=[]", "cluster.tune_sim.seeds must be a non-empty list of integer seeds"),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES)
def test_cluster_config_rejects_bad_values_naming_the_key(override: str, message: str) -> None:
    from pacectl.fabric.profile import cluster_config

    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError) as err:
        cluster_config(_profile("dgx_superpod", (override,)))
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    assert any(f"{how} {key}=" in text for how in ("(override:", "e.g.", "for example"))  # how to set it


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "cluster.topology.ranks_per_node=abc",
            "cluster.topology.ranks_per_node must be an integer >= 1, got 'abc'",
        ),
        (
            "cluster.topology.ranks_per_node=2.5",
            "cluster.topology.ranks_per_node must be an integer >= 1, got 2.5",
        ),
        (
            "cluster.topology.nodes_per_leaf=true",
            "cluster.topology.nodes_per_leaf must be an integer >= 1, got True",
        ),
        (
            "cluster.collective.alpha_inter_s=abc",
            "cluster.collective.alpha_inter_s must be a finite number >= 0",
        ),
        ("cluster.cross_traffic.links=leaf_up:0", "cluster.cross_traffic.links must be a list of link names"),
        ("cluster.compute.noise=3", "cluster.compute.noise must be a list, got 3"),
        ("cluster.topology=3", "cluster.topology must be a mapping, got 3"),
    ],
)
def test_wrong_types_are_refused_when_hydra_composes_the_profile(override: str, message: str) -> None:
    from hydra.errors import HydraException

    from pacectl.cli import composition_error
    from pacectl.config import CONF_DIR

    with pytest.raises(HydraException) as err:
        _profile("dgx_superpod", (override,))
    line = composition_error(CONF_DIR, "config", [override], err.value)
    assert line.startswith(message), line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+cluster.foo=1", "cluster.foo: no such key (known: name, description, power, topology,"),
        ("+cluster.topology.foo=1", "cluster.topology.foo: no such key (known: ranks_per_node,"),
        ("+cluster.topology.rank_per_node=4", "did you mean cluster.topology.ranks_per_node?"),
        ("+cluster.collective.mesage_bytes=1", "did you mean cluster.collective.message_bytes?"),
        (
            "+cluster.compute.noise.0.sigm=0.1",
            "cluster.compute.noise.0.sigm: no such key (known: sigma)",
        ),
        ("+cluster.tune_sim.num_rank=8", "did you mean cluster.tune_sim.num_ranks?"),
    ],
)
def test_cluster_config_rejects_unknown_keys_at_every_level(override: str, message: str) -> None:
    from pacectl.fabric.profile import cluster_config

    with pytest.raises(ConfigError) as err:
        cluster_config(_profile("contended", (override,)))
    assert message in str(err.value)


def test_cluster_config_keeps_the_model_defaults_for_keys_left_out() -> None:
    from pacectl.fabric.profile import cluster_config, sim_fabric

    cluster = {"name": "bare", "compute": {"compute_s": 0.1}}
    profile = cluster_config(cluster)
    assert profile.topology == FatTree() and profile.compute.noise == []
    model, interference = sim_fabric(cluster, "contention", 16)
    assert model.free_time_s > 0 and interference.kappa == 0.0
    with pytest.raises(ConfigError, match=r"^cluster\.jobs\.0\.compute\.compute_s must be set"):
        from pacectl.checks import typed
        from pacectl.fabric.profile import Compute

        typed(Compute, {"noise": []}, "cluster.jobs.0.compute")


def test_nan_message_bytes_names_the_key_not_the_null_model() -> None:
    from pacectl.fabric.profile import ReplayContention, sim_fabric

    cluster = _profile("dgx_superpod", ("cluster.collective.message_bytes=nan",))
    for build in (lambda: sim_fabric(cluster, "contention", 64), lambda: ReplayContention(cluster, 64)):
        with pytest.raises(ConfigError, match=r"^cluster\.collective\.message_bytes must be") as err:
            build()
        assert "null" not in str(err.value)


def test_overflowing_collective_is_rejected_with_the_keys() -> None:
    from pacectl.fabric.contention import FixedComm
    from pacectl.fabric.profile import sim_fabric

    cluster = _profile(
        "dgx_superpod",
        ("cluster.collective.message_bytes=1e300", "cluster.topology.nic_bandwidth_Bps=1e-300"),
    )
    with pytest.raises(ConfigError, match="cluster.collective.message_bytes is too large"):
        sim_fabric(cluster, "null", 64)
    with pytest.raises(
        ConfigError, match=r"^null comm duration must be a finite number >= 0 seconds, got inf"
    ):
        FixedComm(math.inf)
    with pytest.raises(ConfigError, match=r"^alpha_beta comm duration"):
        AlphaBetaComm(FatTree(nic_bandwidth_Bps=1e-300), 64, message_bytes=1e300)


def test_every_fixed_duration_model_is_named_as_such_in_reports() -> None:
    """Reports call a model max-plus from the name an episode carries: the list must be complete."""
    import inspect

    import pacectl.fabric.base as base
    import pacectl.fabric.contention as contention
    import pacectl.fabric.profile as profile
    from pacectl.report import comm_model_note

    models = [
        obj
        for module in (base, contention, profile)
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if isinstance(getattr(obj, "name", None), str)
        and isinstance(getattr(obj, "timing_dependent", None), bool)
    ]
    assert {m.name for m in models} >= {"null", "alpha_beta", "contention"}
    for model in models:
        assert (model.name in base.FIXED_DURATION_MODELS) == (not model.timing_dependent), model
        note = comm_model_note(model.name)
        assert ("pacing cannot shorten" in note) == (not model.timing_dependent), note
    assert "timing-dependent" in comm_model_note("live-gloo")


def test_contention_without_a_timing_dependent_mechanism_is_called_out() -> None:
    """comm=contention where nothing varies the ring's rate has fixed durations: the model says why,
    calls itself fixed-duration, and the run must not present it as a setting where pacing could gain."""
    from pacectl.fabric.profile import inert_contention_note
    from pacectl.report import comm_model_note

    topo = FatTree(ranks_per_node=8, nodes_per_leaf=2, oversubscription=2.0)
    bursts = CrossTraffic(links=("leaf_up:*",), on_s=1.0, off_s=1.0, stagger=0.0)  # in lockstep
    live = ContentionComm(topo, 64, message_bytes=1e9, cross_traffic=bursts)
    assert live.timing_dependent and live.inert_reason is None
    assert live.time_s(0.0) != live.time_s(1.5)  # the flag is what the model does
    inert = {
        "no cross-traffic links": CrossTraffic(),
        "always on": CrossTraffic(links=("leaf_up:*",), on_s=1.0, off_s=0.0),
        "never on": CrossTraffic(links=("leaf_up:*",), on_s=0.0, off_s=1.0),
        # 4 leaf uplinks, half on, staggered by 0.37 periods: one of them is busy at every instant
        "one rate through the whole on/off period": CrossTraffic(links=("leaf_up:*",), on_s=1.0, off_s=1.0),
    }
    for reason, cross in inert.items():
        model = ContentionComm(topo, 64, message_bytes=1e9, cross_traffic=cross)
        assert not model.timing_dependent and reason in (model.inert_reason or ""), model.inert_reason
        # fixed, as the flag says (to the rounding of end minus start time)
        assert model.time_s(0.7) == pytest.approx(model.time_s(0.0), rel=1e-12)
        assert model.time_s(1.5) == pytest.approx(model.time_s(0.0), rel=1e-12)
        assert "ring duration fixed here" in model.description
    one_node = ContentionComm(topo, 8, message_bytes=1e9, cross_traffic=bursts)
    assert not one_node.timing_dependent and "one node" in (one_node.inert_reason or "")
    # bursts on links the ring does not cross: 2 nodes under one leaf never use its uplink
    off_path = ContentionComm(topo, 16, message_bytes=1e9, cross_traffic=bursts)
    assert not off_path.timing_dependent and "do not slow the ring" in (off_path.inert_reason or "")
    assert off_path.time_s(1.5) == pytest.approx(off_path.time_s(0.5), rel=1e-12)

    note = inert_contention_note("dgx_superpod", "no cross-traffic links", interference_kappa=0.0)
    assert note is not None and "no controller can gain" in note and "no early-arrival interference" in note
    assert "cluster=paper_like or cluster=contended" in note
    # never recommends the profile in use; a job inside one node needs more ranks, not another profile
    mine = inert_contention_note("paper_like", "cross traffic always on (off_s 0)", interference_kappa=0.0)
    assert mine is not None and "cluster=paper_like" not in mine.replace("cluster=paper_like gives", "")
    small = inert_contention_note("paper_like", "2 rank(s) fit in one node: ...", interference_kappa=None)
    assert small is not None and "more ranks than one node holds" in small and "pick" not in small
    # interference needs co-located ranks
    assert EarlyArrivalInterference(0.05, ranks_per_node=8).active(16)
    assert not EarlyArrivalInterference(0.05, ranks_per_node=1).active(16)
    assert not EarlyArrivalInterference(0.05, ranks_per_node=8).active(1)
    assert not EarlyArrivalInterference(0.0, ranks_per_node=8).active(16)
    assert inert_contention_note("contended", "no cross-traffic links", interference_kappa=0.05) is None
    replay = inert_contention_note("contended", "no cross-traffic links", interference_kappa=None)
    assert replay is not None and "kappa" not in replay  # the replay has no interference
    assert inert_contention_note("paper_like", None, interference_kappa=0.0) is None
    assert "pacing cannot shorten" in comm_model_note("contention", timing_dependent=False)


def _integrated_s(model: ContentionComm, start_s: float) -> float:
    """The ring's duration integrated switch by switch, with no shortcut and no step limit."""
    remaining, t = model._ring_bytes, start_s
    while remaining > 0:
        state, switch = model._state(t)
        rate = model.ring_rate_Bps(state)
        if t + remaining / rate <= switch:
            return model._fixed_s + t + remaining / rate - start_s
        remaining -= (switch - t) * rate
        t = switch
    return model._fixed_s + t - start_s


@pytest.mark.parametrize("on_s", [0.4, 0.01, 1e-4, 1e-5])
def test_contention_is_never_faster_than_a_quiet_fabric(on_s: float) -> None:
    """Bursts much shorter than the transfer: once cut short after a fixed number of switches (a
    congested all-reduce then looked up to 5x *faster* than a quiet one); whole periods are now
    skipped exactly."""
    topo = FatTree(ranks_per_node=8, nodes_per_leaf=4, oversubscription=4.0)
    cross = CrossTraffic(links=("leaf_up:*",), on_s=on_s, off_s=3 * on_s)
    model = ContentionComm(topo, 64, message_bytes=2e9, cross_traffic=cross)
    assert model.timing_dependent
    for start in (0.0, 0.123, 7.77):
        t = model.time_s(start)
        assert t >= model.free_time_s
        assert t == pytest.approx(_integrated_s(model, start), rel=1e-9)
    if on_s <= 1e-4:  # thousands of periods per transfer: the time-averaged rate
        period = cross.period_s
        grid = np.linspace(0.0, period, 4001)[:-1] + period / 8000  # an independent reference
        mean_rate = np.mean([model.ring_rate_Bps(model._state(float(t))[0]) for t in grid])
        expected = model._fixed_s + model._ring_bytes / mean_rate
        assert model.time_s(0.3) == pytest.approx(expected, rel=2e-3)
    # late starts (a long simulation): the same durations, as the pattern repeats every period;
    # once, switch times below the float resolution of a large t stalled the integration
    for late in (512.47, 1e3 + 0.123, 3.3e7):
        assert model.time_s(late) == pytest.approx(model.time_s(late % cross.period_s), rel=1e-6)


def test_a_recorded_transfer_runs_through_the_bursts_its_own_length_reaches() -> None:
    """Replay scales a recorded transfer of any length: the same integration over the cross traffic
    as the model's own message (equal for that message's free time), the free time without bursts,
    and a long transfer's slowdown is not a short one's that starts at the same time."""
    topo = FatTree(ranks_per_node=8, nodes_per_leaf=4, oversubscription=4.0)
    cross = CrossTraffic(links=("leaf_up:*",), on_s=0.4, off_s=1.2)
    model = ContentionComm(topo, 64, message_bytes=2e9, cross_traffic=cross)
    own = model.free_time_s - model._fixed_s
    for start in (0.0, 0.3, 1.5, 7.77):
        assert model.scaled_time_s(start, own) + model._fixed_s == pytest.approx(
            model.time_s(start), rel=1e-12
        )
        for free in (0.01, 0.47, 5.0):
            scaled = model.scaled_time_s(start, free)
            assert scaled >= free * (1 - 1e-12)
            reference = ContentionComm(topo, 64, message_bytes=2e9 * free / own, cross_traffic=cross)
            assert scaled == pytest.approx(reference.time_s(start) - reference._fixed_s, rel=1e-9)
    short, long = (model.scaled_time_s(1.5, f) / f for f in (0.01, 0.47))
    assert abs(short - long) > 0.05  # the short one finishes before the burst that slows the long one
    quiet = ContentionComm(topo, 64, message_bytes=2e9)
    for free in np.random.default_rng(0).uniform(1e-4, 3.0, 200):  # bit for bit: replay unchanged
        assert quiet.scaled_time_s(0.3, float(free)) == float(free)


@pytest.mark.parametrize(
    "num_ranks, timing_dependent", [(32, False), (64, True), (128, True), (256, False), (1024, False)]
)
def test_paper_like_cross_traffic_is_timing_dependent_only_where_its_rate_varies(
    num_ranks: int, timing_dependent: bool
) -> None:
    """paper_like: staggered bursts on every leaf uplink. One leaf (<= 32 ranks): the ring crosses
    no uplink. From 256 ranks some uplink the ring crosses is always busy: a constant slowdown.
    The flag must agree with the durations the model produces over one period."""
    topo = FatTree(ranks_per_node=8, nodes_per_leaf=4, oversubscription=4.0)
    cross = CrossTraffic(links=("leaf_up:*",), on_s=0.4, off_s=1.2)
    model = ContentionComm(topo, num_ranks, message_bytes=2e9, cross_traffic=cross)
    durations = np.array([model.time_s(t) for t in np.linspace(0.0, 1.6, 321)])
    assert model.timing_dependent == timing_dependent, model.inert_reason
    assert (np.ptp(durations) > 1e-6 * durations.mean()) == timing_dependent


def test_hierarchical_alpha_beta_equals_the_quiet_contention_ring() -> None:
    """Both model NVLink phases plus a ring of nodes whose NICs carry every byte of the node."""
    for rail_optimized in (False, True):
        topo = FatTree(ranks_per_node=8, nodes_per_leaf=4, rail_optimized=rail_optimized)
        for n in (16, 64, 256):
            quiet = ContentionComm(topo, n, message_bytes=2e9).free_time_s
            closed = AlphaBetaComm(topo, n, message_bytes=2e9, algorithm="hierarchical").free_time_s
            assert closed == pytest.approx(quiet, rel=1e-12)
    # up to oversubscription = nodes per leaf an uplink still carries one NIC's flow at full rate;
    # past it the quiet contention ring is uplink-bound, which the closed form does not model
    for oversubscription, equal in ((4.0, True), (8.0, False)):
        topo = FatTree(ranks_per_node=8, nodes_per_leaf=4, oversubscription=oversubscription)
        quiet = ContentionComm(topo, 64, message_bytes=2e9).free_time_s
        closed = AlphaBetaComm(topo, 64, message_bytes=2e9).free_time_s  # hierarchical by default
        assert (closed == pytest.approx(quiet, rel=1e-12)) is equal
        assert quiet >= closed * (1 - 1e-12)
