"""PID pacing on the realised arrival spread.

Source: the structure of simple-pid (``simple_pid/pid.py``): integral clamp for anti-windup, derivative
on measurement, injectable ``dt``; here ``dt`` comes from the observation, never from a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pacectl.checks import within
from pacectl.controllers.base import BaseController, FloatArray, earliness, ewma, relative_to_latest
from pacectl.controllers.registry import register
from pacectl.errors import ControllerError
from pacectl.types import Observation


@register()
@dataclass(kw_only=True, eq=False, repr=False)
class PidController(BaseController):
    """Track a spread setpoint with a PID whose output is a per-rank pacing budget.

    Each iteration ``k``, with ``y_k`` the realised arrival spread (max minus min arrival, pacing delays
    included), seconds. Feeding back the realised spread closes the loop: pacing lowers ``y``, so the
    integral settles where the delays hold the spread at the setpoint (the natural spread, which pacing
    does not change, would only wind the integral up to its limit):

    - error ``e_k = y_k - setpoint_s`` (positive: too much spread, pace more);
    - ``p = kp * e_k``;
    - ``i = clip(i + ki * e_k * dt, 0, output_limit_s)`` (the integral is stored already multiplied by
      ``ki`` and clamped, as in simple-pid, so it can never wind up past the output range);
    - ``d = kd * (y_k - y_{k-1}) / dt``: derivative on measurement, so changing ``setpoint_s`` mid-run
      gives no derivative kick. Because the error is ``measurement - setpoint`` (more spread asks for
      more pacing), this equals ``kd * de/dt`` for a fixed setpoint; ``d = 0`` at the first iteration;
    - output ``u = clip(p + i + d, 0, output_limit_s)``, seconds;
    - ``delay[r] = min(u, gain * predicted[r])`` where ``predicted`` is the EWMA (weight ``smoothing`` on the
      past) of ``earliness[r] = max(natural) - natural[r]``, shifted so the predicted-latest rank gets
      zero: early ranks are delayed by up to ``u`` but never past the predicted latest rank. The
      smoothing keeps the controller from chasing one iteration's noise (with ``smoothing = 0`` a rank
      that happened to be early once is delayed next time, which on i.i.d. noise only costs time).

    Args:
        setpoint_s: target realised arrival spread ``y`` (pacing delays included), seconds, >= 0. A
            plain attribute: it may be changed between iterations.
        kp: proportional gain, seconds of budget per second of spread error, >= 0.
        ki: integral gain, 1/s, >= 0.
        kd: derivative gain, seconds, >= 0.
        output_limit_s: upper bound of the budget ``u``, seconds, > 0.
        dt_s: fixed time step in seconds (> 0), or ``None`` to use each observation's iteration time.
        smoothing: EWMA weight of the previous earliness prediction, in [0, 1); 0 uses the last
            observation only.
        gain: fraction of the predicted earliness a rank may be delayed by, in (0, 1]; below 1 leaves
            a margin for the prediction's error (a rank paced past the actual latest arrival costs time).

    Raises:
        ConfigError: a parameter is out of range.

    Diagnostics: ``active`` (``u > 0``), ``p``, ``i``, ``d``, ``output_s``, ``error_s``, ``spread_s``
    (the last realised spread ``y``; threshold and EWMA report the natural spread as
    ``natural_spread_s``, a different quantity).

    Example:
        >>> c = PidController(setpoint_s=0.005, kp=0.5, ki=0.1)
        >>> c.reset(8, np.random.default_rng(0))
    """

    name = "pid"

    setpoint_s: float = within(0.02, ">= 0")
    kp: float = within(0.5, ">= 0")
    ki: float = within(0.1, ">= 0")
    kd: float = within(0.0, ">= 0")
    output_limit_s: float = within(0.1, "> 0")
    dt_s: float | None = within(None, "> 0")
    smoothing: float = within(0.8, "[0, 1)")
    gain: float = within(0.5, "(0, 1]")

    def _reset_state(self, num_ranks: int) -> None:
        self._p = self._i = self._d = 0.0
        self._output_s = self._error_s = 0.0
        self._last_spread_s: float | None = None
        self._predicted: FloatArray | None = None

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        dt = self.dt_s if self.dt_s is not None else float(obs.iteration_time_s)
        if not (np.isfinite(dt) and dt > 0.0):
            raise ControllerError(
                f"iteration_time_s must be finite and > 0 to serve as the PID time step, got {dt!r} "
                f"(controller {self.name!r}, iteration {obs.iteration}); set dt_s to use a fixed step"
            )
        early = earliness(natural_arrival_s)
        spread = float(obs.arrival_s.max() - obs.arrival_s.min())
        self._error_s = spread - self.setpoint_s
        self._p = self.kp * self._error_s
        self._i = min(max(self._i + self.ki * self._error_s * dt, 0.0), self.output_limit_s)
        self._d = 0.0 if self._last_spread_s is None else self.kd * (spread - self._last_spread_s) / dt
        self._last_spread_s = spread
        self._output_s = min(max(self._p + self._i + self._d, 0.0), self.output_limit_s)
        self._predicted = (
            early if self._predicted is None else ewma(self._predicted, early, 1.0 - self.smoothing)
        )
        return np.minimum(self.gain * relative_to_latest(self._predicted), self._output_s)

    def _diagnostics(self) -> dict[str, float]:
        return {
            "active": float(self._output_s > 0.0),
            "p": self._p,
            "i": self._i,
            "d": self._d,
            "output_s": self._output_s,
            "error_s": self._error_s,
            "spread_s": 0.0 if self._last_spread_s is None else self._last_spread_s,
        }
