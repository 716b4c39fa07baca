"""``python -m pacectl.tune``: end to end, kill and resume, shared storage, export, bad search spaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir

from pacectl.config import CONF_DIR
from pacectl.errors import ConfigError
from pacectl.tune import run_tuning
from pacectl.tuning.space import parse_space
from pacectl.tuning.study import StorageSpec, TrialPoint, choose, pareto_front, pareto_mask

FAST = ["cluster=st", "tune.population_size=4"]


def _tune(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pacectl.tune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _trials(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    kind = "rdb" if "://" in storage else "journal"
    study = optuna.load_study(study_name=name, storage=StorageSpec(kind, storage).open())
    return study.get_trials(deepcopy=False)


@pytest.fixture(scope="module")
def small_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "run"
    proc = _tune(*FAST, "controller=threshold", "tune.n_trials=6", f"hydra.run.dir={out}", cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    assert "[6/6] trial" in proc.stdout and "optuna-dashboard" in proc.stdout
    return out


def test_small_study_end_to_end(small_study: Path) -> None:
    pareto = json.loads((small_study / "pareto.json").read_text())
    assert isinstance(pareto, list) and pareto
    for item in pareto:
        assert {"params", "throughput_it_per_s", "cv"} <= set(item)
        assert set(item["params"]) == {"on_threshold_s", "off_threshold_s", "gain", "smoothing"}
        assert item["params"]["off_threshold_s"] <= item["params"]["on_threshold_s"]
    summary = json.loads((small_study / "tune.json").read_text())
    assert summary["num_trials"]["complete"] == 6
    assert summary["comm_model"] == "null" and summary["scenarios"]["labels"] == ["ST"]
    assert summary["chosen"]["trial"] in {p["trial"] for p in pareto}
    assert (small_study / "pareto.png").stat().st_size > 0
    assert not list(small_study.glob(".*.tmp"))


def test_exported_yaml_round_trips_into_run(small_study: Path, tmp_path: Path) -> None:
    exported = yaml.safe_load((small_study / "controller.yaml").read_text())
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pacectl.run",
            f"controller_file={small_study / 'controller.yaml'}",
            "trace=st",
            "output.plots=false",
            "output.report=false",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"none", "threshold"}
    params = {k: v for k, v in exported.items() if k != "name"}
    assert summary["controller_params"]["threshold"] == pytest.approx(params)
    chosen = json.loads((small_study / "tune.json").read_text())["chosen"]
    assert summary["runs"]["threshold"]["cv"] == pytest.approx(chosen["cv"], rel=1e-9)


def test_kill_and_resume_loses_no_finished_trial(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pacectl.tune", *FAST, "controller=pid", f"hydra.run.dir={out}"]
    proc = subprocess.Popen(
        [*cmd, "tune.n_trials=500"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("[")
        if seen >= 4:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    journal = str(out / "optuna.journal")
    before = {t.number: t.values for t in _trials(journal, "st-pid") if t.state.is_finished()}
    assert 4 <= len(before) < 500
    resumed = _tune(
        *FAST, "controller=pid", f"hydra.run.dir={out}", f"tune.n_trials={len(before) + 3}", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    after = _trials(journal, "st-pid")
    finished = {t.number: t.values for t in after if t.state == optuna.trial.TrialState.COMPLETE}
    assert {n: finished[n] for n in before} == before  # every finished trial kept, values unchanged
    assert len(finished) == len(before) + 3
    assert not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]  # a killed trial is FAIL


@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_two_workers_share_one_study(tmp_path: Path, storage: str) -> None:
    out = tmp_path / "run"
    location = (
        str(tmp_path / "shared.journal") if storage == "journal" else f"sqlite:///{tmp_path / 'shared.db'}"
    )
    proc = _tune(
        *FAST,
        "controller=threshold",
        "tune.n_trials=10",
        "tune.n_workers=2",
        f"tune.storage={location}",
        "tune.study_name=shared",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    trials = _trials(location, "shared")
    assert sorted(t.number for t in trials) == list(range(10))  # no duplicate, no lost trial
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2
    firsts = {}
    for t in trials:  # each worker's first draw is random, from its own seed
        firsts.setdefault(t.user_attrs["worker"], tuple(sorted(t.params.items())))
    assert len(set(firsts.values())) == 2


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"gian": {"type": "float", "low": 0.1, "high": 1.0}},
            "unknown key 'gian' for controller 'threshold'; did you mean 'gain'?",
        ),
        ({"gain": {"type": "float", "low": 0.9, "high": 0.1}}, "low must be <= high, got low=0.9, high=0.1"),
        (
            {"gain": {"type": "flaot", "low": 0.1, "high": 0.9}},
            "type must be one of ['float', 'int', 'categorical']",
        ),
        (
            {"on_threshold_s": {"type": "float", "low": 0.0, "high": 1.0, "log": True}},
            "low must be > 0 with log: true",
        ),
    ],
)
def test_bad_search_space_fails_before_any_trial(tmp_path: Path, space: dict[str, Any], message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    out = tmp_path / "run"
    proc = _tune(*FAST, "controller=threshold", f"tune.space={path}", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    for name in ("optuna.journal", "pareto.json", "controller.yaml", "pareto.png", "tune.json"):
        assert not (out / name).exists()


def test_nothing_to_tune_is_a_user_error(tmp_path: Path) -> None:
    proc = _tune(*FAST, "controller=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2 and "one family to tune" in proc.stderr and "Traceback" not in proc.stderr


def test_invalid_combinations_are_pruned_not_fatal(tmp_path: Path) -> None:
    """Without the fraction reparametrization some (on, off) pairs are invalid: those trials are
    PRUNED with the reason, the study goes on, and no torch is imported on the way."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "on_threshold_s: {type: float, low: 0.001, high: 0.01}\noff_threshold_s: {type: float, low: 0.0, high: 0.01}\n"
    )
    script = f"""
import sys
from hydra import compose, initialize_config_dir
from pacectl.config import CONF_DIR
from pacectl.tune import run_tuning
with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
    cfg = compose("tune", overrides={[*FAST, "controller=threshold", "tune.sampler=random", "tune.n_trials=12", f"tune.space={space}", "tune.progress=false"]!r})
res = run_tuning(cfg, __import__("pathlib").Path({str(tmp_path / "run")!r}), echo=lambda s: None)
print(res.summary["num_trials"]["pruned"], res.summary["num_trials"]["complete"], "torch" in sys.modules)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    pruned, complete, torch_loaded = proc.stdout.split()
    assert int(pruned) > 0 and int(complete) > 0 and int(pruned) + int(complete) == 12
    assert torch_loaded == "False"
    trials = _trials(str(tmp_path / "run" / "optuna.journal"), "st-threshold")
    assert all(
        "off_threshold_s must" in t.user_attrs["invalid_params"] for t in trials if t.state.name == "PRUNED"
    )


def test_fraction_of_resolves_to_a_valid_pair() -> None:
    space = parse_space(
        "threshold",
        {
            "controller.on_threshold_s": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
            "off_threshold_s": {"type": "float", "low": 0.0, "high": 1.0, "fraction_of": "on_threshold_s"},
        },
        fixed={"gain": 0.5, "on_threshold_s": 0.02, "off_threshold_s": 0.01},
        source="test",
    )
    params = space.resolve({"on_threshold_s": 0.4, "off_threshold_s/on_threshold_s": 0.25})
    assert params == {"gain": 0.5, "on_threshold_s": 0.4, "off_threshold_s": pytest.approx(0.1)}
    with pytest.raises(ConfigError, match="fraction_of must name another parameter"):
        parse_space(
            "threshold",
            {"gain": {"type": "float", "low": 0.1, "high": 1, "fraction_of": "x"}},
            fixed={},
            source="t",
        )


def test_pareto_and_choice_rule() -> None:
    assert pareto_mask([1.0, 2.0, 1.5, 2.0], [0.1, 0.2, 0.3, 0.2]) == [True, True, False, True]
    pts = [
        TrialPoint(0, {}, 1.00, 0.10, 0.000, True),
        TrialPoint(1, {}, 0.99, 0.05, 0.010, False),
        TrialPoint(2, {}, 0.998, 0.08, 0.002, True),
    ]
    front = pareto_front(pts)
    assert [p.number for p in front] == [0, 2]  # the infeasible trial is not on the front
    assert choose(front).number == 2  # lowest CV within the cap
    infeasible = [TrialPoint(0, {}, 0.9, 0.1, 0.1, False), TrialPoint(1, {}, 0.95, 0.2, 0.05, False)]
    assert choose(pareto_front(infeasible)).number == 1  # none meets the cap: highest throughput


def test_compose_tune_config_for_a_sim_profile() -> None:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=contended", "tune.sim.num_ranks=8"])
    assert (
        cfg.tune.sim.num_ranks == 8 and cfg.tune.sim.seeds == [0, 1, 2] and cfg.tune.sim.comm == "contention"
    )
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=generic"])
    assert cfg.tune.sim.num_ranks == 32  # defaults when a profile has no tune_sim section
    assert run_tuning is not None


# --- experiments/tuning/run_tuning.py --out ---------------------------------------------------------------


def test_run_tuning_experiment_writes_to_out(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "experiments" / "tuning" / "run_tuning.py"
    helped = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and "--out" in helped.stdout and "committed record" in helped.stdout
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--trials=2",
            "--workers=1",
            "--profiles",
            "st",
            "--families",
            "threshold",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["profiles"]["st"]["families"]) == ["threshold"]
    assert (out / "results.md").read_text().startswith("| profile")
