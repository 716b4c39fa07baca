"""sleep_wait (how a rank waits is part of the action) and phase (a job-level shift): contracts,
propagation through the guard, the units wrapper and the loop, and what each backend makes of them."""

from __future__ import annotations

import numpy as np
import pytest

from pacectl.backends.sim import SimBackend
from pacectl.controllers import (
    IterationUnits,
    NoPacing,
    PhaseController,
    SafetyGuard,
    SleepWait,
    make_controller,
)
from pacectl.errors import ConfigError, ControllerError
from pacectl.fabric.contention import EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import ComputeModel, LognormalJitter, SlowRanks
from pacectl.loop import ExchangeSchedule, run_episode
from pacectl.testing import ControllerContract, make_observation
from pacectl.types import Action, Controller, Observation

RNG = np.random.default_rng(0)


# (sleep_wait and phase at their defaults: tests/test_controllers.py runs every registered family's contract)
class TestPhaseAlwaysShiftsContract(ControllerContract):
    expects_pacing = False
    job_level = True

    def make_controller(self) -> Controller:
        return PhaseController(shift_prob=1.0, horizon_iters=2, hold_iters=3, switch_off_iters=None)


# --- the wait mode travels with the action -----------------------------------------------------------


def test_action_refuses_an_unknown_wait() -> None:
    with pytest.raises(ControllerError, match=r"Action.wait must be one of \['spin', 'sleep'\], got 'doze'"):
        Action(np.zeros(2), "doze")
    assert Action.zeros(3).wait == "spin" and Action.zeros(3, wait="sleep").wait == "sleep"


def test_guard_and_units_pass_the_wait_through() -> None:
    obs = make_observation([0.5, 0.6, 0.7])
    for wrapped in (
        SafetyGuard(SleepWait()),
        IterationUnits(SleepWait()),
        SafetyGuard(IterationUnits(SleepWait())),
    ):
        wrapped.reset(3, RNG)
        assert wrapped.act(obs).wait == "sleep"
    plain = SafetyGuard(NoPacing())
    plain.reset(3, RNG)
    assert plain.act(obs).wait == "spin"


class _BadWait(NoPacing):
    name = "bad_wait"
    wait = "doze"  # Action() refuses it: the guard turns the failure into zero delay, spinning


def test_guard_zeroes_a_bad_wait_and_a_disabled_guard_spins() -> None:
    guard = SafetyGuard(_BadWait())
    guard.reset(2, RNG)
    with pytest.warns(UserWarning, match="wait must be one of"):
        action = guard.act(make_observation([0.5, 0.6]))
    assert action.wait == "spin" and guard.diagnostics()["guard_interventions"] == 1.0
    off = SafetyGuard(SleepWait(), enabled=False)
    off.reset(2, RNG)
    assert off.act(make_observation([0.5, 0.6])).wait == "spin"


def test_make_controller_knows_both() -> None:
    assert make_controller("sleep_wait").name == "sleep_wait"
    assert make_controller("phase", shift_prob=0.25).shift_prob == 0.25
    assert make_controller("sleep_wait", units="iteration").act  # the units wrapper takes it too


# --- the simulator: sleep_wait removes exactly the interference term ----------------------------------


