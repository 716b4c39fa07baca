"""Unit tests of the torch-free core of the live backend (observations, decisions, schedules, records)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from pacectl.backends.replay import ReplayBackend
from pacectl.controllers import PacingGuardWarning
from pacectl.errors import ConfigError
from pacectl.torchdist.core import (
    NUM_GATHER_FIELDS,
    ControlWatcher,
    DecisionEngine,
    ProbeSpec,
    StragglerSpec,
    common_periods,
    counterfactual_error,
    marks_to_ops,
    observation_from_table,
    one_hot_row,
    probe_schedule,
    replay_fidelity,
    rows_to_trace,
    shared_clock_marks,
    straggler_schedule,
    torch_config,
    validate_control,
)
from pacectl.types import Observation


def _table(arrival_local: list[float], in_coll: list[float], delay: list[float]) -> np.ndarray:
    n = len(arrival_local)
    t = np.zeros((n, NUM_GATHER_FIELDS))
    t[:, 0], t[:, 1], t[:, 2] = arrival_local, in_coll, delay
    t[:, 3] = 0.1
    return t


def test_earliness_comes_from_waits_and_the_last_rank_anchors_arrivals() -> None:
    # rank 2 arrives last (shortest time inside the collective: 1 ms transfer only)
    obs = observation_from_table(3, _table([0.05, 0.06, 0.07], [0.021, 0.011, 0.001], [0.0, 0.004, 0.0]))
    np.testing.assert_allclose(obs.wait_s, [0.020, 0.010, 0.0])
    np.testing.assert_allclose(obs.arrival_s, [0.05, 0.06, 0.07])
    np.testing.assert_allclose(obs.natural_arrival_s, [0.05, 0.056, 0.07])
    assert obs.collective_time_s == pytest.approx(0.001)
    assert obs.iteration == 3 and obs.domain == 0 and obs.iteration_time_s == pytest.approx(0.1)


def test_one_hot_sum_is_an_exact_all_gather() -> None:
    rng = np.random.default_rng(1)
    rows = rng.random((4, NUM_GATHER_FIELDS))
    parts = [one_hot_row(r, 4, rows[r]) for r in range(4)]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        total = np.zeros_like(parts[0])
        for r in order:
            total = total + parts[r]
        assert np.array_equal(total.reshape(4, -1), rows)


def _obs(k: int, rng: np.random.Generator) -> Observation:
    t = _table(list(rng.uniform(0.01, 0.05, 4)), list(rng.uniform(0.001, 0.03, 4)), [0.0] * 4)
    return observation_from_table(k, t)


@pytest.mark.parametrize("family", ["threshold", "pid", "ewma", "quantile", "forecast"])
def test_engines_on_identical_inputs_decide_identically(family: str) -> None:
    engines = [DecisionEngine(family, {}, {"max_delay_frac": 0.5}, num_ranks=4, seed=7) for _ in range(3)]
    rng = np.random.default_rng(0)
    for k in range(40):
        obs = _obs(k, rng)
        delays = [e.decide(obs).delay_s for e in engines]
        assert all(np.array_equal(delays[0], d) for d in delays[1:])


def test_non_finite_observation_gives_zero_delay_and_a_warning() -> None:
    engine = DecisionEngine(
        "threshold", {"on_threshold_s": 0.001, "off_threshold_s": 0.0005}, {}, num_ranks=2, seed=0
    )
    bad = observation_from_table(0, _table([0.01, float("nan")], [0.01, 0.0], [0.0, 0.0]))
    with pytest.warns(PacingGuardWarning):
        assert not engine.decide(bad).delay_s.any()


def test_runtime_control_switches_off_and_retunes() -> None:
    engine = DecisionEngine(
        "threshold",
        {"on_threshold_s": 0.001, "off_threshold_s": 0.0005, "gain": 1.0},
        {},
        num_ranks=4,
        seed=0,
    )
    rng = np.random.default_rng(3)
    for k in range(5):
        engine.decide(_obs(k, rng))
    engine.apply_control({"enabled": False}, 1)
    assert engine.version == 1 and not engine.decide(_obs(5, rng)).delay_s.any()
    engine.apply_control({"enabled": True, "controller": {"name": "pid", "kp": 0.3}}, 2)
    assert engine.name == "pid" and engine.controller.enabled
    with pytest.warns(PacingGuardWarning):
        engine.apply_control({"controller": {"name": "pid", "kp": -5.0}}, 3)
    assert engine.name == "pid" and engine.version == 3


def test_control_watcher_reads_changes_and_rejects_bad_files(tmp_path) -> None:
    path = tmp_path / "pacing.json"
    watcher = ControlWatcher(path)
    assert watcher.poll() is None
    path.write_text(json.dumps({"enabled": False}))
    assert watcher.poll() == {"enabled": False}
    assert watcher.poll() is None
    path.write_text(json.dumps({"enabled": True, "bogus": 1}))
    with pytest.warns(PacingGuardWarning, match="bogus"):
        assert watcher.poll() is None


def test_straggler_schedule_is_seeded_and_shaped() -> None:
    spec = StragglerSpec(rank=1, prob=0.5, duration_s=0.01, jitter_frac=0.5)
    a = straggler_schedule(spec, num_iterations=50, world_size=4, seed=3)
    b = straggler_schedule(spec, num_iterations=50, world_size=4, seed=3)
    assert np.array_equal(a, b) and a.shape == (50, 4)
    assert not a[:, [0, 2, 3]].any() and 10 < (a[:, 1] > 0).sum() < 40
    assert a.max() <= 0.015 + 1e-12
    assert not straggler_schedule(StragglerSpec(rank=None), num_iterations=5, world_size=2, seed=0).any()
    with pytest.raises(ConfigError):
        straggler_schedule(spec, num_iterations=5, world_size=1, seed=0)
    with pytest.raises(ConfigError):
        StragglerSpec(kind="nap")


def test_probe_schedule_is_seeded_on_the_chosen_ranks_and_off_by_default() -> None:
    spec = ProbeSpec(ranks=[0, 2], prob=0.5, max_delay_s=0.004)
    a = probe_schedule(spec, num_iterations=60, world_size=4, seed=3, warmup_iterations=5)
    assert np.array_equal(
        a, probe_schedule(spec, num_iterations=60, world_size=4, seed=3, warmup_iterations=5)
    )
    assert a.shape == (60, 4) and not a[:5].any() and not a[:, [1, 3]].any()
    assert ((a == 0.0) | ((a > 0.0) & (a <= 0.004))).all()
    for rank in (0, 2):
        assert 10 < (a[5:, rank] > 0).sum() < 45  # about half of the 55 measured iterations
    assert not np.array_equal(a, probe_schedule(spec, num_iterations=60, world_size=4, seed=4))
    assert not probe_schedule(ProbeSpec(), num_iterations=5, world_size=2, seed=0).any()  # the default: off
    with pytest.raises(ConfigError, match=r"backend.probe.ranks must be ranks in \[0, 2\)"):
        probe_schedule(spec, num_iterations=5, world_size=2, seed=0)


def _synthetic_rows(num_steps: int, delays: np.ndarray, *, blocks: bool = False) -> list[tuple]:
    """Two ranks, two buckets; rank 1 is late by 3 ms on odd steps; rank 0 paced by ``delays``."""
    rows = []
    for k in range(num_steps):
        late = 0.003 if k % 2 else 0.0
        arrivals = [0.010 + delays[k], 0.010 + late]
        exit0 = max(arrivals) + 0.001
        for r in range(2):
            fwd = 0.004 + (late if r == 1 else 0.0)
            call0 = arrivals[r] - (delays[k] if r == 0 else 0.0)
            rows += marks_to_ops(
                step=k,
                rank=r,
                forward_end_s=fwd,
                hook_call_s=[call0, exit0 + 0.001],
                hook_return_s=[arrivals[r] + 1e-5, exit0 + 0.00101],
                enter_s=[arrivals[r], exit0 + 0.001],
                exit_s=[exit0, exit0 + 0.002],
                backward_end_s=exit0 + 0.0025,
                sync_exit_s=exit0 + 0.0026,
                applied_delay_s=float(delays[k]) if r == 0 else 0.0,
                delay_blocks_compute=blocks,
            )
    return rows


def test_record_rows_round_trip_through_the_replay(tmp_path) -> None:
    from pacectl.traces.canonical import load_canonical, write_canonical

    delays = np.where(np.arange(6) % 2, 0.002, 0.0)
    trace = rows_to_trace(_synthetic_rows(6, delays), world_size=2, name="t", source="synthetic")
    path = tmp_path / "rec.parquet"
    write_canonical(trace, path)
    back = load_canonical(path)
    assert back.meta.dp_size == 2 and back.meta.pp_size == 1
    assert back.collective == trace.collective == "DDP gradient all-reduce"  # kept in the file
    fid = replay_fidelity(back)
    assert fid["step_time_max_abs_err_frac"] < 1e-9
    backend = ReplayBackend(back)
    start, _ = backend.replayed_times(None)
    paced = backend.dag.find("grads-reduce-scatter", 0)[0]
    # zero-delay counterfactual: rank 0 arrives 2 ms earlier on paced steps
    np.testing.assert_allclose(start[paced, 1, 0], 0.010, atol=1e-9)


def test_common_periods_average_out_exit_stamp_jitter() -> None:
    """Ranks leave together but stamp late by their own jitter: the mean period telescopes to the wall time."""
    rng = np.random.default_rng(0)
    true_exits = np.cumsum(np.full(200, 0.040))  # a common exit every 40 ms
    jitter = rng.uniform(0.0, 0.010, size=(4, 201))  # each rank's stamp is late by 0-10 ms
    stamps = np.concatenate([np.zeros((4, 1)), true_exits[None, :] + jitter[:, 1:]], axis=1) + jitter[:, :1]
    own = np.diff(stamps, axis=1)  # each rank's own periods (sync_exit_s)
    marks = [[{"sync_exit_s": p} for p in row] for row in own]
    periods = common_periods(marks)
    assert periods.shape == (200,)
    np.testing.assert_allclose(periods.sum(), own.sum(axis=1).mean(), rtol=1e-12)  # the wall time
    assert abs(periods.mean() - 0.040) < 1e-4  # unbiased
    assert own.max(axis=0).mean() > 0.043  # the largest rank's period is biased up (~10 %) by the jitter
    with pytest.raises(ValueError, match="different numbers of iterations"):
        common_periods([marks[0], marks[1][:-1]])


def test_fidelity_compares_against_the_live_iteration_times() -> None:
    delays = np.where(np.arange(6) % 2, 0.002, 0.0)
    trace = rows_to_trace(_synthetic_rows(6, delays), world_size=2, name="t", source="synthetic")
    recorded = trace.recorded_step_time_s().to_numpy()
    assert replay_fidelity(trace, recorded)["step_time_max_abs_err_frac"] < 1e-9
    fid = replay_fidelity(trace, recorded * 0.9)  # live iterations 10 % shorter than the record says
    np.testing.assert_allclose(fid["step_time_median_abs_err_frac"], 1 / 0.9 - 1, rtol=1e-9)
    with pytest.raises(ValueError, match="shape"):
        replay_fidelity(trace, recorded[:-1])
    # the paired effect: the record replayed with its delays minus without them (rank 0 was paced
    # by 2 ms on odd steps, where rank 1 is 3 ms late: the delay is absorbed, no effect)
    cf = counterfactual_error(trace, recorded, recorded)
    assert cf["live_pacing_effect_s"] == 0.0
    np.testing.assert_allclose(cf["predicted_pacing_effect_s"], 0.0, atol=1e-12)
    cf = counterfactual_error(trace, recorded, recorded + 0.001)
    np.testing.assert_allclose(cf["live_pacing_effect_s"], 0.001, rtol=1e-9)


def test_engine_warns_on_a_failing_controller(monkeypatch) -> None:
    engine = DecisionEngine("threshold", {}, {}, num_ranks=2, seed=0)

    def boom(obs: Observation) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.controller.inner, "act", boom)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action = engine.decide(observation_from_table(0, _table([0.01, 0.02], [0.01, 0.0], [0.0, 0.0])))
    assert not action.delay_s.any() and any("boom" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "control",
    [
        {"controller": 5},
        {"guard": 5},
        {"guard": [1]},
        {"guard": {"bogus": 1}},
        {"controller": {"name": "pid", "bogus": 2}},
        {"enabled": "yes"},
        {"enabld": False},
    ],
)
def test_control_messages_of_the_wrong_shape_are_rejected_not_fatal(tmp_path, control) -> None:
    """A mistyped control file is ignored with a warning; it must never reach (and crash) the ranks."""
    with pytest.raises(ConfigError):
        validate_control(control, source="ctl.json")
    path = tmp_path / "ctl.json"
    path.write_text(json.dumps(control))
    with pytest.warns(PacingGuardWarning):
        assert ControlWatcher(path).poll() is None
    engine = DecisionEngine("threshold", {}, {}, num_ranks=2, seed=0)
    with pytest.warns(PacingGuardWarning, match="ignored"):
        engine.apply_control({"controller": {"bogus": 1}}, 1)  # no name: checked only when applied
    assert engine.family == "threshold" and engine.version == 1


def _torch_backend(**changes: object) -> dict:
    import copy
    import dataclasses

    from pacectl.torchdist.core import TorchConfig

    b = dataclasses.asdict(TorchConfig())
    for dotted, value in changes.items():
        node = b
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = copy.deepcopy(value)
    return b


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pacing__gather": "bogus"}, "backend.pacing.gather must be one of"),
        ({"pacing__gather_every": 0}, "backend.pacing.gather_every must be an integer >= 1"),
        ({"pacing__piggyback_max_bytes": -1}, "backend.pacing.piggyback_max_bytes must be an integer >= 0"),
        (
            {"pacing__piggyback_max_bytes": "1MB"},
            "(bytes, e.g. 1048576 = 1 MiB; null: always append to the carrier) or null, got '1MB'",
        ),
        ({"pacing__control_poll_iters": 0}, "backend.pacing.control_poll_iters must be an integer >= 1"),
        (
            {"pacing__spin_s": -1},
            "backend.pacing.spin_s must be >= 0, got -1.0 (override: backend.pacing.spin_s=",
        ),
        ({"workload__width": 0}, "backend.workload.width must be an integer >= 1"),
        ({"workload__model": "cnn"}, "backend.workload.model must be one of"),
        ({"workload__model": "transformer", "workload__heads": 3}, "multiple of backend.workload.heads"),
        ({"straggler__prob": "x"}, "backend.straggler.prob must be a finite number in [0, 1], got 'x'"),
        ({"straggler__rank": 9}, "backend.straggler.rank must be in [-1, 4)"),
        ({"straggler__rnk": 1}, "backend.straggler.rnk: no such key (known: rank, prob,"),
        ({"straggler__rnk": 1}, "did you mean backend.straggler.rank?"),
        ({"start_method": "bogus"}, "backend.start_method must be one of"),
        ({"nproc_per_node": "abc"}, "backend.nproc_per_node must be an integer >= 1"),
        ({"bogus": 1}, "backend.bogus: no such key (known: name, comm_model, nproc_per_node,"),
        ({"nproc": 2}, "did you mean backend.nproc_per_node?"),
        ({"workload__dropout": 0.1}, "backend.workload.dropout: no such key (known: model,"),
        ({"pacing__bogus": 1}, "backend.pacing.bogus: no such key (known: spin_s,"),
        ({"comm_model": "nvlink"}, "backend.comm_model labels the real fabric"),
        ({"probe__ranks": [0, 4]}, "backend.probe.ranks must be ranks in [0, 4) (backend.nproc_per_node=4)"),
        ({"probe__ranks": "all"}, "backend.probe.ranks must be a list of ranks"),
        ({"probe__prob": 2}, "backend.probe.prob must be in [0, 1], got 2"),
        ({"probe__max_delay_s": -0.1}, "backend.probe.max_delay_s must be >= 0, got -0.1"),
        ({"probe__rank": [1]}, "backend.probe.rank: no such key (known: ranks,"),
        ({"fault": 7}, "backend.fault must be a mapping, got 7"),
        ({"fault": {"rank": 1}}, "backend.fault needs both rank and iteration"),
        ({"fault": {"rank": 5, "iteration": 3}}, "backend.fault.rank must be < backend.nproc_per_node=4"),
        (
            {"fault": {"rank": 1, "iteration": 3, "x": 1}},
            "backend.fault.x: no such key (known: rank, iteration, kind)",
        ),
        ({"socket_ifname": "nonexistent0"}, "backend.socket_ifname names no network interface"),
    ],
)
def test_torch_backend_config_is_checked_before_launch(change: dict, message: str) -> None:
    torch_config(_torch_backend())  # the shipped default is valid
    with pytest.raises(ConfigError, match=re.escape(message)):
        torch_config(_torch_backend(**change))


@pytest.mark.parametrize("blocks", [False, True])
def test_a_host_sleep_also_delays_the_next_compute_in_the_replay(tmp_path, blocks: bool) -> None:
    """CPU/gloo pacing sleeps on the training thread: marked, the replay moves the compute after the
    paced collective's launch with the delay (out of zero-delay counterfactuals, into paced replays)."""
    from pacectl.traces.canonical import load_canonical, write_canonical

    delays = np.where(np.arange(6) % 2, 0.002, 0.0)
    trace = rows_to_trace(
        _synthetic_rows(6, delays, blocks=blocks),
        world_size=2,
        name="t",
        source="synthetic",
        pacing_blocks_compute=blocks,
    )
    write_canonical(trace, tmp_path / "rec.parquet")
    back = load_canonical(tmp_path / "rec.parquet")
    assert back.pacing_blocks_compute is blocks
    assert replay_fidelity(back)["step_time_max_abs_err_frac"] < 1e-9  # exact either way
    backend = ReplayBackend(back)
    compute1 = backend.dag.find("backward-compute", 1)[0]
    start, _ = backend.replayed_times(None)  # zero delays
    sleep_left = 0.0 if blocks else 0.002
    np.testing.assert_allclose(start[compute1, 1, 0], 0.010 + 1e-5 + sleep_left, atol=1e-9)
    paced_start, _ = backend.replayed_times(np.full((6, 2), 0.003))  # every rank paced by 3 ms
    shift = paced_start[compute1, 1, 0] - start[compute1, 1, 0]
    np.testing.assert_allclose(shift, 0.003 if blocks else 0.0, atol=1e-9)


