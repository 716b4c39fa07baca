"""The sim backend: seeds, the null model's invariant, symmetry, record-and-replay."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.backends.replay import ReplayBackend
from pacectl.backends.sim import SimBackend
from pacectl.controllers import SafetyGuard, all_families, make_controller
from pacectl.fabric.contention import ContentionComm, CrossTraffic, EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import ComputeModel, LognormalJitter, ParetoHiccups, PeriodicNoise, SlowRanks
from pacectl.fabric.topology import FatTree
from pacectl.loop import run_episode
from pacectl.testing.controller_contract import ControllerContract  # noqa: F401  (import check)
from pacectl.types import Action, Observation

NOISE = ComputeModel(
    0.5,
    (
        LognormalJitter(0.05),
        ParetoHiccups(0.01, 0.05, 2.5),
        PeriodicNoise(7, 0.01),
        SlowRanks((3,), factor=1.2),
    ),
)


def _sim(num_ranks: int = 16, kappa: float = 0.0, comm: object | None = None, iters: int = 40) -> SimBackend:
    return SimBackend(
        num_ranks=num_ranks,
        num_iterations=iters,
        compute=NOISE,
        comm=comm or FixedComm(0.05),  # type: ignore[arg-type]
        interference=EarlyArrivalInterference(kappa, 8),
        record=True,
    )


def _open_loop(sim: SimBackend, delays: np.ndarray, seed: int = 0) -> np.ndarray:
    sim.reset(seed=seed)
    return np.array([sim.step([Action(d)])[0].iteration_time_s for d in delays])


def test_seeds_reproduce_exactly() -> None:
    factory = lambda: SafetyGuard(make_controller("threshold"))  # noqa: E731
    a = run_episode(_sim(kappa=0.05), factory, seed=7)
    b = run_episode(_sim(kappa=0.05), factory, seed=7)
    c = run_episode(_sim(kappa=0.05), factory, seed=8)
    np.testing.assert_array_equal(a.iteration_time_s, b.iteration_time_s)
    np.testing.assert_array_equal(a.applied_delay_s, b.applied_delay_s)
    assert not np.array_equal(a.iteration_time_s, c.iteration_time_s)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.floats(0.0, 0.5), frac=st.floats(0.0, 1.0))
def test_null_model_never_gains_from_pacing(seed: int, scale: float, frac: float) -> None:
    """Fixed durations, no interference: no delay vector shortens any iteration."""
    sim = _sim()
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0, scale, (sim.num_iterations, sim.num_ranks)) * (
        rng.random((sim.num_iterations, sim.num_ranks)) < frac
    )
    base = _open_loop(sim, np.zeros_like(delays))
    paced = _open_loop(sim, delays)
    assert (paced >= base - 1e-12).all()


def test_interference_lets_pacing_win() -> None:
    """The timing-dependent mechanism: delaying the early node peers of a slow rank shortens iterations."""
    sim = SimBackend(
        num_ranks=8,
        num_iterations=5,
        compute=ComputeModel(0.5, (SlowRanks((0,), factor=1.4),)),
        comm=FixedComm(0.01),
        interference=EarlyArrivalInterference(0.1, 8),
    )
    base = _open_loop(sim, np.zeros((5, 8)))
    delays = np.tile(np.r_[0.0, np.full(7, 0.2)], (5, 1))  # peers sleep out the slow rank's extra 0.2 s
    paced = _open_loop(sim, delays)
    assert (paced < base - 0.1).all()


def test_rank_permutation_symmetry_on_a_symmetric_node() -> None:
    """One node: relabelling the ranks (work and delays together) relabels the finish times, with
    interference acting (unequal work, so early ranks' polling slows later ones), and the
    iteration time is unchanged."""
    rng = np.random.default_rng(0)
    work = 0.5 + rng.uniform(0.0, 0.1, 8)
    delays = rng.uniform(0.0, 0.05, 8)
    perm = rng.permutation(8)
    interference = EarlyArrivalInterference(0.05, 8)
    finish = interference.finish_s(work, delays)
    assert (finish > work + 1e-6).sum() >= 4  # interference acts on most ranks
    np.testing.assert_allclose(interference.finish_s(work[perm], delays[perm]), finish[perm], rtol=1e-12)

    # end to end: a slow rank's label does not matter, only where its delay goes
    def run(slow: int, d: np.ndarray) -> Observation:
        sim = SimBackend(
            num_ranks=8,
            num_iterations=1,
            compute=ComputeModel(0.5, (SlowRanks(ranks=(slow,), factor=1.2),)),
            comm=FixedComm(0.01),
            interference=interference,
        )
        sim.reset(seed=0)
        return sim.step([Action(d)])[0]

    a, b = run(2, delays), run(int(np.argsort(perm)[2]), delays[perm])
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-12)
    np.testing.assert_allclose(b.arrival_s, a.arrival_s[perm], rtol=1e-12)


def test_contention_makes_the_collective_time_dependent() -> None:
    comm = ContentionComm(
        FatTree(ranks_per_node=8, nodes_per_leaf=2, oversubscription=4.0),
        64,
        message_bytes=1e9,
        cross_traffic=CrossTraffic(links=("leaf_up:*",), on_s=0.2, off_s=0.3, stagger=0.0),
    )
    sim = _sim(num_ranks=64, comm=comm)
    run = run_episode(sim, lambda: SafetyGuard(make_controller("none")))
    collective = run.collective_time_s[:, 0]
    assert collective.max() > 1.5 * collective.min()


def test_record_then_replay_reproduces_iteration_times() -> None:
    sim = _sim(kappa=0.05)
    ep = run_episode(
        sim, lambda: SafetyGuard(make_controller("threshold", on_threshold_s=0.005, off_threshold_s=0.001))
    )
    assert ep.applied_delay_s.sum() > 0
    trace = sim.to_trace()
    replay = ReplayBackend(trace)
    assert replay.fidelity().step_time_max_abs_err_frac < 1e-9
    # the recorded pacing delays are not launch gaps: an unpaced replay removes them
    unpaced = run_episode(replay, lambda: SafetyGuard(make_controller("none")))
    assert (unpaced.iteration_time_s <= ep.iteration_time_s + 1e-9).all()


def test_step_argument_checks() -> None:
    from pacectl.errors import BackendError

    sim = _sim()
    with pytest.raises(BackendError, match="after reset"):
        sim.step([Action.zeros(16)])
    sim.reset()
    with pytest.raises(BackendError, match="16 finite delays >= 0"):
        sim.step([Action(np.full(16, np.nan))])


def test_sim_cli_contract(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _cli(
        "backend=sim", "backend.num_ranks=32", "backend.num_iterations=60", "comm=contention", out=out
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comm_model"] == "contention" and summary["backend"] == "sim"
    assert set(summary["runs"]) == {"none", *all_families()}  # controller=all: the registry's
    for run in summary["runs"].values():
        assert {"throughput_it_per_s", "iteration_time_mean_s", "cv", "spread_median_s"} <= set(run)
    proc = _cli("backend=sim", "comm=null", "backend.num_iterations=20", out=tmp_path / "null")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "null" / "summary.json").read_text())["comm_model"] == "null"


def test_backend_arguments_are_checked() -> None:
    from pacectl.errors import ConfigError

    ok = {"num_ranks": 4, "num_iterations": 3, "compute": ComputeModel(0.1), "comm": FixedComm(0.01)}
    for record in ("maybe", "true", 1, None):
        with pytest.raises(
            ConfigError, match=r"^backend\.record must be true or false, got .*; e\.g\. backend\.record=true$"
        ):
            SimBackend(**ok, record=record)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^backend\.num_ranks must be an integer >= 1, got 'abc'"):
        SimBackend(**{**ok, "num_ranks": "abc"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^backend\.num_iterations must be an integer >= 1, got 0"):
        SimBackend(**{**ok, "num_iterations": 0})  # type: ignore[arg-type]
    assert SimBackend(**ok, record=np.bool_(True)).record is True  # type: ignore[arg-type]


def _cli(*overrides: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m pacectl.run OVERRIDES output.plots=false hydra.run.dir=OUT``, in this process."""
    from pacectl.run import main
    from pacectl.testing.commands import run_command

    return run_command(main, [*overrides, "output.plots=false", f"hydra.run.dir={out}"], cwd=out.parent)


SIM = ("backend=sim", "backend.num_ranks=16", "backend.num_iterations=5")


@pytest.mark.parametrize(
    ("n_iter", "batches", "block", "runs", "expected"),
    [
        (
            3,
            1,
            10,
            "2",
            "no throughput interval: 3 iterations make 1 block(s) of 10 (the live interleave block)",
        ),
        (3, 1, None, "2", "no throughput interval: 3 iterations make 1 block(s), and"),
        (10, 4, None, "2", "the throughput intervals rest on 4 blocks"),
        (100, 10, None, "2", ""),
        (3, 1, 10, "1", ""),  # nothing compared
        (1, 1, None, "2", ""),  # one iteration: the degenerate-run warning says it
    ],
)
def test_interval_warning_says_when_an_interval_is_missing_or_wide(
    n_iter: int, batches: int, block: int | None, runs: str, expected: str
) -> None:
    """A live run shorter than two interleave blocks prints changes with no interval: it must say so."""
    from pacectl.run import interval_warning

    got = interval_warning(n_iter, batches, block, int(runs))
    assert got.startswith(expected) if expected else got == ""


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("comm=contention", "cluster.topology.ranks_per_node=abc"),
            "cluster.topology.ranks_per_node must be an integer >= 1, got 'abc': "
            "for example cluster.topology.ranks_per_node=8",
        ),
        (
            (*SIM, "comm=contention", "cluster.topology.ranks_per_node=abc"),
            "cluster.topology.ranks_per_node must be an integer >= 1, got 'abc'",
        ),
        (
            ("comm=contention", "cluster.topology.nic_bandwidth_Bps=inf"),
            "cluster.topology.nic_bandwidth_Bps must be a finite number > 0, got inf",
        ),
        (
            ("comm=contention", "cluster.collective.algorithm=foo"),
            "cluster.collective.algorithm must be one of ring, tree, hierarchical, got 'foo'",
        ),
        (("comm=contention", "+cluster.foo=1"), "cluster has unknown key(s) ['foo']"),
        (
            (*SIM, "comm=contention", "+cluster.topology.foo=1"),
            "cluster.topology.foo: no such key (known: ranks_per_node, nodes_per_leaf,",
        ),
        (
            (*SIM, "comm=contention", "cluster.collective.message_bytes=nan"),
            "cluster.collective.message_bytes must be a finite number >= 0, got nan",
        ),
        (
            ("comm=contention", "cluster.collective.message_bytes=nan"),
            "cluster.collective.message_bytes must be a finite number >= 0, got nan",
        ),
    ],
)
def test_cli_rejects_bad_cluster_values_in_one_line(
    tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    proc = _cli(*overrides, out=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pacectl.run: error: {message}"), proc.stderr
    assert "Traceback" not in proc.stderr and "null" not in proc.stderr


def test_cli_null_replay_refuses_a_bad_cluster_value_too(tmp_path: Path) -> None:
    # The profile is a typed config: checked as a whole whichever model reads it (issue 22).
    proc = _cli(
        "comm=null",
        "trace=st",
        "controller=none",
        "cluster.topology.nodes_per_leaf=0",
        "output.iterations=false",
        "output.report=false",
        out=tmp_path / "run",
    )
    assert proc.returncode == 2 and not (tmp_path / "run").exists(), proc.stderr
    assert proc.stderr.strip() == (
        "pacectl.run: error: cluster.topology.nodes_per_leaf must be an integer >= 1, got 0 "
        "(override: cluster.topology.nodes_per_leaf=<value>)"
    )


def test_cli_rejects_a_non_boolean_record(tmp_path: Path) -> None:
    proc = _cli(*SIM, "backend.record=maybe", "controller=none", out=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "pacectl.run: error: backend.record must be true or false, got 'maybe' "
        "(override: backend.record=<value>)"
    )


def test_cli_records_go_where_a_live_runs_do_and_replay(tmp_path: Path) -> None:
    """backend.record=true: <run dir>/records/<controller>.parquet, named on the console and in
    summary.json; trace=<that file> replays it."""
    out = tmp_path / "run"
    proc = _cli(*SIM, "backend.record=true", "controller=threshold", out=out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (out / "records").iterdir()) == ["none.parquet", "threshold.parquet"]
    assert json.loads((out / "summary.json").read_text())["records_dir"] == str(out / "records")
    assert f"records (replay one with trace=<file>): {out / 'records'}" in proc.stdout + proc.stderr
    replay = _cli(f"trace={out / 'records' / 'none.parquet'}", "controller=none", out=tmp_path / "replay")
    assert replay.returncode == 0, replay.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("backend.num_ranks=1", "backend.num_iterations=5"), "every pacing domain has a single rank"),
        (("backend.num_ranks=4", "backend.num_iterations=1"), "only 1 iteration"),
        (("backend.num_ranks=4", "backend.num_iterations=10"), "the throughput intervals rest on 4 blocks"),
    ],
)
def test_cli_warns_when_nothing_can_be_paced_or_measured(
    tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    proc = _cli("backend=sim", *overrides, "controller=threshold", out=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert message in proc.stdout + proc.stderr
    assert any(message in w for w in json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"])