def _sim(kappa: float, *, seed_iters: int = 60, ranks: int = 16) -> SimBackend:
    compute = ComputeModel(0.2, (LognormalJitter(0.05), SlowRanks(fraction=0.125, factor=1.2)))
    return SimBackend(
        num_ranks=ranks,
        num_iterations=seed_iters,
        compute=compute,
        comm=FixedComm(0.02),
        interference=EarlyArrivalInterference(kappa, ranks_per_node=8),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sleep_wait_equals_the_same_sim_without_interference(seed: int) -> None:
    """The only timing-dependent mechanism here is interference (fixed comm, kappa > 0): sleeping
    waiters remove it exactly, so sleep_wait's iterations are those of kappa = 0, bit for bit, from
    its first decision on (iteration 0 runs before any decision, spinning, as no pacing does)."""
    asleep = run_episode(_sim(0.05), lambda: SafetyGuard(SleepWait()), seed=seed)
    quiet = run_episode(_sim(0.0), lambda: SafetyGuard(NoPacing()), seed=seed)
    spinning = run_episode(_sim(0.05), lambda: SafetyGuard(NoPacing()), seed=seed)
    np.testing.assert_array_equal(asleep.iteration_time_s[1:], quiet.iteration_time_s[1:])
    np.testing.assert_array_equal(asleep.natural_arrival_s[1:], quiet.natural_arrival_s[1:])
    assert asleep.iteration_time_s[0] == spinning.iteration_time_s[0]
    assert asleep.wait_asleep is not None and asleep.wait_asleep[1:].all() and not asleep.wait_asleep[0].any()
    # and there is a term to remove: spinning waiters slow the late ranks
    assert spinning.iteration_time_s.sum() > quiet.iteration_time_s.sum()


def test_sleep_wait_is_no_pacing_without_interference() -> None:
    a = run_episode(_sim(0.0), lambda: SafetyGuard(SleepWait()), seed=4)
    b = run_episode(_sim(0.0), lambda: SafetyGuard(NoPacing()), seed=4)
    np.testing.assert_array_equal(a.iteration_time_s, b.iteration_time_s)


def test_replay_sleep_wait_equals_no_pacing(st_backend) -> None:  # type: ignore[no-untyped-def]
    a = run_episode(st_backend, lambda: SafetyGuard(SleepWait()), num_iterations=20)
    b = run_episode(st_backend, lambda: SafetyGuard(NoPacing()), num_iterations=20)
    np.testing.assert_array_equal(a.iteration_time_s, b.iteration_time_s)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)


def test_interference_comes_only_from_spinning_waiters() -> None:
    model = EarlyArrivalInterference(0.1, ranks_per_node=4)
    work = np.array([0.5, 0.6, 0.7, 0.8])
    delay = np.zeros(4)
    spinning = model.finish_s(work, delay)
    assert (spinning > work).any()
    np.testing.assert_array_equal(model.finish_s(work, delay, spinning=False), work)
    # only rank 0 spins: rank s is slowed by kappa * (W_s - W_0) for every s > 0
    partly = model.finish_s(work, delay, spinning=np.array([True, False, False, False]))
    np.testing.assert_allclose(partly, work + 0.1 * np.maximum(0.0, work - work[0]))


# --- phase: a one-time job-level shift ---------------------------------------------------------------


def _obs(k: int, collective_s: float, n: int = 4) -> Observation:
    return make_observation(np.full(n, 0.5), iteration=k, collective_time_s=collective_s)


def test_phase_shifts_by_the_excess_then_holds_zero() -> None:
    c = PhaseController(shift_prob=1.0, switch_off_iters=None)
    c.reset(4, np.random.default_rng(1))
    assert c.act(_obs(0, 0.10)).delay_s.max() == 0.0  # the first figure is the quiet estimate
    shifted = c.act(_obs(1, 0.16)).delay_s
    np.testing.assert_allclose(shifted, 0.06)  # the excess, on every rank alike
    assert c.diagnostics()["shifts"] == 1.0 and c.diagnostics()["active"] == 1.0
    for k in range(2, 10):  # interleaved: quiet again, no more delay (a delay every iteration
        assert c.act(_obs(k, 0.10)).delay_s.max() == 0.0  # would only lengthen the period)
    assert c.diagnostics()["active"] == 0.0


def test_phase_with_a_profiled_quiet_time_judges_against_it() -> None:
    """Given ``quiet_s`` (measured alone), a collective slowed from the first observation on counts as
    slowed; the window minimum would take that first slowed figure as the quiet time."""
    window = PhaseController(shift_prob=1.0, switch_off_iters=None)
    window.reset(4, np.random.default_rng(1))
    assert [window.act(_obs(k, 0.16)).delay_s.max() for k in range(5)] == [0.0] * 5
    assert window.diagnostics()["quiet_s"] == pytest.approx(0.16)
    profiled = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=None)
    profiled.reset(4, np.random.default_rng(1))
    np.testing.assert_allclose(profiled.act(_obs(0, 0.16)).delay_s, 0.06)
    assert profiled.diagnostics()["quiet_s"] == 0.10
    with pytest.raises(ConfigError, match=r"quiet_s must be"):
        PhaseController(quiet_s=0.0)


