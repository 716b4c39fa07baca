"""The zero-delay baseline for early-arrival interference: no pacing, but the ranks wait asleep.

Per-rank pacing within earliness cannot move a collective's start (:mod:`pacectl.fabric`), so one
of the few ways it can pay is through what an early rank does while it waits: a rank that spins in
the collective steals cycles and I/O from a co-located peer still computing, a rank that sleeps
does not. ``sleep_wait`` isolates exactly that: it delays nobody and has every rank wait asleep
(:attr:`pacectl.types.Action.wait` ``"sleep"``). Wherever interference is the mechanism, it is the
bar every pacing controller must beat: a controller that gains less than ``sleep_wait`` gains only
by turning spinning into sleeping, which a blocking wait gives for free.

What it changes, per backend:

- ``backend=sim``: the early-arrival interference term
  (:class:`~pacectl.fabric.contention.EarlyArrivalInterference`) comes only from spinning waiters,
  so ``sleep_wait`` removes exactly that term and nothing else: with no other timing-dependent
  mechanism its iteration times equal those of the same simulation with ``kappa = 0`` (tested).
- ``backend=replay``: the replay is max-plus (and ``comm=contention`` in replay models no
  interference), so ``sleep_wait`` equals no pacing exactly.
- ``backend=torch`` on CPU/gloo: gloo's TCP pair already blocks on epoll, and a thread waiting on a
  gloo work object blocks on a condition variable: the waiting ranks already sleep, so
  ``sleep_wait`` behaves as no pacing there (its run says so in a note).
- ``backend=torch`` on CUDA/NCCL: the host thread does not block inside the gradient collective
  (DDP makes the compute stream wait on the NCCL stream); the waiting is done by the NCCL kernel, which
  spins on the GPU's SMs, and, between nodes, by NCCL's proxy thread, which busy-polls the network.
  Neither can be put to sleep from pacectl. What a sleeping wait could change there is only the
  host's own synchronisations (``cudaDeviceScheduleBlockingSync`` makes them block instead of
  spin, and must be set before the CUDA context exists); pacectl does not set it. So on NCCL
  ``sleep_wait`` is recorded but changes nothing either, and the interference a spinning kernel
  causes has to be measured on the GPU (``experiments/gpu_check``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pacectl.controllers.none import NoPacing
from pacectl.controllers.registry import register


@register(in_all=False, paces=False)
@dataclass(kw_only=True, eq=False, repr=False)
class SleepWait(NoPacing):
    """Never delays any rank; every rank waits asleep inside the paced collective.

    Its action is zero delay with ``wait="sleep"`` (see the module docstring for what each backend
    makes of it). It takes no parameters.

    Diagnostics: ``active`` (always 0.0: it never paces).

    Example:
        >>> import numpy as np
        >>> c = SleepWait()
        >>> c.reset(4, np.random.default_rng(0))
        >>> from pacectl.testing import make_observation
        >>> a = c.act(make_observation([0.5, 0.6, 0.5, 0.7]))
        >>> a.delay_s.tolist(), a.wait
        ([0.0, 0.0, 0.0, 0.0], 'sleep')
    """

    name = "sleep_wait"
    wait = "sleep"
