"""The ByteDance importer: loads the shipped traces and rejects every kind of bad input clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pacectl.data import shipped_trace
from pacectl.errors import TraceError
from pacectl.traces.bytedance import load_bytedance, load_meta
from pacectl.traces.model import TraceWarning, validate_ops

ST_PARQUET, ST_META = shipped_trace("ST")


@pytest.fixture(scope="module")
def st_frame() -> pd.DataFrame:
    return pd.read_parquet(ST_PARQUET)


def _write(df: pd.DataFrame, tmp_path: Path) -> Path:
    path = tmp_path / "trace.parquet"
    df.to_parquet(path)
    return path


@pytest.mark.parametrize("name,world,steps,ops", [("ST", 8, 32, 6784), ("AR", 64, 44, 117216)])
def test_shipped_traces_load(name: str, world: int, steps: int, ops: int) -> None:
    trace = load_bytedance(*shipped_trace(name))
    assert trace.meta.world_size == world
    assert len(trace.steps) == steps
    assert len(trace.ops) == ops
    assert trace.ops["start_ts"].groupby(trace.ops["step"]).min().eq(0).all()


def test_missing_columns(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    path = _write(st_frame.drop(columns=["duration", "seq_id"]), tmp_path)
    with pytest.raises(TraceError, match=r"missing \['seq_id', 'duration'\].*trace.parquet"):
        load_bytedance(path, ST_META)


@pytest.mark.parametrize("value", [np.nan, -0.5, np.inf])
def test_bad_duration(st_frame: pd.DataFrame, tmp_path: Path, value: float) -> None:
    df = st_frame.copy()
    df.loc[17, "duration"] = value
    with pytest.raises(TraceError, match=r"duration must be finite, >= 0.*row 17.*step 23"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_negative_start(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    df = st_frame.copy()
    df.loc[3, "start_ts"] = -1.0
    with pytest.raises(TraceError, match=r"start_ts must be finite"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_rank_missing_from_a_step(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    step = sorted(st_frame["step"].unique())[5]
    df = st_frame[~((st_frame["step"] == step) & (st_frame["dp_rank"] == 1) & (st_frame["stage"] == 2))]
    with pytest.raises(TraceError, match=rf"got 7 in step {step}: missing \(dp_rank, stage\) \[\(1, 2\)\]"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_meta_does_not_match_ranks(tmp_path: Path) -> None:
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_size: 4\npp_size: 2\ntp_size: 1\nworld_size: 8\n")
    with pytest.raises(TraceError, match=r"stage must be in \[0, 2\).*Does the meta file belong"):
        load_bytedance(ST_PARQUET, meta)


def test_meta_too_small_world(tmp_path: Path) -> None:
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_size: 2\npp_size: 4\ntp_size: 1\nworld_size: 9\n")
    with pytest.raises(
        TraceError, match=r"world_size must equal .* = 2 \* 4 \* 1 \* 1 = 8, got 9 .*: one of"
    ):
        load_meta(meta)


def test_meta_with_a_misspelt_key_names_it(tmp_path: Path) -> None:
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_sz: 2\npp_size: 4\ntp_size: 1\nworld_size: 8\n")
    with pytest.raises(TraceError, match=r"missing \['dp_size'\] .*Is 'dp_sz' a misspelt 'dp_size'\?"):
        load_meta(meta)


def test_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "trace.parquet"
    path.write_text("step,rank\n1,2\n")
    with pytest.raises(TraceError, match=r"must be a Parquet file.*trace.parquet: it is not Parquet"):
        load_bytedance(path, ST_META)


def test_truncated_parquet(tmp_path: Path) -> None:
    path = tmp_path / "trace.parquet"
    path.write_bytes(ST_PARQUET.read_bytes()[:30000])
    with pytest.raises(TraceError, match=r"must be a Parquet file.*truncated.*Copy or write the file again"):
        load_bytedance(path, ST_META)
    path.write_bytes(b"")
    with pytest.raises(TraceError, match=r"must be a Parquet file.*it is empty"):
        load_bytedance(path, ST_META)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"trace file must be an existing file"):
        load_bytedance(tmp_path / "nope.parquet", ST_META)


@pytest.mark.parametrize(
    "text,match",
    [
        ("dp_size: 2\npp_size: 4\n", r"missing \['tp_size', 'world_size'\]"),
        ("- 1\n- 2\n", r"must be a YAML mapping"),
        ("dp_size: [\n", r"could not parse it \(in .*meta.yaml\): .* at line 2, column 1; fix the file$"),
        (
            "dp_size: two\npp_size: 4\ntp_size: 1\nworld_size: 8\n",
            r"dp_size must be a positive integer, got 'two'",
        ),
    ],
)
def test_bad_meta(tmp_path: Path, text: str, match: str) -> None:
    meta = tmp_path / "meta.yaml"
    meta.write_text(text)
    with pytest.raises(TraceError, match=match):
        load_meta(meta)


def test_unknown_optype(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    df = st_frame.copy()
    df["optype"] = df["optype"].astype(str)
    df.loc[0, "optype"] = "all-to-all"
    with pytest.raises(TraceError, match=r"optype must be one of .*'all-to-all'"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_canonical_round_trip(tmp_path: Path) -> None:
    from pacectl.backends.replay import ReplayBackend
    from pacectl.traces.canonical import load_canonical, write_canonical

    trace = load_bytedance(ST_PARQUET, ST_META)
    write_canonical(trace, tmp_path / "st.parquet")
    back = load_canonical(tmp_path / "st.parquet")
    assert back.meta == trace.meta and back.fmt == "bytedance"
    pd.testing.assert_frame_equal(back.ops, trace.ops)
    np.testing.assert_array_equal(
        ReplayBackend(back).replayed_times()[1], ReplayBackend(trace).replayed_times()[1]
    )


def test_canonical_rejects_foreign_parquet(tmp_path: Path) -> None:
    from pacectl.traces.canonical import load_canonical

    with pytest.raises(TraceError, match=r"must carry 'pacectl' metadata.*trace=bytedance"):
        load_canonical(ST_PARQUET)


def test_recorded_pacing_delay_is_not_a_launch_gap(tmp_path: Path) -> None:
    """A paced recording (delay_s before the paced op) replays as its unpaced counterfactual."""
    from pacectl.backends.replay import ReplayBackend
    from pacectl.traces.model import OpTrace

    trace = load_bytedance(ST_PARQUET, ST_META)
    ops = trace.ops.copy()
    ops["delay_s"] = 0.0
    paced = ops["optype"] == "grads-reduce-scatter"
    ops.loc[paced, "delay_s"] = 0.004
    ops.loc[paced, "start_ts"] += 0.004  # the rank slept 4 ms before entering
    shifted = OpTrace(ops=ops, meta=trace.meta, source="paced", fmt="canonical")
    base, replay = ReplayBackend(trace), ReplayBackend(shifted)
    nodes = base.dag.find("grads-reduce-scatter")
    np.testing.assert_allclose(replay.launch_s[nodes], base.launch_s[nodes], atol=1e-6)


def test_string_durations_are_rejected(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    df = st_frame.copy()
    df["duration"] = df["duration"].astype(str)
    with pytest.raises(TraceError, match=r"column duration must hold numbers .*got dtype"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_fractional_step_ids_are_rejected(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    df = st_frame.copy()
    df["step"] = df["step"].astype(float)
    df.loc[4, "step"] = 23.5
    with pytest.raises(TraceError, match=r"column step must hold integers, got 23.5 \(in .*row 4"):
        load_bytedance(_write(df, tmp_path), ST_META)


def test_exact_duplicate_row_is_dropped_with_a_warning(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    df = pd.concat([st_frame, st_frame.iloc[[40]]], ignore_index=True)
    row = st_frame.iloc[40]
    with pytest.warns(
        TraceWarning,
        match=rf"dropped 1 exact duplicate row .*the first dropped: row {len(st_frame)} \(step {row['step']}, rank {row['rank']}",
    ):
        trace = load_bytedance(_write(df, tmp_path), ST_META)
    pd.testing.assert_frame_equal(trace.ops, load_bytedance(ST_PARQUET, ST_META).ops)


def test_conflicting_duplicate_has_its_own_message(st_frame: pd.DataFrame, tmp_path: Path) -> None:
    extra = st_frame.iloc[[40]].assign(duration=st_frame["duration"].iloc[40] + 1.0)
    row = st_frame.iloc[40]
    with pytest.raises(
        TraceError,
        match=rf"must appear once, got 2 rows with different duration for step {row['step']}, dp_rank "
        rf"{row['dp_rank']}, stage {row['stage']}, optype {row['optype']}, seq_id {row['seq_id']} .*rows \[40, {len(st_frame)}\]",
    ) as err:
        load_bytedance(_write(pd.concat([st_frame, extra], ignore_index=True), tmp_path), ST_META)
    assert "incomplete" not in str(err.value) and "np." not in str(err.value)


def test_duplicate_without_repair_is_an_error_in_validate_ops() -> None:
    trace = load_bytedance(ST_PARQUET, ST_META)
    ops = pd.concat([trace.ops, trace.ops.iloc[[3]]], ignore_index=True)
    with pytest.raises(TraceError, match="exact duplicate rows for step"):
        validate_ops(ops, trace.meta, source="x")


def test_real_traces_are_in_seconds() -> None:
    trace = load_bytedance(ST_PARQUET, ST_META)
    assert trace.time_unit == "s" and not trace.time_normalized


def test_canonical_names_a_runs_own_output_file(tmp_path: Path) -> None:
    from pacectl.report import write_iterations_parquet
    from pacectl.testing.episodes import make_episode
    from pacectl.traces.canonical import load_canonical

    out = tmp_path / "iterations.parquet"
    write_iterations_parquet(out, {"none": make_episode([[0.0, 0.1], [0.2, 0.3]])})
    with pytest.raises(TraceError, match=r"per-iteration output \(iterations.parquet\), not a trace"):
        load_canonical(out)
