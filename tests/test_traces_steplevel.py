"""Step-level importer (Alibaba PAI mini-batch CSV): real file, mapping and bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pacectl.backends.dag import compile_dag, estimate_intrinsic
from pacectl.data import DATA_DIR
from pacectl.errors import TraceError
from pacectl.traces.steplevel import load_steplevel

JOB1 = DATA_DIR / "alibaba-pai" / "job_1_norm.csv"


def test_alibaba_job1_shape_and_cv() -> None:
    trace = load_steplevel(JOB1)
    assert (trace.meta.dp_size, trace.meta.pp_size) == (10, 1)
    assert len(trace.steps) == 300
    fwd = trace.ops[trace.ops["optype"] == "forward-compute"]
    t = fwd.pivot(index="step", columns="dp_rank", values="duration").to_numpy()
    cv = t.std(axis=1) / t.mean(axis=1)
    assert abs(float(cv.mean()) - 0.058) < 0.002  # shared/traces/README.md: job1 mean CV 0.058


def test_collective_leaves_together_and_replays_exactly() -> None:
    trace = load_steplevel(JOB1, collective_s=0.005)
    rs = trace.ops[trace.ops["optype"] == "grads-reduce-scatter"]
    end = rs["start_ts"] + rs["duration"]
    assert end.groupby(rs["step"]).agg(lambda e: e.max() - e.min()).max() < 1e-12
    start_max = rs.groupby("step")["start_ts"].max()
    assert np.allclose(end.groupby(rs["step"]).max() - start_max, 0.005)
    _, _, counts = estimate_intrinsic(compile_dag(trace))
    assert counts["launch_clipped"] == 0 and counts["transfer_clipped"] == 0


def test_default_collective_is_one_percent_of_median_step() -> None:
    trace = load_steplevel(JOB1)
    step = trace.recorded_step_time_s()
    fwd = trace.ops[trace.ops["optype"] == "forward-compute"]
    c = step - fwd.groupby("step")["duration"].max()
    assert np.allclose(c, 0.01 * np.median(fwd.groupby("step")["duration"].max()))


def _csv(tmp_path: Path, df: pd.DataFrame) -> Path:
    p = tmp_path / "job.csv"
    df.to_csv(p)
    return p


def _base() -> pd.DataFrame:
    return pd.DataFrame(
        {"worker": [0, 1, 0, 1], "gpu": 25, "time": [1, 1, 11, 11], "batch_time_norm": [400.0, 410, 420, 390]}
    )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.drop(columns="worker"), "must have columns worker"),
        (
            lambda d: d.assign(batch_time_norm=[1.0, np.nan, 2, 3]),
            r"batch_time_norm must be a finite time.*row 3",
        ),
        (lambda d: d.assign(batch_time_norm=[1.0, -2, 2, 3]), "batch_time_norm must be a finite time"),
        (lambda d: d.assign(batch_time_norm=[1.0, 1e30, 2, 3]), "batch_time_norm must be a finite time"),
        (lambda d: d.assign(time=[1, 1, 1, 11]), r"each \(worker, time\) must appear once"),
        (lambda d: d.assign(worker=[0, "x", 0, 1]), "worker must be a non-negative integer"),
        (lambda d: d.assign(time=[1, 2, 3, 4]), "recorded by all 2 workers"),
    ],
)
def test_bad_inputs(tmp_path: Path, edit: object, match: str) -> None:
    with pytest.raises(TraceError, match=match):
        load_steplevel(_csv(tmp_path, edit(_base())))  # type: ignore[operator]


def test_incomplete_steps_are_dropped(tmp_path: Path) -> None:
    d = pd.concat(
        [_base(), pd.DataFrame({"worker": [0], "gpu": 25, "time": [21], "batch_time_norm": [500.0]})]
    )
    trace = load_steplevel(_csv(tmp_path, d.reset_index(drop=True)))
    assert trace.steps.tolist() == [1, 11]


def test_not_csv_and_wide_cv_file(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_bytes(b'\x00\xff\x00garbage\n"unterminated')
    with pytest.raises(TraceError):
        load_steplevel(p)
    wide = pd.DataFrame(np.random.default_rng(0).random((3, 4)))
    with pytest.raises(TraceError, match="must have columns worker"):
        load_steplevel(_csv(tmp_path, wide))
    with pytest.raises(TraceError, match="existing file"):
        load_steplevel(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="collective_frac"):
        load_steplevel(JOB1, collective_frac=2.0)
