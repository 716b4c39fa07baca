"""One error hierarchy for pacectl.

Every class also subclasses the builtin it means, so callers that catch ``ValueError`` or
``RuntimeError`` keep working. Messages follow the form
``"<what> must be <constraint>, got <value!r> (in <file>:<row or key>)"`` plus a hint on how to fix it.
The command-line entry points catch :class:`PacectlError` and print the message without a traceback.
"""

from __future__ import annotations


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
