"""Summaries of streamed simulated runs, taken before the compute draws were streamed.

``python tests/golden/sim_streamed_regen.py`` rewrites ``sim_streamed.json``: for each case (profile,
comm model, ranks, iterations), the ``summary.json`` that ``pacectl.run`` writes with
``output.iterations=false`` (every controller, the runs streamed in blocks of
:data:`STREAM_ITERS` iterations), without its wall time. ``tests/test_sim_draws.py`` checks that
today's code writes the same summaries, every number equal, with the compute draws made in chunks
of a few iterations. The committed file was made at main 9dc37d1 (``SimBackend.reset`` drawing every
iteration's compute times at once); regenerate it only when a change of the simulated results is
intended.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from pacectl import loop
from pacectl.config import CONF_DIR

OUT = Path(__file__).resolve().parent / "sim_streamed.json"
#: iterations per streamed block (``loop.STREAM_CELLS`` is set to ranks x this)
STREAM_ITERS = 16
#: (case name, overrides)
CASES = (
    (
        "paper_like-contention",
        ["cluster=paper_like", "comm=contention", "backend.num_ranks=32", "backend.num_iterations=120"],
    ),
    # the empirical series with its AR(1) fill (draws before the per-rank offsets)
    ("alibaba_pai-null", ["cluster=alibaba_pai", "backend.num_ranks=16", "backend.num_iterations=120"]),
)


def summary(overrides: list[str]) -> dict[str, Any]:
    """The ``summary.json`` of one streamed ``pacectl.run`` of ``overrides``, without ``wall_time_s``."""
    from pacectl import run

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "backend=sim",
                *overrides,
                "output.iterations=false",
                "output.plots=false",
                "output.report=false",
            ],
        )
    ranks = int(cfg.backend.num_ranks)
    old = loop.STREAM_CELLS
    loop.STREAM_CELLS = ranks * STREAM_ITERS
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run.run_experiment(cfg, Path(tmp))
            out: dict[str, Any] = json.loads((Path(tmp) / "summary.json").read_text())
    finally:
        loop.STREAM_CELLS = old
    out.pop("wall_time_s", None)
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps({name: summary(o) for name, o in CASES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
