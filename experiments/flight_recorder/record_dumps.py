"""Record the real gloo Flight Recorder dumps shipped in ``pacectl/data/flight-recorder``.

Run from the repository root (CPU only, about a minute on 2 cores)::

    python experiments/flight_recorder/record_dumps.py            # every scenario
    python experiments/flight_recorder/record_dumps.py ddp2 hang2 # some of them

Each scenario starts ``world`` local processes (``torch.multiprocessing.spawn``, gloo on 127.0.0.1)
with the Flight Recorder on (``TORCH_FR_BUFFER_SIZE`` set before ``init_process_group``), trains a
small MLP for a few iterations with a deterministic straggler, and writes each rank's dump with
``torch._C._distributed_c10d._dump_fr_trace()`` (pickle, the default dump format) or
``_dump_fr_trace_json()`` (JSON) to ``<out>/<scenario>/fr_trace_rank_<rank>`` (``.json`` for JSON),
the default writer's naming (``TORCH_FR_DUMP_TEMP_FILE`` + rank). Scenarios:

- ``ddp2``: 2 ranks, DDP (2 gradient buckets after DDP's rebuild in iteration 0), 12 iterations; rank 1 sleeps 100 ms before backward
  on every third iteration. Pickle.
- ``ddp4_json``: 4 ranks, DDP, 10 iterations; rank 2 sleeps 100 ms before backward on even
  iterations. JSON (``_dump_fr_trace_json``).
- ``fsdp2_2x2``: 4 ranks on a 2 x 2 CPU device mesh ``("pp", "dp")``: each ``pp`` row trains its
  own FSDP2 model (``fully_shard`` per layer on the ``dp`` sub-mesh); no pipeline traffic runs
  between rows (a stand-in for the layout only). Ranks 1 (row 0) and 2 (row 1) are stragglers:
  100 ms in the backward of the last layer on odd iterations, inside its FSDP2 unit (after the
  unit's all-gather, before its reduce-scatter; a delay before backward would be absorbed by the
  all-gather that starts it, which every rank waits in). Pickle.
- ``hang2``: 2 ranks, 4 all-reduces, then rank 0 issues a fifth that rank 1 never joins; both ranks
  dump while rank 0 waits in it (a hang snapshot), then rank 1 joins so the job ends cleanly. Pickle.

Stack frames are left out (``includeStackTraces=False``) to keep the files small; the importer
does not read them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

OUT = Path(__file__).resolve().parents[2] / "pacectl" / "data" / "flight-recorder"


def _dump(path: Path, *, json_format: bool) -> None:
    import torch._C._distributed_c10d as c10d

    data = (
        c10d._dump_fr_trace_json(includeCollectives=True)
        if json_format
        else c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False)
    )
    path.write_bytes(data)


def _mlp(seed: int, width: int = 64, depth: int = 3) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _ddp(
    rank: int,
    world: int,
    out: Path,
    iters: int,
    straggler: int,
    every: int,
    sleep_s: float,
    json_format: bool,
) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(0), bucket_cap_mb=0.02)  # 2 buckets (8320 and 4160 elements) after iteration 0
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    for it in range(iters):
        loss = model(x).pow(2).mean()
        if rank == straggler and it % every == 0 and it > 0:
            time.sleep(sleep_s)
        loss.backward()
        opt.step()
        opt.zero_grad()
    suffix = ".json" if json_format else ""
    _dump(out / f"fr_trace_rank_{rank}{suffix}", json_format=json_format)


class _DelayInBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps ``holder.delay_s`` (the injected straggler)."""

    @staticmethod
    def forward(ctx, x, holder):  # type: ignore[no-untyped-def]
        ctx.holder = holder
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        if ctx.holder.delay_s:
            time.sleep(ctx.holder.delay_s)
        return grad, None


class _SlowLinear(nn.Module):
    """A Linear whose backward can be slowed: inside the FSDP2 unit, so the delay falls after the
    unit's all-gather (pre-backward) and before its reduce-scatter (post-backward)."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin
        self.delay_s = 0.0

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.lin(_DelayInBackward.apply(x, self))


def _fsdp2(rank: int, world: int, out: Path, iters: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    row = mesh.get_coordinate()[0]
    model = _mlp(row)
    model[-2] = tail = _SlowLinear(model[-2])
    for layer in model:
        if isinstance(layer, (nn.Linear, _SlowLinear)):
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    for it in range(iters):
        tail.delay_s = 0.1 if rank in (1, 2) and it % 2 == 1 else 0.0
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    _dump(out / f"fr_trace_rank_{rank}", json_format=False)


def _hang(rank: int, world: int, out: Path) -> None:
    t = torch.ones(256)
    for _ in range(4):
        dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True) if rank == 0 else None
    time.sleep(0.3)  # rank 0 is now inside the fifth all-reduce, rank 1 never entered it
    _dump(out / f"fr_trace_rank_{rank}", json_format=False)
    dist.barrier(group=_side)  # both dumps written (on a side group, not recorded in the default group)
    if rank == 1:
        dist.all_reduce(t)  # join at last, so the job ends cleanly
    else:
        work.wait()


_side = None


def _worker(rank: int, world: int, scenario: str, out: str, port: int) -> None:
    global _side
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        TORCH_FR_BUFFER_SIZE="20000",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    folder = Path(out)
    if scenario == "ddp2":
        _ddp(rank, world, folder, iters=12, straggler=1, every=3, sleep_s=0.1, json_format=False)
    elif scenario == "ddp4_json":
        _ddp(rank, world, folder, iters=10, straggler=2, every=2, sleep_s=0.1, json_format=True)
    elif scenario == "fsdp2_2x2":
        _fsdp2(rank, world, folder, iters=8)
    elif scenario == "hang2":
        _side = dist.new_group(ranks=list(range(world)), group_desc="side_barrier")
        _hang(rank, world, folder)
    dist.destroy_process_group()


SCENARIOS = {"ddp2": 2, "ddp4_json": 4, "fsdp2_2x2": 4, "hang2": 2}


def main(argv: list[str]) -> None:
    names = argv or list(SCENARIOS)
    for i, name in enumerate(names):
        world = SCENARIOS[name]
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("fr_trace_rank_*"):
            old.unlink()
        mp.spawn(_worker, args=(world, name, str(folder), 29650 + i), nprocs=world, join=True)
        sizes = sum(p.stat().st_size for p in folder.glob("fr_trace_rank_*"))
        print(f"{name}: {world} ranks, {sizes} bytes in {folder}")


if __name__ == "__main__":
    main(sys.argv[1:])
