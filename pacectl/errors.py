"""One error hierarchy for pacectl.

Every class also subclasses the builtin it means, so callers that catch ``ValueError`` or
``RuntimeError`` keep working. Messages follow the form
``"<what> must be <constraint>, got <value!r> (in <file>:<row or key>)"`` plus a hint on how to fix it.
The command-line entry points catch :class:`PacectlError` and print the message without a traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

#: Exit statuses, the same for every command (``python -m pacectl.run``, ``pacectl.tune``, ``pacectl.traces``):
#: 0 success; 2 a user mistake or unusable input (a bad trace or config, a full disk, a busy run
#: folder), after one error line; 130 interrupted (Ctrl-C); 1 a bug (a traceback follows).
EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class PacectlError(Exception):
    """Base class of every error pacectl raises on purpose (user mistakes and bad input)."""


class TraceError(PacectlError, ValueError):
    """A trace file is missing, malformed, or inconsistent with its metadata."""


class ConfigError(PacectlError, ValueError):
    """A configuration value or override is invalid.

    Attributes:
        key: the dotted key of a value out of range (``cluster.jobs.2.start_s``), or None.
        hint: the part of the message that names the override to set it (``override: <key>=0.1``),
            which an entry point replaces when a config file set the value, not an override.
    """

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.key, self.hint = key, hint


class ControllerError(PacectlError, RuntimeError):
    """A controller was used out of order (for example ``act`` before ``reset``)."""


class BackendError(PacectlError, RuntimeError):
    """A backend was used out of order or cannot run on this machine."""


class StorageFullError(PacectlError, RuntimeError):
    """A write found no room (a full disk, a quota, a file-size limit); nothing half-written was kept."""


def one_line_warnings(*, newline: bool = True) -> None:
    """Show warnings as one ``warning (Category): message`` line (the command-line entry points).

    Python's default format adds the file, line and source line of the code that warned, which
    means nothing to a user of the command line.

    Args:
        newline: end the line with a newline (False when ``logging.captureWarnings`` logs them).
    """
    end = "\n" if newline else ""

    def fmt(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
        return one_line_warning(message, category) + end

    warnings.formatwarning = fmt  # type: ignore[assignment]


def one_line_warning(message: Warning | str, category: type[Warning]) -> str:
    """A warning as the command line shows it: ``warning (Category): message``."""
    return f"warning ({category.__name__}): {message}"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``count`` and ``noun`` with the noun in the right number: ``1 problem``, ``3 problems``.

    Example:
        >>> plural(1, "row"), plural(2, "row"), plural(0, "match", "matches")
        ('1 row', '2 rows', '0 matches')
    """
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"


def repair_rows(count: int) -> str:
    """How many rows of a trace are bad and what to do: ``1 row is bad. Drop or repair it``."""
    return "1 row is bad. Drop or repair it" if count == 1 else f"{count} rows are bad. Drop or repair them"


def did_you_mean(word: str, known: Iterable[str]) -> str | None:
    """The closest of ``known`` to ``word`` (a typo: ``kpp`` -> ``kp``; or the one it starts), or None.

    The one did-you-mean of pacectl: every message that suggests a name gets it from here.
    """
    known = [str(k) for k in known]
    # a name the word begins comes first (backend.nproc: nproc_per_node, not the closer-spelled probe)
    begun = next((k for k in known if k.startswith(str(word))), None)
    close = difflib.get_close_matches(str(word), known, n=1, cutoff=0.5)
    return begun if begun is not None else close[0] if close else None


