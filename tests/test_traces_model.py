"""validate_ops on one packed key: the same canonical records and messages as the pandas checks."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from pacectl.errors import TraceError
from pacectl.traces.model import (
    OP_KEY,
    OpTrace,
    _check_unique_keys,
    drop_exact_duplicates,
    keys_repeat,
    packed_key,
    validate_ops,
)


def test_packed_key_orders_rows_lexicographically() -> None:
    rng = np.random.default_rng(0)
    cols = [rng.integers(-3, 4, 500), rng.integers(0, 2, 500), rng.integers(10, 13, 500)]
    key = packed_key(cols)
    assert key is not None
    assert np.array_equal(np.argsort(key, kind="stable"), np.lexsort(cols[::-1]))
    assert packed_key([np.array([0, 2**61]), np.array([0, 7])]) is None  # too wide: the pandas path
    assert packed_key([np.array([0.5, 1.0])]) is None


@pytest.mark.parametrize("seed", range(4))
def test_packed_key_on_narrow_and_offset_digits(seed: int) -> None:
    # digits as a file holds them (int8 ... uint32) and offset far from 0: the minima come off once
    rng = np.random.default_rng(seed)
    for _ in range(50):
        cols = []
        for _ in range(int(rng.integers(1, 5))):
            lo = int(rng.choice([0, -5, 10 ** int(rng.integers(0, 17))]))
            values = lo + rng.integers(0, int(rng.integers(1, 50)), 300)
            dtype = np.dtype(rng.choice(["int8", "int16", "int32", "uint8", "uint32", "int64"]))
            info = np.iinfo(dtype)
            cols.append(
                values.astype(dtype) if info.min <= values.min() and values.max() <= info.max else values
            )
        key = packed_key(cols)
        assert key is not None and key.dtype == np.int64
        digits = [c.astype(np.int64) - int(c.min()) for c in cols]  # each offset by its minimum
        expected = np.ravel_multi_index(digits, [int(d.max()) + 1 for d in digits])
        assert np.array_equal(key, expected)
        assert np.array_equal(np.argsort(key, kind="stable"), np.lexsort(cols[::-1]))
        rows = np.unique(np.stack([c.astype(np.int64) for c in cols], axis=1), axis=0)
        assert len(np.unique(key)) == len(rows)  # equal keys are equal rows


@pytest.mark.parametrize(
    "order", [["step", "dp_rank"], ["dp_rank", "stage", "step"], ["stage", "seq_id"], ["start_ts"]]
)
def test_every_row_order_validates_to_the_same_records(st_trace: OpTrace, order: list[str]) -> None:
    # sorted (no sort runs), step-major (as the ByteDance files are), rank-major and by time
    raw = st_trace.ops.sort_values(order, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(
        validate_ops(raw, st_trace.meta, source="x"), st_trace.ops, check_exact=True
    )


@pytest.mark.parametrize("optype_dtype", ["str", "category", "object"])
def test_shuffled_rows_validate_to_the_same_records(ar_trace: OpTrace, optype_dtype: str) -> None:
    raw = ar_trace.ops.sample(frac=1.0, random_state=1).reset_index(drop=True)
    raw["optype"] = raw["optype"].astype(optype_dtype)
    raw["stage"] = raw["stage"].astype(np.int8)
    out = validate_ops(raw, ar_trace.meta, source="x")
    pd.testing.assert_frame_equal(out, ar_trace.ops, check_exact=True)


def test_step_ids_too_wide_for_a_key_take_the_pandas_path(st_trace: OpTrace) -> None:
    raw = st_trace.ops.copy()
    raw["step"] = np.where(raw["step"] == raw["step"].min(), 2**61, raw["step"])
    out = validate_ops(raw.sample(frac=1.0, random_state=2), st_trace.meta, source="x")
    expected = raw.sort_values(["step", "dp_rank", "stage", "optype", "seq_id"], kind="stable").reset_index(
        drop=True
    )
    pd.testing.assert_frame_equal(out, expected, check_exact=True)


def _message(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(TraceError) as info:
        fn()
    return str(info.value)


def test_bad_tables_get_the_pandas_messages(st_trace: OpTrace) -> None:
    ops, meta = st_trace.ops, st_trace.meta
    # a conflicting duplicate of one op: the message names its rows and what differs
    dup = pd.concat([ops, ops.iloc[[10]].assign(duration=9.0)], ignore_index=True)
    msg = _message(lambda: validate_ops(dup, meta, source="f"))
    assert msg == _message(lambda: _check_unique_keys(dup, "f"))
    assert "different duration" in msg and "rows [10, 6784]" in msg
    # a (dp_rank, stage) that maps to two global ranks
    two = ops.copy()
    two.loc[two.index[-1], "rank"] = 7 if two["rank"].iloc[-1] != 7 else 6
    assert "map to one global rank" in _message(lambda: validate_ops(two, meta, source="f"))
    # a step that lacks a rank
    short = ops[~((ops["step"] == ops["step"].max()) & (ops["dp_rank"] == 1) & (ops["stage"] == 2))]
    msg = _message(lambda: validate_ops(short, meta, source="f"))
    assert "every step must record all 8 ranks, got 7" in msg and "missing (dp_rank, stage) [(1, 2)]" in msg


def test_exact_duplicates_are_dropped_and_found_on_the_key(st_trace: OpTrace) -> None:
    raw = pd.concat([st_trace.ops, st_trace.ops.iloc[[3]]], ignore_index=True)
    key = [st_trace.ops[c].to_numpy() for c in ("step", "rank", "seq_id", "mc")]
    assert not keys_repeat([*key, pd.factorize(st_trace.ops["optype"])[0]])
    assert keys_repeat(
        [raw[c].to_numpy() for c in ("step", "rank", "seq_id", "mc")] + [pd.factorize(raw["optype"])[0]]
    )
    with pytest.warns(UserWarning, match="dropped 1 exact duplicate row"):
        kept = drop_exact_duplicates(raw, source="f", what="values")
    assert len(kept) == len(st_trace.ops)
    with warnings.catch_warnings():  # through validate_ops: the same table, one warning
        warnings.simplefilter("ignore")
        out = validate_ops(raw.sample(frac=1.0, random_state=0), st_trace.meta, source="f", drop_exact=True)
    pd.testing.assert_frame_equal(out, st_trace.ops, check_exact=True)
    with pytest.warns(UserWarning, match="dropped 1 exact duplicate row"):
        validate_ops(raw, st_trace.meta, source="f", drop_exact=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to drop: no warning
        pd.testing.assert_frame_equal(
            validate_ops(st_trace.ops, st_trace.meta, source="f", drop_exact=True),
            st_trace.ops,
            check_exact=True,
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_step_completeness_from_the_key_matches_the_pandas_check(st_trace: OpTrace, seed: int) -> None:
    # steps and seq ids that do not start at 0 (the key's digits are offset by their minima)
    rng = np.random.default_rng(seed)
    raw = st_trace.ops.assign(step=st_trace.ops["step"] * 3 + 1000, seq_id=st_trace.ops["seq_id"] + 5)
    out = validate_ops(raw.sample(frac=1.0, random_state=seed), st_trace.meta, source="x")
    expected = raw.sort_values(list(OP_KEY), kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(out, expected, check_exact=True)
    # one (dp_rank, stage) missing from one step in the middle: the same message as the pandas path
    step = int(rng.choice(raw["step"].unique()[1:-1]))
    dp, stage = (
        int(v) for v in raw[["dp_rank", "stage"]].drop_duplicates().sample(1, random_state=seed).iloc[0]
    )
    short = raw[~((raw["step"] == step) & (raw["dp_rank"] == dp) & (raw["stage"] == stage))]
    msg = _message(lambda: validate_ops(short.sample(frac=1.0, random_state=seed), st_trace.meta, source="x"))
    assert f"got 7 in step {step}: missing (dp_rank, stage) [({dp}, {stage})]" in msg


def test_a_missing_op_type_is_named(st_trace: OpTrace) -> None:
    raw = st_trace.ops.astype({"optype": object})
    raw.loc[5, "optype"] = np.nan
    msg = _message(lambda: validate_ops(raw, st_trace.meta, source="x"))
    assert msg.startswith("optype must be one of") and "got [nan] (in x: column optype, first at row " in msg
    assert msg.endswith(
        "first at row 5: step 23, rank 0, optype nan, seq_id 1); 1 row is bad. Drop or repair it"
    ), msg


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(["b", "a", "b", "c"], dtype="str"),
        pd.Series(["b", "a", "b", "c"], dtype=object),
        pd.Series(pd.Categorical(["b", "a", "b"], categories=["c", "b", "a"])),
        pd.Series([3, 1, 3]),
        pd.Series([], dtype="str"),
    ],
    ids=["str", "object", "categorical", "int", "empty"],
)
def test_text_codes_give_the_column_back(column: pd.Series) -> None:
    """``values.take(codes)`` is the column as text, values in order of first appearance."""
    from pacectl.traces.model import text_codes

    coded = text_codes(column)
    assert coded is not None
    codes, values = coded
    assert list(values.take(codes)) == [str(v) for v in column]
    assert list(values) == list(dict.fromkeys(str(v) for v in column))


def test_text_codes_of_a_missing_value_is_none() -> None:
    from pacectl.traces.model import text_codes

    assert text_codes(pd.Series(["a", None, "b"], dtype="str")) is None