def test_phase_waits_out_its_own_lag_before_judging_again() -> None:
    c = PhaseController(shift_prob=1.0, horizon_iters=3, hold_iters=2, switch_off_iters=None)
    c.reset(4, np.random.default_rng(1))
    c.act(_obs(0, 0.1))
    np.testing.assert_allclose(c.act(_obs(1, 0.2)).delay_s, 0.05)  # 0.1 of excess over 2 iterations
    # the next 3 observations predate the shift's full effect: still slowed, but no new shift
    assert [c.act(_obs(k, 0.2)).delay_s.max() for k in range(2, 5)] == [0.0, 0.0, 0.0]
    assert c.act(_obs(5, 0.2)).delay_s.max() > 0.0


def test_phase_backoff_is_seeded_and_breaks_symmetry() -> None:
    """Two identical jobs with different seeds do not shift at the same decisions forever."""
    decisions = []
    for seed in (0, 1):
        c = PhaseController(switch_off_iters=None)
        c.reset(4, np.random.default_rng([7, seed]))
        c.act(_obs(0, 0.1))
        decisions.append([bool(c.act(_obs(k, 0.2)).delay_s.max() > 0) for k in range(1, 40)])
    assert decisions[0] != decisions[1]
    again = PhaseController(switch_off_iters=None)
    again.reset(4, np.random.default_rng([7, 0]))
    again.act(_obs(0, 0.1))
    assert [bool(again.act(_obs(k, 0.2)).delay_s.max() > 0) for k in range(1, 40)] == decisions[0]


def _paid(c: PhaseController, k: int, collective_s: float, delay_s: float) -> float:
    """One observation whose collective took ``collective_s`` after a delay ``delay_s`` on every rank;
    the controller's next delay."""
    obs = make_observation(np.full(4, 0.5), np.full(4, delay_s), iteration=k, collective_time_s=collective_s)
    return float(c.act(obs).delay_s.max())


def test_phase_switch_off_measures_an_unpaced_baseline_first() -> None:
    """Rule 5: the first switch_off_iters observations are the unpaced baseline: slowed collectives
    get no shift there; the first judged window shifts as rule 4 says."""
    c = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=5)
    c.reset(4, np.random.default_rng(1))
    assert [_paid(c, k, 0.16, 0.0) for k in range(4)] == [0.0] * 4
    assert c.diagnostics()["shifts_allowed"] == 0.0 and c.diagnostics()["baseline_cost_s"] == 0.0
    assert _paid(c, 4, 0.16, 0.0) == pytest.approx(0.06)  # the baseline's last figure, then judged
    assert c.diagnostics()["baseline_cost_s"] == pytest.approx(0.16)
    assert c.diagnostics()["shifts_allowed"] == 1.0


def test_phase_switches_off_when_its_shifts_do_not_pay() -> None:
    """Collisions that come back whatever the shift (non-commensurate periods): the judged window's
    cost, collective plus the delay paid, is not below the unpaced baseline's, so the controller
    switches off and applies zero delay from then on, however slowed its collectives."""
    c = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=4)
    c.reset(4, np.random.default_rng(1))
    for k in range(4):  # baseline: cost 0.16
        _paid(c, k, 0.16, 0.0)
    delays = [0.0]
    for k in range(4, 8):  # shifted by the excess each time, and slowed again: cost 0.16 + 0.06
        delays.append(_paid(c, k, 0.16, delays[-1]))
    assert max(delays) == pytest.approx(0.06)
    d = c.diagnostics()
    assert d["switch_offs"] == 1.0 and d["shifts_allowed"] == 0.0
    assert d["trial_cost_s"] > d["baseline_cost_s"]
    assert [_paid(c, k, 0.30, 0.0) for k in range(8, 200)] == [0.0] * 192


def test_phase_stays_on_when_its_shift_pays() -> None:
    """Commensurate periods: one shift, then quiet collectives: the judged window costs less than the
    collided baseline, so the controller commits (explore-then-commit): it is judged no more, and
    corrects later collisions however much they cost."""
    c = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=4)
    c.reset(4, np.random.default_rng(1))
    for k in range(4):
        _paid(c, k, 0.16, 0.0)
    delay = _paid(c, 4, 0.16, 0.0)
    assert delay == pytest.approx(0.06)
    for k in range(5, 12):  # the shift holds: quiet from here, windows [4, 8) and [8, 12) pay
        delay = _paid(c, k, 0.10, delay)
    d = c.diagnostics()
    assert d["switch_offs"] == 0.0 and d["shifts_allowed"] == 1.0
    assert d["trial_cost_s"] < d["baseline_cost_s"]
    assert _paid(c, 12, 0.15, 0.0) == pytest.approx(0.05)  # a drift back into overlap is corrected
    for k in range(13, 40):  # windows costlier than the baseline no longer switch it off
        _paid(c, k, 0.30, 0.2)
    assert c.diagnostics()["switch_offs"] == 0.0 and c.diagnostics()["shifts_allowed"] == 1.0


