"""The replay backend: exact reproduction at zero delay, and the null (max-plus) model's invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pacectl.backends.dag import compile_dag
from pacectl.backends.replay import ReplayBackend
from pacectl.errors import BackendError, ConfigError, TraceError
from pacectl.loop import run_episode
from pacectl.traces.model import OpTrace
from pacectl.types import Action


@pytest.mark.parametrize("name", ["st_backend", "ar_backend"])
def test_zero_delay_reproduces_recorded_step_times(name: str, request: pytest.FixtureRequest) -> None:
    backend: ReplayBackend = request.getfixturevalue(name)
    fid = backend.fidelity()
    assert fid.step_time_median_abs_err_frac <= 1e-4
    assert fid.step_time_p90_abs_err_frac <= 1e-4
    assert fid.transfer_clipped == 0


def test_zero_delay_reproduces_every_op_of_st(st_backend: ReplayBackend) -> None:
    start, end = st_backend.replayed_times()
    dag = st_backend.dag
    # float32 seconds in the file: agree to 0.1 ms on every one of the 6,784 ops
    np.testing.assert_allclose(start, dag.start_s, atol=1e-4)
    np.testing.assert_allclose(end, dag.start_s + dag.duration_s, atol=1e-4)
    assert st_backend.clip_counts["launch_clipped"] == 0


def test_closed_loop_matches_open_loop(st_backend: ReplayBackend) -> None:
    rng = np.random.default_rng(1)
    delays = rng.uniform(0, 0.05, size=(st_backend.num_iterations, len(st_backend.rank_labels)))
    _, end = st_backend.replayed_times(delays)
    st_backend.reset()
    dp = st_backend.trace.meta.dp_size
    for k in range(st_backend.num_iterations):
        obs = st_backend.step(
            [Action(delays[k, d * dp : (d + 1) * dp]) for d in range(len(st_backend.domains))]
        )
        assert obs[0].iteration_time_s == pytest.approx(end[:, k].max(), abs=1e-12)
        for d, o in enumerate(obs):
            np.testing.assert_allclose(o.applied_delay_s, delays[k, d * dp : (d + 1) * dp])
            np.testing.assert_allclose(o.natural_arrival_s + o.applied_delay_s, o.arrival_s)
            assert (o.wait_s >= 0).all() and o.wait_s.min() == 0.0


def test_observation_is_the_recorded_arrival(st_backend: ReplayBackend) -> None:
    st_backend.reset()
    obs = st_backend.step([Action.zeros(len(d.ranks)) for d in st_backend.domains])
    dag = st_backend.dag
    for s, o in enumerate(obs):
        node = dag.find("grads-reduce-scatter")[s]
        np.testing.assert_allclose(o.arrival_s, dag.start_s[node, 0], atol=1e-4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_null_model_no_delay_shortens_any_iteration(st_backend: ReplayBackend, data: st.DataObject) -> None:
    """Max-plus monotonicity: with fixed durations, no delay vector makes any op end earlier."""
    shape = (st_backend.num_iterations, len(st_backend.rank_labels))
    delays = data.draw(
        arrays(np.float64, shape, elements=st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False))
    )
    start0, end0 = st_backend.replayed_times()
    start1, end1 = st_backend.replayed_times(delays)
    assert (end1.max(axis=(0, 2)) >= end0.max(axis=(0, 2)) - 1e-12).all()  # every iteration
    assert (end1 >= end0 - 1e-12).all()  # and every op
    assert (start1 >= start0 - 1e-12).all()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(0.0, 30.0))
def test_null_model_no_delay_shortens_any_iteration_ar(
    ar_backend: ReplayBackend, seed: int, scale: float
) -> None:
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0, scale, size=(ar_backend.num_iterations, len(ar_backend.rank_labels)))
    delays[rng.random(delays.shape) < 0.5] = 0.0
    _, end0 = ar_backend.replayed_times()
    _, end1 = ar_backend.replayed_times(delays)
    assert (end1.max(axis=(0, 2)) >= end0.max(axis=(0, 2)) - 1e-12).all()


def test_delaying_the_last_rank_shifts_the_step_one_to_one(st_backend: ReplayBackend) -> None:
    """Max-plus: a delay on the rank that gates the global clip all-reduce passes straight through."""
    n_iter, n_ranks = st_backend.num_iterations, len(st_backend.rank_labels)
    _, end0 = st_backend.replayed_times()
    big = 10.0  # longer than any step: this rank now gates everything downstream
    delays = np.zeros((n_iter, n_ranks))
    delays[:, 0] = big
    _, end1 = st_backend.replayed_times(delays)
    shift = end1.max(axis=(0, 2)) - end0.max(axis=(0, 2))
    assert (shift <= big + 1e-9).all() and (shift > big - 2.5).all()


def test_step_argument_checks(st_backend: ReplayBackend) -> None:
    st_backend.reset()
    with pytest.raises(BackendError, match="one action per domain"):
        st_backend.step([Action.zeros(2)])
    with pytest.raises(BackendError, match="finite delays >= 0"):
        st_backend.step([Action(np.array([-1.0, 0.0]))] * 4)
    for _ in range(st_backend.num_iterations):
        st_backend.step([Action.zeros(2)] * 4)
    with pytest.raises(BackendError, match="at most 32 times"):
        st_backend.step([Action.zeros(2)] * 4)


def test_paced_optype_must_be_a_dp_collective(st_trace: OpTrace) -> None:
    with pytest.raises(ConfigError, match=r"paced_optype must be a DP collective.*got 'forward-compute'"):
        ReplayBackend(st_trace, paced_optype="forward-compute")
    backend = ReplayBackend(st_trace, paced_optype="params-all-gather")
    assert backend.paced_optype == "params-all-gather"


def test_structure_mismatch_is_a_trace_error(st_trace: OpTrace) -> None:
    ops = st_trace.ops
    drop = ops.index[(ops["step"] == ops["step"].max()) & (ops["optype"] == "gc") & (ops["dp_rank"] == 1)]
    broken = OpTrace(
        ops=ops.drop(drop).reset_index(drop=True), meta=st_trace.meta, source="x.parquet", fmt="bytedance"
    )
    with pytest.raises(TraceError, match=r"same ops per stage.*x.parquet"):
        compile_dag(broken)


def test_op_types_that_differ_between_blocks_are_a_trace_error(st_trace: OpTrace) -> None:
    """Same op count in every (step, DP rank) block, but one op's type differs in one block: the
    op types are compared as codes; and a missing op type is refused."""
    ops = st_trace.ops.copy()
    one = ops.index[(ops["step"] == ops["step"].max()) & (ops["optype"] == "gc") & (ops["dp_rank"] == 1)][0]
    ops.loc[one, "optype"] = "optimizer"
    with pytest.raises(TraceError, match=r"same ops per stage.*x.parquet"):
        compile_dag(OpTrace(ops=ops, meta=st_trace.meta, source="x.parquet", fmt="bytedance"))
    ops = st_trace.ops.astype({"optype": object})
    ops.loc[3, "optype"] = None
    with pytest.raises(TraceError, match=r"every op must have an op type.*x.parquet: column optype"):
        compile_dag(OpTrace(ops=ops, meta=st_trace.meta, source="x.parquet", fmt="bytedance"))


class _ScaledComm:
    """A timing-dependent test model: the paced collective takes ``factor`` times its recorded
    transfer, and every call is logged ``(start_s, recorded_s)``."""

    name = "scaled"
    timing_dependent = True
    description = "test: the paced collective scaled"

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.calls: list[tuple[float, float]] = []

    def transfer_s(self, recorded_transfer_s: np.ndarray) -> np.ndarray:
        return recorded_transfer_s

    def contended_s(self, start_s: float, recorded_s: float) -> float:
        self.calls.append((start_s, recorded_s))
        return self.factor * recorded_s


def _zero_steps(backend: ReplayBackend, num_steps: int) -> np.ndarray:
    backend.reset()
    return np.array(
        [
            backend.step([Action.zeros(len(d.ranks)) for d in backend.domains])[0].iteration_time_s
            for _ in range(num_steps)
        ]
    )


def test_a_contended_replay_runs_each_stages_paced_collective_once(
    ar_trace: OpTrace, ar_backend: ReplayBackend
) -> None:
    """AR (DP 4): the paced collective is DP-synchronised, so the timing-dependent hook sees it once
    per stage and step (its longest instance), and every DP rank's instance gets the same extra
    time; an identity model replays exactly the null model's step times, a slower one never
    shortens a step and lengthens some (the hook is applied)."""
    steps, pp = 6, ar_trace.meta.pp_size
    null = _zero_steps(ar_backend, steps)
    same = _ScaledComm(1.0)
    np.testing.assert_array_equal(_zero_steps(ReplayBackend(ar_trace, comm_model=same), steps), null)
    assert len(same.calls) == steps * pp
    starts = np.array([c[0] for c in same.calls[:pp]])
    assert np.isfinite(starts).all() and (starts >= 0).all()
    slow = _ScaledComm(3.0)
    slower = _zero_steps(ReplayBackend(ar_trace, comm_model=slow), steps)
    assert (slower >= null - 1e-9).all() and (slower > null + 1e-6).any()
    # what the model saw in step 0: the longest DP instance of each stage's collective, as recorded
    longest = sorted(ar_backend._transfer[p, 0].max() for p in ar_backend._paced)
    np.testing.assert_allclose(sorted(c[1] for c in slow.calls[:pp]), longest)


def test_a_replay_under_the_contention_model_is_never_faster_without_pacing(ar_trace: OpTrace) -> None:
    """comm=contention, cluster=paper_like on AR: cross traffic only slows the paced collective, so
    with zero delays no step is shorter than under the null model (the README's example command)."""
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, make_comm_model

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["comm=contention", "cluster=paper_like"])
    comm = make_comm_model(cfg, ar_trace.meta.world_size)
    assert comm.timing_dependent
    steps = 8
    contended = _zero_steps(ReplayBackend(ar_trace, comm_model=comm), steps)
    null = _zero_steps(ReplayBackend(ar_trace), steps)
    assert np.isfinite(contended).all() and (contended >= null - 1e-9).all()


