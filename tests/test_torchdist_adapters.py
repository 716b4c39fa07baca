"""Pacing inside Megatron-core and DeepSpeed (``pacectl.torchdist.adapters``), 2 gloo ranks on CPU.

Skipped, saying so, where the framework is not importable: neither is a pacectl dependency, and CI
does not install them (``experiments/frameworks/README.md`` says how they were installed and run
here: megatron-core 0.16.1, DeepSpeed 0.19.8, beside torch 2.13.0 CPU, in a venv of their own).

- Megatron-core's ``DistributedDataParallel`` allocates its gradient buffers on
  ``torch.cuda.current_device()``, which raises without CUDA ("Torch not compiled with CUDA
  enabled"); the ranks here replace that one function with one that returns ``"cpu"`` (a test
  shim, not a supported set-up: the rest of Megatron's DDP runs unchanged on gloo).
- DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``) with ``dist_backend="gloo"``.

Each case trains the same seeded model plain and paced (rank 1 straggling 30 ms before backward)
and checks: the trained parameters are bit-identical, every rank decides alike, the early rank
(rank 0) is the one paced, and every gradient collective of an iteration is recorded.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torchdist_groups import _engine, _spawn  # noqa: E402 - after the torch skip

pytestmark = pytest.mark.dist

_STEPS = 10
_STRAGGLE_S = 0.03


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


needs_megatron = pytest.mark.skipif(
    _missing("megatron.core"),
    reason="megatron-core is not installed (not a pacectl dependency; see experiments/frameworks)",
)
needs_deepspeed = pytest.mark.skipif(
    _missing("deepspeed"),
    reason="deepspeed is not installed (not a pacectl dependency; see experiments/frameworks)",
)


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))


def _train(step: Any, rank: int) -> None:
    """``_STEPS`` iterations; rank 1 straggles between forward and backward."""
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(_STEPS):
        x = torch.randn(8, 64, generator=gen)
        step(x, lambda: time.sleep(_STRAGGLE_S) if rank == 1 else None)


def _paced_result(pacer: Any) -> dict[str, Any]:
    pacer.flush()
    return {
        "decisions": np.array(pacer.decisions),
        "applied": np.array([o.applied_delay_s for o in pacer.observations]),
        "natural": np.array([o.natural_arrival_s for o in pacer.observations]),
        "delay_actual": np.array(pacer.delay_actual_s),
        "collectives": [len(m["enter_s"]) for m in pacer.marks],
        "exits_finite": all(np.isfinite(m["exit_s"]).all() for m in pacer.marks),
        "gather": pacer.gather,
    }


def _megatron_rank(rank: int, world: int, port: int, queue: Any) -> None:
    torch.cuda.current_device = lambda: "cpu"  # the CPU shim (module doc)
    import torch.distributed as dist

    _init(rank, world, port)
    try:
        from megatron.core import parallel_state
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.transformer import TransformerConfig

        from pacectl.errors import ConfigError
        from pacectl.torchdist.adapters import pace_megatron
        from pacectl.torchdist.pacer import Pacer

        parallel_state.initialize_model_parallel()
        dp = parallel_state.get_data_parallel_group()
        out: dict[str, Any] = {}
        for distopt, overlap, paced in itertools.product((False, True), repeat=3):
            torch.manual_seed(0)
            module = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
            config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=1)
            # with overlap, buckets of about one layer each: 4 bucket groups, issued in backward;
            # use_distributed_optimizer: each bucket is reduce-scattered (Megatron's distributed
            # optimizer itself is not built: the parameters stay, the gradient shards are compared)
            ddp_config = DistributedDataParallelConfig(
                overlap_grad_reduce=overlap,
                bucket_size=4000 if overlap else None,
                use_distributed_optimizer=distopt,
            )
            model = DistributedDataParallel(config, ddp_config, module)
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            pacer = pace_megatron(model, Pacer(_engine(world), group=dp)) if paced else None

            def step(
                x: Any, straggle: Any, model: Any = model, opt: Any = opt, distopt: bool = distopt
            ) -> None:
                model.zero_grad_buffer()
                loss = model(x).pow(2).mean()
                straggle()
                loss.backward()
                finalize_model_grads([model])  # what config.finalize_model_grads_func is in Megatron
                if not distopt:
                    for p in model.module.parameters():
                        p.grad = p.main_grad
                    opt.step()

            _train(step, rank)
            result: dict[str, Any] = {
                "params": torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy(),
                "grads": torch.cat([b.grad_data.reshape(-1) for b in model.buffers]).numpy(),
                "bucket_groups": len(model.bucket_groups),
            }
            if pacer is not None:
                result.update(_paced_result(pacer))
            out[f"distopt={distopt} overlap={overlap} paced={paced}"] = result
        try:
            pace_megatron(torch.nn.Linear(2, 2), Pacer(_engine(world), group=dp))
        except ConfigError as err:
            out["not_megatron"] = str(err)
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


def _deepspeed_rank(rank: int, world: int, port: int, queue: Any) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
    )
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    _init(rank, world, port)
    try:
        import deepspeed
        import deepspeed.comm as ds_comm

        from pacectl.torchdist.adapters import pace_deepspeed
        from pacectl.torchdist.pacer import Pacer

        deepspeed.init_distributed(dist_backend="gloo")  # torch.distributed is up: DeepSpeed adopts it
        original = ds_comm.all_reduce
        out: dict[str, Any] = {}
        for (stage, gas), paced in itertools.product(((0, 1), (1, 1), (2, 1), (0, 2)), (False, True)):
            torch.manual_seed(0)
            module = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
            config = {
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": gas,  # 2: an all-reduce every other backward
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                "zero_allow_untested_optimizer": True,
                # ZeRO 1/2: buckets of about one layer each (4 all-reduces per backward on CPU)
                "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000},
            }
            engine, *_ = deepspeed.initialize(
                model=module, model_parameters=module.parameters(), config=config
            )
            adapter = pace_deepspeed(engine, Pacer(_engine(world))) if paced else None

            def step(x: Any, straggle: Any, engine: Any = engine) -> None:
                loss = engine(x).pow(2).mean()
                straggle()
                engine.backward(loss)
                engine.step()

            _train(step, rank)
            result: dict[str, Any] = {
                "params": torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()]).numpy()
            }
            if adapter is not None:
                result.update(_paced_result(adapter.pacer))
                adapter.detach()
                result["restored"] = ds_comm.all_reduce is original
            out[f"stage={stage} gas={gas} paced={paced}"] = result
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


def _check_paced(
    ranks: dict[int, dict[str, Any]], paced: str, plain: str, collectives: int, iterations: int = _STEPS
) -> None:
    for r in (0, 1):
        for what in ("params", "grads"):
            if what in ranks[r][plain]:
                assert np.array_equal(ranks[r][paced][what], ranks[r][plain][what]), (
                    f"rank {r}: {what} changed"
                )
    r0, r1 = ranks[0][paced], ranks[1][paced]
    assert r0["gather"] == "async"  # auto on gloo; an adapter cannot piggyback
    np.testing.assert_array_equal(r0["decisions"], r1["decisions"])
    assert len(r0["decisions"]) == iterations
    assert r0["collectives"] == [collectives] * iterations
    assert r0["exits_finite"] and r1["exits_finite"]
    # rank 1 straggled before its gradient sync: it arrives after rank 0 at the paced collective
    late = r0["natural"][:, 1] > r0["natural"][:, 0]
    assert late.sum() > iterations / 2, r0["natural"]
    # so rank 0 is paced (more than rank 1, which the shared machine's noise can pace too)
    assert r0["applied"][:, 0].sum() > r0["applied"][:, 1].sum()
    done = r0["applied"][:, 0] > 0
    assert (r0["delay_actual"][done] >= r0["applied"][done, 0] - 1e-6).all()


@needs_megatron
def test_megatron_core_ddp_paced_through_its_bucket_groups() -> None:
    ranks = _spawn(_megatron_rank, 2, 600)
    for distopt, overlap in itertools.product((False, True), repeat=2):
        case = f"distopt={distopt} overlap={overlap}"
        groups = ranks[0][f"{case} paced=False"]["bucket_groups"]
        assert groups == (4 if overlap else 1)
        _check_paced(ranks, f"{case} paced=True", f"{case} paced=False", groups)
    assert "needs a megatron.core.distributed.DistributedDataParallel" in ranks[0]["not_megatron"]


@needs_deepspeed
def test_deepspeed_engine_paced_through_deepspeed_comm() -> None:
    ranks = _spawn(_deepspeed_rank, 2, 600)
    for stage, gas, collectives in ((0, 1, 1), (1, 1, 4), (2, 1, 4), (0, 2, 1)):
        case = f"stage={stage} gas={gas}"
        # gradient accumulation: a backward without a gradient collective is no iteration
        _check_paced(ranks, f"{case} paced=True", f"{case} paced=False", collectives, _STEPS // gas)
        assert ranks[0][f"{case} paced=True"]["restored"]
