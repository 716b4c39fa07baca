"""Shared pieces of the pacing controllers: parameter checks, call-order checks, earliness and EWMA.

Controllers subclass :class:`BaseController` and implement ``_reset_state``, ``_act`` and
``_diagnostics``; the base class does the call-order and shape checks once, at the boundary.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import ConfigError, ControllerError
from pacectl.types import Action, Observation

FloatArray = NDArray[np.float64]

_REAL_TYPES = (int, float, np.integer, np.floating)
_Sample = TypeVar("_Sample", FloatArray, np.float64)


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return "finite"


def _shown(value: object) -> str:
    """``repr`` of a user value, with numpy scalars shown as plain Python numbers; a number given
    as a string (quoted on the command line: Hydra then keeps it a string) says so."""
    if isinstance(value, np.generic):
        return repr(value.item())
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return repr(value)
        if not math.isfinite(number):  # YAML reads a bare nan / inf as text; it is no valid value anyway
            return f"{value!r} (not a finite number)"
        return f"{value!r} (a string: drop the quotes around the number)"
    return repr(value)


def _where(controller: str, name: str) -> str:
    """Where a bad parameter came from, and the override that sets it."""
    if controller == "guard":
        return f"(override: guard.{name}=<value>)"
    return f"(controller {controller!r}; override: controller.{name}=<value>)"


def check_float(
    controller: str,
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Validate a finite real parameter against an interval.

    Args:
        controller: controller family name, quoted in the message.
        name: parameter name.
        value: the value given.
        low: lower bound, or ``None`` for none.
        high: upper bound, or ``None`` for none.
        low_open: exclude ``low`` itself.
        high_open: exclude ``high`` itself.

    Returns:
        ``value`` as a Python ``float``.

    Raises:
        ConfigError: ``"gain must be in (0, 1], got 1.5 (controller 'threshold'; override:
            controller.gain=<value>)"`` and the like.
    """
    constraint = _interval(low, high, low_open, high_open)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL_TYPES):
        raise ConfigError(
            f"{name} must be a real number {constraint}, got {_shown(value)} {_where(controller, name)}"
        )
    x = float(value)
    ok = math.isfinite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if not ok:
        finite = "" if math.isfinite(x) else "a finite number "
        raise ConfigError(
            f"{name} must be {finite}{constraint}, got {_shown(value)} {_where(controller, name)}"
        )
    return x


def check_int(controller: str, name: str, value: object, *, low: int) -> int:
    """Validate an integer parameter ``>= low`` (integral floats such as ``16.0`` are accepted).

    Raises:
        ConfigError: ``"window_iters must be an integer >= 1, got 0 (controller 'quantile'; ...)"``.
    """
    integral = isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, (bool, np.bool_)) or not integral or int(value) < low:  # type: ignore[call-overload]
        raise ConfigError(
            f"{name} must be an integer >= {low}, got {_shown(value)} {_where(controller, name)}"
        )
    return int(value)  # type: ignore[call-overload]


def check_thresholds(controller: str, on_threshold_s: object, off_threshold_s: object) -> tuple[float, float]:
    """Validate a hysteresis band: ``0 <= off_threshold_s <= on_threshold_s``, seconds.

    Raises:
        ConfigError: a threshold is negative or not finite, or the band is inverted.
    """
    on = check_float(controller, "on_threshold_s", on_threshold_s, low=0.0)
    off = check_float(controller, "off_threshold_s", off_threshold_s, low=0.0)
    if off > on:
        raise ConfigError(
            f"off_threshold_s must be <= on_threshold_s ({on:g}), got {_shown(off_threshold_s)} "
            f"(controller {controller!r}); the band [off, on] is the hysteresis band"
        )
    return on, off


def earliness(natural_arrival_s: FloatArray) -> FloatArray:
    """How early each rank is relative to the latest one: ``max(natural) - natural[r]`` (>= 0), seconds.

    Args:
        natural_arrival_s: ``float64[num_ranks]`` unpaced arrivals, seconds.

    Returns:
        ``float64[num_ranks]``, zero for the latest rank. The delay that would make every rank arrive
        together with the latest (see :mod:`pacectl.types` for the loop and its values).
    """
    return natural_arrival_s.max() - natural_arrival_s


def ewma(prev: _Sample, x: _Sample, alpha: float) -> _Sample:
    """One EWMA step ``alpha * x + (1 - alpha) * prev``, elementwise.

    The result is clipped to ``[min(prev, x), max(prev, x)]``: the exact convex combination lies there,
    so the clip only removes floating-point rounding, and by induction the average never leaves the
    range of its inputs. ``alpha == 1`` returns ``x`` exactly.

    Args:
        prev: previous average: ``float64[num_ranks]`` or a ``numpy.float64`` scalar.
        x: new sample, same shape and type.
        alpha: weight of the new sample, in (0, 1].
    """
    mixed = (1.0 - alpha) * prev + alpha * x
    clipped: _Sample = np.clip(mixed, np.minimum(prev, x), np.maximum(prev, x))
    return clipped


def relative_to_latest(predicted_earliness_s: FloatArray) -> FloatArray:
    """Shift predicted earliness so that the predicted-latest rank gets exactly zero.

    A common delay on every rank only lengthens the iteration, so the smallest prediction is removed.
    """
    return predicted_earliness_s - predicted_earliness_s.min()


class BaseController:
    """Call-order and shape checks shared by the built-in controllers.

    Subclasses set ``name`` and implement ``_reset_state``, ``_act`` and ``_diagnostics``.
    """

    name: str = "base"
    #: how this controller's ranks wait inside the paced collective (:attr:`pacectl.types.Action.wait`)
    wait: str = "spin"
    _num_ranks: int | None = None

    def reset(self, num_ranks: int, rng: np.random.Generator | None = None) -> None:
        """Clear all state for a new episode.

        Args:
            num_ranks: ranks in this pacing domain, >= 1.
            rng: unused by the built-in controllers (they are deterministic); accepted for the protocol.

        Raises:
            ConfigError: ``num_ranks`` is not an integer >= 1.
        """
        self._num_ranks = check_int(self.name, "num_ranks", num_ranks, low=1)
        self._reset_state(self._num_ranks)

    def act(self, obs: Observation) -> Action:
        """Delays for the next iteration, ``float64[num_ranks]`` seconds, from this iteration's observation.

        Raises:
            ControllerError: called before ``reset``, or the observation has the wrong number of ranks.
        """
        num_ranks = self._require_reset("act")
        natural = np.asarray(obs.natural_arrival_s, dtype=np.float64)
        if natural.shape != (num_ranks,):
            raise ControllerError(
                f"observation natural_arrival_s must have shape ({num_ranks},) to match "
                f"reset(num_ranks={num_ranks}), got shape {natural.shape} "
                f"(controller {self.name!r}, iteration {obs.iteration})"
            )
        return Action(self._act(obs, natural), self.wait)

    def diagnostics(self) -> dict[str, float]:
        """Internal state; always includes ``"active"``. Keys are stable per class.

        Raises:
            ControllerError: called before ``reset``.
        """
        self._require_reset("diagnostics")
        return {key: float(value) for key, value in self._diagnostics().items()}

    def _require_reset(self, method: str) -> int:
        if self._num_ranks is None:
            raise ControllerError(
                f"controller {self.name!r}: {method}() called before reset(); "
                "call reset(num_ranks, rng) first"
            )
        return self._num_ranks

    def _reset_state(self, num_ranks: int) -> None:
        raise NotImplementedError

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        raise NotImplementedError

    def _diagnostics(self) -> dict[str, float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
