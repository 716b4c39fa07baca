"""The pacer's three ways of exchanging the skew figures: a tiny all-reduce (async or blocking), or
piggybacked on bucket 0.

The encoding tests need only torch. The ``dist`` test spawns one 3-rank gloo job (no elastic agent, a
couple of seconds) that trains the same seeded model with plain DDP and the pacer in each mode (and
piggyback with ``gradient_as_bucket_view``, where DDP's gradients alias its buckets), with a
straggler on rank 1, a pacing controller and a runtime retune mid-run.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pacectl.torchdist.core import NUM_GATHER_FIELDS, one_hot_row  # noqa: E402
from pacectl.torchdist.pacer import decode_rows, encode_rows  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encoded_rows_survive_a_one_hot_sum_bit_identically(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    world = 4
    rows = rng.uniform(-1.0, 1.0, (world, NUM_GATHER_FIELDS)) * 10.0 ** rng.integers(-6, 1, (world, 1))
    rows[1, 2] = np.nan  # a non-finite figure stays non-finite (the engine then gives zero delay)
    parts = [encode_rows(one_hot_row(r, world, rows[r]), dtype) for r in range(world)]
    sums = []
    for order in ([0, 1, 2, 3], [2, 3, 1, 0]):
        total = torch.zeros_like(parts[0])
        for r in order:
            total += parts[r]
        sums.append(decode_rows(total).reshape(world, NUM_GATHER_FIELDS))
    assert np.array_equal(sums[0], sums[1], equal_nan=True)  # any summation order, same bits
    assert np.isnan(sums[0][1, 2])
    finite = np.isfinite(rows)
    tol = 0.0 if dtype == torch.float64 else 1e-13
    np.testing.assert_allclose(sums[0][finite], rows[finite], rtol=tol, atol=1e-300)


_STEPS = 10
# 3 ranks: averaging by 1/3 is inexact, so bit-identity with plain DDP checks the arithmetic too
_WORLD = 3
_DDP_MODES = ("plain", "async", "piggyback", "piggyback-view", "piggyback-beside", "collective")
# the same exchanges through PacedAllReduce: a loop that all-reduces each gradient itself (no DDP)
_WRAPPER_MODES = ("wrapper-async", "wrapper-piggyback", "wrapper-collective")
# completed at the next iteration's first bucket, as CUDA piggyback does by default (cuda_resolve):
# the bookkeeping is device-agnostic, so it is checked here on gloo (Pacer._on_device forced on)
_DEFERRED_MODES = ("piggyback-deferred", "wrapper-piggyback-deferred")
_MODES = _DDP_MODES + _WRAPPER_MODES + _DEFERRED_MODES


def _rank_main(rank: int, world: int, port: int, queue: Any) -> None:
    import torch.distributed as dist
    from torch import nn

    from pacectl.torchdist.core import DecisionEngine
    from pacectl.torchdist.pacer import PacedAllReduce, Pacer

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=20))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=20))
    out: dict[str, Any] = {}
    try:
        for mode in _MODES:
            torch.manual_seed(0)
            # a large output layer, as in a language model: bucket 0 is the largest bucket
            model = nn.Sequential(
                nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 256)
            )
            wrapper = mode.startswith("wrapper-")
            ddp = (
                model
                if wrapper
                else nn.parallel.DistributedDataParallel(  # several buckets
                    model, bucket_cap_mb=0.01, gradient_as_bucket_view=mode.endswith("-view")
                )
            )
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            engine = DecisionEngine(
                "threshold",
                {"on_threshold_s": 0.002, "off_threshold_s": 0.001, "gain": 0.5},
                {"max_delay_frac": 0.5},
                num_ranks=world,
                seed=0,
            )
            gather = mode.removeprefix("wrapper-").split("-")[0]
            # -beside: every carrier counts as large, so the rows go in a tiny all-reduce beside it
            beside = {"piggyback_max_bytes": 0} if mode.endswith("-beside") else {}
            pacer = None if mode == "plain" else Pacer(engine, gather=gather, **beside)
            if mode.endswith("-deferred"):
                pacer._on_device = lambda closed: True  # type: ignore[method-assign]
            all_reduce = None
            if wrapper:
                all_reduce = PacedAllReduce(pacer, collectives_per_iteration=len(list(model.parameters())))
            elif pacer is not None:
                pacer.attach(ddp)
            gen = torch.Generator().manual_seed(100 + rank)
            for k in range(_STEPS):
                if pacer is not None and k == 5:
                    pacer.request_control({"guard": {"max_delay_frac": 0.4}})  # rank 0 only; versioned
                if rank == 1:
                    time.sleep(0.03)  # rank 1 straggles: the controller paces rank 0
                x = torch.randn(16, 32, generator=gen)
                opt.zero_grad(set_to_none=True)
                ddp(x).pow(2).mean().backward()
                if all_reduce is not None:  # back to back, as a loop without DDP would
                    for param in model.parameters():
                        all_reduce(param.grad, average=True)
                opt.step()
            result: dict[str, Any] = {
                "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
            }
            if pacer is not None:
                pacer.flush()
                result.update(
                    decisions=np.array(pacer.decisions),
                    applied=np.array([o.applied_delay_s for o in pacer.observations]),
                    iterations=[o.iteration for o in pacer.observations],
                    delay_actual=np.array(pacer.delay_actual_s),
                    version=engine.version,
                    schedule=engine.schedule,
                    max_delay_frac=engine.guard_params["max_delay_frac"],
                    gather_s=np.array(pacer.gather_s),
                    carrier=pacer._carrier,
                    bucket_bytes=list(pacer._sizes),
                    appended=pacer._combined is not None,  # rows appended to a copy of the carrier
                    restarted=[m["restarted"] for m in pacer.marks],
                    sync_exit_minus_backward_end=[
                        m["sync_exit_s"] - m["backward_end_s"] for m in pacer.marks
                    ],
                )
            out[mode] = result
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    from pacectl.torchdist.launch import free_port

    # spawn, not fork: this pytest process may already hold gloo or OpenMP threads from earlier
    # tests, and a child forked from it can deadlock (seen in CI: both ranks hung silently).
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, _WORLD, port, queue), daemon=True) for r in range(_WORLD)
    ]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in procs:
            try:
                rank, res = queue.get(timeout=120)
            except queue_module.Empty:
                pytest.fail(f"no result from ranks {sorted(set(range(_WORLD)) - set(results))} within 120 s")
            results[rank] = res
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():  # never leave a hung rank behind for the interpreter's exit to wait on
                p.kill()
                p.join()
    for r, res in results.items():
        assert "error" not in res, f"rank {r}: {res.get('error')}"
    return results


@pytest.mark.dist
@pytest.mark.parametrize("mode", _MODES[1:])
def test_gradients_are_unchanged_by_the_pacer(ranks, mode: str) -> None:
    for rank in range(_WORLD):
        plain, paced = ranks[rank]["plain"]["params"], ranks[rank][mode]["params"]
        if (mode.startswith("piggyback") and mode != "piggyback-beside") or mode.startswith("wrapper-"):
            # the carrier bucket is longer by the rows, and the wrapper all-reduces tensor by tensor,
            # not bucket by bucket: gloo may sum the elements in another order
            np.testing.assert_allclose(paced, plain, rtol=1e-6, atol=1e-7)  # figures not averaged in
        else:
            # the same all-reduces and DDP's own averaging (times 1/3, not divided by 3): bit-identical
            np.testing.assert_array_equal(paced, plain)
        np.testing.assert_array_equal(ranks[rank][mode]["params"], ranks[0][mode]["params"])


@pytest.mark.dist
@pytest.mark.parametrize("mode", _MODES[1:])
def test_every_mode_decides_identically_on_every_rank_and_pace(ranks, mode: str) -> None:
    r0 = ranks[0][mode]
    assert r0["decisions"].shape == (_STEPS, _WORLD)
    for rank in range(1, _WORLD):
        assert np.array_equal(r0["decisions"], ranks[rank][mode]["decisions"])  # bit-identical
    assert r0["iterations"] == list(range(_STEPS))
    # a delay is really applied on rank 0 (rank 1 straggles) and lasts at least what was asked
    requested = r0["applied"][:, 0]
    # (rank 1 is paced far less: a hiccup of rank 0 longer than rank 1's 30 ms sleep on a loaded
    # machine may make rank 1 early once, so "never" would be a timing assertion)
    assert requested.max() > 0.0 and ranks[1][mode]["applied"][:, 1].sum() < 0.25 * requested.sum()
    assert (r0["delay_actual"][requested > 0] >= requested[requested > 0] - 1e-6).all()
    # the runtime retune reached every rank (versioned broadcast)
    for rank in range(_WORLD):
        assert ranks[rank][mode]["version"] == 1 and ranks[rank][mode]["max_delay_frac"] == 0.4
    assert len(r0["gather_s"]) >= _STEPS - 1


@pytest.mark.dist
@pytest.mark.parametrize("mode", _MODES[1:])
def test_every_iteration_is_marked_once_on_one_clock(ranks, mode: str) -> None:
    """One mark per iteration, each starting where the previous one ended (only iteration 0 starts
    at align()), the exchange ending after the gradient sync: also when an iteration is completed
    at the next one's first bucket (the -deferred modes)."""
    for rank in range(_WORLD):
        res = ranks[rank][mode]
        assert res["restarted"] == [True] + [False] * (_STEPS - 1)
        assert min(res["sync_exit_minus_backward_end"]) >= 0.0


