"""The open registry of controller families: ``@register`` is all a new controller needs.

A family is registered where its class is defined; its fields are its typed config::

    @register("deadband", space={"band_s": {"type": "float", "low": 1e-3, "high": 1.0, "log": True}})
    @dataclass(kw_only=True, eq=False, repr=False)
    class Deadband(BaseController):
        name = "deadband"
        band_s: float = within(0.01, ">= 0")
        gain: float = within(0.5, "(0, 1]")
        def _act(self, obs, natural_arrival_s): ...

A module in ``pacectl/controllers/`` is imported by the package itself; a plugin elsewhere is
imported by whoever uses it, or named under the entry point group ``pacectl.controllers`` of its
distribution (``[project.entry-points."pacectl.controllers"] deadband = "mypkg.deadband"``). From
then on, with no other file touched, it is:

- a config group option, ``controller=deadband``: its fields, typed, in Hydra's ConfigStore
  (:meth:`Family.node`, stored by :mod:`pacectl.config`), so a wrong type is refused as Hydra
  composes it, and a value out of range when the controller is built;
- one of the runs of ``controller=all`` (unless ``in_all=False``);
- built by :func:`pacectl.controllers.make_controller`, offline and in live jobs;
- checked by the contract suite (:func:`pacectl.testing.controller_contract.registered_contracts`);
- tunable with ``python -m pacectl.tune controller=deadband`` when it declares a search space
  (``space``, the fields of :mod:`pacectl.tuning.space`; ``iteration_space`` for
  ``controller.units=iteration``) or one is shipped as ``conf/tune/space/<family>[.iteration].yaml``;
- listed in ``--help`` and by :func:`describe`.

A YAML preset is optional: none is shipped (the ``controller`` group lives in the ConfigStore
only), but a file ``conf/controller/<preset>.yaml`` is an option of the group, under a name of its
own (a file named like a family would be merged into the stored defaults, which Hydra deprecates):
``defaults: [pid, _self_]`` and then the keys it changes.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pacectl.errors import ConfigError, did_you_mean

#: constructor parameters that depend on the run's exchange, in order: (its lag, its every); a
#: config value ``auto``, or leaving the key out, means "the run's" (:func:`pacectl.controllers.fill_schedule`)
SCHEDULE_KEYS = ("horizon_iters", "hold_iters")

_T = TypeVar("_T", bound=type)


@dataclass(frozen=True)
class Family:
    """One registered controller family.

    Attributes:
        name: the family name (``controller=<name>``; the class's ``name``).
        cls: the controller class; the fields of its ``Config`` dataclass are the family's keys.
        in_all: run by ``controller=all``.
        paces: delays some rank on stragglers (False: a baseline such as ``none``); the contract
            suite's ``expects_pacing``.
        job_level: delays every rank of its domain alike (a job-level phase shift); the contract
            suite's ``job_level``.
        space: the default search space in seconds (a space file's mapping), or None.
        iteration_space: the default search space with ``controller.units=iteration``, or None.
    """

    name: str
    cls: type
    in_all: bool = True
    paces: bool = True
    job_level: bool = False
    space: Mapping[str, Any] | None = None
    iteration_space: Mapping[str, Any] | None = None

    @property
    def params(self) -> list[str]:
        """The family's keys: the fields of its class (a dataclass: its typed config), in order."""
        return [f.name for f in dataclasses.fields(self.cls)]

    def defaults(self) -> dict[str, Any]:
        """The config's defaults (fields without one are left out)."""
        return {
            f.name: f.default for f in dataclasses.fields(self.cls) if f.default is not dataclasses.MISSING
        }

    def config(self) -> dict[str, Any]:
        """The family's config node as a dict: ``name``, the defaults (the exchange-dependent
        :data:`SCHEDULE_KEYS` as ``auto``: the run's) and ``units: s``."""
        params = {k: "auto" if k in SCHEDULE_KEYS else v for k, v in self.defaults().items()}
        return {"name": self.name, **params, "units": "s"}

    def node(self) -> type:
        """The typed node of ``controller=<family>`` in Hydra's ConfigStore: :meth:`config` with the
        config's field types, so that OmegaConf refuses a wrong type when Hydra composes it (the
        :data:`SCHEDULE_KEYS` take ``auto`` or an integer, checked by ``fill_schedule``)."""
        hints = {**typing.get_type_hints(self.cls), "name": str, "units": str}
        meta = {f.name: f.metadata for f in dataclasses.fields(self.cls)}
        fields = [
            (k, Any if k in SCHEDULE_KEYS else hints[k], dataclasses.field(default=v, metadata=meta.get(k)))
            for k, v in self.config().items()
        ]
        return dataclasses.make_dataclass(f"{self.cls.__name__}Config", fields)

    @property
    def waits_asleep(self) -> bool:
        """Its ranks wait asleep in the paced collective (``Action.wait == "sleep"``)."""
        return getattr(self.cls, "wait", "spin") == "sleep"

    @property
    def summary(self) -> str:
        """The first paragraph of the class docstring, on one line."""
        return " ".join((inspect.getdoc(self.cls) or "").split("\n\n", 1)[0].split())


#: family name -> :class:`Family`, in registration order
FAMILIES: dict[str, Family] = {}
#: family name -> class (the same registry, as classes)
CONTROLLERS: dict[str, type] = {}
_listeners: list[Callable[[Family, bool], None]] = []


def register(
    name: str | None = None,
    *,
    in_all: bool = True,
    paces: bool = True,
    job_level: bool = False,
    space: Mapping[str, Any] | None = None,
    iteration_space: Mapping[str, Any] | None = None,
) -> Callable[[_T], _T]:
    """Class decorator: register a controller family (see the module docstring).

    Args:
        name: the family name; default the class's ``name`` attribute (set on the class if missing).
        in_all, paces, job_level, space, iteration_space: as :class:`Family`'s attributes.

    Raises:
        ConfigError: the name is taken by another class, or differs from the class's ``name``.
    """

    def decorate(cls: _T) -> _T:
        own = cls.__dict__.get("name")  # the class's own, not one it inherits (BaseController's "base")
        family_name = name or own
        if not isinstance(family_name, str) or not family_name:
            raise ConfigError(
                f"register: {cls.__qualname__} needs a name (register('<name>') or a 'name' attribute)"
            )
        if own is not None and own != family_name:
            raise ConfigError(
                f"register({family_name!r}): {cls.__qualname__}.name is {own!r}; they must be the same"
            )
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(
                f"register({family_name!r}): {cls.__qualname__} must be a dataclass, its fields its "
                "parameters: @dataclass(kw_only=True, eq=False, repr=False) (see pacectl.controllers.base)"
            )
        cls.name = family_name  # type: ignore[attr-defined]
        cls.owner = f"controller {family_name!r}"  # type: ignore[attr-defined] # named in its range errors
        old = FAMILIES.get(family_name)
        where = (cls.__module__, cls.__qualname__)  # the same class imported again (a reload) may re-register
        if old is not None and old.cls is not cls and (old.cls.__module__, old.cls.__qualname__) != where:
            raise ConfigError(
                f"controller family {family_name!r} is already registered by {old.cls.__module__}."
                f"{old.cls.__qualname__}; pick another name"
            )
        family = Family(family_name, cls, in_all, paces, job_level, space, iteration_space)
        FAMILIES[family_name] = family
        CONTROLLERS[family_name] = cls
        for listener in _listeners:
            listener(family, True)
        return cls

    return decorate


def unregister(name: str) -> None:
    """Remove a family (tests that register one of their own clean up with this)."""
    family = FAMILIES.pop(name, None)
    CONTROLLERS.pop(name, None)
    if family is not None:
        for listener in _listeners:
            listener(family, False)


def subscribe(listener: Callable[[Family, bool], None]) -> None:
    """Call ``listener(family, registered)`` for every family registered now and later (and with
    ``registered=False`` on :func:`unregister`): how the config layer keeps Hydra's ConfigStore in step."""
    _listeners.append(listener)
    for family in list(FAMILIES.values()):
        listener(family, True)


def hint(word: str, known: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` (:func:`pacectl.errors.did_you_mean`), or ``""``."""
    close = did_you_mean(word, known)
    return f"; did you mean {close!r}?" if close else ""


def family(name: str) -> Family:
    """The registered family ``name``.

    Raises:
        ConfigError: no such family (with a did-you-mean).
    """
    if name not in FAMILIES:
        known = sorted(FAMILIES)
        raise ConfigError(
            f"controller must be one of {', '.join(known)}, got {name!r}{hint(str(name), known)}"
        )
    return FAMILIES[name]


def all_families() -> list[str]:
    """The families ``controller=all`` runs, in registration order."""
    return [f.name for f in FAMILIES.values() if f.in_all]


def describe() -> str:
    """One line per family: its name, summary and keys with their defaults (``--help``)."""
    lines = []
    for f in FAMILIES.values():
        keys = ", ".join(f"{k}={v}" for k, v in f.config().items() if k != "name") or "no keys"
        lines.append(f"  {f.name}: {f.summary} Keys: {keys}.")
    return "\n".join(lines)
