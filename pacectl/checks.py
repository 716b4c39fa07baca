"""Range checks of the typed configs: each field states its range beside its default.

A component's config is a dataclass that subclasses :class:`Checked`. Its type hints are what
OmegaConf checks when Hydra composes it (wrong types and unknown keys are refused there, see
:func:`pacectl.errors.config_error`); its ranges are checked in ``__post_init__``, also for callers in
Python::

    @dataclass
    class ThresholdConfig(Checked):
        section = "controller"
        gain: float = within(0.5, "(0, 1]")
        window_iters: int = within(16, ">= 1")

A range is an interval ``"(0, 1]"`` / ``"[0, 1)"`` or a bound ``">= 0"`` / ``"> 0"``; ``choices=``
names the values a string may take. Every ``float`` must be finite; an ``int`` may be given as an
integral float (``8.0``, stored as ``8``); ``X | None`` also takes None. Messages:
``"gain must be in (0, 1], got 1.5 (controller 'threshold'; override: controller.gain=<value>)"``.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from pacectl.errors import ConfigError

_REAL_TYPES = (int, float, np.integer, np.floating)
_SPEC = re.compile(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])|(>=|>|<=|<)\s*(\S+)")


@dataclass(frozen=True)
class Range:
    """An interval of real numbers; None bounds are open-ended."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @classmethod
    def parse(cls, spec: str) -> Range:
        """``"(0, 1]"``, ``"[0, 1)"``, ``">= 0"``, ``"> 0"``, ``"<= 2"`` or ``"< 2"``."""
        m = _SPEC.fullmatch(spec.strip())
        if m is None:
            raise ValueError(f"a range must look like '(0, 1]' or '>= 0', got {spec!r}")
        if m.group(1):
            return cls(float(m.group(2)), float(m.group(3)), m.group(1) == "(", m.group(4) == ")")
        op, bound = m.group(5), float(m.group(6))
        return cls(bound, None, op == ">") if op[0] == ">" else cls(None, bound, False, op == "<")

    def __contains__(self, x: float) -> bool:
        lo = self.low is None or (x > self.low if self.low_open else x >= self.low)
        return lo and (self.high is None or (x < self.high if self.high_open else x <= self.high))

    def __str__(self) -> str:
        low, high = self.low, self.high
        if low is not None and high is not None:
            return f"in {'(' if self.low_open else '['}{low:g}, {high:g}{')' if self.high_open else ']'}"
        if low is not None:
            return f"{'>' if self.low_open else '>='} {low:g}"
        if high is not None:
            return f"{'<' if self.high_open else '<='} {high:g}"
        return "finite"


def within(default: Any, spec: str | None = None, *, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with its default and its range (``spec``, see :meth:`Range.parse`) or the
    strings it may be (``choices``)."""
    return field(default=default, metadata={"range": Range.parse(spec) if spec else None, "choices": choices})


def shown(value: object) -> str:
    """``repr`` of a user value, with numpy scalars shown as plain Python numbers; a number given as a
    string (quoted on the command line: Hydra then keeps it a string) says so."""
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


def real(value: object, name: str, rng: Range = Range(), where: str = "") -> float:
    """``value`` as a finite float within ``rng``, or a ConfigError ``"<name> must be ..., got ..."``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL_TYPES):
        raise ConfigError(f"{name} must be a real number {rng}, got {shown(value)}{where}")
    x = float(value)
    if not (math.isfinite(x) and x in rng):
        finite = "" if math.isfinite(x) else "a finite number "
        raise ConfigError(f"{name} must be {finite}{rng}, got {shown(value)}{where}")
    return x


def integer(value: object, name: str, low: int = 0, where: str = "") -> int:
    """``value`` as an int ``>= low`` (an integral float such as ``16.0`` too), or a ConfigError."""
    integral = isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, (bool, np.bool_)) or not integral or int(value) < low:  # type: ignore[call-overload]
        raise ConfigError(f"{name} must be an integer >= {low}, got {shown(value)}{where}")
    return int(value)  # type: ignore[call-overload]


@functools.cache
def _kinds(cls: type) -> dict[str, tuple[type | None, bool]]:
    """Field name -> (its scalar type or None, whether None is allowed), from the type hints."""
    out: dict[str, tuple[type | None, bool]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        scalars = [a for a in args if a is not type(None)]
        kind = scalars[0] if len(scalars) == 1 and scalars[0] in (float, int, bool, str) else None
        out[name] = (kind, len(scalars) < len(args))
    return out


class Checked:
    """Base of the typed configs: ``__post_init__`` checks every field (see the module docstring).

    Attributes:
        section: the config section, for the override in messages (``controller``, ``guard``).
        owner: who the config belongs to, in messages (``controller 'pid'``), or None: then the key
            is named with its section (``guard.window_iters must be ...``).
    """

    section: ClassVar[str] = ""
    owner: ClassVar[str | None] = None

    def where(self, key: str) -> tuple[str, str]:
        """``(the key as messages name it, the parenthesis that says where to set it)``."""
        full = f"{self.section}.{key}" if self.section else key
        override = f"override: {full}=<value>"
        return (key, f" ({self.owner}; {override})") if self.owner else (full, f" ({override})")

    def __post_init__(self) -> None:
        kinds = _kinds(type(self))  # type: ignore[arg-type]
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            kind, optional = kinds[f.name]
            if value is None and optional:
                continue
            name, where = self.where(f.name)
            rng, choices = f.metadata.get("range"), f.metadata.get("choices")
            if kind is float:
                value = real(value, name, rng or Range(), where)
            elif kind is int:
                value = integer(value, name, int(rng.low) if rng and rng.low is not None else 0, where)
                if rng is not None and value not in rng:
                    raise ConfigError(f"{name} must be an integer {rng}, got {value!r}{where}")
            elif kind is bool and not isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"{name} must be true or false, got {shown(value)}{where}")
            elif kind is str and choices and value not in choices:
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}{where}")
            object.__setattr__(self, f.name, value)

    def check_band(self, on: str, off: str) -> None:
        """``0 <= self.<off> <= self.<on>``: a hysteresis band (the fields' own ranges checked first)."""
        if getattr(self, off) > getattr(self, on):
            name, where = self.where(off)
            raise ConfigError(
                f"{name} must be <= {on} ({getattr(self, on):g}), got {shown(getattr(self, off))}"
                f"{where}; the band [off, on] is the hysteresis band"
            )
