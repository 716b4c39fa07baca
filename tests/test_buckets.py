"""Bucketed backward in the simulator (pacectl/fabric/overlap.py): one bucket is today's simulator bit
for bit, the bucketed model is max-plus without contention, and the on-device slowdown acts where
the module says (spinning waits, not sleeping ones nor pacing delays)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pacectl.backends.sim import SimBackend
from pacectl.errors import ConfigError
from pacectl.fabric.contention import ContentionComm, CrossTraffic, EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import ComputeModel, LognormalJitter, ParetoHiccups, SlowRanks
from pacectl.fabric.overlap import BucketedBackward, BucketEngine
from pacectl.fabric.topology import FatTree
from pacectl.types import Action

GOLDEN = Path(__file__).resolve().parent / "golden"
NOISE = ComputeModel(0.5, (LognormalJitter(0.05), ParetoHiccups(0.02, 0.1, 2.5), SlowRanks((3,), factor=1.2)))


def _profile(name: str, overrides: tuple[str, ...] = ()) -> dict[str, object]:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, as_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"cluster={name}", *overrides])
    return as_dict(cfg.cluster)


def test_one_bucket_reproduces_the_single_allreduce_simulator_bit_for_bit() -> None:
    """``cluster.buckets.count=1`` against digests taken before bucketed backward existed (several
    profiles, comm models, the clock actuator, the power cap; five controllers)."""
    sys.path.insert(0, str(GOLDEN))
    try:
        from sim_buckets1_regen import digests
    finally:
        sys.path.remove(str(GOLDEN))
    expected = json.loads((GOLDEN / "sim_buckets1.json").read_text())
    assert digests(("cluster.buckets.count=1",)) == expected


def _contention(num_ranks: int) -> ContentionComm:
    topo = FatTree(ranks_per_node=4, nodes_per_leaf=2, oversubscription=4.0)
    cross = CrossTraffic(links=("leaf_up:*",), on_s=0.3, off_s=0.9)
    return ContentionComm(topo, num_ranks, message_bytes=1e9, cross_traffic=cross)


@pytest.mark.parametrize("comm_kind", ["fixed", "contention"])
@pytest.mark.parametrize("wait", ["spin", "sleep"])
def test_the_engine_with_one_bucket_is_the_single_allreduce_model(comm_kind: str, wait: str) -> None:
    """The bucketed engine itself, forced to run with one bucket, equals the simulator without it."""
    n, iters = 32, 60
    comm = FixedComm(0.08) if comm_kind == "fixed" else _contention(n)
    spec = BucketedBackward(count=1, overlap_slowdown=0.4, pacer="host", noise="instant")

    def sim(overlap: BucketEngine | None) -> SimBackend:
        return SimBackend(
            num_ranks=n,
            num_iterations=iters,
            compute=NOISE,
            comm=comm,
            interference=EarlyArrivalInterference(0.05, 4),
            record=True,
            overlap=overlap,
        )

    delays = np.random.default_rng(3).uniform(0, 0.05, size=(iters, n)) * (np.arange(iters) % 3 > 0)[:, None]
    runs = []
    for backend in (sim(None), sim(BucketEngine(spec, [comm], nominal_compute_s=0.5))):
        backend.reset(seed=5)
        obs = [backend.step([Action(d, wait)])[0] for d in delays]
        runs.append(
            (
                np.array([o.iteration_time_s for o in obs]),
                np.array([o.arrival_s for o in obs]),
                np.array([o.wait_s for o in obs]),
                np.array([o.collective_time_s for o in obs]),
                backend.to_trace().ops,
            )
        )
    for a, b in zip(runs[0][:4], runs[1][:4], strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs[0][4].equals(runs[1][4])


def _engine(
    count: int,
    slowdown: float = 0.0,
    *,
    pacer: str = "device",
    noise: str = "spread",
    seed: int = 0,
    durations: list[float] | None = None,
    fractions: list[float] | None = None,
) -> BucketEngine:
    spec = BucketedBackward(
        count=count,
        sizes=None if fractions is None else tuple(fractions),
        forward_frac=0.3,
        overlap_slowdown=slowdown,
        pacer=pacer,
        noise=noise,
    )
    durations = durations or [0.05] * count
    engine = BucketEngine(spec, [FixedComm(d) for d in durations], nominal_compute_s=0.5)
    engine.reset(seed)
    return engine


def test_a_hand_worked_iteration() -> None:
    """Two ranks, two buckets, 0.5 s all-reduces, overlap slowdown 1 (twice as slow)."""
    engine = _engine(2, 1.0, durations=[0.5, 0.5])
    produced = np.array([[0.2, 1.0], [0.5, 0.9]])
    zero = np.zeros(2)

    def run(delay: np.ndarray, *, asleep: bool = False, host: bool = False) -> float:
        engine.host_pacer = host
        return engine.run(produced[:, 1], delay, asleep=asleep, clock_s=0.0, produced=produced).iteration_s

    # rank 0 spins at bucket 0 from 0.2 to 1.0, so its 0.8 s of backward ends at 1.4: the last
    assert run(zero) == pytest.approx(1.9)
    # paced by its earliness (0.3 s) it spins from 0.5 only: it ends at 1.25; so it does asleep
    assert run(np.array([0.3, 0.0])) == pytest.approx(1.75)
    assert run(zero, asleep=True) == pytest.approx(1.75)
    # the host pacer's sleep holds its backward back by the delay: worse than no pacing
    assert run(np.array([0.3, 0.0]), host=True) == pytest.approx(2.05)
    # without the slowdown: rank 0 ends at 1.0, rank 1 at 0.9, bucket 1 after bucket 0 (1.0)
    engine.slowdown = 0.0
    assert run(zero) == pytest.approx(1.5)


_case = st.fixed_dictionaries(
    {
        "count": st.integers(2, 6),
        "ranks": st.integers(1, 12),
        "seed": st.integers(0, 2**31 - 1),
        "pacer": st.sampled_from(["device", "host"]),
        "noise": st.sampled_from(["spread", "instant"]),
        "scale": st.floats(0.0, 3.0),
    }
)


def _draws(case: dict[str, object]) -> tuple[BucketEngine, np.ndarray, np.ndarray, list[float]]:
    rng = np.random.default_rng(int(case["seed"]))  # type: ignore[call-overload]
    count = int(case["count"])  # type: ignore[call-overload]
    fractions = list(rng.uniform(0.05, 1.0, count))
    fractions = [f / sum(fractions) for f in fractions]
    durations = list(rng.uniform(0.0, 0.3, count) * float(case["scale"]))  # type: ignore[arg-type]
    compute = rng.uniform(0.2, 1.0, int(case["ranks"]))  # type: ignore[call-overload]
    delay = rng.exponential(0.1, int(case["ranks"])) * (rng.random(int(case["ranks"])) < 0.6)  # type: ignore[call-overload]
    engine = _engine(
        count, pacer=str(case["pacer"]), noise=str(case["noise"]), durations=durations, fractions=fractions
    )
    return engine, compute, delay, durations


@settings(max_examples=150, deadline=None)
@given(case=_case)
def test_without_contention_no_delay_shortens_an_iteration(case: dict[str, object]) -> None:
    """Max-plus: with fixed durations and no overlap slowdown, any delays >= 0 (either pacer, either
    noise placement) give an iteration at least as long as without them."""
    engine, compute, delay, _ = _draws(case)
    seed = int(case["seed"])  # type: ignore[call-overload]
    engine.reset(seed)
    base = engine.run(compute, np.zeros_like(compute), asleep=False, clock_s=0.0).iteration_s
    engine.reset(seed)  # the same noise-placement draws
    paced = engine.run(compute, delay, asleep=False, clock_s=0.0).iteration_s
    assert paced >= base


@settings(max_examples=150, deadline=None)
@given(
    case=_case, frac=st.floats(0.0, 1.0), asleep=st.booleans(), slowdown=st.sampled_from([0.0, 0.189, 0.4])
)
def test_delays_within_earliness_at_bucket_0_change_nothing_with_the_device_pacer(
    case: dict[str, object], frac: float, asleep: bool, slowdown: float
) -> None:
    """Device pacer, delays within each rank's earliness at bucket 0: the iteration is bit-identical,
    without the overlap slowdown, and with it when the ranks wait asleep (a pacing delay occupies
    nothing, and a sleeping wait only the transfer)."""
    assume(slowdown == 0.0 or asleep)
    case = {**case, "pacer": "device"}
    engine, compute, _, _ = _draws(case)
    engine.slowdown = slowdown
    seed = int(case["seed"])  # type: ignore[call-overload]
    engine.reset(seed)
    base = engine.run(compute, np.zeros_like(compute), asleep=asleep, clock_s=0.0)
    delay = (base.start_s - base.natural_s) * frac
    assume(bool(((base.natural_s + delay) <= base.start_s).all()))  # no rounding past the last arrival
    engine.reset(seed)
    paced = engine.run(compute, delay, asleep=asleep, clock_s=0.0)
    assert paced.iteration_s == base.iteration_s
    assert paced.start_s == base.start_s


def test_open_loop_bucketed_sim_is_max_plus_with_comm_null() -> None:
    """The whole simulator with 4 buckets and comm=null from the profile: no mechanism in force, and
    random delays never shorten any iteration."""
    from pacectl.fabric.profile import bucket_engine, compute_from, sim_fabric

    cluster = _profile("paper_like", ("cluster.buckets.count=4", "cluster.buckets.noise=instant"))
    n, iters = 32, 80
    comm, interference = sim_fabric(cluster, "null", n)
    engine = bucket_engine(cluster, "null", n)
    assert engine is not None and engine.slowdown == 0.0 and not engine.timing_dependent
    sim = SimBackend(
        num_ranks=n,
        num_iterations=iters,
        compute=compute_from(cluster),
        comm=comm,
        interference=interference,
        overlap=engine,
    )
    assert not sim.comm_timing_dependent and sim.mechanisms == ()
    rng = np.random.default_rng(0)
    delays = rng.exponential(0.3, (iters, n)) * (rng.random((iters, n)) < 0.5)
    sim.reset(seed=1)
    base = np.array([sim.step([Action.zeros(n)])[0].iteration_time_s for _ in range(iters)])
    sim.reset(seed=1)
    paced = np.array([sim.step([Action(d)])[0].iteration_time_s for d in delays])
    assert (paced >= base).all() and (paced > base).any()


def test_contention_profile_turns_the_overlap_slowdown_on() -> None:
    from pacectl.fabric.overlap import SOURCED_OVERLAP_SLOWDOWN
    from pacectl.fabric.profile import bucket_engine

    cluster = _profile("paper_like", ("cluster.buckets.count=4",))
    engine = bucket_engine(cluster, "contention", 64)
    assert engine is not None and engine.slowdown == SOURCED_OVERLAP_SLOWDOWN and engine.timing_dependent
    assert [c.free_time_s for c in engine.comms] == pytest.approx([engine.comms[0].free_time_s] * 4)
    one = bucket_engine(_profile("paper_like"), "contention", 64)
    assert one is None  # one bucket: the simulator runs unchanged


def test_sleep_wait_gains_where_spinning_waits_slow_backward() -> None:
    """Seeded sim run: with 4 buckets, hiccups at random instants (``noise=instant``) and the overlap
    slowdown (early-arrival interference off), sleeping waits are faster than spinning ones; without
    the slowdown they are the same."""
    from pacectl.fabric.profile import bucket_engine, compute_from, sim_fabric

    means = {}
    for slowdown in (0.0, 0.4):
        cluster = _profile(
            "paper_like",
            (
                "cluster.buckets.count=4",
                "cluster.buckets.noise=instant",
                f"cluster.buckets.overlap_slowdown={slowdown}",
                "cluster.interference.kappa=0",
            ),
        )
        comm, interference = sim_fabric(cluster, "contention", 32)
        for wait in ("spin", "sleep"):
            sim = SimBackend(
                num_ranks=32,
                num_iterations=200,
                compute=compute_from(cluster),
                comm=comm,
                interference=interference,
                overlap=bucket_engine(cluster, "contention", 32),
            )
            sim.reset(seed=2)
            means[slowdown, wait] = np.mean(
                [sim.step([Action.zeros(32, wait=wait)])[0].iteration_time_s for _ in range(200)]
            )
    assert means[0.0, "spin"] == means[0.0, "sleep"]
    assert means[0.4, "sleep"] < means[0.4, "spin"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.buckets.count=0", "cluster.buckets.count must be an integer >= 1, got 0"),
        (
            "cluster.buckets.forward_frac=1",
            "cluster.buckets.forward_frac must be in [0, 1), got 1.0",
        ),
        (
            "cluster.buckets.overlap_slowdown=-0.1",
            "cluster.buckets.overlap_slowdown must be >= 0, got -0.1",
        ),
        ("cluster.buckets.pacer=gpu", "cluster.buckets.pacer must be one of device, host, got 'gpu'"),
        ("cluster.buckets.noise=burst", "cluster.buckets.noise must be one of spread, instant, got 'burst'"),
        (
            "cluster.buckets.sizes=[0.5,-0.5]",
            "cluster.buckets.sizes must be a list of numbers > 0 (fractions summing to 1), or null",
        ),
        (
            "cluster.buckets.sizes=[0.5,0.25]",
            "cluster.buckets.sizes must have one fraction per bucket (cluster.buckets.count=1)",
        ),
        ("+cluster.buckets.cont=2", "cluster.buckets.cont: no such key (known: count, sizes, compute,"),
    ],
)
def test_bad_bucket_values_get_one_line_naming_the_key(override: str, message: str) -> None:
    from pacectl.fabric.profile import bucket_engine

    with pytest.raises(ConfigError) as err:
        bucket_engine(_profile("paper_like", (override,)), "contention", 16)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_sizes_must_sum_to_one() -> None:
    from pacectl.fabric.profile import bucket_engine

    cluster = _profile("paper_like", ("cluster.buckets.count=2", "cluster.buckets.sizes=[0.5,0.6]"))
    with pytest.raises(ConfigError, match=r"^cluster\.buckets\.sizes must sum to 1 .*sum 1\.1\)"):
        bucket_engine(cluster, "contention", 16)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("backend.record=true", "cluster.buckets.count=2 does not combine with backend.record=true"),
        ("backend.actuator=clock", "does not combine with backend.actuator=clock"),
        ("cluster.power_cap.node_w=3600", "does not combine with cluster.power_cap.node_w"),
        ("cluster.buckets.count=0", "cluster.buckets.count must be an integer >= 1, got 0"),
    ],
)
def test_the_cli_refuses_what_is_not_modelled_with_exit_2(extra: str, message: str, tmp_path: Path) -> None:
    count = [] if extra.startswith("cluster.buckets.count") else ["cluster.buckets.count=2"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pacectl.run",
            "backend=sim",
            "cluster=paper_like",
            "comm=contention",
            "backend.num_ranks=16",
            "backend.num_iterations=5",
            *count,
            extra,
            f"hydra.run.dir={tmp_path}/run",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_several_jobs_refuse_buckets() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.experiment import MultiJobSimExperiment

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["backend=sim", "cluster=shared_uplink", "comm=contention", "cluster.buckets.count=2"],
        )
    with pytest.raises(ConfigError, match="cluster.buckets.count must be 1 with several jobs"):
        MultiJobSimExperiment(cfg)


def test_device_pacer_delays_do_not_remove_early_arrival_interference() -> None:
    """With buckets and the device pacer, a rank's delay sits on the comm stream at bucket 0: it
    still spins after its compute, so pacing does not lower early-arrival interference (only
    sleeping does); the host pacer's sleep holds its backward back, so there it does."""
    from pacectl.fabric.profile import bucket_engine, compute_from, sim_fabric

    n = 16
    out = {}
    for pacer in ("device", "host"):
        cluster = _profile(
            "paper_like",
            (
                "cluster.buckets.count=4",
                "cluster.buckets.overlap_slowdown=0",
                f"cluster.buckets.pacer={pacer}",
            ),
        )
        comm, interference = sim_fabric(cluster, "null", n)
        interference = EarlyArrivalInterference(0.5, 8)
        sim = SimBackend(
            num_ranks=n,
            num_iterations=1,
            compute=compute_from(cluster),
            comm=comm,
            interference=interference,
            overlap=bucket_engine(cluster, "null", n),
        )
        runs = []
        for delay in (np.zeros(n), np.full(n, 0.05)):
            sim.reset(seed=0)
            runs.append(sim.step([Action(delay)])[0])
        out[pacer] = runs
    np.testing.assert_array_equal(out["device"][0].natural_arrival_s, out["device"][1].natural_arrival_s)
    assert not np.array_equal(out["host"][0].natural_arrival_s, out["host"][1].natural_arrival_s)
