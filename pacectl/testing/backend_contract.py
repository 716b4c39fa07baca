"""The contract every in-process backend satisfies, as a reusable pytest suite.

Subclass :class:`BackendContract` in a test module and override :meth:`make_backend` (a fresh
backend per call); pytest then runs every ``test_*`` method on it::

    class TestMyBackend(BackendContract):
        def make_backend(self):
            return MyBackend(...)

Checks: call order (step before reset, past the end), one observation per domain with the right
shapes and units, the observation identities (natural = arrival - delay, waits >= 0 and zero for
the last rank, iteration time covers every arrival), determinism for a seed, reset rewinds, and,
for a backend whose communication model is not timing-dependent, the max-plus invariant: no delay
shortens an iteration.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pacectl.errors import BackendError
from pacectl.types import Action, Backend, Observation

_NUM_STEPS = 6


class BackendContract:
    """Base class of backend test suites (pytest collects the subclasses)."""

    def make_backend(self) -> Any:
        """Return a new backend; subclasses override this."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ helpers
    def _zeros(self, backend: Backend) -> list[Action]:
        return [Action.zeros(len(d.ranks)) for d in backend.domains]

    def _random(self, backend: Backend, rng: np.random.Generator, scale: float) -> list[Action]:
        return [Action(rng.uniform(0.0, scale, len(d.ranks))) for d in backend.domains]

    def _run(self, backend: Backend, actions: list[list[Action]], seed: int = 0) -> list[list[Observation]]:
        backend.reset(seed=seed)
        return [backend.step(a) for a in actions]

    def _steps(self, backend: Backend) -> int:
        return min(_NUM_STEPS, backend.num_iterations)

    # -------------------------------------------------------------------------------------- tests
    def test_is_a_backend(self) -> None:
        backend = self.make_backend()
        assert isinstance(backend, Backend)
        assert isinstance(backend.comm_model, str) and backend.comm_model
        assert backend.domains and all(d.ranks for d in backend.domains)
        ranks = [r for d in backend.domains for r in d.ranks]
        assert sorted(ranks) == list(range(len(backend.rank_labels))), "domains must partition the ranks"

    def test_step_before_reset_raises(self) -> None:
        backend = self.make_backend()
        with pytest.raises(BackendError):
            backend.step(self._zeros(backend))

    def test_step_past_the_end_raises(self) -> None:
        backend = self.make_backend()
        backend.reset(seed=0)
        for _ in range(backend.num_iterations):
            backend.step(self._zeros(backend))
        with pytest.raises(BackendError):
            backend.step(self._zeros(backend))

    def test_observations_are_consistent(self) -> None:
        backend = self.make_backend()
        rng = np.random.default_rng(0)
        scale = 0.01
        for k, observations in enumerate(
            self._run(backend, [self._random(backend, rng, scale) for _ in range(self._steps(backend))])
        ):
            assert len(observations) == len(backend.domains)
            for d, (obs, dom) in enumerate(zip(observations, backend.domains, strict=True)):
                n = len(dom.ranks)
                assert obs.iteration == k and obs.domain == d
                for field in ("arrival_s", "applied_delay_s", "natural_arrival_s", "wait_s"):
                    value = getattr(obs, field)
                    assert value.shape == (n,) and value.dtype == np.float64, field
                    assert np.isfinite(value).all(), field
                np.testing.assert_allclose(
                    obs.natural_arrival_s, obs.arrival_s - obs.applied_delay_s, atol=1e-12
                )
                assert (obs.wait_s >= -1e-12).all()
                assert obs.wait_s.min() == pytest.approx(0.0, abs=1e-9), (
                    "the last rank to arrive waits for no one"
                )
                assert obs.iteration_time_s >= obs.arrival_s.max() - 1e-12
                assert obs.collective_time_s >= 0.0

    def test_deterministic_for_a_seed_and_reset_rewinds(self) -> None:
        backend = self.make_backend()
        rng = np.random.default_rng(1)
        actions = [self._random(backend, rng, 0.01) for _ in range(self._steps(backend))]
        first = self._run(backend, actions, seed=3)
        again = self._run(backend, actions, seed=3)
        other = self._run(self.make_backend(), actions, seed=3)
        for a, b, c in zip(first, again, other, strict=True):
            for x, y, z in zip(a, b, c, strict=True):
                assert x.iteration_time_s == y.iteration_time_s == z.iteration_time_s
                np.testing.assert_array_equal(x.arrival_s, y.arrival_s)
                np.testing.assert_array_equal(x.arrival_s, z.arrival_s)

    def test_max_plus_invariant_unless_timing_dependent(self) -> None:
        backend = self.make_backend()
        if backend.comm_timing_dependent:
            pytest.skip("timing-dependent communication model: delays may shorten iterations")
        rng = np.random.default_rng(2)
        steps = self._steps(backend)
        base = self._run(backend, [self._zeros(backend) for _ in range(steps)])
        paced = self._run(backend, [self._random(backend, rng, 0.5) for _ in range(steps)])
        for b, p in zip(base, paced, strict=True):
            assert p[0].iteration_time_s >= b[0].iteration_time_s - 1e-12
