"""Search spaces for ``python -m pacectl.tune``: YAML mappings from controller keys to distributions.

A space file (``conf/tune/space/<family>.yaml``) maps controller parameters of one family to Optuna
distributions. Keys are controller keys, written bare (``gain``) or dotted (``controller.gain``, as on
the command line); parameters not in the space keep the value of the ``controller`` group (its YAML
plus command-line overrides)::

    on_threshold_s: {type: float, low: 1.0e-3, high: 10.0, log: true}
    off_threshold_s: {type: float, low: 0.0, high: 1.0, fraction_of: on_threshold_s}
    gain: {type: float, low: 0.05, high: 1.0}
    min_dwell_iters: {type: int, low: 0, high: 20}
    window_iters: {type: categorical, choices: [4, 8, 16, 32]}

Fields: ``type`` (``float``, ``int`` or ``categorical``); ``low`` and ``high`` (inclusive, numbers,
``low <= high``); ``log`` (sample on a log scale, ``low > 0``); ``step`` (a grid, not with ``log``);
``choices`` (categorical only). ``fraction_of: <key>`` (float only) reparametrizes a dependent bound:
Optuna samples the fraction in ``[low, high]`` (named ``"<key>/<other>"`` in the study) and the
controller gets ``fraction * <other>``. The shipped threshold and EWMA spaces sample
``off_threshold_s`` as a fraction of ``on_threshold_s`` in [0, 1], so the constructor's
``off_threshold_s <= on_threshold_s`` always holds and no trial is spent on an invalid pair.

Units: with ``controller.units=iteration`` the default space is ``<family>.iteration.yaml`` (time
bounds up to one iteration, not the seconds file's 10 s), and :func:`check_units` refuses a
``tune.space`` whose time bounds go above 1.0.

Every mistake (unknown key or field, bad bounds, unknown type) is a :class:`ConfigError` raised by
:func:`parse_space` before any trial runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pacectl.controllers import FAMILIES, make_controller
from pacectl.controllers import family as _family
from pacectl.controllers.registry import hint
from pacectl.errors import ConfigError, yaml_problem

TYPES = ("float", "int", "categorical")
FIELDS = {
    "float": {"type", "low", "high", "log", "step", "fraction_of"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}


def accepted_params(name: str) -> list[str]:
    """Keyword parameters of the controller family ``name``, sorted.

    Raises:
        ConfigError: unknown family.
    """
    return sorted({*_family(name).params, "units"})  # units: the reserved key of every family


def constructor_defaults(name: str) -> dict[str, Any]:
    """The default of every keyword parameter of ``name``'s constructor, plus ``units: "s"``.

    Raises:
        ConfigError: unknown family.
    """
    return {**_family(name).defaults(), "units": "s"}


def tunable_families(conf_dir: Path | None = None) -> list[str]:
    """The registered families with a default search space (:func:`default_space`), sorted."""
    folder = _space_dir(conf_dir)
    return sorted(
        name for name, fam in FAMILIES.items() if fam.space is not None or (folder / f"{name}.yaml").is_file()
    )


def _space_dir(conf_dir: Path | None) -> Path:
    if conf_dir is None:
        from pacectl.config import CONF_DIR

        conf_dir = CONF_DIR
    return conf_dir / "tune" / "space"


def default_space(
    name: str, units: str, *, fixed: Mapping[str, Any], conf_dir: Path | None = None
) -> SearchSpace:
    """The default search space of family ``name``: the shipped ``conf/tune/space/<name>.yaml``
    (``<name>.iteration.yaml`` with ``units == "iteration"``), else the one the family registered
    (``register(space=..., iteration_space=...)``).

    Raises:
        ConfigError: the family has no space for these units, or it is invalid.
    """
    suffix = ".iteration" if units == "iteration" else ""
    path = _space_dir(conf_dir) / f"{name}{suffix}.yaml"
    fam = _family(name)
    raw = fam.iteration_space if units == "iteration" else fam.space
    if path.is_file():
        return load_space(name, path, fixed=fixed)
    if raw is None:
        which = "iteration_space" if suffix else "space"
        raise ConfigError(
            f"controller {name!r} has no default search space with units={units}: pass tune.space=<file.yaml> "
            f"(conf/tune/space/threshold{suffix}.yaml is an example), or give it one with "
            f"register({which}=...) or conf/tune/space/{name}{suffix}.yaml"
        )
    source = f"{fam.cls.__module__}.{fam.cls.__qualname__} (register {'iteration_' if suffix else ''}space=)"
    return parse_space(name, dict(raw), fixed=fixed, source=source)


@dataclass(frozen=True)
class Dimension:
    """One tuned controller parameter.

    Attributes:
        key: controller parameter name.
        type: ``"float"``, ``"int"`` or ``"categorical"``.
        low: lower bound (inclusive); for ``fraction_of`` the lowest fraction.
        high: upper bound (inclusive).
        log: sample on a log scale.
        step: grid step, or None.
        choices: categorical choices.
        fraction_of: the parameter this one is a fraction of, or None.
    """

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    fraction_of: str | None = None

    @property
    def optuna_name(self) -> str:
        """The parameter's name in the Optuna study (``"<key>/<other>"`` for a fraction)."""
        return f"{self.key}/{self.fraction_of}" if self.fraction_of else self.key

    def suggest(self, trial: Any) -> Any:
        """Draw this dimension from an Optuna ``trial`` (the raw value: a fraction for ``fraction_of``)."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.optuna_name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(
                self.optuna_name,
                int(self.low or 0),
                int(self.high or 0),
                step=int(self.step or 1),
                log=self.log,
            )
        return trial.suggest_float(
            self.optuna_name, float(self.low or 0.0), float(self.high or 0.0), step=self.step, log=self.log
        )

    def describe(self) -> dict[str, Any]:
        """The distribution as a JSON-ready mapping (the fields of a space file, defaults included)."""
        if self.type == "categorical":
            return {"type": self.type, "choices": list(self.choices)}
        return {
            field: getattr(self, field) for field in ("type", "low", "high", "log", "step", "fraction_of")
        }

    def midpoint(self) -> Any:
        """A representative value (geometric middle on a log scale; the first choice if categorical)."""
        if self.type == "categorical":
            return self.choices[0]
        low, high = float(self.low or 0.0), float(self.high or 0.0)
        mid = math.sqrt(low * high) if self.log else 0.5 * (low + high)
        return int(round(mid)) if self.type == "int" else mid


@dataclass(frozen=True)
class SearchSpace:
    """The search space of one controller family.

    Attributes:
        family: controller family name.
        dimensions: the tuned parameters, in file order.
        fixed: parameters not tuned (from the ``controller`` group), passed as they are.
        source: where the space came from (file path), for messages.
    """

    family: str
    dimensions: tuple[Dimension, ...]
    fixed: Mapping[str, Any]
    source: str

    @property
    def keys(self) -> list[str]:
        """The tuned controller keys."""
        return [d.key for d in self.dimensions]

    def resolve(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Controller parameters from raw Optuna values (keyed by :attr:`Dimension.optuna_name`).

        Args:
            raw: Optuna parameter name -> value (``FrozenTrial.params``).

        Returns:
            Every constructor parameter: the fixed ones, then the tuned ones, fractions multiplied out.
        """
        params: dict[str, Any] = dict(self.fixed)
        for dim in self.dimensions:
            if not dim.fraction_of:
                params[dim.key] = raw[dim.optuna_name]
        for dim in self.dimensions:
            if dim.fraction_of:
                params[dim.key] = float(raw[dim.optuna_name]) * float(params[dim.fraction_of])
        return params

    def sample(self, trial: Any) -> dict[str, Any]:
        """Draw every dimension from ``trial`` and return the controller parameters."""
        return self.resolve({dim.optuna_name: dim.suggest(trial) for dim in self.dimensions})

    def tuned(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Only the tuned keys of ``params`` (resolved values)."""
        return {key: params[key] for key in self.keys}

    def describe(self) -> dict[str, Any]:
        """Every tuned key and its distribution (:meth:`Dimension.describe`), sorted by key: what the
        space samples, independent of the file it came from (comments, order, path)."""
        return {d.key: d.describe() for d in sorted(self.dimensions, key=lambda d: d.key)}

    def fixed_settings(self) -> dict[str, Any]:
        """The untuned constructor parameters as a trial sees them: the controller group's values over
        the constructor's defaults (``units`` included), sorted by key."""
        merged = {**constructor_defaults(self.family), **self.fixed}
        return {k: merged[k] for k in sorted(merged) if k not in self.keys}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _dimension(key: str, spec: Any, where: str, params: list[str]) -> Dimension:
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: must be a mapping like {{type: float, low: 0.1, high: 1.0}}, got {spec!r}"
        )
    kind = spec.get("type")
    if kind is None:
        raise ConfigError(f"{where}.type must be set, one of {list(TYPES)} (for example type: float)")
    if kind not in TYPES:
        raise ConfigError(
            f"{where}.type must be one of {list(TYPES)}, got {kind!r}{hint(str(kind), list(TYPES))}"
        )
    for field in spec:
        if field not in FIELDS[kind]:
            allowed = sorted(FIELDS[kind])
            raise ConfigError(
                f"{where}: unknown field {field!r} for type {kind}{hint(str(field), allowed)} (allowed: {', '.join(allowed)})"
            )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list | tuple) or not choices:
            raise ConfigError(f"{where}.choices must be a non-empty list, got {choices!r}")
        for choice in choices:
            if choice is not None and not isinstance(choice, bool | int | float | str):
                raise ConfigError(
                    f"{where}.choices entries must be numbers, strings, booleans or null, got {choice!r}"
                )
        return Dimension(key=key, type=kind, choices=tuple(choices))
    for field in ("low", "high"):
        if field not in spec:
            raise ConfigError(f"{where}.{field} must be set for type {kind}")
    low, high = _number(spec["low"], f"{where}.low"), _number(spec["high"], f"{where}.high")
    if low > high:
        raise ConfigError(f"{where}: low must be <= high, got low={spec['low']!r}, high={spec['high']!r}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{where}: low must be > 0 with log: true, got low={spec['low']!r}")
    step = spec.get("step")
    if step is not None:
        step = _number(step, f"{where}.step")
        if step <= 0:
            raise ConfigError(f"{where}.step must be > 0, got {spec['step']!r}")
        if log:
            raise ConfigError(f"{where}: step cannot be combined with log: true")
    if kind == "int":
        for field in ("low", "high", "step"):
            value = spec.get(field)
            if value is not None and float(value) != int(value):
                raise ConfigError(f"{where}.{field} must be an integer for type int, got {value!r}")
    fraction_of = spec.get("fraction_of")
    if fraction_of is not None:
        fraction_of = str(fraction_of).removeprefix("controller.")
        if fraction_of not in params or fraction_of == key:
            others = [p for p in params if p != key]
            raise ConfigError(
                f"{where}.fraction_of must name another parameter of the controller, got {spec['fraction_of']!r}"
                f"{hint(fraction_of, others)}"
            )
    return Dimension(key=key, type=kind, low=low, high=high, log=log, step=step, fraction_of=fraction_of)