@pytest.mark.dist
@pytest.mark.parametrize(
    ("mode", "lag"),
    [
        ("async", 1),
        ("collective", 1),
        ("piggyback", 2),
        ("piggyback-view", 2),
        ("piggyback-beside", 2),
        ("wrapper-async", 1),
        ("wrapper-collective", 1),
        ("wrapper-piggyback", 2),
        ("piggyback-deferred", 2),
        ("wrapper-piggyback-deferred", 2),
    ],
)
def test_decision_lag_of_each_mode(ranks, mode: str, lag: int) -> None:
    """The decision on iteration k's figures is applied at k + 1 (async, collective) or k + 2 (piggyback);
    the engine knows it (a forecast's ``horizon_iters: auto`` means that lag)."""
    for rank in range(_WORLD):
        res = ranks[rank][mode]
        assert res["schedule"] == (lag, 1)
        applied, decided = res["applied"][:, rank], res["decisions"][:, rank]
        # piggyback on float32 buckets carries figures as (hi, lo) float32 pairs: ~48 bits kept
        np.testing.assert_allclose(applied[lag:], decided[:-lag], rtol=1e-13, atol=0.0)
        assert not applied[:lag].any()


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["piggyback", "piggyback-view", "piggyback-beside"])
def test_piggyback_rides_on_the_smallest_bucket(ranks, mode: str) -> None:
    """Not bucket 0 (the large output layer here) but the smallest bucket, the same on every rank;
    appended to a copy of it, or (a carrier over piggyback_max_bytes) all-reduced beside it."""
    sizes = ranks[0][mode]["bucket_bytes"]
    assert len(sizes) >= 3 and sizes[0] == max(sizes)
    assert {ranks[r][mode]["carrier"] for r in range(_WORLD)} == {int(np.argmin(sizes))} != {0}
    assert {ranks[r][mode]["appended"] for r in range(_WORLD)} == {not mode.endswith("-beside")}