def test_phase_futility_stop_ends_a_costly_judged_window_early() -> None:
    """futility_z (opt-in): once a quarter of the judged window is in, a running cost above the
    baseline's by more than futility_z baseline standard errors switches the controller off before
    the window ends; without it (the default) the same figures keep it shifting to the window's end."""

    def run(futility_z: float | None) -> list[float]:
        c = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=8, futility_z=futility_z)
        c.reset(4, np.random.default_rng(1))
        for k in range(8):  # baseline: mean 0.16, sd about 0.011
            _paid(c, k, 0.15 if k % 2 else 0.17, 0.0)
        delays = [0.0]
        for k in range(8, 12):  # shifted by the excess each time, and slowed again
            delays.append(_paid(c, k, 0.16, delays[-1]))
        return delays

    stopped = run(2.0)
    assert stopped[1] == pytest.approx(0.06) and stopped[2:] == [0.0, 0.0, 0.0]  # off at judged obs 2
    assert run(None)[1:] == pytest.approx([0.06] * 4)
    with pytest.raises(ConfigError, match=r"futility_z must be"):
        PhaseController(futility_z=0.0)


def test_phase_reprobes_after_reprobe_iters_off() -> None:
    """With reprobe_iters set, a switched-off controller measures a fresh unpaced baseline after that
    many observations and judges again; reset clears the switch-off."""
    c = PhaseController(shift_prob=1.0, quiet_s=0.10, switch_off_iters=2, reprobe_iters=3)
    c.reset(4, np.random.default_rng(1))
    for k in range(4):  # baseline 0.10 (quiet), then a window that pays a shift: off
        _paid(c, k, 0.10 if k < 2 else 0.16, 0.0)
    assert c.diagnostics()["switch_offs"] == 1.0
    assert [_paid(c, k, 0.16, 0.0) for k in range(4, 8)] == [0.0] * 4  # 3 off, 1 of a fresh baseline
    assert _paid(c, 8, 0.16, 0.0) == pytest.approx(0.06)  # its last figure: judged again, shifts
    assert c.diagnostics()["baseline_cost_s"] == pytest.approx(0.16)
    c.reset(4, np.random.default_rng(1))
    assert c.diagnostics()["switch_offs"] == 0.0 and c.diagnostics()["shifts_allowed"] == 0.0
    with pytest.raises(ConfigError, match=r"switch_off_iters must be"):
        PhaseController(switch_off_iters=0)


def test_phase_switches_off_on_the_null_model_and_stays_at_zero() -> None:
    """comm=null through the loop (two jobs sharing nothing): no collective is slowed, the judged
    window equals the baseline, so each job switches off; its delays are zero throughout."""
    from pacectl.backends.multijob import MultiJobSimBackend
    from pacectl.fabric.jobs import JobSpec
    from pacectl.fabric.topology import FatTree

    topo = FatTree(ranks_per_node=2, nodes_per_leaf=2, oversubscription=2.0)
    noise = ComputeModel(0.3, (LognormalJitter(0.03),))
    jobs = [JobSpec("a", (0, 1, 4, 5), noise, 4e9), JobSpec("b", (2, 3, 6, 7), noise, 4e9, start_s=0.05)]
    sim = MultiJobSimBackend(jobs, topo, 8, num_iterations=300, comm="null")
    ep = run_episode(sim, lambda: SafetyGuard(PhaseController(switch_off_iters=50)), seed=0)
    assert ep.applied_delay_s.max() == 0.0
    np.testing.assert_array_equal(ep.diagnostics["switch_offs"][-1], [1.0, 1.0])


def test_phase_through_the_loop_on_a_lone_job_never_shifts() -> None:
    """One job, no other traffic: nothing slows its collective, so it never shifts (a silent zero the
    run turns into a note, tests/test_multijob.py)."""
    ep = run_episode(_sim(0.05), lambda: SafetyGuard(PhaseController()), seed=0)
    assert ep.applied_delay_s.max() == 0.0


