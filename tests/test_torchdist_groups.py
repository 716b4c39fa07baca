"""FSDP2 pacing and process-group aware pacing, on gloo (CPU, ``dist`` marker).

- FSDP2 (``fully_shard`` on an explicit CPU mesh, 2 ranks): the pacer goes in through
  ``set_custom_reduce_scatter`` and ``set_custom_all_gather``; the trained parameters are
  bit-identical to plain FSDP2's, every rank decides alike, and the paced collective is where the
  early rank waits: with ``fsdp2_paced="backward"`` and a straggle between forward and backward the
  first collective of the backward (with FSDP2's default resharding an all-gather, without it,
  ``-zero2``, a reduce-scatter); with ``fsdp2_paced="forward"`` (``-forward``) and a straggle before
  forward the forward's first all-gather.
- A 2 x 2 mesh (4 ranks, ``("pp", "dp")``): two DP groups, each with its own pacer and its own
  straggler, for 300 iterations. Decisions are identical within a group and differ across groups;
  after set-up no collective touches the default group (the Flight Recorder says so), which is
  what makes an exchange on the default group deadlock on sub-meshes elsewhere (NVRx issue #277).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import time
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.dist

_FSDP_STEPS = 8
_FSDP_MODES = ("plain", "async", "collective", "plain-zero2", "async-zero2", "async-forward")
_FSDP_PACED = ("async", "collective", "async-zero2", "async-forward")
#: collectives per iteration the pacer records: reduce-scatters, 3 per backward (one per layer); with
#: resharding also the backward's all-gathers (the last layer's unshard, then each prefetch); paced in
#: forward also the forward's all-gathers
_FSDP_COLLECTIVES = {"async": 6, "collective": 6, "async-zero2": 3, "async-forward": 9}
_MESH_STEPS = 300
_FSDP2_MESH_STEPS = 300


def _engine(world: int) -> Any:
    from pacectl.torchdist.core import DecisionEngine

    return DecisionEngine(
        "threshold",
        {"on_threshold_s": 0.002, "off_threshold_s": 0.001, "gain": 0.5},
        {"max_delay_frac": 0.5},
        num_ranks=world,
        seed=0,
    )


def _fsdp_model(mesh: Any, *, reshard: bool = True) -> Any:
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    # reshard: FSDP2's default (every unit but the root reshards after forward), so backward all-gathers
    # each layer again (prefetching the next one) before the first reduce-scatter, and the early rank
    # waits in the first all-gather. Without (ZeRO-2 style) backward issues no all-gather.
    kwargs = {} if reshard else {"reshard_after_forward": False}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def _fsdp_rank(rank: int, world: int, port: int, queue: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from pacectl.errors import ConfigError
    from pacectl.torchdist.pacer import Pacer

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
    out: dict[str, Any] = {}
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        for mode in _FSDP_MODES:
            gather, _, variant = mode.partition("-")
            model = _fsdp_model(mesh, reshard=variant != "zero2")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            pacer = None
            paced = "forward" if variant == "forward" else "backward"
            if gather != "plain":
                pacer = Pacer(
                    _engine(world), gather=gather, group=mesh.get_group("dp"), fsdp2_paced=paced
                ).attach(model)
            gen = torch.Generator().manual_seed(100 + rank)
            for _ in range(_FSDP_STEPS):
                x = torch.randn(16, 32, generator=gen)
                opt.zero_grad(set_to_none=True)
                # rank 1 straggles, well past the 2 ms threshold (the controller paces rank 0), where
                # the pacer paces: before forward or between forward and backward
                if rank == 1 and paced == "forward":
                    time.sleep(0.03)
                loss = model(x).pow(2).mean()
                if rank == 1 and paced == "backward":
                    time.sleep(0.03)
                loss.backward()
                opt.step()
            result: dict[str, Any] = {
                "params": torch.cat(
                    [p.full_tensor().detach().reshape(-1) for p in model.parameters()]
                ).numpy()
            }
            if pacer is not None:
                pacer.flush()
                result.update(
                    decisions=np.array(pacer.decisions),
                    applied=np.array([o.applied_delay_s for o in pacer.observations]),
                    natural=np.array([o.natural_arrival_s for o in pacer.observations]),
                    delay_actual=np.array(pacer.delay_actual_s),
                    collectives=[len(m["enter_s"]) for m in pacer.marks],
                    gather=pacer.gather,
                )
            out[mode] = result
        try:  # FSDP2 reduce-scatters: nothing to piggyback on
            Pacer(_engine(world), gather="piggyback").attach(_fsdp_model(mesh))
            out["piggyback"] = "accepted"
        except ConfigError as err:
            out["piggyback"] = str(err)
        solo = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
        try:  # a pacer on a group that is not the one FSDP2 reduce-scatters on
            Pacer(_engine(1), gather="async", group=solo).attach(_fsdp_model(mesh))
            out["wrong_group"] = "accepted"
        except ConfigError as err:
            out["wrong_group"] = str(err)
        queue.put((rank, out))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


def _default_group_ops() -> int:
    """The default process group's entries in this rank's Flight Recorder (a trusted dump of its own)."""
    import pickle

    import torch._C._distributed_c10d as c10d

    dump = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))
    return sum(1 for e in dump["entries"] if e["process_group"][1] == "default_pg")


def _mesh_rank(rank: int, world: int, port: int, queue: Any) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100000"  # read by init_process_group: count the default group's ops
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh

    from pacectl.torchdist.pacer import Pacer

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        dp = mesh.get_group("dp")
        torch.manual_seed(rank)
        model = nn.parallel.DistributedDataParallel(nn.Linear(16, 16), process_group=dp)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        pacer = Pacer(_engine(2), group=dp).attach(model)
        before = _default_group_ops()
        x = torch.randn(4, 16)
        for k in range(_MESH_STEPS):
            if k == 150:
                pacer.request_control({"guard": {"max_delay_frac": 0.4}})  # group rank 0: a broadcast on dp
            # each DP group has its own straggler and schedule: rank 1 (group {0, 1}) every 3rd
            # iteration, rank 2 (group {2, 3}) every 5th
            if (rank == 1 and k % 3 == 0) or (rank == 2 and k % 5 == 0):
                time.sleep(0.004)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
        pacer.flush()
        after = _default_group_ops()
        queue.put(
            (
                rank,
                {
                    "decisions": np.array(pacer.decisions),
                    "group": sorted(dist.get_process_group_ranks(dp)),
                    "default_group_ops_during_training": after - before,
                    "version": pacer.engine.version,
                },
            )
        )
    except BaseException as err:  # noqa: BLE001
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


def _fsdp2_mesh_rank(rank: int, world: int, port: int, queue: Any) -> None:
    """FSDP2 on a 2 x 2 mesh ("pp", "dp"): each pp row shards its own model over its dp sub-mesh
    and is paced on that dp group (the pacer's default for FSDP2: the forward's first all-gather)."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100000"  # read by init_process_group: count the default group's ops
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from pacectl.torchdist.pacer import Pacer

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        dp_mesh = mesh["dp"]
        dp = dp_mesh.get_group()
        model = _fsdp_model(dp_mesh)  # the same seed: the rows differ by their data and stragglers
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        pacer = Pacer(_engine(2), group=dp).attach(model)
        before = _default_group_ops()
        gen = torch.Generator().manual_seed(100 + rank)
        for k in range(_FSDP2_MESH_STEPS):
            if k == _FSDP2_MESH_STEPS // 2:
                pacer.request_control({"guard": {"max_delay_frac": 0.4}})  # group rank 0: a broadcast on dp
            # each DP group has its own straggler, before every forward: rank 1 (group {0, 1}) 8 ms,
            # rank 2 (group {2, 3}) 4 ms; both well past the controller's 2 ms threshold
            if rank in (1, 2):
                time.sleep(0.008 if rank == 1 else 0.004)
            x = torch.randn(16, 32, generator=gen)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
        pacer.flush()
        after = _default_group_ops()
        queue.put(
            (
                rank,
                {
                    "decisions": np.array(pacer.decisions),
                    "group": sorted(dist.get_process_group_ranks(dp)),
                    "default_group_ops_during_training": after - before,
                    "version": pacer.engine.version,
                    "collectives": [len(m["enter_s"]) for m in pacer.marks],
                    "fsdp2_paced": pacer.fsdp2_paced,
                },
            )
        )
    except BaseException as err:  # noqa: BLE001
        queue.put((rank, {"error": repr(err)}))
    finally:
        dist.destroy_process_group()


