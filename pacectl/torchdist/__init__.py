"""The real torch.distributed backend: pace a live DDP job, record it, replay it.

Import this package only when a live run is wanted: :mod:`pacectl.torchdist.core` is pure numpy,
while :mod:`~pacectl.torchdist.pacer`, :mod:`~pacectl.torchdist.worker` and
:mod:`~pacectl.torchdist.launch` import torch. Replay, simulation and tuning never import it
(``pacectl.experiment`` loads :class:`~pacectl.torchdist.experiment.TorchExperiment` lazily).

Any DDP loop gets it with one line (``attach``), once the process group is initialised::

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import Pacer
    engine = DecisionEngine("threshold", {}, {"max_delay_frac": 0.5},
                            num_ranks=dist.get_world_size(), seed=0)   # the same on every rank
    pacer = Pacer(engine, control_path="pacing.json").attach(ddp_model)
    ...                 # training loop unchanged
    pacer.flush()       # every rank, at the end: decide on the figures still in flight

The skew figures are exchanged by ``gather="auto"`` by default: on gloo ``"async"``, one tiny
all-reduce at the end of each gradient sync that nobody waits for (decisions pace the next
iteration); on NCCL ``"piggyback"``, riding on the next iteration's smallest gradient bucket (no
extra collective, decisions one iteration more stale). ``gather="collective"`` makes the tiny
all-reduce blocking. See :mod:`pacectl.torchdist.pacer` and
:func:`~pacectl.torchdist.core.resolve_gather` (why, with the measurements).
"""

from __future__ import annotations
