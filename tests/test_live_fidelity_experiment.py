"""The live-fidelity experiment's verdicts (experiments/live_fidelity): aggregation and bad input.

The live jobs themselves are covered by the ``dist`` tests; here the summary of synthetic jobs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "live_fidelity" / "live_fidelity.py"


@pytest.fixture(scope="module")
def lf():
    spec = importlib.util.spec_from_file_location("live_fidelity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(seed: int, predicted: float, live: float, cf: float) -> dict:
    return {
        "seed": seed,
        "self_replay_median_err_frac": {"none": 0.0, "threshold": 0.001 * seed},
        "self_replay_max_err_frac": {"none": 0.0, "threshold": 0.002 * seed},
        "clipped": {"none": seed, "threshold": 0},
        "counterfactual_mean_err_frac": cf,
        "predicted_pacing_effect_s": predicted,
        "live_pacing_effect_s": live,
        "live_iteration_mean_s": 0.04,
    }


def test_aggregate_pairs_live_and_predicted_effects(lf) -> None:
    predicted = np.array([1.0, 1.2, 0.8, 1.1]) * 1e-3
    live = predicted + np.array([0.5, -0.3, 0.2, -0.1]) * 1e-3
    rows = [
        _row(i, p, q, c)
        for i, (p, q, c) in enumerate(zip(predicted, live, [0.01, -0.02, 0.0, 0.03], strict=True))
    ]
    s = lf.aggregate(rows)
    assert s["runs"] == 4 and s["clipped_total"] == 0 + 1 + 2 + 3
    assert s["self_replay_worst_median_err_frac"] == pytest.approx(0.003)
    assert s["self_replay_worst_step_err_frac"] == pytest.approx(0.006)
    diff = s["live_minus_predicted_effect_s"]
    assert diff["mean"] == pytest.approx(0.075e-3)
    # a paired interval: from the differences' spread, not from the two effects' own spreads
    d = (live - predicted) * 1e3
    half = 3.182446305284263 * d.std(ddof=1) / 2  # t(0.975, 3) * sd / sqrt(4), in ms
    assert np.array(diff["ci95"]) * 1e3 == pytest.approx([d.mean() - half, d.mean() + half])
    assert s["counterfactual_mean_err_frac"]["mean"] == pytest.approx(0.005)


def test_bad_arguments_exit_with_a_message(lf, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as err:
        lf.main(["--runs", "1"])
    assert err.value.code == 2 and "--runs must be at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        lf.main(["--controller", "none"])
    assert err.value.code == 2 and "must be a pacing controller" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as err:  # checked before any live job starts
        lf.main(["--out", str(tmp_path / "a_file" / "out.json")])
    assert err.value.code == 2 and "--out: cannot write" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        lf.main(["--controller", "bogus"])
    from pacectl.controllers import CONTROLLERS

    pacing = sorted(name for name in CONTROLLERS if name != "none")  # every registered pacing family
    assert err.value.code == 2 and f"one of {pacing}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # the record would be labelled 4 ranks
        lf.main(["backend.nproc_per_node=2"])
    assert err.value.code == 2 and "use that option instead" in capsys.readouterr().err
