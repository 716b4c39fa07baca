"""Defects a hostile pass (a new user's bad inputs and faults) found, each kept fixed here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pacectl.cli import no_room_error

ROOT = Path(__file__).resolve().parents[1]


def test_a_full_file_system_is_refused_before_hydra_writes(tmp_path: Path) -> None:
    # a disk already full when the run starts ended in Hydra's OSError traceback
    assert no_room_error(tmp_path / "run") is None
    message = no_room_error(tmp_path / "a" / "b", min_free_bytes=1 << 62)
    assert message is not None and "must have room to write" in message and str(tmp_path) in message


@pytest.mark.parametrize("module", ["pacectl.run", "pacectl.tune", "pacectl.traces"])
def test_help_into_a_closed_pipe_prints_no_traceback(module: str) -> None:
    # `python -m pacectl.run --help | head` printed a BrokenPipeError traceback, then exited 1 with no
    # message where pacectl.traces exited 0: a reader that stops reading is not an error, in all three
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away before the first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_a_trace_whose_durations_are_all_zero_is_refused_at_validation(tmp_path: Path) -> None:
    # passed validation, then crashed the what-if with ZeroDivisionError (or 2,182 warnings)
    import pandas as pd

    from pacectl.errors import TraceError
    from pacectl.traces.steplevel import load_steplevel

    p = tmp_path / "zero.csv"
    pd.DataFrame({"worker": [0, 1, 0, 1], "time": [1, 1, 11, 11], "batch_time_norm": 0.0}).to_csv(p)
    with pytest.raises(
        TraceError, match=r"duration must be > 0 for at least one op, got 0 for all 8 ops"
    ) as err:
        load_steplevel(p)
    assert "\n" not in str(err.value)


def test_a_decision_lag_past_the_run_is_refused(tmp_path: Path) -> None:
    # exchange.lag_iters at or past the run length was accepted silently (a no-pacing run in disguise)
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.errors import ConfigError
    from pacectl.experiment import SimExperiment

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "backend=sim",
                "backend.num_ranks=4",
                "backend.num_iterations=20",
                "exchange.lag_iters=20",
            ],
        )
    exp = SimExperiment(cfg)
    with pytest.raises(ConfigError, match=r"exchange.lag_iters must be < the run's 20 iterations, got 20"):
        exp.exchange  # noqa: B018


def test_spread_plot_axis_reaches_the_widest_run(tmp_path: Path) -> None:
    # spread.png froze its shared y-axis at the no-pacing panel's maximum, hiding a paced run that
    # widened the spread (threshold's p99 reached 0.97 s, the axis stopped at 0.82 s)
    import numpy as np

    from pacectl import report
    from pacectl.testing.episodes import make_episode

    base = np.tile([0.0, 0.1, 0.2, 0.8], (20, 1))
    wide = base.copy()
    wide[10, 3] = 0.97
    fig = report.plot_spread(
        tmp_path / "s.png", {"none": make_episode(base), "threshold": make_episode(wide)}
    )
    tops = [ax.get_ylim()[1] for ax in fig.axes if ax.get_ylabel()]
    assert all(t >= 0.97 for t in tops), tops


def test_info_names_the_sequence_parallel_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # info omitted the DSP size, so a DP 32 x PP 2 job of world size 128 looked broken
    from dataclasses import replace

    from pacectl.data import shipped_trace
    from pacectl.traces.__main__ import main
    from pacectl.traces.bytedance import load_bytedance
    from pacectl.traces.canonical import write_canonical

    trace = load_bytedance(*shipped_trace("ST"))
    meta = replace(trace.meta, dsp_size=2, world_size=trace.meta.world_size * 2)
    path = tmp_path / "dsp.parquet"
    write_canonical(type(trace)(ops=trace.ops, meta=meta, source=trace.source, fmt=trace.fmt), path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"of world_size {meta.world_size} recorded" in out and "x tp 1 x dsp 2)" in out, out


def test_a_second_run_into_a_busy_run_folder_is_refused(tmp_path: Path) -> None:
    # two runs into one hydra.run.dir both reported success with mixed provenance
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from pacectl.cli import lock_run_dir; "
         f"assert lock_run_dir(Path({str(run_dir)!r})) is None; print('locked', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        proc = subprocess.run(
            [sys.executable, "-m", "pacectl.run", "trace=st", "controller=none", f"hydra.run.dir={run_dir}"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "must not be in use by another run" in proc.stderr and "Traceback" not in proc.stderr
        assert not (run_dir / "summary.json").exists()
    finally:
        holder.communicate("\n", timeout=30)


def test_tune_refuses_a_one_rank_trace(tmp_path: Path) -> None:
    # a one-worker input produced a full result folder and a what-if of "S = 0.999"; tune refuses it
    # as it refuses a one-rank simulation
    import pandas as pd

    p = tmp_path / "one.csv"
    pd.DataFrame({"worker": 0, "time": [1, 11, 21, 31], "batch_time_norm": [400.0, 410, 420, 390]}).to_csv(p)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pacectl.tune", f"trace={p}", "controller=threshold", "tune.n_trials=2",
         f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "must have >= 2 ranks per pacing domain" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_parquet_traces_are_capped_before_they_are_read(tmp_path: Path) -> None:
    # every importer has a stated bound: Parquet rows are read from the footer before any data
    from pacectl.data import shipped_trace
    from pacectl.errors import TraceError
    from pacectl.traces.bytedance import load_bytedance
    from pacectl.traces.canonical import load_canonical, write_canonical

    path, meta = shipped_trace("ST")
    trace = load_bytedance(path, meta)
    with pytest.raises(TraceError, match=r"must hold <= 10 ops \(rows\), got \d+ .*trace.max_ops"):
        load_bytedance(path, meta, max_ops=10)
    out = tmp_path / "st.parquet"
    write_canonical(trace, out)
    with pytest.raises(TraceError, match=r"must be <= 100 bytes.*trace.max_mb"):
        load_canonical(out, max_bytes=100)
    assert len(load_canonical(out).ops) == len(trace.ops)
