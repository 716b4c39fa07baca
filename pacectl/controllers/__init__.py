"""Pacing controllers, the safety guard that wraps them, and a registry by family name.

Example:
    >>> import numpy as np
    >>> from pacectl.controllers import SafetyGuard, make_controller
    >>> controller = SafetyGuard(make_controller("threshold", on_threshold_s=0.02, gain=0.5))
    >>> controller.reset(8, np.random.default_rng(0))
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from importlib.metadata import entry_points

from pacectl.controllers.base import BaseController

# isort: off
# the built-in families register themselves on import, in this order (controller=all's run order)
from pacectl.controllers.none import NoPacing
from pacectl.controllers.threshold import ThresholdController
from pacectl.controllers.pid import PidController
from pacectl.controllers.ewma import EwmaController
from pacectl.controllers.quantile import QuantileController
from pacectl.controllers.forecast import ForecastController
from pacectl.controllers.sleep_wait import SleepWait
from pacectl.controllers.phase import PhaseController

# isort: on
from pacectl.controllers.guard import PacingGuardWarning, SafetyGuard
from pacectl.controllers.registry import (
    CONTROLLERS,
    FAMILIES,
    SCHEDULE_KEYS,
    Family,
    all_families,
    family,
    hint,
    register,
    unregister,
)
from pacectl.controllers.units import IterationUnits, with_units
from pacectl.errors import ConfigError
from pacectl.types import Controller

# a new module of this package registers its families with no line here (after the built-ins), and
# so does an installed plugin that names its module under the entry point group "pacectl.controllers"
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
for _plugin in entry_points(group="pacectl.controllers"):
    try:
        _plugin.load()
    except Exception as _err:  # noqa: BLE001 - a broken plugin must not break pacectl itself
        warnings.warn(f"controller plugin {_plugin.value!r} failed to load: {_err}", stacklevel=1)

__all__ = [
    "CONTROLLERS",
    "FAMILIES",
    "BaseController",
    "EwmaController",
    "Family",
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
    "all_families",
    "family",
    "fill_schedule",
    "schedule_keys",
    "make_controller",
    "register",
    "unregister",
]


def make_controller(name: str, **params: object) -> Controller:
    """Build a controller from its family name and keyword parameters (for configs and tuning).

    Args:
        name: a registered family name (:data:`~pacectl.controllers.registry.FAMILIES`: the built-in
            ones and any class decorated with :func:`~pacectl.controllers.registry.register`).
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
    fam = family(name)
    params = dict(params)
    units = params.pop("units", "s")
    accepted = sorted(fam.params)
    for key in params:
        if key not in accepted:
            raise ConfigError(
                f"unknown parameter {key!r} for controller {name!r}{hint(key, accepted)} "
                f"(accepted: {', '.join(accepted) or 'none'})"
            )
    controller: Controller = fam.cls(**params)
    return with_units(controller, units)


def schedule_keys(family: str) -> tuple[str, ...]:
    """The :data:`SCHEDULE_KEYS` that ``family``'s constructor takes (none for an unknown family)."""
    fam = FAMILIES.get(family)
    accepted = fam.params if fam is not None else []
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
