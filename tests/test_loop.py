"""The driver loop's exchange schedule: when a decision reaches the ranks (lag, every)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pacectl.backends.sim import SimBackend
from pacectl.fabric.contention import EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import ComputeModel, LognormalJitter
from pacectl.loop import ExchangeSchedule, run_episode
from pacectl.types import Action, Observation

RANKS = 4


class Counter:
    """Decision n (n = 1, 2, ...) delays every rank by n ms and reports active = n."""

    name = "counter"

    def reset(self, num_ranks: int, rng: np.random.Generator) -> None:
        self.n = 0
        self.out = np.zeros(num_ranks)

    def act(self, obs: Observation) -> Action:
        self.n += 1
        self.out[:] = 1e-3 * self.n  # the same array every time: the loop must not hold it
        return Action(self.out)

    def diagnostics(self) -> dict[str, float]:
        return {"active": float(self.n)}


def _sim(iters: int = 30) -> SimBackend:
    return SimBackend(
        num_ranks=RANKS,
        num_iterations=iters,
        compute=ComputeModel(0.1, (LognormalJitter(0.05),)),
        comm=FixedComm(0.01),
        interference=EarlyArrivalInterference(0.0, 8),
    )


def _expected_decision(schedule: ExchangeSchedule, iters: int) -> np.ndarray:
    """Per iteration: which decision (1-based, 0 = none) paces it, written from the definition."""
    out = np.zeros(iters, dtype=int)
    for j in range(iters):
        # decision k + 1 was taken on observation k; it counts only at the end of a group
        taken = [k + 1 for k in range(iters) if (k + 1) % schedule.every == 0 and k + schedule.lag <= j]
        out[j] = max(taken, default=0)
    return out


@pytest.mark.parametrize(("lag", "every"), [(1, 1), (2, 1), (3, 1), (1, 4), (2, 4), (2, 10)])
def test_each_iteration_is_paced_by_the_decision_the_schedule_delivers(lag: int, every: int) -> None:
    schedule = ExchangeSchedule(lag=lag, every=every)
    ep = run_episode(_sim(), Counter, exchange=schedule)
    want = _expected_decision(schedule, 30)
    assert np.allclose(ep.applied_delay_s, 1e-3 * want[:, None])
    # diagnostics and pacing_active belong to the decision that paced the iteration
    assert np.array_equal(ep.diagnostics["active"][:, 0], want.astype(float))
    assert np.array_equal(ep.pacing_active[:, 0], want > 0)
    assert (want[: lag + every - 1] == 0).all() and want[lag + every - 1] == every


def test_default_schedule_is_the_next_iteration() -> None:
    a = run_episode(_sim(), Counter)
    b = run_episode(_sim(), Counter, exchange=ExchangeSchedule(1, 1))
    assert np.array_equal(a.applied_delay_s, b.applied_delay_s)
    assert np.allclose(a.applied_delay_s[1:, 0], 1e-3 * np.arange(1, 30))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_schedule_rejects_non_positive_integers(bad: object) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        ExchangeSchedule(lag=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer >= 1"):
        ExchangeSchedule(every=bad)  # type: ignore[arg-type]


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``python -m pacectl.run OVERRIDES hydra.run.dir=TMP/run``, in this process."""
    from pacectl.run import main
    from pacectl.testing.commands import run_command

    return run_command(main, [*overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)


def test_cli_lag_reaches_the_episode_and_the_summary(tmp_path: Path) -> None:
    proc = _run(
        tmp_path,
        "backend=sim",
        "backend.num_ranks=8",
        "backend.num_iterations=40",
        "controller=threshold",
        "controller.on_threshold_s=0.0",
        "controller.off_threshold_s=0.0",
        "exchange.lag_iters=3",
        "exchange.every_iters=2",
        "output.plots=false",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exchange"] == {"lag_iters": 3, "every_iters": 2, "source": "modelled, exchange.*"}
    assert "paces from iteration k + 3" in proc.stdout + proc.stderr
    frame = __import__("pandas").read_parquet(tmp_path / "run" / "iterations.parquet")
    paced = frame[(frame.run == "threshold")].groupby("iteration")["applied_delay_s"].sum()
    # the first decision (taken on iteration 1, the end of the first group) paces iteration 4
    assert (paced.loc[:3] == 0).all() and paced.loc[4:].sum() > 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("exchange.lag_iters=0", "exchange.lag_iters must be an integer >= 1, got 0"),
        ("exchange.every_iters=two", "exchange.every_iters must be an integer >= 1, got 'two'"),
        ("+exchange.lagg=2", "exchange has unknown key(s) ['lagg']"),
        ("exchange=3", "exchange must be a mapping, got 3"),
        ("exchange=null", "exchange must be a mapping, got None"),
    ],
)
def test_cli_bad_exchange_is_one_line(tmp_path: Path, override: str, message: str) -> None:
    proc = _run(tmp_path, "backend=sim", "backend.num_iterations=5", override)
    assert proc.returncode == 2
    assert message in proc.stderr.lower() or message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_cli_torch_backend_points_at_its_real_exchange(tmp_path: Path) -> None:
    proc = _run(tmp_path, "backend=torch", "exchange.lag_iters=2")
    assert proc.returncode == 2
    assert "backend.pacing.gather" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("overrides", "horizon", "hold"),
    [
        (["backend=sim"], 1, 1),
        (["backend=sim", "exchange.lag_iters=3"], 3, 1),
        (["backend=replay", "exchange.lag_iters=2", "exchange.every_iters=5"], 2, 5),
        (["backend=torch"], 1, 1),  # auto resolves to async on gloo
        (["backend=torch", "backend.pacing.gather=piggyback", "backend.pacing.gather_every=10"], 2, 10),
        # a typed config has every key (a missing one, from a controller_file: test_fill_schedule_*)
        (["backend=sim", "exchange.every_iters=2", "controller.hold_iters=auto"], 1, 2),
    ],
)
def test_forecast_horizon_auto_is_the_runs_decision_schedule(
    overrides: list[str], horizon: int, hold: int
) -> None:
    import warnings

    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, controller_families

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["controller=forecast", *overrides])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # resolved from the run: nothing to warn about
        params = controller_families(cfg)["forecast"]
    assert (params["horizon_iters"], params["hold_iters"]) == (horizon, hold)


