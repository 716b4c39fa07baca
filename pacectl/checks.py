"""Range checks of the typed configs: each field states its range beside its default.

A component's config is a dataclass that subclasses :class:`Checked` (a controller is one itself,
its fields its parameters). Its type hints are what OmegaConf checks when Hydra composes it (a wrong
type is refused there, in one line: :func:`pacectl.errors.config_error`); its ranges are checked in
``__post_init__``, also for callers in Python::

    @dataclass(kw_only=True)
    class GuardConfig(Checked):
        section = "guard"
        max_delay_frac: float = within(0.5, "> 0")
        window_iters: int = within(32, ">= 1")

A range is an interval ``"(0, 1]"`` / ``"[0, 1)"`` or a bound ``">= 0"`` / ``"> 0"``; ``choices=``
names the values a string may take; ``flag(False)`` is a strict boolean. Every ``float`` must be
finite; an ``int`` may be given as an integral float (``8.0``, stored as ``8``); ``X | None`` also
takes None; a ``list[int]`` has each item checked. Messages name the key, the constraint, the value
and where to set it: ``"guard.window_iters must be an integer >= 1, got 0 (override:
guard.window_iters=<value>)"``.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from pacectl.errors import ConfigError, config_error, did_you_mean, dotted

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


def within(
    default: Any,
    spec: str | None = None,
    *,
    choices: tuple[str, ...] | None = None,
    what: str | None = None,
    example: Any = None,
) -> Any:
    """A dataclass field with its default and its range (``spec``, see :meth:`Range.parse`; for a
    list, each item's) or the strings it may be (``choices``); ``what`` says in words what it must
    be, in place of the range, and ``example`` a value to show, in place of the default (one that
    is None or must be set), in its messages."""
    meta = dict(range=Range.parse(spec) if spec else None, choices=choices, what=what, example=example)
    meta = {k: v for k, v in meta.items() if v is not None}
    if isinstance(default, list | dict):  # a list or dict default is made afresh for each instance
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag(default: bool | None) -> Any:
    """A true-or-false field, annotated ``Any``: OmegaConf would read ``no``, ``off`` or ``2`` as a
    boolean, this refuses anything but true and false (in ``__post_init__``); a None default: unset,
    and None is allowed."""
    return field(default=default, metadata={"kind": bool, "optional": default is None})


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


def _real(value: object, rng: Range) -> float:
    """``value`` as a float within ``rng``; else a ConfigError holding what it must be."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL_TYPES):
        raise ConfigError(f"a real number {rng}")
    x = float(value)
    if not math.isfinite(x):
        raise ConfigError(f"a finite number {rng}")
    if x not in rng:
        raise ConfigError(str(rng))
    return x


def _integer(value: object, rng: Range) -> int:
    integral = isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, (bool, np.bool_)) or not integral or int(value) not in rng:  # type: ignore[call-overload]
        raise ConfigError(f"an integer {rng}")
    return int(value)  # type: ignore[call-overload]


def _check(value: object, kind: type, rng: Range | None, choices: tuple[str, ...] | None) -> Any:
    """``value`` checked as a ``kind`` (and normalized); else a ConfigError holding what it must be."""
    if kind is float:
        return _real(value, rng or Range())
    if kind is int:
        return _integer(value, rng or Range(0.0))
    if kind is bool and not isinstance(value, (bool, np.bool_)):
        raise ConfigError("true or false")
    if kind is str and choices and value not in choices:
        raise ConfigError(f"one of {', '.join(choices)}")
    return value


def real(value: object, name: str, rng: Range = Range(), where: str = "") -> float:
    """``value`` as a finite float within ``rng``, or a ConfigError ``"<name> must be ..., got ..."``."""
    try:
        return _real(value, rng)
    except ConfigError as err:
        raise ConfigError(f"{name} must be {err}, got {shown(value)}{where}") from None


def integer(value: object, name: str, low: int = 0, where: str = "") -> int:
    """``value`` as an int ``>= low`` (an integral float such as ``16.0`` too), or a ConfigError."""
    try:
        return _integer(value, Range(float(low)))
    except ConfigError as err:
        raise ConfigError(f"{name} must be {err}, got {shown(value)}{where}") from None


