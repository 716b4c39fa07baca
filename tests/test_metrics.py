"""Tests of pacectl.metrics on hand-computed episodes and Hypothesis-generated ones."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pacectl import metrics
from pacectl.errors import PacectlError
from pacectl.testing.episodes import make_episode

# Dyadic values so that every expected figure is exact in float64.
ARRIVAL_S = [
    [0.0, 0.125, 0.25, 0.75],
    [0.5, 0.5, 0.0, 0.25],
    [0.25, 0.0, 0.5, 0.125],
]
DOMAIN_OF_RANK = [0, 0, 1, 1]


@pytest.fixture
def ep():
    return make_episode(
        ARRIVAL_S,
        domain_of_rank=DOMAIN_OF_RANK,
        iteration_time_s=[1.0, 2.0, 1.0],
        applied_delay_s=[[0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.25, 0.0]],
        pacing_active=[[False, False], [True, False], [True, True]],
        rank_labels=[10, 11, 12, 13],
        guard_interventions=2,
        controller="threshold",
    )


def test_iteration_time_statistics(ep):
    assert metrics.throughput_it_per_s(ep) == 0.75
    assert metrics.iteration_time_mean_s(ep) == pytest.approx(4.0 / 3.0)
    assert metrics.iteration_time_p50_s(ep) == 1.0
    assert metrics.iteration_time_p99_s(ep) == pytest.approx(1.98)  # linear interpolation
    assert metrics.cv(ep) == pytest.approx(math.sqrt(2.0) / 4.0)  # population std (ddof=0)


def test_spread_per_iteration_and_domain(ep):
    np.testing.assert_array_equal(metrics.spread_s(ep), [[0.125, 0.5], [0.0, 0.25], [0.25, 0.375]])
    assert metrics.spread_median_s(ep) == 0.25
    # natural arrivals: rank 0 at iteration 1 and rank 2 at iteration 2 were delayed.
    np.testing.assert_array_equal(metrics.natural_spread_s(ep), [[0.125, 0.5], [0.5, 0.25], [0.25, 0.125]])
    assert metrics.natural_spread_median_s(ep) == 0.25


def test_blame_counts_ties_for_every_tied_rank(ep):
    # iteration 1, domain 0: ranks 0 and 1 both arrive at 0.5, both count as last.
    np.testing.assert_array_equal(metrics.blame(ep), [2 / 3, 2 / 3, 1 / 3, 2 / 3])
    # without pacing: iteration 1 domain 0 -> rank 1; iteration 2 domain 1 -> rank 2 still (0.25 > 0.125).
    np.testing.assert_array_equal(metrics.natural_blame(ep), [1 / 3, 2 / 3, 1 / 3, 2 / 3])
    frac = metrics.blame(ep)
    dom = np.asarray(DOMAIN_OF_RANK)
    assert frac[dom == 0].sum() >= 1.0 and frac[dom == 1].sum() == pytest.approx(1.0)


def test_pacing_cost(ep):
    assert metrics.pacing_delay_total_s(ep) == 0.75
    # default waits: time until the domain's last arrival; they sum to 1.5 rank-seconds.
    assert metrics.wait_fraction(ep) == 1.5 / (4 * 4.0)
    assert metrics.pacing_active_frac(ep) == 0.5


def test_single_rank_domains_have_zero_spread_and_full_blame():
    one = make_episode([[0.25, 0.5], [0.125, 0.0]], domain_of_rank=[0, 1])
    np.testing.assert_array_equal(metrics.spread_s(one), np.zeros((2, 2)))
    np.testing.assert_array_equal(metrics.blame(one), [1.0, 1.0])


def test_summarize_has_every_key_and_is_json_serialisable(ep):
    summary = metrics.summarize(ep)
    expected = {
        "throughput_it_per_s", "iteration_time_mean_s", "iteration_time_p50_s", "iteration_time_p99_s",
        "cv", "spread_median_s", "spread_p99_s", "natural_spread_median_s", "pacing_delay_total_s",
        "wait_fraction", "pacing_active_frac", "guard_interventions", "num_iterations", "num_ranks",
        "blame", "comm_model", "controller", "backend",
    }  # fmt: skip
    assert expected <= summary.keys()
    json.dumps(summary, allow_nan=False)
    for key, value in summary.items():
        assert not isinstance(value, np.generic), key
    assert summary["blame"] == {"10": 2 / 3, "11": 2 / 3, "13": 2 / 3, "12": 1 / 3}
    assert list(summary["blame"]) == ["10", "11", "13", "12"]  # descending, ties by label
    assert summary["guard_interventions"] == 2 and summary["num_ranks"] == 4
    assert (summary["comm_model"], summary["controller"]) == ("null", "threshold")


def test_blame_dict_omits_ranks_never_last():
    summary = metrics.summarize(make_episode([[0.0, 0.5], [0.0, 0.25]]))
    assert summary["blame"] == {"1": 1.0}


def test_compare():
    base = {"throughput_it_per_s": 2.0, "cv": 0.25, "iteration_time_mean_s": 0.5, "iteration_time_p99_s": 1.0}
    other = {
        "throughput_it_per_s": 2.5,
        "cv": 0.125,
        "iteration_time_mean_s": 0.4,
        "iteration_time_p99_s": 0.5,
    }
    out = metrics.compare(base, other)
    assert out["throughput_change_frac"] == 0.25
    assert out["cv_change"] == -0.125
    assert out["iteration_time_mean_change_frac"] == pytest.approx(-0.2)
    assert out["iteration_time_p99_change_frac"] == -0.5


def test_empty_episode_raises_pacectl_error():
    empty = make_episode(np.zeros((0, 3)))
    for fn in (metrics.throughput_it_per_s, metrics.cv, metrics.spread_s, metrics.blame, metrics.summarize):
        with pytest.raises(PacectlError, match="at least one iteration"):
            fn(empty)


def test_domain_without_ranks_raises():
    ep = make_episode([[0.0, 1.0]], domain_of_rank=[0, 2])  # domain 1 owns no rank
    with pytest.raises(PacectlError, match="at least one rank"):
        metrics.spread_s(ep)


# --- properties -----------------------------------------------------------------------------------


@st.composite
def episodes(draw):
    num_iterations = draw(st.integers(1, 12))
    num_ranks = draw(st.integers(1, 8))
    num_domains = draw(st.integers(1, num_ranks))
    # every domain owns at least one rank; the rest are assigned at random (not contiguous).
    extra = draw(st.lists(st.integers(0, num_domains - 1), min_size=num_ranks - num_domains,
                          max_size=num_ranks - num_domains))  # fmt: skip
    dom = draw(st.permutations(list(range(num_domains)) + extra))
    # a coarse grid of values makes ties frequent.
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]) | st.floats(0.0, 2.0)
    arrival = draw(hnp.arrays(np.float64, (num_iterations, num_ranks), elements=values))
    return make_episode(arrival, domain_of_rank=dom)


def _naive_spread(ep, arrival):
    out = np.zeros((ep.num_iterations, ep.num_domains))
    for k in range(ep.num_iterations):
        for d in range(ep.num_domains):
            vals = [arrival[k, r] for r in range(ep.num_ranks) if ep.domain_of_rank[r] == d]
            out[k, d] = max(vals) - min(vals)
    return out


def _naive_blame(ep):
    last = np.zeros(ep.num_ranks)
    for k in range(ep.num_iterations):
        for r in range(ep.num_ranks):
            peers = [
                ep.arrival_s[k, q]
                for q in range(ep.num_ranks)
                if ep.domain_of_rank[q] == ep.domain_of_rank[r]
            ]
            last[r] += ep.arrival_s[k, r] == max(peers)
    return last / ep.num_iterations


@settings(max_examples=200, deadline=None)
@given(episodes())
def test_vectorized_spread_and_blame_match_naive_loops(ep):
    np.testing.assert_array_equal(metrics.spread_s(ep), _naive_spread(ep, ep.arrival_s))
    np.testing.assert_array_equal(metrics.natural_spread_s(ep), _naive_spread(ep, ep.natural_arrival_s))
    np.testing.assert_allclose(metrics.blame(ep), _naive_blame(ep))
    for d in range(ep.num_domains):
        assert metrics.blame(ep)[ep.domain_of_rank == d].sum() >= 1.0 - 1e-12


@settings(max_examples=100, deadline=None)
@given(episodes(), st.data())
def test_wait_fraction_in_unit_interval_when_wait_within_iteration(ep, data):
    it_time = ep.iteration_time_s
    scale = data.draw(hnp.arrays(np.float64, ep.arrival_s.shape, elements=st.floats(0.0, 1.0)))
    waited = make_episode(ep.arrival_s, domain_of_rank=ep.domain_of_rank, wait_s=scale * it_time[:, None])
    assert 0.0 <= metrics.wait_fraction(waited) <= 1.0 + 1e-12  # a sum of n equal terms vs n times one


def test_paired_change_ci95_frac() -> None:
    import math

    from scipy import stats

    from pacectl.metrics import paired_change_ci95_frac

    base = make_episode([[0.0, 0.1]] * 4, iteration_time_s=[1.0, 1.0, 1.0, 1.0])
    other = make_episode([[0.0, 0.1]] * 4, iteration_time_s=[1.1, 0.9, 1.2, 1.0])
    d = np.array([0.1, -0.1, 0.2, 0.0])
    # every iteration its own sample: Student's t with n - 1 degrees of freedom
    expected = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2.0
    assert paired_change_ci95_frac(base, other, block=1) == pytest.approx(expected)
    # by default blocks of floor(sqrt(4)) = 2: means 0.0 and 0.1
    assert paired_change_ci95_frac(base, other) == pytest.approx(
        stats.t.ppf(0.975, 1) * 0.05 * np.sqrt(2) / np.sqrt(2)
    )
    assert paired_change_ci95_frac(base, base) == 0.0
    assert math.isnan(paired_change_ci95_frac(base, make_episode([[0.0, 0.1]] * 3)))


def test_paired_interval_covers_the_mean_change_under_serial_correlation() -> None:
    """Differences that are AR(1) in time (a closed-loop controller, correlated step times): the
    default batch-means interval keeps about its 95 % coverage; treating iterations as independent
    does not (here 94.5 % and 66 % at phi 0.6)."""
    from pacectl.metrics import paired_change_ci95_frac

    rng = np.random.default_rng(0)
    n, phi, true_change = 400, 0.6, 0.01
    covered = {None: 0, 1: 0}
    reps = 400
    for _ in range(reps):
        noise = np.empty(n)
        noise[0] = rng.normal(0.0, 0.02 / np.sqrt(1 - phi * phi))
        for k in range(1, n):
            noise[k] = phi * noise[k - 1] + rng.normal(0.0, 0.02)
        base = make_episode([[0.0, 0.1]] * n, iteration_time_s=np.ones(n))
        other = make_episode([[0.0, 0.1]] * n, iteration_time_s=1.0 + true_change + noise)
        change = float(noise.mean()) + true_change
        for block in covered:
            covered[block] += abs(change - true_change) <= paired_change_ci95_frac(base, other, block=block)
    assert covered[None] / reps > 0.90
    assert covered[1] / reps < 0.85


def test_paired_interval_over_blocks_uses_block_means() -> None:
    """Live runs: differences correlated within interleave blocks widen the interval (batch means)."""
    from scipy import stats

    from pacectl.metrics import paired_change_ci95_frac

    rng = np.random.default_rng(0)
    n, block, offset = 60, 10, 5
    base_t = np.full(n, 1.0)
    block_shift = rng.normal(0.0, 0.05, size=(n + offset) // block + 1)  # drift shared by a block
    other_t = base_t + block_shift[(np.arange(n) + offset) // block] + rng.normal(0.0, 0.001, n)
    base = make_episode([[0.0, 0.1]] * n, iteration_time_s=base_t)
    other = make_episode([[0.0, 0.1]] * n, iteration_time_s=other_t)
    per_iteration = paired_change_ci95_frac(base, other, block=1)
    blocked = paired_change_ci95_frac(base, other, block=block, offset=offset)
    d = other_t - base_t
    ids = (np.arange(n) + offset) // block  # 7 blocks: 5, 10, ..., 10, 5 iterations
    means = np.array([d[ids == i].mean() for i in np.unique(ids)])
    expected = stats.t.ppf(0.975, means.size - 1) * means.std(ddof=1) / np.sqrt(means.size)
    assert blocked == pytest.approx(expected)
    assert blocked > 2 * per_iteration  # the per-iteration formula is too narrow here
    assert np.isnan(paired_change_ci95_frac(base, other, block=100))  # one block: no interval


def test_num_batches_counts_the_blocks_of_the_interval() -> None:
    from pacectl.metrics import num_batches

    assert num_batches(400) == 20 and num_batches(44) == 8  # blocks of floor(sqrt(44)) = 6: 7 full, 1 of 2
    assert num_batches(60, block=10, offset=5) == 7  # the warm-up opens the first block
    assert num_batches(20, block=10, offset=5) == 3 and num_batches(0) == 0


def test_t_quantile_without_scipy_stats_is_bit_identical() -> None:
    """metrics' t quantile (scipy.special.stdtrit) is exactly scipy.stats.t.ppf(0.975, dof)."""
    from scipy import stats

    from pacectl.metrics import _t975

    for dof in (1, 2, 3, 7, 30, 99, 1000, 2048, 2049, 123457):
        assert _t975(dof) == float(stats.t.ppf(0.975, dof))


