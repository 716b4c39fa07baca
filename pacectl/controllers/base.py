"""Shared pieces of the pacing controllers: the config base, call-order checks, earliness and EWMA.

Controllers subclass :class:`BaseController` and implement ``_reset_state``, ``_act`` and
``_diagnostics``; the base class does the call-order and shape checks once, at the boundary.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, integer
from pacectl.errors import ControllerError
from pacectl.types import Action, Observation

FloatArray = NDArray[np.float64]

_Sample = TypeVar("_Sample", FloatArray, np.float64)


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


def require_reset(num_ranks: int | None, who: str, method: str) -> int:
    """``num_ranks`` as ``reset`` set it (None: not yet), for ``who``'s ``method``.

    Raises:
        ControllerError: ``num_ranks`` is None (``method`` called before ``reset``).
    """
    if num_ranks is None:
        raise ControllerError(f"{who}: {method}() called before reset(); call reset(num_ranks, rng) first")
    return num_ranks


def check_shape(obs: Observation, field: str, value: object, num_ranks: int, name: str) -> None:
    """Check that the array ``value`` of observation field ``field`` has shape ``(num_ranks,)``.

    Raises:
        ControllerError: another shape (the message names the field, the controller and the iteration).
    """
    shape = np.shape(value)
    if shape != (num_ranks,):
        raise ControllerError(
            f"observation {field} must have shape ({num_ranks},) to match reset(num_ranks={num_ranks}), "
            f"got shape {shape} (controller {name!r}, iteration {obs.iteration})"
        )


class BaseController(Checked):
    """Typed parameters, call-order and shape checks shared by the built-in controllers.

    A subclass is a dataclass, ``@dataclass(kw_only=True, eq=False, repr=False)``: its fields are its
    parameters, its typed config (the keys of ``controller=<name>``), each with its default and
    range (``gain: float = within(0.5, "(0, 1]")``, :mod:`pacectl.checks`), checked when it is
    built. It sets ``name`` and implements ``_reset_state``, ``_act`` and ``_diagnostics``; state
    lives in ``_private`` attributes set by ``_reset_state``.

    Raises:
        ConfigError: a parameter is out of range; the message names it and shows the bad value.
        TypeError: a positional argument, or a keyword that is not a field.
    """

    section: ClassVar[str] = "controller"
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
        self._num_ranks = integer(num_ranks, "num_ranks", 1, f" (controller {self.name!r})")
        self._reset_state(self._num_ranks)

    def act(self, obs: Observation) -> Action:
        """Delays for the next iteration, ``float64[num_ranks]`` seconds, from this iteration's observation.

        Raises:
            ControllerError: called before ``reset``, or the observation has the wrong number of ranks.
        """
        num_ranks = require_reset(self._num_ranks, f"controller {self.name!r}", "act")
        natural = np.asarray(obs.natural_arrival_s, dtype=np.float64)
        check_shape(obs, "natural_arrival_s", natural, num_ranks, self.name)
        return Action(self._act(obs, natural), self.wait)

    def diagnostics(self) -> dict[str, float]:
        """Internal state; always includes ``"active"``. Keys are stable per class.

        Raises:
            ControllerError: called before ``reset``.
        """
        require_reset(self._num_ranks, f"controller {self.name!r}", "diagnostics")
        return {key: float(value) for key, value in self._diagnostics().items()}

    def _reset_state(self, num_ranks: int) -> None:
        raise NotImplementedError

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        raise NotImplementedError

    def _diagnostics(self) -> dict[str, float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
