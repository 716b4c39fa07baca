"""Quantile controller: align every rank to a quantile of the ranks' predicted arrivals."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray
from pacectl.controllers.registry import register
from pacectl.types import Observation


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class QuantileController(BaseController):
    """Delay each rank towards the ``quantile``-th predicted arrival across ranks.

    Each iteration:

    - keep the last ``window_iters`` natural arrivals of each rank (a rolling window);
    - ``pred[r]`` = median of rank ``r``'s arrivals over the window (the median, not an EWMA, so one
      transient straggler iteration does not move the prediction);
    - ``target = numpy.quantile(pred, quantile)`` (linear interpolation); ``quantile = 1`` aligns every
      rank to the predicted-latest one, smaller values ignore a persistent tail;
    - if the predicted spread ``max(pred) - min(pred)`` is above ``on_threshold_s``,
      ``delay[r] = gain * max(0, target - pred[r])``, else zero.

    Args:
        window_iters: length of the rolling window, iterations, >= 1.
        quantile: quantile of the predicted arrivals to align to, in (0, 1].
        gain: fraction of the gap to the target to delay, in (0, 1].
        on_threshold_s: predicted spread at or below which the controller does nothing, seconds, >= 0.

    Raises:
        ConfigError: a parameter is out of range.

    Diagnostics: ``active``, ``predicted_spread_s``, ``target_s`` (target relative to the earliest
    predicted arrival), ``window_fill`` (iterations in the window), ``max_delay_s``.

    Example:
        >>> c = QuantileController(window_iters=16, quantile=0.9)
        >>> c.reset(8, np.random.default_rng(0))
    """

    name = "quantile"

    window_iters: int = within(16, ">= 1")
    quantile: float = within(0.9, "(0, 1]")
    gain: float = within(1.0, "(0, 1]")
    on_threshold_s: float = within(0.0, ">= 0")

    def _reset_state(self, num_ranks: int) -> None:
        self._window = np.zeros((num_ranks, self.window_iters), dtype=np.float64)  # rank-major: fast median
        self._count = 0
        self._active = False
        self._predicted_spread_s = self._target_s = self._max_delay_s = 0.0

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        self._window[:, self._count % self.window_iters] = natural_arrival_s
        self._count += 1
        predicted = _row_median(self._window[:, : min(self._count, self.window_iters)])
        target = float(np.quantile(predicted, self.quantile))
        earliest = float(predicted.min())
        self._predicted_spread_s = float(predicted.max()) - earliest
        self._target_s = target - earliest
        self._active = self._predicted_spread_s > self.on_threshold_s
        if not self._active:
            delay = np.zeros_like(natural_arrival_s)
        else:
            delay = self.gain * np.maximum(target - predicted, 0.0)
        self._max_delay_s = float(delay.max())
        return delay

    def _diagnostics(self) -> dict[str, float]:
        return {
            "active": float(self._active),
            "predicted_spread_s": self._predicted_spread_s,
            "target_s": self._target_s,
            "window_fill": float(min(self._count, self.window_iters)),
            "max_delay_s": self._max_delay_s,
        }


def _row_median(values: FloatArray) -> FloatArray:
    """Median of each row of ``float64[num_ranks, n]`` (same result as ``np.median(axis=1)``, via one
    partition of the contiguous rows)."""
    n = values.shape[1]
    if n % 2:
        return np.partition(values, n // 2, axis=1)[:, n // 2]
    part = np.partition(values, (n // 2 - 1, n // 2), axis=1)
    return 0.5 * (part[:, n // 2 - 1] + part[:, n // 2])
