"""``python -m pacectl.tune``: end to end, kill and resume, shared storage, export, bad search spaces."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.config import CONF_DIR
from pacectl.errors import ConfigError
from pacectl.testing.commands import run_command
from pacectl.tuning.scenarios import Evaluation
from pacectl.tuning.settings import settings_diff
from pacectl.tuning.space import load_space, parse_space
from pacectl.tuning.storage import StorageSpec
from pacectl.tuning.verdict import (
    ImprovementRule,
    TrialPoint,
    beats_no_pacing,
    choose,
    dominates,
    pareto_front,
    pareto_mask,
)

FAST = ["cluster=st", "tune.population_size=4"]


def _tune(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m pacectl.tune ARGS`` in ``cwd``: in this process (:func:`run_command`), or with
    worker processes (``tune.n_workers`` > 1, whose lines go to the command's own stdout) in a new one."""
    from pacectl.tune import main

    if any(a.startswith("tune.n_workers=") and a != "tune.n_workers=1" for a in args):
        command = [sys.executable, "-m", "pacectl.tune", *args]
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return run_command(main, args, cwd=cwd)


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
    keys = [json.dumps(item["params"], sort_keys=True) for item in pareto]
    assert len(set(keys)) == len(keys)  # each parameter set once (repeats listed in duplicate_trials)
    summary = json.loads((small_study / "tune.json").read_text())
    assert summary["num_trials"]["complete"] == 6
    assert (
        summary["min_cv_gain_frac"] == 0.01 and "at least 0.01 (1.00%) lower" in summary["improvement_rule"]
    )
    assert summary["comm_model"] == "null" and summary["scenarios"]["labels"] == ["ST"]
    assert summary["chosen"]["trial"] in {p["trial"] for p in pareto}
    assert (small_study / "pareto.png").stat().st_size > 0
    assert not list(small_study.glob(".*.tmp"))