def parse_space(family: str, raw: Any, *, fixed: Mapping[str, Any], source: str) -> SearchSpace:
    """Validate a search-space mapping for ``family``.

    Args:
        family: controller family name.
        raw: the loaded YAML (controller key -> distribution spec).
        fixed: the ``controller`` group's parameters (values of untuned keys).
        source: file name for messages.

    Returns:
        The validated :class:`SearchSpace`.

    Raises:
        ConfigError: unknown family or key, bad field, ``low > high``, time bounds above one iteration
            with ``units: iteration`` (:func:`check_units`), or a space whose middle point the
            controller rejects (every trial would be invalid).
    """
    params = accepted_params(family)
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            f"search space {source} must be a non-empty mapping of controller keys to distributions, got {raw!r}"
        )
    dims: list[Dimension] = []
    for raw_key, spec in raw.items():
        key = str(raw_key).removeprefix("controller.")
        if key not in params:
            raise ConfigError(
                f"search space {source}: unknown key {raw_key!r} for controller {family!r}{hint(key, params)} "
                f"(accepted: {', '.join(params)})"
            )
        if key in {d.key for d in dims}:
            raise ConfigError(f"search space {source}: key {key!r} is given twice")
        dims.append(_dimension(key, spec, f"search space {source}: {raw_key}", params))
    tuned = {d.key for d in dims}
    for dim in dims:
        if dim.fraction_of and dim.fraction_of in tuned:
            other = next(d for d in dims if d.key == dim.fraction_of)
            if other.fraction_of or other.type == "categorical":
                raise ConfigError(
                    f"search space {source}: {dim.key}.fraction_of must name a float or int key that is not "
                    f"itself a fraction, got {dim.fraction_of!r}"
                )
    unknown_fixed = sorted(set(fixed) - set(params))
    if unknown_fixed:
        raise ConfigError(f"controller {family!r} has unknown parameter(s) {unknown_fixed}")
    space = SearchSpace(
        family=family,
        dimensions=tuple(dims),
        fixed={k: v for k, v in fixed.items() if k not in tuned},
        source=source,
    )
    for dim in dims:
        if (
            dim.fraction_of
            and dim.fraction_of not in tuned
            and not isinstance(space.fixed.get(dim.fraction_of), int | float)
        ):
            raise ConfigError(
                f"search space {source}: {dim.key}.fraction_of names {dim.fraction_of!r}, which must be tuned "
                f"or have a numeric value in the controller config, got {space.fixed.get(dim.fraction_of)!r}"
            )
    check_units(space)
    check_bounds(space)
    return space


