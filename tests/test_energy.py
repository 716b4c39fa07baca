"""Energy: the power profiles, the state accounting, the actuators, the oracle bound, the power cap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pacectl import energy
from pacectl.backends.replay import ReplayBackend
from pacectl.backends.sim import SimBackend
from pacectl.config import CONF_DIR
from pacectl.controllers import SafetyGuard, make_controller
from pacectl.errors import ConfigError
from pacectl.fabric.contention import EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import NOISE_COMPONENTS, ComputeModel
from pacectl.fabric.power import (
    POWER_PROFILES,
    STATES,
    PowerProfile,
    dvfs_table,
    power_profile,
    uniform_profile,
)
from pacectl.fabric.powercap import NodePowerCap
from pacectl.loop import run_episode
from pacectl.testing.episodes import make_episode
from pacectl.types import Action

FAMILIES = ("none", "threshold", "pid", "ewma", "quantile", "forecast")
H100 = power_profile("h100_sxm")


def _sim(
    *, actuator: str = "delay", power_cap: NodePowerCap | None = None, num_ranks: int = 8, **kw
) -> SimBackend:
    compute = ComputeModel(
        0.5,
        components=(
            NOISE_COMPONENTS["lognormal"](sigma=0.05),
            NOISE_COMPONENTS["slow_ranks"](ranks=(3,), fraction=1.0, factor=1.2),
        ),
    )
    return SimBackend(
        num_ranks=num_ranks,
        num_iterations=60,
        compute=compute,
        comm=FixedComm(0.05),
        actuator=actuator,
        power_cap=power_cap,
        **kw,
    )


def _run(backend, family: str, **params):  # type: ignore[no-untyped-def]
    if family == "threshold":
        params.setdefault("on_threshold_s", 0.01)
        params.setdefault("off_threshold_s", 0.005)
    return run_episode(backend, lambda: SafetyGuard(make_controller(family, **params)), seed=3)


# --- profiles -------------------------------------------------------------------------------------


def test_shipped_profiles_have_a_source_for_every_number_and_sleep_below_spin() -> None:
    for name, p in POWER_PROFILES.items():
        assert p.name == name
        for key in ("compute_w", "clocks_mhz", "idle_w", "spin_w", "sleep_w", "transfer_w"):
            assert p.sources.get(key), (name, key)
        # a sleeping GPU draws no more than a spinning one, and idle is the floor
        assert p.idle_w <= p.sleep_w <= p.spin_w <= p.compute_w[-1], name
        assert np.all(np.diff(p.compute_w) >= 0) and p.min_clock_frac < 1.0


def test_dvfs_table_follows_f_v_squared_and_is_anchored_at_its_ends() -> None:
    clocks = np.arange(500.0, 2001.0, 100.0)
    p = dvfs_table(clocks, static_w=50.0, max_w=600.0, v_min_frac=0.7, knee_frac=0.5)
    assert p[-1] == pytest.approx(600.0)
    c = clocks / clocks[-1]
    low = c <= 0.5  # voltage at its floor: power linear in f
    assert np.allclose(np.asarray(p)[low], 50.0 + 550.0 * c[low] * 0.49)
    assert np.all(np.diff(p) > 0)


def test_clock_helpers_invert_and_snap_to_allowed_clocks() -> None:
    fracs = H100.clock_fracs
    assert H100.snap_clock_up(fracs[10] - 1e-4) == pytest.approx(fracs[10])
    assert H100.snap_clock_up(fracs[10]) == pytest.approx(fracs[10])
    assert H100.snap_clock_up(0.0) == pytest.approx(fracs[0])
    assert H100.snap_clock_up(2.0) == pytest.approx(1.0)
    watts = H100.compute_power_w(fracs[40])
    assert H100.clock_for_power(watts) == pytest.approx(fracs[40])
    assert H100.clock_for_power(1e6) == pytest.approx(1.0)


def test_bad_profiles_and_names_are_one_line_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"cluster.power must be one of .*did you mean 'h100_sxm'"):
        power_profile("h100_sxn")
    with pytest.raises(ConfigError, match="strictly ascending"):
        PowerProfile("x", "x", (2.0, 1.0), (1.0, 2.0), 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="must not fall"):
        PowerProfile("x", "x", (1.0, 2.0), (2.0, 1.0), 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="spin_w must be a finite power"):
        PowerProfile("x", "x", (1.0, 2.0), (1.0, 2.0), 1.0, float("nan"), 1.0, 1.0)


# --- accounting -----------------------------------------------------------------------------------


def test_states_partition_each_iteration_and_the_total_is_their_sum(st_backend: ReplayBackend) -> None:
    for family in ("none", "forecast"):
        ep = _run(st_backend, family)
        acc = energy.account(ep, H100)
        times = np.sum([acc.time_s[s] for s in STATES], axis=0)
        assert np.allclose(times, ep.iteration_time_s[:, None])  # every rank's iteration, no overlap
        assert np.allclose(acc.total_j, np.sum([acc.energy_j[s] for s in STATES], axis=0))
        assert np.all([(acc.energy_j[s] >= 0).all() for s in STATES])


@pytest.mark.parametrize("actuator", ["delay", "clock"])
@pytest.mark.parametrize("where", ["sim", "replay"])
def test_null_profile_energy_is_no_pacings_times_the_time_ratio(actuator: str, where: str, st_trace) -> None:
    """With every state at the same power, energy is power times rank-time: each controller's energy
    is no pacing's times its time ratio, whatever it does with its delays."""
    flat = uniform_profile(250.0)
    backend = _sim(actuator=actuator) if where == "sim" else ReplayBackend(st_trace, actuator=actuator)
    base = _run(backend, "none")
    e_base = energy.account(base, flat).total_j.sum()
    for family in FAMILIES[1:]:
        ep = _run(backend, family)
        ratio = ep.iteration_time_s.sum() / base.iteration_time_s.sum()
        assert energy.account(ep, flat).total_j.sum() == pytest.approx(e_base * ratio, rel=1e-9), family