def test_exported_yaml_round_trips_into_run(small_study: Path, tmp_path: Path) -> None:
    exported = yaml.safe_load((small_study / "controller.yaml").read_text())
    out = tmp_path / "run"
    from pacectl.run import main

    args = [f"controller_file={small_study / 'controller.yaml'}", "trace=st", "output.plots=false"]
    proc = run_command(main, [*args, "output.report=false", f"hydra.run.dir={out}"], cwd=tmp_path)
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _start_endless_tune(
    tmp_path: Path, out: Path, workers: int, *, trials_seen: int
) -> subprocess.Popen[str]:
    """Start an endless tuning job in its own process group (a terminal's job); return once it has
    printed ``trials_seen`` progress lines. Its stdout is left open; stderr is piped."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pacectl.tune",
            *FAST,
            "controller=pid",
            "tune.n_trials=100000",
            f"tune.n_workers={workers}",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("[")
        if seen >= trials_seen:
            break
    return proc


def test_killed_command_takes_its_workers_and_any_resume_fails_their_trials(tmp_path: Path) -> None:
    """kill -KILL of the command (not its process group) with 2 workers: the workers die with it (no
    orphan goes on adding trials), and a resume with no trial left to run still marks their stranded
    trials FAIL before writing its outputs."""
    out = tmp_path / "run"
    proc = _start_endless_tune(tmp_path, out, 2, trials_seen=6)
    journal = str(out / "optuna.journal")
    study = optuna.load_study(study_name="st-pid", storage=StorageSpec("journal", journal).open())
    workers = [int(k.rpartition(":")[2]) for k in study.user_attrs if k.startswith("worker:")]
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)  # the command only, as `kill -KILL <pid>`
    proc.wait(timeout=30)
    try:
        for _ in range(100):
            if not any(_alive(w) for w in workers):
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert not any(_alive(w) for w in workers), "a worker outlived the killed command"
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    trials = _trials(journal, "st-pid")
    stranded = sorted(t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING)
    finished = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    if not stranded:  # ~0.2 %: both workers were between trials (~4 % of a worker's time each)
        pytest.skip("both workers were killed between trials, so no trial was stranded to check")
    resumed = _tune(*FAST, "controller=pid", "tune.n_trials=2", f"hydra.run.dir={out}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"marked {len(stranded)} trial(s) left running by a killed process as FAIL: {stranded}"
        in resumed.stdout
    )
    assert f"{finished} finished trial(s), 0 to run" in resumed.stdout
    after = _trials(journal, "st-pid")
    assert not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]
    assert sorted(t.number for t in after if t.state == optuna.trial.TrialState.FAIL) == stranded
    assert (out / "tune.json").is_file()


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
    counts = [int(m.group(1)) for m in re.finditer(r"^\[(\d+)/10\] trial", proc.stdout, re.M)]
    assert counts == list(range(1, 11))  # one line per trial, counting up by one across both workers
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
        (  # the space's range is at fault, not an override: the file, the key and the bound
            {"gain": {"type": "float", "low": 0, "high": 5}},
            "space.yaml: gain: the threshold controller rejects high=5 and the middle 2.5 of its range "
            "[0, 5] (gain must be in (0, 1], got 2.5); set gain's low and high in",
        ),
        ({"gain": {"low": 0, "high": 1}}, "gain.type must be set, one of ['float', 'int', 'categorical']"),
        (
            "gain: {type: float, low: 0, high: 5\non: [\n",
            "must be valid YAML: expected ',' or '}', but got ':' at line 2",
        ),
    ],
)
def test_bad_search_space_fails_before_any_trial(
    tmp_path: Path, space: dict[str, Any] | str, message: str
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(space if isinstance(space, str) else yaml.safe_dump(space))
    out = tmp_path / "run"
    proc = _tune(*FAST, "controller=threshold", f"tune.space={path}", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "override" not in proc.stderr
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
from pacectl.tuning.study import run_tuning
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
    # a trial that improves on no pacing is preferred to a lower CV that does not (noise-sized)
    assert choose(front, improving=[0]).number == 0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.9, 1.0, 1.1]), st.sampled_from([0.1, 0.2, 0.3])), min_size=1, max_size=8
    )
)
def test_the_front_is_the_points_nothing_dominates(objectives: list[tuple[float, float]]) -> None:
    """pareto_mask and dominates are one relation (tuning/verdict.py writes it once)."""
    points = [TrialPoint(i, {}, thr, cv, 0.0, True) for i, (thr, cv) in enumerate(objectives)]
    mask = pareto_mask([p.throughput_it_per_s for p in points], [p.cv for p in points])
    assert mask == [not any(dominates(q, p) for q in points) for p in points]


def test_pareto_front_lists_a_repeated_point_once() -> None:
    """NSGA-II may draw the same parameters again: the front keeps the first trial and lists the others."""
    same = {"gain": 0.5, "on_threshold_s": 0.1}
    pts = [
        TrialPoint(3, same, 1.0, 0.10, 0.0, True),
        TrialPoint(1, same, 1.0, 0.10, 0.0, True),
        TrialPoint(7, same, 1.0, 0.10, 0.0, True),
        # the same figures with other parameters: another point
        TrialPoint(2, {"gain": 0.2, "on_threshold_s": 0.1}, 1.0, 0.10, 0.0, True),
        TrialPoint(4, {"gain": 0.9, "on_threshold_s": 0.1}, 0.99, 0.05, 0.01, True),
    ]
    front = pareto_front(pts)
    assert [(p.number, p.duplicates) for p in front] == [(1, (3, 7)), (2, ()), (4, ())]
    assert front[0].to_json()["duplicate_trials"] == [3, 7]


def test_compose_tune_config_for_a_sim_profile() -> None:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=contended", "tune.sim.num_ranks=8"])
    assert (
        cfg.tune.sim.num_ranks == 8 and cfg.tune.sim.seeds == [0, 1, 2] and cfg.tune.sim.comm == "contention"
    )
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=dgx_superpod"])
    assert cfg.tune.sim.num_ranks == 32  # defaults when a profile has no tune_sim section


def test_a_study_never_resumes_on_a_changed_trace_file(tmp_path: Path) -> None:
    """Same path, other content (a record written again): the resume is refused, naming the
    content digest, instead of mixing trials of two traces in one front."""
    from pacectl.data import shipped_trace
    from pacectl.traces.bytedance import load_bytedance
    from pacectl.traces.canonical import write_canonical

    trace = load_bytedance(*shipped_trace("ST"))
    path = tmp_path / "rec.parquet"
    write_canonical(trace, path)
    out = tmp_path / "run"
    args = ("tune.population_size=4", "controller=threshold", f"trace={path}", f"hydra.run.dir={out}")
    first = _tune(*args, "tune.n_trials=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    summary = json.loads((out / "tune.json").read_text())
    assert summary["run_overrides"].startswith(f"trace=canonical trace.path={path}")  # absolute
    # the trace is what was tuned on, not the default profile (it recorded "profile": "ar")
    assert summary["profile"] is None and summary["trace"] and summary["fabric_profile"] == "ar"
    moved = tmp_path / "moved" / "rec.parquet"  # the same content elsewhere (a new checkout): resumes
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    same = _tune(
        "tune.population_size=4",
        "controller=threshold",
        f"trace={moved}",
        f"hydra.run.dir={out}",
        "tune.n_trials=3",
        cwd=tmp_path,
    )
    assert same.returncode == 0 and "2 finished trial(s), 1 to run" in same.stdout, same.stderr
    ops = trace.ops.copy()
    ops["duration"] *= 1.01
    write_canonical(type(trace)(ops=ops, meta=trace.meta, source=trace.source, fmt=trace.fmt), path)
    again = _tune(*args, "tune.n_trials=4", cwd=tmp_path)
    assert again.returncode == 2 and "ops_sha256" in again.stderr, again.stderr


def test_a_trace_on_the_command_line_is_what_the_study_tunes_on() -> None:
    """``pacectl.tune trace=...`` replaces the profile's traces (it was once ignored silently)."""
    from pacectl.tuning.scenarios import build_scenarios

    overrides = ["cluster=ar", "trace=st"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=overrides)
    own = build_scenarios(cfg)  # no override given: the profile's own trace
    assert own.labels == ["AR"] and own.default_study_name == "ar" and not own.trace_from_command_line
    given = build_scenarios(cfg, overrides=overrides)
    assert given.labels == ["ST"] and given.default_study_name == "ST" and given.trace_from_command_line
    assert given.descriptor["traces"][0]["name"] == "ST" and given.descriptor["profile"] == "ar"
    assert given.fingerprint != own.fingerprint  # a study resumed on another trace is refused
    assert given.experiments[0].trace.meta.world_size == 8  # ST's 8 ranks, not AR's 64
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=contended", "trace=st", "tune.on=sim"])
    with pytest.raises(ConfigError, match=r"tune.on=sim simulates a cluster and replays no trace"):
        build_scenarios(cfg, overrides=["trace=st"])
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=["cluster=contended", "trace=st"])
    on_sim_profile = build_scenarios(cfg, overrides=["trace=st"])  # auto: the trace makes it a replay
    assert on_sim_profile.kind == "traces" and on_sim_profile.labels == ["ST"]


