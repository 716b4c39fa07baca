"""The per-rank entry point: a built-in DDP workload with a straggler injector, paced by :class:`Pacer`.

Started by :func:`pacectl.torchdist.launch.launch_workers` through torch's elastic launcher, one
process per rank, with a plain-dict spec (see ``conf/backend/torch.yaml`` for the keys). For each
requested controller run the worker rebuilds the model from the same seed, replays the same seeded
straggler schedule and data, trains ``warmup_iterations + num_iterations`` iterations (pacing off and
not logged during warm-up), and rank 0 writes:

- ``<record_dir>/<family>.parquet``: the canonical trace of every rank (replayable);
- ``<record_dir>/<family>.episode.pkl``: the :class:`~pacectl.types.Episode` plus measurement extras.
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pacectl.torchdist.core import (
    DecisionEngine,
    StragglerSpec,
    episode_from_log,
    marks_to_ops,
    rows_to_trace,
    straggler_schedule,
)
from pacectl.torchdist.pacer import Pacer


def build_model(workload: dict[str, Any]) -> tuple[nn.Module, torch.Tensor]:
    """The built-in model and one synthetic input batch (seeded by ``torch.manual_seed`` beforehand).

    Args:
        workload: ``model`` (``"mlp"`` or ``"transformer"``), ``width``, ``depth``, ``batch_size``,
            ``seq_len`` (transformer), ``heads`` (transformer).

    Returns:
        ``(model, input)``.
    """
    kind, width, depth = str(workload["model"]), int(workload["width"]), int(workload["depth"])
    batch = int(workload["batch_size"])
    if kind == "mlp":
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers), torch.randn(batch, width)
    if kind == "transformer":
        layer = nn.TransformerEncoderLayer(
            d_model=width, nhead=int(workload.get("heads", 4)), dim_feedforward=4 * width, batch_first=True
        )
        return nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False), torch.randn(
            batch, int(workload.get("seq_len", 32)), width
        )
    raise ValueError(f"workload.model must be 'mlp' or 'transformer', got {kind!r}")


def inject(duration_s: float, kind: str) -> None:
    """Straggle for ``duration_s``: ``sleep`` idles, ``burn`` spins the CPU."""
    if duration_s <= 0.0:
        return
    if kind == "sleep":
        time.sleep(duration_s)
        return
    deadline = time.perf_counter() + duration_s
    x = 0
    while time.perf_counter() < deadline:
        x += 1


def run_one(spec: dict[str, Any], family: str, params: dict[str, Any]) -> dict[str, Any]:
    """Train one episode under the guarded ``family`` controller; rank 0 writes its record.

    Returns:
        ``decisions`` (``float64[num_iterations, world]``, every rank's own copy) and, on rank 0,
        ``episode_path`` and ``record_path``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = int(spec["seed"])
    workload = spec["workload"]
    warmup, n_iter = int(workload["warmup_iterations"]), int(workload["num_iterations"])
    torch.manual_seed(seed)
    model, x = build_model(workload)
    torch.manual_seed(seed * 1009 + rank + 1)
    x = torch.randn_like(x)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=float(workload["bucket_cap_mb"]))
    opt = torch.optim.SGD(ddp.parameters(), lr=float(workload.get("lr", 1e-3)))
    pacing = spec["pacing"]
    engine = DecisionEngine(family, params, spec["guard"], num_ranks=world, seed=seed)
    pacer = Pacer(
        engine,
        spin_s=float(pacing["spin_s"]),
        gather_every=int(pacing["gather_every"]),
        control_path=pacing.get("control_path"),
        control_poll_iters=int(pacing["control_poll_iters"]),
    )
    if pacing.get("attach", True):
        pacer.attach(ddp)
    straggler = StragglerSpec(**spec["straggler"])
    schedule = straggler_schedule(straggler, num_iterations=warmup + n_iter, world_size=world, seed=seed)
    fault = spec.get("fault") or {}
    engine.controller.enabled = False
    loop_s = np.zeros(warmup + n_iter)
    for k in range(warmup + n_iter):
        t0 = time.perf_counter()
        if k == warmup:
            pacer.reset_log()
            engine.controller.enabled = True
            engine.controller.reset(world, np.random.default_rng([seed, 0, 0]))
        if fault.get("rank") == rank and fault.get("iteration") == k - warmup:
            os._exit(17)  # simulate a crashed rank (tests)
        opt.zero_grad(set_to_none=True)
        inject(float(schedule[k, rank]), straggler.kind)
        loss = ddp(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        loop_s[k] = time.perf_counter() - t0
    out: dict[str, Any] = {
        "loop_s": loop_s[warmup:],
        "decisions": np.array(pacer.decisions),
        "delay_actual_s": np.array(pacer.delay_actual_s[-n_iter:]) if pacer.delay_actual_s else np.zeros(0),
        "gather_s": np.array(pacer.gather_s),
    }
    if not pacing.get("attach", True):
        dist.barrier()
        return out
    all_marks: list[Any] = [None] * world
    dist.all_gather_object(all_marks, pacer.marks)
    if rank == 0:
        record_dir = Path(spec["record_dir"])
        record_dir.mkdir(parents=True, exist_ok=True)
        rows = [
            row
            for r, marks in enumerate(all_marks)
            for k, m in enumerate(marks)
            for row in marks_to_ops(step=k, rank=r, **m)
        ]
        name = str(spec.get("name", "live"))
        record_path = record_dir / f"{family}.parquet"
        periods = np.array([m["sync_exit_s"] for m in pacer.marks], dtype=np.float64)
        episode = episode_from_log(
            controller=family,
            comm_model=str(spec["comm_model"]),
            observations=pacer.observations,
            iteration_time_s=periods,
            diagnostics=pacer.diagnostics,
        )
        extras = {"gather_s": out["gather_s"], "delay_actual_s": out["delay_actual_s"], "periods_s": periods}
        try:
            from pacectl.traces.canonical import write_canonical

            trace = rows_to_trace(rows, world_size=world, name=f"{name}-{family}", source=str(record_path))
            write_canonical(trace, record_path)
            out["record_path"] = str(record_path)
        except Exception as err:  # noqa: BLE001 - a record failure must not lose the episode
            extras["record_error"] = f"{type(err).__name__}: {err}"
        episode_path = record_dir / f"{family}.episode.pkl"
        with open(episode_path, "wb") as fh:
            pickle.dump({"episode": episode, **extras}, fh)
        out["episode_path"] = str(episode_path)
    dist.barrier()
    return out


@record
def worker_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Entry point of one rank: join the process group, run every requested controller, leave.

    Args:
        spec: plain-dict spec (``runs`` = list of ``[family, params]``, ``workload``, ``straggler``,
            ``guard``, ``pacing``, ``seed``, ``pg_timeout_s``, ``record_dir``, ``comm_model``, ``fault``).

    Returns:
        ``{family: run_one(...)}`` for this rank.
    """
    torch.set_num_threads(int(spec.get("threads", 1)))
    dist.init_process_group(
        backend=str(spec.get("dist_backend", "gloo")), timeout=timedelta(seconds=float(spec["pg_timeout_s"]))
    )
    try:
        return {str(family): run_one(spec, str(family), dict(params)) for family, params in spec["runs"]}
    finally:
        dist.destroy_process_group()
