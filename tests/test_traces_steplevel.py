"""Step-level importer (Alibaba PAI mini-batch CSV): real file, mapping and bad inputs."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pacectl.backends.dag import compile_dag, estimate_intrinsic
from pacectl.data import DATA_DIR
from pacectl.errors import TraceError
from pacectl.traces.canonical import load_canonical, write_canonical
from pacectl.traces.model import TraceWarning
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
            r"batch_time_norm must be a finite number in \[0, .*row 3",
        ),
        (
            lambda d: d.assign(batch_time_norm=[1.0, -2, 2, 3]),
            "batch_time_norm must be a finite number in \\[0, ",
        ),
        # the last row cut short (a truncated copy): said so
        (
            lambda d: d.assign(batch_time_norm=[1.0, 2, 2, np.nan]),
            r"row 5.*It is the last row and has empty fields: the file looks truncated",
        ),
        # a negative value in the last row next to an empty field is not a truncation
        (
            lambda d: d.assign(batch_time_norm=[1.0, 2, 2, -3], gpu=[25, 25, 25, np.nan]),
            r"row 5\); 1 row is bad. Drop or repair it\.$",
        ),
        (
            lambda d: d.assign(batch_time_norm=[1.0, 1e30, 2, 3]),
            "batch_time_norm must be a finite number in \\[0, ",
        ),
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
    with pytest.warns(TraceWarning, match=r"dropped 1 of 3 steps \(1 row\): not recorded by all 2 workers"):
        trace = load_steplevel(_csv(tmp_path, d.reset_index(drop=True)))
    assert trace.steps.tolist() == [1, 11]


@pytest.fixture(scope="module")
def job1_frame() -> pd.DataFrame:
    """The shipped Alibaba job 1 as read, without the unnamed index column pandas wrote with it."""
    return pd.read_csv(JOB1, index_col=0)


def test_exact_duplicate_row_is_dropped_with_a_warning(tmp_path: Path, job1_frame: pd.DataFrame) -> None:
    # like the upstream job_2_norm.csv: one row repeated (its index column differs, the data does not)
    i = int(np.flatnonzero(((job1_frame["worker"] == 3) & (job1_frame["time"] == 1001)).to_numpy())[0])
    d = pd.concat([job1_frame.iloc[: i + 1], job1_frame.iloc[i : i + 1], job1_frame.iloc[i + 1 :]])
    match = rf"dropped 1 exact duplicate row \(same worker, gpu, time and batch_time_norm .*the first dropped: row {i + 3} \(worker 3, time 1001.*a copy of row {i + 2}\)"
    with pytest.warns(TraceWarning, match=match):
        trace = load_steplevel(_csv(tmp_path, d.reset_index(drop=True)))
    ref = load_steplevel(JOB1)
    assert len(trace.steps) == 300
    pd.testing.assert_frame_equal(trace.ops, ref.ops)


def test_conflicting_duplicate_is_an_error_naming_the_key(tmp_path: Path, job1_frame: pd.DataFrame) -> None:
    row = job1_frame[(job1_frame["worker"] == 3) & (job1_frame["time"] == 1001)].assign(batch_time_norm=1.0)
    d = pd.concat([job1_frame, row]).reset_index(drop=True)
    with pytest.raises(
        TraceError, match=r"got 2 rows with different values for worker 3 time 1001.*rows \["
    ) as err:
        load_steplevel(_csv(tmp_path, d))
    assert "Drop incomplete" not in str(err.value)


def test_a_missing_row_drops_its_step_with_a_warning(tmp_path: Path, job1_frame: pd.DataFrame) -> None:
    d = job1_frame[~((job1_frame["worker"] == 7) & (job1_frame["time"] == 2001))].reset_index(drop=True)
    with pytest.warns(TraceWarning) as caught:
        trace = load_steplevel(_csv(tmp_path, d))
    (w,) = [str(c.message) for c in caught if issubclass(c.category, TraceWarning)]
    assert "dropped 1 of 300 steps (9 rows): not recorded by all 10 workers: steps [2001]" in w
    assert len(trace.steps) == 299 and 2001 not in trace.steps


def test_complete_file_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        assert len(load_steplevel(JOB1).steps) == 300


def test_normalised_times_are_marked_and_survive_convert(tmp_path: Path, job1_frame: pd.DataFrame) -> None:
    trace = load_steplevel(JOB1, unit_s=0.002)
    assert trace.time_unit == "normalized" and trace.time_normalized and trace.norm_unit_s == 0.002
    fwd = trace.ops[trace.ops["optype"] == "forward-compute"].sort_values(["step", "rank"])
    assert np.allclose(
        fwd["duration"].to_numpy() / trace.norm_unit_s,
        job1_frame.sort_values(["time", "worker"])["batch_time_norm"],
    )
    write_canonical(trace, tmp_path / "t.parquet")
    back = load_canonical(tmp_path / "t.parquet")
    assert (back.time_unit, back.norm_unit_s) == ("normalized", 0.002)
    seconds = job1_frame.rename(columns={"batch_time_norm": "step_time_s"}).assign(
        step_time_s=lambda d: d["step_time_s"] / 1e3
    )
    real = load_steplevel(_csv(tmp_path, seconds))
    assert real.time_unit == "s" and not real.time_normalized and real.norm_unit_s == 1.0


@pytest.mark.parametrize(
    ("edit", "shown"),
    [
        (lambda d: d.assign(worker=[0, -5, 0, 1]), "got -5 "),
        (lambda d: d.assign(batch_time_norm=[1.0, np.nan, 2, 3]), "got an empty field "),
    ],
)
def test_values_in_messages_are_plain_python(tmp_path: Path, edit: object, shown: str) -> None:
    with pytest.raises(TraceError) as err:
        load_steplevel(_csv(tmp_path, edit(_base())))  # type: ignore[operator]
    assert shown in str(err.value) and "np." not in str(err.value)


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


def test_sampling_interval_of_the_shipped_alibaba_file_is_ten():
    """The Alibaba PAI series records every 10th iteration (time = 1, 11, 21, ...); its short last
    gap (2981 -> 2988, the job's end) is not an irregularity."""
    import warnings as _w

    from pacectl.data import DATA_DIR
    from pacectl.traces.steplevel import load_steplevel

    with _w.catch_warnings():
        _w.simplefilter("error")
        trace = load_steplevel(DATA_DIR / "alibaba-pai" / "job_1_norm.csv")
    assert trace.sample_every_iters == 10
    from pacectl.traces.model import TraceWarning

    with pytest.warns(TraceWarning, match="sampled every 5 iterations .as trace.sample_every says"):
        given = load_steplevel(DATA_DIR / "alibaba-pai" / "job_1_norm.csv", sample_every=5)
    assert given.sample_every_iters == 5


def test_irregular_sampling_is_warned_with_its_rows(tmp_path):
    import pytest as _pytest

    from pacectl.errors import TraceError
    from pacectl.traces.model import TraceWarning
    from pacectl.traces.steplevel import load_steplevel

    path = tmp_path / "job.csv"
    times = [0, 10, 20, 25, 35, 45]
    lines = ["worker,time,batch_time_norm"] + [f"{w},{t},{100 + w + t}" for t in times for w in (0, 1)]
    path.write_text("\n".join(lines) + "\n")
    with _pytest.warns(
        TraceWarning, match=r"sampled every 10 iterations .* 1 of 5 gaps differ: 20 -> 25 \(rows 6-9\)"
    ):
        trace = load_steplevel(path)
    assert trace.sample_every_iters == 10
    with _pytest.raises(TraceError, match=r"sample_every \(trace.sample_every\) must be an integer >= 1"):
        load_steplevel(path, sample_every=0)


def test_a_huge_header_is_refused_with_a_short_message(tmp_path: Path) -> None:
    # a new user's 200 MB file printed an 839 MB error line (the whole header, echoed)
    p = tmp_path / "wide.csv"
    p.write_text(",".join(f"column_{i:07d}_" + "x" * 50 for i in range(10_000)) + "\n1,2,3\n")
    with pytest.raises(TraceError, match="must have columns worker") as err:
        load_steplevel(p)
    assert len(str(err.value)) < 1_000 and "more)" in str(err.value)
    p.write_text("x" * (3 << 20))  # one line, no newline, past the header cap
    with pytest.raises(TraceError, match="header line must be at most") as err:
        load_steplevel(p)
    assert len(str(err.value)) < 1_000


def test_a_long_bad_field_is_quoted_as_an_excerpt(tmp_path: Path) -> None:
    d = _base().astype({"batch_time_norm": object})
    d.loc[2, "batch_time_norm"] = "y" * 100_000
    with pytest.raises(
        TraceError,
        match=r"batch_time_norm must be a finite number in \[0, .*got 'yyyy.*more characters.*row 4",
    ) as err:
        load_steplevel(_csv(tmp_path, d))
    assert len(str(err.value)) < 1_000


def test_size_and_row_caps(tmp_path: Path) -> None:
    p = _csv(tmp_path, _base())
    with pytest.raises(TraceError, match=r"must be <= 10 bytes.*Raise the cap \(trace.max_mb\) if"):
        load_steplevel(p, max_bytes=10)
    with pytest.raises(
        TraceError, match=r"must hold <= 2 rows, got at least 4 .*trace.max_ops: now 4 ops, 2 per row"
    ):
        load_steplevel(p, max_ops=4)
    assert len(load_steplevel(p, max_ops=8).steps) == 2


def test_rows_with_the_wrong_number_of_fields(tmp_path: Path) -> None:
    p = _csv(tmp_path, _base())
    text = p.read_text()
    p.write_text(text.rstrip("\n").rsplit(",", 2)[0] + "\n")  # the last row cut mid-way
    with pytest.raises(
        TraceError, match=r"got 3 in row 5.*; 1 row is like that, the last: the file looks trunc"
    ):
        load_steplevel(p)
    p.write_text(text.replace("1,1,25,1,410.0", "1,1,25,1,410.0,7,7"))
    with pytest.raises(
        TraceError, match=r"every row must have 5 fields.*got 7 in row 3.*1 row is bad\. Drop or"
    ):
        load_steplevel(p)
    p.write_text(text.replace("1,1,25,1,410.0", "1,1,25,1,410.0,7,7").rstrip("\n").rsplit(",", 2)[0] + "\n")
    with pytest.raises(TraceError, match=r"got 7 in row 3 .*; 2 rows are bad\. Drop or repair them\.$"):
        load_steplevel(p)


def test_the_config_caps_reach_the_importer(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from pacectl.config import load_trace
    from pacectl.errors import ConfigError

    cfg = OmegaConf.create({"format": "steplevel", "path": str(_csv(tmp_path, _base())), "max_ops": 2})
    with pytest.raises(TraceError, match="must hold <= 1 rows"):
        load_trace(cfg)
    cfg.max_ops = "many"
    with pytest.raises(ConfigError, match="trace.max_ops must be an integer >= 1, got .many."):
        load_trace(cfg)


def test_a_row_that_is_not_utf8_is_a_bad_row_without_noise(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # found by the fuzz campaign: pyarrow printed "Exception ignored ... Traceback" for such a row
    p = _csv(tmp_path, _base())
    p.write_bytes(p.read_bytes().replace(b"1,1,25,1,410.0", b"1,1,\xff\xfe,1"))
    with pytest.raises(TraceError, match=r"could not parse it.*Row #3: Expected 5 columns, got 4"):
        load_steplevel(p)
    assert "Traceback" not in capfd.readouterr().err


def test_a_nan_written_in_the_last_row_is_a_bad_value_not_a_cut_off_row(tmp_path: Path) -> None:
    # Arrow's default null spellings ("nan", "NA", ...) read a written NaN as an empty field: in the
    # last row that said "the file looks truncated"; only an empty field is missing now
    p = tmp_path / "job.csv"
    p.write_text("worker,time,batch_time_norm\n0,1,1.0\n1,1,1.0\n0,2,1.0\n1,2,nan\n")
    with pytest.raises(TraceError, match=r"got nan \(in .*:row 5\); 1 row is bad\. Drop or repair it\.$"):
        load_steplevel(p)
    p.write_text("worker,time,batch_time_norm\n0,1,1.0\n1,1,NA\n0,2,1.0\n1,2,1.0\n")
    with pytest.raises(TraceError, match=r"got 'NA' \(in .*:row 3\)"):
        load_steplevel(p)
    p.write_text("worker,time,batch_time_norm\n0,1,1.0\n1,1,\n0,2,1.0\n1,2,1.0\n")  # empty: said so
    with pytest.raises(TraceError, match=r"got an empty field \(in .*:row 3\); 1 row is bad"):
        load_steplevel(p)
    p.write_text("worker,time,batch_time_norm\n0,1,1.0\n1,1,1.0\n0,2,1.0\n1,2,\n")  # cut off: still said
    with pytest.raises(TraceError, match="It is the last row and has empty fields: the file looks truncated"):
        load_steplevel(p)