def test_live_records_carry_their_measured_iteration_times(tmp_path) -> None:
    """A standalone replay of a live record is judged against the live periods, not its stamps' span."""
    from pacectl.errors import TraceError
    from pacectl.traces.canonical import load_canonical, write_canonical
    from pacectl.traces.model import OpTrace

    delays = np.zeros(6)
    rows = _synthetic_rows(6, delays)
    span = rows_to_trace(rows, world_size=2, name="t", source="synthetic").recorded_step_time_s().to_numpy()
    periods = list(span * 0.9)  # the live iterations were 10 % shorter than the stamps' span
    trace = rows_to_trace(rows, world_size=2, name="t", source="synthetic", step_time_s=periods)
    write_canonical(trace, tmp_path / "rec.parquet")
    back = load_canonical(tmp_path / "rec.parquet")
    np.testing.assert_allclose(back.measured_step_time_s, periods)
    np.testing.assert_allclose(back.reference_step_time_s().to_numpy(), periods)
    fid = ReplayBackend(back).fidelity()
    np.testing.assert_allclose(fid.step_time_median_abs_err_frac, 1 / 0.9 - 1, rtol=1e-6)
    np.testing.assert_allclose(replay_fidelity(back)["step_time_median_abs_err_frac"], 1 / 0.9 - 1, rtol=1e-6)
    # a trace without measured times (production traces, older records) keeps the span
    plain = rows_to_trace(rows, world_size=2, name="t", source="synthetic")
    assert (
        plain.measured_step_time_s is None
        and ReplayBackend(plain).fidelity().step_time_max_abs_err_frac < 1e-9
    )
    with pytest.raises(TraceError, match="one positive finite time per step"):
        OpTrace(ops=trace.ops, meta=trace.meta, source="x", fmt="torch-live", measured_step_time_s=(1.0,))


