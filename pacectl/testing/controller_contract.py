"""The contract every pacing controller must pass (STYLE.md, "Contract suites in pacectl/testing/").

Subclass :class:`ControllerContract` in a test module and override ``make_controller``::

    class TestThreshold(ControllerContract):
        def make_controller(self) -> Controller:
            return ThresholdController(on_threshold_s=0.02)

Observations come from :func:`pacectl.testing.synthetic_natural_arrivals` (seeded noise, a persistent
straggler, transient stragglers and a quiet phase), driven in closed loop by
:func:`pacectl.testing.run_closed_loop`.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pacectl.errors import ConfigError, ControllerError
from pacectl.testing.observations import (
    make_observation,
    run_closed_loop,
    synthetic_collective_times,
    synthetic_natural_arrivals,
)
from pacectl.types import WAIT_MODES, Controller

NUM_RANKS = (1, 2, 8)
NUM_ITERATIONS = 60


class ControllerContract:
    """Conformance tests for one controller; subclasses provide ``make_controller``.

    Attributes:
        expects_pacing: the controller paces on the synthetic stragglers (some delay > 0 with several
            ranks). Set to False for a controller that never paces (the ``none`` baseline).
        job_level: the controller delays every rank of its domain by the same amount (a job-level
            phase shift, ``phase``), decided from the collective's time rather than the ranks'
            arrivals. Then every action must be uniform over the ranks (instead of leaving some
            rank undelayed), and it must shift on the synthetic slowed collectives
            (:func:`~pacectl.testing.synthetic_collective_times`) rather than on stragglers.
    """

    expects_pacing: bool = True
    job_level: bool = False

    def make_controller(self) -> Controller:
        """Return a new controller instance (not reset). Subclasses must override this."""
        raise NotImplementedError("subclasses of ControllerContract must override make_controller()")

    def _fresh(self, num_ranks: int, seed: int = 0) -> Controller:
        controller = self.make_controller()
        controller.reset(num_ranks, np.random.default_rng(seed))
        return controller

    def test_satisfies_protocol(self) -> None:
        controller = self.make_controller()
        assert isinstance(controller, Controller)
        assert isinstance(controller.name, str) and controller.name

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_action_shape_finite_nonnegative(self, num_ranks: int) -> None:
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=1)
        for delay in run_closed_loop(self._fresh(num_ranks), naturals):
            assert delay.shape == (num_ranks,)
            assert delay.dtype == np.float64
            assert np.isfinite(delay).all()
            assert (delay >= 0.0).all()

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_wait_mode_is_known(self, num_ranks: int) -> None:
        """How the ranks wait in the collective is one of WAIT_MODES, the same at every decision."""
        controller = self._fresh(num_ranks)
        naturals = synthetic_natural_arrivals(num_ranks, 10, seed=12)
        waits = {controller.act(make_observation(n, iteration=k)).wait for k, n in enumerate(naturals)}
        assert waits <= set(WAIT_MODES) and len(waits) == 1

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_some_rank_is_never_delayed(self, num_ranks: int) -> None:
        """Delaying every rank by a common amount only lengthens the iteration (of one job alone).

        A job-level controller delays every rank alike instead, on purpose: that moves the job's
        collectives against another job's (:mod:`pacectl.controllers.phase`).
        """
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=2)
        collective = synthetic_collective_times(NUM_ITERATIONS, seed=2) if self.job_level else None
        for delay in run_closed_loop(self._fresh(num_ranks), naturals, collective_time_s=collective):
            if self.job_level:
                assert (delay == delay[0]).all(), "a job-level delay is the same on every rank"
            else:
                assert delay.min() == 0.0

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_job_level_shifts_on_slowed_collectives(self, num_ranks: int) -> None:
        if not self.job_level:
            pytest.skip("a per-rank controller: test_paces_on_stragglers covers it")
        naturals = np.full((NUM_ITERATIONS, num_ranks), 0.5)
        collective = synthetic_collective_times(NUM_ITERATIONS, seed=3)
        delays = run_closed_loop(self._fresh(num_ranks), naturals, collective_time_s=collective)
        assert max(float(d.max()) for d in delays) > 0.0
        quiet = run_closed_loop(
            self._fresh(num_ranks), naturals, collective_time_s=np.full(NUM_ITERATIONS, 0.1)
        )
        assert all(float(d.max()) == 0.0 for d in quiet), "a quiet collective is never shifted"

    @pytest.mark.parametrize("num_ranks", [2, 8])
    def test_paces_on_stragglers(self, num_ranks: int) -> None:
        if not self.expects_pacing:
            pytest.skip("this controller never paces")
        if self.job_level:
            pytest.skip(
                "a job-level controller ignores the ranks' spread: test_job_level_shifts_on_slowed_collectives"
            )
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=3)
        delays = run_closed_loop(self._fresh(num_ranks), naturals)
        assert max(float(d.max()) for d in delays) > 0.0

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_no_spread_no_delay(self, num_ranks: int) -> None:
        naturals = np.full((NUM_ITERATIONS, num_ranks), 0.5)
        for delay in run_closed_loop(self._fresh(num_ranks), naturals):
            np.testing.assert_array_equal(delay, 0.0)

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_deterministic_for_seed(self, num_ranks: int) -> None:
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=4)
        first = self._fresh(num_ranks, seed=7)
        second = self._fresh(num_ranks, seed=7)
        for a, b in zip(run_closed_loop(first, naturals), run_closed_loop(second, naturals), strict=True):
            np.testing.assert_array_equal(a, b)
        assert first.diagnostics() == second.diagnostics()

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_reset_clears_state(self, num_ranks: int) -> None:
        controller = self.make_controller()
        controller.reset(8, np.random.default_rng(0))
        run_closed_loop(controller, synthetic_natural_arrivals(8, NUM_ITERATIONS, seed=5))
        controller.reset(num_ranks, np.random.default_rng(0))
        fresh = self._fresh(num_ranks)
        assert controller.diagnostics() == fresh.diagnostics()
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=6)
        for a, b in zip(run_closed_loop(controller, naturals), run_closed_loop(fresh, naturals), strict=True):
            np.testing.assert_array_equal(a, b)

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_inputs_not_mutated(self, num_ranks: int) -> None:
        controller = self._fresh(num_ranks)
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=8)
        before = naturals.copy()
        # Read-only observation arrays make any in-place write raise ValueError.
        run_closed_loop(controller, naturals, read_only=True)
        np.testing.assert_array_equal(naturals, before)
        obs = make_observation(naturals[0], np.full(num_ranks, 0.001), iteration=NUM_ITERATIONS)
        copies = {f: getattr(obs, f).copy() for f in ("arrival_s", "applied_delay_s", "natural_arrival_s")}
        controller.act(obs)
        for field, copy in copies.items():
            np.testing.assert_array_equal(getattr(obs, field), copy, err_msg=field)

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_returned_action_not_aliased(self, num_ranks: int) -> None:
        """Writing into a returned action must not change the controller's later decisions."""
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=9)
        scribbled, clean = self._fresh(num_ranks), self._fresh(num_ranks)
        for k, natural in enumerate(naturals):
            obs = make_observation(natural, iteration=k)
            a = scribbled.act(obs).delay_s
            expected = clean.act(obs).delay_s.copy()
            np.testing.assert_array_equal(a, expected)
            if a.flags.writeable:
                a[:] = 123.0

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_pickle_round_trip_mid_episode(self, num_ranks: int) -> None:
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=10)
        original = self._fresh(num_ranks)
        run_closed_loop(original, naturals[: NUM_ITERATIONS // 2])
        restored = pickle.loads(pickle.dumps(original))
        assert restored.diagnostics() == original.diagnostics()
        rest = naturals[NUM_ITERATIONS // 2 :]
        for a, b in zip(run_closed_loop(original, rest), run_closed_loop(restored, rest), strict=True):
            np.testing.assert_array_equal(a, b)
        assert restored.diagnostics() == original.diagnostics()

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_diagnostics(self, num_ranks: int) -> None:
        controller = self._fresh(num_ranks)
        keys = set(controller.diagnostics())
        assert "active" in keys
        naturals = synthetic_natural_arrivals(num_ranks, NUM_ITERATIONS, seed=11)
        for k, natural in enumerate(naturals):
            controller.act(make_observation(natural, iteration=k))
            diagnostics = controller.diagnostics()
            assert set(diagnostics) == keys, "diagnostics keys must be stable"
            assert all(isinstance(key, str) for key in diagnostics)
            assert all(type(value) is float for value in diagnostics.values())
            assert diagnostics["active"] in (0.0, 1.0)

    def test_act_before_reset_raises(self) -> None:
        controller = self.make_controller()
        with pytest.raises(ControllerError, match="reset"):
            controller.act(make_observation([0.5, 0.6]))

    @pytest.mark.parametrize("num_ranks", NUM_RANKS)
    def test_wrong_number_of_ranks_raises(self, num_ranks: int) -> None:
        controller = self._fresh(num_ranks)
        with pytest.raises((ControllerError, ConfigError)) as info:
            controller.act(make_observation(np.linspace(0.5, 0.6, num_ranks + 1)))
        assert f"({num_ranks},)" in str(info.value) and f"({num_ranks + 1},)" in str(info.value)

    @pytest.mark.parametrize("num_ranks", [0, -1, 2.5, True])
    def test_reset_rejects_bad_num_ranks(self, num_ranks: object) -> None:
        with pytest.raises(ConfigError, match="num_ranks"):
            self.make_controller().reset(num_ranks, np.random.default_rng(0))  # type: ignore[arg-type]


def contract_for(name: str) -> type[ControllerContract]:
    """The :class:`ControllerContract` of the registered family ``name`` at its defaults, with
    ``expects_pacing`` and ``job_level`` as its registration says."""
    from pacectl.controllers import FAMILIES, make_controller

    fam = FAMILIES[name]
    return type(
        f"Test{fam.cls.__name__}Contract",
        (ControllerContract,),
        {
            "expects_pacing": fam.paces,
            "job_level": fam.job_level,
            "make_controller": lambda self: make_controller(name),
            "__module__": __name__,
        },
    )


def registered_contracts() -> dict[str, type[ControllerContract]]:
    """One contract class per registered family (:func:`contract_for`), by class name: a test module
    runs them all with ``globals().update(registered_contracts())``."""
    from pacectl.controllers import FAMILIES

    classes = (contract_for(name) for name in FAMILIES)
    return {cls.__name__: cls for cls in classes}