def test_a_modelled_decision_lag_is_part_of_the_study() -> None:
    """``exchange.*`` changes every episode: it is in the descriptor (another fingerprint, so no
    resume across it), reaches the episodes, and the "use it" overrides carry it. Absent by default,
    so studies from before it still resume."""
    from pacectl.tuning.outputs import run_overrides
    from pacectl.tuning.scenarios import build_scenarios

    base = ["cluster=contended", "tune.sim.num_iterations=30", "tune.sim.seeds=[0]"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        default = build_scenarios(compose("tune", overrides=base))
        lagged = build_scenarios(compose("tune", overrides=[*base, "exchange.lag_iters=2"]))
    assert "exchange" not in default.descriptor
    assert lagged.descriptor["exchange"] == {"lag_iters": 2, "every_iters": 1}
    assert lagged.fingerprint != default.fingerprint
    assert lagged.experiments[0].exchange.lag == 2
    overrides, _ = run_overrides(lagged.descriptor)
    assert "exchange.lag_iters=2" in overrides.split()
    assert "exchange" not in run_overrides(default.descriptor)[0]
    # a refused resume names the values, although a default lag is absent from the descriptor
    from pacectl.tuning.settings import exchange_shown

    diffs = settings_diff(
        exchange_shown({"episodes": lagged.descriptor}), exchange_shown({"episodes": default.descriptor})
    )
    assert diffs == ["episodes: exchange.lag_iters: 2 in the study, 1 in this command"]


# --- resume only with the same trial settings -------------------------------------------------------


def _copy_study(study_dir: Path, dest: Path) -> Path:
    """A fresh run dir holding a copy of ``study_dir``'s journal (the module's study stays as it is)."""
    dest.mkdir(parents=True)
    shutil.copy(study_dir / "optuna.journal", dest / "optuna.journal")
    return dest


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["controller.units=iteration"], "controller.units: 's' in the study, 'iteration' in this command"),
        (
            ["tune.space={gain_only}", "controller.on_threshold_s=5"],
            "controller.on_threshold_s: tuned (in the search space) in the study, 5.0 in this command",
        ),
        (["tune.space={wider_gain}"], "search space key gain.low: 0.05 in the study, 0.01 in this command"),
        (
            ["guard.max_delay_frac=0.3"],
            "episodes: guard.max_delay_frac: 0.5 in the study, 0.3 in this command",
        ),
        (["guard.max_delay_s=2.0"], "episodes: guard.max_delay_s: null in the study, 2.0 in this command"),
        (  # the fabric the contention model adds is named by its keys, not dumped
            ["comm=contention"],
            "episodes: comm: 'null' in the study, 'contention' in this command; episodes: cluster: not set "
            "in the study, set (",
        ),
    ],
)
def test_resume_with_other_trial_settings_is_refused(
    small_study: Path, tmp_path: Path, overrides: list[str], expected: str
) -> None:
    """A study resumes only with what determines a trial's result; anything else is refused before
    any trial, naming the setting (old and new), and the study and its outputs are left untouched."""
    gain_only = tmp_path / "gain_only.yaml"
    gain_only.write_text("gain: {type: float, low: 0.05, high: 1.0}\n")
    wider = tmp_path / "wider.yaml"
    wider.write_text(
        (CONF_DIR / "tune" / "space" / "threshold.yaml").read_text().replace("low: 0.05", "low: 0.01")
    )
    out = _copy_study(small_study, tmp_path / "run")
    journal = str(out / "optuna.journal")
    before = [(t.number, t.state, t.values) for t in _trials(journal, "st-threshold")]
    args = [a.format(gain_only=gain_only, wider_gain=wider) for a in overrides]
    proc = _tune(
        *FAST, "controller=threshold", "tune.n_trials=8", *args, f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout
    assert expected in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning")]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr  # warnings may precede it
    assert "another tune.study_name" in proc.stderr
    assert (
        "the study has" not in proc.stderr and "'algorithm'" not in proc.stderr and "None" not in proc.stderr
    )
    assert [(t.number, t.state, t.values) for t in _trials(journal, "st-threshold")] == before
    assert not (out / "controller.yaml").exists()


def test_resume_accepts_settings_that_do_not_change_a_trial(small_study: Path, tmp_path: Path) -> None:
    """Trial count, cap, sampler seed and an explicit default value (units=s) may change on resume."""
    out = _copy_study(small_study, tmp_path / "run")
    proc = _tune(
        *FAST,
        "controller=threshold",
        "controller.units=s",
        "tune.n_trials=7",
        "tune.seed=5",
        "tune.max_throughput_loss_frac=0.01",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 finished trial(s), 1 to run" in proc.stdout
    assert json.loads((out / "tune.json").read_text())["num_trials"]["complete"] == 7


def test_settings_diff_names_each_difference() -> None:
    old = {
        "controller": {"name": "threshold", "units": "s", "gain": 0.5},
        "space": {"on_threshold_s": {"type": "float", "low": 0.001, "high": 10.0, "log": True}},
        "episodes": {"guard": {"max_delay_frac": 0.5}, "seeds": [0, 1, 2]},
    }
    new = {
        "controller": {"name": "threshold", "units": "iteration"},
        "space": {
            "on_threshold_s": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
            "gain": {"type": "float", "low": 0.1, "high": 1.0},
        },
        "episodes": {"guard": {"max_delay_frac": 0.5}, "seeds": [0, 1]},
    }
    assert settings_diff(old, new) == [
        "controller.gain: 0.5 in the study, tuned (in the search space) in this command",
        "controller.units: 's' in the study, 'iteration' in this command",
        "episodes: seeds: [0, 1, 2] in the study, [0, 1] in this command",
        "search space key gain: not tuned in the study, {type: 'float', low: 0.1, high: 1.0} in this command",
        "search space key on_threshold_s.high: 10.0 in the study, 1.0 in this command",
    ]
    assert settings_diff(old, old) == []
    fabric = {"topology": {"kind": "fat_tree"}, "collective": {"algorithm": "ring"}}
    assert settings_diff(
        {"episodes": {"comm": "null", "guard": {"max_delay_s": None}}},
        {"episodes": {"comm": "contention", "cluster": fabric, "guard": {"max_delay_s": 2.0}}},
    ) == [  # values first, then a mapping present on one side only, by its keys
        "episodes: comm: 'null' in the study, 'contention' in this command",
        "episodes: guard.max_delay_s: null in the study, 2.0 in this command",
        "episodes: cluster: not set in the study, set (2 keys: collective, topology) in this command",
    ]


# --- Ctrl-C and bad overrides -------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_reports_once_keeps_the_study_and_resumes(tmp_path: Path, workers: int) -> None:
    """SIGINT to the process group (the terminal's Ctrl-C): one line on stderr, exit 130, no outputs,
    the journal kept with no trial left RUNNING, and the printed command resumes the study."""
    out = tmp_path / "run"
    proc = _start_endless_tune(tmp_path, out, workers, trials_seen=3)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("pacectl.tune: interrupted; the study's ")
    assert f"kept in {out / 'optuna.journal'}" in stderr
    for name in ("pareto.json", "pareto.png", "controller.yaml", "tune.json"):
        assert not (out / name).exists()
    trials = _trials(str(out / "optuna.journal"), "st-pid")
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    finished = [t for t in trials if t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL]
    assert len(finished) >= 3
    assert f"the study's {len(finished)} finished trial(s)" in stderr
    command = shlex.split(stderr.split("resume with the same command: ", 1)[1])
    assert command[:3] == ["python", "-m", "pacectl.tune"] and f"hydra.run.dir={out}" in command
    command = [c.replace("tune.n_trials=100000", f"tune.n_trials={len(finished) + 2}") for c in command]
    resumed = subprocess.run(
        [sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(finished)} finished trial(s), 2 to run" in resumed.stdout
    assert (out / "controller.yaml").is_file()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "+tune.bogus=1",
            [
                "tune has unknown key(s) ['bogus']",
                "'max_throughput_loss_frac', 'min_cv_gain_frac',",
                "Remove tune.bogus (set to 1)",
            ],
        ),
        ("+tune.sim.num_rank=8", ["tune.sim.num_rank: no such key", "did you mean tune.sim.num_ranks?"]),
        ("+guard.foo=1", ["guard", "foo", "max_delay_frac"]),
        ("+foo=1", ["top-level keys must be among", "'tune'", "foo"]),
        ("controller.smoothing=0.9", ["controller.smoothing=0.9 sets a key the search space", "tune.space"]),
        (
            "tune.space={iteration_bad}",
            ["on_threshold_s must have high <= 1.0 with controller.units=iteration"],
        ),
        ("tune.progress=maybe", ["tune.progress must be true or false", "got 'maybe'"]),
        ("tune.min_cv_gain_frac=1.5", ["tune.min_cv_gain_frac must be in [0, 1)", "got 1.5"]),
        ("tune.sim.seeds=[a]", ["tune.sim.seeds must be a list of integers", "got 'a'"]),
        (
            "controller.units=hours",
            ["controller.units must be one of ['s', 'iteration'], got 'hours'", "controller.units=s"],
        ),
        ("tune.space={directory}", ["must be a YAML file, got a directory", "tune.space=<file.yaml>"]),
    ],
)
def test_bad_overrides_stop_before_the_storage(tmp_path: Path, override: str, expected: list[str]) -> None:
    """Unknown keys (tune.*, guard.*, top level) and a seconds-sized space in iteration units: one
    line, exit 2, before any storage exists."""
    bad = tmp_path / "space.yaml"  # a space in seconds, used with iteration units
    bad.write_text("on_threshold_s: {type: float, low: 0.001, high: 10.0, log: true}\n")
    extra = ["controller.units=iteration"] if "iteration_bad" in override else []
    out = tmp_path / "run"
    proc = _tune(
        *FAST,
        "controller=threshold",
        *extra,
        override.format(iteration_bad=bad, directory=tmp_path),
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not list(tmp_path.glob("**/optuna.journal*"))
    assert not out.exists()  # the run dir Hydra made is removed


# --- no improvement over no pacing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thr", "cv", "base_cv", "cap", "expected"),
    [
        (1.001, 0.20, 0.20, 0.005, False),  # +0.1 % throughput, same CV: under the 0.5 % throughput gain
        (1.006, 0.20, 0.20, 0.005, True),  # +0.6 % throughput, same CV
        (1.006, 0.2001, 0.20, 0.005, False),  # more throughput but a higher CV
        (0.996, 0.19, 0.20, 0.005, True),  # CV 5 % lower within the cap
        (0.996, 0.198, 0.20, 0.005, True),  # CV exactly 1 % lower: the threshold counts
        (0.996, 0.1985, 0.20, 0.005, False),  # CV 0.75 % lower: noise
        (0.990, 0.19, 0.20, 0.005, False),  # lower CV, over the cap
        (0.990, 0.19, 0.20, None, True),  # lower CV, no cap
        (1.000, 0.20, 0.20, 0.005, False),  # the same on both
        (0.99659, 0.17, 0.1698, 0.005, False),  # -0.341 %, CV 0.17 vs 0.1698
        (1.000 + 1e-12, 0.20, 0.20, 0.005, False),  # float noise is a tie
        # the reported ST case: CV 0.0228676 vs 0.0228712 (-0.016 %) at -0.005 % throughput
        (0.99995, 0.0228676, 0.0228712, 0.005, False),
        (1.00001, 0.0228676, 0.0228712, 0.005, False),  # and a noise-sized gain on both
    ],
)
def test_beats_no_pacing(thr: float, cv: float, base_cv: float, cap: float | None, expected: bool) -> None:
    point = TrialPoint(0, {}, thr, cv, 1.0 - thr, cap is None or 1.0 - thr <= cap)
    rule = ImprovementRule(min_cv_gain_frac=0.01, min_throughput_gain_frac=0.005, cap=cap)
    assert beats_no_pacing(point, Evaluation(1.0, base_cv), rule) is expected