def test_a_live_record_without_its_delays_is_refused(tmp_path) -> None:
    """Dropping delay_s would replay a paced record as unpaced with a perfect-looking fidelity."""
    import pyarrow.parquet as pq

    from pacectl.errors import TraceError
    from pacectl.traces.canonical import load_canonical, write_canonical

    trace = rows_to_trace(
        _synthetic_rows(4, np.full(4, 0.002)),
        world_size=2,
        name="t",
        source="synthetic",
        pacing_blocks_compute=True,
    )
    path = tmp_path / "rec.parquet"
    write_canonical(trace, path)
    table = pq.read_table(path)
    pq.write_table(table.drop(["delay_s"]), tmp_path / "cut.parquet")
    with pytest.raises(TraceError, match=r"must have the column delay_s.*cut.parquet"):
        load_canonical(tmp_path / "cut.parquet")


def _staggered_live_marks(
    num_iter: int = 60, world: int = 4, seed: int = 0, return_lag_s: float = 0.0
) -> tuple[list, np.ndarray]:
    """Marks of ranks on one host clock: every rank leaves each bucket at a common instant but
    stamps it late (comm thread 0-1 ms, training thread 0-4 ms), and starts the next iteration at
    its own late stamp. With ``return_lag_s`` the last hook returns up to that late (its thread lost
    the core after issuing the all-reduce), often after the bucket completed.
    Returns ``(marks_by_rank, true common exits)``."""
    rng = np.random.default_rng(seed)
    marks: list[list[dict]] = [[] for _ in range(world)]
    start = 100.0 + rng.uniform(0.0, 0.001, world)  # the align() exit stamps
    exits = []
    for _ in range(num_iter):
        fwd = start + 0.010 + rng.uniform(0.0, 0.004, world)
        call0 = fwd + 0.003
        c0 = call0.max() + 0.001  # bucket 0's common completion
        call1 = call0 + 0.002
        c1 = max(call1.max(), c0) + 0.002  # the last bucket's
        stamp = [c0 + rng.uniform(0.0, 0.001, world), c1 + rng.uniform(0.0, 0.001, world)]
        late = rng.uniform(0.0, return_lag_s, world)
        bwd_end = np.maximum(c1, call1 + 1e-4 + late) + rng.uniform(0.0, 0.004, world)
        sync = bwd_end + 0.0001
        for r in range(world):
            s = start[r]
            marks[r].append(
                {
                    "start_clock_s": s,
                    "restarted": not exits,
                    "forward_end_s": fwd[r] - s,
                    "hook_call_s": [call0[r] - s, call1[r] - s],
                    "hook_return_s": [call0[r] + 1e-4 - s, call1[r] + 1e-4 + late[r] - s],
                    "enter_s": [call0[r] + 2e-5 - s, call1[r] + 2e-5 - s],
                    "exit_s": [stamp[0][r] - s, stamp[1][r] - s],
                    "backward_end_s": bwd_end[r] - s,
                    "sync_exit_s": sync[r] - s,
                    "applied_delay_s": 0.0,
                    "decisions_before": 0,
                }
            )
        exits.append(c1)
        start = sync
    return marks, np.asarray(exits)


