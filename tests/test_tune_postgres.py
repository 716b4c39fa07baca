"""Tuning on a real PostgreSQL server (``tune.storage=postgresql://...``, extra ``.[rdb]``).

A server is started for this module on loopback, as its own user, in a temporary data folder on a
free port, and stopped at the end (:mod:`pacectl.testing.postgres`); without PostgreSQL or psycopg2
the module is skipped with the reason. These are the parts of the many-machines recipe (one server,
N hosts running the same command) that one machine can run: N commands here are N processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from pacectl.testing.postgres import missing, postgres_server
from pacectl.tuning.storage import StorageSpec

FAST = ["cluster=st", "tune.population_size=4"]
ROOT = Path(__file__).resolve().parents[1]
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pacectl.tune", *FAST, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=StorageSpec("rdb", url).open())
    return study.get_trials(deepcopy=False)


def test_two_commands_on_one_study_reach_exactly_n_trials(pg_url: str, tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            _cmd(
                "controller=threshold",
                "tune.n_trials=8",
                f"tune.storage={pg_url}",
                "tune.study_name=shared-two",
                f"hydra.run.dir={tmp_path / f'host{i}'}",
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    trials = _trials(pg_url, "shared-two")
    finished = [t for t in trials if t.state in FINISHED]
    assert len(finished) == 8  # exactly tune.n_trials between them, not 8 each
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    surplus = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs.get("surplus") for t in surplus)  # a FAIL here is only an unevaluated extra
    assert (tmp_path / "host0" / "tune.json").is_file() and (tmp_path / "host1" / "tune.json").is_file()


def test_kill_9_mid_trial_leaves_that_trial_fail_and_loses_nothing(pg_url: str, tmp_path: Path) -> None:
    name = "killed"
    cmd = _cmd("controller=pid", f"tune.storage={pg_url}", f"tune.study_name={name}")
    storage = StorageSpec("rdb", pg_url).open()
    stranded: list[int] = []
    for attempt in range(4):  # a kill can land between two trials (rarely): then run and kill again
        proc = subprocess.Popen(
            [*cmd, "tune.n_trials=100000", f"hydra.run.dir={tmp_path / f'a{attempt}'}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_env(),
        )
        assert proc.stdout is not None
        seen = 0
        for line in proc.stdout:
            seen += line.startswith("[")
            if seen >= 3:
                break
        study = optuna.load_study(study_name=name, storage=storage)
        for _ in range(400):  # kill it while a trial is running (not between two)
            if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        stranded = sorted(
            t.number for t in _trials(pg_url, name) if t.state == optuna.trial.TrialState.RUNNING
        )
        if stranded:
            break
    assert stranded, "no trial was running when the command was killed, in 4 tries"
    before = {t.number: t.values for t in _trials(pg_url, name) if t.state in FINISHED}
    resumed = subprocess.run(
        [*cmd, f"tune.n_trials={len(before) + 2}", f"hydra.run.dir={tmp_path / 'b'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"marked {len(stranded)} trial(s) left running by a killed process as FAIL: {stranded}"
        in resumed.stdout
    )
    after = _trials(pg_url, name)
    assert sorted(t.number for t in after if t.state == optuna.trial.TrialState.FAIL) == stranded
    finished = {t.number: t.values for t in after if t.state in FINISHED}
    assert {n: finished[n] for n in before} == before  # nothing else lost, values unchanged
    assert len(finished) == len(before) + 2
    # a resume with other settings is refused, as on the journal, and changes nothing
    other = subprocess.run(
        [
            *cmd,
            f"tune.n_trials={len(finished) + 2}",
            "guard.max_delay_frac=0.3",
            f"hydra.run.dir={tmp_path / 'c'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert other.returncode == 2, other.stdout
    assert (
        "was run with other settings" in other.stderr
        and "guard.max_delay_frac: 0.5 in the study, 0.3" in other.stderr
    )
    assert "Traceback" not in other.stderr
    assert len([t for t in _trials(pg_url, name) if t.state in FINISHED]) == len(finished)
