"""Sweeps through Hydra launchers: every job's outputs are those of the same job run alone.

``-m hydra/launcher=joblib`` runs a sweep's jobs in parallel processes on one machine
(hydra-joblib-launcher); ``hydra/launcher=submitit_local`` runs them through submitit as on a SLURM
cluster (``submitit_slurm``, documented in experiments/README.md), here on this machine. Skipped
without the plugins (``pip install -e ".[launchers]"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ["backend=sim", "backend.num_ranks=8", "backend.num_iterations=200", "output.plots=false"]
CONTROLLERS = ("threshold", "pid")

pytestmark = pytest.mark.slow


def _have(plugin: str) -> bool:
    """Whether Hydra's launcher plugin ``plugin`` is installed (find_spec raises, not returns None,
    when no plugin at all has made the ``hydra_plugins`` namespace)."""
    try:
        return importlib.util.find_spec(f"hydra_plugins.{plugin}") is not None
    except ModuleNotFoundError:
        return False


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pacectl.run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _outputs(folder: Path) -> dict[str, object]:
    """What a job wrote, less its wall time (the only figure that depends on the machine's load)."""
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("wall_time_s", None)
    return {
        "summary.json": summary,
        "iterations.parquet": (folder / "iterations.parquet").read_bytes(),
        "report.md": (folder / "report.md").read_text(),
    }


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    root = tmp_path_factory.mktemp("alone")
    for c in CONTROLLERS:
        _run(*JOB, f"controller={c}", f"hydra.run.dir={root / c}", cwd=root)
    return {c: _outputs(root / c) for c in CONTROLLERS}


def _job_dirs(sweep: Path) -> dict[str, Path]:
    """``{controller: job folder}`` of a sweep, read from each job's own overrides."""
    from pacectl.cli import job_overrides

    found = {}
    for job in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()):
        overrides = job_overrides(job)
        found[next(c for c in CONTROLLERS if f"controller={c}" in overrides)] = job
    return found


@pytest.mark.skipif(
    not _have("hydra_joblib_launcher"),
    reason='hydra-joblib-launcher is not installed (pip install -e ".[launchers]")',
)
def test_joblib_sweep_jobs_match_the_same_jobs_run_alone(tmp_path: Path, alone: dict) -> None:
    sweep = tmp_path / "sweep"
    _run(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        *JOB,
        f"controller={','.join(CONTROLLERS)}",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    jobs = _job_dirs(sweep)
    assert sorted(jobs) == sorted(CONTROLLERS)
    for c, folder in jobs.items():
        assert _outputs(folder) == alone[c], c


@pytest.mark.skipif(
    not _have("hydra_submitit_launcher"),
    reason='hydra-submitit-launcher is not installed (pip install -e ".[launchers]")',
)
def test_submitit_local_job_matches_the_same_job_run_alone(tmp_path: Path, alone: dict) -> None:
    sweep = tmp_path / "sweep"
    _run(
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        *JOB,
        "controller=threshold",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    jobs = _job_dirs(sweep)
    assert list(jobs) == ["threshold"]
    assert _outputs(jobs["threshold"]) == alone["threshold"]


@pytest.mark.skipif(
    not _have("hydra_joblib_launcher"),
    reason='hydra-joblib-launcher is not installed (pip install -e ".[launchers]")',
)
def test_a_study_cell_through_a_launcher_is_the_in_process_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scaling and staleness studies' cells (pacectl.studies) run as sweep jobs through a launcher
    from hydra import initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.studies import launched_cells, sim_cell

    kwargs = {"cluster": "paper_like", "iterations": 60, "seeds": 2}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        here = {n: sim_cell(["comm=contention"], num_ranks=n, **kwargs) for n in (4, 8)}
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    launched = launched_cells(
        ["comm=contention"],
        scales=(4, 8),
        launcher="joblib",
        launcher_overrides=["hydra.launcher.n_jobs=2"],
        sweep_dir=tmp_path / "sweep",
        **kwargs,
    )
    assert launched == here


def _script(path: str):
    """An experiment script as a module (its functions; ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_under_test", ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    not _have("hydra_joblib_launcher"),
    reason='hydra-joblib-launcher is not installed (pip install -e ".[launchers]")',
)
def test_a_staleness_cell_through_a_launcher_is_the_in_process_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every schedule x seed of one scenario as sweep jobs; the paired intervals between runs of
    # different jobs come from their iterations.parquet
    from hydra import initialize_config_dir

    from pacectl.config import CONF_DIR

    study = _script("experiments/staleness/run_study.py")
    args = ("paper_like", 8, ["comm=contention"], 40, 2)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        here = study.scenario_rows("p", "paper_like", 8, study.scenario_runs(*args), 2)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    runs = study.launched_scenario_runs(
        *args, launcher="joblib", launcher_overrides=["hydra.launcher.n_jobs=2"], sweep_dir=tmp_path
    )
    assert sorted(runs) == sorted((lag, every, s) for lag, every in study.SCHEDULES for s in range(2))
    launched = study.scenario_rows("p", "paper_like", 8, runs, 2)
    assert len(launched) == len(study.SCHEDULES) * len(runs[(1, 1, 0)]) > 0
    assert launched == here


@pytest.mark.skipif(
    not _have("hydra_joblib_launcher"),
    reason='hydra-joblib-launcher is not installed (pip install -e ".[launchers]")',
)
def test_a_tuning_cell_through_a_launcher_is_the_in_process_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one pacectl.tune job per family; the held-out judgement runs here on each job's tune.json
    study = _script("experiments/tuning/run_tuning.py")
    kwargs = {"families": ["threshold", "pid"]}
    here = study.run(["st"], 3, 1, tmp_path / "here", **kwargs)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    launched = study.run(
        ["st"], 3, 1, tmp_path / "launched", launcher="joblib",
        launcher_overrides=["hydra.launcher.n_jobs=2"], **kwargs,
    )  # fmt: skip
    for result in (here, launched):
        for family in result["profiles"]["st"]["families"].values():
            assert family.pop("wall_s") > 0  # the only figure that depends on the machine's load
    assert list(launched["profiles"]["st"]["families"]) == ["threshold", "pid"]
    assert launched == here