def _record(marks: list, periods: np.ndarray):
    rows = [
        row
        for r, rank_marks in enumerate(marks)
        for k, m in enumerate(rank_marks)
        for row in marks_to_ops(step=k, rank=r, **{**m, "sync_exit_s": float(periods[k])})
    ]
    return rows_to_trace(rows, world_size=len(marks), name="t", source="synthetic", step_time_s=list(periods))


def test_shared_clock_marks_place_each_ranks_lag() -> None:
    """On one host clock the stamp lags are placed exactly: the record replays its own periods, which
    sum to the wall time; per-rank clocks replayed from a common barrier run long."""
    marks, true_exit = _staggered_live_marks()
    aligned, periods = shared_clock_marks(marks)
    first_start = min(m[0]["start_clock_s"] for m in marks)
    np.testing.assert_allclose(periods.sum(), true_exit[-1] - first_start, atol=1e-3)
    np.testing.assert_allclose(periods[1:], np.diff(true_exit), atol=1e-3)  # off by the earliest stamp's lag
    for rank_marks in aligned:
        for k, m in enumerate(rank_marks):
            assert m["sync_exit_s"] == periods[k] and m["backward_end_s"] <= periods[k]
            assert m["exit_s"][-1] == pytest.approx(periods[k])  # the last bucket's common exit ends it
    assert aligned[0][0]["exit_s"] == aligned[1][0]["exit_s"]  # one completion per bucket, on every rank
    fid = replay_fidelity(_record(aligned, periods))
    assert fid["step_time_max_abs_err_frac"] < 1e-9
    assert fid["launch_clipped"] == 0 and fid["transfer_clipped"] == 0  # no stamp contradicts the model
    # the per-rank clocks, each from its own late start: the replay runs long by the ranks' lags
    local = replay_fidelity(_record(marks, common_periods(marks)))
    assert local["step_time_median_abs_err_frac"] > 0.03