def unknown_keys_error(where: str, section: Mapping[str, Any], known: Iterable[str]) -> ConfigError:
    """The error for the keys of the config ``section`` (at override path ``where``) not in ``known``.

    It lists the unknown and the known keys, and suggests the closest known key with the value given
    (``Did you mean guard.window_iters=4?``) or removing the key.

    Example:
        >>> print(unknown_keys_error("guard", {"windo_iters": 4}, ["window_iters"]))
        guard has unknown key(s) ['windo_iters']: nothing reads them (known: ['window_iters']). Did you mean guard.window_iters=4? Otherwise remove guard.windo_iters
    """
    known = sorted(known)
    unknown = sorted(str(k) for k in section if str(k) not in known)
    first = unknown[0]
    shown = override_value(section[first])
    close = did_you_mean(first, known)
    # where the key came from is not known here (a +key override, a list value, a file): name the key
    fix = f"Remove {where}.{first} (set to {shown})"
    if close:
        fix = f"Did you mean {where}.{close}={shown}? Otherwise remove {where}.{first}"
    return ConfigError(f"{where} has unknown key(s) {unknown}: nothing reads them (known: {known}). {fix}")


def dotted(full_key: str) -> str:
    """OmegaConf's key path (``cluster.jobs[0].ranks``) as an override names it (``cluster.jobs.0.ranks``)."""
    return re.sub(r"\[(\d+)\]", r".\1", full_key)


def override_value(value: object) -> str:
    """A value as an override writes it (``true``, ``0.5``, ``null``; ``...`` for a mapping or list)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, (int, float, str)) else "..."


_KINDS = {float: "a finite number", int: "an integer", bool: "true or false", str: "a string"}
_PLURAL = {float: "finite numbers", int: "integers", bool: "booleans", str: "strings"}


def _kind(hint: Any) -> str:
    """What a value of the type ``hint`` is, in words (``a list of integers``)."""
    import dataclasses
    import typing

    if dataclasses.is_dataclass(hint) or typing.get_origin(hint) is dict:
        return "a mapping"
    if typing.get_origin(hint) in (list, tuple):
        inner = (typing.get_args(hint) or (Any,))[0]
        return f"a list of {_PLURAL[inner]}" if inner in _PLURAL else "a list"
    return _KINDS.get(hint, "a value" if hint is Any else str(hint).replace("typing.", ""))


def _detached_entry(err: BaseException) -> tuple[str, str | None] | None:
    """Where ``err`` arose in a list's entry that OmegaConf checked on its own (a profile's
    ``cluster.jobs`` item, whose keys come without the list's path): the entry's section
    (``cluster.jobs.<i>``) and the job's name where it is set already; else None."""
    from omegaconf import DictConfig, OmegaConf

    root = getattr(err, "parent_node", None)
    with contextlib.suppress(AttributeError):
        while root is not None and root._get_parent() is not None:
            root = root._get_parent()
    section = str(getattr(OmegaConf.get_type(root), "section", "")) if isinstance(root, DictConfig) else ""
    if "<i>" not in section:
        return None
    name = root.get("name") if "name" in root else None
    return section, name if isinstance(name, str) else None


def config_error(err: BaseException, section: str = "") -> str:
    """One line for an OmegaConf validation error (or a Hydra composition error caused by one).

    OmegaConf refuses a value of the wrong type for a typed config (a :mod:`pacectl.checks`
    dataclass in Hydra's ConfigStore) and a key the dataclass does not have; this names the key, the
    value, what it must be, an example (the field's default) and, for an unknown key, the closest
    known one. It reads the exception's fields (``full_key``, ``value``, ``object_type``), not its text;
    ``section`` names the node the key is in when it was checked on its own (``trace``).

    Example:
        >>> from dataclasses import dataclass
        >>> from omegaconf import OmegaConf
        >>> @dataclass
        ... class Guard:
        ...     window_iters: int = 32
        >>> try:
        ...     OmegaConf.merge(OmegaConf.structured(Guard), {"window_iters": "abc"})
        ... except Exception as err:
        ...     print(config_error(err))
        window_iters must be an integer, got 'abc': for example window_iters=32
    """
    from omegaconf.errors import OmegaConfBaseException

    while not isinstance(err, OmegaConfBaseException) and err.__cause__ is not None:
        err = err.__cause__
    if not isinstance(err, OmegaConfBaseException):
        return " ".join(str(err).split())
    key, leaf = dotted(str(getattr(err, "full_key", "") or "")), str(getattr(err, "key", "") or "")
    key = f"{section}.{key}" if section and not key.startswith(f"{section}.") else key
    entry = _detached_entry(err) if not section else None
    if entry is not None:  # a list's entry, checked on its own: cluster.jobs.<i>.<key>
        key = f"{entry[0]}.{key}"
        if entry[1] is not None:  # the index is not known; the job's name may be
            return f"{_config_error(err, key, leaf)} (the entry of job {entry[1]!r})"
    return _config_error(err, key, leaf)


