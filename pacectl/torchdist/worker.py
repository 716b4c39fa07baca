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
from pacectl.torchdist.launch import is_peer_error
from pacectl.torchdist.pacer import Pacer

#: Seconds a rank that lost a peer waits before it fails (see :func:`worker_main`).
PEER_ERROR_EXIT_DELAY_S = 1.0


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


def run_one(
    spec: dict[str, Any], family: str, params: dict[str, Any], *, label: str | None = None
) -> dict[str, Any]:
    """Train one episode under the guarded ``family`` controller; rank 0 writes its record.

    Args:
        spec: the worker spec (see :func:`worker_main`).
        family: controller family.
        params: its parameters.
        label: names the record files (default: ``family``).

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
    label = label or family
    engine = DecisionEngine(family, params, spec["guard"], num_ranks=world, seed=seed)
    pacer = Pacer(
        engine,
        spin_s=float(pacing["spin_s"]),
        gather_every=int(pacing["gather_every"]),
        gather=str(pacing.get("gather", "piggyback")),
        control_path=pacing.get("control_path"),
        control_poll_iters=int(pacing["control_poll_iters"]),
    )
    attach = pacing.get("attach", True)
    if attach == "allreduce_hook":  # benchmarks: torch's own Python all-reduce hook, no pacer
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
        attach = False
    elif attach:
        pacer.attach(ddp)
    straggler = StragglerSpec(**spec["straggler"])
    schedule = straggler_schedule(straggler, num_iterations=warmup + n_iter, world_size=world, seed=seed)
    fault = spec.get("fault") or {}
    engine.controller.enabled = False
    loop_s = np.zeros(warmup + n_iter)
    for k in range(warmup + n_iter):
        t0 = time.perf_counter()
        if k == warmup:
            pacer.flush()  # the warm-up's last figures: decided on (paced off), not logged
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
    pacer.flush()  # the last figures still in flight (one collective, outside the timed loop)
    out: dict[str, Any] = {
        "loop_s": loop_s[warmup:],
        "decisions": np.array(pacer.decisions),
        "delay_actual_s": np.array(pacer.delay_actual_s[-n_iter:]) if pacer.delay_actual_s else np.zeros(0),
        "gather_s": np.array(pacer.gather_s),
    }
    if not attach:
        dist.barrier()
        return out
    marks = pacer.marks
    all_marks: list[Any] = [None] * world
    dist.all_gather_object(all_marks, marks)
    if rank == 0:
        record_dir = Path(spec["record_dir"])
        record_dir.mkdir(parents=True, exist_ok=True)
        rows = [
            row
            for r, rank_marks in enumerate(all_marks)
            for k, m in enumerate(rank_marks)
            for row in marks_to_ops(step=k, rank=r, **m)
        ]
        name = str(spec.get("name", "live"))
        record_path = record_dir / f"{label}.parquet"
        periods = np.array([m["sync_exit_s"] for m in marks], dtype=np.float64)
        episode = episode_from_log(
            controller=family,
            comm_model=str(spec["comm_model"]),
            observations=pacer.observations,
            iteration_time_s=periods,
            diagnostics=pacer.diagnostics,
            decisions_before=[int(m.get("decisions_before", 0)) for m in marks],
        )
        extras = {
            "gather_s": out["gather_s"],
            "delay_actual_s": out["delay_actual_s"],
            "periods_s": periods,
            "controls_applied": pacer.controls_applied,
        }
        try:
            from pacectl.traces.canonical import write_canonical

            trace = rows_to_trace(rows, world_size=world, name=f"{name}-{family}", source=str(record_path))
            write_canonical(trace, record_path)
            out["record_path"] = str(record_path)
        except Exception as err:  # noqa: BLE001 - a record failure must not lose the episode
            extras["record_error"] = f"{type(err).__name__}: {err}"
        episode_path = record_dir / f"{label}.episode.pkl"
        with open(episode_path, "wb") as fh:
            pickle.dump({"episode": episode, **extras}, fh)
        out["episode_path"] = str(episode_path)
    dist.barrier()
    return out


@record
def worker_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Entry point of one rank: join the process group, run every requested controller, leave.

    Args:
        spec: plain-dict spec (``runs`` = list of ``[family, params]`` or ``[family, params,
            overrides]``, ``workload``, ``straggler``, ``guard``, ``pacing``, ``seed``,
            ``pg_timeout_s``, ``record_dir``, ``comm_model``, ``fault``). ``overrides`` (benchmarks)
            updates ``pacing`` for that run; its ``label`` key (default: the family) names the
            run's result and record files, so one job can interleave variants of one family.

    Returns:
        ``{label: run_one(...)}`` for this rank.
    """
    torch.set_num_threads(int(spec.get("threads", 1)))
    dist.init_process_group(
        backend=str(spec.get("dist_backend", "gloo")), timeout=timedelta(seconds=float(spec["pg_timeout_s"]))
    )
    try:
        out: dict[str, Any] = {}
        for entry in spec["runs"]:
            family, params = str(entry[0]), dict(entry[1])
            overrides = dict(entry[2]) if len(entry) > 2 else {}
            label = str(overrides.pop("label", family))
            run_spec = {**spec, "pacing": {**spec["pacing"], **overrides}}
            out[label] = run_one(run_spec, family, params, label=label)
        return out
    except Exception as err:
        if is_peer_error(str(err)):
            # A peer died: let the agent notice that rank's exit first (it is the root cause; a
            # fork-started job reports only the first exit it sees), then fail with this error.
            time.sleep(PEER_ERROR_EXIT_DELAY_S)
        raise
    finally:
        dist.destroy_process_group()
