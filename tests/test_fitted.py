"""comm=fitted: the fit recovers a planted dependence, finds none under max-plus or in AR's placebo,
and the replay with the fitted model is the null model's at zero delay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pacectl.backends.replay import ReplayBackend
from pacectl.errors import ConfigError
from pacectl.fabric.fitted import FittedComm, Placement, fit_backend, fit_options, timeline_features
from pacectl.testing.synthetic import bucket_trace
from pacectl.types import Action

ONE_NODE = Placement(ranks_per_node=2)


def _slope(fit, feature="compute", which="fit"):
    coefs = fit.fit.coefficients if which == "fit" else fit.placebo.coefficients
    (c,) = [c for c in coefs if c.op_class == "grads-reduce-scatter" and c.feature == feature]
    return c


def test_fit_recovers_planted_slope():
    fit = fit_backend(ReplayBackend(bucket_trace(beta=0.3, seed=1)), placement=ONE_NODE)
    c = _slope(fit)
    assert c.identified and c.ci95_low <= 0.3 <= c.ci95_high
    assert abs(c.estimate - 0.3) < 0.05
    assert fit.heldout_r2 > 0.5  # it predicts the steps it was not fitted on
    placebo = _slope(fit, which="placebo")
    assert placebo.ci95_low <= 0.0 <= placebo.ci95_high  # permuted steps: nothing
    assert not fit.consistent_with_max_plus and fit.verdict.startswith("timing-dependent")


def test_fit_finds_nothing_under_max_plus():
    fit = fit_backend(ReplayBackend(bucket_trace(beta=0.0, seed=1)), placement=ONE_NODE)
    c = _slope(fit)
    assert c.identified and c.ci95_low <= 0.0 <= c.ci95_high
    assert fit.consistent_with_max_plus, fit.verdict
    assert fit.verdict.startswith("consistent with max-plus within +-")


def test_features_count_node_mates_compute():
    backend = ReplayBackend(bucket_trace(beta=0.0, seed=2, num_steps=6))
    fit_one = FittedComm(_layout_for(backend, ONE_NODE), np.zeros((2, 2)), placement=ONE_NODE, source="t")
    dag = backend.dag
    _, _, compute = timeline_features(fit_one.layout, dag, dag.start_s, dag.start_s + dag.duration_s)
    bucket = list(fit_one.layout.comm_nodes).index(int(dag.find("grads-reduce-scatter")[0]))
    # step 0 is covered: both ranks' remaining backward runs through the whole transfer
    assert compute[bucket, 0] == pytest.approx([2.0, 2.0], abs=1e-6)
    # one rank per node: only its own backward is beside it
    apart = Placement(ranks_per_node=1)
    _, _, alone = timeline_features(
        _layout_for(backend, apart), dag, dag.start_s, dag.start_s + dag.duration_s
    )
    assert alone[bucket, 0] == pytest.approx([1.0, 1.0], abs=1e-6)


def _layout_for(backend, placement):
    from pacectl.fabric.fitted import _layout

    m = backend.trace.meta
    return _layout(backend.dag, placement, dp_size=m.dp_size, pp_size=m.pp_size, tp_size=m.tp_size)


def test_fitted_replay_is_null_at_zero_delay_and_responds_to_overlap():
    backend = ReplayBackend(bucket_trace(beta=0.3, seed=3, num_steps=16))
    null_end = backend.replayed_times()[1]
    model = FittedComm.for_backend(backend, placement=ONE_NODE)
    _, end = model.replay(backend)
    np.testing.assert_allclose(end, null_end, rtol=0, atol=1e-12)
    # closed loop through ReplayBackend.step: zero delays give the null model's iteration times
    backend.use_comm_model(model)
    backend.reset()
    times = [backend.step([Action.zeros(2)])[0].iteration_time_s for _ in range(backend.num_iterations)]
    np.testing.assert_allclose(times, null_end.max(axis=(0, 2)), rtol=0, atol=1e-12)
    # a delay that moves the bucket past the covering backward shortens its transfer under the fit
    late = np.zeros((backend.num_iterations, 2))
    late[:, 1] = 0.2  # rank 1 arrives after every backward has ended: nothing runs beside the bucket
    _, end_mp = backend.replayed_times(late)
    _, end_fit = model.replay(backend, late)
    b = int(backend.dag.find("grads-reduce-scatter")[0])
    # step 0 was covered: alone, its transfer takes exp(-0.3 * 2) of the recorded time
    start_mp = backend.replayed_times(late)[0][b, 0].max()
    tau_mp, tau_fit = end_mp[b, 0, 0] - start_mp, end_fit[b, 0, 0] - start_mp
    assert tau_fit == pytest.approx(tau_mp * np.exp(-model.beta.max() * 2.0), rel=1e-6)


@pytest.mark.slow
def test_ar_placebo_finds_nothing_and_max_plus_holds():
    from pacectl.data import shipped_trace
    from pacectl.traces.bytedance import load_bytedance

    fit = fit_backend(ReplayBackend(load_bytedance(*shipped_trace("AR"))))
    assert fit.placebo.wald_p_value > 0.05
    for c in fit.placebo.coefficients:
        if c.identified:
            assert c.ci95_low <= 0.0 <= c.ci95_high, c
    assert fit.consistent_with_max_plus, fit.verdict
    assert fit.bound_frac < 0.001
    json.dumps(fit.to_dict())  # summary-ready


def test_fit_options_are_checked():
    assert fit_options(None)["placement"] == Placement()
    with pytest.raises(ConfigError, match="fit.ranks_per_node must be an integer >= 1, got 0"):
        fit_options({"ranks_per_node": 0})
    with pytest.raises(ConfigError, match="fit.rank_order must be one of"):
        fit_options({"rank_order": "random"})
    with pytest.raises(ConfigError, match="fit"):
        fit_options({"block_step": 4})
    with pytest.raises(
        ConfigError, match=r"fit.block_steps must be an integer >= 1, got 0 \(override: fit.block_steps=8\)"
    ):
        fit_options({"block_steps": 0})


def test_sim_refuses_comm_fitted():
    from pacectl.fabric.profile import sim_fabric

    with pytest.raises(ConfigError, match="comm=fitted .* needs backend=replay"):
        sim_fabric({}, "fitted", 4)


def test_placement_megatron_order():
    nodes = Placement(ranks_per_node=8).nodes(
        dp_size=4, pp_size=4, tp_size=4, trace_ranks=np.zeros((4, 4), int)
    )
    # rank = 4 * (dp + 4 * stage): dp 0,1 of a stage share a node, stages never do
    assert nodes.tolist() == [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5], [6, 6, 7, 7]]


def test_traces_fit_cli_json(tmp_path, capsys):
    from pacectl.traces.__main__ import main

    path = tmp_path / "synthetic.parquet"
    from pacectl.traces.canonical import write_canonical

    write_canonical(bucket_trace(beta=0.0, seed=4, num_steps=24), path)
    assert main(["fit", str(path), "--ranks-per-node", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["placement"]["ranks_per_node"] == 2
    assert out["verdict"].startswith("consistent with max-plus")
    assert main(["fit", str(path), "--ranks-per-node", "2"]) == 0
    text = capsys.readouterr().out
    assert "verdict    consistent with max-plus" in text and "placebo" in text
    assert main(["fit", str(path), "--seed", "-1"]) == 2  # named by its flag, with an example
    assert capsys.readouterr().err.strip().endswith("fit.seed must be an integer >= 0, got -1 (flag --seed)")


def test_run_with_comm_fitted_records_the_model_and_its_fit(tmp_path):
    """``python -m pacectl.run comm=fitted``: summary.json names the model that ran and holds its fit."""
    from pacectl.run import main
    from pacectl.testing.commands import run_command
    from pacectl.traces.canonical import write_canonical

    path, out = tmp_path / "synthetic.parquet", tmp_path / "run"
    write_canonical(bucket_trace(beta=0.3, seed=1), path)
    args = [
        "trace=canonical", f"trace.path={path}", "comm=fitted", "fit.ranks_per_node=2",
        "controller=threshold", "output.plots=false", "output.report=false", f"hydra.run.dir={out}",
    ]  # fmt: skip
    proc = run_command(main, args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comm_model"] == "fitted"
    assert summary["comm_fit"]["verdict"].startswith("timing-dependent")
    assert {"fit", "placebo", "heldout_r2"} <= set(summary["comm_fit"])
