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
#: checks it), so reports can say so from the name an episode carries.
FIXED_DURATION_MODELS = ("null", "alpha_beta")


class NullComm:
    """The null model: every transfer takes exactly its recorded intrinsic time (max-plus, no contention)."""

    name = "null"
    timing_dependent = False
    description = "null (fixed recorded durations, max-plus: pacing cannot shorten an iteration)"

    def transfer_s(self, recorded_transfer_s: NDArray[np.float64]) -> NDArray[np.float64]:
        """Return the recorded transfer times unchanged."""
        return recorded_transfer_s
