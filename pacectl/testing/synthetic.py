"""Synthetic op traces with a known communication-timing law, for testing :mod:`pacectl.fabric.fitted`.

:func:`bucket_trace` writes DDP-like steps on one node: a forward pass, a backward segment, one
gradient bucket whose all-reduce overlaps the rest of backward *or not* (a coin per step), and the
end-of-step all-reduce. The bucket's intrinsic time is planted as
``tau0 * exp(beta * x) * lognormal(sigma)`` with ``x`` the number of compute ops on the node that run
while it transfers (both ranks' remaining backward, 2.0, when the coin says so; 0 otherwise), so a
fit should recover ``beta``; ``beta = 0`` is a trace generated under max-plus.
"""

from __future__ import annotations

from pathlib import Path

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
        last = max(max(hand_off[d] + rest, bucket_end) for d in range(dp_size))  # the step's last op ends
        for d in range(dp_size):
            clip_start = max(hand_off[d] + rest, bucket_end)
            rows += [
                (k, d, 0, d, "forward-compute", 0, 0, 0.0, fwd[d]),
                (k, d, 0, d, "backward-compute", 0, 0, fwd[d], bwd0[d]),
                (k, d, 0, d, "grads-reduce-scatter", 0, -1, hand_off[d], bucket_end - hand_off[d]),
                (k, d, 0, d, "backward-compute", 1, 0, hand_off[d], rest),
                (k, d, 0, d, "optimizer-clip-main-grad", 0, -1, clip_start, last + 5e-4 - clip_start),
            ]
    ops = pd.DataFrame(
        rows, columns=["step", "dp_rank", "stage", "rank", "optype", "seq_id", "mc", "start_ts", "duration"]
    )
    meta = JobMeta(name="synthetic", dp_size=dp_size, pp_size=1, world_size=dp_size)
    return OpTrace(
        ops=validate_ops(ops, meta, source="synthetic"), meta=meta, source="synthetic", fmt="synthetic"
    )


def tiled_bytedance(
    out_dir: str | Path,
    *,
    name: str = "AR",
    dp_factor: int = 1,
    step_factor: int = 1,
    jitter: float = 0.0,
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write a larger ByteDance-schema trace made of copies of a shipped one (for benchmarks).

    DP rank ``d`` of copy ``c`` is ``d + c * dp_size``; step ``k`` of repeat ``j`` is
    ``k + j * (num_steps recorded span)``. Global ranks are renumbered ``(stage * dp + dp_rank) * tp``.
    With ``jitter > 0`` each copy's durations (and the later start times of its ops) are scaled by
    one factor ``1 + jitter * U(0, 1)`` per (copy, step repeat, dp_rank, stage), so copies differ.

    Args:
        out_dir: folder to write ``trace-<name>xDP.parquet`` and ``meta-<name>xDP.yaml`` into.
        name: the shipped trace to tile (``AR`` or ``ST``).
        dp_factor: copies along the DP axis (>= 1); step_factor: repeats along the step axis (>= 1).
        jitter: relative per-rank scaling of the copies, >= 0.
        seed: RNG seed for the jitter.

    Returns:
        ``(parquet_path, meta_path)``.
    """
    import yaml

    from pacectl.data import shipped_trace

    parquet, meta_path = shipped_trace(name)
    df = pd.read_parquet(parquet)
    meta = yaml.safe_load(Path(meta_path).read_text())
    dp, pp, tp = int(meta["dp_size"]), int(meta["pp_size"]), int(meta["tp_size"])
    span = int(df["step"].max() - df["step"].min() + 1)
    rng = np.random.default_rng(seed)
    parts = []
    new_dp = dp * dp_factor
    for j in range(step_factor):
        for c in range(dp_factor):
            part = df.copy()
            part["step"] = part["step"] + j * span
            dp_rank = part["dp_rank"].to_numpy(np.int64) + c * dp
            part["dp_rank"] = dp_rank.astype(np.int32)
            part["rank"] = ((part["stage"].to_numpy(np.int64) * new_dp + dp_rank) * tp).astype(np.int32)
            if jitter > 0 and (c or j):
                scale = 1.0 + jitter * rng.uniform(0.0, 1.0, size=(dp, pp))
                f = scale[df["dp_rank"].to_numpy(np.int64), df["stage"].to_numpy(np.int64)]
                part["duration"] = (part["duration"].to_numpy(np.float64) * f).astype(np.float32)
                part["start_ts"] = (part["start_ts"].to_numpy(np.float64) * f).astype(np.float32)
            parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["optype"] = out["optype"].astype("category")
    tag = f"{name}x{dp_factor}" + (f"s{step_factor}" if step_factor > 1 else "")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / f"trace-{tag}.parquet"
    meta_out = out_dir / f"meta-{tag}.yaml"
    out.to_parquet(trace_path, index=False)
    new_meta = dict(
        meta, trial_name=tag, dp_size=new_dp, world_size=new_dp * pp * tp * int(meta.get("dsp_size", 1))
    )
    meta_out.write_text(yaml.safe_dump(new_meta))
    return trace_path, meta_out


def steplevel_csv(path: str | Path, *, num_workers: int, num_iterations: int, seed: int = 0) -> Path:
    """Write an Alibaba-PAI-layout step-level CSV (``,worker,gpu,time,batch_time_norm``) for benchmarks.

    Batch times are ``round(500 * lognormal(0, 0.05))`` with one slow worker (``worker 0`` x 1.2) and
    a slow iteration every 50; ``time`` counts every 10th iteration, as in the PAI files.

    Args:
        path: the CSV to write.
        num_workers: workers (DP ranks); num_iterations: recorded iterations.
        seed: RNG seed.

    Returns:
        ``path``.
    """
    rng = np.random.default_rng(seed)
    t = 500.0 * rng.lognormal(0.0, 0.05, size=(num_iterations, num_workers))
    t[:, 0] *= 1.2
    t[::50] *= 1.1
    it = np.arange(num_iterations)
    frame = pd.DataFrame(
        {
            "worker": np.tile(np.arange(num_workers), num_iterations),
            "gpu": 100,
            "time": np.repeat(1 + 10 * it, num_workers),
            "batch_time_norm": np.round(t).astype(np.int64).ravel(),
        }
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path)
    return path