def test_a_hook_returning_after_the_last_completion_is_next_iterations_lag() -> None:
    """On a busy host a rank's training thread can lose its core right after issuing the last
    all-reduce and return from the hook after the bucket completed (seen: 4 ms at 2 ranks under
    load). That lag is after the iteration's end, so it must not become backward compute that the
    optimizer bookkeeping at the iteration's end precedes: once it did, and the replay clipped
    those launch gaps and ran those iterations long (p90 error 8-20 %)."""
    marks, _ = _staggered_live_marks(return_lag_s=0.006)
    late = sum(
        m["start_clock_s"] + m["hook_return_s"][-1] > m["start_clock_s"] + m["exit_s"][-1]
        for rank_marks in marks
        for m in rank_marks
    )
    assert late > 20  # the scenario happens often
    aligned, periods = shared_clock_marks(marks)
    for rank_marks in aligned:
        for k, m in enumerate(rank_marks):
            assert m["backward_compute_end_s"] <= periods[k] and max(m["hook_return_s"]) <= periods[k]
    fid = replay_fidelity(_record(aligned, periods))
    assert fid["launch_clipped"] == 0 and fid["transfer_clipped"] == 0
    assert fid["step_time_max_abs_err_frac"] < 1e-9


def test_shared_clock_marks_restart_at_align_and_reject_mismatches() -> None:
    marks, _ = _staggered_live_marks(num_iter=6, world=2)
    for rank_marks in marks:  # an align() before iteration 3: its clock starts 1 s later
        for m in rank_marks[3:]:
            m["start_clock_s"] += 1.0
        rank_marks[3]["restarted"] = True
    _, periods = shared_clock_marks(marks)
    assert periods.max() < 0.1  # the gap before the align is in no iteration
    marks[1][2]["restarted"] = True
    with pytest.raises(ValueError, match="restarted"):
        shared_clock_marks(marks)
    with pytest.raises(ValueError, match="different numbers of iterations"):
        shared_clock_marks([marks[0], marks[1][:-1]])


