"""One error hierarchy for pacectl.

Every class also subclasses the builtin it means, so callers that catch ``ValueError`` or
``RuntimeError`` keep working. Messages follow the form
``"<what> must be <constraint>, got <value!r> (in <file>:<row or key>)"`` plus a hint on how to fix it.
The command-line entry points catch :class:`PacectlError` and print the message without a traceback.
"""

from __future__ import annotations

import difflib
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
    """A configuration value or override is invalid."""


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
    value = section[first]
    shown = (
        str(value).lower()
        if isinstance(value, bool)
        else value
        if isinstance(value, (int, float, str))
        else "..."
    )
    close = difflib.get_close_matches(first, known, n=1) or [k for k in known if k.startswith(first)][:1]
    # where the key came from is not known here (a +key override, a list value, a file): name the key
    fix = f"Remove {where}.{first} (set to {shown})"
    if close:
        fix = f"Did you mean {where}.{close[0]}={shown}? Otherwise remove {where}.{first}"
    return ConfigError(f"{where} has unknown key(s) {unknown}: nothing reads them (known: {known}). {fix}")


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
