"""Flight Recorder and NCCL Inspector importers: real gloo dumps, synthesised formats, hang snapshots.

The real dumps in ``pacectl/data/flight-recorder`` were recorded with torch 2.13 on CPU by
``experiments/flight_recorder/record_dumps.py`` (see that folder's README for each scenario and the
timing path it exercises: every gloo dump takes the ``created`` path, gloo writes no
``duration_ms``); the synthesised ones by ``experiments/flight_recorder/write_synthetic.py``.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pacectl.data import DATA_DIR
from pacectl.errors import TraceError
from pacectl.testing.synth_traces import (
    SynthJob,
    flight_recorder_dumps,
    nccl_inspector_logs,
    simulate,
    write_flight_recorder,
)
from pacectl.traces.__main__ import main as traces_main
from pacectl.traces.collectives import LayoutOverrides, kind_of, role_of
from pacectl.traces.detect import detect_format
from pacectl.traces.flight_recorder import (
    VERSIONS,
    FlightRecorderWarning,
    P2PReport,
    import_flight_recorder,
    inspect_flight_recorder,
    read_dump,
)
from pacectl.traces.nccl_inspector import NcclInspectorWarning, import_nccl_inspector

FR = DATA_DIR / "flight-recorder"
INSPECTOR = DATA_DIR / "nccl-inspector"


def _quiet_import(path: Path | str, **kwargs: object) -> tuple[object, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlightRecorderWarning)
        return import_flight_recorder(path, **kwargs)  # type: ignore[arg-type]


def _first_arrivals(trace: object) -> pd.DataFrame:
    """Arrival at each step's first gradient collective: step x rank, seconds from the step start."""
    ops = trace.ops  # type: ignore[attr-defined]
    first = ops[(ops["optype"] == "grads-reduce-scatter") & (ops["seq_id"] == 0)]
    return first.pivot_table(index="step", columns="rank", values="start_ts")


# ------------------------------------------------------------------------------ the real gloo dumps
@pytest.mark.parametrize("name", ["ddp2", "ddp4_json", "fsdp2_2x2", "hang2"])
def test_real_gloo_dumps_carry_no_duration_and_stay_scheduled(name: str) -> None:
    """What the fixtures' README says of gloo in torch 2.13, checked on the files themselves."""
    for f in sorted((FR / name).glob("fr_trace_rank_*")):
        dump = read_dump(f)
        e = dump.entries
        assert dump.version == "2.10" and len(e) > 0
        assert e["duration_ms"].isna().all()  # no TORCH_NCCL_ENABLE_TIMING on gloo: the created path
        assert (e["state"] == "scheduled").all()
        assert set(e["backend"].astype(str)) == {"gloo"}


def test_ddp2_straggler_is_rank_1_on_the_injected_iterations() -> None:
    trace, report = _quiet_import(FR / "ddp2")
    a = report.assembly  # type: ignore[attr-defined]
    assert trace.meta.dp_size == 2 and trace.meta.pp_size == 1  # type: ignore[attr-defined]
    assert a.timing == "created" and "time_created_ns" in a.timing_note
    assert a.collectives_per_step == [2] and a.steps == 11  # 12 iterations: the first differs
    arr = _first_arrivals(trace)
    late = arr[1] - arr[0]
    # record_dumps.py: rank 1 sleeps 100 ms on iterations 3, 6, 9; step k is iteration k + 1 here
    assert sorted(late.nlargest(3).index.tolist()) == [2, 5, 8]
    assert (late.loc[[2, 5, 8]] > 0.05).all()


def test_ddp4_json_dumps_are_real_json_and_rank_2_is_late() -> None:
    assert all(read_dump(f).fmt == "json" for f in (FR / "ddp4_json").iterdir() if f.name.startswith("fr_"))
    trace, report = _quiet_import(FR / "ddp4_json")
    assert trace.meta.dp_size == 4  # type: ignore[attr-defined]
    arr = _first_arrivals(trace)
    injected = [1, 3, 5, 7]  # iterations 2, 4, 6, 8
    assert (arr.loc[injected].idxmax(axis=1) == 2).all()
    assert ((arr.loc[injected, 2] - arr.loc[injected].drop(columns=2).max(axis=1)) > 0.03).all()


