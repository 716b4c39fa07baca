"""The no-pacing baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pacectl.controllers.base import BaseController, FloatArray
from pacectl.controllers.registry import register
from pacectl.types import Observation


@register(in_all=False, paces=False)
@dataclass(kw_only=True, eq=False, repr=False)
class NoPacing(BaseController):
    """Never delays any rank: the baseline every result is compared with.

    Diagnostics: ``active`` (always 0.0).

    Example:
        >>> c = NoPacing()
        >>> c.reset(4, np.random.default_rng(0))
    """

    name = "none"

    def _reset_state(self, num_ranks: int) -> None:
        pass

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        return np.zeros_like(natural_arrival_s)

    def _diagnostics(self) -> dict[str, float]:
        return {"active": 0.0}
