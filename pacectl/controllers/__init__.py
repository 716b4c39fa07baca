"""Pacing controllers, the safety guard that wraps them, and a registry by family name.

Example:
    >>> import numpy as np
    >>> from pacectl.controllers import SafetyGuard, make_controller
    >>> controller = SafetyGuard(make_controller("threshold", on_threshold_s=0.02, gain=0.5))
    >>> controller.reset(8, np.random.default_rng(0))
"""

from __future__ import annotations

import difflib
import inspect

from pacectl.controllers.base import BaseController
from pacectl.controllers.ewma import EwmaController
from pacectl.controllers.forecast import ForecastController
from pacectl.controllers.guard import PacingGuardWarning, SafetyGuard
from pacectl.controllers.none import NoPacing
from pacectl.controllers.phase import PhaseController
from pacectl.controllers.pid import PidController
from pacectl.controllers.quantile import QuantileController
from pacectl.controllers.sleep_wait import SleepWait
from pacectl.controllers.threshold import ThresholdController
from pacectl.controllers.units import IterationUnits, with_units
from pacectl.errors import ConfigError
from pacectl.types import Controller

__all__ = [
    "CONTROLLERS",
    "BaseController",
    "EwmaController",
    "ForecastController",
    "IterationUnits",
    "NoPacing",
    "PacingGuardWarning",
    "PhaseController",
    "PidController",
    "QuantileController",
    "SafetyGuard",
    "SleepWait",
    "ThresholdController",
    "SCHEDULE_KEYS",
    "fill_schedule",
    "schedule_keys",
    "make_controller",
]

CONTROLLERS: dict[str, type[BaseController]] = {
    cls.name: cls
    for cls in (
        NoPacing,
        ThresholdController,
        PidController,
        EwmaController,
        QuantileController,
        ForecastController,
        SleepWait,
        PhaseController,
    )
}
"""Controller family name -> class."""


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def make_controller(name: str, **params: object) -> Controller:
    """Build a controller from its family name and keyword parameters (for configs and tuning).

    Args:
        name: family name, one of ``CONTROLLERS`` (``"none"``, ``"threshold"``, ``"pid"``, ``"ewma"``,
            ``"quantile"``, ``"forecast"``, ``"sleep_wait"``, ``"phase"``).
        **params: constructor parameters of that class (see its docstring for units and ranges), plus
            the reserved key ``units``: ``"s"`` (default; every ``*_s`` parameter in seconds) or
            ``"iteration"`` (every time as a fraction of the median iteration time, via
            :class:`~pacectl.controllers.units.IterationUnits`, so tuned values transfer between jobs).

    Returns:
        A new, not yet reset, controller (not wrapped in :class:`SafetyGuard`).

    Raises:
        ConfigError: unknown name or parameter (with a "did you mean" suggestion), or a value out of range.

    Example:
        >>> make_controller("pid", setpoint_s=0.005, kp=0.5).name
        'pid'
    """
    known = sorted(CONTROLLERS)
    if name not in CONTROLLERS:
        raise ConfigError(
            f"controller must be one of {', '.join(known)}, got {name!r}{_did_you_mean(str(name), known)}"
        )
    cls = CONTROLLERS[name]
    params = dict(params)
    units = params.pop("units", "s")
    accepted = sorted(
        p.name for p in inspect.signature(cls).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    )
    for key in params:
        if key not in accepted:
            raise ConfigError(
                f"unknown parameter {key!r} for controller {name!r}{_did_you_mean(key, accepted)} "
                f"(accepted: {', '.join(accepted) or 'none'})"
            )
    controller: Controller = cls(**params)
    return with_units(controller, units)


#: constructor parameters that depend on the run's exchange, in order: (its lag, its every); a
#: config value ``auto``, or leaving the key out, means "the run's" (:func:`fill_schedule`)
SCHEDULE_KEYS = ("horizon_iters", "hold_iters")


def schedule_keys(family: str) -> tuple[str, ...]:
    """The :data:`SCHEDULE_KEYS` that ``family``'s constructor takes (none for an unknown family)."""
    cls = CONTROLLERS.get(family)
    accepted = inspect.signature(cls).parameters if cls is not None else {}
    return tuple(key for key in SCHEDULE_KEYS if key in accepted)


def fill_schedule(family: str, params: dict[str, object], lag: int, every: int) -> dict[str, object]:
    """Set a family's exchange-dependent parameters from the run's exchange, in place.

    For a family whose constructor takes ``horizon_iters`` / ``hold_iters`` (the forecast
    controller), a value ``auto`` or a missing key becomes ``lag`` / ``every``: the iterations from
    an observation to the first one its decision paces, and how many it stays in force
    (``exchange.lag_iters`` / ``exchange.every_iters`` offline, the live gather's lag and
    ``gather_every``). Other families' parameters are left as they are.

    Returns:
        ``params`` (an integral float such as ``3.0`` becomes the integer ``3``).

    Raises:
        ConfigError: one of those keys is neither ``auto`` nor an integer >= 1.
    """
    taken = schedule_keys(family)
    for key, value in zip(SCHEDULE_KEYS, (lag, every), strict=True):
        if key not in taken:
            continue
        current = params.get(key, "auto")
        if current == "auto":
            params[key] = value
        elif isinstance(current, float) and current.is_integer() and current >= 1:
            params[key] = int(current)  # 3.0 or 1e3 from a YAML file or the command line
        elif isinstance(current, bool) or not isinstance(current, int) or current < 1:
            raise ConfigError(
                f"{key} must be an integer >= 1 or auto (the run's exchange), got {current!r} "
                f"(controller {family!r}; override: controller.{key}=<value>)"
            )
    return params
