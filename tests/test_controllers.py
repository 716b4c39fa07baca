"""Contract and behaviour tests for the built-in controllers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.controllers import (
    CONTROLLERS,
    EwmaController,
    ForecastController,
    NoPacing,
    PidController,
    QuantileController,
    ThresholdController,
    make_controller,
)
from pacectl.controllers import quantile as quantile_module
from pacectl.errors import ConfigError, ControllerError
from pacectl.testing import ControllerContract, make_observation
from pacectl.testing.controller_contract import NUM_ITERATIONS, registered_contracts
from pacectl.testing.observations import run_closed_loop, synthetic_natural_arrivals
from pacectl.types import Controller, Observation

RNG = np.random.default_rng(0)


def spread_obs(spread_s: float, *, iteration: int = 0, iteration_time_s: float = 1.0) -> Observation:
    """Two ranks: rank 0 early by ``spread_s``, rank 1 the latest."""
    return make_observation([0.5, 0.5 + spread_s], iteration=iteration, iteration_time_s=iteration_time_s)


# --- contract -------------------------------------------------------------------------------------
# Every registered family runs the contract at its defaults (registered_contracts, added at the end
# of this section); the classes here add other settings, or replace a family's default contract by
# its class name (TestForecastControllerContract).


class TestThresholdNoSmoothingContract(ControllerContract):
    def make_controller(self) -> Controller:
        return ThresholdController(on_threshold_s=0.03, off_threshold_s=0.03, gain=1.0, smoothing=0.0)


class TestPidContract(ControllerContract):
    def make_controller(self) -> Controller:
        return PidController(kd=0.2)


class TestPidFixedStepContract(ControllerContract):
    def make_controller(self) -> Controller:
        return PidController(kp=1.0, ki=0.5, kd=0.1, dt_s=0.6)


class TestQuantileThresholdContract(ControllerContract):
    def make_controller(self) -> Controller:
        return QuantileController(window_iters=1, quantile=1.0, gain=0.5, on_threshold_s=0.01)


class TestForecastControllerContract(ControllerContract):
    def make_controller(self) -> Controller:
        return ForecastController()

    @pytest.mark.parametrize("num_ranks", [2, 8])
    def test_paces_on_stragglers(self, num_ranks: int) -> None:
        """The shipped defaults pace a persistent straggler's early ranks from the end of the warm-up;
        where transient stragglers make the earliness noisier than the persistent lead (the contract's
        data at 8 ranks: forecast-error SD above its 50 ms), the 1-SD margin withholds every delay."""
        rng = np.random.default_rng(3)
        naturals = 0.5 + rng.normal(0.0, 0.002, (NUM_ITERATIONS, num_ranks))
        naturals[:, -1] += 0.05  # the persistent straggler alone
        delays = np.array(run_closed_loop(self._fresh(num_ranks), naturals))
        warmup = ForecastController().warmup_iters
        assert (delays[warmup:, :-1] > 0.04).all() and not delays[:, -1].any()
        noisy = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=3)
        controller = self._fresh(num_ranks)
        delays = np.array(run_closed_loop(controller, noisy))
        if num_ranks == 8:
            assert not delays.any() and controller.diagnostics()["sigma_h_s"] > 0.05
        else:
            assert delays.any()


class TestForecastNoMarginContract(ControllerContract):
    def make_controller(self) -> Controller:
        return ForecastController(horizon_iters=3, alpha=0.3, margin_sigmas=0.0, warmup_iters=2)


class TestThresholdIterationUnitsContract(ControllerContract):
    def make_controller(self) -> Controller:
        return make_controller("threshold", units="iteration", on_threshold_s=0.01, off_threshold_s=0.005)


class TestPhaseControllerContract(ControllerContract):
    """phase at its defaults, except a switch-off window (rule 5) short enough that the contract's
    NUM_ITERATIONS observations reach a judged window (at the default 100 they are all baseline)."""

    expects_pacing = False
    job_level = True

    def make_controller(self) -> Controller:
        return make_controller("phase", switch_off_iters=8)


for _name, _contract in registered_contracts().items():
    globals().setdefault(_name, _contract)


class TestPidIterationUnitsContract(ControllerContract):
    def make_controller(self) -> Controller:
        return make_controller("pid", units="iteration", setpoint_s=0.005)


@settings(max_examples=30, deadline=None)
@given(
    exponent=st.integers(-6, 6), family=st.sampled_from(["threshold", "pid", "ewma", "quantile", "forecast"])
)
def test_iteration_units_are_scale_free(exponent: int, family: str) -> None:
    """Scaling every time of every observation by c = 2**k scales the delays by exactly c."""
    c = 2.0**exponent
    rng = np.random.default_rng(3)
    naturals = rng.uniform(0.0, 0.05, (12, 4)) + np.array([0.0, 0.01, 0.02, 0.04])
    plain = make_controller(family, units="iteration")
    scaled = make_controller(family, units="iteration")
    plain.reset(4, np.random.default_rng(0))
    scaled.reset(4, np.random.default_rng(0))
    delay_a = delay_b = np.zeros(4)
    for k, natural in enumerate(naturals):
        obs_a = make_observation(natural, delay_a, iteration=k, iteration_time_s=0.5 + 0.01 * k)
        obs_b = make_observation(c * natural, delay_b, iteration=k, iteration_time_s=c * (0.5 + 0.01 * k))
        delay_a = plain.act(obs_a).delay_s
        delay_b = scaled.act(obs_b).delay_s
        np.testing.assert_allclose(delay_b, c * delay_a, rtol=1e-12, atol=1e-15)


def test_units_must_be_known() -> None:
    with pytest.raises(ConfigError, match=r"units must be one of \['s', 'iteration'\], got 'ms'"):
        make_controller("threshold", units="ms")


# --- registry and validation ----------------------------------------------------------------------


def test_registry_names_match_classes() -> None:
    """The built-in families are registered (others may be too: the registry is open)."""
    assert {"none", "threshold", "pid", "ewma", "quantile", "forecast", "sleep_wait", "phase"} <= set(
        CONTROLLERS
    )
    for name, cls in CONTROLLERS.items():
        assert cls.name == name
        assert make_controller(name).name == name


def test_make_controller_passes_params() -> None:
    controller = make_controller("threshold", gain=0.25, on_threshold_s=0.05)
    assert isinstance(controller, ThresholdController)
    assert controller.gain == 0.25 and controller.on_threshold_s == 0.05


def test_make_controller_unknown_name_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'threshold'") as info:
        make_controller("treshold")
    assert "'treshold'" in str(info.value)


def test_make_controller_unknown_param_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'gain'") as info:
        make_controller("threshold", gian=0.5)
    assert "'gian'" in str(info.value)


def test_parameters_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ThresholdController(0.02)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "params", "shown"),
    [
        (
            "threshold",
            {"gain": 1.5},
            "gain must be in (0, 1], got 1.5 (controller 'threshold'; override: controller.gain=<value>)",
        ),
        ("threshold", {"gain": 0}, "got 0"),
        ("threshold", {"smoothing": 1.0}, "smoothing must be in [0, 1), got 1.0"),
        ("threshold", {"on_threshold_s": -0.1}, "got -0.1"),
        ("threshold", {"on_threshold_s": 0.01, "off_threshold_s": 0.02}, "got 0.02"),
        ("threshold", {"gain": "high"}, "got 'high'"),
        ("threshold", {"gain": float("nan")}, "got nan"),
        ("pid", {"kp": -1.0}, "kp must be >= 0, got -1.0"),
        ("pid", {"output_limit_s": 0.0}, "output_limit_s must be > 0, got 0.0"),
        ("pid", {"dt_s": -0.5}, "got -0.5"),
        ("ewma", {"alpha": 0.0}, "alpha must be in (0, 1], got 0.0"),
        ("ewma", {"min_dwell_iters": -2}, "min_dwell_iters must be an integer >= 0, got -2"),
        ("ewma", {"min_dwell_iters": 1.5}, "got 1.5"),
        ("quantile", {"quantile": 0.0}, "quantile must be in (0, 1], got 0.0"),
        ("quantile", {"window_iters": 0}, "window_iters must be an integer >= 1, got 0"),
        ("quantile", {"window_iters": np.int64(0)}, "got 0 (controller 'quantile';"),
        ("forecast", {"horizon_iters": 0}, "horizon_iters must be an integer >= 1, got 0"),
        ("forecast", {"margin_sigmas": -1.0}, "margin_sigmas must be >= 0, got -1.0"),
        ("forecast", {"warmup_iters": 1}, "warmup_iters must be an integer >= 2, got 1"),
        ("forecast", {"hold_iters": "auto"}, "hold_iters must be an integer >= 1, got 'auto'"),
    ],
)
def test_validation_message_shows_bad_value(name: str, params: dict[str, object], shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_controller(name, **params)
    assert shown in str(info.value)


def test_integral_float_accepted_for_int_params() -> None:
    assert QuantileController(window_iters=8.0).window_iters == 8  # type: ignore[arg-type]


def test_diagnostics_before_reset_raises() -> None:
    with pytest.raises(ControllerError, match="before reset"):
        ThresholdController().diagnostics()


# --- none -----------------------------------------------------------------------------------------


def test_none_never_paces() -> None:
    controller = NoPacing()
    controller.reset(3, RNG)
    action = controller.act(make_observation([0.1, 0.5, 2.0]))
    np.testing.assert_array_equal(action.delay_s, 0.0)
    assert controller.diagnostics() == {"active": 0.0}


# --- threshold ------------------------------------------------------------------------------------


def test_threshold_hysteresis_and_early_ranks_only() -> None:
    controller = ThresholdController(on_threshold_s=0.02, off_threshold_s=0.01, gain=0.5, smoothing=0.0)
    controller.reset(3, RNG)

    def act(natural: list[float]) -> np.ndarray:
        return controller.act(make_observation(natural)).delay_s

    np.testing.assert_array_equal(act([0.5, 0.51, 0.515]), 0.0)  # spread 15 ms: below on
    assert controller.diagnostics()["active"] == 0.0
    delay = act([0.5, 0.53, 0.54])  # spread 40 ms: switches on
    assert controller.diagnostics()["active"] == 1.0
    np.testing.assert_allclose(delay, [0.02, 0.005, 0.0])
    assert delay[2] == 0.0  # the latest rank is never delayed
    delay = act([0.5, 0.51, 0.515])  # 15 ms: inside the band, stays on
    assert controller.diagnostics()["active"] == 1.0
    np.testing.assert_allclose(delay, [0.0075, 0.0025, 0.0])
    np.testing.assert_array_equal(act([0.5, 0.505, 0.508]), 0.0)  # 8 ms: below off, switches off
    assert controller.diagnostics()["active"] == 0.0
    np.testing.assert_array_equal(act([0.5, 0.51, 0.515]), 0.0)  # inside the band, stays off


def test_threshold_smoothing_predicts_persistent_straggler() -> None:
    controller = ThresholdController(on_threshold_s=0.0, off_threshold_s=0.0, gain=1.0, smoothing=0.9)
    controller.reset(2, RNG)
    for k in range(200):
        delay = controller.act(spread_obs(0.05, iteration=k)).delay_s
    np.testing.assert_allclose(delay, [0.05, 0.0])
    # One iteration with the roles swapped barely moves the prediction, and the new latest rank is not paced.
    delay = controller.act(make_observation([0.55, 0.5])).delay_s
    np.testing.assert_allclose(delay, [0.04, 0.0])


# --- pid ------------------------------------------------------------------------------------------


def test_pid_terms_and_delay_mapping() -> None:
    controller = PidController(
        setpoint_s=0.01, kp=0.5, ki=0.0, kd=0.0, output_limit_s=1.0, smoothing=0.0, gain=1.0
    )
    controller.reset(3, RNG)
    delay = controller.act(make_observation([0.5, 0.4, 0.61])).delay_s  # spread 0.21, error 0.2
    diagnostics = controller.diagnostics()
    assert diagnostics["p"] == pytest.approx(0.1)
    assert diagnostics["output_s"] == pytest.approx(0.1)
    np.testing.assert_allclose(delay, [0.1, 0.1, 0.0])  # delay = min(u, earliness): rank 0 is 0.11 early
    delay = controller.act(make_observation([0.5, 0.56, 0.61])).delay_s  # spread 0.11, error 0.1
    np.testing.assert_allclose(delay, [0.05, 0.05, 0.0])
    delay = controller.act(make_observation([0.5, 0.58, 0.61])).delay_s
    assert delay[1] == pytest.approx(0.03)  # capped by its earliness 0.03 < u = 0.05
    # the PID feeds back the realised spread (delays included) and reports that one as spread_s
    controller.act(make_observation([0.5, 0.4, 0.61], [0.05, 0.1, 0.0]))  # natural 0.21, realised 0.11
    assert controller.diagnostics()["spread_s"] == pytest.approx(0.11)
    assert "natural_spread_s" not in controller.diagnostics()


def test_pid_anti_windup() -> None:
    controller = PidController(setpoint_s=0.0, kp=0.0, ki=1.0, kd=0.0, output_limit_s=0.05)
    controller.reset(2, RNG)
    for k in range(10_000):  # a long saturated error
        controller.act(spread_obs(1.0, iteration=k))
        assert 0.0 <= controller.diagnostics()["i"] <= 0.05
    assert controller.diagnostics()["output_s"] == 0.05
    controller.setpoint_s = 0.2  # now the error is negative: the output recovers at once, no unwinding
    controller.act(spread_obs(0.1, iteration=10_000))
    assert controller.diagnostics()["i"] == pytest.approx(0.0)
    assert controller.diagnostics()["active"] == 0.0


def test_pid_derivative_on_measurement_no_setpoint_kick() -> None:
    controller = PidController(setpoint_s=0.01, kp=0.5, ki=0.0, kd=1.0, output_limit_s=1.0, dt_s=1.0)
    controller.reset(2, RNG)
    controller.act(spread_obs(0.05))
    controller.act(spread_obs(0.05, iteration=1))
    p_before = controller.diagnostics()["p"]
    controller.setpoint_s = 0.03
    controller.act(spread_obs(0.05, iteration=2))
    diagnostics = controller.diagnostics()
    assert diagnostics["d"] == 0.0  # no kick: the measurement did not move
    assert diagnostics["p"] == pytest.approx(p_before - 0.5 * 0.02)
    controller.act(spread_obs(0.07, iteration=3))  # spread rose by 20 ms in 1 s
    assert controller.diagnostics()["d"] == pytest.approx(0.02)


def test_pid_uses_observation_time_step() -> None:
    controller = PidController(setpoint_s=0.0, kp=0.0, ki=1.0, kd=0.0, output_limit_s=10.0)
    controller.reset(2, RNG)
    controller.act(spread_obs(0.1, iteration_time_s=2.0))
    assert controller.diagnostics()["i"] == pytest.approx(0.2)
    with pytest.raises(ControllerError, match="iteration_time_s"):
        controller.act(spread_obs(0.1, iteration_time_s=0.0))


# --- ewma -----------------------------------------------------------------------------------------

spreads = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(spreads, st.floats(min_value=0.01, max_value=1.0))
def test_ewma_stays_within_inputs(values: list[float], alpha: float) -> None:
    controller = EwmaController(alpha=alpha)
    controller.reset(2, RNG)
    for k, spread in enumerate(values):
        controller.act(make_observation([0.0, spread], iteration=k))
        smoothed = controller.diagnostics()["smoothed_spread_s"]
        assert min(values[: k + 1]) <= smoothed <= max(values[: k + 1])


@settings(max_examples=200, deadline=None)
@given(
    spreads,
    st.floats(min_value=0.05, max_value=1.0),
    st.floats(min_value=0.0, max_value=0.5),
    st.floats(min_value=0.0, max_value=0.5),
    st.integers(min_value=0, max_value=6),
)
def test_ewma_no_chatter_inside_band(
    values: list[float], alpha: float, low: float, width: float, dwell: int
) -> None:
    controller = EwmaController(
        alpha=alpha, off_threshold_s=low, on_threshold_s=low + width, min_dwell_iters=dwell
    )
    controller.reset(2, RNG)
    active, since_toggle = False, None
    for k, spread in enumerate(values):
        controller.act(make_observation([0.0, spread], iteration=k))
        diagnostics = controller.diagnostics()
        now, smoothed = diagnostics["active"] == 1.0, diagnostics["smoothed_spread_s"]
        if since_toggle is not None:
            since_toggle += 1  # iterations the current state has lasted
        if now != active:
            # A toggle happens only outside the band, in the right direction, after the dwell time.
            assert smoothed > controller.on_threshold_s if now else smoothed < controller.off_threshold_s
            assert since_toggle is None or since_toggle >= dwell
            since_toggle = 0
        active = now


def test_ewma_dwell_delays_switch_off() -> None:
    controller = EwmaController(alpha=1.0, on_threshold_s=0.02, off_threshold_s=0.01, min_dwell_iters=3)
    controller.reset(2, RNG)
    states = []
    for k, spread in enumerate([0.05, 0.0, 0.0, 0.0, 0.0]):
        controller.act(spread_obs(spread, iteration=k))
        states.append(controller.diagnostics()["active"])
    assert states == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_ewma_delays_smoothed_earliness() -> None:
    controller = EwmaController(
        alpha=0.5, on_threshold_s=0.0, off_threshold_s=0.0, min_dwell_iters=0, gain=1.0
    )
    controller.reset(2, RNG)
    np.testing.assert_allclose(controller.act(spread_obs(0.04)).delay_s, [0.04, 0.0])
    np.testing.assert_allclose(controller.act(spread_obs(0.02, iteration=1)).delay_s, [0.03, 0.0])


# --- quantile -------------------------------------------------------------------------------------


def test_quantile_one_aligns_to_predicted_latest() -> None:
    controller = QuantileController(window_iters=5, quantile=1.0, gain=1.0)
    controller.reset(3, RNG)
    naturals = np.array([0.5, 0.52, 0.6]) + np.random.default_rng(1).uniform(-0.01, 0.01, size=(5, 3))
    for k, natural in enumerate(naturals):
        delay = controller.act(make_observation(natural, iteration=k)).delay_s
    predicted = np.median(naturals, axis=0)
    np.testing.assert_allclose(predicted + delay, predicted.max())  # everyone meets the predicted latest
    assert delay[2] == 0.0


def test_quantile_median_ignores_one_transient_straggler() -> None:
    controller = QuantileController(window_iters=5, quantile=1.0, gain=1.0)
    controller.reset(2, RNG)
    for k in range(4):
        controller.act(make_observation([0.5, 0.6], iteration=k))
    delay = controller.act(make_observation([0.9, 0.6], iteration=4)).delay_s  # rank 0 straggles once
    np.testing.assert_allclose(delay, [0.1, 0.0])


def test_quantile_below_one_leaves_tail() -> None:
    controller = QuantileController(window_iters=1, quantile=0.5, gain=1.0)
    controller.reset(3, RNG)
    delay = controller.act(make_observation([0.5, 0.6, 1.0])).delay_s
    np.testing.assert_allclose(delay, [0.1, 0.0, 0.0])


def test_quantile_on_threshold() -> None:
    controller = QuantileController(window_iters=1, quantile=1.0, on_threshold_s=0.05)
    controller.reset(2, RNG)
    np.testing.assert_array_equal(controller.act(spread_obs(0.04)).delay_s, 0.0)
    assert controller.diagnostics()["active"] == 0.0
    np.testing.assert_allclose(controller.act(spread_obs(0.06, iteration=1)).delay_s, [0.06, 0.0])
    assert controller.diagnostics()["active"] == 1.0


def _quantile_by_partition(
    naturals: np.ndarray, window: int, quantile: float, gain: float
) -> list[np.ndarray]:
    """The quantile rule as it was before its sorted window: each rank's window partitioned anew."""
    out = []
    for k in range(len(naturals)):
        values = naturals[max(0, k + 1 - window) : k + 1].T  # [ranks, filled]
        n = values.shape[1]
        if n % 2:
            predicted = np.partition(values, n // 2, axis=1)[:, n // 2]
        else:
            part = np.partition(values, (n // 2 - 1, n // 2), axis=1)
            predicted = 0.5 * (part[:, n // 2 - 1] + part[:, n // 2])
        target = float(np.quantile(predicted, quantile))
        active = float(predicted.max()) - float(predicted.min()) > 0.0
        out.append(gain * np.maximum(target - predicted, 0.0) if active else np.zeros(len(predicted)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(1, 12),
    num_ranks=st.integers(1, 9),
    quantile=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**31),
    ties=st.booleans(),
)
def test_quantile_sorted_window_decides_as_the_partition_did(
    window: int, num_ranks: int, quantile: float, seed: int, ties: bool
) -> None:
    naturals = np.random.default_rng(seed).uniform(0.4, 0.6, size=(3 * window + 5, num_ranks))
    if ties:  # repeated values within and across ranks
        naturals = np.round(naturals, 2)
    expected = _quantile_by_partition(naturals, window, quantile, 0.75)
    for few_ranks in (quantile_module.FEW_RANKS, 1):  # the passes as accumulations, then row by row
        default, quantile_module.FEW_RANKS = quantile_module.FEW_RANKS, few_ranks
        try:
            controller = QuantileController(window_iters=window, quantile=quantile, gain=0.75)
            controller.reset(num_ranks, RNG)
            for k, natural in enumerate(naturals):
                delay = controller.act(make_observation(natural, iteration=k)).delay_s
                np.testing.assert_array_equal(delay, expected[k])
        finally:
            quantile_module.FEW_RANKS = default


# --- forecast -------------------------------------------------------------------------------------


def _ar1_earliness(phi: float, iterations: int, num_ranks: int, seed: int) -> np.ndarray:
    """Natural arrivals whose earliness has a per-rank mean and AR(1) deviations of coefficient ``phi``."""
    rng = np.random.default_rng(seed)
    means = np.linspace(0.0, 0.03, num_ranks)
    dev = np.zeros(num_ranks)
    arrivals = np.empty((iterations, num_ranks))
    for k in range(iterations):
        dev = phi * dev + 0.005 * rng.standard_normal(num_ranks)
        arrivals[k] = 1.0 - (means + dev)  # earliness = max - arrival: larger mean, earlier rank
    return arrivals


def _run(controller: ForecastController, naturals: np.ndarray) -> list[np.ndarray]:
    controller.reset(naturals.shape[1], RNG)
    return [controller.act(make_observation(n, iteration=k)).delay_s for k, n in enumerate(naturals)]


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9])
def test_forecast_estimates_the_autocorrelation(phi: float) -> None:
    """The pooled lag-1 autocorrelation of the earliness deviations converges to the AR(1) coefficient.

    Earliness is measured from the latest rank, so every rank's series shares the latest rank's noise;
    with 16 ranks that common part is small, and the estimate lands within 0.1 of ``phi``.
    """
    controller = ForecastController(alpha=0.01)
    _run(controller, _ar1_earliness(phi, 4000, 16, seed=1))
    assert controller.diagnostics()["phi"] == pytest.approx(phi, abs=0.1)


def test_forecast_cold_start_is_unbiased_when_the_warm_up_ends() -> None:
    """Independent earliness (phi 0): at the end of the 8-iteration warm-up the pooled phi is near 0
    and the forecast-error SD near its long-run value. (A plain EWMA started at the first sample reads
    its shared offset as autocorrelation, phi 0.34, and one started at 0 gives two thirds of the SD.)"""
    phis, ratios = [], []
    for seed in range(20):
        naturals = 0.5 + np.random.default_rng(seed).normal(0.0, 0.01, (400, 32))
        controller = ForecastController()
        controller.reset(32, RNG)
        for k, natural in enumerate(naturals):
            controller.act(make_observation(natural, iteration=k))
            if k == controller.warmup_iters - 1:
                phi, sigma = controller.diagnostics()["phi"], controller.diagnostics()["sigma_h_s"]
        phis.append(phi)
        ratios.append(sigma / controller.diagnostics()["sigma_h_s"])
    assert np.mean(phis) < 0.1
    assert 0.9 < np.mean(ratios) < 1.3  # slightly above 1: the mean of 1..7 earlier iterations is noisy


def test_forecast_delay_is_the_ar1_forecast_less_the_margin() -> None:
    """One step by hand: mean m of the earlier iterations, innovation d, the mean of phi^j d over the
    held iterations, their mean error variance, the margin, the latest rank at 0."""
    naturals = _ar1_earliness(0.8, 300, 4, seed=2)
    for horizon, hold, margin in [(1, 1, 0.0), (3, 1, 0.0), (2, 1, 1.5), (2, 4, 1.0)]:
        controller = ForecastController(
            horizon_iters=horizon, hold_iters=hold, alpha=0.1, margin_sigmas=margin, gain=0.7
        )
        delays = _run(controller, naturals[:-1])
        state = (controller._mean.copy(), controller._prev_dev.copy(), controller._c0, controller._c1)
        delay = controller.act(make_observation(naturals[-1], iteration=299)).delay_s
        mean, prev_dev, c0, c1 = state  # after 299 iterations: past the start-up, weight alpha
        early = naturals[-1].max() - naturals[-1]
        dev = early - mean  # the innovation: against the mean of the earlier iterations
        c0 = 0.9 * c0 + 0.1 * np.mean(dev * dev)
        c1 = 0.9 * c1 + 0.1 * np.mean(dev * prev_dev)
        phi = float(np.clip(c1 / c0, 0.0, 1.0))
        held = [phi**j for j in range(horizon, horizon + hold)]  # the iterations the decision paces
        forecast = mean + np.mean(held) * dev
        forecast -= forecast.min()
        sigma_h = np.sqrt(c0 * np.mean([1.0 - p * p for p in held]))
        np.testing.assert_allclose(
            delay, 0.7 * np.maximum(forecast - margin * sigma_h, 0.0), rtol=1e-9, atol=1e-15
        )
        assert max(float(d.max()) for d in delays) > 0.0


def test_forecast_longer_horizon_trusts_the_last_value_less() -> None:
    """On transient earliness (phi 0.5) the delays move towards the ranks' means as the horizon grows."""
    naturals = _ar1_earliness(0.5, 500, 8, seed=3)
    early = naturals.max(axis=1, keepdims=True) - naturals
    targets = [ForecastController(horizon_iters=h, margin_sigmas=0.0) for h in (1, 4)]
    delays = [np.array(_run(c, naturals)) for c in targets]
    # how far each decision is from the ranks' long-run earliness (the forecast at an infinite horizon)
    centre = early.mean(axis=0) - early.mean(axis=0).min()
    distance = [np.abs(d[100:] - centre).mean() for d in delays]
    assert distance[1] < 0.8 * distance[0]


def test_forecast_margin_only_removes_delay() -> None:
    naturals = _ar1_earliness(0.7, 400, 6, seed=4)
    low = np.array(_run(ForecastController(margin_sigmas=0.0), naturals))
    high = np.array(_run(ForecastController(margin_sigmas=2.0), naturals))
    assert (high <= low + 1e-15).all() and high.sum() < low.sum()


@pytest.mark.parametrize("phi", [0.0, 0.3, 0.97, 1.0])
def test_forecast_mean_power_is_the_mean_over_the_held_iterations(phi: float) -> None:
    from pacectl.controllers.forecast import _mean_power

    for first, count in [(1, 1), (2, 1), (1, 10), (4, 7)]:
        expected = np.mean([phi**j for j in range(first, first + count)])
        assert _mean_power(phi, first, count) == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert 0.0 <= _mean_power(phi, 1, 10**12) <= 1.0  # closed form: no array, however long the hold


def test_forecast_active_means_some_rank_delayed() -> None:
    naturals = _ar1_earliness(0.5, 200, 4, seed=6)
    for margin in (0.0, 50.0):  # 50 SDs withhold every delay: engaged but not pacing
        controller = ForecastController(margin_sigmas=margin)
        controller.reset(4, RNG)
        for k, natural in enumerate(naturals):
            delay = controller.act(make_observation(natural, iteration=k)).delay_s
            assert controller.diagnostics()["active"] == float(delay.max() > 0.0)


def test_fill_schedule_sets_missing_or_auto_keys_of_the_families_that_take_them() -> None:
    from pacectl.controllers import fill_schedule

    assert fill_schedule("forecast", {}, 2, 5) == {"horizon_iters": 2, "hold_iters": 5}
    mixed = fill_schedule("forecast", {"horizon_iters": 3, "hold_iters": "auto"}, 2, 5)
    assert mixed == {"horizon_iters": 3, "hold_iters": 5}
    assert fill_schedule("threshold", {"gain": 0.3}, 2, 5) == {"gain": 0.3}  # no such keys: untouched
    with pytest.raises(ConfigError, match=r"hold_iters must be an integer >= 1 or auto .*got 'later'"):
        fill_schedule("forecast", {"hold_iters": "later"}, 2, 5)


def test_forecast_waits_for_warmup_and_threshold() -> None:
    naturals = _ar1_earliness(0.9, 50, 4, seed=5)
    delays = _run(ForecastController(warmup_iters=10, margin_sigmas=0.0), naturals)
    assert all(float(d.max()) == 0.0 for d in delays[:9]) and float(delays[9].max()) > 0.0
    quiet = _run(ForecastController(warmup_iters=2, on_threshold_s=1.0), naturals)
    assert all(float(d.max()) == 0.0 for d in quiet)


# --- all controllers ------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(sorted(CONTROLLERS)),
    st.lists(
        st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=4, max_size=4),
        min_size=1,
        max_size=20,
    ),
    st.permutations(range(4)),
)
def test_permuting_ranks_permutes_delays(name: str, naturals: list[list[float]], perm: list[int]) -> None:
    plain, permuted = make_controller(name), make_controller(name)
    plain.reset(4, RNG)
    permuted.reset(4, RNG)
    for k, natural in enumerate(np.array(naturals)):
        a = plain.act(make_observation(natural, iteration=k)).delay_s
        b = permuted.act(make_observation(natural[perm], iteration=k)).delay_s
        np.testing.assert_array_equal(a[perm], b)


def test_pickled_controller_keeps_parameters() -> None:
    controller = ThresholdController(gain=0.3)
    assert pickle.loads(pickle.dumps(controller)).gain == 0.3
    assert "gain=0.3" in repr(controller)


def test_a_quoted_number_is_named_as_a_string() -> None:
    with pytest.raises(ConfigError, match=r"got '0.5' \(a string: drop the quotes around the number\)"):
        PidController(kp="0.5")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"got 'abc' \(controller 'pid'"):  # not a number at all
        PidController(kp="abc")  # type: ignore[arg-type]


def test_a_non_finite_value_read_as_text_is_not_called_a_quoted_number() -> None:
    """YAML reads a bare ``nan`` as the string 'nan': no quotes to drop, just not a valid value."""
    with pytest.raises(ConfigError, match=r"got 'nan' \(not a finite number\)"):
        ThresholdController(on_threshold_s="nan")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"got '0.5' \(a string: drop the quotes"):
        ThresholdController(on_threshold_s="0.5")  # type: ignore[arg-type]
