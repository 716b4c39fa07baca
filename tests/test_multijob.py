"""Several jobs on one fabric in the simulator (pacectl/backends/multijob.py, pacectl/fabric/jobs.py,
conf/cluster/shared_uplink.yaml): the physics, the phase controller's interleaving, the null model's
zero, per-job summaries, and the bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pacectl.backends.multijob import MultiJobSimBackend
from pacectl.controllers import make_controller
from pacectl.controllers.guard import SafetyGuard
from pacectl.controllers.none import NoPacing
from pacectl.controllers.phase import PhaseController
from pacectl.errors import ConfigError
from pacectl.fabric.contention import ContentionComm, CrossTraffic
from pacectl.fabric.jobs import JobSpec, parse_jobs
from pacectl.fabric.noise import ComputeModel, LognormalJitter, SlowRanks
from pacectl.fabric.topology import FatTree
from pacectl.loop import run_episode
from pacectl.types import Action

# 4 nodes of 2 ranks, 2 nodes per leaf, 2:1 uplinks (one NIC's worth): job a on nodes 0 and 2, job b
# on nodes 1 and 3, so both rings cross leaf_up:0 and leaf_up:1 and halve each other's rate there
TOPO = FatTree(ranks_per_node=2, nodes_per_leaf=2, oversubscription=2.0)
A_RANKS, B_RANKS = (0, 1, 4, 5), (2, 3, 6, 7)


def _two(
    offset: float,
    *,
    sigma: float = 0.0,
    slow: bool = False,
    n: int = 100,
    comm: str = "contention",
    b_compute: float = 0.3,
) -> MultiJobSimBackend:
    def compute(c: float) -> ComputeModel:
        noise = ((LognormalJitter(sigma),) if sigma else ()) + (
            (SlowRanks(fraction=0.25, factor=1.1),) if slow else ()
        )
        return ComputeModel(c, noise)

    a = JobSpec("a", A_RANKS, compute(0.3), 4e9)
    b = JobSpec("b", B_RANKS, compute(b_compute), 4e9 * b_compute / 0.3, start_s=offset)
    return MultiJobSimBackend([a, b], TOPO, 8, num_iterations=n, comm=comm)


def _guarded(family: str):  # type: ignore[no-untyped-def]
    return lambda: SafetyGuard(make_controller(family))


# --- the physics ---------------------------------------------------------------------------------


def test_a_job_alone_takes_the_single_job_models_quiet_time() -> None:
    a = JobSpec("a", tuple(range(8)), ComputeModel(0.3), 4e9)
    sim = MultiJobSimBackend([a], TOPO, 8, num_iterations=3)
    single = ContentionComm(TOPO, 8, message_bytes=4e9)
    assert sim.fabrics[0].quiet_s == pytest.approx(single.free_time_s, rel=1e-12)
    sim.reset(seed=0)
    obs = sim.step([Action.zeros(8)])[0]
    assert obs.collective_time_s == pytest.approx(single.free_time_s, rel=1e-9)
    assert obs.iteration_time_s == pytest.approx(0.3 + single.free_time_s, rel=1e-9)


def test_overlapping_rings_share_the_uplink_max_min_fairly() -> None:
    """Two identical rings, the later starting phi after the earlier: both run at half rate while they
    overlap, so each takes T + (T_ring - phi) (the excess the phase controller's rule expects)."""
    sim = _two(0.02, n=2)
    fab = sim.fabrics[0]
    ring = fab.quiet_s - fab.fixed_s
    sim.reset(seed=0)
    first = sim.step([Action.zeros(4), Action.zeros(4)])
    second = sim.step([Action.zeros(4), Action.zeros(4)])
    got = {o.domain: o.collective_time_s for o in [*first, *second]}
    assert got[0] == pytest.approx(fab.quiet_s + ring - 0.02, rel=1e-9)
    assert got[1] == pytest.approx(fab.quiet_s + ring - 0.02, rel=1e-9)
    assert sim.shared and sim.shared[0][:2] == (0, 1) and "leaf_up:0" in sim.shared[0][2]


def test_disjoint_rings_never_slow_each_other() -> None:
    a = JobSpec("a", (0, 1, 2, 3), ComputeModel(0.3), 4e9)  # nodes 0, 1: leaf 0 only
    b = JobSpec("b", (4, 5, 6, 7), ComputeModel(0.3), 4e9)  # nodes 2, 3: leaf 1 only
    sim = MultiJobSimBackend([a, b], TOPO, 8, num_iterations=20)
    assert not sim.shared and sim.job_shift_note and not sim.comm_timing_dependent
    ep = run_episode(sim, lambda: SafetyGuard(NoPacing()))
    np.testing.assert_allclose(ep.collective_time_s, sim.fabrics[0].quiet_s, rtol=1e-9)


def test_the_competitor_reacts_a_square_wave_does_not() -> None:
    """Slowing job a's collective stretches a's period, which moves a's next collective; an open-loop
    square wave on the same links (cluster.cross_traffic) keeps its schedule whatever a does."""
    sim = _two(0.0, n=30)
    base = run_episode(sim, lambda: SafetyGuard(NoPacing()))
    b_alone = MultiJobSimBackend([sim.jobs[1]], TOPO, 8, num_iterations=30)
    alone = run_episode(b_alone, lambda: SafetyGuard(NoPacing()))
    assert base.domain_iteration_time_s is not None and alone.domain_iteration_time_s is not None
    assert base.domain_iteration_time_s[:, 1].mean() > alone.domain_iteration_time_s[:, 0].mean() * 1.05
    a = sim.jobs[0]
    wave = CrossTraffic(links=("leaf_up:0", "leaf_up:1"), on_s=0.2, off_s=0.2, stagger=0.0)
    square = MultiJobSimBackend([a], TOPO, 8, num_iterations=30, cross_traffic=wave)
    assert square.mechanisms == ("cross_traffic",)
    ep = run_episode(square, lambda: SafetyGuard(NoPacing()))
    assert ep.collective_time_s.max() > square.fabrics[0].quiet_s * 1.05


def test_per_rank_delays_within_earliness_change_no_duration() -> None:
    """The structural fact on several jobs: delays within each rank's earliness leave every job's
    collective start, and so every duration on the shared links, unchanged."""
    sim = _two(0.03, sigma=0.03, slow=True, n=40)
    base = run_episode(sim, lambda: SafetyGuard(NoPacing()), seed=3)

    # decide each iteration's delays from its own unpaced arrivals: replay the draws
    sim.reset(seed=3)
    work = [w.copy() for w in sim._work]
    sim.reset(seed=3)
    counts = [0, 0]
    obs = sim.step([Action(0.5 * (w[0].max() - w[0])) for w in work])
    times = {0: [], 1: []}
    for _ in range(60):
        for o in obs:
            times[o.domain].append(o.collective_time_s)
            counts[o.domain] += 1
        acts = [Action(0.5 * (work[j][counts[j]].max() - work[j][counts[j]])) for j in range(2)]
        obs = sim.step(acts)
    for j in range(2):
        k = min(len(times[j]), 30)
        np.testing.assert_allclose(times[j][:k], base.collective_time_s[:k, j], rtol=1e-9)


# --- phase: a stable interleaving --------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 0.07, 0.14, 0.21, 0.28, 0.35])
def test_two_identical_jobs_with_phase_interleave_from_any_offset(offset: float) -> None:
    """Two identical jobs (period ~0.39 s, ring ~27 % of it) on one shareable uplink, phase on both:
    from every initial offset, over seeds 0-2, the last 100 of 400 iterations run almost all on a
    quiet fabric. Seeded compute jitter (1 %) keeps drifting the jobs' relative phase, so phase
    keeps correcting: a stable interleaving, not a frozen one. No pacing, from the same offsets,
    often stays collided. (The shift rule alone, switch_off_iters=null: the switch-off's unpaced
    baseline and one judged window are tested in tests/test_wait_and_phase.py.)"""
    quiet = []
    for seed in (0, 1, 2):
        sim = _two(offset, sigma=0.01, n=400)
        q = sim.fabrics[0].quiet_s
        ep = run_episode(sim, lambda: SafetyGuard(PhaseController(switch_off_iters=None)), seed=seed)
        tail = ep.collective_time_s[-100:] / q - 1.0
        quiet.append(float((tail < 0.05).mean()))
        again = run_episode(sim, lambda: SafetyGuard(PhaseController(switch_off_iters=None)), seed=seed)
        np.testing.assert_array_equal(again.collective_time_s, ep.collective_time_s)  # seeded
    assert min(quiet) >= 0.7 and np.mean(quiet) >= 0.85, quiet


@pytest.mark.parametrize("offset", [0.0, 0.02, 0.05])
def test_a_profiled_quiet_time_breaks_a_collision_the_window_minimum_never_sees(offset: float) -> None:
    """Two identical jitter-free jobs that start overlapping stay overlapping at a fixed offset: every
    collective is slowed alike, the window minimum takes the collided time for the quiet one and
    phase never shifts. Given the quiet time measured alone (the job's solo time), it does, and the
    jobs interleave."""
    sim = _two(offset, n=200)
    q = sim.fabrics[0].quiet_s
    window = run_episode(sim, lambda: SafetyGuard(PhaseController()), seed=0)
    assert window.applied_delay_s.max() == 0.0
    assert (window.collective_time_s[-50:] > 1.3 * q).all()
    assert window.diagnostics["quiet_s"][-1] == pytest.approx(window.collective_time_s[-1], rel=1e-9)
    solo = MultiJobSimBackend(sim.jobs[:1], TOPO, 8, num_iterations=5)
    probed = float(np.median(run_episode(solo, lambda: SafetyGuard(NoPacing())).collective_time_s))
    assert probed == pytest.approx(q, rel=1e-12)  # a solo probe measures the quiet time
    profiled = run_episode(sim, lambda: SafetyGuard(PhaseController(quiet_s=probed)), seed=0)
    assert profiled.applied_delay_s.max() > 0.0
    np.testing.assert_allclose(profiled.collective_time_s[-50:], q, rtol=1e-9)


def test_phase_gains_on_shared_uplink_and_reports_both_jobs() -> None:
    sim = _two(0.0, sigma=0.01, n=300)
    none = run_episode(sim, lambda: SafetyGuard(NoPacing()), seed=0)
    phase = run_episode(sim, lambda: SafetyGuard(PhaseController()), seed=0)
    from pacectl import metrics

    s_none, s_phase = metrics.summarize(none), metrics.summarize(phase)
    assert set(s_phase["jobs"]) == {"a", "b"}
    assert s_phase["throughput_it_per_s"] == pytest.approx(
        sum(j["throughput_it_per_s"] for j in s_phase["jobs"].values())
    )
    assert s_phase["throughput_it_per_s"] > s_none["throughput_it_per_s"] * 1.05
    ci = metrics.paired_change_ci95_frac(none, phase)
    assert np.isfinite(ci) and ci > 0


def test_the_table_of_several_jobs_shows_their_sum_and_a_row_per_job() -> None:
    # the table's throughput was the jobs' sum but its mean iter their average: 1 / mean iter was not
    # the throughput. The sum row now leaves the iteration columns to the job rows, each consistent
    import re

    from pacectl import metrics, report

    sim = _two(0.0, sigma=0.01, n=300)
    runs = {
        name: metrics.summarize(run_episode(sim, lambda c=c: SafetyGuard(c()), seed=0))
        for name, c in (("none", NoPacing), ("phase", PhaseController))
    }
    for text in (report.format_console_table(runs), report._markdown_table(runs, "none")):
        rows, run = {}, ""
        for line in text.splitlines():
            cells = (
                [c.strip() for c in line.strip("|").split("|")]
                if "|" in line
                else re.split(r"\s{2,}", line.strip())
            )
            if cells[0].startswith(("none", "phase")):
                run = cells[0].split()[0]
                rows[cells[0]] = cells
            elif cells[0].startswith("job "):
                rows[f"{run} {cells[0]}"] = cells
        assert set(rows) == {
            "none (sum)",
            "none job a",
            "none job b",
            "phase (sum)",
            "phase job a",
            "phase job b",
        }
        for run in ("none", "phase"):
            total, jobs = rows[f"{run} (sum)"], [rows[f"{run} job {j}"] for j in "ab"]
            assert total[3:6] == ["—", "—", "—"], total
            assert float(total[1]) == pytest.approx(sum(float(j[1]) for j in jobs), abs=2e-3)
            for job, name in zip(jobs, "ab", strict=True):
                assert float(job[1]) == pytest.approx(
                    runs[run]["jobs"][name]["throughput_it_per_s"], rel=1e-3
                )
                assert float(job[1]) * float(job[3]) == pytest.approx(1.0, rel=2e-3)  # 1 / mean iter
        assert rows["none job a"][2] == "baseline" and rows["phase job a"][2].startswith(("+", "-"))


# --- more than two jobs -------------------------------------------------------------------------------

# 6 nodes of 2 ranks, 3 nodes per leaf, 3:1 uplinks (one NIC's worth): jobs a, b, c each on one node
# of leaf 0 and one of leaf 1, so all three rings cross leaf_up:0 and leaf_up:1
TOPO3 = FatTree(ranks_per_node=2, nodes_per_leaf=3, oversubscription=3.0)


def _three(
    offsets: tuple[float, float, float], *, sigma: float = 0.0, n: int = 100, comm: str = "contention"
) -> MultiJobSimBackend:
    noise = (LognormalJitter(sigma),) if sigma else ()
    jobs = [
        JobSpec(name, (2 * i, 2 * i + 1, 6 + 2 * i, 7 + 2 * i), ComputeModel(0.5, noise), 4e9, start_s=o)
        for i, (name, o) in enumerate(zip("abc", offsets, strict=True))
    ]
    return MultiJobSimBackend(jobs, TOPO3, 12, num_iterations=n, comm=comm)


def test_three_rings_on_one_uplink_each_get_a_third() -> None:
    sim = _three((0.0, 0.0, 0.0), n=2)
    assert [(i, j) for i, j, _ in sim.shared] == [(0, 1), (0, 2), (1, 2)]
    fab = sim.fabrics[0]
    sim.reset(seed=0)
    obs = sim.step([Action.zeros(4)] * 3)
    assert sorted(o.domain for o in obs) == [0, 1, 2]
    for o in obs:
        assert o.collective_time_s == pytest.approx(fab.fixed_s + 3 * (fab.quiet_s - fab.fixed_s), rel=1e-9)


@pytest.mark.parametrize("offsets", [(0.0, 0.0, 0.0), (0.0, 0.1, 0.2)])
def test_three_jobs_with_phase_interleave_and_every_run_gains(offsets: tuple[float, float, float]) -> None:
    """Three identical jobs (ring ~15 % of the period each, ~45 % together) under 1 % jitter: phase
    on every job brings most collectives of the last 100 of 400 iterations back to a quiet fabric,
    and the sum over jobs gains in every seed."""
    from pacectl import metrics

    sim = _three(offsets, sigma=0.01, n=400)
    q = sim.fabrics[0].quiet_s
    quiet = []
    for seed in (0, 1, 2):
        none = run_episode(sim, lambda: SafetyGuard(NoPacing()), seed=seed)
        phase = run_episode(sim, lambda: SafetyGuard(PhaseController()), seed=seed)
        quiet.append(float((phase.collective_time_s[-100:] / q - 1 < 0.05).mean()))
        s = metrics.summarize(phase)
        assert set(s["jobs"]) == {"a", "b", "c"}
        assert s["throughput_it_per_s"] > metrics.summarize(none)["throughput_it_per_s"]
    assert np.mean(quiet) >= 0.8, quiet


def test_the_three_job_profile_runs_and_reports_every_job() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl import metrics
    from pacectl.config import CONF_DIR
    from pacectl.experiment import make_experiment

    overrides = ["backend=sim", "cluster=shared_uplink3", "comm=contention", "backend.num_iterations=40"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        experiment = make_experiment(compose(config_name="config", overrides=overrides))
    b = experiment.backend
    assert [j.name for j in b.jobs] == ["a", "b", "c"] and len(b.shared) == 3
    assert all("leaf_up:0" in links for _, _, links in b.shared)
    s = metrics.summarize(experiment.run("phase", {}))
    assert set(s["jobs"]) == {"a", "b", "c"}
    assert s["throughput_it_per_s"] == pytest.approx(
        sum(j["throughput_it_per_s"] for j in s["jobs"].values())
    )


# --- the null model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 2, 3])
@pytest.mark.parametrize(
    "family", ["threshold", "pid", "ewma", "quantile", "forecast", "sleep_wait", "phase"]
)
def test_null_never_gains_with_one_job_or_several(jobs: int, family: str) -> None:
    sim = _two(0.0, sigma=0.03, slow=True, n=60, comm="null", b_compute=0.6)
    if jobs == 1:
        sim = MultiJobSimBackend(sim.jobs[:1], TOPO, 8, num_iterations=60, comm="null")
    if jobs == 3:
        sim = _three((0.0, 0.0, 0.0), sigma=0.03, n=60, comm="null")
    base = run_episode(sim, lambda: SafetyGuard(NoPacing()), seed=1)
    paced = run_episode(sim, _guarded(family), seed=1)
    assert base.domain_iteration_time_s is not None and paced.domain_iteration_time_s is not None
    # max-plus per job: every iteration of every job at least as long as unpaced
    assert (paced.domain_iteration_time_s >= base.domain_iteration_time_s - 1e-12).all()
    np.testing.assert_allclose(paced.collective_time_s, base.collective_time_s, rtol=1e-12)


# --- config: parse, contract, bad input -----------------------------------------------------------------


def test_parse_jobs_rejects_a_job_that_does_not_fit_and_a_rank_claimed_twice() -> None:
    compute = {"compute_s": 0.3}
    with pytest.raises(ConfigError, match=r"cluster\.jobs\.1 \(b\) claims ranks up to 71, which do not fit"):
        parse_jobs(
            [
                {"name": "a", "ranks": ["0-7"], "compute": compute},
                {"name": "b", "ranks": ["56-71"], "compute": compute},
            ],
            fabric_ranks=64,
            topology=FatTree(),
            message_bytes=1e9,
        )
    with pytest.raises(
        ConfigError, match=r"claims rank 7, which job 'a' already runs on.*\(now \[7-15, 20\]\)"
    ):
        parse_jobs(
            [
                {"name": "a", "ranks": ["0-7"], "compute": compute},
                {"name": "b", "ranks": ["7-15", 20], "compute": compute},
            ],
            fabric_ranks=64,
            topology=FatTree(),
            message_bytes=1e9,
        )
    for entry, message in [  # the typed entry refuses an unknown key and a wrong type
        ({"rank": 1}, r"cluster\.jobs\.0\.rank: no such key .*did you mean cluster\.jobs\.0\.ranks\?"),
        ({"start_s": "x"}, r"cluster\.jobs\.0\.start_s must be a finite number >= 0 \(seconds\), got 'x'"),
        ({"compute": {"compute_s": 0.3, "nois": []}}, r"cluster\.jobs\.0\.compute\.nois: no such key"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_jobs(
                [{"name": "a", "ranks": [0], "compute": compute, **entry}],
                fabric_ranks=8,
                topology=FatTree(),
                message_bytes=1e9,
            )
    with pytest.raises(ConfigError, match=r"cluster\.jobs\.0\.compute\.compute_s"):
        parse_jobs(
            [{"name": "a", "ranks": [0], "compute": {"compute_s": -1}}],
            fabric_ranks=8,
            topology=FatTree(),
            message_bytes=1e9,
        )
    jobs = parse_jobs(
        [{"name": "a", "ranks": ["0-1", 4, 5], "compute": compute}],
        fabric_ranks=8,
        topology=TOPO,
        message_bytes=1e9,
    )
    assert jobs[0].ranks == (0, 1, 4, 5) and jobs[0].nodes(2) == (0, 2)
    jobs = parse_jobs(  # one range or one rank in place of a list
        [{"name": "a", "ranks": "0-3", "compute": compute}, {"ranks": 5, "compute": compute}],
        fabric_ranks=8,
        topology=TOPO,
        message_bytes=1e9,
    )
    assert [(j.name, j.ranks, j.message_bytes) for j in jobs] == [
        ("a", (0, 1, 2, 3), 1e9),
        ("job1", (5,), 1e9),
    ]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pacectl.run",
            "backend=sim",
            "cluster=shared_uplink",
            "output.plots=false",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["cluster.jobs.1.ranks=[56-71]"],
            "cluster.jobs.1 (b) claims ranks up to 71, which do not fit the fabric of 64 ranks",
        ),
        (["cluster.jobs.1.ranks=[7-15]"], "cluster.jobs.1 (b) claims rank 7, which job 'a' already runs on"),
        (
            ["+cluster.per_job.c.controller_params.phase.quiet_s=0.1"],
            "cluster.per_job.c names no job of cluster=shared_uplink: its jobs are ['a', 'b']",
        ),
        (
            ["+cluster.per_job.b.controller_params.phase.quiet_s=-1"],
            "cluster.per_job.b.controller_params.phase.quiet_s must be > 0, got -1",
        ),
    ],
)
def test_bad_jobs_get_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    proc = _run("comm=contention", "controller=phase", *args, f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("warning")]
    assert len(errors) == 1, proc.stderr
    assert not out.exists()


def test_contract_summary_has_every_job_and_the_sum(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(
        "comm=contention",
        "controller=phase",
        "backend.num_iterations=120",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    for run in ("none", "phase"):
        r = summary["runs"][run]
        assert set(r["jobs"]) == {"a", "b"}
        assert r["throughput_it_per_s"] == pytest.approx(
            sum(j["throughput_it_per_s"] for j in r["jobs"].values())
        )
        for job in r["jobs"].values():
            assert {"throughput_it_per_s", "iteration_time_mean_s", "iteration_time_p99_s", "cv"} <= set(job)
    # a gain for one job is reported next to the other job's figure
    assert set(summary["vs_baseline"]["phase"]["jobs"]) == {"a", "b"}
    assert all("throughput_change_frac" in j for j in summary["vs_baseline"]["phase"]["jobs"].values())
    assert [j["name"] for j in summary["sim"]["jobs"]] == ["a", "b"]
    assert summary["sim"]["shared_links"][0]["jobs"] == ["a", "b"]


def test_null_contract_shows_no_gain(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(
        "comm=null",
        "controller=all",
        "controller.families=[threshold,phase,sleep_wait]",
        "backend.num_iterations=60",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    for name, vs in summary["vs_baseline"].items():
        assert vs["throughput_change_frac"] <= 1e-12, name
        assert all(j["throughput_change_frac"] <= 1e-12 for j in vs["jobs"].values()), name
    assert any("phase: no other traffic" in w for w in summary["warnings"])


def test_phase_on_a_single_job_with_no_other_traffic_is_a_clear_note(tmp_path: Path) -> None:
    """One job left on the fabric: phase cannot move against anything; the run says so in one line
    (not a silent zero) and runs."""
    out = tmp_path / "run"
    proc = _run(
        "comm=contention",
        "controller=phase",
        "backend.num_iterations=30",
        "cluster.jobs=[{name:a,ranks:[0-7,16-23],compute:{compute_s:0.3}}]",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "phase: no other traffic" in line]
    assert len(lines) == 1 and "one job on the fabric and no cross traffic" in lines[0], proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"]["phase"]["pacing_delay_total_s"] == 0.0


def test_kappa_override_replaces_the_profiles() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.experiment import make_experiment

    base = ["backend=sim", "cluster=shared_uplink", "comm=contention"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        plain = make_experiment(compose(config_name="config", overrides=base))
        bumped = make_experiment(
            compose(config_name="config", overrides=[*base, "cluster.interference.kappa=0.05"])
        )
    assert type(plain).__name__ == "MultiJobSimExperiment"
    assert plain.backend.interference.kappa == 0.0
    assert bumped.backend.interference.kappa == 0.05
    assert "early_arrival_interference" in bumped.backend.mechanisms
    assert bumped.describe()["sim"]["interference_kappa"] == 0.05
    assert plain.describe()["sim"]["interference_kappa_source"].startswith("assumed: scenario choice")


@pytest.mark.parametrize("pin", ["+cluster.jobs.1.controller=none", "cluster.jobs.1.controller=none"])
def test_a_job_can_pin_its_own_controller(pin: str) -> None:
    """``cluster.jobs.<i>.controller`` gives that job its own family: under ``controller=phase`` job b
    pinned to ``none`` never delays, while a (the run's phase) shifts. The entry's type has the key,
    so it is set with or without ``+``."""
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.experiment import make_experiment

    overrides = [
        "backend=sim",
        "cluster=shared_uplink",
        "comm=contention",
        "backend.num_iterations=150",
        pin,
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        experiment = make_experiment(compose(config_name="config", overrides=overrides))
    ep = experiment.run("phase", {})
    b = ep.domain_of_rank == 1
    assert ep.applied_delay_s[:, b].max() == 0.0
    assert ep.applied_delay_s[:, ~b].max() > 0.0


def _composed(*overrides: str):  # type: ignore[no-untyped-def]
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.experiment import make_experiment

    base = ["backend=sim", "cluster=shared_uplink", "comm=contention", *overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return make_experiment(compose(config_name="config", overrides=base))


def test_per_job_sets_a_jobs_keys_and_its_controller_params_by_name() -> None:
    """``+cluster.per_job.<job>.<key>``: b's own start, compute time (its noise kept: mappings merge)
    and phase's quiet time for b only; a keeps the profile's values and the window minimum."""
    experiment = _composed(
        "backend.num_iterations=20",
        "+cluster.per_job.b.start_s=0.2",
        "+cluster.per_job.b.compute.compute_s=0.5",
        "+cluster.per_job.b.controller_params.phase.quiet_s=0.191",
    )
    a, b = experiment.jobs
    assert (b.start_s, b.compute.compute_s, len(b.compute.components)) == (0.2, 0.5, 2)
    assert (a.start_s, a.compute.compute_s, a.controller_params) == (0.0, 0.3, {})
    assert b.controller_params == {"phase": {"quiet_s": 0.191}}
    described = experiment.comm_description  # the report's comm-model line names what was set
    assert (
        "running job a: 16 ranks on nodes [0, 2], compute 0.3 s (2 noise components), 4e+09 B all-reduced, "
        "quiet all-reduce 95.6 ms | job b: 16 ranks on nodes [1, 3], compute 0.5 s (2 noise components), "
        "8e+09 B all-reduced, quiet all-reduce 191 ms, starts at 0.2 s, its phase {'quiet_s': 0.191}; shared links: "
    ) in described
    assert experiment.describe()["sim"]["jobs"][1]["controller_params"] == {"phase": {"quiet_s": 0.191}}
    ep = experiment.run("phase", {})
    quiet = ep.diagnostics["quiet_s"][-1]
    assert quiet[1] == 0.191 and quiet[0] != 0.191  # b's given, a's its window minimum
    assert b.params_for("none", {}) == {}  # only the family they are for takes them


def test_per_job_sets_one_entry_of_a_list_by_its_index() -> None:
    """``+cluster.per_job.b.compute.noise.0.sigma``: Hydra makes ``noise`` a mapping of indices,
    which sets that entry's key; the entry's kind and the list's other entry are kept."""
    a, b = _composed("+cluster.per_job.b.compute.noise.0.sigma=0.05").jobs
    assert [type(c).__name__ for c in b.compute.components] == [
        type(c).__name__ for c in a.compute.components
    ]
    assert (b.compute.components[0].sigma, a.compute.components[0].sigma) == (0.05, 0.03)
    assert b.compute.components[1] == a.compute.components[1]


def test_per_job_merge_sets_list_entries_by_index_and_refuses_what_has_no_entry() -> None:
    from pacectl.fabric.jobs import _merged

    base = {
        "compute": {"compute_s": 0.3, "noise": [{"kind": "lognormal", "sigma": 0.03}]},
        "ranks": ["0-7", 9],
    }
    merged = _merged(base, {"compute": {"noise": {"0": {"sigma": 0.1}}}, "ranks": {"1": 10}}, "w")
    assert merged == {
        "compute": {"compute_s": 0.3, "noise": [{"kind": "lognormal", "sigma": 0.1}]},
        "ranks": ["0-7", 10],
    }
    assert base["compute"]["noise"][0]["sigma"] == 0.03  # the entry itself is not changed
    for extra, message in [
        (
            {"compute": {"noise": {"1": {"sigma": 0.1}}}},
            r"w\.compute\.noise\.1: the job's noise has 1 entry, so",
        ),
        ({"compute": {"noise": {"kind": "x"}}}, r"w\.compute\.noise is a list, so its keys are indices"),
        ({"compute": {"noise": {}}}, r"w\.compute\.noise is a list, .* the mapping \{\}"),
        ({"ranks": {"0": 1, "x": 2}}, r"w\.ranks is a list, so its keys are indices"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _merged(base, extra, "w")
    with pytest.raises(
        ConfigError, match=r"w\.compute\.noise\.0: the job's noise is not set, .*'\+w\.compute\.noise=\["
    ):
        _merged(
            {"compute": None}, {"compute": {"noise": {"0": {"sigma": 0.1}}}}, "w"
        )  # a job's compute unset
    assert _merged({"compute": None}, {"compute": {"compute_s": 0.5}}, "w") == {"compute": {"compute_s": 0.5}}
    with pytest.raises(
        ConfigError, match=r"w\.compute\.compute_s\.0: the job's compute_s is 0\.3, not a list"
    ):
        _merged(base, {"compute": {"compute_s": {"0": 1}}}, "w")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+cluster.per_job.bb.start_s=0.1",
            r"cluster\.per_job\.bb names no job .* Did you mean cluster\.per_job\.b\?",
        ),
        ("+cluster.per_job.b.name=c", r"cluster\.per_job\.b has unknown key\(s\) \['name'\]"),
        ("+cluster.per_job.b.start_s=-1", r"cluster\.per_job\.b\.start_s must be a finite number >= 0"),
        (
            "+cluster.per_job.b.start_s=abc",
            r"cluster\.per_job\.b\.start_s must be a finite number >= 0 .*'abc'",
        ),
        (
            "+cluster.per_job.b.rank=1",
            r"cluster\.per_job\.b has unknown key\(s\) \['rank'\].*per_job\.b\.ranks=1",
        ),
        ("+cluster.per_job.b.compute.nois=[]", r"cluster\.per_job\.b\.compute\.nois: no such key"),
        ("+cluster.per_job.b=5", r"cluster\.per_job\.b must be a mapping, got 5"),
        (
            "+cluster.per_job.b.controller_params.phaze.quiet_s=0.1",
            r"cluster\.per_job\.b\.controller_params\.phaze: 'phaze' is not a controller family \(did you mean 'phase'",
        ),
        (
            "+cluster.per_job.b.controller_params.phase.quiet=0.1",
            r"cluster\.per_job\.b\.controller_params\.phase has unknown key\(s\) \['quiet'\].*quiet_s",
        ),
        (
            "+cluster.per_job.b.compute.noise.0.sigma=-1",
            r"cluster\.per_job\.b\.compute\.noise\.0\.sigma must be >= 0, got -1",
        ),
        (
            "+cluster.per_job.b.compute.noise.1.sigma=0.1",
            r"noise\.1\.sigma: no such key \(known: ranks, fraction, factor\).*is a 'slow_ranks' item; another kind",
        ),
        (
            "+cluster.per_job.b.compute.noise.5.sigma=0.1",
            r"cluster\.per_job\.b\.compute\.noise\.5: the job's noise has 2 entries.*"
            r"'\+cluster\.per_job\.b\.compute\.noise=\[",
        ),
        (
            "+cluster.jobs.1.controller_params.phase.gain=3",
            r"cluster\.jobs\.1\.controller_params\.phase\.gain must be in \(0, 2\]",
        ),
    ],
)
def test_per_job_bad_input_names_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _composed(override)


def test_per_job_on_a_profile_without_jobs_is_refused() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.experiment import make_experiment

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["backend=sim", "+cluster.per_job.a.start_s=0.1"])
        with pytest.raises(
            ConfigError, match=r"cluster\.per_job sets keys of named jobs, but cluster=\S+ places no jobs"
        ):
            make_experiment(cfg)


# --- the study script ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_multi_job_study_runs_and_its_null_rows_are_zero(tmp_path: Path) -> None:
    """experiments/multi_job/run_study.py on 1 seed of 30 iterations: its records, comm=null's zero,
    and per-rank delays within earliness moving nothing (quantile, sleep_wait: no start shift)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "experiments/multi_job/run_study.py",
            "--seeds",
            "1",
            "--iterations",
            "30",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == {"multi_job.json", "multi_job.csv", "multi_job.md"}
    record = json.loads((out / "multi_job.json").read_text())
    assert record["command"].startswith("python experiments/multi_job/run_study.py")
    for scenario in ("comm=null", "comm=null (periods 1:1.37)", "comm=null (three jobs)"):
        null = record["scenarios"][scenario]["runs"]
        assert all(r["throughput_change_frac"] <= 1e-12 for r in null.values()), scenario
        assert null["phase"]["throughput_change_frac"] == 0.0
        assert null["phase_probe"]["throughput_change_frac"] == 0.0
        assert null["phase_no_switch_off"]["throughput_change_frac"] == 0.0
    assert set(record["scenarios"]["three jobs"]["runs"]["phase"]["jobs"]) == {"a", "b", "c"}
    shared = record["scenarios"]["shared_uplink"]
    assert shared["ceiling_it_per_s"] > shared["runs"]["none"]["throughput_it_per_s"]
    assert all(j["start_shift_s"] == 0.0 for j in shared["runs"]["sleep_wait"]["jobs"].values())
