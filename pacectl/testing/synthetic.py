"""Synthetic op traces with a known communication-timing law, for testing :mod:`pacectl.fabric.fitted`.

:func:`bucket_trace` writes DDP-like steps on one node: a forward pass, a backward segment, one
gradient bucket whose all-reduce overlaps the rest of backward *or not* (a coin per step), and the
end-of-step all-reduce. The bucket's intrinsic time is planted as
``tau0 * exp(beta * x) * lognormal(sigma)`` with ``x`` the number of compute ops on the node that run
while it transfers (both ranks' remaining backward, 2.0, when the coin says so; 0 otherwise), so a
fit should recover ``beta``; ``beta = 0`` is a trace generated under max-plus.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pacectl.traces.model import JobMeta, OpTrace, validate_ops


def bucket_trace(
    *,
    beta: float,
    num_steps: int = 64,
    dp_size: int = 2,
    tau0_s: float = 0.005,
    sigma: float = 0.05,
    seed: int = 0,
) -> OpTrace:
    """A trace whose bucket all-reduce slows by ``exp(beta)`` per compute op running beside it.

    Args:
        beta: planted slope of log intrinsic time per concurrent compute op.
        num_steps: steps; dp_size: ranks (all on one node), >= 2.
        tau0_s: the bucket's intrinsic time with nothing beside it, seconds.
        sigma: lognormal noise of the intrinsic time.
        seed: RNG seed.

    Returns:
        A validated :class:`OpTrace` (pp_size 1, format ``"synthetic"``).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(num_steps):
        covered = True if k == 0 else bool(rng.random() < 0.5)  # step 0 is the DAG's template
        fwd = 0.010 + rng.normal(0, 5e-4, dp_size).clip(-4e-3, 4e-3)
        bwd0 = 0.010 + rng.normal(0, 1e-3, dp_size).clip(-4e-3, 4e-3)
        hand_off = fwd + bwd0
        g = float(hand_off.max())
        x = float(dp_size) if covered else 0.0
        tau = tau0_s * float(np.exp(beta * x)) * float(np.exp(rng.normal(0, sigma)))
        bucket_end = g + tau
        rest = 0.1 if covered else 2e-5  # remaining backward: covers the transfer, or nearly nothing
        for d in range(dp_size):
            comp_end = hand_off[d] + rest
            clip_start = max(comp_end, bucket_end)
            rows += [
                (k, d, 0, d, "forward-compute", 0, 0, 0.0, fwd[d]),
                (k, d, 0, d, "backward-compute", 0, 0, fwd[d], bwd0[d]),
                (k, d, 0, d, "grads-reduce-scatter", 0, -1, hand_off[d], bucket_end - hand_off[d]),
                (k, d, 0, d, "backward-compute", 1, 0, hand_off[d], rest),
                (k, d, 0, d, "optimizer-clip-main-grad", 0, -1, clip_start, 0.0),
            ]
        last = max(max(hand_off[d] + rest, bucket_end) for d in range(dp_size))
        for r in range(len(rows) - 5 * dp_size, len(rows)):
            if rows[r][4] == "optimizer-clip-main-grad":
                step, d, st, rank, op, seq, mc, start, _ = rows[r]
                rows[r] = (step, d, st, rank, op, seq, mc, start, last + 5e-4 - start)
    ops = pd.DataFrame(
        rows, columns=["step", "dp_rank", "stage", "rank", "optype", "seq_id", "mc", "start_ts", "duration"]
    )
    meta = JobMeta(name="synthetic", dp_size=dp_size, pp_size=1, world_size=dp_size)
    return OpTrace(
        ops=validate_ops(ops, meta, source="synthetic"), meta=meta, source="synthetic", fmt="synthetic"
    )
