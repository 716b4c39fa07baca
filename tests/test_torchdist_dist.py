"""Multi-process gloo tests of the live backend (``dist`` marker; CPU, a few seconds each).

One 2-rank job (no pacing and a threshold controller tuned to pace) serves several checks; a second
job kills a rank mid-run. Ranks start through torch's elastic launcher on 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hydra import compose, initialize_config_dir  # noqa: E402

from pacectl.config import CONF_DIR  # noqa: E402
from pacectl.controllers.guard import PacingGuardWarning  # noqa: E402
from pacectl.errors import BackendError  # noqa: E402

pytestmark = pytest.mark.dist

_FAST = [
    "backend=torch",
    "backend.nproc_per_node=2",
    "backend.num_iterations=12",
    "backend.warmup_iterations=2",
    "backend.pg_timeout_s=10",
    "backend.start_method=spawn",
    "backend.workload.width=64",
    "backend.workload.depth=2",
    "backend.workload.batch_size=8",
    "backend.workload.bucket_cap_mb=0.01",
    "backend.straggler.prob=0.5",
    "backend.straggler.duration_s=0.01",
    "backend.straggler.jitter_frac=0.0",
]


def _cfg(tmp: Path, *extra: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            config_name="config",
            overrides=[*_FAST, f"backend.record_dir={tmp}", *extra],
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from pacectl.torchdist.experiment import TorchExperiment

    tmp = tmp_path_factory.mktemp("live")
    cfg = _cfg(
        tmp,
        "controller=threshold",
        "controller.on_threshold_s=0.002",
        "controller.off_threshold_s=0.001",
        "controller.gain=0.5",
    )
    exp = TorchExperiment(cfg)
    summary = exp.describe()
    exp.in_place_before_success = sorted(p.name for p in tmp.iterdir())  # type: ignore[attr-defined]
    exp.write_outputs(tmp)  # what a successful run does last
    return exp, summary


def test_records_appear_only_when_the_run_succeeded(live) -> None:
    exp, summary = live
    assert exp.in_place_before_success == []  # an interrupted run leaves no records in place
    assert Path(summary["records"]["threshold"]).is_file() and Path(summary["records"]["none"]).is_file()
    assert not exp.record_dir.exists()  # the partial folder was emptied and removed


def test_every_rank_takes_identical_decisions(live) -> None:
    exp, _ = live
    decisions = exp.decisions()
    assert sorted(decisions) == [0, 1]
    for family in ("none", "threshold"):
        d0, d1 = decisions[0][family]["decisions"], decisions[1][family]["decisions"]
        assert d0.shape == (12, 2)
        assert np.array_equal(d0, d1)  # bit-identical: same gathered table, same guarded controller


def test_a_delay_is_really_applied(live) -> None:
    exp, _ = live
    ep = exp.run("threshold", exp.families["threshold"])
    assert ep.applied_delay_s.max() > 0.0  # the controller paced rank 0 (rank 1 straggles)
    assert not exp.run("none", {}).applied_delay_s.any()
    # rank 0's sleep before bucket 0 lasted at least what was asked
    actual = exp._extras["threshold"]["delay_actual_s"]
    requested = ep.applied_delay_s[:, 0]
    assert (actual[requested > 0] >= requested[requested > 0] - 1e-6).all()
    # ... and it shows in the observed arrivals: paced ranks wait less than their natural earliness
    paced = requested > 0
    natural_wait = ep.natural_arrival_s.max(axis=1) - ep.natural_arrival_s[:, 0]
    assert (ep.wait_s[paced, 0] < natural_wait[paced] + 1e-3).all()
    # pacing_active marks the iterations whose delays an active controller chose (as in replay and sim)
    delayed = ep.applied_delay_s.max(axis=1) > 0
    assert not ep.pacing_active[0, 0]
    assert (delayed <= ep.pacing_active[:, 0]).all()


def test_record_then_replay_round_trips(live) -> None:
    from pacectl.backends.replay import ReplayBackend
    from pacectl.traces.canonical import load_canonical

    exp, summary = live
    path = Path(summary["records"]["threshold"])
    trace = load_canonical(path)
    assert trace.meta.dp_size == 2 and trace.meta.pp_size == 1 and "delay_s" in trace.ops.columns
    paced = trace.ops[(trace.ops["optype"] == "grads-reduce-scatter") & (trace.ops["seq_id"] == 0)]
    ep = exp.run("threshold", exp.families["threshold"])
    kept = paced["step"].unique()
    np.testing.assert_allclose(
        paced.pivot(index="step", columns="dp_rank", values="delay_s").to_numpy(), ep.applied_delay_s[kept]
    )
    backend = ReplayBackend(trace)
    assert backend.num_iterations == len(kept)
    fid = summary["fidelity"]["by_run"]["threshold"]
    # The ranks share the host clock: each rank's stamp lags are placed (shared_clock_marks) and the
    # replay reproduces the live iteration times, exactly where the stamps respect the dependency
    # model. (With per-rank clocks the replay ran 10-13 % long.)
    assert "host clock" in fid["compares"]
    assert fid["step_time_median_abs_err_frac"] < 0.02
    assert np.isfinite(fid["counterfactual_vs_live_none"]["step_time_median_abs_err_frac"])


def test_a_killed_rank_ends_the_job_with_a_clear_error(tmp_path) -> None:
    from pacectl.torchdist.experiment import TorchExperiment

    # The job must end (a hang would stall the suite) with a message that names the rank and why.
    cfg = _cfg(tmp_path, "controller=none", "+backend.fault={rank: 1, iteration: 3}")
    with pytest.raises(
        BackendError, match=r"rank 1 failed \(exit code 17.*the fault injected by backend.fault"
    ):
        TorchExperiment(cfg).describe()


def test_a_frozen_rank_is_named_and_ends_the_job_within_pg_timeout(tmp_path) -> None:
    from pacectl.torchdist.experiment import TorchExperiment

    # SIGSTOP on rank 1: the job used to end after pg_timeout_s + 30 s, blaming the healthy rank 0
    # with gloo internals. The watch kills the frozen rank at pg_timeout_s / 2 and names it.
    cfg = _cfg(
        tmp_path,
        "controller=none",
        "backend.pg_timeout_s=8",
        "+backend.fault={rank: 1, iteration: 2, kind: stop}",
    )
    with pytest.raises(
        BackendError, match=r"rank 1 \(pid \d+\) stopped answering: it was held stopped"
    ) as err:
        TorchExperiment(cfg).describe()
    assert "rank 0" not in str(err.value) and "gloo" not in str(err.value).lower()


def test_a_fault_past_the_run_is_refused(tmp_path) -> None:
    from pacectl.errors import ConfigError
    from pacectl.torchdist.experiment import TorchExperiment

    cfg = _cfg(tmp_path, "controller=none", "+backend.fault={rank: 1, iteration: 100000}")
    with pytest.raises(ConfigError, match=r"backend.fault.iteration must be < backend.num_iterations"):
        TorchExperiment(cfg)


@pytest.mark.parametrize("gather", ["async", "piggyback", "collective"])
def test_runtime_control_in_process(tmp_path, gather: str) -> None:
    """One in-process gloo rank: the watched file switches pacing off, then retunes, without restart.

    A change polled at the end of iteration k is applied at the end of k (collective mode), at the
    first collective of k + 1 (async: the exchange completes in the background, the training thread
    applies it before the next delay) or at the end of k + 1 (piggyback: the version rides on the
    next iteration's first collective).
    """
    import torch.distributed as dist

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.launch import free_port
    from pacectl.torchdist.pacer import PacedAllReduce, Pacer

    store = dist.TCPStore(
        "127.0.0.1", free_port(), 1, is_master=True, timeout=__import__("datetime").timedelta(seconds=10)
    )
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        control = tmp_path / "pacing.json"
        engine = DecisionEngine("threshold", {}, {}, num_ranks=1, seed=0)
        pacer = Pacer(engine, gather=gather, control_path=control, control_poll_iters=1)
        all_reduce = PacedAllReduce(pacer, collectives_per_iteration=2)
        grad = torch.ones(8)
        lag = 0 if gather == "collective" else 1
        for k in range(6):
            if k == 2:
                control.write_text(json.dumps({"enabled": False}))
            if k == 4:
                control.write_text(json.dumps({"enabled": True, "controller": {"name": "pid", "kp": 0.2}}))
            if k == 5:  # a mistyped version: ignored with a warning, and listed
                control.write_text(json.dumps({"guard": 5}))
                with pytest.warns(PacingGuardWarning, match="control file ignored"):
                    all_reduce(grad)
                    all_reduce(grad)
            else:
                all_reduce(grad)
                all_reduce(grad)
            if k == 2 + lag:
                assert not engine.controller.enabled and engine.version == 1
        pacer.flush()
        assert engine.version == 2 and engine.name == "pid" and engine.controller.enabled
        # the log says which message took effect from which decision (row k carries the version)
        assert [(c["observation"], c["version"], c["applied"]) for c in pacer.controls_applied] == [
            (2, 1, True),
            (4, 2, True),
        ]
        assert pacer.controls_applied[0]["control"] == {"enabled": False}
        assert [c["iteration"] for c in pacer.controls_rejected] == [5]
        assert "guard" in pacer.controls_rejected[0]["error"]
        assert torch.equal(grad, torch.ones(8))  # world of 1: the carried figures never leak into grad
        assert len(pacer.observations) == 6 and len(pacer.marks) == 6
        assert [o.iteration for o in pacer.observations] == list(range(6))
        assert all(len(m["enter_s"]) == 2 for m in pacer.marks)
        pacer.reset_log()  # a new episode (the live run's warm-up ends so): the log carries both lists
        assert [(c["version"], c["carried"]) for c in pacer.controls_applied] == [(1, True), (2, True)]
        assert [(c["iteration"], c["carried"]) for c in pacer.controls_rejected] == [(0, True)]
    finally:
        dist.destroy_process_group()


def test_pacer_rejects_bad_arguments(tmp_path) -> None:
    """Misuse fails at construction, not inside a communication callback mid-training."""
    import torch.distributed as dist

    from pacectl.errors import ConfigError
    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.launch import free_port
    from pacectl.torchdist.pacer import Pacer

    store = dist.TCPStore(
        "127.0.0.1", free_port(), 1, is_master=True, timeout=__import__("datetime").timedelta(seconds=10)
    )
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        engine = DecisionEngine("threshold", {}, {}, num_ranks=1, seed=0)
        for kwargs, message in (
            ({"gather": "bogus"}, "gather must be one of"),
            ({"gather_every": 0}, "gather_every must be an integer >= 1"),
            ({"control_poll_iters": 0}, "control_poll_iters must be an integer >= 1"),
            ({"spin_s": -1.0}, r"Pacer.spin_s must be >= 0, got -1.0"),
            ({"piggyback_max_bytes": 0.5}, "piggyback_max_bytes must be an integer >= 0"),
            ({"cuda_resolve": "later"}, "cuda_resolve='later': expected one of"),
        ):
            with pytest.raises(ConfigError, match=message):
                Pacer(engine, **kwargs)
        with pytest.raises(ConfigError, match="num_ranks=4 must equal the process group's world size 1"):
            Pacer(DecisionEngine("threshold", {}, {}, num_ranks=4, seed=0))
    finally:
        dist.destroy_process_group()


def test_live_summary_says_what_its_interval_does_not_cover(live) -> None:
    _, summary = live
    assert "interleaved in blocks of 10 iterations" in summary["note"]
    assert summary["fidelity"]["num_op_instances"] > 0
    assert all("runtime_controls" in m for m in summary["measured"].values())


def test_live_runs_measure_cpu_time_per_iteration_as_the_energy_proxy(live) -> None:
    """On CPU/gloo there is no energy counter: every rank's process CPU time per measured iteration
    is the proxy, and the summary says so."""
    from pacectl.energy import measured_summary

    exp, _ = live
    source, measured = exp.measured_energy()
    assert source == "cpu_time_proxy"
    assert set(measured) == {"none", "threshold"}
    for values in measured.values():
        assert values.shape == (12, 2) and (values > 0).all()
    per_run, vs, top = measured_summary(source, measured, block=10, offset=2)
    assert per_run["none"]["cpu_time_per_iteration_s"] > 0
    assert "cpu_time_change_frac" in vs["threshold"] and "proxy" in top["energy_measured"]["what"]


def test_runs_are_interleaved_in_blocks_with_a_rotating_order() -> None:
    from pacectl.torchdist.worker import run_interleaved

    calls: list[tuple[str, int, int]] = []

    class FakeRun:
        def __init__(self, family: str, total: int) -> None:
            self.family, self.total, self.k = family, total, 0
            self.pacer = self

        def align(self) -> None:
            calls.append((self.family, self.k, -1))

        def train(self, n: int) -> None:
            stop = min(self.k + n, self.total)
            calls.append((self.family, self.k, stop))
            self.k = stop

    runs = [FakeRun("none", 7), FakeRun("pid", 7)]
    reported: list[int] = []
    run_interleaved(runs, 3, reported.append)  # type: ignore[arg-type]
    assert reported == [3, 6, 9, 12, 13, 14]  # progress after every block, all runs together
    trains = [(f, a, b) for f, a, b in calls if b >= 0]
    assert trains == [
        ("none", 0, 3), ("pid", 0, 3),  # round 0
        ("pid", 3, 6), ("none", 3, 6),  # round 1: the order rotates
        ("none", 6, 7), ("pid", 6, 7),
    ]  # fmt: skip
    assert len(calls) == 2 * len(trains)  # every block starts with an align
    sequential = [FakeRun("none", 4), FakeRun("pid", 4)]
    calls.clear()
    reported.clear()
    run_interleaved(sequential, 0, reported.append)  # type: ignore[arg-type]
    assert calls == [("none", 0, 4), ("pid", 0, 4)]
    assert reported == [4, 8]


def test_live_progress_is_written_atomically_and_read_into_the_bar(tmp_path, monkeypatch) -> None:
    """Rank 0 writes the iterations done; the launcher's bar polls the file and ends at the total."""
    import pacectl.torchdist.experiment as experiment
    from pacectl.torchdist.worker import progress_writer

    path = tmp_path / "job.progress"
    assert progress_writer(None) is None
    write = progress_writer(str(path))
    assert write is not None
    write(3)
    write(12)
    assert path.read_text() == "12" and not path.with_name("job.progress.tmp").exists()

    bars = []
    real_tqdm = __import__("tqdm").tqdm

    def visible_bar(*args, **kwargs):  # type: ignore[no-untyped-def]  # as on a terminal
        bar = real_tqdm(*args, **{**kwargs, "disable": False, "file": io.StringIO()})
        bars.append(bar)
        return bar

    monkeypatch.setattr("tqdm.tqdm", visible_bar)
    with experiment._progress_bar(path, total=14, poll_s=0.01):
        deadline = time.monotonic() + 10
        while bars[0].n < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert bars[0].n == 12  # what rank 0 reported, never more than the total
    assert not path.exists()  # removed with the job


def test_runtime_control_never_reaches_the_no_pacing_baseline(tmp_path) -> None:
    """A control file (here present from the start) retunes the paced run, never the baseline."""
    from pacectl.torchdist.experiment import TorchExperiment

    control = tmp_path / "ctl.json"
    control.write_text(json.dumps({"controller": {"name": "pid", "kp": 0.2}}))
    cfg = _cfg(
        tmp_path / "rec",
        "controller=threshold",
        f"backend.pacing.control_path={control}",
        "backend.pacing.control_poll_iters=1",
    )
    exp = TorchExperiment(cfg)
    summary = exp.describe()
    assert summary["measured"]["none"]["runtime_controls"] == []
    assert not exp.run("none", {}).applied_delay_s.any()
    (applied,) = summary["measured"]["threshold"]["runtime_controls"]
    assert applied["applied"] and applied["control"]["controller"]["name"] == "pid"


def test_records_about_to_be_replaced_are_named_before_the_run(tmp_path) -> None:
    from pacectl.torchdist.experiment import TorchExperiment

    (tmp_path / "none.parquet").write_bytes(b"an earlier record")
    with pytest.warns(UserWarning, match=r"already holds \['none.parquet'\]: this run replaces them"):
        TorchExperiment(_cfg(tmp_path, "controller=none"))  # no rank starts before describe()
    assert (tmp_path / "none.parquet").read_bytes() == b"an earlier record"


def _paced_as_scheduled(exp) -> np.ndarray:
    """The threshold run's applied delays, checked equal to its decisions delivered as
    ``exp.exchange`` (:class:`~pacectl.loop.ExchangeSchedule`) says; returns them."""
    schedule = exp.exchange
    ep = exp.run("threshold", exp.families["threshold"])
    decided = exp.decisions()[0]["threshold"]["decisions"]
    want = np.zeros_like(ep.applied_delay_s)
    for k in range(len(decided)):
        first = schedule.applies_from(k)
        if first is not None:
            want[first:] = decided[k]
    np.testing.assert_array_equal(ep.applied_delay_s, want)
    return ep.applied_delay_s


def _threshold_job(tmp_path, *extra: str):
    from pacectl.torchdist.experiment import TorchExperiment

    cfg = _cfg(
        tmp_path,
        "controller=threshold",
        "controller.on_threshold_s=0.002",
        "controller.off_threshold_s=0.001",
        *extra,
    )
    exp = TorchExperiment(cfg)
    return exp, exp.describe()


def test_live_decisions_pace_after_the_lag_the_offline_model_uses(live) -> None:
    """gather=auto is async on gloo: a decision on iteration k paces k + 1, the lag that
    ``summary.exchange`` reports and that replay/sim model with ``exchange.lag_iters``."""
    exp, summary = live
    assert exp.gather == "async"
    assert summary["pacing"]["gather_resolved"] == "async"
    assert exp.exchange.lag == 1 and exp.exchange.every == 1
    assert _paced_as_scheduled(exp)[1:].any()


def test_piggybacked_decisions_pace_two_iterations_later(tmp_path) -> None:
    """gather=piggyback: the figures of iteration k ride on k + 1's carrier bucket, so the decision
    paces k + 2, the lag the offline model uses for it (``exchange.lag_iters=2``)."""
    exp, summary = _threshold_job(tmp_path, "backend.pacing.gather=piggyback")
    assert exp.gather == "piggyback" and summary["pacing"]["gather_resolved"] == "piggyback"
    assert exp.exchange.lag == 2
    assert _paced_as_scheduled(exp)[2:].any()


def test_live_gather_every_paces_as_the_offline_schedule_says(tmp_path) -> None:
    """gather_every=3 (async): the figures of iterations k-2..k are exchanged together and the
    decision on the last of them paces until the next group's: exactly ExchangeSchedule(1, 3)."""
    exp, _ = _threshold_job(tmp_path, "backend.pacing.gather_every=3")
    assert (exp.exchange.lag, exp.exchange.every) == (1, 3)
    assert _paced_as_scheduled(exp)[3:].any()


def test_a_nameless_control_is_checked_against_the_family_published_last(tmp_path) -> None:
    """A family switch published but not yet applied: a following control without "name" retunes
    the new family, so it is checked as that family's."""
    import torch.distributed as dist

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.launch import free_port
    from pacectl.torchdist.pacer import Pacer

    store = dist.TCPStore(
        "127.0.0.1", free_port(), 1, is_master=True, timeout=__import__("datetime").timedelta(seconds=10)
    )
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        pacer = Pacer(
            DecisionEngine("threshold", {}, {}, num_ranks=1, seed=0), control_path=tmp_path / "c.json"
        )
        assert pacer._published_family() == "threshold"
        pacer.request_control({"controller": {"name": "pid", "kp": 0.2}})
        pacer.request_control({"enabled": False})
        assert pacer._published_family() == "pid"  # not applied yet: the engine still runs threshold
        (tmp_path / "c.json").write_text(json.dumps({"controller": {"kp": 0.3}}))  # a pid key
        assert pacer.watcher is not None and pacer.watcher.poll() == {"controller": {"kp": 0.3}}
    finally:
        dist.destroy_process_group()


def test_probe_delays_are_slept_recorded_and_alike_in_every_run(tmp_path) -> None:
    """backend.probe: the seeded schedule on the chosen ranks, in every controller's run, each probe
    slept at least as long as scheduled and recorded in the episode extras and the summary."""
    from pacectl.torchdist.core import ProbeSpec, probe_schedule
    from pacectl.torchdist.experiment import TorchExperiment

    probe = ["backend.probe.ranks=[1]", "backend.probe.prob=0.6", "backend.probe.max_delay_s=0.003"]
    exp = TorchExperiment(_cfg(tmp_path, "controller=threshold", *probe))
    summary = exp.describe()
    assert summary["probe"] == {"ranks": [1], "prob": 0.6, "max_delay_s": 0.003}
    spec = ProbeSpec(ranks=(1,), prob=0.6, max_delay_s=0.003)
    expected = probe_schedule(spec, num_iterations=14, world_size=2, seed=0, warmup_iterations=2)[2:]
    assert expected[:, 1].any() and not expected[:, 0].any()
    for family in ("none", "threshold"):
        extras = exp._extras[family]
        assert np.array_equal(extras["probe_s"], expected)
        slept = extras["probe_actual_s"]
        assert slept.shape == (12, 2) and not slept[expected == 0].any()
        assert (slept[expected > 0] >= expected[expected > 0] - 1e-6).all()
