"""Forecast controller: pace each rank by its earliness forecast for the iteration the delay lands on.

Why: a decision taken on the figures of iteration ``k`` paces iteration ``k + h`` (``h`` = the
exchange lag, 1 at best; see :class:`~pacectl.loop.ExchangeSchedule`). Where a rank's earliness
persists (a slow GPU, a far NIC) any recent value predicts ``k + h`` well; where it decays (real
step times: ``experiments/staleness/README.md``), pacing on the last value, or on a fast EWMA of
it, delays ranks that are no longer early. This controller forecasts instead, and delays only what
it expects to still be there.

Model (per rank, standard AR(1) around a slowly moving mean; Box, Jenkins and Reinsel, *Time Series
Analysis*, ch. 3 and 5): with ``e_k[r]`` the earliness of rank ``r`` (``max(natural) - natural[r]``),
``m[r]`` its mean over the earlier iterations and ``d_k[r] = e_k[r] - m[r]`` (the innovation),

- ``phi = clip(c1 / c0, 0, 1)``, pooled over ranks: ``c0`` the EWMA of ``mean_r d_k[r]^2`` and ``c1``
  the EWMA of ``mean_r d_k[r] d_{k-1}[r]`` (lag-1 autocorrelation; pooled, since ranks of one job
  share their dynamics and one estimate from ``n`` ranks is less noisy). ``m``, ``c0`` and ``c1`` are
  running means of their first ``1 / alpha`` samples, then EWMAs of weight ``alpha``: a plain EWMA
  started at the first sample keeps ``(1 - alpha)^k`` of it (70 % after 7 iterations at 0.05), a
  shared offset in every deviation that reads as autocorrelation, and one started at 0 leaves ``c0``
  too small (the margin too narrow) when the warm-up ends;
- forecast ``f[r] = m[r] + D d_k[r]`` with ``D`` the mean of ``phi^j`` over the iterations the
  decision is in force, ``j = h .. h + hold - 1`` (``h`` = ``horizon_iters``, ``hold`` =
  ``hold_iters``; ``D = phi^h`` for a decision that holds one iteration): the forecast with the least
  mean squared error over them. Its error's standard deviation ``sigma_h`` is the root mean of the
  AR(1) ``j``-step forecast error variances ``c0 (1 - phi^(2 j))`` over the same ``j``;
- ``delay[r] = gain * max(0, f[r] - min(f) - margin_sigmas * sigma_h)``: the forecast earliness
  relative to the predicted-latest rank, less a safety margin (delaying a rank that turns out late
  costs the whole iteration that much; not delaying an early one only forgoes the gain);
- no delay while the forecast spread ``max(f) - min(f)`` is at or below ``on_threshold_s`` or
  fewer than ``warmup_iters`` iterations have been seen.

With ``phi = 1`` (persistent earliness) the forecast is the last value, as the threshold controller's
with ``smoothing = 0``; with ``phi = 0`` it is the rank's mean, as a long-window quantile
controller's. Like every controller it only delays ranks: under fixed durations (max-plus, ``comm=null``)
that never shortens an iteration, however good the forecast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray
from pacectl.controllers.registry import register
from pacectl.types import Observation


def _ordered_sum(values: FloatArray) -> float:
    """The sum of ``values`` in ascending order: the same bits for any permutation of them."""
    return float(np.sort(values).sum())


def _mean_power(x: float, first: int, count: int) -> float:
    """``mean(x**j for j in first .. first + count - 1)`` for ``0 <= x <= 1``, in closed form (a
    geometric series: no array, however long the hold)."""
    if x >= 1.0:
        return 1.0
    if x <= 0.0:
        return 0.0
    return x**first * (1.0 - x**count) / ((1.0 - x) * count)


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class ForecastController(BaseController):
    """Delay each rank by its AR(1) earliness forecast over the iterations the delay applies to
    (``horizon_iters`` ahead, for ``hold_iters``), less a safety margin.

    See the module docstring for the model and its source.

    Args:
        horizon_iters: iterations from the observed iteration to the first one the delay applies to, >= 1:
            ``exchange.lag_iters`` in replay and sim (1 by default), 1 for a live job's ``async`` or
            ``collective`` exchange, 2 for ``piggyback``. In a config, ``auto`` (the default
            of ``controller=forecast``) is replaced by the run's lag
            (:func:`pacectl.controllers.fill_schedule`; a missing key counts as ``auto`` there, in
            ``controller_file`` files and live runtime controls too).
        hold_iters: iterations a decision stays in force, >= 1: ``exchange.every_iters`` (a live job's
            ``gather_every``); ``auto`` in a config, as ``horizon_iters``.
        alpha: EWMA weight of the newest sample in the per-rank mean and the pooled moments, in (0, 1];
            the first ``1 / alpha`` samples are averaged with equal weights (a start-up running mean).
        gain: fraction of the margin-reduced forecast to delay, in (0, 1].
        margin_sigmas: safety margin in forecast-error standard deviations, >= 0.
        on_threshold_s: forecast spread at or below which nothing is delayed, seconds, >= 0.
        warmup_iters: iterations observed before any delay, >= 2 (the variance needs two; the
            autocorrelation's first sample comes at the third).

    Raises:
        ConfigError: a parameter is out of range.

    Diagnostics: ``active`` (some rank delayed: after the warm-up, above the threshold, and not all
    withheld by the margin), ``phi`` (pooled lag-1 autocorrelation), ``sigma_h_s`` (forecast error
    standard deviation), ``forecast_spread_s``, ``natural_spread_s``, ``max_delay_s``.

    Example:
        >>> c = ForecastController(horizon_iters=2, margin_sigmas=0.5)
        >>> c.reset(8, np.random.default_rng(0))
    """

    name = "forecast"

    horizon_iters: int = within(1, ">= 1")
    hold_iters: int = within(1, ">= 1")
    alpha: float = within(0.05, "(0, 1]")
    gain: float = within(1.0, "(0, 1]")
    margin_sigmas: float = within(1.0, ">= 0")
    on_threshold_s: float = within(0.0, ">= 0")
    warmup_iters: int = within(8, ">= 2")

    def _reset_state(self, num_ranks: int) -> None:
        self._seen = 0
        self._mean: FloatArray | None = None
        self._prev_dev: FloatArray | None = None
        self._c0 = 0.0
        self._c1 = 0.0
        self._phi = 0.0
        self._sigma_h_s = 0.0
        self._active = False
        self._forecast_spread_s = self._spread_s = self._max_delay_s = 0.0

    def _weight(self, count: int) -> float:
        """Weight of sample number ``count`` (from 1) in a start-up EWMA (module docstring)."""
        return max(self.alpha, 1.0 / count)

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        early = natural_arrival_s.max() - natural_arrival_s
        self._spread_s = float(early.max())
        self._seen += 1
        first = self._mean is None
        if first:
            self._mean = early.copy()
        # the innovation: earliness against the mean of the *earlier* iterations (zero on the first),
        # so no sample is compared with a mean it dominates
        dev = early - self._mean
        if not first:
            # sums of the sorted products: the moments, and so the decisions, do not depend on the
            # order of the ranks (bit for bit), at a third of math.fsum's cost
            n = dev.size
            self._c0 += self._weight(self._seen - 1) * (_ordered_sum(dev * dev) / n - self._c0)
            if self._prev_dev is not None:
                c1_sample = _ordered_sum(dev * self._prev_dev) / n
                self._c1 += self._weight(self._seen - 2) * (c1_sample - self._c1)
            self._prev_dev = dev
        self._phi = min(max(self._c1 / self._c0, 0.0), 1.0) if self._c0 > 0.0 else 0.0
        decay = _mean_power(self._phi, self.horizon_iters, self.hold_iters)
        held_var = 1.0 - _mean_power(self._phi * self._phi, self.horizon_iters, self.hold_iters)
        self._sigma_h_s = math.sqrt(max(self._c0 * held_var, 0.0))

        forecast = self._mean + decay * dev
        forecast = forecast - forecast.min()
        self._mean = self._mean + self._weight(self._seen) * dev
        self._forecast_spread_s = float(forecast.max())
        engaged = self._seen >= self.warmup_iters and self._forecast_spread_s > self.on_threshold_s
        delay = np.zeros_like(natural_arrival_s)
        if engaged:
            delay = self.gain * np.maximum(forecast - self.margin_sigmas * self._sigma_h_s, 0.0)
        self._max_delay_s = float(delay.max())
        self._active = self._max_delay_s > 0.0  # pacing: some rank delayed (the margin may withhold all)
        return delay

    def _diagnostics(self) -> dict[str, float]:
        return {
            "active": float(self._active),
            "phi": self._phi,
            "sigma_h_s": self._sigma_h_s,
            "forecast_spread_s": self._forecast_spread_s,
            "natural_spread_s": self._spread_s,
            "max_delay_s": self._max_delay_s,
        }
