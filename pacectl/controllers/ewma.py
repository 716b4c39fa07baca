"""EWMA-hysteresis controller: a smoothed spread, a hysteresis band, and a minimum dwell time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray, earliness, ewma, relative_to_latest
from pacectl.controllers.registry import register
from pacectl.types import Observation


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class EwmaController(BaseController):
    """Pace on an exponentially smoothed natural spread, with a hysteresis band and a minimum dwell.

    Each iteration ``k`` (standard EWMA; the first sample initialises both averages):

    - ``s_k = alpha * spread_k + (1 - alpha) * s_{k-1}``, ``spread_k`` the natural spread, seconds;
    - ``E_k[r] = alpha * earliness_k[r] + (1 - alpha) * E_{k-1}[r]``, shifted so the predicted-latest
      rank has zero;
    - the state may toggle only once it has lasted ``min_dwell_iters`` iterations (the initial off state
      counts as settled, so pacing can switch on at the first iteration): switch on when
      ``s_k > on_threshold_s``, off when ``s_k < off_threshold_s``. Inside the band it never toggles;
    - while on, ``delay[r] = gain * E_k[r]``; while off, zero.

    Args:
        alpha: weight of the newest sample, in (0, 1]; 1 means no smoothing.
        on_threshold_s: smoothed spread above which pacing switches on, seconds, >= 0.
        off_threshold_s: smoothed spread below which pacing switches off, seconds,
            ``0 <= off_threshold_s <= on_threshold_s``.
        min_dwell_iters: minimum iterations between two toggles, >= 0.
        gain: fraction of the smoothed earliness to delay, in (0, 1].

    Raises:
        ConfigError: a parameter is out of range.

    Diagnostics: ``active``, ``smoothed_spread_s``, ``natural_spread_s``, ``dwell_iters`` (iterations
    since the last toggle), ``max_delay_s``.

    Example:
        >>> c = EwmaController(alpha=0.2, on_threshold_s=0.02, off_threshold_s=0.01, min_dwell_iters=5)
        >>> c.reset(8, np.random.default_rng(0))
    """

    name = "ewma"

    alpha: float = within(0.2, "(0, 1]")
    on_threshold_s: float = within(0.02, ">= 0")
    off_threshold_s: float = within(0.01, ">= 0")
    min_dwell_iters: int = within(5, ">= 0")
    gain: float = within(0.5, "(0, 1]")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_band("on_threshold_s", "off_threshold_s")

    def _reset_state(self, num_ranks: int) -> None:
        self._active = False
        self._dwell_iters = self.min_dwell_iters
        self._smoothed_spread_s: float | None = None
        self._smoothed_earliness: FloatArray | None = None
        self._spread_s = 0.0
        self._max_delay_s = 0.0

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        early = earliness(natural_arrival_s)
        spread = early.max()
        if self._smoothed_earliness is None or self._smoothed_spread_s is None:
            self._smoothed_earliness, smoothed = early, spread
        else:
            self._smoothed_earliness = ewma(self._smoothed_earliness, early, self.alpha)
            smoothed = ewma(np.float64(self._smoothed_spread_s), spread, self.alpha)
        self._smoothed_spread_s, self._spread_s = float(smoothed), float(spread)

        self._dwell_iters += 1
        if self._dwell_iters >= self.min_dwell_iters:
            toggle = (
                self._smoothed_spread_s < self.off_threshold_s
                if self._active
                else self._smoothed_spread_s > self.on_threshold_s
            )
            if toggle:
                self._active, self._dwell_iters = not self._active, 0

        delay = np.zeros_like(natural_arrival_s)
        if self._active:
            delay = self.gain * relative_to_latest(self._smoothed_earliness)
        self._max_delay_s = float(delay.max())
        return delay

    def _diagnostics(self) -> dict[str, float]:
        return {
            "active": float(self._active),
            "smoothed_spread_s": 0.0 if self._smoothed_spread_s is None else self._smoothed_spread_s,
            "natural_spread_s": self._spread_s,
            "dwell_iters": float(self._dwell_iters),
            "max_delay_s": self._max_delay_s,
        }