def _spawn(target: Any, world: int, timeout_s: float) -> dict[int, dict[str, Any]]:
    from pacectl.torchdist.launch import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results: dict[int, dict[str, Any]] = {}
        for _ in procs:
            try:
                rank, res = q.get(timeout=timeout_s)
            except queue_module.Empty:
                pytest.fail(
                    f"no result from ranks {sorted(set(range(world)) - set(results))} within {timeout_s} s"
                )
            results[rank] = res
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
                p.join()
    for r, res in results.items():
        assert "error" not in res, f"rank {r}: {res.get('error')}"
    return results


@pytest.fixture(scope="module")
def fsdp_ranks() -> dict[int, dict[str, Any]]:
    return _spawn(_fsdp_rank, 2, 180)


@pytest.mark.parametrize("mode", _FSDP_PACED)
def test_fsdp2_gradients_are_unchanged_by_the_pacer(fsdp_ranks, mode: str) -> None:
    plain = "plain-zero2" if mode.endswith("-zero2") else "plain"  # the straggle's place changes nothing
    for r in (0, 1):
        assert np.array_equal(fsdp_ranks[r][mode]["params"], fsdp_ranks[r][plain]["params"])


@pytest.mark.parametrize("mode", _FSDP_PACED)
def test_fsdp2_decides_alike_on_every_rank_and_paces_where_the_early_rank_waits(
    fsdp_ranks, mode: str
) -> None:
    r0, r1 = fsdp_ranks[0][mode], fsdp_ranks[1][mode]
    assert r0["gather"] == mode.partition("-")[0]
    assert np.array_equal(r0["decisions"], r1["decisions"])
    assert r0["collectives"] == [_FSDP_COLLECTIVES[mode]] * _FSDP_STEPS
    # the straggle shows at the paced collective: rank 1 arrives after rank 0 (before rank 0's delay)
    late = r0["natural"][:, 1] > r0["natural"][:, 0]
    assert late.sum() > _FSDP_STEPS / 2, r0["natural"]
    # so rank 0 is paced (more than rank 1, which the shared machine's noise can pace too)
    assert r0["applied"][:, 0].sum() > r0["applied"][:, 1].sum()
    paced = r0["applied"][:, 0] > 0
    assert (r0["delay_actual"][paced] >= r0["applied"][paced, 0] - 1e-6).all()