def test_held_decisions_keep_their_wait() -> None:
    ep = run_episode(_sim(0.05), lambda: SafetyGuard(SleepWait()), exchange=ExchangeSchedule(lag=2, every=3))
    assert ep.wait_asleep is not None
    assert not ep.wait_asleep[:4].any() and ep.wait_asleep[4:].all()  # first decision: obs 2, paces 4


def test_loop_takes_one_factory_per_domain(st_backend) -> None:  # type: ignore[no-untyped-def]
    n = len(st_backend.domains)
    factories = [lambda: SafetyGuard(SleepWait())] + [lambda: SafetyGuard(NoPacing())] * (n - 1)
    ep = run_episode(st_backend, factories, num_iterations=5)
    assert ep.controller == "sleep_wait"
    assert ep.wait_asleep is not None and ep.wait_asleep[1:, 0].all() and not ep.wait_asleep[:, 1:].any()
    with pytest.raises(ValueError, match="one factory per domain"):
        run_episode(st_backend, factories[:1] * (n + 1), num_iterations=2)


# --- the run: overrides, notes -----------------------------------------------------------------------


def _compose(*overrides: str):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("kappa", [0.0, 0.01, 0.1])
def test_kappa_override_replaces_the_profiles(kappa: float) -> None:
    from pacectl.experiment import SimExperiment

    base = ["backend=sim", "backend.num_ranks=64", "cluster=paper_like", "comm=contention"]
    assert SimExperiment(_compose(*base)).backend.interference.kappa == 0.05  # the profile's
    exp = SimExperiment(_compose(*base, f"cluster.interference.kappa={kappa}"))
    assert exp.backend.interference.kappa == kappa
    assert exp.describe()["sim"]["interference_kappa"] == kappa


def test_every_run_says_whether_its_kappa_is_measured_or_assumed() -> None:
    from pacectl.experiment import SimExperiment

    base = ["backend=sim", "backend.num_ranks=16", "cluster=paper_like", "comm=contention"]
    sim = SimExperiment(_compose(*base)).describe()["sim"]
    assert sim["interference_kappa_source"].startswith("assumed")
    record = "measured: experiments/interference/results/kappa_cpu.json (spin arm)"
    exp = SimExperiment(
        _compose(*base, "cluster.interference.kappa=0.3", f"cluster.interference.kappa_source='{record}'")
    )
    assert exp.describe()["sim"]["interference_kappa_source"] == record
    assert "(kappa 0.3, measured)" in exp.backend.comm_description


def test_phase_alone_warns_and_sleep_wait_says_what_it_changes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pacectl import run

    cfg = _compose(
        "backend=sim",
        "backend.num_ranks=16",
        "backend.num_iterations=20",
        "cluster=contended",
        "comm=contention",
        "controller=all",
        "controller.families=[phase,sleep_wait]",
        "output.plots=false",
        "output.iterations=false",
    )
    summary = run.run_experiment(cfg, tmp_path)
    phase = [w for w in summary["warnings"] if "phase: no other traffic" in w]
    assert len(phase) == 1 and "a job-level shift cannot change any duration here" in phase[0]
    assert summary["runs"]["phase"]["pacing_delay_total_s"] == 0.0
    assert summary["notes"] == [
        "sleep_wait: it removes exactly the early-arrival interference term (kappa 0.05, spinning "
        "waiters only): the bar a per-rank controller must beat on this run"
    ]
    assert summary["runs"]["sleep_wait"]["wait_asleep_frac"] > 0.9
    assert "sleep_wait" not in summary.get("never_paced", "")  # it changed how ranks wait
    assert (
        summary["runs"]["sleep_wait"]["throughput_it_per_s"] > summary["runs"]["none"]["throughput_it_per_s"]
    )


def test_replay_notes_for_sleep_wait_and_phase() -> None:
    from pacectl.experiment import ReplayExperiment, controller_notes

    exp = ReplayExperiment(_compose("trace=st", "analysis.whatif=false"))
    warned, noted = controller_notes(exp, {"none": {}, "phase": {}, "sleep_wait": {}})
    assert warned and "one recorded job replayed with fixed durations, comm=null" in warned[0]
    assert noted == [
        "sleep_wait: the replay models no early-arrival interference (max-plus; comm=contention in "
        "replay models link sharing only), so sleep_wait equals no pacing here"
    ]
    assert controller_notes(exp, {"none": {}, "threshold": {}}) == ([], [])