@given(
    wait=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6),
    spin=st.floats(0.0, 800.0),
    extra=st.floats(0.0, 800.0),
)
def test_a_sleeping_wait_never_uses_more_energy_than_a_spinning_one(wait, spin, extra) -> None:
    """Same episode, same wait lengths: marking the waits sleeping never raises the energy, for any
    profile whose sleeping power is at most its spinning power."""
    arrival = np.max(wait) - np.asarray(wait)  # waits = latest arrival minus each arrival
    ep = make_episode([arrival.tolist()], iteration_time_s=[float(np.max(wait)) + 1.0])
    profile = H100.with_powers(sleep_w=spin, spin_w=spin + extra)
    spinning = energy.account(ep, profile).total_j.sum()
    sleeping_ep = dataclasses.replace(ep, wait_asleep=np.ones((1, ep.num_domains), dtype=bool))
    sleeping = energy.account(sleeping_ep, profile)
    assert sleeping.total_j.sum() <= spinning + 1e-9
    assert sleeping.time_s["spin_wait"].sum() == 0.0
    assert sleeping.time_s["sleep_wait"].sum() == pytest.approx(ep.wait_s.sum())


def test_sleep_wait_controller_spends_no_more_energy_than_no_pacing() -> None:
    """controller=sleep_wait (Action.wait='sleep'): same timing in max-plus, waits at the sleeping power."""
    backend = _sim()
    base, asleep = _run(backend, "none"), _run(backend, "sleep_wait")
    assert np.array_equal(base.iteration_time_s, asleep.iteration_time_s)
    assert asleep.wait_asleep is not None and asleep.wait_asleep[1:].all()
    e_base, e_asleep = (energy.account(ep, H100) for ep in (base, asleep))
    assert e_asleep.total_j.sum() < e_base.total_j.sum()
    assert e_asleep.energy_j["sleep_wait"].sum() > 0.0


def test_energy_summary_fields_and_the_paired_interval() -> None:
    backend = _sim()
    eps = {f: _run(backend, f) for f in ("none", "threshold")}
    per_run, vs, top = energy.energy_summary(eps, H100)
    s = per_run["none"]
    assert s["energy_total_j"] == pytest.approx(sum(s["energy_by_state_j"].values()))
    assert s["energy_per_iteration_j"] == pytest.approx(s["energy_total_j"] / 60)
    assert sum(s["energy_per_rank_j"].values()) == pytest.approx(s["energy_total_j"])
    assert s["power_profile"] == "h100_sxm"
    change = vs["threshold"]
    assert change["energy_change_frac"] == pytest.approx(
        per_run["threshold"]["energy_total_j"] / s["energy_total_j"] - 1.0
    )
    assert change["energy_change_ci95_frac"] >= 0.0
    # the spinning power is assumed: at the sleeping power, sleeping instead of spinning saves nothing
    sweep = top["energy_vs_spin_w"]["by_spin_w"]
    assert set(sweep) == {f"{w:g}" for w in energy.spin_power_range(H100)}
    assert top["power"]["sources"]["spin_w"].startswith("assumed")