def test_counterfactual_lines_for_the_console_and_report() -> None:
    from pacectl.report import counterfactual_lines

    cf = {"mean_err_frac": 0.0244, "predicted_pacing_effect_s": 0.0004, "live_pacing_effect_s": -0.00126}
    fid = {"by_run": {"none": {}, "threshold": {"counterfactual_vs_live_none": cf}}}
    lines = counterfactual_lines(fid)
    assert list(lines) == ["threshold"]
    assert "mean iteration +2.44 %" in lines["threshold"]
    assert "predicted +0.4 ms, live -1.26 ms" in lines["threshold"]
    assert counterfactual_lines(None) == {} and counterfactual_lines({"compares": "x"}) == {}


def test_piggyback_max_bytes_outside_piggyback_warns() -> None:
    """The limit applies to the piggyback exchange only: set with another mode, say it is ignored."""
    with pytest.warns(UserWarning, match="applies to gather=piggyback only; gather=async ignores it"):
        torch_config(_torch_backend(pacing__gather="async", pacing__piggyback_max_bytes=1 << 20))
    # the default, auto, is async on gloo: the limit is ignored there too, and said so
    with pytest.warns(UserWarning, match=r"gather=auto \(async on gloo\) ignores it"):
        torch_config(_torch_backend(pacing__piggyback_max_bytes=1 << 20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_config(_torch_backend(pacing__gather="piggyback", pacing__piggyback_max_bytes=1 << 20))
        torch_config(_torch_backend(pacing__piggyback_max_bytes=None))


def test_auto_gather_is_async_on_gloo_and_piggyback_on_nccl() -> None:
    from pacectl.torchdist.core import exchange_lag, resolve_gather

    assert resolve_gather("auto", "gloo") == "async" and resolve_gather("auto", "nccl") == "piggyback"
    assert resolve_gather("auto", "NCCL") == "piggyback"
    for mode in ("piggyback", "async", "collective"):
        assert resolve_gather(mode, "gloo") == resolve_gather(mode, "nccl") == mode
    assert [exchange_lag(m) for m in ("async", "collective", "piggyback")] == [1, 1, 2]


def test_live_exchange_line_names_the_resolved_mode_and_the_lag() -> None:
    from pacectl.report import live_exchange_line

    line = live_exchange_line(
        {"gather": "auto", "gather_resolved": "async"}, {"lag_iters": 1, "every_iters": 1}
    )
    assert line == "figures exchanged by 'async' (gather=auto); a decision on iteration k paces k + 1"
    line = live_exchange_line(
        {"gather": "piggyback", "gather_resolved": "piggyback", "piggyback_max_bytes": 1024},
        {"lag_iters": 2, "every_iters": 1},
    )
    assert line == (
        "figures exchanged by 'piggyback' (beside carrier buckets over 1024 bytes); "
        "a decision on iteration k paces k + 2"
    )


@pytest.mark.parametrize(
    ("control", "line"),
    [
        ({"enabled": "yes"}, "pacing control: enabled must be true or false, got 'yes' (in ctl.json)"),
        ({"guard": [1]}, "pacing control: guard must be a mapping, got [1] (in ctl.json)"),
        ({"controller": 5}, "pacing control: controller must be a mapping or null, got 5 (in ctl.json)"),
        (
            {"enabld": False},
            "pacing control: enabld: no such key (known: enabled, controller, guard); did you mean enabled?",
        ),
    ],
)
def test_a_control_message_is_checked_by_its_typed_config(control: dict, line: str) -> None:
    """ControlMessage: the file's key, what it must be, the file, and an example; null leaves a key as it is."""
    with pytest.raises(ConfigError) as info:
        validate_control(control, source="ctl.json")
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert 'for example {"enabled": false}' in str(info.value)
    assert validate_control({"enabled": None, "controller": None}, source="ctl.json") == {}


def test_engine_resolves_auto_horizons_from_its_exchange_and_in_runtime_controls() -> None:
    """``auto`` horizons mean the exchange's (lag, every): set by the Pacer, kept for runtime retunes."""
    auto = {"horizon_iters": "auto", "hold_iters": "auto"}
    engine = DecisionEngine("forecast", auto, {}, num_ranks=4, seed=0)
    assert (engine.controller.inner.horizon_iters, engine.controller.inner.hold_iters) == (1, 1)
    engine.set_schedule(2, 3)
    assert (engine.controller.inner.horizon_iters, engine.controller.inner.hold_iters) == (2, 3)
    assert engine.params == auto  # the message stays as given; only the built controller is resolved
    control = validate_control({"controller": {"name": "forecast", **auto, "alpha": 0.1}}, source="test")
    assert engine.apply_control(control, 1)
    assert (engine.controller.inner.horizon_iters, engine.controller.inner.alpha) == (2, 0.1)
    assert engine.apply_control({"controller": {"name": "forecast", "margin_sigmas": 0.5}}, 2)
    inner = engine.controller.inner
    assert (inner.horizon_iters, inner.hold_iters) == (2, 3)  # left out: the exchange's
    fixed = DecisionEngine("forecast", {"horizon_iters": 5}, {}, num_ranks=4, seed=0)
    fixed.set_schedule(2, 1)
    assert fixed.controller.inner.horizon_iters == 5  # an explicit value wins
    with pytest.raises(ConfigError, match="horizon_iters must be an integer >= 1 or auto"):
        validate_control({"controller": {"name": "forecast", "horizon_iters": "soon"}}, source="test")


def test_a_control_without_a_name_is_checked_against_the_running_family(tmp_path: Path) -> None:
    """{"controller": {...}} without "name" retunes the running family: its values are checked as that
    family's when the file is read (one rejection, naming the file's key), not later on every rank."""
    from pacectl.torchdist.core import ControlWatcher, validate_control

    bad = {"controller": {"on_threshold_s": "abc"}}
    with pytest.raises(
        ConfigError, match=r'key "on_threshold_s" of "controller" in this file\) \(in ctl.json\)'
    ):
        validate_control(bad, source="ctl.json", family="threshold")
    with pytest.raises(ConfigError, match="must name its family here"):
        validate_control(bad, source="ctl.json")
    assert validate_control({"controller": {"gain": 0.3}}, source="ctl.json", family="threshold")
    path = tmp_path / "ctl.json"
    path.write_text(json.dumps(bad))
    watcher = ControlWatcher(path, family=lambda: "threshold")
    with pytest.warns(PacingGuardWarning, match="on_threshold_s"):
        assert watcher.poll() is None
    assert len(watcher.rejected) == 1 and "in this file" in watcher.rejected[0]["error"]
