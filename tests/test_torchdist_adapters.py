"""Pacing inside Megatron-core and DeepSpeed (``pacectl.torchdist.adapters``), 2 or 4 gloo ranks on CPU.

Skipped, saying so, where the framework is not importable: neither is a pacectl dependency, and CI
does not install them (``experiments/frameworks/README.md`` says how they were installed and run
here: megatron-core 0.16.1, DeepSpeed 0.19.8, beside torch 2.13.0 CPU, in a venv of their own).

- Megatron-core's ``DistributedDataParallel`` allocates its gradient buffers on
  ``torch.cuda.current_device()``, which raises without CUDA ("Torch not compiled with CUDA
  enabled"); the ranks here replace that one function with one that returns ``"cpu"`` (a test
  shim, not a supported set-up: the rest of Megatron's DDP runs unchanged on gloo).
- DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``) with ``dist_backend="gloo"``.

Each case trains the same seeded model plain and paced (rank 1 straggling 30 ms before backward)
and checks: the trained parameters are bit-identical, every rank of a DP group decides alike, the
early rank is the one paced, and every gradient collective of an iteration is recorded. Cases:
Megatron DDP (overlap off/on x ``use_distributed_optimizer`` off/on, the latter stepped by hand:
:func:`_sharded_sgd_step`), Megatron PP 2 x DP 2 (4 ranks, the test's own pipeline schedule:
:func:`_megatron_pp_rank`), DeepSpeed ZeRO 0-3 and gradient accumulation.
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


def _where(err: BaseException) -> str:
    """The error and the innermost frames that raised it (the test's message)."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)[-3:]
    return f"{err!r} at " + " <- ".join(
        f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames[::-1]
    )


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


def _sgd_on_main_grad(module: Any, opt: Any) -> None:
    """A torch optimizer's step on Megatron's reduced gradients (``main_grad``, views of the gradient
    buffer). ``grad`` is dropped again after the step: left aliasing ``main_grad``, the next backward
    would accumulate into it in place and Megatron's hook would then add it to itself (doubled)."""
    for p in module.parameters():
        p.grad = p.main_grad
    opt.step()
    for p in module.parameters():
        p.grad = None


def _sharded_sgd_step(model: Any, group: Any, *, lr: float) -> None:
    """What Megatron's ``DistributedOptimizer`` does for fp32 parameters, by hand: SGD on this
    rank's shard of each bucket's parameter buffer with its shard of the reduce-scattered gradient
    buffer, then the parameter all-gather of Megatron's DDP (``start_param_sync``)."""
    import torch.distributed as dist
    from megatron.core.distributed.param_and_grad_buffer import shard_buffer

    size, me = dist.get_world_size(group), dist.get_rank(group)
    with torch.no_grad():
        for bucket_group in model.bucket_groups:
            for bucket in bucket_group.buckets:
                param = shard_buffer(bucket.param_data, size)[me]
                param.sub_(shard_buffer(bucket.grad_data, size)[me], alpha=lr)
    model.start_param_sync(force_sync=True)


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
            # use_distributed_optimizer: each bucket is reduce-scattered, and the step is the
            # distributed optimizer's for fp32 parameters: SGD on this rank's shard of the parameter
            # buffer, then Megatron DDP's own parameter all-gather (start_param_sync). Megatron's
            # DistributedOptimizer class cannot be built on a CPU-only torch (module doc).
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
                if distopt:
                    _sharded_sgd_step(model, dp, lr=0.1)
                else:
                    _sgd_on_main_grad(model.module, opt)

            initial = torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])
            _train(step, rank)
            result: dict[str, Any] = {
                "initial": initial.numpy(),
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
        queue.put((rank, {"error": _where(err)}))
    finally:
        dist.destroy_process_group()


def _megatron_pp_rank(rank: int, world: int, port: int, queue: Any) -> None:
    """PP 2 x DP 2 (4 ranks): Megatron's parallel state, DDP and ``finalize_model_grads`` per stage,
    one pacer per stage's DP group, 4 microbatches a step.

    Megatron's schedules cannot run on a CPU-only torch: all three (``forward_backward_no_pipelining``,
    ``..._pipelining_with_interleaving``, ``..._pipelining_without_interleaving``) allocate
    ``torch.zeros([], dtype=torch.int, device="cuda")`` (``schedules.py`` 596, 983, 2138 in 0.16.1:
    ``AssertionError: Torch not compiled with CUDA enabled``). So the test drives the pipeline by
    hand (GPipe order: every microbatch's forward, then every backward; activations and their
    gradients sent with gloo send/recv on Megatron's pipeline group) and ends each step as
    Megatron's schedules do, with ``finalize_model_grads``.
    """
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

        from pacectl.torchdist.adapters import pace_megatron
        from pacectl.torchdist.pacer import Pacer

        parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
        dp = parallel_state.get_data_parallel_group()
        pp = parallel_state.get_pipeline_model_parallel_group()
        stage = parallel_state.get_pipeline_model_parallel_rank()
        dp_rank = parallel_state.get_data_parallel_rank()
        peer = (  # the other stage's rank with this DP rank
            parallel_state.get_pipeline_model_parallel_next_rank()
            if stage == 0
            else parallel_state.get_pipeline_model_parallel_prev_rank()
        )
        out: dict[str, Any] = {"stage": stage, "dp_ranks": sorted(dist.get_process_group_ranks(dp))}
        for paced in (False, True):
            torch.manual_seed(stage)
            module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
            # what finalize_model_grads reads of a Megatron model stage: no shared embedding here
            module.pre_process, module.post_process = stage == 0, stage == 1
            module.share_embeddings_and_output_weights = False
            config = TransformerConfig(
                num_layers=2,
                hidden_size=64,
                num_attention_heads=1,
                pipeline_model_parallel_size=2,
                pipeline_dtype=torch.float32,
            )
            model = DistributedDataParallel(config, DistributedDataParallelConfig(), module)
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            pacer = pace_megatron(model, Pacer(_engine(2), group=dp)) if paced else None
            gen = torch.Generator().manual_seed(100 + dp_rank)
            initial = torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])
            for _ in range(_STEPS):
                model.zero_grad_buffer()
                if rank == 1:  # the straggler: stage 0's DP rank 1; stage 1's DP rank 1 waits on it
                    time.sleep(_STRAGGLE_S)
                inputs, outputs = [], []
                for _ in range(4):  # forwards
                    if stage == 0:
                        x = torch.randn(8, 64, generator=gen)
                    else:
                        x = torch.empty(8, 64)
                        dist.recv(x, peer, group=pp)
                        x.requires_grad_()
                    y = model(x)
                    if stage == 0:
                        dist.send(y.detach(), peer, group=pp)
                    inputs.append(x)
                    outputs.append(y)
                for x, y in zip(inputs, outputs, strict=True):  # backwards
                    if stage == 1:
                        (y.pow(2).mean() / 4).backward()
                        dist.send(x.grad, peer, group=pp)
                    else:
                        grad = torch.empty(8, 64)
                        dist.recv(grad, peer, group=pp)
                        y.backward(grad)
                finalize_model_grads([model])  # where Megatron's schedules end a step
                _sgd_on_main_grad(module, opt)
            result: dict[str, Any] = {
                "initial": initial.numpy(),
                "params": torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy(),
                "grads": torch.cat([b.grad_data.reshape(-1) for b in model.buffers]).numpy(),
            }
            if pacer is not None:
                result.update(_paced_result(pacer))
            out[f"paced={paced}"] = result
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": _where(err)}))
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
        from pacectl.torchdist.adapters import DEEPSPEED_COLLECTIVES

        calls = dict.fromkeys(DEEPSPEED_COLLECTIVES, 0)  # which of them each case issues (under the pacer's)

        def counted(name: str, f: Any) -> Any:
            def count(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return f(*args, **kwargs)

            return count

        for name in DEEPSPEED_COLLECTIVES:
            setattr(ds_comm, name, counted(name, getattr(ds_comm, name)))
        original = ds_comm.all_reduce
        out: dict[str, Any] = {}
        cases = ((0, 1), (1, 1), (2, 1), (0, 2), (3, 1))
        for (stage, gas), paced in itertools.product(cases, (False, True)):
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

            before = dict(calls)
            _train(step, rank)
            issued = {n: calls[n] - before[n] for n in calls if calls[n] > before[n]}
            params = list(module.parameters())
            # ZeRO-3 partitions the parameters: gather them whole to compare (a no-op below stage 3)
            with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
                trained = torch.cat([p.detach().reshape(-1).clone() for p in params]).numpy()
            result: dict[str, Any] = {"params": trained, "calls": issued}
            if adapter is not None:
                result.update(_paced_result(adapter.pacer))
                adapter.detach()
                result["restored"] = ds_comm.all_reduce is original
            out[f"stage={stage} gas={gas} paced={paced}"] = result
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": _where(err)}))
    finally:
        dist.destroy_process_group()


def _check_paced(
    ranks: dict[int, dict[str, Any]],
    paced: str,
    plain: str,
    collectives: int,
    iterations: int = _STEPS,
    *,
    compare: tuple[str, ...] = ("params",),
    pair: tuple[int, int] = (0, 1),
) -> None:
    """``pair``: the global ranks of one DP group, in group order; the second is the late one."""
    for r in pair:
        for what in compare:  # a missing key is a KeyError: the comparison cannot pass unnoticed
            a, b = ranks[r][paced][what], ranks[r][plain][what]
            assert a.size and np.array_equal(a, b), f"rank {r}: {what} changed (or empty)"
    r0, r1 = ranks[pair[0]][paced], ranks[pair[1]][paced]
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
        for r in (0, 1):  # the optimizer stepped (so the comparison below compares trained parameters)
            plain = ranks[r][f"{case} paced=False"]
            assert not np.array_equal(plain["params"], plain["initial"]), f"rank {r}: not trained"
            # the sharded step and all-gather train as all-reduce + SGD does (to rounding)
            np.testing.assert_allclose(
                plain["params"],
                ranks[r][f"distopt=False overlap={overlap} paced=False"]["params"],
                rtol=0,
                atol=1e-6,
            )
        np.testing.assert_array_equal(  # every rank holds the whole updated model
            ranks[0][f"{case} paced=True"]["params"], ranks[1][f"{case} paced=True"]["params"]
        )
        _check_paced(ranks, f"{case} paced=True", f"{case} paced=False", groups, compare=("params", "grads"))
    assert "needs a megatron.core.distributed.DistributedDataParallel" in ranks[0]["not_megatron"]


@needs_deepspeed
def test_deepspeed_engine_paced_through_deepspeed_comm() -> None:
    ranks = _spawn(_deepspeed_rank, 2, 600)
    for stage, gas, collectives in ((0, 1, 1), (1, 1, 4), (2, 1, 4), (0, 2, 1), (3, 1, 4)):
        case = f"stage={stage} gas={gas}"
        calls = ranks[0][f"{case} paced=True"]["calls"]
        if stage == 3:  # ZeRO-3 reduces gradients with reduce-scatter, 4 buckets a backward
            assert calls.get("reduce_scatter_fn") == 4 * _STEPS, calls
        else:  # on the CPU accelerator ZeRO 0-2 reduce with all_reduce (module doc)
            assert "all_reduce" in calls and "reduce_scatter_fn" not in calls, calls
        # gradient accumulation: a backward without a gradient collective is no iteration
        _check_paced(ranks, f"{case} paced=True", f"{case} paced=False", collectives, _STEPS // gas)
        assert ranks[0][f"{case} paced=True"]["restored"]


@needs_megatron
def test_megatron_core_pipeline_parallel_paced_per_stage() -> None:
    """PP 2 x DP 2: each stage's DP group has its own pacer; rank 1 (stage 0) straggles, so rank 3
    (stage 1, fed by rank 1) arrives late too: each group paces its early rank, on its own. The
    pipeline schedule is the test's own (Megatron's need CUDA: :func:`_megatron_pp_rank`)."""
    ranks = _spawn(_megatron_pp_rank, 4, 900)
    groups = sorted({tuple(ranks[r]["dp_ranks"]) for r in ranks})
    assert groups == [(0, 1), (2, 3)], groups  # Megatron's default order: DP inside a stage
    for pair in groups:
        for r in pair:
            plain = ranks[r]["paced=False"]
            assert not np.array_equal(plain["params"], plain["initial"]), f"rank {r}: not trained"
        _check_paced(ranks, "paced=True", "paced=False", 1, compare=("params", "grads"), pair=pair)
    # the two groups decide on their own figures (their delays differ)
    assert not np.array_equal(ranks[0]["paced=True"]["applied"], ranks[2]["paced=True"]["applied"])