# --- actuators ------------------------------------------------------------------------------------


def test_clock_actuator_keeps_the_simulators_timing_and_spends_no_more_energy() -> None:
    for family in FAMILIES[1:]:
        delay = _run(_sim(actuator="delay"), family)
        clock = _run(_sim(actuator="clock"), family)
        assert np.array_equal(delay.iteration_time_s, clock.iteration_time_s)
        assert np.array_equal(delay.arrival_s, clock.arrival_s)
        assert clock.actuator == "clock"
        assert (clock.clock_frac >= H100.min_clock_frac - 1e-12).all() and (clock.clock_frac <= 1.0).all()
        # every clock is one the GPU type allows
        assert np.isin(np.round(clock.clock_frac, 9), np.round(H100.clock_fracs, 9)).all()
        assert energy.account(clock, H100).total_j.sum() <= energy.account(delay, H100).total_j.sum() + 1e-6


def test_clock_actuator_in_replay_never_moves_an_arrival_past_its_delay(st_trace) -> None:
    """One clock per pipeline, slowed at most by the smallest delay over its stages' natural arrivals:
    the stages of a pipeline cannot compound each other's slowdown past what was asked, so every
    arrival lies between the natural one and the delay actuator's, and the iteration is no longer."""
    delay_backend, clock_backend = ReplayBackend(st_trace), ReplayBackend(st_trace, actuator="clock")
    delay_backend.reset()
    clock_backend.reset()
    rng = np.random.default_rng(1)
    slowed = 0
    for _ in range(delay_backend.num_iterations):
        actions = [Action(rng.uniform(0.0, 0.3, len(d.ranks))) for d in delay_backend.domains]
        by_delay, by_clock = delay_backend.step(actions), clock_backend.step(actions)
        assert by_clock[0].iteration_time_s <= by_delay[0].iteration_time_s + 1e-9
        for d, c in zip(by_delay, by_clock, strict=True):
            assert np.all(c.arrival_s <= d.arrival_s + 1e-9)
            assert np.all(c.arrival_s >= d.natural_arrival_s - 1e-9)
            assert np.all(c.compute.sleep_s <= d.applied_delay_s + 1e-12)
            slowed += int((c.compute.clock_frac < 1.0).sum())
    assert slowed > 0


def test_bad_actuator_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"backend.actuator must be one of \['delay', 'clock'\]"):
        _sim(actuator="dvfs")


# --- the oracle bound -----------------------------------------------------------------------------


@pytest.mark.parametrize("actuator", ["delay", "clock"])
@pytest.mark.parametrize("where", ["sim", "replay"])
def test_no_controller_exceeds_the_oracle_bound(actuator: str, where: str, st_trace) -> None:
    """Fixed durations (max-plus): each iteration's saving of every controller is at most the bound's
    for that iteration, and so is the total."""
    backend = _sim(actuator=actuator) if where == "sim" else ReplayBackend(st_trace, actuator=actuator)
    base = _run(backend, "none")
    bound = energy.oracle_saving(base, H100)
    assert bound.sum() > 0
    base_it = energy.account(base, H100).per_iteration_j
    for family in FAMILIES[1:]:
        ep = _run(backend, family)
        saved = base_it - energy.account(ep, H100).per_iteration_j
        assert np.all(saved <= bound.sum(axis=1) + 1e-6), family
        reached = energy.energy_comparison(base, {family: ep}, H100)[family]["oracle_bound_reached_frac"]
        assert reached <= 1.0 + 1e-9


def test_oracle_bound_is_zero_without_slack() -> None:
    backend = SimBackend(num_ranks=8, num_iterations=20, compute=ComputeModel(0.5), comm=FixedComm(0.05))
    base = _run(backend, "none")
    assert np.all(base.wait_s == 0.0)
    assert energy.oracle_saving(base, H100).sum() == 0.0
    ep = make_episode([[0.3, 0.3, 0.3]], iteration_time_s=[1.0])
    assert energy.bound_summary(ep, H100)["oracle_saving_j"] == 0.0