def test_forecast_explicit_horizon_that_differs_from_the_run_warns() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, controller_families

    overrides = ["controller=forecast", "exchange.lag_iters=3", "controller.horizon_iters=1"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with pytest.warns(UserWarning, match=r"horizon_iters=1 \(this run: 3\).*set them to auto"):
        params = controller_families(cfg)["forecast"]
    assert params["horizon_iters"] == 1  # explicit wins
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["controller=forecast", "controller.hold_iters=3.0"])
    with pytest.warns(UserWarning, match=r"hold_iters=3 \(this run: 1\)"):
        params = controller_families(cfg)["forecast"]
    assert params["hold_iters"] == 3 and isinstance(params["hold_iters"], int)  # 3.0 normalized


def test_forecast_controller_file_without_the_keys_follows_the_run(tmp_path: Path) -> None:
    """A controller file that leaves horizon_iters / hold_iters out gets the run's lag and every."""
    (tmp_path / "c.yaml").write_text("name: forecast\nmargin_sigmas: 0.5\n")
    proc = _run(
        tmp_path,
        "backend=sim",
        "backend.num_iterations=20",
        f"controller_file={tmp_path / 'c.yaml'}",
        "exchange.lag_iters=2",
        "exchange.every_iters=3",
        "output.plots=false",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    params = summary["controller_params"]["forecast"]
    assert (params["horizon_iters"], params["hold_iters"], params["margin_sigmas"]) == (2, 3, 0.5)
    assert not summary["warnings"]


def test_forecast_horizon_auto_under_controller_all_and_in_tune() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, controller_families
    from pacectl.tuning.settings import Settings, tune_space

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["backend=sim", "exchange.lag_iters=4", "exchange.every_iters=3"])
        params = controller_families(cfg)["forecast"]
        assert (params["horizon_iters"], params["hold_iters"]) == (4, 3)
        tune_cfg = compose("tune", overrides=["controller=forecast", "exchange.lag_iters=2"])
    space = tune_space(tune_cfg, Settings.from_cfg(tune_cfg.tune))
    assert (space.fixed["horizon_iters"], space.fixed["hold_iters"]) == (2, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["backend=torch"], "pacectl.tune tunes offline"),
        (
            ["cluster=alibaba_pai", "controller.warmup_iters=1"],
            "a fixed value of the controller, not of the search space",
        ),
        (
            ["cluster=alibaba_pai", "controller.horizon_iters=0"],
            "horizon_iters must be an integer >= 1 or auto (the run's exchange), got 0",
        ),
    ],
)
def test_tune_refuses_the_live_backend_and_names_a_fixed_value_at_fault(
    tmp_path: Path, args: list[str], message: str
) -> None:
    from pacectl.testing.commands import run_command
    from pacectl.tune import main

    proc = run_command(
        main, ["controller=forecast", *args, f"hydra.run.dir={tmp_path / 'tune'}"], cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "tune").exists()


def test_forecast_bad_gather_every_is_named() -> None:
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR, controller_families
    from pacectl.errors import ConfigError

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=["controller=forecast", "backend=torch", "backend.pacing.gather_every=0"]
        )
    with pytest.raises(ConfigError, match="backend.pacing.gather_every must be an integer >= 1, got 0"):
        controller_families(cfg)
