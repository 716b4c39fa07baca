"""The study scripts' shared cells (pacectl.studies), the staleness study and its forecast margin sweep, on tiny settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import initialize_config_dir

from pacectl import metrics
from pacectl.config import CONF_DIR
from pacectl.controllers import all_families
from pacectl.studies import combined_half_width, sim_cell, sim_episodes

ROOT = Path(__file__).resolve().parents[1]


def test_sim_cell_means_the_seeds_episodes() -> None:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cell = sim_cell(["comm=contention"], cluster="paper_like", num_ranks=8, iterations=30, seeds=2)
        seeds = [
            sim_episodes(["comm=contention"], cluster="paper_like", num_ranks=8, iterations=30, seed=s)
            for s in (0, 1)
        ]
    assert set(cell) == {"none", *all_families()}  # controller=all: the registry's
    for family, row in cell.items():
        summaries = [metrics.summarize(eps[family]) for eps in seeds]
        assert row["cv"] == np.mean([s["cv"] for s in summaries])
        assert row["comm_timing_dependent"] is True
        halves = [metrics.paired_change_ci95_frac(eps["none"], eps[family]) for eps in seeds]
        assert row["throughput_change_ci95_frac"] == combined_half_width(halves)
    assert cell["none"]["throughput_change_ci95_frac"] == 0.0


def test_combined_half_width_of_independent_seeds() -> None:
    assert combined_half_width([0.3, 0.4]) == 0.25  # sqrt(0.09 + 0.16) / 2
    assert combined_half_width([0.2]) == 0.2


def _tiny_study(script: str, out: Path) -> None:
    """Run ``experiments/staleness/<script>`` on 1 seed of 40 iterations into ``out``; it must succeed."""
    proc = subprocess.run(
        [sys.executable, f"experiments/staleness/{script}", "--iterations", "40", "--seeds", "1"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr


def test_staleness_study_runs_and_its_reference_rows_are_consistent(tmp_path: Path) -> None:
    out = tmp_path / "results"
    _tiny_study("run_study.py", out)
    assert {p.name for p in out.iterdir()} == {
        "results.csv",
        "table.md",
        "throughput_vs_lag.png",
        "meta.json",
    }
    frame = pd.read_csv(out / "results.csv")
    # no pacing takes no decision: the schedule cannot change it
    none = frame[frame["controller"] == "none"]
    assert (none.groupby(["scenario", "num_ranks"])["throughput_it_per_s"].nunique() == 1).all()
    instant = frame[(frame["lag_iters"] == 1) & (frame["every_iters"] == 1)]
    assert (instant["vs_instant_frac"] == 0.0).all()
    # the max-plus control: fixed durations, no controller gains under any schedule
    control = frame[~frame["comm_timing_dependent"]]
    assert len(control) and (control["throughput_change_frac"] <= 1e-12).all()
    assert "reference" in (out / "table.md").read_text()


def test_forecast_margin_sweep_runs_and_the_max_plus_control_never_gains(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / "table.md").write_text("the staleness study's own file")  # shares the folder: kept
    _tiny_study("forecast_margin.py", out)
    assert {p.name for p in out.iterdir()} == {
        "table.md",
        "forecast_margin.csv",
        "forecast_margin.md",
        "forecast_margin.png",
    }
    assert (out / "table.md").read_text() == "the staleness study's own file"
    frame = pd.read_csv(out / "forecast_margin.csv")
    assert len(frame) == 4 * 3 * 6  # scenarios x lags x margins
    control = frame[~frame["comm_timing_dependent"]]
    assert len(control) == 3 * 6 and (control["throughput_change_frac"] <= 1e-12).all()
    assert "| margin 0.5 | margin 1 | margin 1.5 |" in (out / "forecast_margin.md").read_text()


def test_staleness_study_refuses_a_bad_out_before_simulating(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = subprocess.run(
        [sys.executable, "experiments/staleness/run_study.py", "--out", str(blocker / "sub")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--out" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("profile", "ranks", "lowest", "median"), [("alibaba_pai", 8, 0.4, 0.6), ("h200_gloo4", 4, 0.2, 0.5)]
)
def test_real_step_time_profiles_replay_correlated_series(
    profile: str, ranks: int, lowest: float, median: float
) -> None:
    """The staleness study's real-data scenarios: each rank replays one recorded worker (Alibaba PAI)
    or rank (the H200 capture), whose series are correlated over iterations (i.i.d. synthetic
    noise would show ~0)."""
    from hydra import compose

    from pacectl.config import as_dict
    from pacectl.fabric.noise import EmpiricalSamples
    from pacectl.fabric.profile import compute_from

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["backend=sim", f"cluster={profile}"])
    model = compute_from(as_dict(cfg.cluster))
    assert [type(c) for c in model.components] == [EmpiricalSamples]
    times = model.sample(np.random.default_rng(0), 300, ranks)
    lag1 = [np.corrcoef(times[:-1, r], times[1:, r])[0, 1] for r in range(ranks)]
    assert min(lag1) > lowest and np.median(lag1) > median
    assert cfg.cluster.tune_sim.num_ranks == ranks


def test_h200_compute_series_is_derived_from_the_capture() -> None:
    """gloo4_compute.csv (replayed by cluster=h200_gloo4) is exactly what its ATTRIBUTION.md says."""
    from pacectl.data import DATA_DIR

    folder = DATA_DIR / "h200-capture"
    iters = pd.read_csv(folder / "gloo4_iters.csv")
    buckets = pd.read_csv(folder / "gloo4_buckets.csv")
    first = buckets[buckets["bucket"] == 0][["rank", "iteration", "enter_ns"]]
    joined = iters.merge(first, on=["rank", "iteration"])
    joined = joined[joined["iteration"] >= 30].sort_values(["rank", "iteration"])
    want = pd.DataFrame(
        {
            "worker": joined["rank"].to_numpy(),
            "iteration": joined["iteration"].to_numpy(),
            "batch_time_norm": ((joined["enter_ns"] - joined["start_ns"]) / 1e3).round(3).to_numpy(),
        }
    )
    shipped = pd.read_csv(folder / "gloo4_compute.csv")
    pd.testing.assert_frame_equal(shipped, want)
    assert shipped.groupby("worker").size().tolist() == [170] * 4


def test_empirical_step_times_follow_the_time_column_not_the_row_order(tmp_path) -> None:
    from pacectl.data import DATA_DIR
    from pacectl.fabric.noise import EmpiricalSamples

    shipped = DATA_DIR / "alibaba-pai" / "job_1_norm.csv"
    shuffled = tmp_path / "shuffled.csv"
    pd.read_csv(shipped).sample(frac=1.0, random_state=0).to_csv(shuffled, index=False)
    np.testing.assert_array_equal(
        EmpiricalSamples(str(shuffled))._factors, EmpiricalSamples(str(shipped))._factors
    )


def test_alibaba_fill_keeps_the_samples_and_their_lag10_autocorrelation() -> None:
    """The PAI series is sampled every 10 iterations: the AR(1) bridge passes through every sample and
    its lag-10 autocorrelation is the samples' lag-1 one; the description says how it fills."""
    from pacectl.data import DATA_DIR
    from pacectl.fabric.noise import EmpiricalSamples

    model = EmpiricalSamples(str(DATA_DIR / "alibaba-pai" / "job_1_norm.csv"))
    assert model.interval_iters == 10
    assert "AR(1) bridge" in model.describe() and "every 10 iterations" in model.describe()
    series = model._series(np.random.default_rng(0))
    np.testing.assert_allclose(series[::10], model._factors, rtol=1e-12)
    for w in range(series.shape[1]):
        logs = np.log(series[:, w])
        lag10 = np.corrcoef(logs[:-10], logs[10:])[0, 1]
        assert abs(lag10 - model._rho[w]) < 0.1
    held = EmpiricalSamples(str(DATA_DIR / "alibaba-pai" / "job_1_norm.csv"), fill="hold")._series(
        np.random.default_rng(0)
    )
    assert held.shape[0] == 10 * model._factors.shape[0]
