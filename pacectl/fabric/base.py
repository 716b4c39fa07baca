"""Communication-duration models: how long a collective or p2p transfer takes once all members arrived.

The model in force is part of every result. In the **null** model durations are fixed (as recorded,
or as configured) and every op starts at the maximum of its inputs' end times: a max-plus system.
There, delaying a rank can never make any iteration finish earlier, because every start and end time
is a non-decreasing function of every delay. Any gain from pacing therefore has to come from a
timing-dependent model (contention on shared links, interference, cross traffic).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray


@runtime_checkable
class CommModel(Protocol):
    """Gives the intrinsic transfer time of every op instance of a replay.

    Attributes:
        name: short name written into every output (``"null"``, ``"alpha_beta"``, ``"contention"``).
        timing_dependent: True when durations depend on when ops run (pacing can then help or hurt).
        description: one line for reports.
    """

    name: str
    timing_dependent: bool
    description: str

    def transfer_s(self, recorded_transfer_s: NDArray[np.float64]) -> NDArray[np.float64]:
        """Transfer times to replay, ``float64[N, num_steps, dp_size]`` seconds, from the recorded ones."""
        ...


#: Names of the communication models with fixed durations (max-plus: delaying a rank can never
#: shorten an iteration). Every model whose ``timing_dependent`` is False is listed here (a test
#: checks it), so reports can say so from the name an episode carries. A ``contention`` model can
#: be fixed-duration too, on a profile where nothing varies its rate (``ContentionComm.inert_reason``):
#: episodes carry ``comm_timing_dependent`` for that, see :func:`is_timing_dependent`.
FIXED_DURATION_MODELS = ("null", "alpha_beta")


def is_timing_dependent(comm_model: str, timing_dependent: bool | None = None) -> bool:
    """Whether durations depended on timing: the recorded flag if known, else judged by the model's name.

    Example:
        >>> is_timing_dependent("contention"), is_timing_dependent("contention", False)
        (True, False)
        >>> is_timing_dependent("null")
        False
    """
    if timing_dependent is not None:
        return bool(timing_dependent)
    return comm_model not in FIXED_DURATION_MODELS


class NullComm:
    """The null model: every transfer takes exactly its recorded intrinsic time (max-plus, no contention)."""

    name = "null"
    timing_dependent = False
    description = "null (fixed recorded durations, max-plus: pacing cannot shorten an iteration)"

    def transfer_s(self, recorded_transfer_s: NDArray[np.float64]) -> NDArray[np.float64]:
        """Return the recorded transfer times unchanged."""
        return recorded_transfer_s