def test_episode_records_every_rank(ar_backend: ReplayBackend) -> None:
    class Zero:
        name = "none"

        def reset(self, num_ranks: int, rng: np.random.Generator) -> None:
            self.n = num_ranks

        def act(self, obs):  # type: ignore[no-untyped-def]
            return Action.zeros(self.n)

        def diagnostics(self) -> dict[str, float]:
            return {"active": 0.0}

    ep = run_episode(ar_backend, Zero)
    assert ep.arrival_s.shape == (44, 16)
    assert sorted(ep.rank_labels.tolist()) == list(range(0, 64, 4))
    recorded = ar_backend.trace.recorded_step_time_s().to_numpy()
    np.testing.assert_allclose(ep.iteration_time_s, recorded, rtol=1e-4)


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_counterfactual_matches_the_published_analyzer(name: str, request: pytest.FixtureRequest) -> None:
    """Cross-check against an independent implementation: the OSDI'25 artifact's replay with every
    launch delay removed (``step_t_nodelay`` in result-*.json), per step, within 0.5%."""
    import json

    from pacectl.data import DATA_DIR

    backend: ReplayBackend = request.getfixturevalue(f"{name.lower()}_backend")
    published = json.loads((DATA_DIR / "bytedance" / f"result-{name}.json").read_text())["step_t_nodelay"]
    _, end = backend.replayed_times(launch_s=np.zeros_like(backend.launch_s))
    ours = end.max(axis=(0, 2))
    ref = np.array([published[str(s)] for s in backend.step_ids])
    np.testing.assert_allclose(ours, ref, rtol=5e-3)


def test_pacing_active_lines_up_with_applied_delays(st_backend: ReplayBackend) -> None:
    from pacectl.controllers import SafetyGuard, make_controller

    ep = run_episode(
        st_backend,
        lambda: SafetyGuard(make_controller("threshold", on_threshold_s=0.005, off_threshold_s=0.002)),
    )
    assert not ep.pacing_active[0].any()
    delayed = ep.applied_delay_s.reshape(ep.num_iterations, ep.num_domains, -1).max(axis=2) > 0
    assert (delayed <= ep.pacing_active).all()  # a delay is only applied by an active controller