def _config_error(err: Any, key: str, leaf: str) -> str:
    """:func:`config_error` of ``err`` (an OmegaConf error) at override path ``key``, the last
    part of which is ``leaf``."""
    import dataclasses
    import enum
    import typing

    from omegaconf.errors import ConfigKeyError, ValidationError

    cls = getattr(err, "object_type", None)
    declared = (
        {f.name: f for f in dataclasses.fields(cls)}
        if isinstance(cls, type) and dataclasses.is_dataclass(cls)
        else {}
    )
    if isinstance(err, ValidationError) and isinstance(getattr(err, "key", None), int):  # a list's item
        items = [
            typing.get_args(a)[0]
            for a in (err.ref_type, *typing.get_args(err.ref_type))
            if typing.get_args(a)
        ]
        entry = next((a for a in items if isinstance(a, type) and dataclasses.is_dataclass(a)), None)
        if entry is not None:  # an entry of a list of sections (cluster.jobs.0)
            return f"{key} must be a mapping of {', '.join(f.name for f in dataclasses.fields(entry))}, got {err.value!r}"
        return f"{key.rpartition('.')[0]} must be {_kind(err.ref_type)}, got {err.value!r} at [{err.key}]"
    if isinstance(err, ConfigKeyError) and declared:
        close = did_you_mean(leaf, declared)
        fix = f"; did you mean {key.removesuffix(leaf)}{close}?" if close else "; remove it"
        return f"{key}: no such key (known: {', '.join(declared)}){fix}"
    if isinstance(err, ValidationError) and leaf in declared:
        hint = typing.get_type_hints(cls).get(leaf)
        args = (hint,) if typing.get_origin(hint) in (list, tuple, dict) else typing.get_args(hint) or (hint,)
        kinds = [_kind(a) for a in args if a is not type(None)]
        meta = declared[leaf].metadata  # a pacectl.checks field states its range, or what it must be
        must = meta.get("what") or " or ".join(kinds) + (f" {meta['range']}" if meta.get("range") else "")
        must += " or null" if type(None) in args else ""
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            must = "one of " + ", ".join(m.name for m in hint)
        default = meta.get("example", declared[leaf].default)
        example = (  # none where there is no default ("???": must be set) or no index to write
            ""
            if default is None or default is dataclasses.MISSING or default == "???" or "<i>" in key
            else f": for example {key}={override_value(default)}"
        )
        return f"{key} must be {must}, got {getattr(err, 'value', None)!r}{example}"
    return f"{key or 'config'}: " + str(getattr(err, "msg", err)).splitlines()[0]


def yaml_problem(err: BaseException) -> str:
    """A YAML parse error on one line: what is wrong and where (line, column); other errors squeezed
    onto one line.

    Example:
        >>> import yaml
        >>> try:
        ...     yaml.safe_load("a: [1, 2")
        ... except yaml.YAMLError as err:
        ...     print(yaml_problem(err))
        expected ',' or ']', but got '<stream end>' at line 1, column 9
    """
    import yaml

    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        what = err.problem or err.context or "syntax error"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{what}{where}"
    return " ".join(str(err).split())
