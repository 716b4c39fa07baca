"""The simulator's compute draws, streamed chunk by chunk of iterations (``ComputeModel.stream``),
are the values of drawing every iteration at once (``ComputeModel.sample``), bit for bit, and a
streamed ``pacectl.run`` writes the summaries it wrote before the draws were streamed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from pacectl.backends import sim as sim_module
from pacectl.fabric.noise import (
    ComputeModel,
    Draws,
    EmpiricalSamples,
    LognormalJitter,
    ParetoHiccups,
    PeriodicNoise,
    SlowRanks,
)

GOLDEN = Path(__file__).resolve().parent / "golden"
SHIPPED = Path(__file__).resolve().parents[1] / "pacectl" / "data"

MODELS = {
    "paper_like": ComputeModel(
        0.5,
        (
            LognormalJitter(sigma=0.03),
            ParetoHiccups(prob=0.0045, scale_s=0.2, alpha=3.0),
            SlowRanks(fraction=0.05, factor=1.15),
        ),
    ),
    # every component, per-rank draws between per-cell ones, and the pauses' two blocks last
    "every_kind": ComputeModel(
        0.3,
        (
            PeriodicNoise(period_iters=7, duration_s=0.01),
            LognormalJitter(sigma=0.05),
            SlowRanks(ranks=(1, 3), fraction=0.2, factor=1.3),
            ParetoHiccups(prob=0.05, scale_s=0.1, alpha=2.5),
        ),
    ),
    "explicit_slow_ranks": ComputeModel(
        0.2, (SlowRanks(ranks=(0,), factor=1.5), LognormalJitter(sigma=0.02))
    ),
    "no_noise": ComputeModel(0.1),
}


def _empirical(tmp_path: Path) -> ComputeModel:
    """An empirical series sampled every 10 iterations (the AR(1) fill draws normals first)."""
    rng = np.random.default_rng(3)
    rows = [f"{w},{t},{1 + 0.1 * rng.standard_normal():.6f}" for w in range(3) for t in range(1, 400, 10)]
    path = tmp_path / "steps.csv"
    path.write_text("worker,time,batch_time_norm\n" + "\n".join(rows) + "\n")
    return ComputeModel(0.4, (EmpiricalSamples(path=str(path)), LognormalJitter(sigma=0.01)))


def _chunked(model: ComputeModel, seed: int, iterations: int, ranks: int, chunk: int) -> np.ndarray:
    stream = model.stream(np.random.default_rng(seed), iterations, ranks)
    return np.concatenate(
        [stream.rows(k, min(iterations, k + chunk)) for k in range(0, iterations, chunk)], axis=0
    )


@pytest.mark.parametrize("name", sorted(MODELS) + ["empirical"])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_streamed_draws_are_the_whole_draws_bit_for_bit(name: str, chunk: int, tmp_path: Path) -> None:
    model = _empirical(tmp_path) if name == "empirical" else MODELS[name]
    iterations, ranks = 53, 40
    whole = model.sample(np.random.default_rng(11), iterations, ranks)
    streamed = _chunked(model, 11, iterations, ranks, chunk)
    assert streamed.tobytes() == whole.tobytes()


def test_a_rewound_stream_hands_out_the_same_times_again() -> None:
    model = MODELS["every_kind"]
    stream = model.stream(np.random.default_rng(2), 30, 16)
    first = np.concatenate([stream.rows(k, k + 5) for k in range(0, 30, 5)])
    stream.rewind()
    again = np.concatenate([stream.rows(k, min(30, k + 4)) for k in range(0, 30, 4)])
    assert first.tobytes() == again.tobytes() == model.sample(np.random.default_rng(2), 30, 16).tobytes()
    with pytest.raises(ValueError, match="continue at iteration 30"):
        stream.rows(0, 1)


@pytest.mark.parametrize(
    ("method", "args"),
    [("random", ()), ("lognormal", (0.1, 0.2)), ("pareto", (3.0,)), ("normal", (1.0, 2.0))],
)
def test_skipping_a_block_leaves_the_stream_where_drawing_it_would(method: str, args: tuple) -> None:
    for bits in (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.MT19937):
        drawn = np.random.Generator(bits(5))
        drawn.integers(0, 2**31, size=3, dtype=np.int32)  # a buffered 32-bit half-word, where one is kept
        getattr(drawn, method)(*args, size=(37, 29))
        skipped = np.random.Generator(bits(5))
        skipped.integers(0, 2**31, size=3, dtype=np.int32)
        draws = Draws(skipped, 37, 29)
        draws.cells(method, *args)
        assert _same_state(draws.generator().bit_generator.state, drawn.bit_generator.state), bits.__name__


def _same_state(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def test_a_component_without_a_streamed_form_is_drawn_whole() -> None:
    class Doubling:
        def apply(self, compute_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            return compute_s * 2 * rng.random(compute_s.shape)

    model = ComputeModel(0.1, (LognormalJitter(sigma=0.1), Doubling()))  # type: ignore[arg-type]
    assert _chunked(model, 0, 20, 8, 3).tobytes() == model.sample(np.random.default_rng(0), 20, 8).tobytes()


def test_the_backend_draws_a_chunk_of_iterations_at_a_time(monkeypatch) -> None:
    from pacectl.backends.sim import SimBackend
    from pacectl.fabric.contention import FixedComm
    from pacectl.types import Action

    monkeypatch.setattr(sim_module, "DRAW_CELLS", 16 * 3)
    sim = SimBackend(num_ranks=16, num_iterations=10, compute=MODELS["paper_like"], comm=FixedComm(0.01))
    expected = MODELS["paper_like"].sample(np.random.default_rng(4), 10, 16)
    for _ in range(2):  # a second reset with the same seed rewinds the stream
        sim.reset(seed=4)
        got = [sim.step([Action.zeros(16)])[0].natural_arrival_s.copy() for _ in range(10)]
        assert len(sim._work) <= 3
        assert np.stack(got).tobytes() == expected.tobytes()
    sim.reset(seed=5)
    assert sim.step([Action.zeros(16)])[0].natural_arrival_s.tobytes() == (
        MODELS["paper_like"].sample(np.random.default_rng(5), 10, 16)[0].tobytes()
    )


@pytest.mark.parametrize("case", ["paper_like-contention", "alibaba_pai-null"])
def test_streamed_run_writes_the_summaries_of_the_draws_made_at_once(case: str, monkeypatch) -> None:
    """Against summaries written at main 9dc37d1, before the draws were streamed (golden file):
    every number equal, with the draws made 5 iterations at a time."""
    sys.path.insert(0, str(GOLDEN))
    try:
        from sim_streamed_regen import CASES, summary
    finally:
        sys.path.remove(str(GOLDEN))
    overrides = dict(CASES)[case]
    ranks = next(int(o.split("=")[1]) for o in overrides if o.startswith("backend.num_ranks="))
    monkeypatch.setattr(sim_module, "DRAW_CELLS", ranks * 5)
    expected = json.loads((GOLDEN / "sim_streamed.json").read_text())[case]
    _assert_equal_to_rounding(summary(overrides), expected)


def _assert_equal_to_rounding(got: object, expected: object, path: str = "") -> None:
    """Equal structure, strings and integers; floats within rounding (rel 1e-12, or 1e-12 absolute
    for the residues near zero, e.g. state_time_s.other ~3e-14): numpy's sums may take another order
    on another CPU (an AMD EPYC without AVX-512 gave another last digit than the recording machine)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), path
        for k in expected:
            _assert_equal_to_rounding(got[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _assert_equal_to_rounding(g, e, f"{path}[{i}]")
    elif isinstance(expected, float) and isinstance(got, float):
        both_nan = math.isnan(got) and math.isnan(expected)
        assert both_nan or math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-12), (path, got, expected)
    else:
        assert got == expected, (path, got, expected)
