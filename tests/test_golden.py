"""Golden metrics of every controller on the shipped real traces (rewrite with tests/golden/regen.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
from regen import GOLDEN_DIR, golden_summary  # noqa: E402


@pytest.mark.parametrize("trace_name", ["AR", "ST"])
def test_golden_metrics(trace_name: str) -> None:
    expected = json.loads((GOLDEN_DIR / f"replay_{trace_name}.json").read_text())
    actual = golden_summary(trace_name)
    assert actual.keys() == expected.keys()
    for family, values in expected.items():
        for key, value in values.items():
            assert actual[family][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (family, key)
    # the null model: no controller beats no pacing on a real trace
    for family in actual:
        assert actual[family]["iteration_time_mean_s"] >= actual["none"]["iteration_time_mean_s"] * (
            1 - 1e-12
        )