@functools.cache
def _kinds(cls: type) -> dict[str, tuple[type | None, bool, Any]]:
    """Field name -> (its scalar type or None, whether None is allowed, the container (list or
    tuple) of them or None), from the type hints."""
    out: dict[str, tuple[type | None, bool, Any]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        scalars = [a for a in args if a is not type(None)]
        one = scalars[0] if len(scalars) == 1 else None
        many = typing.get_origin(one) if typing.get_origin(one) in (list, tuple) else None
        if many:
            one = (typing.get_args(one) or (None,))[0]
        out[name] = (one if one in (float, int, bool, str) else None, len(scalars) < len(args), many)
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
            kind, optional, many = kinds[f.name]
            kind, optional = f.metadata.get("kind", kind), optional or f.metadata.get("optional", False)
            if kind is None or (value is None and optional) or value == "???":  # "???": not set yet
                continue
            rng, choices = f.metadata.get("range"), f.metadata.get("choices")
            try:
                if not many:
                    checked = _check(value, kind, rng, choices)
                elif isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                    raise ConfigError(f"a list of {kind.__name__}")
                else:
                    checked = many(_check(v, kind, rng, choices) for v in value)
            except ConfigError as err:
                name, where = self.where(f.name)
                where = where.replace("<value>", str(f.metadata.get("example", "<value>")))
                must = f.metadata.get("what") or str(err)
                wrong = [
                    v for v in (value if many else [value]) if isinstance(v, str) and v not in (choices or ())
                ]
                close = did_you_mean(wrong[0], choices) if wrong and choices else None
                hint = f" (did you mean {close!r}{f' for {wrong[0]!r}' if many else ''}?)" if close else ""
                raise ConfigError(
                    f"{name} must be {must}, got {shown(value)}{hint}{where}",
                    key=f"{self.section}.{f.name}" if self.section else f.name,
                    hint=where[where.find("override: ") : -1] if "override: " in where else None,
                ) from None
            object.__setattr__(self, f.name, checked)

    def check_band(self, on: str, off: str) -> None:
        """``0 <= self.<off> <= self.<on>``: a hysteresis band (the fields' own ranges checked first)."""
        if getattr(self, off) > getattr(self, on):
            name, where = self.where(off)
            raise ConfigError(
                f"{name} must be <= {on} ({getattr(self, on):g}), got {shown(getattr(self, off))}"
                f"{where}; the band [off, on] is the hysteresis band"
            )


T = TypeVar("T")


@functools.cache
def _at(cls: type[T], section: str) -> type[T]:
    """``cls`` with its messages naming keys under ``section`` (a list item: ``cluster.jobs.0.compute``)."""
    return type(cls.__name__, (cls,), {"section": section, "__module__": cls.__module__})


def structured(cls: type) -> Any:
    """``OmegaConf.structured(cls)`` with every node writable: OmegaConf makes a frozen dataclass's
    node read-only, so that neither a YAML preset nor an override could set its keys."""
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.structured(cls)
    stack = [node]
    while stack:
        top = stack.pop()
        OmegaConf.set_readonly(top, None)
        stack += [child for k in top if isinstance(child := top._get_node(k), DictConfig)]
    return node


def typed(cls: type[T], node: object, section: str | None = None) -> T:
    """``node`` (a mapping or config node; None: empty) as the typed config ``cls`` (a dataclass),
    checked: its types and keys by OmegaConf, the ranges of a :class:`Checked` by ``__post_init__``;
    ``section`` (default ``cls.section``) is the override path its keys are named under in messages.

    Raises:
        ConfigError: one line (:func:`pacectl.errors.config_error`): a wrong type, an unknown key
            (with a did-you-mean), a value out of range, or a key that must be set and is not.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    where = getattr(cls, "section", "") if section is None else section
    kind = _at(cls, where) if issubclass(cls, Checked) and where != cls.section else cls  # type: ignore[arg-type]
    if node is not None and not isinstance(node, Mapping | DictConfig):
        keys = ", ".join(f.name for f in fields(cls))  # type: ignore[arg-type]
        raise ConfigError(
            f"{where} must be a mapping of {keys}, got {shown(node)}; set {where}.<key>=<value>"
        )
    try:
        if isinstance(node, DictConfig):  # its interpolations resolved where it sits
            node = OmegaConf.to_container(node, resolve=True)
        spec = OmegaConf.to_object(OmegaConf.merge(structured(kind), node or {}))
        if kind is not cls:  # an instance of cls itself, as checked (a class made here does not pickle)
            plain = object.__new__(cls)
            plain.__dict__.update(vars(spec))
            spec = plain
        return spec  # type: ignore[return-value]
    except MissingMandatoryValue as err:
        key = dotted(f"{where}.{err.full_key}" if where else str(err.full_key))
        raise ConfigError(f"{key} must be set (override: {key}=<value>)") from None
    except ConfigError:  # from a list entry's __post_init__, which knows no index
        _named_error(cls, node, where, None)
        raise
    except OmegaConfBaseException as err:
        _named_error(cls, node, where, err)
        raise ConfigError(config_error(err, where)) from None


def _named_error(cls: type, node: Any, where: str, err: Exception | None) -> None:
    """Raise the error of a key of ``node`` under its name where OmegaConf or ``__post_init__``
    named it without: a list for a mapping, or a list's typed entry (``cluster.jobs.0``)."""
    from omegaconf import ListConfig

    hints = typing.get_type_hints(cls)
    for key, value in (node or {}).items():
        hint, name = hints.get(str(key)), f"{where}.{key}" if where else str(key)
        args, listed = typing.get_args(hint) or (hint,), isinstance(value, list | tuple | ListConfig)
        mapping = any(typing.get_origin(a) is dict or is_dataclass(a) for a in (hint, *args))
        if mapping and listed and err is not None and not getattr(err, "full_key", ""):
            raise ConfigError(f"{name} must be a mapping, got {shown(list(value))}") from None
        lists = [typing.get_args(a) for a in (hint, *args) if typing.get_origin(a) is list]
        if lists and lists[0] and is_dataclass(lists[0][0]) and listed:
            for i, item in enumerate(value):
                typed(lists[0][0], item, f"{name}.{i}")  # type: ignore[arg-type]
