"""What-if analysis against the published outputs of the OSDI'25 artifact (within 2 % relative)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pacectl.backends.replay import ReplayBackend
from pacectl.data import DATA_DIR
from pacectl.whatif import analyze, ideal_transfer_s, num_replays, plot_heatmap, write_timeline

PUBLISHED = DATA_DIR / "bytedance"


def _published(name: str, kind: str) -> dict:  # type: ignore[type-arg]
    return json.loads((PUBLISHED / f"{kind}-{name}.json").read_text())


@pytest.fixture(scope="module")
def results(st_backend: ReplayBackend, ar_backend: ReplayBackend) -> dict:  # type: ignore[type-arg]
    return {"ST": analyze(st_backend), "AR": analyze(ar_backend)}


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_blocking_slowdown_matches_published(results: dict, name: str) -> None:  # type: ignore[type-arg]
    published = _published(name, "result")
    assert results[name].blocking_slowdown == pytest.approx(published["blocking_slowdown"], rel=0.02)
    assert results[name].launch_slowdown == pytest.approx(published["launch_slowdown"], rel=0.02)


@pytest.mark.parametrize("name", ["ST", "AR"])
@pytest.mark.parametrize("dim", ["dp_rank", "stage", "optype"])
def test_attribution_matches_published(results: dict, name: str, dim: str) -> None:  # type: ignore[type-arg]
    published = _published(name, "result")[f"blocking_decompose_by_{dim}"]
    ours = getattr(results[name], f"by_{dim}")
    assert set(ours) == set(published)
    for key, value in published.items():
        assert ours[key] == pytest.approx(value, rel=0.02), key


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_per_step_attribution_matches_published(results: dict, name: str) -> None:  # type: ignore[type-arg]
    published = _published(name, "result")["blocking_decompose_by_dp_rank_per_step"]
    ours = results[name].per_step["by_dp_rank"]
    for step, table in published.items():
        for key, value in table.items():
            assert ours[step][key] == pytest.approx(value, rel=0.02), (step, key)


def test_m_w_and_m_s_match_published(results: dict) -> None:  # type: ignore[type-arg]
    # AR: the injected slow worker explains the whole slowdown, M_W ~ 1; no stage imbalance.
    assert results["AR"].m_w.rem == pytest.approx(_published("AR", "mw")["Mw"], rel=0.02)
    assert results["AR"].m_s.rem == pytest.approx(_published("AR", "ms")["Ms"], abs=0.002)
    # ST: stage imbalance; M_S large, M_W small.
    assert results["ST"].m_s.rem == pytest.approx(_published("ST", "ms")["Ms"], rel=0.02)
    assert results["ST"].m_w.rem == pytest.approx(_published("ST", "mw")["Mw"], rel=0.02)
    for name in ("AR", "ST"):
        assert results[name].m_w.t_ideal == pytest.approx(_published(name, "mw")["tideal"], rel=0.02)
        assert results[name].m_w.t_ori == pytest.approx(_published(name, "mw")["tori"], rel=0.02)


def test_slowdown_pinned_on_dp_rank_0_stage_0_of_ar(results: dict) -> None:  # type: ignore[type-arg]
    ar = results["AR"]
    assert np.unravel_index(int(np.argmax(ar.by_rank)), ar.by_rank.shape) == (0, 0)
    assert max(ar.by_dp_rank, key=ar.by_dp_rank.get) == "0"
    assert max(ar.by_stage, key=ar.by_stage.get) == "0"
    assert "global rank 0 (dp_rank 0, stage 0)" in "\n".join(ar.worst_offenders())


def test_ideal_is_uniform_per_optype(st_backend: ReplayBackend) -> None:
    ideal = ideal_transfer_s(st_backend)
    for t in np.unique(st_backend.dag.optype):
        values = ideal[st_backend.dag.optype == t]
        assert np.ptp(values) == 0.0


def test_whatif_json_and_files(results: dict, st_backend: ReplayBackend, tmp_path) -> None:  # type: ignore[no-untyped-def,type-arg]
    payload = json.loads(json.dumps(results["ST"].to_json(), allow_nan=False))
    assert {"blocking_slowdown", "by_dp_rank", "by_stage", "by_optype", "m_w", "m_s", "by_rank"} <= set(
        payload
    )
    plot_heatmap(tmp_path / "h.png", results["ST"])
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_timeline(tmp_path / "t.json", st_backend, step_index=1)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 2 * st_backend.dag.num_nodes * 2  # recorded + ideal, 2 DP ranks
    assert all(e["dur"] >= 0 for e in complete)


def test_m_s_is_undefined_with_one_pipeline_stage() -> None:
    """With one stage "the last stage" is the whole job, so M_S would be 1.000 on every pure-DP
    trace and read as "all of the slowdown is stage imbalance"; it is undefined instead."""
    from pacectl.report import format_value
    from pacectl.traces.kineto import load_kineto

    result = analyze(ReplayBackend(load_kineto(DATA_DIR / "h200-capture")))
    assert result.blocking_slowdown > 1.0 and np.isfinite(result.m_w.rem)
    assert np.isnan(result.m_s.rem) and "one pipeline stage" in result.m_s.subset
    assert "M_S = n/a" in result.worst_offenders()[0]
    assert format_value(0.25, ".3f") == "0.250" and format_value(None, ".3f") == "n/a"


@pytest.mark.parametrize("name", ["st_backend", "ar_backend"])
def test_the_replay_count_is_known_before_the_analysis(name: str, request: pytest.FixtureRequest) -> None:
    """num_replays (the progress bar's total) is what analyze runs, one on_replay call each."""
    backend: ReplayBackend = request.getfixturevalue(name)
    calls: list[int] = []
    result = analyze(backend, on_replay=lambda: calls.append(1))
    assert (
        num_replays(backend) == result.num_replays == len(calls) == {"st_backend": 31, "ar_backend": 41}[name]
    )


def _tiled_st(tmp_path_factory: pytest.TempPathFactory) -> ReplayBackend:
    from pacectl.testing.synthetic import tiled_bytedance
    from pacectl.traces.bytedance import load_bytedance

    out = tmp_path_factory.mktemp("tiled")
    return ReplayBackend(load_bytedance(*tiled_bytedance(out, name="ST", dp_factor=3, jitter=0.1)))


def _steplevel(tmp_path_factory: pytest.TempPathFactory) -> ReplayBackend:
    from pacectl.testing.synthetic import steplevel_csv
    from pacectl.traces.steplevel import load_steplevel

    path = steplevel_csv(tmp_path_factory.mktemp("step") / "s.csv", num_workers=12, num_iterations=40)
    return ReplayBackend(load_steplevel(path))


@pytest.mark.parametrize("case", ["st_backend", "ar_backend", "tiled", "steplevel", "h200"])
def test_column_method_is_bit_identical_to_one_full_replay_per_scenario(
    case: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The default method (changed DP columns plus one ideal column, batched; reuse of the original
    where a scenario's durations are its) gives exactly what one full replay per scenario gives."""
    if case == "tiled":
        backend = _tiled_st(tmp_path_factory)
    elif case == "steplevel":
        backend = _steplevel(tmp_path_factory)
    elif case == "h200":
        from pacectl.traces.kineto import load_kineto

        backend = ReplayBackend(load_kineto(DATA_DIR / "h200-capture"))
    else:
        backend = request.getfixturevalue(case)
    fast, full = analyze(backend), analyze(backend, method="full")
    assert json.dumps(fast.to_json()) == json.dumps(full.to_json())
    assert np.array_equal(fast.by_rank, full.by_rank)
    assert np.array_equal(fast.step_time_ideal_s, full.step_time_ideal_s)
    assert fast.num_replays == full.num_replays == num_replays(backend)


@pytest.mark.parametrize("per_batch", [1, 3])
def test_column_batches_do_not_change_the_result(
    ar_backend: ReplayBackend, per_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario batches split at any size give the same times: one scenario per batch, and three
    per batch over four scenarios (the last batch a view of the reused buffers, one scenario wide)."""
    from pacectl import whatif
    from pacectl.backends import dag

    n, steps = ar_backend.dag.num_nodes, ar_backend.dag.start_s.shape[1]
    small = whatif._Replayer(ar_backend, chunk_elements=per_batch * (n + 1) * steps * 2)  # width 2: k=1 + 1
    ideal = ideal_transfer_s(ar_backend)
    recorded = np.asarray(ar_backend.transfer_s)
    widths: list[int] = []
    evaluate = dag.evaluate

    def counted(levels, end, *args, **kwargs):  # type: ignore[no-untyped-def]
        widths.append(end.shape[-1])
        return evaluate(levels, end, *args, **kwargs)

    monkeypatch.setattr(dag, "evaluate", counted)

    def changed(b0: int, b1: int, out: np.ndarray) -> None:
        out[...] = recorded[:, :, None, b0:b1]

    cols = small.column_step_times(4, 1, changed, ideal[:, :, 0])
    assert widths == ([1, 1, 1, 1] if per_batch == 1 else [3, 1])
    for d in range(4):
        mask = (np.arange(4) == d)[None, None, :]
        assert np.array_equal(cols[d], small.step_times(np.where(mask, recorded, ideal)))


def test_reused_buffers_give_fresh_results(ar_backend: ReplayBackend) -> None:
    """The replayer's reused arrays: ``scenario`` equals ``np.where``; each ``step_times`` equals a
    replay into fresh arrays that also records start times, whichever scenario ran before it (the
    full recording first, whose later ends could leak into a smaller scenario's if a row were
    left unwritten)."""
    from pacectl import whatif
    from pacectl.backends.dag import evaluate

    rep = whatif._Replayer(ar_backend)
    dag = ar_backend.dag
    ideal, recorded = ideal_transfer_s(ar_backend), np.asarray(ar_backend.transfer_s)
    mask = (dag.stage == 1)[:, None, None] & (np.arange(recorded.shape[2]) == 2)[None, None, :]
    assert np.array_equal(rep.scenario(ideal, recorded, mask), np.where(mask, recorded, ideal))

    def fresh(transfer: np.ndarray) -> np.ndarray:
        end = np.zeros((dag.num_nodes + 1, *transfer.shape[1:]))
        evaluate(dag.levels, end, np.empty(transfer.shape), None, transfer)
        return end[:-1].max(axis=(0, 2))

    full = rep.step_times(recorded)
    part = rep.step_times(rep.scenario(ideal, recorded, mask))
    assert np.array_equal(full, fresh(recorded))
    assert np.array_equal(part, fresh(np.where(mask, recorded, ideal)))
    assert (part < full).any()  # the second scenario is smaller somewhere: a leak would show


def test_unknown_method_is_refused(st_backend: ReplayBackend) -> None:
    with pytest.raises(ValueError, match="method must be"):
        analyze(st_backend, method="fast")