def test_fsdp2_refuses_a_piggybacked_exchange(fsdp_ranks) -> None:
    assert "FSDP2 reduce-scatters its gradients" in fsdp_ranks[0]["piggyback"]


def test_fsdp2_refuses_a_pacer_on_another_group_than_its_reduce_scatter(fsdp_ranks) -> None:
    for r in (0, 1):
        message = fsdp_ranks[r]["wrong_group"]
        assert f"Pacer's group (ranks [{r}]) must be the group FSDP2 reduce-scatters on" in message, message
        assert "ranks [0, 1]" in message and "group=mesh['dp'].get_group()" in message


def test_two_dp_groups_pace_on_their_own_group_without_a_hang() -> None:
    ranks = _spawn(_mesh_rank, 4, 600)
    assert [ranks[r]["group"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    for a, b in ((0, 1), (2, 3)):  # identical within a group
        assert np.array_equal(ranks[a]["decisions"], ranks[b]["decisions"])
        assert ranks[a]["decisions"].shape == (_MESH_STEPS, 2)
        assert ranks[a]["version"] == 1  # the control reached the group through its own broadcast
    # independent across groups: each paces its own early rank, on its own straggler's schedule
    d_a, d_b = ranks[0]["decisions"], ranks[2]["decisions"]
    assert not np.array_equal(d_a, d_b)
    assert d_a[:, 0].max() > 0 and d_b[:, 1].max() > 0  # rank 0 waits for 1; rank 3 waits for 2
    for r in range(4):
        assert ranks[r]["default_group_ops_during_training"] == 0


def test_fsdp2_on_a_2x2_mesh_paces_each_dp_group_on_its_own_without_a_hang() -> None:
    """Issue 24 item 5 with FSDP2: 4 gloo ranks, a ("pp", "dp") mesh, each pp row's model sharded
    by fully_shard over its dp sub-mesh and paced on that group, each group with its own straggler."""
    ranks = _spawn(_fsdp2_mesh_rank, 4, 300)
    assert [ranks[r]["group"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    for r in range(4):
        assert ranks[r]["fsdp2_paced"] == "forward"
        # every iteration logged, each with the 9 collectives of _FSDP_COLLECTIVES["async-forward"]
        assert ranks[r]["collectives"] == [_FSDP_COLLECTIVES["async-forward"]] * _FSDP2_MESH_STEPS
    for a, b in ((0, 1), (2, 3)):  # identical within a group
        assert np.array_equal(ranks[a]["decisions"], ranks[b]["decisions"])
        assert ranks[a]["decisions"].shape == (_FSDP2_MESH_STEPS, 2)
        assert ranks[a]["version"] == 1  # the control reached the group through its own broadcast
    # independent across groups: each paces its own early rank
    d_a, d_b = ranks[0]["decisions"], ranks[2]["decisions"]
    assert not np.array_equal(d_a, d_b)
    assert d_a[:, 0].max() > 0 and d_b[:, 1].max() > 0  # rank 0 waits for 1; rank 3 waits for 2
    for r in range(4):
        assert ranks[r]["default_group_ops_during_training"] == 0


# ------------------------------------------------------------------ the built-in workload, live
_LIVE = [
    "backend=torch",
    "backend.nproc_per_node=2",
    "backend.num_iterations=12",
    "backend.warmup_iterations=2",
    "backend.pg_timeout_s=20",
    "backend.workload.width=64",
    "backend.workload.depth=2",
    "backend.workload.batch_size=8",
    "backend.workload.bucket_cap_mb=0.01",
    "backend.straggler.prob=1.0",  # every step: its boundary gap stands out even on a loaded machine
    "backend.straggler.duration_s=0.04",
    "backend.straggler.jitter_frac=0.0",
    "controller=none",
]


def _live(tmp: Any, *extra: str) -> tuple[Any, dict[str, Any]]:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.torchdist.experiment import TorchExperiment

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*_LIVE, f"backend.record_dir={tmp}", *extra])
    exp = TorchExperiment(cfg)
    summary = exp.describe()
    exp.write_outputs(tmp)
    return exp, summary


def _late_rank(trace: Any) -> tuple[int, int]:
    """``(rank that arrives last most often at the paced collective, steps)``."""
    ops = trace.ops
    first = ops[(ops["optype"] == "grads-reduce-scatter") & (ops["seq_id"] == 0)]
    arrivals = first.pivot_table(index="step", columns="rank", values="start_ts")
    return int(arrivals.idxmax(axis=1).value_counts().idxmax()), len(arrivals)


def test_a_live_flight_recorder_dump_replays_like_the_run_record(tmp_path) -> None:
    """backend.flight_recorder=true: the dump of the run and its canonical record agree on the
    iteration count and on the straggler (rank 1: backend.straggler.rank's default)."""
    from pacectl.traces.canonical import load_canonical
    from pacectl.traces.flight_recorder import FlightRecorderWarning, import_flight_recorder

    _, summary = _live(tmp_path, "backend.flight_recorder=true")
    folder = summary["flight_recorder"]["none"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FlightRecorderWarning)
        dump, report = import_flight_recorder(folder)
    record = load_canonical(summary["records"]["none"])
    assert report.assembly.timing == "created" and report.assembly.layout.dp_groups[0].desc == "pacectl-none"
    notes = [str(w.message) for w in caught]
    assert _late_rank(dump) == _late_rank(record) == (1, 12), notes


def test_a_live_fsdp2_flight_recorder_dump_replays_like_the_run_record(tmp_path) -> None:
    """backend.parallel=fsdp2 backend.flight_recorder=true, rank 1 straggling 40 ms before every
    forward: the dump and the canonical record agree on the iteration count and the straggler.

    The dump is read with ``all_gathers="sync"``: the early rank waits in the forward's first
    parameter all-gather (the collective FSDP2's pacer paces by default), and folded into compute
    (the default, ``"fold"``) that wait reads as rank 0's forward and the straggler is lost (two
    runs of this job so read, 12 steps each: at the first reduce-scatter a tie, 6 steps each, and
    rank 0 last most often)."""
    from pacectl.traces.canonical import load_canonical
    from pacectl.traces.flight_recorder import FlightRecorderWarning, import_flight_recorder

    _, summary = _live(tmp_path, "backend.flight_recorder=true", "backend.parallel=fsdp2")
    assert summary["workload"]["parallel"] == "fsdp2"
    folder = summary["flight_recorder"]["none"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FlightRecorderWarning)
        dump, report = import_flight_recorder(folder, all_gathers="sync")
    record = load_canonical(summary["records"]["none"])
    assert report.assembly.timing == "created" and report.assembly.layout.dp_groups[0].desc == "pacectl-none"
    assert report.assembly.folded_per_step == {}  # every all-gather of the DP group is a step collective
    notes = [str(w.message) for w in caught]
    assert _late_rank(dump) == _late_rank(record) == (1, 12), notes


def test_an_fsdp2_run_writes_the_summary_a_ddp_run_writes(tmp_path) -> None:
    def keys(node: Any, prefix: str = "") -> set[str]:
        if isinstance(node, dict):
            return {
                k for key, value in node.items() for k in {prefix + key} | keys(value, prefix + key + ".")
            }
        return set()

    _, ddp = _live(tmp_path / "ddp")
    _, fsdp2 = _live(tmp_path / "fsdp2", "backend.parallel=fsdp2")
    assert keys(fsdp2) == keys(ddp)
    assert fsdp2["workload"]["parallel"] == "fsdp2" and ddp["workload"]["parallel"] == "ddp"
    assert "the forward's first all-gather" in fsdp2["paced_collective"]
    assert fsdp2["trace"]["num_steps"] == ddp["trace"]["num_steps"] == 12
