"""The paper's threshold controller with hysteresis.

Source: Gopalan and Ali, "When Scaling Fails: Network and Fabric Effects on Distributed GPU Training
Performance": when the arrival spread (latest minus earliest) exceeds a threshold, pace the early ranks
by delaying them before they enter the collective; switch off when the spread is back under the
threshold. The separate off threshold (hysteresis) and the EWMA prediction are this package's choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray, earliness, ewma, relative_to_latest
from pacectl.controllers.registry import register
from pacectl.types import Observation


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class ThresholdController(BaseController):
    """Delay early ranks by a fraction of their predicted earliness while the natural spread is high.

    Each iteration ``k``:

    - ``spread_k = max(natural) - min(natural)``, the spread without pacing;
    - hysteresis: switch on when ``spread_k > on_threshold_s``, off when ``spread_k < off_threshold_s``;
    - prediction: ``pred_k = smoothing * pred_{k-1} + (1 - smoothing) * earliness_k`` with
      ``earliness_k[r] = max(natural) - natural[r]`` (``pred_0 = earliness_0``), then shifted so that the
      predicted-latest rank has zero;
    - while on, ``delay[r] = gain * pred_k[r]``; while off, zero.

    Args:
        on_threshold_s: natural spread above which pacing switches on, seconds, >= 0.
        off_threshold_s: natural spread below which pacing switches off, seconds,
            ``0 <= off_threshold_s <= on_threshold_s``.
        gain: fraction of the predicted earliness to delay, in (0, 1].
        smoothing: EWMA weight of the previous prediction, in [0, 1); 0 uses the last observation only.

    Raises:
        ConfigError: a parameter is out of range; the message names it and shows the bad value.

    Diagnostics: ``active``, ``natural_spread_s``, ``predicted_spread_s`` (largest predicted earliness),
    ``max_delay_s``.

    Example:
        >>> c = ThresholdController(on_threshold_s=0.02, off_threshold_s=0.01, gain=0.5)
        >>> c.reset(8, np.random.default_rng(0))
    """

    name = "threshold"

    on_threshold_s: float = within(0.02, ">= 0")
    off_threshold_s: float = within(0.01, ">= 0")
    gain: float = within(0.5, "(0, 1]")
    smoothing: float = within(0.5, "[0, 1)")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_band("on_threshold_s", "off_threshold_s")

    def _reset_state(self, num_ranks: int) -> None:
        self._active = False
        self._predicted: FloatArray | None = None
        self._spread_s = 0.0
        self._max_delay_s = 0.0

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        early = earliness(natural_arrival_s)
        self._predicted = (
            early if self._predicted is None else ewma(self._predicted, early, 1.0 - self.smoothing)
        )
        self._spread_s = float(early.max())
        if self._active:
            self._active = not self._spread_s < self.off_threshold_s
        else:
            self._active = self._spread_s > self.on_threshold_s
        delay = np.zeros_like(natural_arrival_s)
        if self._active:
            delay = self.gain * relative_to_latest(self._predicted)
        self._max_delay_s = float(delay.max())
        return delay

    def _diagnostics(self) -> dict[str, float]:
        predicted = 0.0 if self._predicted is None else float(relative_to_latest(self._predicted).max())
        return {
            "active": float(self._active),
            "natural_spread_s": self._spread_s,
            "predicted_spread_s": predicted,
            "max_delay_s": self._max_delay_s,
        }
