"""Quantile controller: align every rank to a quantile of the ranks' predicted arrivals."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray
from pacectl.controllers.registry import register
from pacectl.types import Observation

#: below this many ranks the sorted window's passes run as numpy accumulations down the columns (few
#: calls), from it row by row (contiguous rows; about 2 x window calls): the same minima and maxima
FEW_RANKS = 512


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class QuantileController(BaseController):
    """Delay each rank towards the ``quantile``-th predicted arrival across ranks.

    Each iteration:

    - keep the last ``window_iters`` natural arrivals of each rank (a rolling window, also kept in
      sorted order, updated by one value each iteration);
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
        self._ring = np.zeros((self.window_iters, num_ranks), dtype=np.float64)  # arrival order (slots)
        # each rank's window in ascending order down a column, kept so incrementally (+inf: not filled yet)
        self._sorted = np.full((self.window_iters, num_ranks), np.inf, dtype=np.float64)
        self._buf = np.empty((self.window_iters, num_ranks), dtype=np.float64)
        self._columns = np.arange(num_ranks)
        self._count = 0
        self._active = False
        self._predicted_spread_s = self._target_s = self._max_delay_s = 0.0

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        slot = self._count % self.window_iters
        leaving = self._ring[slot].copy() if self._count >= self.window_iters else np.inf
        self._ring[slot] = natural_arrival_s
        _replace_sorted(self._sorted, leaving, natural_arrival_s, self._columns, self._buf)
        self._count += 1
        predicted = _median_of_sorted(self._sorted, min(self._count, self.window_iters))
        target = float(np.quantile(predicted, self.quantile))
        earliest = float(predicted.min())
        self._predicted_spread_s = float(predicted.max()) - earliest
        self._target_s = target - earliest
        self._active = self._predicted_spread_s > self.on_threshold_s
        delay = np.zeros_like(natural_arrival_s)
        if self._active:
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


def _replace_sorted(
    sorted_s: FloatArray,
    leaving: FloatArray | float,
    entering: FloatArray,
    columns: NDArray[np.intp],
    buf: FloatArray,
) -> None:
    """In ``sorted_s`` (``float64[window, num_ranks]``, each column ascending), replace one copy of
    each column's ``leaving`` value (``+inf``: an unfilled row) with ``entering`` and restore the
    order, in place. Only the replaced value is out of order, so one bubble pass up the rows (it
    carries a value that is too large to its row) and one down (one that is too small) sort each
    column. A bubble pass is a running extremum: up, row ``j`` becomes ``min(max(rows 0..j), row
    j+1)`` and the top row the maximum; down, row ``j`` becomes ``max(row j-1, min(rows j..top))``
    and row 0 the minimum; so both are running extrema over the window, ``O(window x num_ranks)``
    minima and maxima (:data:`FEW_RANKS` says how they run; a partition of every rank's window costs a
    selection per rank, about 10x as much at 16,384 ranks: experiments/bench/README.md). The
    columns hold exactly each rank's window, so every order statistic, and so the median, is the
    one ``numpy.partition`` gives (finite arrivals: the guard passes no others).

    Args:
        sorted_s: ``float64[window, num_ranks]``, updated in place.
        leaving: ``float64[num_ranks]`` the value leaving each window, or ``inf`` while it fills.
        entering: ``float64[num_ranks]`` the value entering it.
        columns: ``arange(num_ranks)``.
        buf: ``float64[window, num_ranks]`` scratch.
    """
    sorted_s[np.count_nonzero(sorted_s < leaving, axis=0), columns] = entering
    top = len(sorted_s) - 1
    if sorted_s.shape[1] < FEW_RANKS:  # few ranks: two accumulations (few calls; they stride down columns)
        np.maximum.accumulate(sorted_s, axis=0, out=buf)
    else:  # many: row by row, each row contiguous
        buf[0] = sorted_s[0]
        for j in range(1, top + 1):
            np.maximum(buf[j - 1], sorted_s[j], out=buf[j])
    np.minimum(buf[:-1], sorted_s[1:], out=buf[:-1])  # the pass up is in buf
    if sorted_s.shape[1] < FEW_RANKS:
        np.minimum.accumulate(buf[::-1], axis=0, out=sorted_s[::-1])
    else:
        sorted_s[top] = buf[top]
        for j in range(top - 1, -1, -1):
            np.minimum(sorted_s[j + 1], buf[j], out=sorted_s[j])
    np.maximum(buf[:-1], sorted_s[1:], out=sorted_s[1:])  # the pass down, back in sorted_s


def _median_of_sorted(sorted_s: FloatArray, filled: int) -> FloatArray:
    """Median of each column's first ``filled`` rows of ``float64[window, num_ranks]`` sorted down
    the columns (the value ``np.median`` gives of those values: the middle one, or the mean of the two)."""
    if filled % 2:
        return sorted_s[filled // 2].copy()
    return 0.5 * (sorted_s[filled // 2 - 1] + sorted_s[filled // 2])