def test_fsdp2_mesh_dumps_give_two_dp_groups_each_with_its_straggler() -> None:
    trace, report = _quiet_import(FR / "fsdp2_2x2")
    a = report.assembly  # type: ignore[attr-defined]
    assert (trace.meta.dp_size, trace.meta.pp_size) == (2, 2)  # type: ignore[attr-defined]
    assert [g.desc for g in a.layout.dp_groups] == ["mesh_dp", "mesh_dp"]
    assert [g.ranks for g in a.layout.dp_groups] == [(0, 1), (2, 3)]
    assert a.collectives_per_step == [3, 3]  # one reduce-scatter per fully_shard layer
    assert a.folded_per_step == {"all_gather": 6.0}  # parameter all-gathers fold into compute
    arr = _first_arrivals(trace)
    # ranks 1 and 2 are slowed on odd iterations; iteration 0 has nothing before it to time its
    # start, so step k is iteration k + 1
    odd = [s for s in arr.index if s % 2 == 0]
    assert ((arr.loc[odd, 1] - arr.loc[odd, 0]) > 0.05).all()
    assert ((arr.loc[odd, 2] - arr.loc[odd, 3]) > 0.05).all()


def test_all_gathers_sync_makes_fsdp2_parameter_all_gathers_step_collectives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``all_gathers="sync"``: the DP group's all-gathers join its steps (where an FSDP job's early
    ranks wait for a straggler before forward); the step boundary stays where the gradient
    collectives put it, and a DDP set (no all-gather) imports as before."""
    folded, _ = _quiet_import(FR / "fsdp2_2x2")
    synced, report = _quiet_import(FR / "fsdp2_2x2", all_gathers="sync")
    a = report.assembly  # type: ignore[attr-defined]
    assert a.collectives_per_step == [9, 9] and a.folded_per_step == {}  # 6 all-gathers + 3 reduce-scatters
    assert synced.ops["step"].nunique() == folded.ops["step"].nunique() == 7  # type: ignore[attr-defined]
    # the same steps: each begins at the forward's first all-gather, so the forward shrinks to the
    # time before it and no step's span changes
    span = lambda t: t.ops.groupby(["step", "rank"]).apply(lambda o: (o.start_ts + o.duration).max())  # noqa: E731
    assert np.allclose(span(synced), span(folded), atol=1e-6)
    assert (_quiet_import(FR / "ddp2", all_gathers="sync")[0].ops).equals(_quiet_import(FR / "ddp2")[0].ops)  # type: ignore[attr-defined]
    with pytest.raises(TraceError, match=r"trace.all_gathers must be one of \['fold', 'sync'\], got 'keep'"):
        import_flight_recorder(FR / "ddp2", all_gathers="keep")
    assert traces_main(["info", str(FR / "fsdp2_2x2"), "--all-gathers", "sync"]) == 0
    out = capsys.readouterr().out
    assert "([9, 9] per step per stage)" in out and "folded into compute" not in out


def test_hang_snapshot_reports_who_is_behind_and_refuses_replay() -> None:
    _, report = inspect_flight_recorder(FR / "hang2")
    assert report.hang is not None and "ranks [1] never entered all_reduce #5" in report.hang
    (status,) = report.status
    assert status.behind == (1,) and status.waiting == (0,) and status.oldest_unfinished == 5
    assert status.last_enqueued == (5, 4) and status.last_completed == (4, 4)
    with pytest.raises(TraceError) as err:
        import_flight_recorder(FR / "hang2")
    msg = str(err.value)
    assert "hang snapshot" in msg and "TORCH_FR_BUFFER_SIZE" in msg and "TORCH_NCCL_ENABLE_TIMING" in msg
    assert "\n" not in msg


def test_info_on_a_hang_snapshot_exits_0_with_the_behind_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert traces_main(["info", str(FR / "hang2")]) == 0
    out = capsys.readouterr().out
    assert "HANG SNAPSHOT" in out and "rank 1: last enqueued #4" in out and "<- behind" in out
    assert traces_main(["info", str(FR / "hang2"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["status"][0]["behind"] == [1] and info["world_size"] == 2
    assert traces_main(["validate", str(FR / "hang2")]) == 2
    assert "hang snapshot" in capsys.readouterr().err


def test_info_prints_world_size_groups_and_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert traces_main(["info", str(FR / "fsdp2_2x2")]) == 0
    out = capsys.readouterr().out
    for key in (
        "world_size 4",
        "'3' (mesh_dp): role dp, ranks [0, 1]",
        "layout    dp 2 x pp 2 x tp 1",
        "timing    created",
    ):
        assert key in out, out


def test_validate_and_convert_name_the_timing_estimate_and_the_file_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pacectl.traces.canonical import load_canonical

    assert traces_main(["validate", str(FR / "ddp2")]) == 0
    assert "2 ranks, 11 steps, 132 ops, arrival timing created)" in capsys.readouterr().out
    out = tmp_path / "ddp2.parquet"
    assert traces_main(["convert", str(FR / "ddp2"), "-o", str(out)]) == 0
    assert "arrival timing created)" in capsys.readouterr().out
    assert load_canonical(out).timing.startswith("created: arrival = host enqueue time (time_created_ns)")


def test_enqueue_times_are_aligned_across_hosts_on_the_common_completion(tmp_path: Path) -> None:
    """The created path with durations present: rank 1's host clock 80 ms ahead (every entry) is
    found from the collectives' common completion (enqueue + duration) and removed, and says so."""
    job = SynthJob(dp=2, steps=6, straggler_s={1: 0.02}, seed=1)
    truth = simulate(job)
    dumps = flight_recorder_dumps(job, truth=truth)
    for e in dumps[1]["entries"]:
        e["time_created_ns"] += 80_000_000
    write_flight_recorder(dumps, tmp_path)
    trace, report = _quiet_import(tmp_path, timing="created")
    a = report.assembly  # type: ignore[attr-defined]
    assert abs(a.clock_offsets_s[1] - a.clock_offsets_s[0] - 0.08) < 1e-3, a.clock_offsets_s
    assert "clock offsets removed on the collectives' common completion" in a.timing_note
    assert "clock offsets removed" in trace.timing  # type: ignore[attr-defined]
    late = (_first_arrivals(trace)[1] - _first_arrivals(trace)[0]).to_numpy()
    true_late = truth.arrival_s[:, 1, 0] - truth.arrival_s[:, 0, 0]
    assert np.abs(late - true_late).max() < 1e-3, (late, true_late)


