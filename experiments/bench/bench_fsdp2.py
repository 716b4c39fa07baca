"""Zero-delay overhead of the FSDP2 pacer against plain FSDP2 (figures in ``results/fsdp2.json``).

Measured the way ``bench_torchdist.py`` measures the DDP pacer: every rank builds one FSDP2 model
per variant (same seed; ``fully_shard`` per Linear, then the root, on a 1-D CPU device mesh over
``--nproc`` gloo ranks) and trains them *interleaved inside one job*, in blocks of ``--block``
iterations, round-robin, the order rotating every round; each round gives one paired difference
per variant (its block's mean iteration time minus plain FSDP2's, same round), so the shared
machine's drift cancels. Variants:

- ``plain``: FSDP2 with its default all-gather and reduce-scatter (FSDP2's default resharding);
- ``custom_comms``: a custom all-gather and reduce-scatter (``set_custom_all_gather``,
  ``set_custom_reduce_scatter``) that only call ``all_gather_single`` / ``reduce_scatter_single``:
  the floor of *any* Python custom comm, which the pacer's two comms are;
- ``async`` / ``collective``: :class:`~pacectl.torchdist.pacer.Pacer` attached (controller
  ``none``: every delay zero; ``fsdp2_paced="forward"``, the default, which routes every
  all-gather of forward and backward through its bookkeeping), exchanging by the tiny async or
  blocking all-reduce;
- ``async_backward``: as ``async`` with ``fsdp2_paced="backward"`` (the forward's all-gathers pass
  through untimed).

Reported: plain's median iteration time; per variant the median paired difference in ms and as a
fraction of plain's iteration time, with a 95 % bootstrap interval over rounds; ``loadavg`` before
and after (the machine is shared with other engineers' jobs).

Usage: ``python experiments/bench/bench_fsdp2.py [--nproc 2] [--width 512] [--rounds 40] [--block 5]
[--device cpu|cuda] [--backend gloo|nccl] [--out results/fsdp2.json]``

``--device cuda``: the models and FSDP2's collectives on CUDA, so the pacer takes its CUDA path
(device-side waits on FSDP2's streams, CUDA events around every collective, the device times read
at the iteration's end); the block times wait for the device. With ``--backend nccl`` (the
default on CUDA) each rank needs a GPU of its own (NCCL refuses two ranks on one GPU). With
``--backend gloo`` the ranks may share one GPU (gloo copies CUDA tensors through the host): this is
what ``experiments/gpu_check/device_run.sh`` runs on its one GPU, since with a single rank FSDP2
issues no collective at all and there would be nothing to pace. Gloo's host copies lengthen the
iteration, so that figure is the pacer's CUDA-path cost on a gloo-speed iteration, not on NCCL's.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write_record  # noqa: E402

VARIANTS = ("plain", "custom_comms", "async", "collective", "async_backward")


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of the interleaved job; ``times_s``: ``float64[rounds, variants]`` block means."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import PacedAllGather, PacedReduceScatter, Pacer, fsdp2_modules
    from pacectl.torchdist.worker import build_model

    class PlainReduceScatter(PacedReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # type: ignore[no-untyped-def]
            dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group)

    class PlainAllGather(PacedAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):  # type: ignore[no-untyped-def]
            return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)

    torch.set_num_threads(1)
    cuda = spec.get("device", "cpu") == "cuda"
    dev = torch.device("cpu")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        count = torch.cuda.device_count()
        if spec["backend"] == "nccl" and local >= count:
            raise RuntimeError(f"--backend nccl needs a GPU per rank: {count} visible, rank {local} has none")
        dev = torch.device("cuda", local % max(count, 1))
        torch.cuda.set_device(dev)
    dist.init_process_group(spec.get("backend", "gloo"), timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",))
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    workload = spec["workload"]
    setups = []
    for name in spec["variants"]:
        torch.manual_seed(0)
        model, x = build_model(workload)
        torch.manual_seed(1009 + rank)
        x = torch.randn_like(x).to(dev)
        model = model.to(dev)
        for layer in [m for m in model.modules() if isinstance(m, torch.nn.Linear)]:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        pacer = None
        if name == "custom_comms":
            rs, ag = PlainReduceScatter(None), PlainAllGather(None)  # type: ignore[arg-type]
            for m in fsdp2_modules(model):
                m.set_custom_reduce_scatter(rs)
                if m._get_fsdp_state()._fsdp_param_groups:
                    m.set_custom_all_gather(ag)
        elif name != "plain":
            engine = DecisionEngine("none", {}, {"max_delay_frac": 0.5}, num_ranks=world, seed=0)
            gather, _, paced = name.partition("_")
            pacer = Pacer(
                engine, gather=gather, group=mesh.get_group(), fsdp2_paced=paced or "forward"
            ).attach(model)
        setups.append((model, opt, x, pacer))

    def step(model: Any, opt: Any, x: Any) -> None:
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    for model, opt, x, _ in setups:
        for _ in range(3):
            step(model, opt, x)
    rounds, block = int(spec["rounds"]), int(spec["block"])
    times = np.zeros((rounds, len(setups)))
    for r in range(rounds):
        shift = r % len(setups)
        for i in list(range(shift, len(setups))) + list(range(shift)):
            model, opt, x, pacer = setups[i]
            if pacer is not None:
                pacer.align()  # as the live runs do between blocks
            sync()
            t0 = time.perf_counter()
            for _ in range(block):
                step(model, opt, x)
            sync()
            times[r, i] = (time.perf_counter() - t0) / block
    for *_, pacer in setups:
        if pacer is not None:
            pacer.flush()
    dist.barrier()
    setups.clear()
    gc.collect()
    dist.destroy_process_group()
    return {"times_s": times}


def _paired(diff: np.ndarray, scale: float) -> dict[str, float]:
    from scipy import stats

    ci = stats.bootstrap((diff,), np.median, confidence_level=0.95, n_resamples=2000, random_state=0)
    low, high = ci.confidence_interval
    return {
        "median_ms": float(np.median(diff)) * 1e3,
        "ci95_ms": [float(low) * 1e3, float(high) * 1e3],
        "frac": float(np.median(diff)) / scale,
        "ci95_frac": [float(low) / scale, float(high) / scale],
    }


def main() -> None:
    from pacectl.torchdist.launch import launch_workers

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: gloo on cpu, nccl on cuda"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fsdp2.json")
    args = parser.parse_args()
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cpu" and backend == "nccl":
        parser.exit(2, "bench_fsdp2: error: --backend nccl needs --device cuda\n")
    spec = {
        "variants": list(VARIANTS),
        "rounds": args.rounds,
        "block": args.block,
        "device": args.device,
        "backend": backend,
        "workload": {"model": "mlp", "width": args.width, "depth": args.depth, "batch_size": args.batch},
    }
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    out = launch_workers(spec, nproc_per_node=args.nproc, start_method="fork", entrypoint=worker)[0]
    times = out["times_s"]
    plain = times[:, 0]
    scale = float(np.median(plain))
    row = {
        "world_size": args.nproc,
        "device": args.device,
        "backend": backend,
        "workload": f"mlp width {args.width} depth {args.depth} batch {args.batch}, fully_shard per Linear",
        "rounds": args.rounds,
        "block_iterations": args.block,
        "plain_iteration_median_ms": scale * 1e3,
        "iteration_median_ms": {v: float(np.median(times[:, i])) * 1e3 for i, v in enumerate(VARIANTS)},
        "overhead_vs_plain": {v: _paired(times[:, i] - plain, scale) for i, v in enumerate(VARIANTS) if i},
        "overhead_vs_custom_comms": {
            v: _paired(times[:, i] - times[:, 1], scale) for i, v in enumerate(VARIANTS) if i > 1
        },
        "block_mean_ms": {v: (times[:, i] * 1e3).round(4).tolist() for i, v in enumerate(VARIANTS)},
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": "python " + " ".join(sys.argv),
    }
    print({k: v for k, v in row.items() if k != "block_mean_ms"})
    write_record(
        args.out,
        [row],
        note=(
            "zero-delay FSDP2 pacer vs plain FSDP2, interleaved and paired inside one gloo job on CPU; the "
            "machine (2 cores) was shared with other engineers' jobs while measured (loadavg in the row)"
            if args.device == "cpu"
            else f"zero-delay FSDP2 pacer vs plain FSDP2 on CUDA ({backend}), interleaved and paired inside one job"
        ),
        cpu_count=os.cpu_count(),
    )


if __name__ == "__main__":
    main()
