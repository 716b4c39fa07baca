"""Kineto (PyTorch profiler) importer: real shipped traces, edge cases, bad inputs and fuzzing."""

from __future__ import annotations

import gzip
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacectl.backends.dag import compile_dag, estimate_intrinsic
from pacectl.data import DATA_DIR
from pacectl.errors import TraceError
from pacectl.traces.jsonstream import stream_events
from pacectl.traces.kineto import KinetoWarning, TraceProblems, import_kineto, load_kineto
from pacectl.traces.model import TraceWarning

H200 = DATA_DIR / "h200-capture"
HTA = DATA_DIR / "hta"
PAIR = HTA / "trace_filter"
CPU_ONLY = HTA / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
NO_INFO = HTA / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"


def _quiet_import(*args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KinetoWarning)
        return import_kineto(*args, **kwargs)


@pytest.fixture(scope="module")
def h200() -> Any:
    return _quiet_import(H200)


def _doc(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


_KEEP = ("ProfilerStep#", "gloo:", "c10d::", "DistributedDataParallel.forward")


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Ranks 0 and 1 of the H200 set, reduced to the events the importer uses (fast to fuzz)."""
    docs = []
    for r in (0, 1):
        d = _doc(H200 / f"gloo4_rank{r}.json.gz")
        d["traceEvents"] = [e for e in d["traceEvents"] if str(e.get("name", "")).startswith(_KEEP)]
        d["distributedInfo"]["world_size"] = 2
        docs.append(d)
    return docs


def _write(path: Path, doc: Any, *, gz: bool = False) -> Path:
    text = json.dumps(doc)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ real traces
def test_h200_gloo4_imports_as_4_rank_dp(h200: Any) -> None:
    trace, rep = h200
    assert (trace.meta.dp_size, trace.meta.pp_size, trace.meta.world_size) == (4, 1, 4)
    assert rep.steps == [23, 24, 25, 26]
    assert rep.buckets_per_step == 3
    assert rep.collective_source.startswith("CPU backend spans (gloo)")
    assert rep.arrival_source.startswith("c10d enqueue")
    assert rep.matching.startswith("ordinal")
    assert not rep.align_applied  # one host, one clock
    # the canonical op type of DDP's gradient collective, named as the capture recorded it
    assert trace.collective == "gloo all_reduce"
    counts = trace.ops.groupby("optype").size().to_dict()
    assert counts == {
        "forward-compute": 16,
        "backward-compute": 48,
        "grads-reduce-scatter": 48,
        "optimizer": 16,
    }


def test_h200_arrival_spreads_match_the_hook_csv(h200: Any) -> None:
    """Spreads from the Kineto files vs. the DDP comm hook's enter_ns (independent recording)."""
    _, rep = h200
    b = pd.read_csv(H200 / "gloo4_buckets.csv")
    b = b[b["iteration"].isin(rep.steps)]
    csv = b.groupby(["iteration", "bucket"])["enter_ns"].agg(lambda s: (s.max() - s.min()) * 1e-9).unstack()
    diff = np.abs(rep.spread_all_s - csv.to_numpy())
    assert np.median(diff) < 1e-4 and diff.max() < 3e-4  # measured: median 0.037 ms, max 0.12 ms
    # the clock-alignment residual is the exit skew, which the hook also sees (median 1.6 ms)
    exit_spread = b.groupby(["iteration", "bucket"])["exit_ns"].agg(lambda s: (s.max() - s.min()) * 1e-9)
    assert abs(rep.residual_median_s - float(exit_spread.median())) < 1e-3


def test_h200_step_times_match_the_iteration_csv(h200: Any) -> None:
    _, rep = h200
    it = pd.read_csv(H200 / "gloo4_iters.csv")
    it = it[it["iteration"].isin(rep.steps)]
    wall = (it.groupby("iteration")["end_ns"].max() - it.groupby("iteration")["start_ns"].min()) * 1e-9
    assert np.abs(rep.step_time_s - wall.to_numpy()).max() < 1e-3


def test_h200_replays_exactly(h200: Any) -> None:
    trace, _ = h200
    dag = compile_dag(trace)
    _, _, counts = estimate_intrinsic(dag)
    assert counts["launch_clipped"] == 0 and counts["transfer_clipped"] == 0


def _assert_warned(caught: pytest.WarningsRecorder, *expected: str) -> None:
    """Every expected text is in one of the KinetoWarnings, and every KinetoWarning is an expected one."""
    messages = [str(w.message) for w in caught if issubclass(w.category, KinetoWarning)]
    assert all(any(e in m for m in messages) for e in expected), messages
    assert all(any(e in m for e in expected) for m in messages), messages


def test_hta_pair_subset_of_world_warns_and_loads() -> None:
    with pytest.warns(KinetoWarning) as caught:
        trace, rep = import_kineto(PAIR)
    _assert_warned(caught, "world_size=128", "no all-reduce/reduce-scatter collective found")
    assert trace.meta.dp_size == 2 and trace.meta.world_size == 128
    assert rep.steps == [551, 552] and rep.buckets_per_step == 5
    assert rep.kinds == {"all_to_all": 5.0}
    assert 0.030 < float(np.median(rep.spread_first_s)) < 0.045  # README: 37.6 ms median
    with pytest.raises(TraceError, match="world_size=128"):
        import_kineto(PAIR, strict=True)


def test_cpu_only_gloo_single_rank() -> None:
    trace, rep = _quiet_import(CPU_ONLY)
    assert trace.ops["rank"].unique().tolist() == [34]
    assert rep.world_size == 300 and rep.buckets_per_step == 2
    assert rep.matching.startswith("single rank")


def test_missing_distributed_info_rank_from_override_or_name(tmp_path: Path) -> None:
    with pytest.warns(KinetoWarning) as caught:
        import_kineto(NO_INFO)
    _assert_warned(caught, "rank 0 taken from the default", "no all-reduce/reduce-scatter collective found")
    trace, _ = _quiet_import(NO_INFO, ranks=[5])
    assert trace.ops["rank"].unique().tolist() == [5]
    named = tmp_path / "job.rank-7.json.gz"
    named.write_bytes(NO_INFO.read_bytes())
    with pytest.warns(KinetoWarning) as caught:
        import_kineto(named)
    _assert_warned(caught, "rank 7 taken from the file name", "no all-reduce/reduce-scatter collective found")


def test_glob_plain_json_and_bare_list(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    for r, d in enumerate(small_pair):
        _write(tmp_path / f"r{r}.json", d)
    a, _ = _quiet_import(str(tmp_path / "r*.json"))
    # a bare event list (no distributedInfo, no base): ranks from an override, ts made absolute
    bare = tmp_path / "bare"
    bare.mkdir()
    for r, d in enumerate(small_pair):
        base = d["baseTimeNanoseconds"] / 1000
        events = [dict(e, ts=e["ts"] + base) if "ts" in e else e for e in d["traceEvents"]]
        _write(bare / f"w{r}.json", events)
    b, _ = _quiet_import(bare, ranks=[0, 1])
    pd.testing.assert_frame_equal(a.ops, b.ops, check_exact=False, rtol=0, atol=1e-6)  # epoch µs: 0.25 µs ulp


def test_relative_ts_with_base_time(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    """Shifting the base by 1 s on one rank shifts its clock; auto alignment removes it."""
    docs = [json.loads(json.dumps(d)) for d in small_pair]
    docs[1]["baseTimeNanoseconds"] += 1_000_000_000
    for r, d in enumerate(docs):
        _write(tmp_path / f"rank{r}.json.gz", d, gz=True)
    trace, rep = _quiet_import(tmp_path)
    assert rep.align_applied and abs(rep.clock_offsets_s[1] - 1.0) < 0.01
    assert rep.residual_median_s < 0.005
    ref, _ = _quiet_import(tmp_path, align="none")
    assert ref.recorded_step_time_s().max() > 0.9  # unaligned: 1 s apart


def test_truncated_file_recovers_with_warning(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    doc = dict(small_pair[0])
    doc["baseTimeNanoseconds"] = doc.pop(
        "baseTimeNanoseconds"
    )  # after traceEvents, as Kineto often writes it
    text = json.dumps(doc)
    cut = text.index("traceEvents") + len(text[text.index("traceEvents") :]) * 3 // 4
    p = tmp_path / "rank0.json"
    p.write_text(text[:cut])
    _write(tmp_path / "rank1.json", small_pair[1])
    with pytest.warns(KinetoWarning, match="truncated"):
        _, rep = import_kineto(tmp_path, drop_unmatched=True)
    assert any("baseTimeNanoseconds lost" in w for w in rep.warnings)
    with pytest.raises(TraceError, match="complete in strict mode"):
        import_kineto(tmp_path, strict=True, drop_unmatched=True)


def test_truncated_gzip_recovers_or_fails_cleanly(tmp_path: Path) -> None:
    data = (H200 / "gloo4_rank0.json.gz").read_bytes()
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(data[: len(data) * 2 // 3])
    with pytest.warns(KinetoWarning) as caught:
        import_kineto(p)
    # the cut drops a step, and one rank file of a 4-rank job replays the present rank alone
    _assert_warned(caught, "gzip stream ended early", "dropped 1 of 2 steps", "must equal world_size=4")
    p.write_bytes(data[:200])
    with pytest.raises(TraceError, match="ends early"):
        import_kineto(p)


_NEW_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _nccl_pair(
    tmp_path: Path,
    spans: list[tuple[float, float]],
    *,
    names: tuple[str, str] = (_NEW_NCCL, _NEW_NCCL),
    skew_us: float = 0.0,
    **kernel_args: Any,
) -> Path:
    """Two NCCL ranks (kernel ``names[r]`` on rank r), one step, one all-reduce kernel per ``(ts, dur)``
    (µs); rank r's kernels start ``r * skew_us`` later and end at the same time."""
    for r in range(2):
        events: list[dict[str, Any]] = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#3",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 1000,
            }
        ]
        events += [
            {
                "ph": "X",
                "cat": "kernel",
                "name": names[r],
                "pid": 0,
                "tid": 7,
                "ts": ts + r * skew_us,
                "dur": dur - r * skew_us,
                "args": {"stream": 7, **kernel_args},
            }
            for ts, dur in spans
        ]
        if "correlation" in kernel_args:  # a CPU launch with that id, and one with a valid id
            for corr in (kernel_args["correlation"], 7):
                launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1}
                events.append({**launch, "ts": 150.0, "dur": 5.0, "args": {"correlation": corr}})
        _write(
            tmp_path / f"rank{r}.json",
            {"distributedInfo": {"rank": r, "world_size": 2, "backend": "nccl"}, "traceEvents": events},
        )
    return tmp_path


def test_old_and_new_nccl_kernel_names(tmp_path: Path) -> None:
    _nccl_pair(
        tmp_path,
        [(200.0, 100.0), (500.0, 100.0)],
        names=(
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        ),
        skew_us=5.0,
    )
    trace, rep = _quiet_import(tmp_path)
    assert rep.kinds == {"all_reduce": 2.0} and rep.collective_source.startswith("gpu kernels")
    assert rep.residual_max_s == 0.0
    assert np.allclose(rep.spread_first_s, 5e-6)


def test_buckets_serialise_in_a_chain(tmp_path: Path) -> None:
    """Bucket k starts after bucket k - 1 ends as serialised itself: a long bucket 0 pushes bucket 1,
    which pushes bucket 2 (once, bucket 2 started before bucket 0's end)."""
    trace, _ = _quiet_import(_nccl_pair(tmp_path, [(100.0, 100.0), (110.0, 10.0), (130.0, 10.0)]))
    colls = trace.ops[(trace.ops["optype"] == "grads-reduce-scatter") & (trace.ops["rank"] == 0)]
    colls = colls.sort_values("seq_id")
    starts, ends = colls["start_ts"].to_numpy(), (colls["start_ts"] + colls["duration"]).to_numpy()
    assert (starts[1:] >= ends[:-1] - 1e-12).all(), (starts, ends)


@pytest.mark.parametrize("corr", [float("nan"), float("inf"), 1.5])
def test_a_correlation_id_that_is_no_integer_links_nothing(tmp_path: Path, corr: float) -> None:
    trace, rep = _quiet_import(_nccl_pair(tmp_path, [(200.0, 100.0), (500.0, 100.0)], correlation=corr))
    assert rep.kinds == {"all_reduce": 2.0} and len(trace.steps) == 1


# ------------------------------------------------------------------------------------ bad inputs
def _pair_dir(tmp_path: Path, docs: list[Any], *, gz: bool = False) -> Path:
    for r, d in enumerate(docs):
        _write(tmp_path / f"rank{r}.json{'.gz' if gz else ''}", d, gz=gz)
    return tmp_path


def test_invalid_json_names_offset(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    text = json.dumps(small_pair[0])
    i = text.index('"ph"', len(text) // 2)
    (tmp_path / "rank0.json").write_text(text[:i] + "@" + text[i + 1 :])
    _write(tmp_path / "rank1.json", small_pair[1])
    with pytest.raises(TraceError, match=r"valid JSON.*at character \d+ \(after event #\d+\)"):
        import_kineto(tmp_path)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda e: e.pop("ts"), "ts of .* must be a finite number"),
        (lambda e: e.update(dur=float("nan")), "dur of .* must be a finite number"),
        (lambda e: e.update(dur=-3.0), "dur of .* must be a finite number"),
        (lambda e: e.update(dur=1e20), "dur of .* must be a finite number"),
        (lambda e: e.update(ts="12"), "ts of .* must be a finite number"),
    ],
)
def test_bad_event_fields(tmp_path: Path, small_pair: list[dict[str, Any]], mutate: Any, match: str) -> None:
    docs = json.loads(json.dumps(small_pair))
    ev = next(e for e in docs[0]["traceEvents"] if e.get("name") == "gloo:all_reduce")
    mutate(ev)
    with pytest.raises(TraceProblems, match=match) as info:
        import_kineto(_pair_dir(tmp_path, docs))
    assert info.value.problems[0].where.startswith("event #")


def test_duplicated_events(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    docs = json.loads(json.dumps(small_pair))
    ev = next(e for e in docs[1]["traceEvents"] if e.get("name") == "gloo:all_reduce")
    docs[1]["traceEvents"].append(dict(ev))
    with pytest.raises(TraceProblems, match="each event must appear once"):
        import_kineto(_pair_dir(tmp_path, docs))


def test_unmatched_collectives(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    docs = json.loads(json.dumps(small_pair))
    evs = docs[1]["traceEvents"]
    i = next(i for i, e in enumerate(evs) if e.get("name") == "gloo:all_reduce")
    del evs[i]
    with pytest.raises(TraceError, match="every rank must record the same collectives"):
        import_kineto(_pair_dir(tmp_path, docs))
    _, rep = _quiet_import(tmp_path, drop_unmatched=True)
    assert len(rep.steps) == 3 and len(rep.dropped_steps) == 1


def test_rank_count_must_match_world_size(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    docs = json.loads(json.dumps(small_pair))
    for d in docs:
        d["distributedInfo"]["world_size"] = 1
    with pytest.raises(TraceError, match=r"rank must be in \[0, world_size=1\)"):
        import_kineto(_pair_dir(tmp_path, docs))
    with pytest.raises(TraceError, match="world_size=8"):
        import_kineto(tmp_path, world_size=8, strict=True)


def test_duplicate_rank_and_missing_rank(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    docs = json.loads(json.dumps(small_pair))
    docs[1]["distributedInfo"]["rank"] = 0
    with pytest.raises(TraceError, match="each rank must come from one file"):
        import_kineto(_pair_dir(tmp_path / "a", docs) if (tmp_path / "a").mkdir() is None else tmp_path)
    docs = json.loads(json.dumps(small_pair))
    for d in docs:
        del d["distributedInfo"]
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b" / "x.json", docs[0])
    _write(tmp_path / "b" / "y.json", docs[1])
    with pytest.raises(TraceError, match="the rank of each file must be known"):
        import_kineto(tmp_path / "b")


def test_empty_directory_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty directory"):
        import_kineto(tmp_path)
    with pytest.raises(TraceError, match="glob must match"):
        import_kineto(str(tmp_path / "*.json"))
    with pytest.raises(TraceError, match="existing file"):
        import_kineto(tmp_path / "nope.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(TraceError, match="must not be empty"):
        import_kineto(tmp_path / "empty.json")


def test_size_guard_on_a_sparse_2gb_file(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    with p.open("wb") as f:  # sparse: no 2 GB written
        f.truncate(2 * 1024**3)
    with pytest.raises(
        TraceError, match=r"size must be <= 1024 MiB \(1073741824 bytes\) \(trace.max_mb\), got 2048 MiB"
    ):
        import_kineto(p)


def test_decompressed_size_guard(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="decompressed trace text must be <="):
        import_kineto(H200 / "gloo4_rank0.json.gz", max_bytes=1 << 20)


def test_no_collectives_is_an_error(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "ts": 0,
                "dur": 5,
                "pid": 1,
                "tid": 1,
            }
        ]
    }
    with pytest.raises(TraceError, match="at least one collective"):
        import_kineto(_write(tmp_path / "rank0.json", doc))


def test_stream_reader_is_bounded_and_matches_json_load(tmp_path: Path) -> None:
    doc = _doc(H200 / "gloo4_rank1.json.gz")
    seen: list[Any] = []
    res = stream_events(H200 / "gloo4_rank1.json.gz", lambda e, i: seen.append(e))
    assert seen == doc["traceEvents"] and res.truncated is None
    assert res.meta["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]


# ----------------------------------------------------------------------------------------- fuzzing
_OK = (TraceError,)


def _mutate_bytes(text: bytes, op: str, pos_frac: float, byte: int) -> bytes:
    pos = int(pos_frac * (len(text) - 1))
    if op == "truncate":
        return text[:pos]
    if op == "flip":
        return text[:pos] + bytes([text[pos] ^ (byte or 1)]) + text[pos + 1 :]
    if op == "insert":
        return text[:pos] + bytes([byte]) + text[pos:]
    return text[:pos] + text[pos + 1 :]  # delete


def _mutate_doc(doc: dict[str, Any], op: str, idx_frac: float, key: str) -> dict[str, Any]:
    d = json.loads(json.dumps(doc))
    evs = d["traceEvents"]
    i = int(idx_frac * (len(evs) - 1))
    if op == "drop_key":
        evs[i].pop(key, None)
    elif op == "dup_event":
        evs.insert(i, dict(evs[i]))
    elif op == "nan":
        evs[i][key] = float("nan")
    elif op == "neg":
        evs[i][key] = -1.0
    elif op == "huge":
        evs[i][key] = 1e300
    elif op == "wrong_type":
        evs[i][key] = [1, "x"]
    elif op == "drop_event":
        del evs[i]
    elif op == "drop_meta":
        d.pop(key, None)
    return d


def _import_one_of_pair(tmp: Path, first: bytes, second: dict[str, Any], gz: bool) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        f.unlink()
    (tmp / ("rank0.json.gz" if gz else "rank0.json")).write_bytes(gzip.compress(first) if gz else first)
    _write(tmp / "rank1.json", second)
    try:
        _quiet_import(tmp)
    except _OK:
        pass


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from(["truncate", "flip", "insert", "delete"]),
    pos=st.floats(0, 1),
    byte=st.integers(0, 255),
    gz=st.booleans(),
)
def test_fuzz_byte_mutations_load_or_raise_trace_error(
    tmp_path: Path, small_pair: list[dict[str, Any]], op: str, pos: float, byte: int, gz: bool
) -> None:
    text = json.dumps(small_pair[0]).encode()
    _import_one_of_pair(tmp_path / "fz", _mutate_bytes(text, op, pos, byte), small_pair[1], gz)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from(
        ["drop_key", "dup_event", "nan", "neg", "huge", "wrong_type", "drop_event", "drop_meta"]
    ),
    idx=st.floats(0, 1),
    key=st.sampled_from(
        ["ts", "dur", "name", "ph", "cat", "args", "pid", "distributedInfo", "baseTimeNanoseconds"]
    ),
)
def test_fuzz_structural_mutations_load_or_raise_trace_error(
    tmp_path: Path, small_pair: list[dict[str, Any]], op: str, idx: float, key: str
) -> None:
    doc = _mutate_doc(small_pair[0], op, idx, key)
    _import_one_of_pair(tmp_path / "fz", json.dumps(doc).encode(), small_pair[1], False)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(op=st.sampled_from(["truncate", "flip", "delete"]), pos=st.floats(0, 1), byte=st.integers(1, 255))
def test_fuzz_gzip_bytes_of_a_real_file(op: str, pos: float, byte: int) -> None:
    """Mutate the *compressed* bytes of a real HTA file (corrupt deflate, CRC, header)."""
    import tempfile

    data = _mutate_bytes(CPU_ONLY.read_bytes(), op, pos, byte)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "rank-34.json.gz"
        p.write_bytes(data)
        try:
            _quiet_import(p)
        except _OK:
            pass


# Edge inputs pinned as regressions. The fuzzers above (240 Hypothesis examples per run, plus a
# 2,504-example random campaign of 1-3 stacked mutations during development) found no input that
# raised anything but TraceError; these are the corner cases the reader was hardened against.
REGRESSIONS: list[tuple[str, bytes]] = [
    ("lone bracket", b"["),
    ("scalar document", b"42"),
    ("events not objects", b'{"traceEvents": [1, "x", null]}'),
    (
        "bool ts",
        b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": true, "dur": 1}]}',
    ),
    (
        "NaN literal",
        b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 1, "dur": NaN}]}',
    ),
    ("extra data", b'{"traceEvents": []} {"x": 1}'),
    ("no events", b'{"traceEvents": []}'),
    (
        "dict distributedInfo wrong types",
        b'{"distributedInfo": {"rank": "0", "world_size": -1}, "traceEvents": []}',
    ),
    (
        "invalid utf-8",
        b'{"traceEvents": [{"name": "\xff\xfe", "ph": "X"}]}'.replace(b"\\xff\\xfe", b"\xff\xfe"),
    ),
]


@pytest.mark.parametrize(("label", "payload"), REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_fuzz_regressions(tmp_path: Path, label: str, payload: bytes) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(payload)
    with pytest.raises(TraceError):
        _quiet_import(p)


def test_load_kineto_returns_trace() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = load_kineto(CPU_ONLY)
    assert trace.fmt == "kineto" and math.isfinite(float(trace.ops["duration"].sum()))
    assert os.path.basename(trace.source).startswith("rank-34")


def _h200_with_rank1_cut(tmp_path: Path, keep: float) -> Path:
    """The shipped 4-rank gloo set with rank 1 decompressed and cut to ``keep`` of its text."""
    for r in (0, 2, 3):
        (tmp_path / f"gloo4_rank{r}.json.gz").write_bytes((H200 / f"gloo4_rank{r}.json.gz").read_bytes())
    text = gzip.decompress((H200 / "gloo4_rank1.json.gz").read_bytes())
    cut = tmp_path / "gloo4_rank1.json"
    cut.write_bytes(text[: int(len(text) * keep)])
    return cut


def test_heavily_truncated_rank_is_named(tmp_path: Path) -> None:
    cut = _h200_with_rank1_cut(tmp_path, 1.5 / 5.87)  # the review's case: 1.5 MB of 5.9 MB
    with pytest.raises(TraceProblems) as info:
        _quiet_import(tmp_path)
    (problem,) = info.value.problems
    assert problem.file == str(cut)
    for text in (
        "disjoint step sets",
        "looks truncated",
        "JSON ended early",
        "Re-export",
        "gloo4_rank0.json.gz",
    ):
        assert text in problem.message
    assert str(cut) in str(info.value) and "field file" not in str(info.value)
    # half the file: one step survives on rank 1; the collective mismatch names the truncated file too
    _h200_with_rank1_cut(tmp_path, 0.5)
    with pytest.raises(TraceProblems, match="every rank must record the same collectives.*looks truncated"):
        _quiet_import(tmp_path)
    # the suggested fix works: the complete ranks alone load
    trace, rep = _quiet_import([tmp_path / f"gloo4_rank{r}.json.gz" for r in (0, 2, 3)])
    assert trace.meta.dp_size == 3 and rep.steps == [23, 24, 25, 26]


def test_mildly_truncated_rank_still_recovers(tmp_path: Path, h200: Any) -> None:
    _h200_with_rank1_cut(tmp_path, 0.9)
    with pytest.warns(KinetoWarning, match="truncated"):
        trace, rep = import_kineto(tmp_path)
    assert rep.steps == h200[1].steps and rep.buckets_per_step == 3


def test_folder_with_two_jobs_suggests_a_glob(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    for r, d in enumerate(small_pair):
        _write(tmp_path / f"gloo4_rank{r}.json.gz", d, gz=True)
    single = json.loads(json.dumps(small_pair[0]))
    single["distributedInfo"]["world_size"] = 1
    _write(tmp_path / "nccl1_rank0.json.gz", single, gz=True)
    with pytest.raises(TraceProblems) as info:
        _quiet_import(tmp_path)
    (problem,) = info.value.problems
    assert "files of 2 jobs" in problem.message and "in this folder" in problem.message
    assert f"'{tmp_path / 'gloo4_rank*.json.gz'}'" in problem.message
    trace, _ = _quiet_import(str(tmp_path / "gloo4_rank*.json.gz"))  # the suggested glob works
    assert trace.meta.dp_size == 2


def test_dropped_steps_wording_and_plain_values(tmp_path: Path, small_pair: list[dict[str, Any]]) -> None:
    docs = json.loads(json.dumps(small_pair))
    evs = docs[1]["traceEvents"]
    del evs[next(i for i, e in enumerate(evs) if e.get("name") == "gloo:all_reduce")]
    with pytest.raises(TraceError) as err:
        import_kineto(_pair_dir(tmp_path, docs))
    assert "np." not in str(err.value) and "{0: 3, 1: 2}" in str(err.value)
    with pytest.warns(KinetoWarning) as caught:
        import_kineto(tmp_path, drop_unmatched=True)
    _assert_warned(
        caught, "dropped 1 of 4 steps: unmatched collectives across ranks: steps [", "{0: 3, 1: 2}"
    )
    docs = json.loads(json.dumps(small_pair))
    docs[1]["traceEvents"].append(
        dict(next(e for e in docs[1]["traceEvents"] if e.get("name") == "gloo:all_reduce"))
    )
    with pytest.raises(TraceProblems) as err2:
        import_kineto(_pair_dir(tmp_path, docs))
    assert "np." not in str(err2.value)


def test_kineto_warning_is_a_trace_warning() -> None:
    assert issubclass(KinetoWarning, TraceWarning)


@pytest.mark.parametrize("max_mb", [float("nan"), float("inf"), -1, 0, "abc", True])
def test_trace_max_mb_must_be_a_positive_number(max_mb: Any) -> None:
    from omegaconf import OmegaConf

    from pacectl.config import load_trace
    from pacectl.errors import ConfigError

    cfg = OmegaConf.create({"format": "kineto", "path": str(DATA_DIR / "h200-capture"), "max_mb": max_mb})
    with pytest.raises(ConfigError, match=r"^trace\.max_mb must be (a (finite|real) number )?> 0, got "):
        load_trace(cfg)


def test_a_folder_of_other_traces_replayed_as_kineto_names_them() -> None:
    """pacectl/data/bytedance holds JSON files (the artifact's analysis outputs), so it reads as
    Kineto and fails; the error then names the traces the folder does hold."""
    from omegaconf import OmegaConf

    from pacectl.config import load_trace

    cfg = OmegaConf.create({"format": "kineto", "path": str(DATA_DIR / "bytedance")})
    with pytest.raises(
        TraceError, match=r"the folder also holds trace-AR.parquet, trace-ST.parquet: to replay one"
    ):
        load_trace(cfg)


def test_a_single_truncated_file_is_named_as_truncated(tmp_path: Path) -> None:
    """With one file there is no other rank to compare with: its own cut JSON is the evidence, and
    the message says so and how to fix it (it used to say only that no step held a collective)."""
    text = gzip.open(DATA_DIR / "hta" / "trace_filter" / "sampled_rank-0.json.gz").read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TraceError) as err:
            load_kineto([str(cut)])
    assert "looks truncated" in str(err.value) and "Re-export the trace" in str(err.value)