# ---------------------------------------------------------------------------- untrusted pickles
class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_in_one_line_and_never_executed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    dump = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [_Evil(marker)]}
    path = tmp_path / "dumps" / "fr_trace_rank_0"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps(dump))
    assert detect_format(path.parent)[0] == "flight_recorder"  # it looks like a dump
    with pytest.raises(TraceError, match=r"refused and not executed") as err:
        read_dump(path)
    assert "system" in str(err.value) and str(path) in str(err.value)
    assert traces_main(["info", str(path.parent)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "refused and not executed" in lines[0] and "Traceback" not in lines[0]
    assert not marker.exists()


def test_truncated_and_foreign_files_name_the_file(tmp_path: Path) -> None:
    src = FR / "ddp2" / "fr_trace_rank_0"
    cut = tmp_path / "fr_trace_rank_0"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(TraceError, match=r"ends early \(truncated") as err:
        read_dump(cut)
    assert str(cut) in str(err.value)
    jsrc = FR / "ddp4_json" / "fr_trace_rank_0.json"
    jcut = tmp_path / "fr_trace_rank_1.json"
    jcut.write_bytes(jsrc.read_bytes()[:5000])
    with pytest.raises(TraceError, match=r"truncated") as err:
        read_dump(jcut)
    assert str(jcut) in str(err.value)
    empty = tmp_path / "fr_trace_rank_2"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        read_dump(empty)
    with pytest.raises(TraceError, match=r"must be <= 100 bytes"):
        read_dump(src, max_bytes=100)


def test_max_ops_caps_the_entries_read_and_the_ops_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """trace.max_ops bounds the import's memory: the entries are counted file by file (the set is
    refused before its next file is read), and the trace's ops before its op table is built."""
    job = SynthJob(dp=4, steps=6, buckets=2)
    write_flight_recorder(flight_recorder_dumps(job), tmp_path)
    entries = sum(len(read_dump(f).entries) for f in sorted(tmp_path.iterdir()))  # 4 x (1 + 6 x 2)
    trace, _ = import_flight_recorder(tmp_path)
    assert entries < len(trace.ops)  # 2 + 2 x 2 ops per step and rank
    with pytest.raises(
        TraceError, match=r"<= 20 entries \(trace.max_ops\), got 26 in its first 2 of 4 files"
    ):
        import_flight_recorder(tmp_path, max_ops=20)
    with pytest.raises(
        TraceError, match=rf"<= {entries} ops \(trace.max_ops\), got {len(trace.ops)} "
    ) as err:
        import_flight_recorder(tmp_path, max_ops=entries)
    assert "\n" not in str(err.value)
    assert len(import_flight_recorder(tmp_path, max_ops=len(trace.ops))[0].ops) == len(trace.ops)
    assert traces_main(["info", str(tmp_path), "--max-ops", "20"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trace.max_ops / --max-ops" in lines[0]


# ---------------------------------------------------------------------------- versions and formats
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_every_supported_version_imports_alike(tmp_path: Path, version: str, fmt: str) -> None:
    job = SynthJob(dp=4, steps=5, straggler_s={1: 0.01})
    write_flight_recorder(flight_recorder_dumps(job, version=version), tmp_path, fmt=fmt)
    trace, report = _quiet_import(tmp_path)
    assert report.versions == [version] and report.formats == [fmt]  # type: ignore[attr-defined]
    assert report.assembly.timing == "duration"  # type: ignore[attr-defined]
    assert _first_arrivals(trace).idxmax(axis=1).eq(1).all()


@pytest.mark.parametrize("version", ["2.3", "3.0", "banana"])
def test_an_unknown_version_is_named(tmp_path: Path, version: str) -> None:
    write_flight_recorder(flight_recorder_dumps(SynthJob(dp=2), version="2.10"), tmp_path)
    path = tmp_path / "nccl_trace_rank_0"
    d = pickle.loads(path.read_bytes())
    d["version"] = version
    path.write_bytes(pickle.dumps(d))
    with pytest.raises(TraceError) as err:
        read_dump(path)
    assert repr(version) in str(err.value) and "key version" in str(err.value) and str(path) in str(err.value)


# ------------------------------------------------------------------------- timing and layout (synth)
def test_durations_give_clock_free_earliness_where_enqueue_times_mislead(tmp_path: Path) -> None:
    """Hosts run 30-50 ms ahead of their devices (varying): durations recover the device arrivals
    exactly; enqueue times do not."""
    job = SynthJob(dp=4, steps=6, straggler_s={2: 0.02}, host_lead_s=0.03, host_jitter_s=0.02, seed=3)
    truth = simulate(job)
    write_flight_recorder(flight_recorder_dumps(job), tmp_path)
    true_rel = truth.arrival_s[:, :, 0] - truth.arrival_s[:, :, 0].min(axis=1, keepdims=True)
    errors = {}
    for timing in ("duration", "created"):
        trace, report = _quiet_import(tmp_path, timing=timing)
        assert report.assembly.timing == timing  # type: ignore[attr-defined]
        arr = _first_arrivals(trace).to_numpy()
        rel = arr - arr.min(axis=1, keepdims=True)
        errors[timing] = float(np.abs(rel - true_rel).max())
    assert errors["duration"] < 1e-6  # ns rounding of the written times only
    assert errors["created"] > 5e-3


def test_megatron_layout_folds_tp_and_takes_stages_from_pipeline_groups() -> None:
    trace, report = _quiet_import(FR / "synth_megatron_nccl")
    lay = report.assembly.layout  # type: ignore[attr-defined]
    assert (lay.dp_size, lay.pp_size, lay.tp_size, lay.world_size) == (2, 2, 2, 8)
    assert [g.ranks for g in lay.dp_groups] == [(0, 2), (4, 6)]  # TP representatives, stage order
    assert sorted(trace.ops["rank"].unique().tolist()) == [0, 2, 4, 6]  # type: ignore[attr-defined]
    arr = _first_arrivals(trace)
    assert ((arr[2] - arr[0]) > 0.015).all()  # rank 2 (stage 0, DP rank 1) late by 20 ms every step
    assert ((arr[6] - arr[4]).abs() < 0.005).all()


def test_a_group_name_reused_by_two_rank_sets_is_two_groups(tmp_path: Path) -> None:
    """Names are reused after split_group: stage 1's DP group renamed to stage 0's ("1") stays a
    group of its own, matched by its own sequence numbers, and the import is the unrenamed one's."""
    job = SynthJob(dp=2, pp=2, steps=5, straggler_s={1: 0.02, 2: 0.01})
    dumps = flight_recorder_dumps(job)
    write_flight_recorder(dumps, tmp_path / "distinct")
    for r in (2, 3):  # their DP group is "2" (ranks [2, 3]); stage 0's is "1" (ranks [0, 1])
        d = dumps[r]
        d["pg_config"]["1"] = {**d["pg_config"].pop("2"), "name": "1"}
        d["pg_status"]["1"] = d["pg_status"].pop("2")
        for e in d["entries"]:
            if e["process_group"][0] == "2":
                e["process_group"] = ("1", e["process_group"][1])
    write_flight_recorder(dumps, tmp_path / "reused")
    trace, report = _quiet_import(tmp_path / "reused")
    lay = report.assembly.layout  # type: ignore[attr-defined]
    assert [(g.name, g.ranks) for g in lay.dp_groups] == [("1", (0, 1)), ("1", (2, 3))]
    assert lay.pp_size == 2
    reference, _ = _quiet_import(tmp_path / "distinct")
    pd.testing.assert_frame_equal(_first_arrivals(trace), _first_arrivals(reference))
    arr = _first_arrivals(trace)
    assert ((arr[1] - arr[0]) > 0.015).all() and ((arr[2] - arr[3]) > 0.005).all()


def test_layout_overrides_and_their_errors() -> None:
    _, by_name = _quiet_import(FR / "fsdp2_2x2", layout=LayoutOverrides(dp_group="mesh_dp"))
    _, by_size = _quiet_import(FR / "fsdp2_2x2", layout=LayoutOverrides(dp_size=2, pp_size=2))
    for r in (by_name, by_size):
        assert [g.ranks for g in r.assembly.layout.dp_groups] == [(0, 1), (2, 3)]  # type: ignore[attr-defined]
    with pytest.raises(TraceError, match="dp_size x tp_size x pp_size must equal the world size 4"):
        _quiet_import(FR / "fsdp2_2x2", layout=LayoutOverrides(dp_size=3))
    with pytest.raises(TraceError, match="trace.dp_group must name a group"):
        _quiet_import(FR / "fsdp2_2x2", layout=LayoutOverrides(dp_group="DATA_PARALLEL_GROUP"))
    with pytest.raises(TraceError, match="collectives_per_step=2 must be a multiple"):
        _quiet_import(FR / "fsdp2_2x2", layout=LayoutOverrides(collectives_per_step=2))


def test_a_timeout_dump_with_every_entry_scheduled_is_a_hang(tmp_path: Path) -> None:
    write_flight_recorder(flight_recorder_dumps(SynthJob(dp=2), all_scheduled=True), tmp_path)
    _, report = inspect_flight_recorder(tmp_path)
    assert report.hang is not None and "every entry is scheduled" in report.hang


def test_a_rank_that_never_arrives_is_behind_in_its_own_group_only(tmp_path: Path) -> None:
    job = SynthJob(dp=2, pp=2, tp=1, steps=4)
    write_flight_recorder(flight_recorder_dumps(job, hang_rank=3), tmp_path, fmt="json")
    _, report = inspect_flight_recorder(tmp_path)
    hung = [s for s in report.status if s.hung]
    assert [(s.group.ranks, s.behind, s.waiting) for s in hung] == [((2, 3), (3,), (2,))]


def test_group_roles_and_kinds() -> None:
    assert role_of("1", "DATA_PARALLEL_GROUP_WITH_CP") == "dp"
    assert role_of("3", "mesh_dp_shard") == "dp"
    assert role_of("2", "TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert role_of("4", "PIPELINE_MODEL_PARALLEL_GROUP") == "pp"
    assert role_of("5", "EXPERT_DATA_PARALLEL_GROUP") == "ep"
    assert role_of("0", "default_pg") == "world"
    assert role_of("9", "undefined") == "other"
    assert kind_of("_reduce_scatter_base") == "reduce_scatter" and kind_of("AllReduce") == "all_reduce"
    assert kind_of("allgather_into_tensor_coalesced") == "all_gather" and kind_of("send 0->1") == "send"


# ------------------------------------------------------------------------------ detection and run
def test_detection_keeps_kineto_folders_and_finds_dumps_and_logs(tmp_path: Path) -> None:
    assert detect_format(DATA_DIR / "h200-capture")[0] == "kineto"
    assert detect_format(DATA_DIR / "h200-capture" / "gloo4_rank0.json.gz")[0] == "kineto"
    assert detect_format(FR / "ddp2")[0] == "flight_recorder"
    assert detect_format(FR / "ddp2" / "fr_trace_rank_0")[0] == "flight_recorder"
    assert detect_format(FR / "ddp4_json" / "fr_trace_rank_0.json")[0] == "flight_recorder"
    assert detect_format(f"{FR / 'ddp4_json'}/fr_trace_rank_*.json")[0] == "flight_recorder"
    assert detect_format(INSPECTOR / "verbose")[0] == "nccl_inspector"


def test_shipped_synthetic_fixtures_are_what_the_script_writes(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "write_synthetic",
        Path(__file__).parents[1] / "experiments" / "flight_recorder" / "write_synthetic.py",
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    for folder in mod.write_all(tmp_path):
        shipped = DATA_DIR / folder.relative_to(tmp_path)
        for f in folder.iterdir():
            assert f.read_bytes() == (shipped / f.name).read_bytes(), f


# ------------------------------------------------------------------------ point-to-point matching
_PIPE = SynthJob(dp=2, pp=2, steps=3, buckets=2, microbatches=2, seed=5)


def _p2p_of(dumps: dict[int, dict[str, object]], folder: Path) -> P2PReport:
    write_flight_recorder(dumps, folder)
    report = inspect_flight_recorder(folder)[1].p2p
    assert report is not None
    return report


def _tag_sizes(dumps: dict[int, dict[str, object]]) -> None:
    """Give every send and its recv one size of their own: 1000 x sender + p2p_seq_id (global
    sender, from the group's ranks), so a send paired with the wrong recv shows as a size mismatch."""
    for d in dumps.values():
        ranks = {g["name"]: ast.literal_eval(g["ranks"]) for g in d["pg_config"].values()}  # type: ignore[attr-defined]
        for e in d["entries"]:  # type: ignore[attr-defined]
            if e["is_p2p"]:
                kind, peers = e["profiling_name"].split(":")[1].split(" ")
                a, b = (int(x) for x in peers.replace("<-", "->").split("->"))
                sender = ranks[e["process_group"][0]][a if kind == "send" else b]
                e["input_sizes"] = [[1000 * sender + e["p2p_seq_id"]]]


def _merge_pipeline_groups(dumps: dict[int, dict[str, object]]) -> None:
    """Put both pipelines' p2p ops (groups '3' = ranks [0, 2] and '4' = [1, 3]) into one 4-rank
    group '3': the pairs 0->2 and 1->3 then carry the same p2p_seq_ids in one group."""
    for d in dumps.values():
        old = {g["name"]: ast.literal_eval(g["ranks"]) for g in d["pg_config"].values()}  # type: ignore[attr-defined]
        pp = next(n for n in ("3", "4") if n in old)
        d["pg_config"].pop(pp)  # type: ignore[attr-defined]
        d["pg_status"].pop(pp, None)  # type: ignore[attr-defined]
        d["pg_config"]["3"] = {"name": "3", "desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": "[0, 1, 2, 3]"}  # type: ignore[index]
        for e in d["entries"]:  # type: ignore[attr-defined]
            if e["is_p2p"]:
                backend, name = e["profiling_name"].split(":")
                kind, peers = name.split(" ")
                arrow = "->" if "->" in peers else "<-"
                a, b = (old[pp][int(x)] for x in peers.split(arrow))  # local -> global = new local
                e["profiling_name"] = f"{backend}:{kind} {a}{arrow}{b}"
                e["process_group"] = ("3", "PIPELINE_MODEL_PARALLEL_GROUP")


def test_p2p_ops_are_matched_by_group_ordered_pair_and_seq_id_in_any_entry_order(tmp_path: Path) -> None:
    dumps = flight_recorder_dumps(_PIPE)
    _tag_sizes(dumps)
    rng = np.random.default_rng(0)
    for d in dumps.values():  # entries out of order: the matching must not rely on their order
        d["entries"] = [d["entries"][i] for i in rng.permutation(len(d["entries"]))]  # type: ignore[index]
    rep = _p2p_of(dumps, tmp_path / "two_groups")
    got = {(p.group.ranks, p.src, p.dst): (p.matched, p.unmatched, p.size_mismatch, p.by) for p in rep.pairs}
    # each pipeline: 2 activations forward and 2 gradients back per step, 3 steps; both groups use ids 1-12
    assert got == {
        ((0, 2), 0, 2): (6, 0, 0, "p2p_seq_id"),
        ((0, 2), 2, 0): (6, 0, 0, "p2p_seq_id"),
        ((1, 3), 1, 3): (6, 0, 0, "p2p_seq_id"),
        ((1, 3), 3, 1): (6, 0, 0, "p2p_seq_id"),
    }
    assert (rep.matches["send_seq"] == rep.matches["recv_seq"]).all() and rep.matches["finished"].all()
    assert set(rep.matches["send_seq"]) == set(range(1, 13))
    # the two pairs in one 4-rank group, with the same p2p_seq_ids: still each with its own peer
    dumps = flight_recorder_dumps(_PIPE)
    _tag_sizes(dumps)
    _merge_pipeline_groups(dumps)
    rep = _p2p_of(dumps, tmp_path / "one_group")
    got = {(p.group.ranks, p.src, p.dst): (p.matched, p.unmatched, p.size_mismatch) for p in rep.pairs}
    assert got == {((0, 1, 2, 3), s, d): (6, 0, 0) for s, d in ((0, 2), (2, 0), (1, 3), (3, 1))}
    # and a matcher keyed on (group, p2p_seq_id) alone would have crossed them: the check can fail
    m = rep.matches
    assert len(m.merge(m, on=["group", "send_seq"])) > len(m)


def test_a_p2p_op_without_its_other_side_is_reported_with_why(tmp_path: Path) -> None:
    def drop(dumps: dict[int, dict[str, object]], rank: int, keep: object) -> None:
        dumps[rank]["entries"] = [e for e in dumps[rank]["entries"] if keep(e)]  # type: ignore[attr-defined, operator]

    # rank 2 lost its recv of p2p #2 (inside its range: a desync)
    dumps = flight_recorder_dumps(_PIPE)
    drop(dumps, 2, lambda e: not (e["is_p2p"] and e["p2p_seq_id"] == 2))
    pair = next(p for p in _p2p_of(dumps, tmp_path / "desync").pairs if (p.src, p.dst) == (0, 2))
    assert (pair.matched, pair.unmatched_sends, pair.unmatched_recvs) == (5, (2,), ())
    assert "inside rank 2's recorded range #1-#12 with no recv there (a desync)" in pair.why[0]
    with pytest.warns(FlightRecorderWarning, match=r"1 point-to-point op\(s\) unmatched \(of 47"):
        import_flight_recorder(tmp_path / "desync")
    # rank 3's ring buffer wrapped: its oldest entries, up to its 4th p2p op, are gone
    dumps = flight_recorder_dumps(_PIPE)
    entries = dumps[3]["entries"]
    cut = next(i for i, e in enumerate(entries) if e["is_p2p"] and e["p2p_seq_id"] == 4)  # type: ignore[attr-defined]
    dumps[3]["entries"] = entries[cut + 1 :]  # type: ignore[index]
    rep = _p2p_of(dumps, tmp_path / "wrapped")
    pair = next(p for p in rep.pairs if (p.src, p.dst) == (1, 3))
    # rank 3 had received #1, #2 (forward) and sent #3, #4 back: all four fell off its buffer
    assert (pair.matched, pair.unmatched_sends) == (4, (1, 2))
    assert pair.why == ("2 send(s) before rank 3's oldest recorded p2p op #5 (its ring buffer wrapped)",)
    back = next(p for p in rep.pairs if (p.src, p.dst) == (3, 1))
    assert (back.matched, back.unmatched_recvs) == (4, (3, 4))
    # no dump from rank 3 at all
    dumps = flight_recorder_dumps(_PIPE)
    del dumps[3]
    rep = _p2p_of(dumps, tmp_path / "no_dump")
    pair = next(p for p in rep.pairs if (p.src, p.dst) == (1, 3))
    assert pair.matched == 0 and len(pair.unmatched_sends) == 6
    assert "whose recv would be in rank 3's dump, which the set lacks" in pair.why[0]
    assert rep.matched == 12 and rep.unmatched == 12  # pipeline [0, 2] whole, [1, 3] half in the set


def test_a_middle_stage_is_matched_by_order_and_never_guessed(tmp_path: Path) -> None:
    """pp 3: the middle stage's p2p_seq_id counts its ops with both neighbours (one counter per
    group), so ids differ across a pair; the k-th send meets the k-th recv, if both sides hold as many."""
    job = SynthJob(dp=2, pp=3, steps=3, buckets=2, microbatches=2, seed=6)
    dumps = flight_recorder_dumps(job)
    _tag_sizes(dumps)
    rep = _p2p_of(dumps, tmp_path / "all")
    assert {p.by for p in rep.pairs} == {"order"} and len(rep.pairs) == 8  # 2 pipelines x 4 directions
    assert rep.unmatched == 0 and rep.matched == 8 * 6
    mid = rep.matches[rep.matches["src"] == 2]  # rank 2 (stage 1) sends to 4 and back to 0
    assert not (mid["send_seq"] == mid["recv_seq"]).all()  # the ids really differ across these pairs
    # sizes were tagged by the sender's id: order matching paired each send with its own recv
    assert (rep.matches["numel"] % 1000 == rep.matches["send_seq"]).all()
    # rank 4 (stage 2) lost its oldest p2p op: counts differ, the pair is reported, none guessed
    entries = dumps[4]["entries"]
    first = next(i for i, e in enumerate(entries) if e["is_p2p"])  # type: ignore[attr-defined]
    dumps[4]["entries"] = entries[:first] + entries[first + 1 :]  # type: ignore[index]
    rep = _p2p_of(dumps, tmp_path / "lost")
    pair = next(p for p in rep.pairs if (p.src, p.dst) == (2, 4))
    assert (pair.by, pair.matched, len(pair.unmatched_sends), len(pair.unmatched_recvs)) == ("order", 0, 6, 5)
    assert "several peers" in pair.why[0] and "none matched" in pair.why[0]


def test_batched_p2p_ops_share_an_id_and_foreign_entries_are_counted_not_matched(tmp_path: Path) -> None:
    """batch_isend_irecv: the ops of one batch share a p2p_seq_id (seqP2P_ is bumped once per
    batch) and the batch ends with a ``coalesced`` entry; within one id and direction, ops pair in
    enqueue order. A name whose peer is outside its group is counted, not matched."""
    dumps = flight_recorder_dumps(_PIPE)
    _tag_sizes(dumps)  # sizes tagged with the unbatched ids: a pairing out of order shows
    for d in dumps.values():
        out, ops = [], 0
        for e in d["entries"]:  # type: ignore[attr-defined]
            out.append(e)
            if e["is_p2p"]:
                ops += 1
                e["p2p_seq_id"] = (e["p2p_seq_id"] + 1) // 2  # two ops per batch
                if ops % 2 == 0:  # the batch's end
                    out.append({**e, "profiling_name": "nccl:coalesced", "input_sizes": []})
        d["entries"] = out
    dumps[0]["entries"].append(
        {**dumps[0]["entries"][-1], "profiling_name": "nccl:send 0->7", "is_p2p": True}
    )  # type: ignore[attr-defined]
    rep = _p2p_of(dumps, tmp_path)
    assert {(p.src, p.dst): (p.matched, p.unmatched, p.size_mismatch) for p in rep.pairs} == {
        (0, 2): (6, 0, 0), (2, 0): (6, 0, 0), (1, 3): (6, 0, 0), (3, 1): (6, 0, 0),
    }  # fmt: skip
    assert set(rep.matches["send_seq"]) == set(range(1, 7))
    assert rep.other == {"coalesced": 4 * 6, "unreadable peer": 1}
    assert (
        rep.lines()[-1]
        == "not matched (not a send/recv with readable peers): {'coalesced': 24, 'unreadable peer': 1}"
    )


def test_the_pipeline_fixture_imports_and_its_p2p_ops_are_matched(capsys: pytest.CaptureFixture[str]) -> None:
    """synth_pp2_p2p (write_synthetic.py): dp 2 x pp 2, 2 microbatches per step, 6 steps; the first
    stage of each pipeline had posted the next step's first send when the dumps were taken."""
    with pytest.warns(FlightRecorderWarning, match=r"2 point-to-point op\(s\) unmatched \(of 98"):
        trace, report = import_flight_recorder(FR / "synth_pp2_p2p")
    lay = report.assembly.layout
    assert (lay.dp_size, lay.pp_size) == (2, 2) and [g.ranks for g in lay.dp_groups] == [(0, 1), (2, 3)]
    p2p = report.p2p
    assert p2p is not None and (p2p.matched, p2p.unmatched) == (48, 2)
    assert {(p.src, p.dst): (p.matched, p.unmatched_sends) for p in p2p.pairs} == {
        (0, 2): (12, (25,)), (2, 0): (12, ()), (1, 3): (12, (25,)), (3, 1): (12, ()),
    }  # fmt: skip
    assert "p2p" not in set(trace.ops["optype"].str.split("-").str[-1])  # reported, not replayed
    assert ((_first_arrivals(trace)[1] - _first_arrivals(trace)[0]) > 0.015).all()  # rank 1: +20 ms
    assert traces_main(["info", str(FR / "synth_pp2_p2p")]) == 0
    out = capsys.readouterr().out
    assert (
        "p2p       48 send/recv pairs matched, 2 ops unmatched, by (process group, ordered pair, p2p_seq_id)"
        in out
    )
    assert (
        "'3' (PIPELINE_MODEL_PARALLEL_GROUP) 0 -> 2: 12 matched (by p2p_seq_id); UNMATCHED 1 send(s) [25] and "
        "0 recv(s) [] (p2p_seq_id): 1 send(s) after rank 2's newest #24 (posted after it dumped, or in flight)"
    ) in out
    assert traces_main(["info", str(FR / "synth_pp2_p2p"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (
        info["flight_recorder"]["p2p"]["matched"] == 48
        and not info["flight_recorder"]["p2p"]["used_by_replay"]
    )
    assert traces_main(["info", str(FR / "ddp2")]) == 0
    assert (
        "p2p       no send/recv recorded (gloo records no send/recv in torch 2.13)" in capsys.readouterr().out
    )


# ------------------------------------------------------------------------------- NCCL Inspector
@pytest.mark.parametrize("variant", ["verbose", "plain"])
def test_inspector_earliness_from_execution_times(variant: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NcclInspectorWarning)
        trace, report = import_nccl_inspector(INSPECTOR / variant)
    assert trace.meta.dp_size == 4 and report.assembly.timing == "duration"
    assert report.rank_from.startswith("its rank in the communicator of all ranks")
    arr = _first_arrivals(trace)
    late = arr[2] - arr.drop(columns=2).max(axis=1)
    assert (late > 0.015).all()  # write_synthetic.py: rank 2 is 20 ms late every step
    unknown_compute = any("compute between collectives is unknown" in str(w.message) for w in caught)
    assert unknown_compute == (variant == "plain")


def test_inspector_bad_lines(tmp_path: Path) -> None:
    nccl_inspector_logs(SynthJob(dp=2, steps=4), tmp_path)
    first = sorted(tmp_path.iterdir())[0]
    lines = first.read_text().splitlines()
    first.write_text("\n".join(lines) + "\n" + lines[-1][:40])  # a last line cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NcclInspectorWarning)
        import_nccl_inspector(tmp_path)
    assert any("cut short" in str(w.message) for w in caught)
    lines.insert(2, "{not json")
    first.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"{first.name}:3\)"):
        import_nccl_inspector(tmp_path)


def test_max_ops_caps_the_collective_records_of_an_inspector_log_set(tmp_path: Path) -> None:
    """The record cap is counted while the logs are read, over the whole set: one line naming the
    key, the log it was reached in and the fix; the same set imports with the cap raised."""
    nccl_inspector_logs(SynthJob(dp=2, steps=4), tmp_path)
    trace, _ = import_nccl_inspector(tmp_path)
    n = len(trace.ops)
    with pytest.raises(
        TraceError, match=r"must hold <= 3 collective records \(trace\.max_ops\).*Raise the cap"
    ):
        import_nccl_inspector(tmp_path, max_ops=3)
    again, _ = import_nccl_inspector(tmp_path, max_ops=10 * n)
    assert len(again.ops) == n
