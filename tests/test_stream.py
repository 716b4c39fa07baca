"""A streamed episode (``run_episode(reduce=...)``, ``output.iterations=false``) summarises as the
full one does: every metric and energy field of every controller, exact where the figure is a max,
min, quantile or count, to float rounding where it is a sum."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from pacectl import energy, loop, metrics
from pacectl.config import CONF_DIR, controller_factory, controller_families
from pacectl.errors import PacectlError
from pacectl.experiment import make_experiment

#: fields that are maxima, minima, quantiles of them, or counts: no summation, so bit-identical
EXACT = {
    "spread_median_s",
    "spread_p99_s",
    "natural_spread_median_s",
    "natural_spread_p99_s",
    "blame",
    "natural_blame",
    "throughput_it_per_s",
    "iteration_time_mean_s",
    "iteration_time_p50_s",
    "iteration_time_p99_s",
    "cv",
}


def _flat(x: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(x, dict):
        return {k: v for key, value in x.items() for k, v in _flat(value, (*path, str(key))).items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, value in enumerate(x) for k, v in _flat(value, (*path, str(i))).items()}
    return {path: x}


def _assert_same(full: Any, streamed: Any) -> None:
    a, b = _flat(full), _flat(streamed)
    assert a.keys() == b.keys()
    for key, value in a.items():
        other = b[key]
        if any(part in EXACT for part in key) or not isinstance(value, float):
            assert other == value or (math.isnan(value) and math.isnan(other)), key
        else:
            assert other == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), key


def _cfg(*overrides: str) -> Any:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


CASES = {
    "sim-contention": (
        "backend=sim",
        "cluster=paper_like",
        "comm=contention",
        "backend.num_ranks=16",
        "controller.families=[threshold,pid,ewma,quantile,forecast,sleep_wait]",
    ),
    "sim-clock": (
        "backend=sim",
        "cluster=contended",
        "comm=contention",
        "backend.num_ranks=16",
        "backend.actuator=clock",
    ),
    "replay-ar": ("trace=ar",),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_summary_equals_the_full_one_for_every_controller(case: str, monkeypatch) -> None:
    cfg = _cfg(*CASES[case], "backend.num_iterations=90" if case != "replay-ar" else "seed=0")
    experiment = make_experiment(cfg)
    num_ranks = len(experiment.backend.rank_labels)
    # blocks of 7 iterations (several, and a partial last one), or of 1 (more than the 64 blocks
    # the loop joins at a time)
    block = 1 if case == "sim-contention" else 7
    monkeypatch.setattr(loop, "STREAM_CELLS", num_ranks * block)
    full, streamed = {}, {}
    for family, params in controller_families(cfg).items():
        full[family] = experiment.run(family, params)
        streamed[family] = loop.run_episode(
            experiment.backend,
            controller_factory(family, params, cfg.guard),
            seed=int(cfg.seed),
            exchange=experiment.exchange,
            reduce=partial(energy.episode_totals, profile=experiment.power, oracle=family == "none"),
        )
        assert streamed[family].totals is not None and streamed[family].arrival_s.shape == (0, num_ranks)
        assert full[family].num_iterations > 64 * block or full[family].num_iterations % block
        _assert_same(metrics.summarize(full[family]), metrics.summarize(streamed[family]))
        np.testing.assert_array_equal(metrics.spread_s(full[family]), metrics.spread_s(streamed[family]))
        np.testing.assert_array_equal(full[family].iteration_time_s, streamed[family].iteration_time_s)
    _assert_same(
        energy.energy_summary(full, experiment.power), energy.energy_summary(streamed, experiment.power)
    )


def test_run_writes_the_same_summary_with_and_without_iterations(tmp_path: Path, monkeypatch) -> None:
    from pacectl import run

    monkeypatch.setattr(loop, "STREAM_CELLS", 8 * 5)
    quick = ("backend=sim", "backend.num_ranks=8", "backend.num_iterations=40", "output.plots=false")
    summaries = {}
    for parquet in (True, False):
        cfg = _cfg(
            *quick, "comm=contention", "cluster=paper_like", f"output.iterations={str(parquet).lower()}"
        )
        summaries[parquet] = run.run_experiment(cfg, tmp_path / str(parquet))
        assert (tmp_path / str(parquet) / "iterations.parquet").exists() == parquet
    for s in summaries.values():
        s.pop("wall_time_s", None)
    _assert_same(summaries[True], summaries[False])


def test_a_streamed_episode_refuses_what_needs_its_arrays() -> None:
    cfg = _cfg("backend=sim", "backend.num_ranks=4", "backend.num_iterations=5")
    experiment = make_experiment(cfg)
    ep = loop.run_episode(
        experiment.backend, controller_factory("none", {}, cfg.guard), reduce=metrics.episode_totals
    )
    with pytest.raises(PacectlError, match="streamed"):
        metrics.episode_totals(ep)
    with pytest.raises(PacectlError, match="streamed without the energy totals"):
        energy.summarize_energy(ep, experiment.power)
