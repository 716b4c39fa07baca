"""Test helpers shipped with pacectl: synthetic observations and contract suites.

``ControllerContract`` imports pytest, so it is loaded lazily; ``make_observation`` needs only numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pacectl.testing.observations import (
    make_observation,
    run_closed_loop,
    synthetic_collective_times,
    synthetic_natural_arrivals,
)

if TYPE_CHECKING:
    from pacectl.testing.controller_contract import ControllerContract

__all__ = [
    "ControllerContract",
    "make_observation",
    "run_closed_loop",
    "synthetic_collective_times",
    "synthetic_natural_arrivals",
]


def __getattr__(name: str) -> Any:
    if name == "ControllerContract":
        from pacectl.testing.controller_contract import ControllerContract

        return ControllerContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
