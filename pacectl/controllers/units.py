"""Run a controller in units of the iteration time, so its thresholds transfer between jobs.

A threshold of 20 ms means little to a job whose iterations take 47 s and too much to one whose
iterations take 50 ms (``experiments/tuning/``). :class:`IterationUnits` divides every time of an
observation by the median iteration time seen so far (a rolling window) before the inner controller
sees it, and multiplies the delays it returns by the same scale. Inside, ``on_threshold_s: 0.01``
then means "1 % of an iteration". Select it with the reserved controller key ``units: iteration``
(see :func:`pacectl.controllers.make_controller`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pacectl.checks import integer
from pacectl.errors import ConfigError, ControllerError
from pacectl.types import Action, Controller, Observation

UNITS = ("s", "iteration")


class IterationUnits:
    """Wrap a controller so that it works in iteration-time units (Controller protocol).

    Each iteration ``k``: ``scale = median(iteration_time_s over the last window_iters observations)``
    (the current one included; non-finite or non-positive times are skipped, and with none yet the
    scale is 1 s), the inner controller acts on the observation with every ``*_s`` field divided by
    ``scale``, and its delays are multiplied by ``scale``. Deterministic, so every rank of a live job
    computes the same scale. Scaling every time of every observation by ``c`` scales the delays by
    ``c`` (tested).

    Args:
        inner: the controller to wrap; the wrapper takes its ``name``.
        window_iters: iterations in the rolling median, >= 1.

    Raises:
        ConfigError: ``window_iters`` < 1.

    Diagnostics: the inner controller's, plus ``units_scale_s`` (the current scale, seconds).
    """

    def __init__(self, inner: Controller, *, window_iters: int = 32) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.window_iters = integer(window_iters, "units_window_iters", 1, f" (controller {inner.name!r})")
        self._times: np.ndarray | None = None

    def reset(self, num_ranks: int, rng: np.random.Generator) -> None:
        """Reset the inner controller and the iteration-time window."""
        self.inner.reset(num_ranks, rng)
        self._times = np.full(self.window_iters, np.nan)
        self._count = 0
        self._scale_s = 1.0

    def act(self, obs: Observation) -> Action:
        """The inner controller's delays for ``obs`` in iteration units, converted back to seconds.

        Raises:
            ControllerError: called before ``reset``.
        """
        if self._times is None:
            raise ControllerError(f"act() must follow reset() (controller {self.name!r}, iteration units)")
        t = float(obs.iteration_time_s)
        if np.isfinite(t) and t > 0:
            self._times[self._count % self.window_iters] = t
            self._count += 1
        seen = self._times[~np.isnan(self._times)]
        self._scale_s = float(np.median(seen)) if len(seen) else 1.0
        c = 1.0 / self._scale_s
        scaled = replace(
            obs,
            arrival_s=obs.arrival_s * c,
            applied_delay_s=obs.applied_delay_s * c,
            natural_arrival_s=obs.natural_arrival_s * c,
            wait_s=obs.wait_s * c,
            iteration_time_s=obs.iteration_time_s * c,
            collective_time_s=obs.collective_time_s * c,
        )
        action = self.inner.act(scaled)
        delay = np.asarray(action.delay_s, dtype=np.float64) * self._scale_s
        return Action(delay, getattr(action, "wait", "spin"))  # how the ranks wait has no unit

    def diagnostics(self) -> dict[str, float]:
        """Inner diagnostics plus ``units_scale_s``."""
        return {**self.inner.diagnostics(), "units_scale_s": self._scale_s}


def with_units(controller: Controller, units: object) -> Controller:
    """``controller`` as is for ``units="s"``, wrapped in :class:`IterationUnits` for ``"iteration"``.

    Raises:
        ConfigError: any other value.
    """
    if units == "s":
        return controller
    if units == "iteration":
        return IterationUnits(controller)
    raise ConfigError(
        f"controller units must be one of {list(UNITS)}, got {units!r} (controller {controller.name!r}): "
        "'s' reads every threshold in seconds, 'iteration' as a fraction of the median iteration time"
    )