def test_min_cv_gain_frac_sets_the_threshold() -> None:
    point = TrialPoint(0, {}, 0.99995, 0.0228676, 0.00005, True)  # CV 0.016 % lower
    base = Evaluation(1.0, 0.0228712)
    assert not beats_no_pacing(point, base, ImprovementRule(0.001, 0.005, 0.005))
    assert beats_no_pacing(point, base, ImprovementRule(0.0001, 0.005, 0.005))
    assert beats_no_pacing(point, base, ImprovementRule(0.0, 0.005, 0.005))  # any strictly lower CV


@pytest.mark.parametrize(
    ("profile", "min_gain", "recommended"),
    [
        # ST's paper-threshold reference has a CV 0.33 % below no pacing's: not an improvement at 1 %
        ("st", "0.01", "no pacing (controller=none)"),
        # at 0.1 % it would be, but a replay has fixed durations: its lower CV comes only from
        # lengthening fast iterations, which is never counted as an improvement
        ("st", "0.001", "no pacing (controller=none)"),
        # on a timing-dependent profile (interference) the reference does improve, and no trial does
        ("contended", "0.001", "the paper's threshold controller at its defaults (controller=threshold)"),
    ],
)
def test_no_improvement_is_flagged_everywhere(
    tmp_path: Path, profile: str, min_gain: str, recommended: str
) -> None:
    """Thresholds far above every arrival spread never pace: every trial equals no pacing, so the
    console, tune.json and controller.yaml say so and recommend no pacing, or the paper's threshold at
    its defaults when that meets the rule on a timing-dependent model; the export still loads."""
    space = tmp_path / "space.yaml"
    space.write_text("on_threshold_s: {type: float, low: 50.0, high: 100.0}\n")
    out = tmp_path / "run"
    proc = _tune(
        f"cluster={profile}",
        "tune.population_size=4",
        "controller=threshold",
        "tune.n_trials=3",
        f"tune.space={space}",
        f"tune.min_cv_gain_frac={min_gain}",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: no trial improves on no pacing (3 completed" in proc.stderr
    summary = json.loads((out / "tune.json").read_text())
    assert summary["improves_on_no_pacing"] is False and summary["trials_improving_on_no_pacing"] == 0
    assert summary["trials_lowering_cv_by_lengthening_only"] == 0  # no trial paces at all
    assert summary["min_cv_gain_frac"] == float(min_gain)
    assert f"at least {float(min_gain):.3g}" in summary["improvement_rule"]
    assert summary["recommendation"] == recommended
    assert summary["chosen"]["cv"] == summary["baseline_none"]["cv"]
    assert summary["comm_model_timing_dependent"] is (profile == "contended")
    text = (out / "controller.yaml").read_text()
    assert "# WARNING: no trial improves on no pacing" in text and f"recommended: {recommended}" in text
    lengthening = profile == "st" and min_gain == "0.001"
    assert summary["reference_lowers_cv_by_lengthening_only"] is lengthening
    assert ("only by lengthening the fast iterations" in proc.stderr) is lengthening
    if recommended.startswith("no pacing"):
        assert "Recommended: no pacing" in proc.stderr
        assert summary["reference_improves_on_no_pacing"] is False
        assert summary["recommendation_command"] == "python -m pacectl.run controller=none trace=st"
    else:
        assert "The paper's threshold controller at its defaults does" in proc.stderr
        assert summary["reference_improves_on_no_pacing"] is True
        assert summary["recommendation_command"].startswith("python -m pacectl.run controller=threshold ")
        assert summary["recommendation_command"] in proc.stderr
    exported = yaml.safe_load(text)
    assert exported["name"] == "threshold" and 50.0 <= exported["on_threshold_s"] <= 100.0


def test_a_choice_the_reference_beats_on_both_objectives_is_not_recommended(tmp_path: Path) -> None:
    """A weak space (gain 0.30-0.32, the reference's 0.5) on contended: the choice improves on no
    pacing, but the paper's threshold at its defaults has more throughput and a lower CV, so that is
    the recommendation, with a warning on the console and in controller.yaml."""
    space = tmp_path / "space.yaml"
    space.write_text("gain: {type: float, low: 0.30, high: 0.32}\n")
    out = tmp_path / "run"
    proc = _tune(
        "cluster=contended",
        "controller=threshold",
        "tune.n_trials=2",
        f"tune.space={space}",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "tune.json").read_text())
    chosen, reference = summary["chosen"], summary["reference_threshold"]
    assert summary["improves_on_no_pacing"] is True
    assert reference["throughput_it_per_s"] > chosen["throughput_it_per_s"] and reference["cv"] < chosen["cv"]
    assert summary["reference_dominates_chosen"] is True and summary["chosen_dominates_reference"] is False
    assert summary["recommendation"].startswith("the paper's threshold controller")
    assert summary["recommendation_command"].startswith("python -m pacectl.run controller=threshold ")
    assert "warning: the paper's threshold controller at its defaults beats the chosen trial" in proc.stderr
    assert (
        "# WARNING: the paper's threshold controller at its defaults beats this trial"
        in (out / "controller.yaml").read_text()
    )


def test_a_lower_cv_from_lengthening_iterations_is_not_an_improvement(tmp_path: Path) -> None:
    """A replay has fixed durations: pacing can lower the CV only by lengthening fast iterations.
    Trials that do meet the CV rule are counted as such, and no pacing stays the recommendation."""
    space = tmp_path / "space.yaml"
    space.write_text("on_threshold_s: {type: float, low: 0.001, high: 0.02}\n")
    out = tmp_path / "run"
    proc = _tune(
        *FAST,
        "controller=threshold",
        "tune.n_trials=4",
        f"tune.space={space}",
        "tune.min_cv_gain_frac=0.0001",
        "tune.max_throughput_loss_frac=null",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "tune.json").read_text())
    assert summary["comm_model_timing_dependent"] is False
    lowered = summary["trials_lowering_cv_by_lengthening_only"]
    assert lowered >= 1 and summary["trials_improving_on_no_pacing"] == 0
    assert summary["chosen"]["cv"] < summary["baseline_none"]["cv"]  # lower CV ...
    assert summary["chosen"]["throughput_it_per_s"] <= summary["baseline_none"]["throughput_it_per_s"]
    assert summary["improves_on_no_pacing"] is False  # ... but not an improvement
    assert summary["recommendation"] == "no pacing (controller=none)"
    assert f"{lowered} trial(s)" in proc.stderr and "only by lengthening the fast iterations" in proc.stderr


