"""Tests of the safety guard: contract, failure handling, caps and the runtime switch."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from pacectl.controllers import (
    EwmaController,
    NoPacing,
    PacingGuardWarning,
    PidController,
    SafetyGuard,
    ThresholdController,
)
from pacectl.errors import ConfigError, ControllerError
from pacectl.testing import ControllerContract, make_observation
from pacectl.types import Action, Controller, Observation

RNG = np.random.default_rng(0)


class Scripted:
    """A fake inner controller: returns ``delay`` (or raises ``error``) and counts its calls."""

    name = "scripted"

    def __init__(self, delay: object = (0.1, 0.0), error: Exception | None = None) -> None:
        self.delay, self.error, self.calls = delay, error, 0

    def reset(self, num_ranks: int, rng: np.random.Generator) -> None:
        self.calls = 0

    def act(self, obs: Observation) -> Action:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return Action(np.asarray(self.delay, dtype=np.float64))

    def diagnostics(self) -> dict[str, float]:
        return {"active": 1.0, "calls": float(self.calls)}


def guarded(inner: Controller, num_ranks: int = 2, **params: object) -> SafetyGuard:
    guard = SafetyGuard(inner, **params)  # type: ignore[arg-type]
    guard.reset(num_ranks, RNG)
    return guard


def obs(natural: tuple[float, ...] = (0.5, 0.6), iteration_time_s: float = 1.0) -> Observation:
    return make_observation(list(natural), iteration_time_s=iteration_time_s)


# --- contract -------------------------------------------------------------------------------------


class TestGuardedThresholdContract(ControllerContract):
    def make_controller(self) -> Controller:
        return SafetyGuard(ThresholdController())


class TestGuardedPidContract(ControllerContract):
    def make_controller(self) -> Controller:
        return SafetyGuard(PidController(kp=2.0, output_limit_s=1.0), max_delay_frac=0.05)


class TestGuardedEwmaContract(ControllerContract):
    def make_controller(self) -> Controller:
        return SafetyGuard(EwmaController(), max_delay_s=0.01, window_iters=4)


class TestGuardedNoneContract(ControllerContract):
    expects_pacing = False

    def make_controller(self) -> Controller:
        return SafetyGuard(NoPacing())


# --- behaviour ------------------------------------------------------------------------------------


def test_guard_takes_inner_name_and_merges_diagnostics() -> None:
    guard = guarded(Scripted())
    assert guard.name == "scripted"
    guard.act(obs())
    diagnostics = guard.diagnostics()
    assert diagnostics["calls"] == 1.0 and diagnostics["active"] == 1.0
    assert {"guard_interventions", "guard_clipped", "guard_cap_s", "guard_enabled"} <= set(diagnostics)


def test_passes_valid_action_through() -> None:
    guard = guarded(Scripted(delay=(0.1, 0.0)))
    np.testing.assert_array_equal(guard.act(obs()).delay_s, [0.1, 0.0])
    assert guard.diagnostics()["guard_interventions"] == 0.0
    assert guard.diagnostics()["guard_clipped"] == 0.0


@pytest.mark.parametrize(
    ("delay", "reason"),
    [
        ((np.nan, 0.0), "non-finite"),
        ((np.inf, 0.0), "non-finite"),
        ((-0.1, 0.0), "negative"),
        ((0.1, 0.0, 0.0), "shape"),
        ("garbage", "raised"),
    ],
)
def test_bad_action_gives_zeros_warning_and_count(delay: object, reason: str) -> None:
    guard = guarded(Scripted(delay=delay))
    with pytest.warns(PacingGuardWarning, match=reason):
        action = guard.act(obs())
    np.testing.assert_array_equal(action.delay_s, [0.0, 0.0])
    diagnostics = guard.diagnostics()
    assert diagnostics["guard_interventions"] == 1.0
    assert diagnostics["active"] == 0.0


def test_exception_gives_zeros_and_keeps_running() -> None:
    guard = guarded(Scripted(error=ZeroDivisionError("boom")))
    for _ in range(3):
        with pytest.warns(PacingGuardWarning, match="ZeroDivisionError: boom"):
            np.testing.assert_array_equal(guard.act(obs()).delay_s, 0.0)
    assert guard.diagnostics()["guard_interventions"] == 3.0


@pytest.mark.parametrize("field", ["natural_arrival_s", "arrival_s", "wait_s", "iteration_time_s"])
def test_non_finite_observation_skips_inner(field: str) -> None:
    inner = Scripted()
    guard = guarded(inner)
    good = obs()
    value = np.array([0.5, np.nan]) if field != "iteration_time_s" else float("inf")
    bad = Observation(**{**vars(good), field: value})
    with pytest.warns(PacingGuardWarning, match="non-finite"):
        np.testing.assert_array_equal(guard.act(bad).delay_s, 0.0)
    assert inner.calls == 0
    assert guard.diagnostics()["guard_interventions"] == 1.0


def test_cap_is_fraction_of_median_iteration_time() -> None:
    guard = guarded(Scripted(delay=(10.0, 0.0)), max_delay_frac=0.5, window_iters=3)
    assert guard.diagnostics()["guard_cap_s"] == 0.0  # before any observation
    np.testing.assert_array_equal(guard.act(obs(iteration_time_s=1.0)).delay_s, [0.5, 0.0])
    guard.act(obs(iteration_time_s=3.0))
    np.testing.assert_array_equal(guard.act(obs(iteration_time_s=2.0)).delay_s, [1.0, 0.0])  # median 2
    # The window holds the last 3 iteration times: (3, 2, 100) -> median 3.
    np.testing.assert_array_equal(guard.act(obs(iteration_time_s=100.0)).delay_s, [1.5, 0.0])
    diagnostics = guard.diagnostics()
    assert diagnostics["guard_clipped"] == 4.0
    assert diagnostics["guard_interventions"] == 0.0


def test_absolute_cap() -> None:
    guard = guarded(Scripted(delay=(10.0, 0.0)), max_delay_s=0.05)
    np.testing.assert_array_equal(guard.act(obs()).delay_s, [0.05, 0.0])


def test_clipping_does_not_warn() -> None:
    guard = guarded(Scripted(delay=(10.0, 0.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PacingGuardWarning)
        guard.act(obs())
        guard.act(obs())
    assert guard.diagnostics()["guard_clipped"] == 2.0


def test_disabled_gives_zeros_without_calling_inner() -> None:
    inner = Scripted(delay=(0.1, 0.0))
    guard = guarded(inner, enabled=False)
    np.testing.assert_array_equal(guard.act(obs()).delay_s, 0.0)
    assert inner.calls == 0
    assert guard.diagnostics()["active"] == 0.0 and guard.diagnostics()["guard_enabled"] == 0.0
    guard.enabled = True
    np.testing.assert_array_equal(guard.act(obs()).delay_s, [0.1, 0.0])
    assert guard.diagnostics()["guard_enabled"] == 1.0


def test_deterministic_across_instances_and_pickle() -> None:
    rng = np.random.default_rng(3)
    naturals = 0.5 + rng.exponential(0.05, size=(50, 4))
    times = 1.0 + rng.exponential(0.2, size=50)
    guards = [guarded(ThresholdController(smoothing=0.0), num_ranks=4, max_delay_frac=0.05) for _ in range(2)]
    for k, (natural, t) in enumerate(zip(naturals, times, strict=True)):
        if k == 25:
            guards[1] = pickle.loads(pickle.dumps(guards[1]))
        a, b = (g.act(make_observation(natural, iteration=k, iteration_time_s=t)).delay_s for g in guards)
        np.testing.assert_array_equal(a, b)
    assert guards[0].diagnostics() == guards[1].diagnostics()
    assert guards[0].diagnostics()["guard_clipped"] > 0


def test_call_order_and_shape_errors_raise() -> None:
    guard = SafetyGuard(Scripted())
    with pytest.raises(ControllerError, match="before reset"):
        guard.act(obs())
    guard.reset(2, RNG)
    with pytest.raises(ControllerError, match=r"shape \(2,\)"):
        guard.act(obs((0.5, 0.6, 0.7)))


def test_reset_clears_counters() -> None:
    guard = guarded(Scripted(delay=(np.nan, 0.0)))
    with pytest.warns(PacingGuardWarning):
        guard.act(obs())
    guard.reset(2, RNG)
    diagnostics = guard.diagnostics()
    assert diagnostics["guard_interventions"] == 0.0 and diagnostics["guard_cap_s"] == 0.0


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"max_delay_frac": 0.0}, "max_delay_frac must be > 0, got 0.0"),
        ({"max_delay_s": -1.0}, "max_delay_s must be > 0, got -1.0"),
        ({"window_iters": 0}, "window_iters must be an integer >= 1, got 0"),
    ],
)
def test_guard_validation(params: dict[str, object], shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        SafetyGuard(Scripted(), **params)  # type: ignore[arg-type]
    assert shown in str(info.value)


def test_guard_rejects_non_controller() -> None:
    with pytest.raises(ConfigError, match="Controller"):
        SafetyGuard(object())  # type: ignore[arg-type]


def test_guard_median_is_bit_identical_to_numpy() -> None:
    """The guard's fast window median must give exactly np.median (decisions are compared bitwise)."""
    from pacectl.controllers.guard import _median

    rng = np.random.default_rng(11)
    for n in range(1, 66):
        for _ in range(20):
            x = rng.lognormal(size=n) * 10.0 ** float(rng.integers(-6, 3))
            assert _median(x) == float(np.median(x))
