"""Rewrite the golden metric files on purpose: ``python tests/golden/regen.py``.

Each ``replay_<trace>.json`` holds the summary of every controller family (its constructor
defaults, default guard) replayed on a shipped trace. ``tests/test_golden.py`` compares
fresh runs against them, so any change in the replay, the controllers or the metrics shows up.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from pacectl import metrics
from pacectl.backends.replay import ReplayBackend
from pacectl.config import controller_factory, shipped_controller
from pacectl.controllers.guard import GuardConfig
from pacectl.data import SHIPPED_TRACES, shipped_trace
from pacectl.loop import run_episode
from pacectl.report import atomic_write_text, jsonable
from pacectl.traces.bytedance import load_bytedance

GOLDEN_DIR = Path(__file__).resolve().parent
FAMILIES = ("none", "threshold", "pid", "ewma", "quantile")
GOLDEN_KEYS = (
    "throughput_it_per_s",
    "iteration_time_mean_s",
    "iteration_time_p99_s",
    "cv",
    "spread_median_s",
    "spread_p99_s",
    "pacing_delay_total_s",
    "wait_fraction",
)


def golden_summary(trace_name: str) -> dict[str, dict[str, float]]:
    """Summaries of every family on one shipped trace, restricted to :data:`GOLDEN_KEYS`."""
    backend = ReplayBackend(load_bytedance(*shipped_trace(trace_name)))
    guard = OmegaConf.structured(GuardConfig)
    out = {}
    for family in FAMILIES:
        params = shipped_controller(family, OmegaConf.create({}))
        summary = metrics.summarize(run_episode(backend, controller_factory(family, params, guard)))
        out[family] = {key: summary[key] for key in GOLDEN_KEYS}
    return out


def main() -> None:
    for name in SHIPPED_TRACES:
        text = json.dumps(jsonable(golden_summary(name)), indent=2, sort_keys=True) + "\n"
        atomic_write_text(GOLDEN_DIR / f"replay_{name}.json", text)
        print(f"written {GOLDEN_DIR / f'replay_{name}.json'}")


if __name__ == "__main__":
    main()
