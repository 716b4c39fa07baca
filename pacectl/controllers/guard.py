"""The safety guard that wraps every controller, in every backend (replay, simulation, live)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np

from pacectl.checks import Checked, integer, within
from pacectl.controllers.base import FloatArray, check_shape, require_reset
from pacectl.errors import ConfigError
from pacectl.types import WAIT_MODES, Action, Controller, Observation

_OBS_ARRAYS = ("arrival_s", "applied_delay_s", "natural_arrival_s", "wait_s")


class PacingGuardWarning(UserWarning):
    """The safety guard replaced a controller's action by zero delay."""


@dataclass(kw_only=True)
class GuardConfig(Checked):
    """The ``guard`` section of the run's config: the caps of :class:`SafetyGuard` (see there).

    Stored in Hydra's ConfigStore as ``guard=default`` (:mod:`pacectl.config`), typed.
    """

    section = "guard"
    max_delay_frac: float = within(0.5, "> 0")
    max_delay_s: float | None = within(None, "> 0")
    window_iters: int = within(32, ">= 1")


@dataclass(eq=False, repr=False)
class SafetyGuard(GuardConfig):
    """Wrap a controller: cap its delays, and turn any failure into zero delay plus a warning.

    Each iteration:

    - an observation with a non-finite value gives zero delay without calling the inner controller;
    - the cap is ``max_delay_frac`` times the median iteration time over the last ``window_iters``
      finite observations (0 before any), and at most ``max_delay_s`` if given;
    - while ``enabled`` is False the inner controller is not called and the delay is zero (a runtime
      kill switch; the inner state is kept as it was);
    - an exception from the inner controller, or an action of the wrong shape, with NaN, inf or negative
      entries, gives zero delay;
    - delays above the cap are clipped to it;
    - how the ranks wait (:attr:`~pacectl.types.Action.wait`) passes through; every zero-delay
      fallback above (failure, kill switch) waits as ``"spin"``, the default of no pacing.

    Every zeroing emits a :class:`PacingGuardWarning` and counts in ``guard_interventions``; every clipped
    action counts in ``guard_clipped``. The guard is a pure function of its inputs, so every rank of a real
    job computes the same delays. Call-order and shape errors (``act`` before ``reset``, an observation
    with the wrong number of ranks) are bugs in the caller and raise :class:`ControllerError`.

    Args:
        inner: the controller to wrap; the guard takes its ``name``.
        max_delay_frac: cap as a fraction of the median iteration time, > 0.
        max_delay_s: absolute cap, seconds, > 0, or ``None`` for none.
        window_iters: iterations in the rolling median of the iteration time, >= 1.
        enabled: initial value of the ``enabled`` attribute.

    Raises:
        ConfigError: ``inner`` is not a controller or a parameter is out of range.

    Diagnostics: the inner controller's, with ``active`` forced to 0 while disabled or after a zeroed
    action, plus ``guard_interventions``, ``guard_clipped``, ``guard_cap_s`` and ``guard_enabled``.

    Example:
        >>> from pacectl.controllers import ThresholdController
        >>> guard = SafetyGuard(ThresholdController(), max_delay_frac=0.5)
        >>> guard.reset(8, np.random.default_rng(0))
    """

    inner: Controller
    enabled: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Controller):
            raise ConfigError(
                f"inner must be a Controller (with name, reset, act, diagnostics), got {self.inner!r} (guard)"
            )
        super().__post_init__()
        self.name: str = self.inner.name
        self._num_ranks: int | None = None

    def reset(self, num_ranks: int, rng: np.random.Generator | None = None) -> None:
        """Reset the inner controller, the iteration-time window and the counters.

        Args:
            num_ranks: ranks in this pacing domain, >= 1.
            rng: passed to the inner controller's ``reset``.

        Raises:
            ConfigError: ``num_ranks`` is not an integer >= 1.
        """
        num_ranks = integer(num_ranks, "num_ranks", 1, " (guard)")
        self.inner.reset(num_ranks, rng)  # type: ignore[arg-type]
        self._num_ranks = num_ranks
        self._iteration_times = np.zeros(self.window_iters, dtype=np.float64)
        self._count = 0
        self._cap_s = 0.0
        self._interventions = 0
        self._clipped = 0
        self._last_zeroed = False

    def act(self, obs: Observation) -> Action:
        """Guarded delays for the next iteration, ``float64[num_ranks]`` seconds.

        Raises:
            ControllerError: called before ``reset``, or the observation has the wrong number of ranks.
        """
        num_ranks = require_reset(self._num_ranks, f"controller {self.name!r} (guarded)", "act")
        arrays = [getattr(obs, field) for field in _OBS_ARRAYS]
        for field, arr in zip(_OBS_ARRAYS, arrays, strict=True):
            check_shape(obs, field, arr, num_ranks, self.name)
        zeros = np.zeros(num_ranks, dtype=np.float64)
        self._last_zeroed = False

        arrays += [np.array([obs.iteration_time_s, obs.collective_time_s], dtype=np.float64)]
        if not np.isfinite(np.concatenate(arrays)).all():
            return self._zero(zeros, "observation has non-finite values")
        window = self._iteration_times
        window[self._count % self.window_iters] = obs.iteration_time_s
        self._count += 1
        median = _median(window[: min(self._count, self.window_iters)])
        self._cap_s = max(self.max_delay_frac * median, 0.0)
        if self.max_delay_s is not None:
            self._cap_s = min(self._cap_s, self.max_delay_s)

        if not self.enabled:
            return Action(zeros)
        try:
            action = self.inner.act(obs)
            delay: FloatArray = np.array(action.delay_s, dtype=np.float64)
            wait = getattr(action, "wait", "spin")
        except Exception as err:  # noqa: BLE001 - any failure of the inner controller means "do not pace"
            return self._zero(zeros, f"controller raised {type(err).__name__}: {err}")
        if wait not in WAIT_MODES:
            return self._zero(zeros, f"controller returned wait={wait!r}, expected one of {list(WAIT_MODES)}")
        if delay.shape != (num_ranks,):
            return self._zero(
                zeros, f"controller returned delay_s of shape {delay.shape}, expected ({num_ranks},)"
            )
        if not np.isfinite(delay).all():
            return self._zero(zeros, "controller returned non-finite delays")
        if (delay < 0.0).any():
            return self._zero(zeros, f"controller returned negative delays (min {delay.min()!r} s)")
        if (delay > self._cap_s).any():
            self._clipped += 1
            delay = np.minimum(delay, self._cap_s)
        return Action(delay, wait)

    def diagnostics(self) -> dict[str, float]:
        """The inner controller's diagnostics merged with the guard's own.

        Raises:
            ControllerError: called before ``reset``.
        """
        require_reset(self._num_ranks, f"controller {self.name!r} (guarded)", "diagnostics")
        try:
            merged = {key: float(value) for key, value in self.inner.diagnostics().items()}
        except Exception as err:  # noqa: BLE001 - diagnostics must never stop a run
            warnings.warn(
                f"pacing guard ({self.name!r}): diagnostics() raised {type(err).__name__}: {err}",
                PacingGuardWarning,
                stacklevel=2,
            )
            merged = {}
        if not self.enabled or self._last_zeroed:
            merged["active"] = 0.0
        merged.setdefault("active", 0.0)
        merged.update(
            guard_interventions=float(self._interventions),
            guard_clipped=float(self._clipped),
            guard_cap_s=self._cap_s,
            guard_enabled=float(self.enabled),
        )
        return merged

    def _zero(self, zeros: FloatArray, reason: str) -> Action:
        self._interventions += 1
        self._last_zeroed = True
        warnings.warn(
            f"pacing guard ({self.name!r}): {reason}; applying zero delay", PacingGuardWarning, stacklevel=3
        )
        return Action(zeros)

    def __repr__(self) -> str:
        return (
            f"SafetyGuard({self.inner!r}, max_delay_frac={self.max_delay_frac!r}, "
            f"max_delay_s={self.max_delay_s!r}, window_iters={self.window_iters!r}, enabled={self.enabled!r})"
        )


def _median(values: FloatArray) -> float:
    """Median of a short 1-D array, bit-identical to ``np.median`` (mean of the two middle values).

    Several times faster than ``np.median`` on the guard's 32-value window, which runs on the
    training critical path of a live job every iteration.
    """
    ordered = np.sort(values)
    mid = ordered.size // 2
    if ordered.size % 2:
        return float(ordered[mid])
    return float((ordered[mid - 1] + ordered[mid]) / 2.0)