def test_oracle_bound_of_one_rank_in_closed_form() -> None:
    """Rank 0 computes 1 s and waits 1 s for rank 1: its best is the slowest clock at or above 1/2."""
    ep = make_episode([[1.0, 2.0]], iteration_time_s=[2.0])
    saving = energy.oracle_saving(ep, H100)[0]
    c = H100.snap_clock_up(0.5)
    best = min(
        float(H100.compute_power_w(x)) / x + H100.sleep_w * (2.0 - 1.0 / x)
        for x in [*H100.clock_fracs[H100.clock_fracs >= c], 0.5]
    )
    assert saving[0] == pytest.approx(H100.compute_w[-1] + H100.spin_w - best)
    assert saving[1] == 0.0


# --- the power-coupled straggler ------------------------------------------------------------------


def test_power_cap_off_reproduces_the_simulator_exactly() -> None:
    """Switched off, the simulator is today's: ``max(W + d) + comm`` (an independent re-statement
    here), bit for bit, with or without the energy fields' machinery."""
    rng = np.random.default_rng(0)
    compute = ComputeModel(0.5, components=(NOISE_COMPONENTS["lognormal"](sigma=0.1),))
    kw = dict(num_ranks=8, num_iterations=30, compute=compute, comm=FixedComm(0.05))
    plain = SimBackend(**kw)
    off = SimBackend(**kw, power_cap=None, power=power_profile("a100_sxm"))
    work = compute.sample(np.random.default_rng(5), 30, 8)
    plain.reset(seed=5)
    off.reset(seed=5)
    for k in range(30):
        delay = rng.uniform(0.0, 0.05, 8)
        a = plain.step([Action(delay)])[0]
        b = off.step([Action(delay)])[0]
        expected = float(np.max(work[k] + delay)) + 0.05
        assert a.iteration_time_s == b.iteration_time_s == expected
        assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.natural_arrival_s, work[k])
    assert "node_power_cap" not in off.mechanisms and off.comm_timing_dependent is False


def test_power_cap_that_never_binds_changes_nothing_but_rounding() -> None:
    loose = NodePowerCap(node_w=1e5, ranks_per_node=4, profile=H100)
    assert not loose.binding()
    a, b = _run(_sim(), "threshold"), _run(_sim(power_cap=loose), "threshold")
    assert np.allclose(a.iteration_time_s, b.iteration_time_s, rtol=1e-12, atol=1e-12)


def test_a_sleeping_leader_speeds_up_the_straggler_under_a_node_cap() -> None:
    """Two GPUs on a 600 W node: once the leader is done, the straggler gets what the leader does not
    draw; a leader that sleeps (a pacing delay) draws less than one that spins, so the straggler
    finishes sooner and the iteration is shorter, although the delay is within the leader's earliness."""
    cap = NodePowerCap(node_w=600.0, ranks_per_node=2, profile=H100)
    work = np.array([1.0, 2.0])
    spinning = cap.run(work, np.zeros(2))
    sleeping = cap.run(work, np.array([0.5, 0.0]))
    assert sleeping.finish_s[0] == pytest.approx(spinning.finish_s[0])
    assert sleeping.finish_s[1] < spinning.finish_s[1]
    assert sleeping.arrival_s[0] <= sleeping.finish_s[1]  # the delay is within its earliness
    # the whole node never draws more than the cap while the straggler computes (none at the floor)
    assert spinning.over_cap_s.sum() == 0.0
    # the compute energy is the integral of the clock's power: the straggler's work at its clocks
    assert np.all(spinning.compute_energy_j > 0)


def test_power_cap_in_the_simulator_is_a_named_timing_dependent_mechanism() -> None:
    cap = NodePowerCap(node_w=2400.0, ranks_per_node=4, profile=H100)
    backend = _sim(power_cap=cap)
    assert "node_power_cap" in backend.mechanisms and backend.comm_timing_dependent
    assert "node_power_cap" in backend.comm_description
    base = _run(backend, "none")
    paced = _run(backend, "threshold")
    # under the cap the state times still partition each iteration
    acc = energy.account(paced, H100)
    assert np.allclose(np.sum([acc.time_s[s] for s in STATES], axis=0), paced.iteration_time_s[:, None])
    assert base.compute_energy_j is not None and (base.compute_energy_j > 0).all()