#: the suffix of a controller's parameter message that points at a command-line override; a search
#: space's problem is its bounds, not an override
_OVERRIDE_HINT = re.compile(r"\s*\(controller '[^']*'(; override: controller\.[^)]*)?\)")


def _rejection(family: str, params: Mapping[str, Any]) -> str | None:
    """The controller's message when it rejects ``params`` (without the override hint), else None."""
    try:
        make_controller(family, **params)
    except ConfigError as err:
        return _OVERRIDE_HINT.sub("", str(err))
    return None


def check_bounds(space: SearchSpace) -> None:
    """Refuse a space whose middle point the controller rejects (most trials would be invalid), naming
    the dimension and the bound(s) at fault.

    Each tuned key is tried at its middle, low and high with every other key at its middle; a key whose
    middle is rejected is reported with the rejected bounds. Combinations only (no single key at fault,
    e.g. two keys that must be ordered) are reported as such.

    Raises:
        ConfigError: naming the space file, the key, the bound and the controller's rule.
    """
    dims = space.dimensions
    raw_middle = {d.optuna_name: d.midpoint() for d in dims}
    middle = space.resolve(raw_middle)
    problem = _rejection(space.family, middle)
    if problem is None:
        return
    defaults = constructor_defaults(space.family)
    # every tuned key at the constructor's default: if the controller still refuses, a fixed value
    # (the controller group, a controller.<key>= override) is at fault, not the space
    try:
        make_controller(space.family, **{**middle, **{k: defaults[k] for k in space.keys if k in defaults}})
    except ConfigError as err:
        raise ConfigError(
            f"{err}: a fixed value of the controller, not of the search space {space.source}"
        ) from None
    for dim in dims:
        if dim.type == "categorical" or dim.fraction_of or dim.key not in defaults:
            continue
        # the middle with this key at the constructor's default: if that passes, the key is at fault
        if _rejection(space.family, {**middle, dim.key: defaults[dim.key]}) is not None:
            continue

        def rejected(value: Any, d: Dimension = dim) -> bool:
            return _rejection(space.family, space.resolve({**raw_middle, d.optuna_name: value})) is not None

        low, high = float(dim.low or 0.0), float(dim.high or 0.0)
        inward = 1 if dim.type == "int" else 1e-6 * (high - low)
        cast = int if dim.type == "int" else float
        # a bound is at fault when it and its inner neighbour are rejected (an open end such as gain's
        # 0 in (0, 1] is sampled with probability zero, so it is no fault)
        bad = [
            f"{field}={_fmt(cast(value))}"
            for field, value, nudged in (("low", low, low + inward), ("high", high, high - inward))
            if rejected(cast(value)) and rejected(cast(min(max(nudged, low), high)))
        ]
        rule = _rejection(space.family, {**middle, dim.key: dim.midpoint()}) or problem
        items = [*bad, f"the middle {_fmt(dim.midpoint())}"]
        listing = " and ".join([", ".join(items[:-1]), items[-1]] if bad else items)
        raise ConfigError(
            f"search space {space.source}: {dim.key}: the {space.family} controller rejects {listing} of "
            f"its range [{_fmt(dim.low)}, {_fmt(dim.high)}] ({rule}); set {dim.key}'s low and high in "
            f"{space.source} within what the controller accepts"
        )
    raise ConfigError(
        f"search space {space.source}: the {space.family} controller rejects the middle of the space "
        f"({', '.join(f'{k}={_fmt(v)}' for k, v in middle.items() if k in space.keys)}): {problem}; "
        f"change the bounds in {space.source} so that its middle is a valid controller"
    )


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_units(space: SearchSpace) -> None:
    """Refuse time bounds above one iteration when the controller works in iteration units.

    With ``units: iteration`` (a fixed controller value) every ``*_s`` parameter is a fraction of the
    median iteration time, so a seconds-sized bound such as ``high: 10.0`` (ten iterations) spends
    most trials where no arrival spread reaches and no delay passes the guard.

    Raises:
        ConfigError: a ``*_s`` dimension (not a ``fraction_of``) with ``high > 1``, naming the file,
            the key and the shipped iteration-unit space.
    """
    if space.fixed.get("units") != "iteration":
        return
    for dim in space.dimensions:
        time_bound = dim.key.endswith("_s") and dim.type != "categorical" and not dim.fraction_of
        if time_bound and float(dim.high or 0.0) > 1.0:
            raise ConfigError(
                f"search space {space.source}: {dim.key} must have high <= 1.0 with controller.units=iteration "
                f"(1.0 = one median iteration time), got high={dim.high!r}; this space looks written for "
                f"seconds. Use a space in iteration units (conf/tune/space/{space.family}.iteration.yaml is "
                "the default with controller.units=iteration) or controller.units=s"
            )


def load_space(family: str, path: str | Path, *, fixed: Mapping[str, Any]) -> SearchSpace:
    """Read and validate the search space file ``path`` for ``family`` (see :func:`parse_space`).

    Raises:
        ConfigError: missing or unparsable file, or an invalid space.
    """
    file = Path(path)
    if file.is_dir():
        raise ConfigError(
            f"search space {str(path)!r} must be a YAML file, got a directory; pass tune.space=<file.yaml> "
            f"(conf/tune/space/{family}.yaml is an example)"
        )
    if not file.is_file():
        raise ConfigError(
            f"search space {str(path)!r} must be an existing YAML file, got a path that does not exist; "
            f"pass tune.space=<file.yaml> (conf/tune/space/{family}.yaml is an example)"
        )
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(
            f"search space {file} must be valid YAML: {yaml_problem(err)}; fix the file"
        ) from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"search space {file} must be a readable UTF-8 YAML file: {err}") from err
    return parse_space(family, raw, fixed=fixed, source=str(file))