def test_t_quantile_table_is_scipys_bit_for_bit() -> None:
    """Every value of the table _t975 reads is the installed scipy's (regenerate: python -m pacectl._t975)."""
    import scipy
    from scipy.special import stdtrit

    from pacectl._t975 import SCIPY_VERSION, T975
    from pacectl.metrics import _t975_table_current

    assert _t975_table_current() == (scipy.__version__ == SCIPY_VERSION)
    if scipy.__version__ != SCIPY_VERSION:
        pytest.skip(
            f"the table was written with scipy {SCIPY_VERSION}, {scipy.__version__} is installed: "
            "_t975 asks scipy (test_t_quantile_under_another_scipy_asks_scipy)"
        )
    assert T975 == tuple(float(stdtrit(dof, 0.975)) for dof in range(1, len(T975) + 1))


def test_t_quantile_under_another_scipy_asks_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the installed scipy is not the table's, _t975 computes each value with scipy."""
    from scipy.special import stdtrit

    import pacectl.metrics as metrics

    monkeypatch.setattr(metrics, "_t975_table_current", lambda: False)
    calls: list[int] = []
    import scipy.special

    real = scipy.special.stdtrit
    monkeypatch.setattr(scipy.special, "stdtrit", lambda d, q: calls.append(d) or real(d, q))
    assert metrics._t975(7) == float(stdtrit(7, 0.975))
    assert calls == [7]


@pytest.mark.parametrize("content", [None, "{not json", '{"t975": [1.0]}'])
def test_a_missing_or_damaged_t_table_falls_back_to_scipy(tmp_path, monkeypatch, content):
    """Without a readable _t975.json (deleted, truncated, a key missing) the module loads with no
    table, and every quantile comes from scipy instead of a traceback."""
    import importlib
    import pathlib

    import pacectl._t975 as table

    path = tmp_path / "_t975.json"
    if content is not None:
        path.write_text(content)
    real = pathlib.Path.with_name
    monkeypatch.setattr(
        pathlib.Path, "with_name", lambda self, name: path if name == "_t975.json" else real(self, name)
    )
    try:
        importlib.reload(table)
        assert table.T975 == () and table.SCIPY_VERSION == ""
        from scipy.special import stdtrit

        assert metrics._t975(7) == float(stdtrit(7, 0.975))
    finally:
        monkeypatch.undo()
        importlib.reload(table)
    assert len(table.T975) == 2048