def test_sim_settings_on_a_trace_profile_are_reported_as_ignored(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _tune(
        *FAST,
        "controller=threshold",
        "tune.n_trials=1",
        "tune.sim.num_ranks=16",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: tune.sim")]
    assert len(warnings) == 1, proc.stderr
    assert "tune.sim.num_ranks=16 is ignored: this study replays recorded traces (ST)" in warnings[0]
    assert json.loads((out / "tune.json").read_text())["scenarios"]["kind"] == "traces"


# --- the "use it" hint reruns the tuned episode ---------------------------------------------------------


def test_hint_reruns_the_tuned_sim_episode(tmp_path: Path) -> None:
    """The printed pacectl.run command (sim profile) runs the first tuned seed with the tuned ranks,
    iterations, comm model and guard, so it reproduces the chosen trial's figures on that seed exactly;
    the line under it says the tuned figures are a mean over the seeds."""
    out = tmp_path / "tune"
    proc = _tune(
        "cluster=contended",
        "controller=threshold",
        "tune.population_size=4",
        "tune.n_trials=2",
        "tune.sim.num_ranks=8",
        "tune.sim.num_iterations=30",
        "tune.sim.seeds=[3,4]",
        "guard.max_delay_frac=0.4",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # "use it:" when the chosen trial is the recommendation, else "the chosen trial (not recommended):"
    hint = next(line for line in proc.stdout.splitlines() if "controller_file=" in line)
    command = shlex.split(hint.partition(":  ")[2])
    assert {"backend.num_iterations=30", "backend.num_ranks=8", "seed=3", "guard.max_delay_frac=0.4"} <= set(
        command
    )
    assert "this runs seed=3 only" in proc.stdout
    run_dir = tmp_path / "run"
    ran = subprocess.run(
        [
            sys.executable,
            *command[1:],
            "output.plots=false",
            "output.report=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    runs = json.loads((run_dir / "summary.json").read_text())["runs"]
    summary = json.loads((out / "tune.json").read_text())
    tuned, base = summary["chosen"]["per_episode"][0], summary["baseline_none"]["per_episode"][0]
    assert tuned["label"] == "seed=3"
    assert runs["threshold"]["throughput_it_per_s"] == pytest.approx(tuned["throughput_it_per_s"], rel=1e-12)
    assert runs["threshold"]["cv"] == pytest.approx(tuned["cv"], rel=1e-12)
    assert runs["none"]["cv"] == pytest.approx(base["cv"], rel=1e-12)


# --- iteration units -------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["threshold", "pid", "ewma", "quantile", "forecast"])
def test_iteration_units_get_an_iteration_space(family: str) -> None:
    """controller.units=iteration picks conf/tune/space/<family>.iteration.yaml: no time bound above
    one iteration (1.0); every shipped space parses with its own unit."""
    from pacectl.tuning.settings import Settings, tune_space

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("tune", overrides=[f"controller={family}", "controller.units=iteration"])
    space = tune_space(cfg, Settings.from_cfg(cfg.tune))
    assert space.source.endswith(f"{family}.iteration.yaml")
    times = [d for d in space.dimensions if d.key.endswith("_s") and not d.fraction_of]
    assert times and all(float(d.high or 0) <= 1.0 for d in times)
    seconds_file = CONF_DIR / "tune" / "space" / f"{family}.yaml"
    assert load_space(family, seconds_file, fixed={"units": "s"}).keys == space.keys
    if family != "quantile":  # the seconds spaces reach 10 s; quantile's stops at 1 s, valid in both units
        with pytest.raises(ConfigError, match="high <= 1.0 with controller.units=iteration"):
            load_space(family, seconds_file, fixed={"units": "iteration"})


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
    assert "improves_on_no_pacing" in results["profiles"]["st"]["families"]["threshold"]["tune_set"]
    assert (out / "results.md").read_text().startswith("| profile")


def test_run_tuning_experiment_tunes_and_judges_at_the_lag_given(tmp_path: Path) -> None:
    """--exchange-lag reaches tuning and the held-out episodes alike (the paper's controller judged
    at lag 2 is not the one judged at lag 1), and the table says so."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "tuning" / "run_tuning.py"
    results = {}
    for lag in (1, 2):
        out = tmp_path / f"lag{lag}"
        proc = subprocess.run(
            [
                sys.executable,
                str(script),
                "--trials=2",
                "--profiles",
                "alibaba_pai",
                "--families",
                "threshold",
            ]
            + ["--exchange-lag", str(lag), "--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        results[lag] = json.loads((out / "results.json").read_text())
        assert results[lag]["exchange_lag_iters"] == lag
    paper = [
        results[lag]["profiles"]["alibaba_pai"]["heldout_paper_threshold"]["throughput_it_per_s"]
        for lag in (1, 2)
    ]
    assert paper[0] != paper[1]
    assert (tmp_path / "lag2" / "results.md").read_text().startswith("Decision lag 2 iterations")
    assert (tmp_path / "lag1" / "results.md").read_text().startswith("| profile")
    bad = subprocess.run(
        [sys.executable, str(script), "--exchange-lag", "0", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--exchange-lag must be an integer >= 1" in bad.stderr


def test_study_without_recorded_settings_is_refused(tmp_path: Path) -> None:
    """A study made by an older pacectl.tune (no trial settings recorded) cannot be checked, so it is
    refused rather than mixed with new trials."""
    out = tmp_path / "run"
    out.mkdir()
    journal = out / "optuna.journal"
    study = optuna.create_study(
        study_name="st-threshold",
        storage=StorageSpec("journal", str(journal)).open(),
        directions=["maximize", "minimize"],
    )
    study.set_user_attr("scenario_fingerprint", "0123456789abcdef")
    study.add_trial(optuna.trial.create_trial(values=[1.0, 0.1]))
    proc = _tune(*FAST, "controller=threshold", "tune.n_trials=3", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2 and "made by an older pacectl.tune" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert len(_trials(str(journal), "st-threshold")) == 1


def test_study_from_an_older_pacectl_recording_fewer_settings_is_refused_with_a_way_out(
    tmp_path: Path,
) -> None:
    """A study whose recorded settings are this command's minus some (an older pacectl.tune recorded
    fewer: the profile's defaults such as cluster.cross_traffic.stagger) is refused in one line that
    says why and names the new study to start, and it keeps its trials."""
    from pacectl.tuning.settings import SETTINGS_ATTR

    out = tmp_path / "run"
    args = [*FAST, "controller=threshold", f"hydra.run.dir={out}"]
    assert _tune(*args, "tune.n_trials=1", cwd=tmp_path).returncode == 0
    journal = str(out / "optuna.journal")
    study = optuna.load_study(study_name="st-threshold", storage=StorageSpec("journal", journal).open())
    older = study.user_attrs[SETTINGS_ATTR]
    older["episodes"] = {k: v for k, v in older["episodes"].items() if k != "guard"}
    study.set_user_attr(SETTINGS_ATTR, older)
    proc = _tune(*args, "tune.n_trials=2", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, (
        proc.stderr
    )
    assert "cannot resume: it was made by an older pacectl.tune" in proc.stderr
    assert (
        "(episodes: guard)" in proc.stderr
        and "Start a new study: tune.study_name=st-threshold-2" in proc.stderr
    )
    assert len(_trials(journal, "st-threshold")) == 1


def test_run_dir_at_a_file_is_one_error_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = _tune(f"hydra.run.dir={afile / 'sub'}", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"pacectl.tune: error: hydra.run.dir must be a folder (new or existing), but {afile} is a file; "
        "pick another path"
    )


def test_ctrl_c_while_a_worker_is_being_reaped_still_exits_as_an_interrupt(monkeypatch) -> None:
    """The race seen in CI: SIGINT lands just as join() reaps a worker, so multiprocessing still
    thinks it alive and os.kill finds no such process. That must stay a KeyboardInterrupt (exit 130),
    not become a ProcessLookupError traceback."""
    import multiprocessing as mp

    from pacectl.tuning import workers

    class ReapedWorker:
        pid = 2**22 + 12345  # no such process

        def __init__(self, *args, **kwargs) -> None:
            self.joins = 0

        def start(self) -> None:
            pass

        def join(self, timeout=None) -> None:
            self.joins += 1
            if self.joins == 1:
                raise KeyboardInterrupt  # the interrupt arrives inside the first join

        def is_alive(self) -> bool:
            return self.joins == 1  # reaped, but its exit code not recorded yet

        def terminate(self) -> None:
            pass

    class Ctx:
        Process = ReapedWorker

    def no_such_process(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(mp, "get_context", lambda method: Ctx())
    monkeypatch.setattr(workers.os, "kill", no_such_process)
    with pytest.raises(KeyboardInterrupt):
        workers.run_workers(2, [1, 1], [0, 1])


def test_a_storage_that_is_no_journal_is_a_config_error(tmp_path: Path) -> None:
    from pacectl.tuning.storage import storage_spec

    (tmp_path / "folder").mkdir()
    for value, message in (
        ("folder", "must be a journal file, got a folder"),
        ("missing/sub/x.journal", "does not exist; create it first"),
    ):  # a file that is no journal fails when the study is opened, with its own message
        with pytest.raises(ConfigError, match=message):
            storage_spec(value, tmp_path, cwd=tmp_path).open()
    assert not (tmp_path / "missing").exists()
    if Path("/proc/self").is_dir():  # a folder nobody can create files in, root included
        with pytest.raises(ConfigError, match="cannot create or open the journal there"):
            storage_spec("/proc/pacectl-test.journal", tmp_path).open()
    with pytest.raises(ConfigError, match="reachable RDB URL") as err:  # SQLAlchemy's error, one line
        storage_spec(f"sqlite:///{tmp_path}/no/such/dir/x.db", tmp_path).open()
    assert "\n" not in str(err.value) and "Background on this error" not in str(err.value)


def test_trace_names_in_cluster_traces_are_refused_cleanly(tmp_path: Path) -> None:
    proc = _tune(*FAST, "controller=threshold", "tune.n_trials=1", "cluster.traces=[ar,st]", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cluster.traces[0] must be a trace like {format: bytedance" in proc.stderr
    assert "got 'ar'" in proc.stderr


def test_a_json_lines_file_that_is_no_journal_is_refused_cleanly(tmp_path: Path) -> None:
    (tmp_path / "other.jsonl").write_text('{"x": 1}\n')
    proc = _tune(*FAST, "controller=threshold", "tune.n_trials=1", "tune.storage=other.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot be opened: not an Optuna journal (KeyError" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.jsonl"]  # no outputs/ left behind


def test_a_second_study_into_the_same_folder_says_it_replaces_the_first_ones_outputs(tmp_path: Path) -> None:
    out = tmp_path / "study"
    first = _tune(*FAST, "controller=threshold", "tune.n_trials=2", f"hydra.run.dir={out}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "holds the outputs" not in first.stderr
    again = _tune(*FAST, "controller=threshold", "tune.n_trials=3", f"hydra.run.dir={out}", cwd=tmp_path)
    assert again.returncode == 0 and "holds the outputs" not in again.stderr  # a resume: same study
    other = _tune(*FAST, "controller=ewma", "tune.n_trials=2", f"hydra.run.dir={out}", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert f"warning: {out} holds the outputs of study 'st-threshold': this study ('st-ewma') replaces" in (
        other.stderr
    )
    assert json.loads((out / "tune.json").read_text())["study_name"] == "st-ewma"


def test_two_commands_sharing_a_study_stop_at_its_total(tmp_path: Path) -> None:
    """tune.n_trials is the study's total also when two commands (machines) run it at the same time:
    each would otherwise run its own quota of the trials missing when it started."""
    import optuna

    n = 30
    args = [
        sys.executable,
        "-m",
        "pacectl.tune",
        *FAST,
        "controller=pid",
        f"tune.n_trials={n}",
        "tune.storage=shared.journal",
        "tune.study_name=shared",
    ]
    procs = [
        subprocess.Popen(
            [*args, f"hydra.run.dir=out{i}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        counts += [int(k) for k in re.findall(rf"^\[(\d+)/{n}\] trial", out, flags=re.MULTILINE)]
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "shared.journal"))
    )
    trials = optuna.load_study(study_name="shared", storage=storage).get_trials(deepcopy=False)
    finished = [
        t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    ]
    # Without the shared stop: up to 2 n. With it: n, or n + 1 when both commands ask for a new trial
    # in the same instant (a check-then-create race the stop cannot close).
    assert n <= len(finished) <= n + 1, [t.state for t in trials]
    # the [k/N] counter counts the other command's trials too: the study's last trial shows its total
    assert max(counts) == len(finished), counts


def test_front_size_names_the_exact_ties_with_no_pacing() -> None:
    from types import SimpleNamespace

    from pacectl.tuning.outputs import _ties_note
    from pacectl.tuning.scenarios import Evaluation

    base = Evaluation(throughput_it_per_s=1.0, cv=0.02)
    tie = SimpleNamespace(throughput_it_per_s=1.0, cv=0.02)
    other = SimpleNamespace(throughput_it_per_s=1.01, cv=0.03)
    assert _ties_note(SimpleNamespace(baseline=base, front=[tie, tie, other])) == (
        " (2 of them tie exactly with no pacing)"
    )
    assert _ties_note(SimpleNamespace(baseline=base, front=[tie, other])) == ""  # one tie: no pacing itself


def test_outputs_say_when_trials_still_run_elsewhere(tmp_path: Path) -> None:
    """A command that ends while another (a live process) still runs a trial of the shared study
    writes its outputs from the finished trials and says which are missing."""
    from pacectl.tuning.workers import owner_tag

    args = [*FAST, "controller=threshold", "tune.n_trials=2", "tune.storage=s.journal", "tune.study_name=s"]
    assert _tune(*args, "hydra.run.dir=a", cwd=tmp_path).returncode == 0
    study = optuna.load_study(
        study_name="s", storage=StorageSpec("journal", str(tmp_path / "s.journal")).open()
    )
    trial = study.ask()  # another command's trial in flight: owned by this (live) test process
    trial.set_user_attr("worker", owner_tag())
    proc = _tune(*args, "hydra.run.dir=b", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"trial(s) [{trial.number}] still running in other commands" in proc.stdout
    num = json.loads((tmp_path / "b" / "tune.json").read_text())["num_trials"]
    assert num["running"] == 1 and num["complete"] + num["pruned"] == 2


@pytest.mark.parametrize("override", ["tune.sim.num_ranks=1", "tune.sim.num_iterations=1"])
def test_a_sim_scenario_with_nothing_to_tune_is_refused(tmp_path: Path, override: str) -> None:
    """One rank has no arrival spread and one iteration no CV: refused before any trial."""
    out = tmp_path / "run"
    proc = _tune("cluster=contended", "controller=threshold", override, f"hydra.run.dir={out}", cwd=tmp_path)
    assert (
        proc.returncode == 2 and f"{override.partition('=')[0]} must be an integer >= 2, got 1" in proc.stderr
    )
    assert not out.exists()


def test_settings_diff_names_the_objectives_a_command_gives_and_not_the_power_they_imply() -> None:
    """Dropping the energy objective on resume: one line naming the default this command keeps (it
    records no objectives), not '{}', and no line for the power profile that only energy records."""
    study = {"episodes": {"comm": "null", "power": "h100_sxm"}, "objectives": ["throughput", "cv", "energy"]}
    command = {"episodes": {"comm": "null"}}
    assert settings_diff(study, command) == [
        "tune.objectives: ['throughput', 'cv', 'energy'] in the study, [throughput, cv] (the default) in this command"
    ]
    other = {"episodes": {"comm": "null", "power": "a100_sxm"}, "objectives": ["throughput", "energy"]}
    assert settings_diff(study, other) == [  # both tune energy: a changed profile is a difference
        "episodes: power: 'h100_sxm' in the study, 'a100_sxm' in this command",
        "tune.objectives: ['throughput', 'cv', 'energy'] in the study, ['throughput', 'energy'] in this command",
    ]