def test_power_cap_with_interference_and_the_clock_actuator_runs() -> None:
    cap = NodePowerCap(node_w=2400.0, ranks_per_node=4, profile=H100)
    backend = _sim(power_cap=cap, actuator="clock", interference=EarlyArrivalInterference(0.05, 4))
    ep = _run(backend, "threshold")
    assert np.isfinite(ep.iteration_time_s).all() and (ep.arrival_s >= ep.natural_arrival_s - 1e-12).all()


# --- the run's outputs (the contract) ------------------------------------------------------------


def _compose(*overrides: str):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_replay_reports_energy_per_run_and_against_no_pacing(tmp_path: Path) -> None:
    """The contract: ``python -m pacectl.run hydra.run.dir=DIR`` (the default AR replay) writes each
    run's ``energy_total_j`` and ``energy_per_iteration_j`` and ``vs_baseline.<run>.energy_change_frac``;
    the no-pacing run's energy is the sum of its states'."""
    from pacectl import run

    run.run_experiment(_compose("output.iterations=false"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name, s in summary["runs"].items():
        assert s["energy_total_j"] > 0 and s["energy_per_iteration_j"] > 0, name
        assert s["power_profile"] == "h100_sxm"
    none = summary["runs"]["none"]
    assert none["energy_total_j"] == pytest.approx(sum(none["energy_by_state_j"].values()), rel=1e-12)
    for name, vs in summary["vs_baseline"].items():
        assert vs["energy_change_frac"] == pytest.approx(
            summary["runs"][name]["energy_total_j"] / none["energy_total_j"] - 1.0
        )
        assert vs["oracle_bound_reached_frac"] <= 1.0
    assert summary["energy_bound"]["oracle_saving_j"] > 0
    assert summary["power"]["name"] == "h100_sxm" and summary["actuators"] == ["delay"]
    assert (tmp_path / "energy.png").is_file()
    text = (tmp_path / "report.md").read_text()
    assert "power profile h100_sxm" in text and "ΔE (%)" in text and "energy.png" in text


def test_both_actuators_side_by_side_in_sim(tmp_path: Path) -> None:
    from pacectl import report, run

    cfg = _compose(
        "backend=sim",
        "backend.num_ranks=8",
        "backend.num_iterations=40",
        "backend.actuator=both",
        "controller=threshold",
        "cluster.power=a100_sxm",
        "cluster.power_cap.node_w=2000",
        "output.plots=false",
        "output.iterations=false",
    )
    summary = run.run_experiment(cfg, tmp_path)
    assert list(summary["runs"]) == ["none", "threshold", "threshold@clock"]
    assert summary["runs"]["threshold@clock"]["actuator"] == "clock"
    assert summary["power"]["name"] == "a100_sxm"
    assert "node_power_cap" in summary["sim"]["mechanisms"]
    table = report.format_console_table(summary["runs"])
    assert "energy: power profile a100_sxm" in table and "threshold@clock" in table


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.power=h100", "cluster.power must be one of"),
        ("cluster.power_cap.node_w=-5", "cluster.power_cap.node_w must be a finite power > 0 W, or null"),
        ("backend.actuator=dvfs", "backend.actuator must be one of"),
    ],
)
def test_energy_settings_are_checked(tmp_path: Path, override: str, message: str) -> None:
    from pacectl import run

    cfg = _compose("backend=sim", "backend.num_ranks=4", "backend.num_iterations=5", override)
    with pytest.raises(ConfigError, match=message):
        run.run_experiment(cfg, tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_domains_with_their_own_clocks_account_each_ranks_own_iteration() -> None:
    """Several jobs on one fabric: a domain's k-th iteration has its own length; every rank's states
    fill its own domain's iteration, not the row's mean."""
    ep = make_episode([[0.0, 0.5, 0.1, 0.1]], iteration_time_s=[1.5], domain_of_rank=[0, 0, 1, 1])
    own = dataclasses.replace(ep, domain_iteration_time_s=np.array([[1.0, 2.0]]))
    acc = energy.account(own, uniform_profile(100.0))
    assert np.allclose(np.sum([acc.time_s[s] for s in STATES], axis=0), [[1.0, 1.0, 2.0, 2.0]])
